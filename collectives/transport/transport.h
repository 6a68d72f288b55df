/*
 * transport.h — internal: frames, transfers and the context of a running op.
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
 */
#ifndef DT_TRANSPORT_H
#define DT_TRANSPORT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "dt_clock.h"
#include "dt_comm.h"

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

/*
 * The context of one collective while it runs.
 */
struct dt_opctx {
    dt_comm *comm;
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
    struct stage_op *stage;                /* device buffers being staged (staging/), or NULL */
    const struct stage_hooks *stage_hooks; /* ... and what the algorithms tell it */
};

#endif /* DT_TRANSPORT_H */
