/*
 * comm_internal.h — internal: the communicator's state and who owns what.
 *
 * Two kinds of thread touch a communicator:
 *
 *   API thread(s)        dt_submit / dt_run / dt_work_wait / dt_comm_destroy
 *                        / dt_comm_abort. Enqueue ops, wait for work handles,
 *                        and run a blocking collective themselves when the
 *                        loop is free (comm_thread.c).
 *   communicator thread  runs queued collectives one at a time, in
 *                        submission order, as sequential code that posts
 *                        transfers and then runs the libuv loop until they
 *                        are done; runs the loop for p2p, init and failure
 *                        clean-up, and polls it while idle.
 *
 * Ownership rules (the transport's own state, c->tp, keeps the same ones,
 * written in transport.h, with c->mu as its lock):
 *   - Fields under "loop owner only" are touched only by the thread that
 *     holds the loop (`loop_busy`, taken and given back under `mu`): the
 *     communicator thread, or an API thread running an op inline.
 *   - Fields under "mutex" are read and written with `mu` held. The
 *     transport's inbox (c->tp) is how other threads hand work to the loop:
 *     they append under `mu`, then wake the loop (uv_async_send, the only
 *     libuv call made off the loop thread).
 *   - The first failure wins: `failed`, `fail_status` and `error` are set
 *     once and never change, so every later op reports the root cause. The
 *     rooms below read them only through report.h's failure_locked.
 *
 * The rooms below hold their own state (dt_transport, dt_stager) and never
 * include this header: what they need of the communicator is handed down.
 */
#ifndef DT_COMM_INTERNAL_H
#define DT_COMM_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>

#include <sodium.h>
#include <uv.h>

#include "dt_comm.h"
#include "report.h"
#include "staging.h"
#include "transport.h"

struct dt_work {
    dt_comm *comm;
    dt_op op;
    uint64_t seq;
    double deadline; /* p2p: when dt_work_wait gives up */
    bool done;       /* under mu */
    dt_status status;
    struct dt_work *next; /* executor queue */
    dt_xfer xfer;         /* p2p: the one transfer */
    bool staged;          /* a buffer of op is device memory (staging.c) */
    void *p2p_device;     /* staged p2p: the caller's device buffer */
    bool in_flight;       /* gloo wire p2p: posted by the executor, completed later */
};

struct dt_comm {
    int rank, size;
    double timeout_s;          /* liveness: a waited-on peer's longest silence */
    double progress_timeout_s; /* progress: an op's longest wait for live peers */
    double init_timeout_s;
    size_t socket_buffer;
    char *job_id, *host, *init_url;
    dt_log_fn log;
    void *log_user;
    dt_store *store;
    bool store_borrowed;           /* options.store: the caller's, used only in dt_comm_init */
    dt_store *marker_store;        /* the job marker's key space (job_marker.c), or NULL */
    bool gloo_wire;                /* options.wire is gloo's: no listener of dtrain's (mesh.c) */
    struct gloo_ctx *gloo;         /* the gloo wire's group (comm_gloo.c); NULL on dtrain's */
    int gloo_group;                /* its torch group: 0 the world, k the k-th new_group */
    int gloo_groups_made;          /* the world's: new_groups so far (group_gloo.c) */
    struct gloo_pending *gloo_p2p; /* sends/recvs in flight on the gloo wire (p2p_gloo.c) */
    uv_async_t *gloo_waker;        /* the gloo context's (comm_gloo_wake's handle), once joined */
    atomic_bool gloo_turn;         /* the thread waits on the gloo wire: wake gloo_waker too */
    dt_store_server *store_server; /* rank 0's, while the job starts (store_host.c) */

    /* The rooms' own state, which they touch under their own rules
     * (transport.h, staging.h); the communicator sets both up (comm.c)
     * and reads and writes their fields from above. */
    dt_transport tp;  /* the loop, the connections, what is posted on them */
    dt_stager stager; /* device buffers: pinned buffers, streams, the p2p pool */

    /* loop owner only */
    uv_thread_t thread; /* runs the ops and the loop */

