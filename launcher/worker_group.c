/*
 * worker_group.c — supervising one group of workers: spawn, watch, stop.
 *
 * The group is the unit of failure. Ranks of a collective job depend on
 * each other: when one dies the others block in their next collective
 * until a timeout, so waiting for them is pointless. When the first worker
 * exits non-zero or dies from a signal, the launcher stops everyone else.
 * torchrun's local agent reports that first failure as the cause (its
 * ChildFailedError); we start from it and follow what the workers said to
 * the rank whose failure was its own (root_cause.c), since the first to
 * exit is often a rank that only reported a peer's failure. Workers that
 * die from our SIGTERM are consequences, never the cause by themselves.
 *
 * The first failure is not always the cause. A rank that is stopped
 * (SIGSTOP) makes no progress and says nothing; its peers wait for it until
 * their op timeout, and the first of them to time out exits first. So at
 * the first failure, before anything is signalled, the launcher reads the
 * state of every worker still running from /proc/PID/stat and notes those
 * in state T (stopped by a signal). State t (stopped by a tracer) is not
 * noted: it is also the passing state of a process that a profiler samples
 * or that LeakSanitizer inspects while it exits. The check costs one small
 * file read per worker, once per failure. A rank can also hang without
 * being stopped (a deadlock in its own code, SIGTERM blocked): it shows as
 * the worker still running when the grace period ends. The verdict is made
 * once the group is down and every line is drained (root_cause.c): a
 * stopped worker, or else a silent one that outlived SIGTERM, is the cause
 * when the failure it led to is a timeout. The exit code is the first
 * failure's either way: it is what the job ended with.
 *
 * Stopping is SIGTERM, a grace period, then SIGKILL. TERM first so a worker
 * can flush its logs, finish a checkpoint write or tell its peers why it is
 * leaving; KILL after the grace period because a worker stuck in a blocking
 * call or ignoring TERM must not keep the job alive forever. TERM is
 * followed by CONT, so a stopped worker acts on it instead of holding the
 * group until the KILL. A second SIGINT/SIGTERM to the launcher skips the
 * wait.
 *
 * Each worker runs in its own session and process group (libuv's
 * UV_PROCESS_DETACHED = setsid), and signals go to the whole group
 * (kill(-pid)): helpers a worker forked die with it, and a terminal's Ctrl-C
 * reaches only the launcher, which then runs the orderly TERM/grace/KILL
 * sequence once instead of every process reacting on its own. The cost: no
 * signal to the launcher reaches its workers by itself; so each worker is
 * started through worker_exec.c with a parent-death signal, and dies
 * (SIGKILL) the moment its launcher does, however it died. The group is
 * signalled only while its leader is unreaped, so a recycled pid is never
 * hit.
 *
 * Everything runs on one libuv loop: a uv_process_t per worker (libuv
 * handles SIGCHLD and calls exit_cb), two uv_pipe_t per worker for its
 * stdout/stderr, a uv_timer_t for the grace period, and one more that bounds
 * how long we wait for end-of-file after every worker has exited (a
 * grandchild may hold the pipe open). The group is done when every handle
 * is closed; uv_run then returns, because the launcher's signal watchers
 * are unreferenced.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "launch.h"

#define DRAIN_AFTER_EXIT_MS 2000

static void on_drain_timeout(uv_timer_t *t);

/* ---- stopping ---------------------------------------------------------------- */

/* The state letter of a process from /proc/PID/stat ("PID (comm) S ..."; the
 * command may itself hold spaces and parentheses, so look after the last
 * ')'), or 0 if it cannot be read (gone, or no /proc). */
static char process_state(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *end = strrchr(buf, ')');
    return end && end[1] == ' ' ? end[2] : 0;
}

/* Signals every worker not yet reaped, and notes on each one still alive
 * (neither gone nor a zombie) that the launcher sent it sig: a worker that
 * then dies of that signal was stopped by us, whatever its peers blame on
 * it (root_cause.c says so). One /proc read per worker and signal. */
static void signal_running(worker_group *g, int sig)
{
    for (int i = 0; i < g->n; i++) {
        worker *w = &g->workers[i];
        if (!w->running)
            continue;
        char state = process_state(w->proc.pid);
        if (state && state != 'Z')
            w->signalled |= 1u << sig;
        if (kill(-w->proc.pid, sig) != 0)
            kill(w->proc.pid, sig);
    }
}

static void on_grace_over(uv_timer_t *t)
{
    worker_group *g = t->data;
    if (g->running == 0 || g->killed)
        return;
    g->killed = true;
    fprintf(stderr, "dtrain-launch: %d worker%s still running after SIGTERM; sending SIGKILL\n",
            g->running, g->running == 1 ? "" : "s");
    for (int i = 0; i < g->n; i++)
        if (g->workers[i].running && !g->interrupted_by)
            g->workers[i].ignored_term = true;
    signal_running(g, SIGKILL);
}

