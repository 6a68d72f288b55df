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
 * Ownership rules (a reader of transport_read.c and transport.c must keep
 * these in mind):
 *   - Fields under "loop owner only" are touched only by the thread that
 *     holds the loop (`loop_busy`, taken and given back under `mu`): the
 *     communicator thread, or an API thread running an op inline.
 *   - Fields under "mutex" are read and written with `mu` held. The inbox is
 *     how other threads hand work to the loop: they append under `mu`, then
 *     uv_async_send(&wake), the only libuv call made off the loop thread.
 *   - The first failure wins: `failed`, `fail_status` and `error` are set
 *     once and never change, so every later op reports the root cause.
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
#include "transport.h"

#define DT_ERROR_MAX 1024

/* Receive states of one connection. */
enum {
    RX_HANDSHAKE,  /* reading a fixed-size handshake message into hs_buf */
    RX_HEADER,     /* reading a frame header */
    RX_WAIT_MATCH, /* header read, no receive posted for it yet: paused */
    RX_PAYLOAD,    /* reading the payload into rx_cur's buffer */
    RX_NOTICE,     /* reading an ABORT frame's text */
    RX_STOPPED,    /* failed or closing: nothing more is read */
};

/* Read-ahead per connection: a read at a frame boundary takes up to this
 * much, so a small frame (header + payload) costs one read(2). */
#define RX_STAGE_BYTES 16384

typedef struct dt_conn {
    dt_comm *comm;
    uv_tcp_t tcp;
    uv_connect_t connect_req;
    int peer;        /* rank once known, else -1 */
    int expect_peer; /* outgoing connections: the rank we dialled */
    bool outgoing;
    bool authenticated;
    bool closing;
    bool bye;        /* peer said it is leaving */
    bool lost;       /* EOF or error seen */
    bool has_handle; /* tcp was initialised */
    bool shut_down;  /* our side is shut down (FIN queued): close once acknowledged */
    int hs_phase;    /* handshake step */
    char addr[64];   /* "host:port" of the peer */
    double deadline; /* handshake must finish by then */
    double retry_at; /* outgoing: reconnect after a refusal */
    struct sockaddr_storage dial_addr;
    struct dt_conn *next; /* in comm->pending while handshaking */

    int rx_state;
    size_t rx_got;  /* bytes of the current unit read so far */
    size_t rx_need; /* handshake/notice: bytes of the current unit */
    dt_frame_hdr rx_hdr;
    dt_xfer *rx_cur;                /* receive being filled */
    bool reading;                   /* uv_read_start is in effect */
    bool rx_into_stage;             /* the read in flight lands in rx_stage */
    int rx_deferred;                /* EOF/error that came behind staged frames */
    size_t stage_off, stage_len;    /* unconsumed read-ahead: [off, len) */
    char rx_stage[RX_STAGE_BYTES];  /* read-ahead at frame boundaries */
    dt_xfer *coll_head, *coll_tail; /* posted collective receives, in order */
    dt_xfer *failed_sends;          /* sends the peer refused, awaiting the reader's verdict */
    uint8_t hs_buf[128];            /* handshake messages in and out */
    uint8_t hs_hello[48];           /* kept: both MACs cover it */
    uint8_t hs_challenge[64];
    uint8_t hs_out[64];
    uv_write_t hs_write;
    char notice[DT_ERROR_MAX + 8]; /* ABORT frame: u32 status, text */
    uint32_t notice_status;

    /* liveness and progress (heartbeat.c) */
    double heard_at;  /* when bytes from the peer last arrived (or reading resumed) */
    double beat_at;   /* when we last sent it a heartbeat */
    bool peer_beat;   /* a heartbeat from it has arrived: the two below are known */
    bool peer_in_op;  /* it is running collective peer_at ... */
    uint64_t peer_at; /* ... or has not started it: the first it has not finished */
} dt_conn;

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

