/*
 * rank_threads.h — run the ranks of a job as threads of one process.
 *
 * A test describes what one rank does (a rank_fn); rank_threads_run starts
 * `world` threads, each of which joins a fresh job through its own
 * communicator (a new file:// rendezvous URL per job, unique within the
 * process and across processes by pid), runs the function, and destroys the
 * communicator. The caller then reads each rank's verdict.
 *
 * Why threads and not processes: collectives are about data, and threads
 * make every rank's buffers visible to one test, so the ranks can share one
 * serial reference and a barrier of their own (rank_sync) to line up the
 * cases. Nothing here is global except the URL counter: each job is a
 * struct owned by the test.
 *
 * Failures. Criterion's assertions may only run on the test's own thread,
 * so a rank records what went wrong with rank_fail (the first message is
 * kept) and the test asserts on the verdicts after the join. A rank that
 * merely saw a wrong value keeps going, so that every rank still submits the
 * same collectives in the same order; a rank whose collective failed returns
 * at once (its communicator is failed, and the transport tells the others).
 * A rank that returns failed breaks rank_sync for the others, so nobody
 * waits on it there.
 *
 * Bounds: every communicator gets op and init timeouts well below the
 * Criterion timeouts the tests set, so a hang becomes a message naming the
 * rank and the op rather than a killed test.
 */
#ifndef DT_TEST_RANK_THREADS_H
#define DT_TEST_RANK_THREADS_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "dt_comm.h"

#define RANK_THREADS_MAX 8
#define RANK_OP_TIMEOUT_S 20.0   /* per collective; the tests allow more */
#define RANK_INIT_TIMEOUT_S 20.0 /* rendezvous + connecting */

typedef struct rank_job rank_job;

typedef struct rank_ctx {
    int rank, world;
    dt_comm *comm; /* this rank's communicator for the job */
    void *arg;     /* the test's argument, shared by all ranks */
    rank_job *job;
    bool failed;
    char msg[1024]; /* the first failure, for the test's report */
} rank_ctx;

typedef void (*rank_fn)(rank_ctx *rc);

struct rank_job {
    int world;
    char url[128]; /* the job's rendezvous URL */
    rank_fn fn;
    void *arg;
    /* rank_sync: a barrier that a failed rank can break */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned long generation;
    bool broken;
    struct dt_device **devices; /* NULL, or [world]: options.device of each rank */
    rank_ctx ranks[RANK_THREADS_MAX];
};

/* Records the first failure of this rank; returns false so that callers
 * can write `return rank_fail(...)`. */
__attribute__((format(printf, 2, 3))) static inline bool rank_fail(rank_ctx *rc, const char *fmt,
                                                                   ...)
{
    if (!rc->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(rc->msg, sizeof rc->msg, fmt, ap);
        va_end(ap);
        rc->failed = true;
    }
    return false;
}

/* Waits until every rank of the job calls rank_sync as often. False when a
 * rank has given up (returned failed): the caller should return too. */
static inline bool rank_sync(rank_ctx *rc)
{
    rank_job *j = rc->job;
    pthread_mutex_lock(&j->mu);
    unsigned long gen = j->generation;
    if (!j->broken && ++j->arrived == j->world) {
        j->arrived = 0;
        j->generation++;
        pthread_cond_broadcast(&j->cv);
    }
    while (!j->broken && j->generation == gen)
        pthread_cond_wait(&j->cv, &j->mu);
    bool ok = !j->broken;
    pthread_mutex_unlock(&j->mu);
    return ok || rank_fail(rc, "gave up: another rank failed");
}

