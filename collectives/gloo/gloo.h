/*
 * gloo.h — the gloo room: torch 1.13 gloo's wire, spoken by dtrain.
 *
 * A gloo_ctx is one rank's view of a process group as torch 1.13's
 * ProcessGroupGloo builds it (gloo commit 5b14351, the version Debian's
 * torch links): one TCP connection per pair of ranks, no handshake, every
 * message a 48-byte preamble and maybe a payload, and data that moves only
 * after the receiver announced where it goes. Everything below is internal
 * to collectives/; the room's README.md says what it owns and what it may
 * call.
 *
 * Threads: a context is used by one thread at a time. That thread runs the
 * context's libuv loop while it waits (wait.c), so bytes move only inside
 * a collective; a torch peer that runs ahead is held back by TCP. Two
 * calls may come from any other thread: comm_gloo_wake and
 * comm_gloo_interrupt (an async handle on the loop, and an atomic).
 *
 * Invariant that keeps buffers safe: a collective returns only when every
 * message it posted has completed, or after the context failed; failing
 * closes every connection at once (fail.c), so no callback touches an op's
 * memory after the op returned.
 */
#ifndef DT_GLOO_H
#define DT_GLOO_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <uv.h>

#include "dt_comm.h"

#define GLOO_PREAMBLE_BYTES \
    48                         /* six little-endian u64: nbytes, opcode, slot, offset,
                                  length, roffset */
#define GLOO_ADDRESS_BYTES 136 /* sockaddr_storage (128) + i64 seq */
#define GLOO_ERR_LEN 512

/* Opcodes of the preamble (gloo/transport/tcp/pair.h). */
enum gloo_opcode {
    GLOO_SEND_BUFFER = 0,  /* pinned buffers: never sent by torch's CPU collectives */
    GLOO_SEND_UNBOUND = 1, /* data for the receiver's oldest posted receive */
    GLOO_SEND_READY = 2,   /* "I have a send for you on this slot" */
    GLOO_RECV_READY = 3,   /* "I have posted a receive on this slot" */
};

/* The top byte of a collective's slot (gloo/types.h). */
enum gloo_prefix {
    GLOO_GATHER = 0x01,
    GLOO_ALLGATHER = 0x02,
    GLOO_REDUCE = 0x03,
    GLOO_ALLREDUCE = 0x04,
    GLOO_SCATTER = 0x05,
    GLOO_BROADCAST = 0x06,
    GLOO_BARRIER = 0x07,
    GLOO_ALLTOALL = 0x08,
};

/* gloo's unbound buffer: memory plus counts of finished sends and
 * receives. A collective waits "for one more receive on this buffer",
 * never for a particular message: FIFO order per slot makes that sound. */
typedef struct gloo_buf {
    uint8_t *ptr;
    size_t size;
    int sends_done;
    int recvs_done;
    int recv_from; /* the peer of the last finished receive */
} gloo_buf;

/* A posted send or receive waiting in a slot's queue. */
typedef struct gloo_op {
    struct gloo_op *next;
    gloo_buf *buf;
    size_t offset, nbytes;
} gloo_op;

typedef struct gloo_fifo {
    gloo_op *head, *tail;
} gloo_fifo;

/* The matching state of one (peer, slot), as gloo keeps it (match.c). It
 * exists before the local side reaches the slot: a peer may announce the
 * next collective's messages while this rank is still in the previous. */
typedef struct gloo_slot_state {
    uint64_t slot;
    uint64_t remote_recv; /* peer's RECV_READYs no local send has used */
    uint64_t remote_send; /* peer's SEND_READYs no local receive has used */
    uint64_t expect_send; /* SEND_READYs still owed for receives posted first */
    gloo_fifo sends;      /* local sends waiting for a RECV_READY */
    gloo_fifo recvs;      /* local receives announced, waiting for data */
} gloo_slot_state;

