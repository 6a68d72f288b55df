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

#include <pthread.h>
#include <stdbool.h>

#include "report.h"
#include "stage_hooks.h"
#include "transport.h"

typedef struct stage_op stage_op; /* one staged op (staging.c) */
struct dt_device;

/* The staging's own state, which the communicator embeds (dt_comm's
 * `stager`) and sets up (comm.c): what it was handed (fixed after setup)
 * and what it makes on first use. The staging never sees the
 * communicator's struct; it reports up through `report`, with `owner`. */
typedef struct dt_stager {
    const comm_report *report; /* how to report up (report.h) */
    dt_comm *owner;            /* passed back through report, never looked into */
    pthread_mutex_t *mu;       /* the communicator's lock: guards p2p_pool's making */
    int rank, size;
    double timeout_s;          /* a copy that never completes fails after it */
    struct dt_device *device;  /* options.device: buffers it owns are staged; or NULL */
    struct staging *staging;   /* staging.c: pinned buffers, stream; loop owner only */
    struct p2p_pool *p2p_pool; /* staging_p2p.c: send/recv host buffers; made under *mu */
} dt_stager;

/* work.c asks when it prepares an op; executor.c runs a staged op (the op's
 * o->stager) */
bool comm_staging_wants(const dt_stager *s, const dt_op *op);
dt_status comm_staging_run(dt_opctx *o);
/* p2p (staging_p2p.c): before the transfer is posted (copies a device send
 * buffer out, points op at host memory; *staged false when neither buffer
 * is the device's after all, else the device buffer in *device_buf), and in
 * dt_work_wait (copies a received message in, returns the host buffer to
 * the pool); returns the op's final status. */
dt_status comm_staging_p2p_begin(dt_stager *s, dt_op *op, bool *staged, void **device_buf);
dt_status comm_staging_p2p_end(dt_stager *s, dt_op *op, bool staged, void *device_buf,
                               dt_status st);
/* comm.c: frees the pinned buffers, the streams and the events (of both). */
void comm_staging_destroy(dt_stager *s);
void comm_staging_p2p_destroy(dt_stager *s); /* staging_p2p.c: the p2p pool */

/* The hooks staging.c hands the algorithms (staging_pieces.c). */
dt_status comm_staging_pieces_need(dt_opctx *o, const void *p, size_t n);
void comm_staging_pieces_ready(dt_opctx *o, const void *p, size_t n);

#endif /* DT_STAGING_H */
