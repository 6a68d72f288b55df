/*
 * rdzv_watch.c — a rendezvous file the launcher made outlives no launcher,
 * not even one killed outright.
 *
 * The launcher removes its file when it exits (launch_job_cleanup), and the
 * ranks' last close removes it before that. A SIGKILLed launcher does
 * neither, and its workers die with it (worker_exec.c), so nobody would;
 * the next launch's sweep (launch_job.c) catches only default names, and
 * only if there is a next launch. So before it starts anything the launcher
 * starts a watcher: a process that blocks reading a pipe whose only write
 * end the launcher holds. However the launcher ends, the kernel closes that
 * end and the read returns; the watcher then removes the file once the
 * job's workers (killed by their parent-death signal) have let go of it,
 * through dt_store_remove_if_dead, which never touches a live job's file
 * and writes nothing to it. It tries every WATCH_POLL_NS for WATCH_LIMIT_S
 * and gives up on a file still held (another node's ranks of a multi-node
 * job: theirs to remove). After a clean exit the file is already gone and
 * the watcher exits at once.
 *
 * The watcher is forked twice (its first parent exits at once), so it is
 * no child of the launcher's event loop, and starts a session of its own
 * with /dev/null for stdio: a signal to the launcher's process group or
 * terminal does not stop it, and it holds no pipe of the launcher's caller
 * open; ps shows it as dtrain-rdzv-watch. Cost: one sleeping process per
 * launch, a few stat calls after.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dt_comm.h"
#include "launch.h"

#define WATCH_POLL_NS 20000000L /* 20 ms */
#define WATCH_LIMIT_S 10

/* The watcher's life: wait for the launcher to go, then for its file to be
 * dead, and remove it. Never returns. */
static void watch(int from_launcher, const char *url)
{
    char byte;
    while (read(from_launcher, &byte, 1) < 0 && errno == EINTR)
        ;
    for (int i = 0; i < WATCH_LIMIT_S * (1000000000L / WATCH_POLL_NS); i++) {
        bool removed = false;
        dt_status st = dt_store_remove_if_dead(url, &removed);
        if (removed || st != DT_OK || access(url + 7, F_OK) != 0)
            break;
        nanosleep(&(struct timespec){0, WATCH_POLL_NS}, NULL);
    }
    _exit(0);
}

/* In the forked child: stdio to /dev/null, every other descriptor closed
 * but the pipe's read end, a session of its own. */
static void detach(int keep)
{
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; fd < 3 && null >= 0; fd++)
        dup2(null, fd);
    for (int fd = 3; fd < 1024; fd++)
        if (fd != keep)
            close(fd);
    setsid();
    prctl(PR_SET_NAME, "dtrain-rdzv-watch"); /* what ps and top show */
    signal(SIGINT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
}

void launch_rdzv_watch(const launch_job *job)
{
    if (!job->owns_rendezvous_file || strncmp(job->init_url, "file:///", 8) != 0)
        return;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return; /* no watcher: the next launch's sweep is the fallback */
    pid_t first = fork();
    if (first == 0) {
        close(fds[1]);
        detach(fds[0]);
        if (fork() == 0)
            watch(fds[0], job->init_url);
        _exit(0);
    }
    close(fds[0]); /* the launcher keeps the write end, never writing */
    if (first > 0)
        while (waitpid(first, NULL, 0) < 0 && errno == EINTR)
            ;
}
