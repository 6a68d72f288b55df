/*
 * staging.h — internal: how ops on device buffers reach the host
 * algorithms (staging.c has the picture and the costs).
 *
 * work.c asks comm_staging_wants() once per op (a pointer query, only on a
 * communicator that has a device), and the executor runs a staged op through
 * comm_staging_run() instead of comm_algo_run(). The algorithms see host buffers only;
 * the pipelined ones tell the staging what they are about to read and what
 * they have finished, through the hooks staging.c hands them with the op
 * (stage_hooks.h; staging_pieces.c answers).
 */
#ifndef DT_STAGING_H
#define DT_STAGING_H

#include "comm_internal.h"
#include "stage_hooks.h"

typedef struct stage_op stage_op; /* one staged op (staging.c) */

/* work.c asks when it prepares an op; executor.c runs a staged op */
bool comm_staging_wants(dt_comm *c, const dt_op *op);
dt_status comm_staging_run(dt_opctx *o);
/* p2p (staging_p2p.c): before the transfer is posted (copies a device send
 * buffer out, points the op at host memory), and in dt_work_wait (copies a
 * received message in, returns the host buffer to the pool); returns the
 * op's final status. */
dt_status comm_staging_p2p_begin(dt_comm *c, dt_work *w);
dt_status comm_staging_p2p_end(dt_work *w, dt_status st);
/* comm.c: frees the pinned buffers, the streams and the events (of both). */
void comm_staging_destroy(dt_comm *c);
void comm_staging_p2p_destroy(dt_comm *c); /* staging_p2p.c: the p2p pool */

/* The hooks staging.c hands the algorithms (staging_pieces.c). */
dt_status comm_staging_pieces_need(dt_opctx *o, const void *p, size_t n);
void comm_staging_pieces_ready(dt_opctx *o, const void *p, size_t n);

#endif /* DT_STAGING_H */
