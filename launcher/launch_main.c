/*
 * launch_main.c — dtrain-launch: start N workers, supervise them as one
 * group, restart the group after a failure up to --max-restarts times.
 *
 *   dtrain-launch -n 4 ./minigpt --preset seed
 *   dtrain-launch -n 2 --nnodes 2 --node-rank K --rdzv file:///shared/job ./prog
 *
 * What torchrun does, and what we keep: torchrun's elastic agent starts the
 * local workers, watches them, and on a failure stops all of them and either
 * restarts the group (up to --max-restarts) or exits with the first
 * failure's report. It also re-runs a rendezvous among the agents so the
 * set of nodes may change between restarts (elasticity). We keep the first
 * part only: the set of nodes is fixed, each node's launcher restarts its
 * own workers, and a failure on one node reaches the others through the
 * workers' collectives failing (their peer's connection drops), which makes
 * them fail and restart too. Each attempt has its own job id, so attempts
 * never mix.
 *
 * The restart loop is plain sequential code: each attempt builds a group on
 * the same libuv loop and runs the loop until the group is done. SIGINT,
 * SIGTERM and SIGHUP are watched with uv_signal handles that are
 * unreferenced, so they never keep the loop alive by themselves; while a
 * group runs they stop it (TERM, grace, KILL) and the launcher exits
 * 128+signal (130 for Ctrl-C, 143 for SIGTERM), without restarting.
 *
 * Exit status: 0 if the (last) group succeeded; the root cause's exit code,
 * or 128+signal if it was killed; 127/126 if PROGRAM cannot be started;
 * 2 for bad flags.
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dt_comm.h"
#include "dt_flags.h"
#include "launch.h"

typedef struct launcher {
    uv_loop_t loop;
    uv_signal_t signals[3];
    worker_group *running; /* the group being supervised, or NULL */
    int got_signal;        /* first signal received, or 0 */
} launcher;

static void on_signal(uv_signal_t *h, int signum)
{
    launcher *l = h->data;
    if (!l->got_signal)
        l->got_signal = signum;
    if (l->running)
        launch_group_interrupt(l->running, signum);
}

static void watch_signals(launcher *l)
{
    static const int which[3] = {SIGINT, SIGTERM, SIGHUP};
    for (int i = 0; i < 3; i++) {
        uv_signal_init(&l->loop, &l->signals[i]);
        l->signals[i].data = l;
        uv_signal_start(&l->signals[i], on_signal, which[i]);
        uv_unref((uv_handle_t *)&l->signals[i]);
    }
    /* A reader of our output that goes away must not kill the launcher (and
     * orphan the workers): write() then fails with EPIPE instead. libuv
     * resets signal dispositions in the children it spawns. */
    signal(SIGPIPE, SIG_IGN);
}

static void unwatch_signals(launcher *l)
{
    for (int i = 0; i < 3; i++)
        uv_close((uv_handle_t *)&l->signals[i], NULL);
    uv_run(&l->loop, UV_RUN_DEFAULT);
}

/* mkdir -p */
static int make_dir(const char *path)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* One attempt: start the group, supervise it to the end. */
static group_result run_attempt(launcher *l, const launch_options *o, const launch_job *job,
                                int restart, int *exit_code)
{
    char err[256];
    uv_run(&l->loop, UV_RUN_NOWAIT); /* deliver a signal that arrived between attempts */
    if (l->got_signal) {
        *exit_code = 128 + l->got_signal;
        return GROUP_INTERRUPTED;
    }
    worker_group *g = launch_group_start(&l->loop, o, job, restart, err, sizeof err);
    if (!g) {
        fprintf(stderr, "dtrain-launch: %s\n", err);
        *exit_code = 1;
        return GROUP_SPAWN_FAILED;
    }
    l->running = g;
    uv_run(&l->loop, UV_RUN_DEFAULT);
    l->running = NULL;
    group_result r = launch_group_finish(g, exit_code);
    launch_group_free(g);
    return r;
}

/* More workers than this per CPU starve each other: every rank's threads
 * compete for the same cores, start-up crawls and can miss its deadline. */
#define WORKERS_PER_CPU_WARN 4

/* Warns (and only warns: a test may oversubscribe on purpose) when this
 * node's workers far exceed the CPUs this process may run on. */
static void warn_if_oversubscribed(const launch_options *o)
{
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (cpus <= 0 || o->nproc_per_node <= WORKERS_PER_CPU_WARN * cpus)
        return;
    fprintf(stderr,
            "dtrain-launch: warning: %d workers on %d CPU core%s (%.3g per core): they "
            "will starve each other and start-up may miss its deadline; start fewer, or give "
            "them time with --init-timeout\n",
            o->nproc_per_node, cpus, cpus == 1 ? "" : "s", (double)o->nproc_per_node / cpus);
}