/* A receive from any of several ranks, not yet bound to one (match.c). */
typedef struct gloo_any_recv {
    struct gloo_any_recv *next;
    uint64_t slot;
    uint64_t ranks; /* bit r: rank r may fulfil it (groups of up to 64) */
    gloo_buf *buf;
    size_t offset, nbytes;
} gloo_any_recv;

typedef struct gloo_ctx gloo_ctx;
typedef struct gloo_pair gloo_pair;

/* A connection to a pair's listener, held until it proves itself the peer
 * by its first message (held.c). */
#define GLOO_HELD_MAX 4
typedef struct gloo_held {
    gloo_pair *pair;
    uv_tcp_t tcp;
    enum { GLOO_HELD_FREE, GLOO_HELD_READING, GLOO_HELD_CLOSING, GLOO_HELD_PEER } state;
    uint8_t head[GLOO_PREAMBLE_BYTES]; /* its first bytes, at most one preamble */
    size_t got;
    char addr[64]; /* "ip:port", for messages */
} gloo_held;

/* One connection to one peer (pair.c), and its read side (frame.c). */
struct gloo_pair {
    gloo_ctx *ctx;
    int peer;
    uv_tcp_t listener; /* this pair's own listening socket */
    uv_tcp_t tcp;      /* the connection this side makes (the connecting side) */
    uv_tcp_t *conn;    /* the peer's connection: &tcp, or a held one that proved itself */
    uv_connect_t connect_req;
    gloo_held held[GLOO_HELD_MAX]; /* the accepting side's candidates (held.c) */
    int nheld;                     /* of them reading, not yet proven */
    const char *held_lost;         /* the last held one ended, unproven, in the rendezvous: why */
    uint8_t *early;                /* preambles written before the peer was proven (held.c) */
    size_t early_len, early_cap;
    bool listener_open, tcp_open, connected;
    const char *gone;             /* why the connection ended (EOF, reset), else NULL */
    struct sockaddr_storage self; /* the listener's address, as published */
    /* reading: a preamble, then its payload straight into the posted buffer */
    uint8_t head[GLOO_PREAMBLE_BYTES];
    size_t head_got;
    uint64_t rx_slot, rx_len;
    uint8_t *rx_dest; /* where the payload goes; NULL: reading a preamble */
    size_t rx_left;
    gloo_buf *rx_buf;
    struct gloo_batch *out; /* messages written since the last flush (wire.c) */
    /* matching */
    gloo_slot_state *slots;
    size_t nslots, slots_cap;
};

struct gloo_ctx {
    int rank, size;
    double timeout_s, init_timeout_s;
    uv_loop_t loop;
    uv_timer_t timer; /* the deadline of the wait in progress */
    bool timer_fired;
    uv_async_t waker;     /* any thread: end the loop pass in progress (wait.c) */
    bool waker_open;      /* the loop and waker exist (a member's context) */
    atomic_int interrupt; /* any thread: the dt_status to fail with, DT_OK if none */
    gloo_pair *pairs;     /* [size]; pairs[rank] unused */
    uint32_t next_tag;    /* torch's per-group collective counter */
    bool joined; /* the rendezvous is over (held.c: a lone candidate's end is the peer's) */
    void (*note)(void *arg, const char *line); /* a stranger dropped (held.c); may be NULL */
    void *note_arg;
    const char *op; /* the collective running, for messages */
    size_t batched; /* messages in the pairs' batches (wire.c) */
    uint32_t op_tag;
    uint64_t op_slot;
    gloo_any_recv *any; /* receives from any source, not yet bound */
    int first_gone;     /* the first peer whose connection ended, or -1 */
    dt_status failed;   /* DT_OK while healthy */
    char err[GLOO_ERR_LEN];
    /* dt_comm_traffic: payload bytes sent, received, data messages sent,
     * received (wire.c, frame.c count them as they complete) */
    atomic_uint_fast64_t traffic[4];
};