/* Rejected connections, logged without flooding (reject_log.c). */
#define REJECT_LOG_ADDRS 4
typedef struct reject_log {
    int full;            /* logged in full since the last quiet interval */
    uint64_t suppressed; /* counted, not yet in a summary line */
    double since, last;  /* the summary interval's start; the last rejection */
    int n_addrs;         /* distinct hosts among the suppressed, at most 4 */
    char addrs[REJECT_LOG_ADDRS][64];
} reject_log;

struct dt_comm {
    const comm_report *report; /* how the rooms below report up (report.h); set first */
    int rank, size;
    double timeout_s;          /* liveness: a waited-on peer's longest silence */
    double progress_timeout_s; /* progress: an op's longest wait for live peers */
    double init_timeout_s;
    size_t socket_buffer;
    char *job_id, *host, *init_url;
    dt_log_fn log;
    void *log_user;
    uint8_t key[crypto_auth_KEYBYTES]; /* handshake key, from the job secret */
    uint8_t job_hash[16];
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
    int port;
    char (*peer_addr)[64]; /* [size] "host:port", fixed after init */
    atomic_uint_fast64_t rejected;
    atomic_uint_fast64_t traffic[4]; /* dt_traffic's fields in order (conn.c counts) */
    struct dt_device *device;        /* options.device: buffers it owns are staged; or NULL */
    struct staging *staging;         /* staging.c: pinned buffers, stream; loop owner only */
    reject_log reject_log;           /* loop owner only (then destroy): reject_log.c */
    struct p2p_pool *p2p_pool;       /* staging_p2p.c: send/recv host buffers; made under mu */

    /* loop owner only */
    uv_loop_t loop;
    uv_async_t wake;
    uv_tcp_t listener;
    uv_timer_t ticker;  /* handshake deadlines, reconnects, grace close */
    uv_thread_t thread; /* runs the ops and the loop */
    bool loop_ready, listener_open;
    atomic_bool io_running;
    dt_conn **peers;              /* [size] authenticated connections */
    dt_conn *pending;             /* handshaking connections */
    dt_xfer *p2p_head, *p2p_tail; /* posted p2p receives, in order */
    bool io_failed_done;          /* failure cleanup ran */
    bool io_shutdown;             /* shutdown started */
    double close_at;              /* after failure/shutdown: force-close time */
    int open_handles;             /* conns not yet closed */

    /* mutex */
    pthread_mutex_t mu;
    pthread_cond_t cv_api;    /* API thread: work done, mesh ready */
    pthread_cond_t cv_thread; /* communicator thread: something to do */
    bool loop_busy;           /* a thread is running the loop (or an op) */
    bool thread_awaits_loop;  /* the communicator thread waits for loop_busy to clear */
    bool init_done;           /* dt_comm_init succeeded */
    bool lost_at_startup;     /* the failure: a peer left while the mesh formed */
    int p2p_outstanding;      /* p2p works posted and not yet complete */
    dt_xfer *inbox_head, *inbox_tail;
    bool want_connect, want_fail;
    struct sockaddr_storage *dial; /* [size] addresses of lower ranks */
    int connected;                 /* authenticated peers */
    bool mesh_ready;
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
    bool fail_deferred;     /* a peer failed in an op after the one running here */
    double deferred_until;  /* ... and the op running here gets until then */
    dt_status deferred_status;
    char deferred_error[DT_ERROR_MAX];
    uint64_t p2p_seq; /* p2p ops submitted so far */

    /* loop owner only */
    void *scratch[2];
    size_t scratch_cap[2];
    uint32_t *sent_index, *recv_index; /* [size] each */
};

/* The files below come bottom first: each calls only the ones above it
 * here (tests/check_file_calls.py holds the layer to that). Those of
 * transport/ call log.c, family.c and fail.c only through c->report
 * (report.h), as the rooms below the communicator must (README.md). */

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
/* Label an authenticated connection of a child with its peer's world rank. */
void comm_family_label_peer(dt_conn *cn);
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
 * reported from a later op (transport_read.c holds it back until then) becomes
 * this communicator's failure. True if it did: comm_wake_thread after unlocking. */
