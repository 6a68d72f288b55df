/*
 * staging_pieces.h — internal: a staged op's state, shared by staging.c
 * (which sets it up, issues the copies and finishes the op) and
 * staging_pieces.c (the waits and copies the algorithms' hooks ask for).
 */
#ifndef DT_STAGING_PIECES_H
#define DT_STAGING_PIECES_H

#include "dt_device.h"
#include "staging.h"

#define STAGE_PIECE_BYTES ((size_t)1024 * 1024)

enum { PIECE_IDLE, PIECE_ISSUED, PIECE_SYNCED };

/* Per communicator, made on first use, freed by dt_comm_destroy. */
typedef struct staging {
    dt_device *dev;
    dt_device_stream *stream;
    dt_device_event **events; /* [cap_pieces] one per input piece */
    unsigned char *piece;     /* [cap_pieces] PIECE_* */
    size_t cap_pieces;
    dt_device_event *done; /* behind the last copy of an op */
    char *arena;
    size_t cap;
    bool pinned; /* arena from dt_device_pinned_alloc, else malloc */
} staging;

/* One of an op's two buffers (send, recv), as this rank uses it. */
typedef struct stage_buf {
    char *dev;  /* the caller's device pointer; NULL if on the host or unused */
    char *host; /* what the algorithm uses */
    size_t bytes;
    bool in, out;  /* holds input / output on this rank */
    size_t piece0; /* index of its first input piece */
} stage_buf;

struct stage_op {
    dt_stager *stager;
    const dt_opctx *o; /* the op: its kind, sequence number and deadline */
    staging *s;
    stage_buf b[2];    /* send, recv */
    size_t out_staged; /* bytes of b[1] copied back through stage_ready */
    dt_status err;     /* first failure of a stage_ready copy */
};

/* staging_pieces.c: fail the communicator with the device's message
 * (returns st); wait for the input pieces of b overlapping bytes [lo, hi). */
dt_status comm_staging_pieces_fail(dt_stager *sg, dt_status st, const char *what);
dt_status comm_staging_pieces_sync(stage_op *so, stage_buf *b, size_t lo, size_t hi);
/* Waits for e until the op's deadline; fails the communicator with
 * DT_ETIMEDOUT naming the op, the device and `what` if it never completes
 * (a hung device), or with the device's error. */
dt_status comm_staging_pieces_wait(stage_op *so, dt_device_event *e, const char *what);

#endif /* DT_STAGING_PIECES_H */