/* How a group meets (rendezvous.c). The keys are torch's, under the
 * store's torch key space (job id ""): "default_pg/<group>/0/..." and
 * "default_pg/store_based_barrier_key:<barrier>". */
typedef struct gloo_config {
    int rank, size;        /* rank -1: not a member of this new_group, only its barrier */
    int group;             /* 0 for the default group; new_group k gives k */
    int barrier_size;      /* ranks in the store barrier: the world's (torch's new_group
                              has every global rank join); 0 = size */
    const char *host;      /* the address to listen on: "127.0.0.1" or an IP */
    double timeout_s;      /* each wait of a collective (torch: the group's timeout);
                              0 = torch's 30 min */
    double init_timeout_s; /* store waits, connecting, the store barrier; 0 = timeout_s */
    void (*note)(void *arg, const char *line); /* each stranger dropped, one line; NULL: none */
    void *note_arg;
} gloo_config;

/* ---- peer_name.c: a connection's far end, for messages -------------------- */
/* "ip:port" of tcp's peer, or "?" if the socket cannot say. */
void comm_gloo_tcp_name(const uv_tcp_t *tcp, char *out, size_t n);
/* "ip:port" of peer's end of its connection (the one held, while it is
 * unproven and alone), or "?". */
void comm_gloo_peer_name(const gloo_ctx *c, int peer, char *out, size_t n);

/* ---- slot.c: slots, tags and their names ---------------------------------- */
uint64_t comm_gloo_slot(enum gloo_prefix prefix, uint32_t tag);
/* "allreduce tag 3" or "send/recv tag 5", into out. */
const char *comm_gloo_slot_describe(uint64_t slot, char *out, size_t cap);
/* Takes the next collective tag, and names the op and its slot for
 * messages. */
uint32_t comm_gloo_begin(gloo_ctx *c, const char *op, enum gloo_prefix prefix);

/* ---- sigpipe.c: a write to a dead peer is EPIPE, never a killed process ---- */
void comm_gloo_sigpipe_block(sigset_t *old);
void comm_gloo_sigpipe_restore(const sigset_t *old);

/* ---- fail.c: the first error, and closing every connection ---------------- */
__attribute__((format(printf, 3, 4))) dt_status comm_gloo_fail(gloo_ctx *c, dt_status st,
                                                               const char *fmt, ...);
void comm_gloo_close_all(gloo_ctx *c);
void comm_gloo_close_listener(gloo_pair *p);
/* Closes a held connection (held.c) that will not be the peer. */
void comm_gloo_held_drop(gloo_held *k);
/* The connection to p ended (why: a static string); ops waiting for p fail. */
void comm_gloo_pair_gone(gloo_pair *p, const char *why);

/* ---- wire.c: writing messages ------------------------------------------- */
/* Into p's batch; nothing leaves before comm_gloo_wire_flush. */
void comm_gloo_wire_notify(gloo_pair *p, enum gloo_opcode op, uint64_t slot, size_t nbytes);
void comm_gloo_wire_data(gloo_pair *p, uint64_t slot, gloo_buf *buf, size_t offset, size_t nbytes);
/* Every pair's batch, one write each (wait.c calls it around each pass). */
void comm_gloo_wire_flush(gloo_ctx *c);
/* Forget p's batch (a closed connection, or destroy). */
void comm_gloo_wire_drop(gloo_pair *p);
/* Before p's peer is proven, a flush writes p's notifications to every
 * connection held for p and keeps them; a connection held later gets
 * them first (replay); the proven one has had them all (free; destroy). */
void comm_gloo_wire_early_replay(gloo_pair *p, gloo_held *k);
void comm_gloo_wire_early_free(gloo_pair *p);

/* ---- match.c: the receiver-driven matching per (peer, slot) --------------- */
void comm_gloo_post_send(gloo_ctx *c, int peer, uint64_t slot, gloo_buf *buf, size_t offset,
                         size_t nbytes);