bool comm_fail_deferred_locked(dt_comm *c);
/* The same before the op ends, once it has had its grace (comm_xfer_wait). */
void comm_fail_deferred(dt_comm *c);
/* With mu held: the first collective this rank has not finished. */
uint64_t comm_fail_first_unfinished_locked(const dt_comm *c);

/* reject_log.c: a rejection to log or count (loop thread); the ticker's
 * summary once an interval has passed; the count left at destroy. */
void comm_reject_log_note(dt_comm *c, const char *addr, const char *why);
void comm_reject_log_tick(dt_comm *c);
void comm_reject_log_flush(dt_comm *c);

/* conn.c: what the layers of a connection share (run on the loop) */
void comm_conn_release_xfer(dt_comm *c, dt_xfer *x, int state); /* hand back to owner */
void comm_conn_release_list(dt_comm *c, dt_xfer *x);            /* fail a list of receives */
void comm_conn_expect(dt_conn *cn, int state, size_t bytes);    /* the next unit to read */
void comm_conn_stop_reading(dt_conn *cn);
void comm_conn_watch_liveness(dt_conn *cn); /* the kernel watches the peer's host */
void comm_conn_close(dt_conn *cn);
void comm_conn_unlink_pending(dt_conn *cn); /* out of comm->pending */
/* During a shutdown, once no connection is left open: close the loop's own
 * handles (the ticker, the wake-up), so that the loop ends. */
void comm_conn_maybe_finish(dt_comm *c);

/* handshake.c, run on the loop: the first message of a new connection
 * (the caller then starts reading it); the next one, in hs_buf (rx_need
 * bytes), true when it proved that rank cn->expect_peer is on the other
 * end; a stranger turned away; the connection lost (err) mid-handshake. */
void comm_handshake_start_outgoing(dt_conn *cn);
void comm_handshake_start_incoming(dt_conn *cn);
bool comm_handshake_step(dt_conn *cn);
void comm_handshake_reject(dt_conn *cn, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void comm_handshake_lost(dt_conn *cn, ssize_t err);

/* transport_read.c: the reader of every connection, run on the loop:
 * reading on or off; a header that waited for its receive (rx_state
 * RX_WAIT_MATCH), matched again now that one was posted. */
void comm_transport_read_set(dt_conn *cn, bool on);
void comm_transport_read_header(dt_conn *cn);
/* Does anything posted still wait for data from this peer? */
bool comm_transport_expects_from(dt_comm *c, dt_conn *cn);
/* "send #3 with tag 7 (...)": a frame header, for messages. */
void comm_transport_describe_hdr(char *out, size_t n, const dt_frame_hdr *h);

/* transport.c: frames out, and transfers posted (run on the loop, except
 * comm_transport_post, which any thread may call) */
void comm_transport_post(dt_comm *c, dt_xfer *x);      /* from another thread */
void comm_transport_post_here(dt_comm *c, dt_xfer *x); /* by the loop owner */
void comm_transport_io_post(dt_comm *c, dt_xfer *x);   /* send or match a receive */
void comm_transport_send_control(dt_conn *cn, uint8_t kind, uint64_t seq, const void *payload,
                                 size_t len);

/* heartbeat.c, run on the loop: the ticker's turn (a heartbeat out to every
 * peer once a beat; a peer something posted waits on that has been silent
 * past the liveness limit fails the communicator); and, for an op that
 * reached its progress limit, which ranks have not joined it, as their
 * heartbeats tell ("rank 1 (ADDR) is alive but has not joined it: ..."). */
void comm_heartbeat_tick(dt_comm *c, double now);
void comm_heartbeat_absent(dt_comm *c, uint64_t seq, int waited_on, char *out, size_t n);

/* mesh.c: connections and the loop */
dt_status comm_mesh_start(dt_comm *c); /* the loop and the listener */
void comm_mesh_connect(dt_comm *c);    /* dial c->dial[0..rank) */
void comm_mesh_stop(dt_comm *c);       /* stop the thread, close the loop */
void comm_mesh_shutdown(dt_comm *c);   /* on the thread: BYE, close all */

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
 * communicator thread. */
dt_status comm_thread_start(dt_comm *c);
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
