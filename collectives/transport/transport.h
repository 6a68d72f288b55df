/*
 * transport.h — internal: frames, transfers, the transport's own state
 * (dt_transport) and the context of a running op.
 *
 * A collective's algorithm posts transfers (dt_xfer) and waits for them
 * through xfer.h.
 *
 * The transport moves the bytes: sends are written to the peer's socket in
 * posting order; frames arriving from a peer are matched, in order, against
 * the receives posted for that peer, and their payload is read straight into
 * the receive buffer. Every frame carries the op's identity (kind, sequence
 * number, count, dtype, reduction, root) and a per-peer message index, and
 * the receiver checks all of it: that is how ranks that disagree about an op
 * get a protocol error instead of a wrong answer.
 *
 * Invariants an algorithm must keep:
 *   - For each ordered pair of ranks, the sender's sends and the receiver's
 *     receives of one op are posted in the same order with the same sizes.
 *   - A posted dt_xfer and its buffer belong to the transport until
 *     comm_xfer_wait returns for it. Returning early on error is safe: the
 *     op's runner calls comm_xfer_drain(o) after every op, which runs the loop
 *     until the transport has let go of every transfer the op posted.
 *   - A zero-byte transfer is allowed (a header with no payload): barrier.
 *
 * The transport's state is a struct of its own, dt_transport, which the
 * communicator embeds (dt_comm's `tp`) and sets up. The transport never sees
 * the communicator's struct: what it needs of it comes down as plain fields
 * copied in at setup (rank, world size, the limits, the address to listen
 * on, the handshake's key), the communicator's lock and condition variable
 * (pointers), and a table to report up through (report.h) with the
 * communicator as an opaque `owner`. Includes run one way, as calls do: the
 * communicator includes this header, never the other way round.
 *
 * Who touches what (the threads are comm_internal.h's):
 *   - "fixed after setup" fields are written by the communicator before its
 *     thread starts (dial and peer_addr: before it asks for the mesh) and
 *     only read after;
 *   - "loop owner only" fields are touched only by the thread that holds
 *     the loop;
 *   - "under *mu" fields are read and written with the communicator's lock
 *     held. The inbox is how other threads hand work to the loop: they
 *     append under *mu, then wake the loop (comm_transport_wake_loop,
 *     uv_async_send, the only libuv call made off the loop thread).
 */
#ifndef DT_TRANSPORT_H
#define DT_TRANSPORT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sodium.h>
#include <uv.h>

#include "dt_clock.h"
#include "dt_comm.h"
#include "report.h"

/* The frame header, 40 bytes on the wire in host byte order (every rank of a
 * job runs on one architecture). */
typedef struct dt_frame_hdr {
    uint8_t kind;   /* FRAME_* */
    uint8_t op;     /* dt_op_kind */
    uint8_t dtype;  /* dt_dtype */
    uint8_t redop;  /* dt_redop */
    int32_t root;   /* root rank, or -1 */
    uint32_t index; /* collective: message index within the op for this peer
                        pair; p2p: the tag */
    uint32_t reserved;
    uint64_t seq;    /* collective: op sequence number; p2p: sender's p2p count */
    uint64_t count;  /* elements in the op (its defining count) */
    uint64_t length; /* payload bytes that follow */
} dt_frame_hdr;

_Static_assert(sizeof(dt_frame_hdr) == DT_FRAME_HEADER_BYTES, "dt_comm.h's header size");

enum {
    FRAME_COLL = 1,      /* part of a collective */
    FRAME_P2P = 2,       /* tagged send/recv */
    FRAME_ABORT = 3,     /* payload: u32 status + text; the sender has failed. seq:
                        the first collective the sender has not finished */
    FRAME_BYE = 4,       /* the sender is destroying its communicator */
    FRAME_HEARTBEAT = 5, /* the sender is alive (heartbeat.c). seq: the first
                            collective it has not finished; index: 1 if it is
                            running that one, 0 if it has not started it */
};

enum { XFER_POSTED = 0, XFER_DONE = 1, XFER_FAILED = 2 };

typedef struct dt_opctx dt_opctx;
typedef struct dt_work dt_work;
typedef struct dt_conn dt_conn; /* one connection (conn.h) */

typedef struct dt_xfer {
    /* set when posted */
    dt_frame_hdr hdr; /* sent as is, or the header expected */
    char *buf;
    size_t len;
    int peer; /* recv from DT_ANY_SOURCE: p2p only */
    int is_send;
    dt_opctx *owner; /* collective transfers: the op that posted it */
    dt_work *work;   /* p2p transfers: the work handle they complete */
    /* owned by the transport while posted */
    struct dt_xfer *next;
    size_t done;
    uv_write_t write_req;
    /* completion, written by the transport (p2p: under the mutex) */
    int state;  /* XFER_* */
    int source; /* recv: the rank the frame came from */
} dt_xfer;

/* Rejected connections, logged without flooding (reject_log.c). */
#define REJECT_LOG_ADDRS 4
typedef struct reject_log {
    int full;            /* logged in full since the last quiet interval */
    uint64_t suppressed; /* counted, not yet in a summary line */
    double since, last;  /* the summary interval's start; the last rejection */
    int n_addrs;         /* distinct hosts among the suppressed, at most 4 */
    char addrs[REJECT_LOG_ADDRS][64];
} reject_log;

/*
 * The transport of one communicator: its loop, its connections, what is
 * posted on them, and what the communicator handed it.
 */