void comm_gloo_post_recv(gloo_ctx *c, int peer, uint64_t slot, gloo_buf *buf, size_t offset,
                         size_t nbytes);
/* A receive any rank whose bit is set in `ranks` may fulfil. */
void comm_gloo_post_recv_any(gloo_ctx *c, uint64_t ranks, uint64_t slot, gloo_buf *buf,
                             size_t offset, size_t nbytes);
void comm_gloo_match_send_ready(gloo_pair *p, uint64_t slot);
void comm_gloo_match_recv_ready(gloo_pair *p, uint64_t slot);
/* Data of `len` bytes arrived on slot: takes the oldest posted receive.
 * DT_EPROTO (and the context failed) if there is none or it is smaller. */
dt_status comm_gloo_match_data(gloo_pair *p, uint64_t slot, uint64_t len, gloo_op *out);
void comm_gloo_match_free(gloo_pair *p);

/* ---- frame.c: reading messages (libuv callbacks) -------------------------- */
void comm_gloo_frame_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b);
void comm_gloo_frame_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *b);
/* A whole preamble is in p->head (read elsewhere: held.c): act on it. */
void comm_gloo_frame_preamble(gloo_pair *p);
/* p->conn is the peer's connection: TCP_NODELAY, and reading it. */
void comm_gloo_frame_start(gloo_pair *p);
/* -1 if the n first bytes of b may begin a preamble this side accepts as
 * a connection's first message (a notification), else the first byte that
 * cannot. */
int comm_gloo_frame_first_bad(const uint8_t *b, size_t n);

/* ---- held.c: connections to a listener, held until one proves itself ------ */
/* The listener has a connection: hold it (or refuse it, named, when full). */
void comm_gloo_held_accept(gloo_pair *p);
/* Is some connection held for p, unproven, or has the last one ended so
 * (the rendezvous counts the pair made; comm_gloo_held_joined judges)? */
bool comm_gloo_held_any(const gloo_pair *p);
/* The rendezvous is over (every peer has connected by now): a pair whose
 * only connection ended before it spoke has lost its peer. */
void comm_gloo_held_joined(gloo_ctx *c);

/* ---- pair.c: listening, gloo's rule for who connects, connecting ---------- */
dt_status comm_gloo_pair_listen(gloo_pair *p, const char *host);
void comm_gloo_pair_address(const gloo_pair *p, uint8_t out[GLOO_ADDRESS_BYTES]);
dt_status comm_gloo_pair_connect(gloo_pair *p, const uint8_t addr[GLOO_ADDRESS_BYTES]);

/* ---- wait.c: running the loop until a buffer completes -------------------- */
/* The waker, on the context's new loop (rendezvous.c). */
void comm_gloo_waker_init(gloo_ctx *c);
/* From any thread: ends the loop pass in progress (comm_gloo_progress
 * returns), or the next one if none runs now. */
void comm_gloo_wake(gloo_ctx *c);
/* From any thread: the context fails with st (not DT_OK) at once, on the
 * thread that runs its loop: the op waiting there returns st, and every
 * connection closes, which tells the peers. Does nothing to a context
 * that has failed already. */
void comm_gloo_interrupt(gloo_ctx *c, dt_status st);
dt_status comm_gloo_wait_recv(gloo_ctx *c, gloo_buf *b, int peer);
dt_status comm_gloo_wait_send(gloo_ctx *c, gloo_buf *b, int peer);
/* Runs the loop until every pair is connected (rendezvous). */
dt_status comm_gloo_wait_connected(gloo_ctx *c);
/* Runs the loop for `seconds` (the store barrier's polls): connections to
 * the listeners are accepted and vetted meanwhile. */
void comm_gloo_idle(gloo_ctx *c, double seconds);

/* ---- kernels.c: gloo's reductions ----------------------------------------- */
/* True if torch's gloo reduces t with op (sum prod min max on every dtype
 * but bf16; band bor bxor on integers). */
