/*
 * tsan_driver.c — the communicator's threaded failure paths as one plain
 * program, for ThreadSanitizer.
 *
 * Criterion's runner cannot start under TSan, so the failure scenarios that
 * test_failures.c pins down as specifications run here again, in a form TSan
 * can watch: ranks as threads of this process (so TSan sees both sides of
 * every hand-off), and a real SIGKILLed rank in a forked child. Each scenario
 * checks the status and the message it must produce and prints one TAP line;
 * the exit status is 0 only when every scenario passed. Under TSan any data
 * race is reported by the runtime (and fails the run through TSAN_OPTIONS'
 * exitcode and the report files dev.sh collects).
 *
 *   kill      a forked rank is SIGKILLed mid-job; the survivor names it
 *   abort     dt_comm_abort from a second thread while an op waits, and the
 *             waiting thread destroys the communicator as soon as it wakes
 *   timeout   a rank skips an op; the other's op times out naming it
 *   mismatch  ranks disagree about the count; both get DT_EPROTO
 *   async     4 ranks submit async collectives and p2p from two threads each
 *   gloo      on the gloo wire: sends queued while receives are in flight
 *             (they wake the thread's wait on the wire), then an abort from
 *             a second thread while a receive is in flight and an
 *             all-reduce waits
 *
 * usage: tsan_driver [SCENARIO...]   (default: all, in the order above)
 */
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dt_comm.h"

#define MAX_RANKS 4

typedef struct scenario_job {
    char url[128];
    int world;
    double timeout_s;
    dt_wire wire;
} scenario_job;

typedef struct rank_result {
    dt_status status;
    char msg[1024];
} rank_result;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void job_init(scenario_job *j, const char *name, int world, double timeout_s)
{
    snprintf(j->url, sizeof j->url, "file:///tmp/dtrain-tsan-%s-%d", name, (int)getpid());
    j->world = world;
    j->timeout_s = timeout_s;
    j->wire = DT_WIRE_DTRAIN;
}

static void quiet_log(void *user, const char *line)
{
    (void)user;
    (void)line;
}

/* Joins the job as `rank`; NULL (and a message in *r) on failure. */
static dt_comm *join(const scenario_job *j, int rank, rank_result *r)
{
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = rank;
    o.world_size = j->world;
    o.init_url = j->url;
    o.job_id = "tsan";
    o.timeout_s = j->timeout_s;
    o.init_timeout_s = 30;
    o.log = quiet_log;
    o.wire = j->wire;
    dt_comm *c = NULL;
    dt_status st = dt_comm_init(&c, &o);
    if (st == DT_OK)
        return c;
    r->status = st;
    snprintf(r->msg, sizeof r->msg, "init: %s", c ? dt_comm_error(c) : "out of memory");
    if (c)
        dt_comm_destroy(c);
    return NULL;
}

static void record(rank_result *r, dt_status st, dt_comm *c)
{
    r->status = st;
    snprintf(r->msg, sizeof r->msg, "%s", dt_comm_error(c));
}

/* ---- one rank per thread ---------------------------------------------------- */

typedef struct rank_arg {
    const scenario_job *job;
    int rank;
    void (*fn)(struct rank_arg *a, dt_comm *c);
    rank_result result;
} rank_arg;

static void *rank_main(void *p)
{
    rank_arg *a = p;
    dt_comm *c = join(a->job, a->rank, &a->result);
    if (c)
        a->fn(a, c); /* fn destroys c */
    return NULL;
}