typedef struct dt_transport {
    /* fixed after setup: handed down by the communicator (comm.c) */
    const comm_report *report; /* how to report up (report.h) */
    dt_comm *owner;            /* passed back through report, never looked into */
    pthread_mutex_t *mu;       /* the communicator's lock: guards "under *mu" */
    pthread_cond_t *cv_api;    /* the communicator's API threads wait on it */
    int rank, size;
    double timeout_s;                  /* liveness: a waited-on peer's longest silence */
    double progress_timeout_s;         /* progress: an op's longest wait for live peers */
    double init_timeout_s;             /* dialling a peer gives up after it */
    size_t socket_buffer;              /* SO_SNDBUF/SO_RCVBUF, 0: the kernel's autotuning */
    const char *host;                  /* the address to listen on (the communicator's) */
    uint8_t key[crypto_auth_KEYBYTES]; /* handshake key, from the job secret */
    uint8_t job_hash[16];              /* the job id's hash, in every HELLO */
    struct sockaddr_storage *dial;     /* [size] addresses of lower ranks */
    char (*peer_addr)[64];             /* [size] "host:port" */
    int port;                          /* where the listener listens */

    /* any thread */
    atomic_uint_fast64_t rejected;   /* connections turned away */
    atomic_uint_fast64_t traffic[4]; /* dt_traffic's fields in order (conn.c counts) */
    atomic_bool io_running;          /* the loop's thread runs: wake_loop may send */

    /* loop owner only */
    uv_loop_t loop;
    uv_async_t wake;
    uv_tcp_t listener;
    uv_timer_t ticker; /* handshake deadlines, reconnects, grace close */
    bool loop_ready, listener_open;
    dt_conn **peers;              /* [size] authenticated connections */
    dt_conn *pending;             /* handshaking connections */
    dt_xfer *p2p_head, *p2p_tail; /* posted p2p receives, in order */
    bool io_failed_done;          /* failure cleanup ran */
    bool io_shutdown;             /* shutdown started */
    double close_at;              /* after failure/shutdown: force-close time */
    int open_handles;             /* conns not yet closed */
    reject_log reject_log;        /* then destroy's, the thread gone (reject_log.c) */
    void *scratch[2];             /* comm_xfer_scratch */
    size_t scratch_cap[2];
    uint32_t *sent_index, *recv_index; /* [size] each: the running op's */

    /* under *mu */
    dt_xfer *inbox_head, *inbox_tail;  /* posted by other threads, for the loop */
    bool want_connect;                 /* dial the lower ranks (comm_mesh_connect) */
    bool want_fail;                    /* the communicator failed: let go of everything */
    int connected;                     /* authenticated peers */
    bool mesh_ready;                   /* every peer is connected */
    bool lost_at_startup;              /* a peer left while the mesh formed */
    bool fail_deferred;                /* a peer failed in an op after the one running here */
    double deferred_until;             /* ... and the op running here gets until then */
    dt_status deferred_status;         /* ... its status and message, which the */
    char deferred_error[DT_ERROR_MAX]; /* communicator takes over (fail.c) */
} dt_transport;

/*
 * The context of one collective while it runs.
 */
struct dt_opctx {
    dt_transport *tp;
    const dt_op *op;
    uint64_t seq;        /* this op's sequence number */
    uint64_t wire_count; /* count sent in frame headers (allgatherv: the sum) */
    int rank, size;
    double deadline;                       /* monotonic seconds (dt_now) */
    int outstanding;                       /* transfers posted and not yet let go; no lock:
                            * only the loop's holder (comm_thread.c) posts
                            * and releases them */
    uint32_t *sent_index;                  /* [size] next message index to each peer */
    uint32_t *recv_index;                  /* [size] next message index expected from each */
    struct dt_stager *stager;              /* the staging's state (staging/), for staged ops */
    struct stage_op *stage;                /* device buffers being staged (staging/), or NULL */
    const struct stage_hooks *stage_hooks; /* ... and what the algorithms tell it */
};

/* ---- what the communicator calls ---------------------------------------- */

/* mesh.c: set up (no I/O): what the communicator hands down, atomics
 * initialised; then, once rank and size are set, the per-peer arrays;
 * freed at destroy (the key wiped). */
void comm_transport_init(dt_transport *t, dt_comm *owner, const comm_report *report,
                         pthread_mutex_t *mu, pthread_cond_t *cv_api);
dt_status comm_transport_alloc(dt_transport *t);
void comm_transport_free(dt_transport *t);
/* mesh.c: connections and the loop */
dt_status comm_mesh_start(dt_transport *t, bool listen); /* the loop (and the listener) */
void comm_mesh_connect(dt_transport *t);                 /* dial t->dial[0..rank) */
void comm_mesh_stop(dt_transport *t);                    /* close the loop (its thread has ended) */
void comm_mesh_shutdown(dt_transport *t);                /* on the thread: BYE, close all */
/* Wake the loop, if its thread runs (any thread, with *mu held or not). */
void comm_transport_wake_loop(dt_transport *t);

/* transport.c: a transfer posted by the loop owner, or from another thread
 * (through the inbox; then report->wake_thread). */
void comm_transport_post_here(dt_transport *t, dt_xfer *x);
void comm_transport_post(dt_transport *t, dt_xfer *x);

/* reject_log.c: the count of rejections not yet reported gets its summary
 * line (at destroy, the loop thread gone). */
void comm_reject_log_flush(dt_transport *t);

/* heartbeat.c: for an op that reached its progress limit, which ranks have
 * not joined it, as their heartbeats tell ("rank 1 (ADDR) is alive but has
 * not joined it: ..."). */
void comm_heartbeat_absent(dt_transport *t, uint64_t seq, int waited_on, char *out, size_t n);

#endif /* DT_TRANSPORT_H */