static inline void rank_sync_break(rank_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->broken = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* Joins `url` as this rank, with the tests' timeouts. On failure records
 * why and returns the status (*out is then NULL). */
static inline dt_status rank_join(rank_ctx *rc, const char *url, const char *job_id, dt_comm **out)
{
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = rc->rank;
    o.world_size = rc->world;
    o.init_url = url;
    o.job_id = job_id;
    o.timeout_s = RANK_OP_TIMEOUT_S;
    o.init_timeout_s = RANK_INIT_TIMEOUT_S;
    o.device = rc->job->devices ? rc->job->devices[rc->rank] : NULL;
    dt_status st = dt_comm_init(out, &o);
    if (st != DT_OK) {
        rank_fail(rc, "init of %s: %s: %s", url, dt_status_name(st),
                  *out ? dt_comm_error(*out) : "out of memory");
        if (*out)
            dt_comm_destroy(*out);
        *out = NULL;
    }
    return st;
}

static inline void *rank_thread_main(void *p)
{
    rank_ctx *rc = p;
    if (rank_join(rc, rc->job->url, "collectives", &rc->comm) == DT_OK)
        rc->job->fn(rc);
    if (rc->failed)
        rank_sync_break(rc->job);
    if (rc->comm)
        dt_comm_destroy(rc->comm);
    rc->comm = NULL;
    return NULL;
}

/* Runs fn on ranks 0 .. world-1 of a new job and waits for all of them.
 * Verdicts are in job->ranks[r].failed / .msg. Returns the number of ranks
 * that failed (threads that could not start count as failed). devices: NULL,
 * or [world] with rank r's communicator staging devices[r]'s buffers. */
static inline int rank_threads_run_on(rank_job *job, int world, rank_fn fn, void *arg,
                                      struct dt_device **devices)
{
    static atomic_uint counter;
    memset(job, 0, sizeof *job);
    job->devices = devices;
    job->world = world;
    job->fn = fn;
    job->arg = arg;
    snprintf(job->url, sizeof job->url, "file:///tmp/dtrain-test-%d-%u", (int)getpid(),
             atomic_fetch_add(&counter, 1));
    pthread_mutex_init(&job->mu, NULL);
    pthread_cond_init(&job->cv, NULL);

    pthread_t threads[RANK_THREADS_MAX];
    bool started[RANK_THREADS_MAX] = {false};
    for (int r = 0; r < world; r++) {
        rank_ctx *rc = &job->ranks[r];
        rc->rank = r;
        rc->world = world;
        rc->arg = arg;
        rc->job = job;
        started[r] = pthread_create(&threads[r], NULL, rank_thread_main, rc) == 0;
        if (!started[r]) {
            rank_fail(rc, "could not start the thread of rank %d", r);
            rank_sync_break(job);
        }
    }
    int failed = 0;
    for (int r = 0; r < world; r++) {
        if (started[r])
            pthread_join(threads[r], NULL);
        failed += job->ranks[r].failed;
    }
    pthread_cond_destroy(&job->cv);
    pthread_mutex_destroy(&job->mu);
    return failed;
}

/* rank_threads_run_on with no devices: host buffers only. */
static inline int rank_threads_run(rank_job *job, int world, rank_fn fn, void *arg)
{
    return rank_threads_run_on(job, world, fn, arg, NULL);
}

/* rank_threads_run, then on the test's thread a Criterion expectation per
 * rank that it passed, showing what each failed rank recorded. */
static inline void rank_threads_expect_ok(int world, rank_fn fn, void *arg)
{
    rank_job *job = calloc(1, sizeof *job);
    cr_assert(job != NULL);
    rank_threads_run(job, world, fn, arg);
    for (int r = 0; r < world; r++)
        cr_expect(!job->ranks[r].failed, "rank %d of %d: %s", r, world, job->ranks[r].msg);
    free(job);
}

/* In a rank_fn: runs call, an op returning dt_status; on failure records
 * what (and the communicator's error) and returns from the rank_fn. */
#define RANK_CHECK_OK(rc, what, call)                                                        \
    do {                                                                                     \
        dt_status st_ = (call);                                                              \
        if (st_ != DT_OK) {                                                                  \
            rank_fail(rc, "%s: %s: %s", what, dt_status_name(st_), dt_comm_error(rc->comm)); \
            return;                                                                          \
        }                                                                                    \
    } while (0)

#endif /* DT_TEST_RANK_THREADS_H */