static void group_stop(worker_group *g)
{
    if (g->stopping)
        return;
    g->stopping = true;
    if (g->running == 0)
        return;
    signal_running(g, SIGTERM);
    signal_running(g, SIGCONT); /* a stopped worker can act on TERM only once resumed */
    uv_timer_start(&g->grace_timer, on_grace_over, (uint64_t)(g->opts->grace_s * 1000), 0);
}

void launch_group_interrupt(worker_group *g, int signum)
{
    if (!g->interrupted_by)
        g->interrupted_by = signum;
    if (!g->stopping) {
        fprintf(stderr,
                "dtrain-launch: got %s, stopping %d worker%s (SIGTERM, then SIGKILL "
                "after %g s; repeat to kill now)\n",
                launch_signal_name(signum), g->running, g->running == 1 ? "" : "s",
                g->opts->grace_s);
        group_stop(g);
    } else {
        on_grace_over(&g->grace_timer);
    }
}

/* ---- completion ---------------------------------------------------------------- */

static void on_timer_closed(uv_handle_t *h)
{
    (void)h;
}

/* Called whenever a worker is reaped or a pipe closes. */
static void maybe_finish(worker_group *g)
{
    if (g->running > 0 || g->timers_closing)
        return;
    if (g->open_pipes > 0) {
        if (!uv_is_active((uv_handle_t *)&g->drain_timer))
            uv_timer_start(&g->drain_timer, on_drain_timeout, DRAIN_AFTER_EXIT_MS, 0);
        return;
    }
    g->timers_closing = true;
    uv_close((uv_handle_t *)&g->grace_timer, on_timer_closed);
    uv_close((uv_handle_t *)&g->drain_timer, on_timer_closed);
}

static void on_pipe_closed(uv_handle_t *h)
{
    worker *w = h->data;
    w->group->open_pipes--;
    maybe_finish(w->group);
}

static void close_pipe(worker *w, int which)
{
    if (!w->pipe_open[which])
        return;
    w->pipe_open[which] = false;
    launch_output_finish(&w->streams[which]);
    uv_close((uv_handle_t *)&w->pipes[which], on_pipe_closed);
}

/* Every worker is gone but a pipe never reached EOF: something the worker
 * started still holds it. Stop waiting. */
static void on_drain_timeout(uv_timer_t *t)
{
    worker_group *g = t->data;
    for (int i = 0; i < g->n; i++) {
        close_pipe(&g->workers[i], 0);
        close_pipe(&g->workers[i], 1);
    }
}

/* ---- stopped workers -------------------------------------------------------------- */

/* Called at the first failure, before any signal: which workers are stopped. */
static void note_stopped_workers(worker_group *g)
{
    for (int i = 0; i < g->n; i++) {
        worker *w = &g->workers[i];
        if (!w->running)
            continue;
        char state = process_state(w->proc.pid);
        if (state != 'T')
            continue;
        w->stopped = true;
        fprintf(stderr,
                "dtrain-launch: rank %d (pid %d) is stopped (SIGSTOP) and makes no "
                "progress\n",
                w->rank, w->proc.pid);
    }
}

/* ---- events ------------------------------------------------------------------ */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    buf->base = malloc(suggested);
    buf->len = buf->base ? suggested : 0;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    worker *w = s->data;
    int which = s == (uv_stream_t *)&w->pipes[0] ? 0 : 1;
    if (n > 0) {
        launch_output_feed(&w->streams[which], buf->base, (size_t)n);
        w->last_output_ms = uv_now(w->group->loop);
    }
    free(buf->base);
    if (n < 0)
        close_pipe(w, which); /* UV_EOF, or the pipe failed: either way it is over */
}

static void on_process_closed(uv_handle_t *h)
{
    (void)h;
}

static void on_worker_exit(uv_process_t *p, int64_t exit_status, int term_signal)
{
    worker *w = p->data;
    worker_group *g = w->group;
    w->running = false;
    w->exit_status = exit_status;
    w->term_signal = term_signal;
    g->running--;
    uv_close((uv_handle_t *)p, on_process_closed);
    bool failed = exit_status != 0 || term_signal != 0;
    if (failed && !g->stopping) {
        char what[128];
        launch_worker_describe_exit(w, what, sizeof what);
        g->first_failure = w;
        g->first_failure_ms = uv_now(g->loop);
        fprintf(stderr, "dtrain-launch: rank %d %s; stopping the other workers\n", w->rank, what);
        note_stopped_workers(g);
        group_stop(g);
    }
    if (g->running == 0 && uv_is_active((uv_handle_t *)&g->grace_timer))
        uv_timer_stop(&g->grace_timer);
    maybe_finish(g);
}

/* ---- starting ------------------------------------------------------------------ */

static int open_log(const launch_options *o, int rank, int restart)
{
    if (!o->log_dir)
        return -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/rank_%05d.log", o->log_dir, rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "dtrain-launch: cannot open %s (%s); rank %d is not logged\n", path,
                strerror(errno), rank);
        return -1;
    }
    if (restart > 0)
        dprintf(fd, "=== dtrain-launch: restart %d ===\n", restart);
    return fd;
}