static int supervise(launcher *l, const launch_options *o, const launch_job *job)
{
    int exit_code = 0;
    fprintf(stderr,
            "dtrain-launch: %d worker%s of %s (ranks %d..%d of %d), run id %s, "
            "rendezvous %s\n",
            o->nproc_per_node, o->nproc_per_node == 1 ? "" : "s", o->program[0],
            o->node_rank * o->nproc_per_node, (o->node_rank + 1) * o->nproc_per_node - 1,
            o->nproc_per_node * o->nnodes, job->run_id, job->init_url);
    for (int restart = 0;; restart++) {
        group_result r = run_attempt(l, o, job, restart, &exit_code);
        if (r != GROUP_FAILED || restart >= o->max_restarts) {
            if (r == GROUP_FAILED && o->max_restarts > 0)
                fprintf(stderr, "dtrain-launch: giving up after %d restart%s\n", restart,
                        restart == 1 ? "" : "s");
            break;
        }
        fprintf(stderr,
                "dtrain-launch: restart %d of %d: starting all %d workers again "
                "(job id %s-r%d)\n",
                restart + 1, o->max_restarts, o->nproc_per_node, job->run_id, restart + 1);
    }
    if (exit_code >= 128 + SIGHUP && l->got_signal)
        fprintf(stderr, "dtrain-launch: stopped by signal %d, exit %d\n", l->got_signal, exit_code);
    return exit_code;
}

/* Node 0 of a tcp:// rendezvous hosts the store, listening on the URL's
 * HOST:PORT, for as long as it supervises (restarts included). */
static int host_store(const launch_options *o, dt_store_server **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!o->rdzv || strncmp(o->rdzv, "tcp://", 6) != 0 || o->node_rank != 0)
        return 0;
    char host[256];
    const char *colon = strrchr(o->rdzv + 6, ':');
    int port = colon ? atoi(colon + 1) : 0;
    size_t n = colon ? (size_t)(colon - (o->rdzv + 6)) : 0;
    if (!colon || n == 0 || n >= sizeof host || port <= 0 || port > 65535) {
        snprintf(err, errlen, "--rdzv '%s' is not tcp://HOST:PORT", o->rdzv);
        return -1;
    }
    memcpy(host, o->rdzv + 6, n);
    host[n] = 0;
    return dt_store_server_start(out, host, port, err, errlen) == DT_OK ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], LAUNCH_EXEC_MODE) == 0)
        return launch_exec_worker(argc, argv); /* a worker's first step: worker_exec.c */
    launch_options o;
    char err[512];
    switch (launch_options_parse(&o, argc, argv, err, sizeof err)) {
    case LAUNCH_PARSE_HELP: launch_options_usage(stdout); return 0;
    case LAUNCH_PARSE_ERROR: return dt_flag_error("dtrain-launch", "%s", err);
    case LAUNCH_PARSE_OK: break;
    }
    launch_job job;
    if (launch_job_init(&job, &o, err, sizeof err) != 0) {
        fprintf(stderr, "dtrain-launch: %s\n", err);
        return 2;
    }
    if (launch_env_choose_master(&job, &o, err, sizeof err) != 0) {
        fprintf(stderr, "dtrain-launch: %s\n", err);
        launch_job_cleanup(&job);
        return 1;
    }
    launch_job_sweep(&job);
    launch_rdzv_watch(&job);
    if (o.log_dir && make_dir(o.log_dir) != 0) {
        fprintf(stderr, "dtrain-launch: cannot create --log-dir %s: %s\n", o.log_dir,
                strerror(errno));
        return 2;
    }
    warn_if_oversubscribed(&o);
    dt_store_server *store = NULL;
    if (host_store(&o, &store, err, sizeof err) != 0) {
        fprintf(stderr, "dtrain-launch: %s\n", err);
        launch_job_cleanup(&job);
        return 2;
    }
    launcher l = {0};
    if (uv_loop_init(&l.loop) != 0) {
        fprintf(stderr, "dtrain-launch: cannot create an event loop\n");
        return 1;
    }
    watch_signals(&l);
    int code = supervise(&l, &o, &job);
    unwatch_signals(&l);
    uv_loop_close(&l.loop);
    dt_store_server_stop(store);
    launch_job_cleanup(&job);
    return code;
}