bool comm_gloo_reduces(dt_dtype t, dt_redop op);
/* out[i] = a[i] ⊕ b[i], gloo's order and rounding; out may alias a. */
void comm_gloo_reduce(void *out, const void *a, const void *b, size_t count, dt_dtype t,
                      dt_redop op);

/* ---- rendezvous.c: joining a group, leaving it ---------------------------- */
/* Always sets *out (NULL only on DT_ENOMEM); on failure the message is in
 * err and *out must still be destroyed. A rank that is no member of group
 * k > 0 (cfg->rank -1) only joins its store barrier, as torch's new_group
 * has it; *out is then no group, only to destroy. */
dt_status comm_gloo_connect(gloo_ctx **out, dt_store *store, const gloo_config *cfg, char *err,
                            size_t errlen);
void comm_gloo_destroy(gloo_ctx *c);
/* Its traffic so far, dt_traffic's fields in order. Any thread. */
void comm_gloo_traffic(gloo_ctx *c, uint64_t out[4]);
const char *comm_gloo_error(const gloo_ctx *c);

/* ---- the collectives, one file each (torch 1.13's calls, CPU tensors) ----- */
dt_status comm_gloo_allreduce(gloo_ctx *c, void *buf, size_t count, dt_dtype t, dt_redop op);
dt_status comm_gloo_broadcast(gloo_ctx *c, void *buf, size_t bytes, int root);
/* out: size·bytes; in: bytes, this rank's block (may be out + rank·bytes). */
dt_status comm_gloo_allgather(gloo_ctx *c, void *out, const void *in, size_t bytes);
dt_status comm_gloo_barrier(gloo_ctx *c);
/* In place; non-root buffers are left holding partial sums, as gloo's. */
dt_status comm_gloo_reduce_root(gloo_ctx *c, void *buf, size_t count, dt_dtype t, dt_redop op,
                                int root);
/* gather: out (root only): size·bytes. scatter: in (root only): size·bytes. */
dt_status comm_gloo_gather(gloo_ctx *c, void *out, const void *in, size_t bytes, int root);
dt_status comm_gloo_scatter(gloo_ctx *c, void *out, const void *in, size_t bytes, int root);
/* all_to_all_single with equal splits: block i of in goes to rank i. */
dt_status comm_gloo_alltoall(gloo_ctx *c, void *out, const void *in, size_t block);
/* Tagged point-to-point; peer -1 receives from any rank (*from says which). */
dt_status comm_gloo_send(gloo_ctx *c, const void *buf, size_t bytes, int peer, uint32_t tag);
dt_status comm_gloo_recv(gloo_ctx *c, void *buf, size_t bytes, int peer, uint32_t tag, int *from);

/* Posted and completed apart, for a caller that keeps several in flight
 * (the communicator's async send/recv, ../p2p_gloo.c): post, then drive
 * the loop (comm_gloo_progress, or any collective's waits) until done. */
typedef struct gloo_p2p {
    gloo_buf buf;
    bool is_send;
    int peer; /* -1: a receive from any rank */
} gloo_p2p;
dt_status comm_gloo_p2p_post(gloo_ctx *c, gloo_p2p *p, bool is_send, void *buf, size_t bytes,
                             int peer, uint32_t tag);
/* False while in flight; true once finished, *st then DT_OK (a receive's
 * sender in p->buf.recv_from) or the failure (the context failed, or the
 * peer's connection ended). */
bool comm_gloo_p2p_finished(gloo_ctx *c, const gloo_p2p *p, dt_status *st);
/* Runs one pass of the loop, which waits, with no timer, until something
 * happens: bytes moved, a connection ended, comm_gloo_wake or
 * comm_gloo_interrupt. Returns at once on a failed context. */
void comm_gloo_progress(gloo_ctx *c);

/* ---- run.c: a dtrain op on this wire (compositions where gloo has none) --- */
dt_status comm_gloo_run(gloo_ctx *c, const dt_op *op);

#endif /* DT_GLOO_H */