static void spawn_worker(worker_group *g, worker *w, const launch_job *job)
{
    const launch_options *o = g->opts;
    w->group = g;
    w->rank = o->node_rank * o->nproc_per_node + w->local_rank;
    w->log_fd = open_log(o, w->rank, g->restart);
    for (int i = 0; i < 2; i++) { /* --tee/--redirects: where stream i + 1 goes */
        launch_output_init(&w->streams[i], w->rank,
                           launch_options_shows_stream(o, i + 1) ? i + 1 : -1,
                           launch_options_logs_stream(o, i + 1) ? w->log_fd : -1, &w->tail);
        uv_pipe_init(g->loop, &w->pipes[i], 0);
        w->pipes[i].data = w;
        w->pipe_open[i] = true;
        g->open_pipes++;
    }
    char path[4096];
    int found = launch_exec_find(o->program[0], path, sizeof path);
    if (found != 0) {
        w->spawn_error = found;
        close_pipe(w, 0);
        close_pipe(w, 1);
        return;
    }
    w->env = launch_env_build(o, job, w->local_rank, g->restart);
    w->args = launch_exec_args(o, path);
    uv_stdio_container_t stdio[3] = {
        {.flags = UV_IGNORE}, /* stdin: /dev/null; N ranks cannot share a terminal */
        {.flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE, .data.stream = (uv_stream_t *)&w->pipes[0]},
        {.flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE, .data.stream = (uv_stream_t *)&w->pipes[1]},
    };
    uv_process_options_t po = {
        .exit_cb = on_worker_exit,
        .file = "/proc/self/exe", /* worker_exec.c, which execs the program */
        .args = w->args,
        .env = w->env,
        .flags = UV_PROCESS_DETACHED,
        .stdio_count = 3,
        .stdio = stdio,
    };
    w->proc.data = w;
    int rc = w->env && w->args ? uv_spawn(g->loop, &w->proc, &po) : UV_ENOMEM;
    if (rc != 0) {
        w->spawn_error = rc;
        if (w->env && w->args)
            uv_close((uv_handle_t *)&w->proc, on_process_closed);
        close_pipe(w, 0);
        close_pipe(w, 1);
        return;
    }
    w->running = true;
    w->last_output_ms = uv_now(g->loop);
    g->running++;
    uv_read_start((uv_stream_t *)&w->pipes[0], on_alloc, on_read);
    uv_read_start((uv_stream_t *)&w->pipes[1], on_alloc, on_read);
}

worker_group *launch_group_start(uv_loop_t *loop, const launch_options *o, const launch_job *job,
                                 int restart, char *err, size_t errlen)
{
    worker_group *g = calloc(1, sizeof *g);
    worker *ws = calloc((size_t)o->nproc_per_node, sizeof *ws);
    if (!g || !ws) {
        free(g);
        free(ws);
        snprintf(err, errlen, "out of memory for %d workers", o->nproc_per_node);
        return NULL;
    }
    *g = (worker_group){.loop = loop,
                        .opts = o,
                        .restart = restart,
                        .n = o->nproc_per_node,
                        .workers = ws};
    uv_timer_init(loop, &g->grace_timer);
    uv_timer_init(loop, &g->drain_timer);
    g->grace_timer.data = g->drain_timer.data = g;
    for (int i = 0; i < g->n; i++)
        ws[i].log_fd = -1;
    for (int i = 0; i < g->n; i++) {
        ws[i].local_rank = i;
        spawn_worker(g, &ws[i], job);
        if (ws[i].spawn_error) {
            char what[128];
            launch_worker_describe_exit(&ws[i], what, sizeof what);
            fprintf(stderr, "dtrain-launch: rank %d (%s) %s\n", ws[i].rank, o->program[0], what);
            g->first_failure = &ws[i];
            group_stop(g);
            break;
        }
    }
    maybe_finish(g);
    return g;
}

/* ---- the verdict (the report itself is root_cause.c) ------------------------------ */

group_result launch_group_finish(worker_group *g, int *exit_code)
{
    if (g->first_failure)
        launch_root_cause_report(g);
    if (g->interrupted_by) { /* the user's decision overrides any failure */
        *exit_code = 128 + g->interrupted_by;
        return GROUP_INTERRUPTED;
    }
    if (!g->first_failure) {
        *exit_code = 0;
        return GROUP_SUCCEEDED;
    }
    const worker *w = g->first_failure;
    if (w->spawn_error) {
        *exit_code = w->spawn_error == UV_ENOENT ? 127 : 126; /* as a shell reports it */
        return GROUP_SPAWN_FAILED;
    }
    *exit_code = w->term_signal ? 128 + w->term_signal : (int)(w->exit_status & 0xff);
    if (*exit_code == 0)
        *exit_code = 1;
    return GROUP_FAILED;
}

void launch_group_free(worker_group *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n; i++) {
        worker *w = &g->workers[i];
        launch_output_free(&w->streams[0]);
        launch_output_free(&w->streams[1]);
        launch_env_free(w->env);
        launch_exec_args_free(w->args);
        if (w->log_fd >= 0)
            close(w->log_fd);
    }
    free(g->workers);
    free(g);
}
