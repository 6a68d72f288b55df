/*
 * pipe_internal.h — what the pipeline layer's files share and its header
 * does not promise: the three schedule generators. Each writes, for every
 * stage, the order of its compute actions only (F, B, W with mb set);
 * schedule.c inserts the transfers, the STEP marker and the slots.
 */
#ifndef DT_PIPE_INTERNAL_H
#define DT_PIPE_INTERNAL_H

#include "dt_pipe.h"

/* comp[s] has room for 3m actions; n[s] gets the count. 0, or -1 on
 * ENOMEM. */
int dt_sched_gpipe(dt_pipe_action **comp, int *n, int p, int m);
int dt_sched_1f1b(dt_pipe_action **comp, int *n, int p, int m);
int dt_sched_zb(dt_pipe_action **comp, int *n, int p, int m);

/* True for the four transfer ops. */
static inline bool dt_pipe_is_transfer(dt_pipe_op op)
{
    return op >= DT_PIPE_SEND_ACT && op <= DT_PIPE_RECV_GRAD;
}

/* The bf16 wire of a stage's activations and gradients (act_comm.c):
 * buf[kind][dir] holds, per slot of that kind (0: activation slots, 1:
 * gradient slots), per_slot halves to send (dir 0) or received (dir 1). */
typedef struct dt_act_wire {
    uint16_t *buf[2][2];
    size_t per_slot;
} dt_act_wire;

/* Room for count halves per slot (slots[kind] of each kind); keeps what
 * is there when it already fits. DT_ENOMEM leaves the wire empty. */
dt_status dt_act_wire_reserve(dt_act_wire *w, size_t count, const int slots[2]);
void dt_act_wire_free(dt_act_wire *w);
/* src rounded into the slot's send buffer, which it returns. */
const uint16_t *dt_act_wire_pack(dt_act_wire *w, int kind, int slot, const float *src,
                                 size_t count);
/* The slot's receive buffer, and it widened into dst once received. */
uint16_t *dt_act_wire_inbox(dt_act_wire *w, int kind, int slot);
void dt_act_wire_unpack(dt_act_wire *w, int kind, int slot, float *dst, size_t count);

#endif /* DT_PIPE_INTERNAL_H */
