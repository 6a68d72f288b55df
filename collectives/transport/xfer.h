/*
 * xfer.h — internal: what an algorithm sees of the network (xfer.c).
 *
 * An algorithm runs on the thread that holds the loop (comm_thread.c), as
 * plain sequential code. It talks to peers through transfers (dt_xfer) that it
 * posts and later waits for:
 *
 *     dt_xfer x;
 *     comm_xfer_recv(o, &x, left, scratch, bytes);   // post: returns at once
 *     comm_xfer_send(o, &y, right, chunk, bytes);
 *     st = comm_xfer_wait(o, &x);                   // block until done or failed
 *
 * Invariants an algorithm must keep are in transport.h.
 */
#ifndef DT_XFER_H
#define DT_XFER_H

#include "transport.h"

/* Post a transfer of `len` bytes to/from `peer` as part of op `o`. */
void comm_xfer_send(dt_opctx *o, dt_xfer *x, int peer, const void *buf, size_t len);
void comm_xfer_recv(dt_opctx *o, dt_xfer *x, int peer, void *buf, size_t len);
/* Block until x is done (DT_OK) or the communicator failed (its status).
 * Either way it returns only once the transport has let go of x, so a
 * transfer on the stack is safe to leave once waited for. */
dt_status comm_xfer_wait(dt_opctx *o, dt_xfer *x);
/* Wait for every transfer in xs[0..n); returns the first failure. */
dt_status comm_xfer_wait_all(dt_opctx *o, dt_xfer *xs, int n);
/* Block until every transfer the op posted has been let go of. */
void comm_xfer_drain(dt_opctx *o);

/* Per-communicator scratch of at least `bytes` (> 0), reused across ops
 * (grown, never shrunk). `slot` 0 or 1: two independent buffers. NULL on
 * ENOMEM. */
void *comm_xfer_scratch(dt_opctx *o, int slot, size_t bytes);

#endif /* DT_XFER_H */