    /* mutex */
    pthread_mutex_t mu;
    pthread_cond_t cv_api;    /* API thread: work done, mesh ready */
    pthread_cond_t cv_thread; /* communicator thread: something to do */
    bool loop_busy;           /* a thread is running the loop (or an op) */
    bool thread_awaits_loop;  /* the communicator thread waits for loop_busy to clear */
    bool init_done;           /* dt_comm_init succeeded */
    int p2p_outstanding;      /* p2p works posted and not yet complete */
    bool failed;
    dt_status fail_status;
    char error[DT_ERROR_MAX];
    dt_work *q_head, *q_tail;
    bool stopping;
    uint64_t next_seq; /* collectives submitted so far */
    bool in_op;        /* the loop owner is running op cur_kind #cur_seq */
    dt_op_kind cur_kind;
    uint64_t cur_seq;
    char arg_error[DT_ERROR_MAX]; /* the last rejected argument or failed split (not a failure) */
    struct dt_group *group; /* set once (family.c): this communicator's place among its groups */
    uint64_t p2p_seq;       /* p2p ops submitted so far */
};

/* The files below come bottom first: each calls only the ones above it
 * here (tests/check_file_calls.py holds the layer to that). The rooms
 * below (transport/, staging/) call log.c, family.c, fail.c and wake.c only
 * through the table comm.c hands them (report.h), as the rooms below the
 * communicator must (README.md); they never include this header. */

/* wake.c: waking the communicator thread (cond var, the loop's async
 * handle while it runs, the gloo wire's while it waits there), with mu
 * held or not; a timed wait on the monotonic clock, deadline in dt_now()
 * seconds; a work handle done (with mu held), which wakes its waiters. */
void comm_wake_thread(dt_comm *c);
void comm_wake_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, double deadline);
void comm_wake_work_done(dt_work *w, dt_status st);

