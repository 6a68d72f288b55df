/*
 * test_bench_ranks.c — `dtrain-bench --ranks N` when one of its forked
 * ranks dies: the others still say why they failed, the bench exits with
 * the dead rank's status, rank 0's header is not lost, and the rendezvous
 * file is gone. The built program is run as a user runs it; its ranks are
 * found as the bench's children in /proc.
 *
 * Waiting is bounded by each test's Criterion timeout; no assertion is
 * about time.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "run_program.h"

#ifndef DTRAIN_BENCH_BIN
#error "DTRAIN_BENCH_BIN must name the built dtrain-bench"
#endif

enum { RANKS = 3 };

static void sleep_ms(long ms)
{
    nanosleep(&(struct timespec){0, ms * 1000000}, NULL);
}

/* The parent pid in /proc/PID/stat, or -1. */
static pid_t parent_of(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *end = strrchr(buf, ')');
    int ppid;
    return end && sscanf(end + 1, " %*c %d", &ppid) == 1 ? ppid : -1;
}

/* Up to `max` children of `parent`; returns how many. */
static int children_of(pid_t parent, pid_t *out, int max)
{
    DIR *d = opendir("/proc");
    cr_assert(d, "/proc: %s", strerror(errno));
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < max;) {
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid > 0 && parent_of(pid) == parent)
            out[n++] = pid;
    }
    closedir(d);
    return n;
}

static bool file_has(const char *path, const char *needle)
{
    char *text = run_slurp(path);
    bool found = strstr(text, needle) != NULL;
    free(text);
    return found;
}

typedef struct bench_run {
    pid_t pid;
    char dir[32], out[64], err[64];
} bench_run;

/* Starts 3 ranks all-reducing 4 B a million times (far longer than a test
 * waits), and returns once rank 0's header is in the output: every rank
 * has joined by then. The header must reach the file at once, not when
 * rank 0 exits. */
static void bench_start(bench_run *b)
{
    snprintf(b->dir, sizeof b->dir, "/tmp/dt-bench-test-XXXXXX");
    cr_assert(mkdtemp(b->dir), "mkdtemp: %s", strerror(errno));
    snprintf(b->out, sizeof b->out, "%s/stdout", b->dir);
    snprintf(b->err, sizeof b->err, "%s/stderr", b->dir);
    const char *argv[] = {
        DTRAIN_BENCH_BIN, "--ranks", "3", "-c", "allreduce", "-b", "4", "-e", "4", "-w", "1", "-n",
        "1000000",        NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, b->out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, b->err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_eq(posix_spawn(&b->pid, argv[0], &fa, NULL, (char **)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    int status;
    for (int waited = 0; !file_has(b->out, "# dtrain-bench allreduce"); waited += 10) {
        cr_assert(waited < 30000, "rank 0's header never reached the output (not flushed?)");
        cr_assert_eq(waitpid(b->pid, &status, WNOHANG), 0, "the bench ended early:\n%s",
                     run_slurp(b->err));
        sleep_ms(10);
    }
}

/* Waits for the bench; returns its exit code (128 + signal if killed) and
 * its stderr in *err. */
static int bench_wait(const bench_run *b, char **err)
{
    int status;
    while (waitpid(b->pid, &status, 0) < 0)
        cr_assert_eq(errno, EINTR);
    *err = run_slurp(b->err);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void assert_no_rendezvous_file(const bench_run *b)
{
    char pattern[64];
    snprintf(pattern, sizeof pattern, "/tmp/dtrain-bench-%d-*", (int)b->pid);
    glob_t g;
    int found = glob(pattern, 0, NULL, &g);
    cr_assert_eq(found, GLOB_NOMATCH, "the rendezvous file %s was left behind",
                 found == 0 ? g.gl_pathv[0] : pattern);
}

static void bench_cleanup(const bench_run *b)
{
    unlink(b->out);
    unlink(b->err);
    rmdir(b->dir);
}

Test(bench_ranks, a_killed_rank_lets_the_others_report_and_sets_the_exit_status, .timeout = 60)
{
    bench_run b;
    bench_start(&b);
    pid_t ranks[RANKS + 1];
    cr_assert_eq(children_of(b.pid, ranks, RANKS + 1), RANKS);
    kill(ranks[RANKS - 1], SIGKILL);

    char *text;
    int code = bench_wait(&b, &text);
    cr_assert_eq(code, 128 + SIGKILL, "exit %d, not the killed rank's; stderr:\n%s", code, text);
    int dead = -1;
    const char *said = strstr(text, "was killed by signal 9");
    cr_assert(said, "the bench did not say which rank was killed:\n%s", text);
    while (said > text && said[-1] != '\n')
        said--;
    cr_assert_eq(sscanf(said, "dtrain-bench: rank %d", &dead), 1, "%s", text);
    for (int r = 0; r < RANKS; r++) {
        if (r == dead)
            continue;
        char own[64];
        snprintf(own, sizeof own, "dtrain-bench: rank %d: ", r);
        cr_assert(strstr(text, own), "rank %d's own failure message was lost:\n%s", r, text);
    }
    free(text);
    assert_no_rendezvous_file(&b);
    bench_cleanup(&b);
}

/* One rank killed, another stopped: the stopped one holds the rendezvous
 * file open until the bench kills it, so no rank can remove the file on
 * its way out; the bench must. */
Test(bench_ranks, ranks_that_had_to_be_killed_leave_no_rendezvous_file, .timeout = 60)
{
    bench_run b;
    bench_start(&b);
    pid_t ranks[RANKS + 1];
    cr_assert_eq(children_of(b.pid, ranks, RANKS + 1), RANKS);
    kill(ranks[1], SIGSTOP);
    kill(ranks[2], SIGKILL);
    char *text;
    int code = bench_wait(&b, &text);
    cr_assert_eq(code, 128 + SIGKILL, "exit %d; stderr:\n%s", code, text);
    free(text);
    assert_no_rendezvous_file(&b);
    bench_cleanup(&b);
}
