/*
 * dt_ckpt_train.h — the checkpoint layer's glue to the optimizer layer:
 * describe a live model + DDP or ZeRO-1 optimizer as a dt_ckpt_state
 * (train_state.c). Separate from dt_ckpt.h, and built into an archive of
 * its own (dt_ckpt_train), so that the format and the tools need nothing
 * from optim/: dtrain-ckpt is linked without it.
 */
#ifndef DT_CKPT_TRAIN_H
#define DT_CKPT_TRAIN_H

#include "dt_ckpt.h"
#include "dt_optim.h"

/*
 * Fills s with pointers into m (and z's shard under ZeRO-1; z NULL means
 * DDP, whose AdamW moments are allocated zeroed if absent). The caller
 * sets step, seed, data_row and rng_state. DT_ENOMEM if the moments could
 * not be allocated.
 */
dt_status dt_ckpt_state_of(dt_ckpt_state *s, dt_model *m, dt_zero1 *z, int rank, int world);

#endif /* DT_CKPT_TRAIN_H */