static void run_ranks(const scenario_job *j, rank_arg *args, void (*fn)(rank_arg *a, dt_comm *c))
{
    pthread_t t[MAX_RANKS];
    for (int r = 0; r < j->world; r++) {
        args[r] = (rank_arg){.job = j, .rank = r, .fn = fn, .result = {.status = DT_OK}};
        pthread_create(&t[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < j->world; r++)
        pthread_join(t[r], NULL);
}

/* ---- TAP ---------------------------------------------------------------- */

static int tap_index, tap_failed;

__attribute__((format(printf, 3, 4))) static void verdict(bool ok, const char *name,
                                                          const char *fmt, ...)
{
    char why[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    printf("%s %d - %s\n", ok ? "ok" : "not ok", ++tap_index, name);
    if (!ok) {
        printf("# %s\n", why);
        tap_failed++;
    }
    fflush(stdout);
}

static bool has(const char *msg, const char *part)
{
    return strstr(msg, part) != NULL;
}

/* ---- abort -------------------------------------------------------------- */

typedef struct abort_ctx {
    dt_comm *comm;
} abort_ctx;

static void *abort_later(void *p)
{
    abort_ctx *a = p;
    usleep(100 * 1000);
    dt_comm_abort(a->comm, "the driver says stop");
    return NULL;
}

/* Rank 0 waits on an all-reduce rank 1 never joins; a second thread aborts
 * it, and rank 0 destroys the communicator the moment its wait returns,
 * which is the window the header promises is safe. */
static void abort_rank(rank_arg *a, dt_comm *c)
{
    if (a->rank == 1) {
        usleep(600 * 1000);
        dt_comm_destroy(c);
        return;
    }
    float x = 1;
    dt_work *w;
    abort_ctx ctx = {c};
    pthread_t t;
    dt_status st = dt_allreduce_async(c, &x, 1, DT_F32, DT_SUM, &w);
    pthread_create(&t, NULL, abort_later, &ctx);
    if (st == DT_OK)
        st = dt_work_wait(w);
    record(&a->result, st, c);
    dt_comm_destroy(c); /* before the join: no order with the aborting thread */
    pthread_join(t, NULL);
}

static void scenario_abort(void)
{
    scenario_job j;
    rank_arg args[2];
    job_init(&j, "abort", 2, 20);
    run_ranks(&j, args, abort_rank);
    rank_result *r = &args[0].result;
    verdict(r->status == DT_EABORTED && has(r->msg, "the driver says stop"),
            "abort: a pending op ends DT_EABORTED with the reason", "%s: %s",
            dt_status_name(r->status), r->msg);
}

/* ---- timeout ------------------------------------------------------------ */

static void timeout_rank(rank_arg *a, dt_comm *c)
{
    if (a->rank == 1) {
        usleep(1500 * 1000); /* never calls the all-reduce */
        dt_comm_destroy(c);
        return;
    }
    float x[4] = {1, 2, 3, 4};
    dt_op op = {.kind = DT_OP_ALLREDUCE,
                .recv = x,
                .count = 4,
                .dtype = DT_F32,
                .redop = DT_SUM,
                .timeout_s = 0.5};
    record(&a->result, dt_run(c, &op), c);
    dt_comm_destroy(c);
}

static void scenario_timeout(void)
{
    scenario_job j;
    rank_arg args[2];
    job_init(&j, "timeout", 2, 20);
    run_ranks(&j, args, timeout_rank);
    rank_result *r = &args[0].result;
    verdict(r->status == DT_ETIMEDOUT && has(r->msg, "rank 1"),
            "timeout: the op times out naming the silent rank", "%s: %s", dt_status_name(r->status),
            r->msg);
}

/* ---- mismatch ----------------------------------------------------------- */

static void mismatch_rank(rank_arg *a, dt_comm *c)
{
    size_t count = a->rank == 0 ? 4096 : 8192;
    float *buf = calloc(count, sizeof *buf);
    record(&a->result, buf ? dt_allreduce(c, buf, count, DT_F32, DT_SUM) : DT_ENOMEM, c);
    free(buf);
    dt_comm_destroy(c);
}

static void scenario_mismatch(void)
{
    scenario_job j;
    rank_arg args[2];
    job_init(&j, "mismatch", 2, 10);
    run_ranks(&j, args, mismatch_rank);
    for (int r = 0; r < 2; r++) {
        rank_result *v = &args[r].result;
        char name[96];
        snprintf(name, sizeof name, "mismatch: rank %d gets DT_EPROTO with both counts", r);
        verdict(v->status == DT_EPROTO && has(v->msg, "4096 x f32") && has(v->msg, "8192 x f32"),
                name, "%s: %s", dt_status_name(v->status), v->msg);
    }
}

/* ---- kill --------------------------------------------------------------- */

/* The victim: a forked process that all-reduces until it is killed. */
static void victim_main(const scenario_job *j)
{
    rank_result r;
    dt_comm *c = join(j, 1, &r);
    if (!c)
        _exit(1);
    for (;;) {
        float x = 1;
        if (dt_allreduce(c, &x, 1, DT_F32, DT_SUM) != DT_OK)
            _exit(1);
    }
}

/* Forks before this process starts any thread of its own (the parent's
 * communicator comes after the fork). */
static void scenario_kill(void)
{
    scenario_job j;
    job_init(&j, "kill", 2, 20);
    pid_t pid = fork();
    if (pid == 0)
        victim_main(&j);
    rank_result r = {.status = DT_OK};
    dt_comm *c = pid > 0 ? join(&j, 0, &r) : NULL;
    double killed_at = 0;
    for (int i = 0; c && r.status == DT_OK; i++) {
        float x = 1;
        if (i == 50) {
            kill(pid, SIGKILL);
            killed_at = now_s();
        }
        dt_status st = dt_allreduce(c, &x, 1, DT_F32, DT_SUM);
        if (st != DT_OK)
            record(&r, st, c);
    }
    double noticed = now_s() - killed_at;
    if (c)
        dt_comm_destroy(c);
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    verdict(r.status == DT_EPEER && has(r.msg, "rank 1") && killed_at > 0 && noticed < 10,
            "kill: the survivor names the killed rank", "%s after %.2f s: %s",
            dt_status_name(r.status), noticed, r.msg);
}

/* ---- async -------------------------------------------------------------- */

enum { ASYNC_ROUNDS = 20, ASYNC_COUNT = 1024 };

typedef struct p2p_arg {
    dt_comm *comm;
    int rank, world;
    bool ok;
} p2p_arg;

/* A second thread per rank: p2p around the ring while the rank's own
 * thread runs collectives, so the API threads, the communicator thread and
 * the loop all hand work to each other. */
static void *ring_p2p(void *p)
{
    p2p_arg *a = p;
    int right = (a->rank + 1) % a->world, left = (a->rank + a->world - 1) % a->world;
    a->ok = true;
    for (int i = 0; i < ASYNC_ROUNDS && a->ok; i++) {
        int32_t out = a->rank * 1000 + i, in = -1;
        dt_work *s, *r;
        if (dt_recv_async(a->comm, &in, 1, DT_I32, left, 7, NULL, &r) != DT_OK) {
            a->ok = false;
            break;
        }
        dt_status sent = dt_send_async(a->comm, &out, 1, DT_I32, right, 7, &s);
        if (sent == DT_OK)
            sent = dt_work_wait(s);
        dt_status got = dt_work_wait(r);
        a->ok = sent == DT_OK && got == DT_OK && in == left * 1000 + i;
    }
    return NULL;
}

/* Each round: two all-reduces in flight at once, then a broadcast; every
 * result is checked. */
static bool async_collectives(dt_comm *c, int rank, int world)
{
    int32_t a[ASYNC_COUNT], b[ASYNC_COUNT];
    for (int i = 0; i < ASYNC_ROUNDS; i++) {
        for (int k = 0; k < ASYNC_COUNT; k++)
            a[k] = b[k] = rank + k + i;
        dt_work *wa, *wb;
        if (dt_allreduce_async(c, a, ASYNC_COUNT, DT_I32, DT_SUM, &wa) != DT_OK)
            return false;
        dt_status st = dt_allreduce_async(c, b, ASYNC_COUNT, DT_I32, DT_MAX, &wb);
        dt_status sa = dt_work_wait(wa);
        if (st == DT_OK)
            st = dt_work_wait(wb);
        if (sa != DT_OK || st != DT_OK)
            return false;
        for (int k = 0; k < ASYNC_COUNT; k++)
            if (a[k] != world * (k + i) + world * (world - 1) / 2 || b[k] != world - 1 + k + i)
                return false;
        int32_t v = rank == i % world ? i : -1; /* the root's value wins */
        if (dt_broadcast(c, &v, 1, DT_I32, i % world) != DT_OK || v != i)
            return false;
    }
    return true;
}

static void async_rank(rank_arg *a, dt_comm *c)
{
    p2p_arg p2p = {.comm = c, .rank = a->rank, .world = a->job->world};
    pthread_t t;
    pthread_create(&t, NULL, ring_p2p, &p2p);
    bool ok = async_collectives(c, a->rank, a->job->world);
    pthread_join(t, NULL);
    record(&a->result, ok && p2p.ok ? DT_OK : DT_EPEER, c);
    if (!ok || !p2p.ok)
        snprintf(a->result.msg, sizeof a->result.msg, "%s wrong or failed: %s",
                 !ok ? "collectives" : "p2p", dt_comm_error(c));
    dt_comm_destroy(c);
}

static void scenario_async(void)
{
    scenario_job j;
    rank_arg args[MAX_RANKS];
    job_init(&j, "async", MAX_RANKS, 20);
    run_ranks(&j, args, async_rank);
    bool ok = true;
    const char *why = "";
    for (int r = 0; r < MAX_RANKS; r++)
        if (args[r].result.status != DT_OK) {
            ok = false;
            why = args[r].result.msg;
        }
    verdict(ok, "async: collectives and p2p from two threads per rank agree", "%s", why);
}

/* ---- gloo wire -------------------------------------------------------------- */

/* 50 round trips, each rank posting its next receive before it sends;
 * then rank 0 is aborted from a second thread with a receive in flight
 * and an all-reduce rank 1 never joins, and destroys at once. */
static void gloo_rank(rank_arg *a, dt_comm *c)
{
    const int peer = 1 - a->rank;
    int32_t v = 0;
    dt_work *w = NULL;
    dt_status st = dt_recv_async(c, &v, 1, DT_I32, peer, 0, NULL, &w);
    for (int i = 0; i < 50 && st == DT_OK; i++) {
        if (a->rank == 0)
            st = dt_send(c, &v, 1, DT_I32, 1, (uint32_t)i);
        dt_status got = dt_work_wait(w);
        st = st != DT_OK ? st : got;
        w = NULL;
        if (st == DT_OK && i < 49)
            st = dt_recv_async(c, &v, 1, DT_I32, peer, (uint32_t)i + 1, NULL, &w);
        if (st == DT_OK && a->rank == 1)
            st = dt_send(c, &v, 1, DT_I32, 0, (uint32_t)i);
    }
    if (w)
        dt_work_wait(w);
    if (st != DT_OK || a->rank == 1) {
        if (a->rank == 1)
            usleep(600 * 1000);
        record(&a->result, st, c);
        dt_comm_destroy(c);
        return;
    }
    float x = 1, y = 0;
    dt_work *in_flight = NULL, *sum = NULL;
    abort_ctx ctx = {c};
    pthread_t t;
    st = dt_recv_async(c, &y, 1, DT_F32, 1, 99, NULL, &in_flight);
    if (st == DT_OK)
        st = dt_allreduce_async(c, &x, 1, DT_F32, DT_SUM, &sum);
    pthread_create(&t, NULL, abort_later, &ctx);
    dt_status s1 = in_flight ? dt_work_wait(in_flight) : st;
    dt_status s2 = sum ? dt_work_wait(sum) : st;
    record(&a->result, s1 == DT_EABORTED ? s2 : s1, c);
    dt_comm_destroy(c); /* before the join: no order with the aborting thread */
    pthread_join(t, NULL);
}

static void scenario_gloo(void)
{
    scenario_job j;
    rank_arg args[2];
    job_init(&j, "gloo", 2, 600);
    j.wire = DT_WIRE_GLOO;
    unlink(j.url + 7); /* torch's key space: a stale file would hand out dead addresses */
    run_ranks(&j, args, gloo_rank);
    unlink(j.url + 7);
    rank_result *r = &args[0].result;
    verdict(r->status == DT_EABORTED && has(r->msg, "the driver says stop") &&
                args[1].result.status == DT_OK,
            "gloo: round trips, then an abort ends the receive in flight and the waiting "
            "all-reduce",
            "rank 0 %s: %s; rank 1 %s: %s", dt_status_name(r->status), r->msg,
            dt_status_name(args[1].result.status), args[1].result.msg);
}

/* ---- main --------------------------------------------------------------- */

static const struct {
    const char *name;
    void (*run)(void);
} scenarios[] = {
    {"kill", scenario_kill}, /* first: it forks, before any thread exists */
    {"abort", scenario_abort}, {"timeout", scenario_timeout}, {"mismatch", scenario_mismatch},
    {"async", scenario_async}, {"gloo", scenario_gloo},
};
enum { NUM_SCENARIOS = sizeof scenarios / sizeof scenarios[0] };

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    bool want[NUM_SCENARIOS];
    for (int s = 0; s < NUM_SCENARIOS; s++)
        want[s] = argc < 2;
    for (int i = 1; i < argc; i++) {
        int s = 0;
        while (s < NUM_SCENARIOS && strcmp(argv[i], scenarios[s].name) != 0)
            s++;
        if (s == NUM_SCENARIOS) {
            fprintf(stderr, "tsan_driver: unknown scenario '%s'\n", argv[i]);
            return 2;
        }
        want[s] = true;
    }
    int planned = 0;
    for (int s = 0; s < NUM_SCENARIOS; s++)
        planned += want[s] ? (strcmp(scenarios[s].name, "mismatch") == 0 ? 2 : 1) : 0;
    printf("1..%d\n", planned);
    for (int s = 0; s < NUM_SCENARIOS; s++)
        if (want[s])
            scenarios[s].run();
    return tap_failed == 0 && tap_index == planned ? 0 : 1;
}
