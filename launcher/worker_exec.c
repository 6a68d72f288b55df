/*
 * worker_exec.c — a worker dies with its launcher.
 *
 * Workers run in sessions of their own (worker_group.c), so nothing the
 * kernel does to the launcher reaches them: a launcher that is SIGKILLed
 * (or OOM-killed) would leave its workers training, saving checkpoints and
 * holding the rendezvous file, with nobody watching. Linux's answer is a
 * parent-death signal, prctl(PR_SET_PDEATHSIG), which must be set in the
 * child between fork and exec. libuv's uv_spawn runs no code of ours
 * there, so the child first execs this launcher again in a hidden mode
 * (argv[1] == LAUNCH_EXEC_MODE), which:
 *
 *   1. asks for SIGKILL when its parent dies (the setting survives exec);
 *   2. checks that its parent is still the launcher that forked it: had the
 *      launcher died before step 1, the child was already re-parented and
 *      no signal would ever come, so it exits instead;
 *   3. execs the program.
 *
 * The program is found on PATH before the spawn (launch_exec_find), so a
 * missing or unrunnable program is still a spawn error the launcher
 * reports (127, 126) and never restarts. Cost: one more execve per worker.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "launch.h"

int launch_exec_find(const char *name, char *path, size_t len)
{
    if (strchr(name, '/')) { /* as execvp: a name with a slash is a path */
        snprintf(path, len, "%s", name);
        return access(path, X_OK) == 0 ? 0 : errno == ENOENT ? UV_ENOENT : UV_EACCES;
    }
    const char *d = getenv("PATH");
    int found = UV_ENOENT;
    for (d = d && *d ? d : "/usr/local/bin:/usr/bin:/bin";; d++) {
        size_t n = strcspn(d, ":"); /* an empty entry is the current directory */
        snprintf(path, len, "%.*s/%s", (int)(n ? n : 1), n ? d : ".", name);
        if (access(path, X_OK) == 0)
            return 0;
        if (errno == EACCES)
            found = UV_EACCES; /* as execvp: keep looking, report EACCES if nothing runs */
        d += n;
        if (!*d)
            return found;
    }
}

char **launch_exec_args(const launch_options *o, const char *path)
{
    size_t n = 0;
    while (o->program[n])
        n++;
    char **args = calloc(n + 5, sizeof *args);
    char pid[24];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    if (!args)
        return NULL;
    args[0] = strdup("dtrain-launch");
    args[1] = strdup(LAUNCH_EXEC_MODE);
    args[2] = strdup(pid);
    args[3] = strdup(path);
    bool ok = args[0] && args[1] && args[2] && args[3];
    for (size_t i = 0; i < n; i++)
        ok = ok && (args[4 + i] = strdup(o->program[i]));
    if (!ok) {
        launch_exec_args_free(args);
        return NULL;
    }
    return args;
}

void launch_exec_args_free(char **args)
{
    for (char **p = args; p && *p; p++)
        free(*p);
    free(args);
}

/* argv: dtrain-launch LAUNCH_EXEC_MODE LAUNCHER_PID PATH ARGV0 ARGS... */
int launch_exec_worker(int argc, char **argv)
{
    if (argc < 5)
        return 2;
    long launcher = strtol(argv[2], NULL, 10);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
        fprintf(stderr, "dtrain-launch: prctl(PR_SET_PDEATHSIG): %s\n", strerror(errno));
        return 126;
    }
    if ((long)getppid() != launcher)
        return 128 + SIGKILL; /* the launcher is gone already: as if its signal came */
    execv(argv[3], argv + 4);
    int e = errno;
    fprintf(stderr, "dtrain-launch: cannot run %s: %s\n", argv[3], strerror(e));
    return e == ENOENT ? 127 : 126;
}