/* log.c: a line for the log (rejected strangers, pinned memory refused). */
void comm_log(dt_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* family.c: the tree of communicators made from one world by splits (its
 * records and their making: family.h). comm_family_who writes "rank 2" or,
 * for a split's child, "rank 0 (world rank 3) of group 'split 1 colour 1'
 * = world ranks 3,5" into out; true for a child; with c->mu held. */
bool comm_family_who(const dt_comm *c, char *out, size_t n);
/* Label the address of an authenticated connection of a child to `peer`
 * with that peer's world rank (report.h's label_peer). */
void comm_family_label_peer(dt_comm *c, int peer, char *addr, size_t n);
/* dt_comm_destroy: leave the family first (nothing spreads to c after),
 * free c's group record last. */
void comm_family_detach(dt_comm *c);
void comm_family_free(dt_comm *c);

/* fail.c: record the first failure (any thread), wake everyone, and have
 * the loop fail every pending transfer and close the connections; spread
 * it to c's family. */
void comm_fail(dt_comm *c, dt_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void comm_failv(dt_comm *c, dt_status st, const char *fmt, va_list ap);
/* Record a failure on c alone, never spreading it to c's groups (a spread
 * failure reaches the others this way). */
void comm_fail_member(dt_comm *c, dt_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* With mu held, as the op running on this rank ends: a failure a peer
 * reported from a later op (transport_read.c holds it back in c->tp until
 * then) becomes this communicator's failure. True if it did: comm_wake_thread
 * after unlocking. */
bool comm_fail_deferred_locked(dt_comm *c);
/* The same before the op ends, once it has had its grace (comm_xfer_wait). */
void comm_fail_deferred(dt_comm *c);
/* With mu held: the first collective this rank has not finished; whether
 * it runs one; DT_OK or the first failure's status (its message into
 * why[0..n)). */
uint64_t comm_fail_first_unfinished_locked(const dt_comm *c);
bool comm_fail_in_op_locked(const dt_comm *c);
dt_status comm_fail_status_locked(const dt_comm *c, char *why, size_t n);

/* comm_env.c: the job id a launcher's environment implies (Open MPI, PMIx,
 * Slurm), or "dtrain"; malloc'd. */
char *comm_env_default_job_id(void);

/* comm_env.c: the options a group's communicator inherits from its parent
 * (store, host, timeouts, log), as rank `rank` of `size` under `job_id`;
 * each kind of group sets the rest. */
void comm_env_child_options(dt_comm_options *o, const dt_comm *parent, int rank, int size,
                            const char *job_id);

/* validate.c: DT_OK if op is well formed for c, else DT_EINVAL with the
 * reason in c->arg_error. */
dt_status comm_validate_op(dt_comm *c, const dt_op *op);

/* executor.c: running a collective (on the thread that holds the loop) */
dt_status comm_executor_run(dt_comm *c, dt_work *w);

/* comm_thread.c: who runs the loop. Start the loop, the listener and the
 * communicator thread; stop the thread (it says BYE and closes the mesh
 * first), before comm_mesh_stop closes the loop. */
dt_status comm_thread_start(dt_comm *c);
void comm_thread_stop(dt_comm *c);
/* Run a blocking collective on the caller's thread when the loop is free;
 * false (nothing done) when it must queue instead. */
bool comm_thread_run_inline(dt_comm *c, dt_work *w, dt_status *st);
/* Post a tagged send or receive: on the caller's thread when the loop is
 * free and nothing is waiting for it (then its first bytes move at once),
 * otherwise through the inbox (comm_transport_post). */
void comm_thread_post_p2p(dt_comm *c, dt_xfer *x);

/* comm.c, shared with group.c: set up a communicator from options (no I/O),
 * and, once its peers' addresses are in c->dial, connect the mesh and wait
 * for it until `deadline` (dt_now() seconds). */
dt_status comm_setup(dt_comm *c, const dt_comm_options *o);
dt_status comm_connect_mesh(dt_comm *c, double deadline);

/* comm_gloo.c: the gloo wire. Joins (after comm_setup) and leaves; the
 * executor runs its ops (comm_gloo_run, gloo/gloo.h). */
dt_status comm_gloo_wire_init(dt_comm *c, const dt_comm_options *o);
/* gloo_config's note: a stranger dropped, logged and counted on arg (a dt_comm). */
void comm_gloo_note_stranger(void *arg, const char *line);
/* dt_comm_traffic on this wire: the gloo group's counts (dt_traffic's
 * fields in order). */
void comm_gloo_wire_traffic(dt_comm *c, uint64_t out[4]);
/* p2p_gloo.c: tagged send/recv on the gloo wire. The executor posts w's
 * message and marks it in flight; comm_gloo_p2p_reap completes what has
 * finished (after every op, and from the thread's turns on the wire,
 * comm_gloo_p2p_progress, which last until something happens there or
 * comm_wake_thread). All by the loop owner; _forget at destroy. */
dt_status comm_gloo_p2p_start(dt_comm *c, dt_work *w);
void comm_gloo_p2p_reap(dt_comm *c);
void comm_gloo_p2p_progress(dt_comm *c);
void comm_gloo_p2p_forget(dt_comm *c);
/* Joins the group cfg names through store (the world's) and marks c ready. */
struct gloo_config;
dt_status comm_gloo_wire_join(dt_comm *c, dt_store *store, const struct gloo_config *cfg);
/* group_gloo.c: dt_comm_split on the gloo wire (torch's new_group). */
dt_status comm_group_gloo_split(dt_comm *parent, int color, int key, dt_comm **child);

void comm_gloo_wire_destroy(dt_comm *c);

/* ---- job_marker.c: "another secret" told apart from "not started yet" ---- */

#define COMM_MARKER_POLL_S 0.25 /* between looks at a missing peer's fingerprint */

/* With a marker (DT_JOB_MARKER): publishes this rank's key fingerprint in
 * the marker's key space. DT_OK and nothing done without one. */
dt_status comm_marker_publish(dt_comm *c, const char *marker);
/* DT_EINVAL, failing c naming "DT_SECRET differs", when peer's fingerprint
 * is there and is not ours (after lingering 2·COMM_MARKER_POLL_S, so that
 * the peer has looked too before this rank's end can take the store away);
 * DT_OK otherwise (also while it is absent). */
dt_status comm_marker_check(dt_comm *c, int peer);
void comm_marker_close(dt_comm *c);

#endif /* DT_COMM_INTERNAL_H */
