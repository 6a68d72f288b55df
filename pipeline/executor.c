/*
 * executor.c — runs one stage's list of a pipeline schedule on a real
 * rank: the only place that turns schedule data into compute and
 * transfers.
 *
 * The stage is anything behind dt_pipe_stage's table: a plain stage of
 * the model (stage_model.c) or, in a 3-D run, a tensor-parallel share of
 * one, whose forward and backward run their own all-reduces over the tp
 * group in between the transfers posted here.
 *
 * Per action:
 *   F, B, W     select the micro-batch's slots in the stage, then
 *               forward, backward (whole, or its input half when the
 *               schedule is split) or the weight half. The last stage's B
 *               starts from dloss = 1/m: the loss of the step is the mean
 *               over micro-batches, as in `--grad-accum m`.
 *   transfers   a run of consecutive transfers is posted together, every
 *               send and receive async (dt_send_async / dt_recv_async,
 *               tagged by kind and micro-batch), then only the receives
 *               are waited. The tensors go straight from and into the
 *               model's activation slots (dt_model_output, _input, ...).
 *   ahead       before each action, every later receive whose set is
 *               already free (the last action of the set's previous
 *               micro-batch is done and no send still leaves from it) is
 *               posted at once and waited at its place: its data lands
 *               while the stage computes. Without it, a receive posted at
 *               its place costs a hand-off to the communicator thread and
 *               back even when the data arrived long before — on the
 *               critical path of 1F1B and ZB-H1, whose stage 0 needs each
 *               gradient the moment it finishes the forward before it.
 *               The sets, hence the memory, are the schedule's.
 *   STEP        every send still in flight is waited: after it the
 *               gradients are final and every buffer is free.
 *
 * Data parallelism across pipelines (dt_pipe_set_grad_hook): the stage's
 * last action that writes weight gradients (its last B, or in a split
 * schedule its last W) is the one after which each parameter's gradient
 * is final for the step. Only that action runs with the caller's backward
 * hook installed, so DDP launches each bucket's all-reduce over the
 * stage's data-parallel group the moment that backward has finished it,
 * overlapped with the rest of it; whatever follows in the list (sends,
 * other stages' W) overlaps too.
 *
 * Why sends are never waited where they are posted: two neighbours that
 * send to each other at the same time (stage s its activations forward,
 * stage s+1 a gradient back, as 1F1B does every step) would each block in
 * its send once the message outgrows the socket buffers, and neither would
 * ever reach its receive. Posting the receive with the send, and waiting a
 * send only before its slot is reused by another micro-batch or at STEP,
 * makes the exchange complete whatever the size; dt_pipe_simulate checks
 * the same rules on every schedule with sends that never buffer.
 *
 * --act-comm bf16 (dt_pipe_set_act_comm_bf16, act_comm.c): the same
 * transfers carry the tensors rounded to bf16, from and into per-slot
 * buffers; a receive is widened into its slot when it is waited.
 *
 * Failures: any failed transfer fails the communicator (the transport's
 * contract), which fails every other pending transfer at once, and the
 * error names the stage, the action, the micro-batch and the peer, with
 * the communicator's root cause (a dead rank is named by every survivor;
 * a receive of another size is a DT_EPROTO naming both sides).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dt_clock.h"
#include "pipe_internal.h"

#define TAG_BASE 0x70000000u /* pipeline transfers: base + 2 mb + kind */

struct dt_pipe {
    dt_comm *comm;
    dt_pipe_stage m; /* what runs the compute: a plain stage or a tp share */
    const dt_pipe_schedule *sched;
    int stage, p;
    dt_work **pending[2]; /* [slots] send leaving each act / grad slot */
    int *pending_mb[2];
    int *pending_at[2];    /* its action index, for the timeline */
    dt_work **recvs;       /* the current batch's receives */
    int *recv_at;          /* their action indices */
    int *free_after;       /* [n] a receive's set is free after this action (-1: at once) */
    dt_work **early;       /* [n] a receive posted ahead of its place, not yet waited */
    float *losses;         /* [m] last stage: each micro-batch's loss */
    int last_weights;      /* index of the step's last weight-gradient action */
    dt_grad_ready_fn hook; /* installed for that action only, or NULL */
    void *hook_user;
    dt_pipe_stats stats;
    double *t_start, *t_end; /* [n] the last run's timeline */
    bool act_bf16;           /* transfers in bf16 (act_comm.c) */
    dt_act_wire wire;
    char err[1024];
};

static dt_status pipe_fail(dt_pipe *p, dt_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static dt_status pipe_fail(dt_pipe *p, dt_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (!p->err[0]) {
        int n = snprintf(p->err, sizeof p->err, "pipeline stage %d: ", p->stage);
        vsnprintf(p->err + n, sizeof p->err - (size_t)n, fmt, ap);
    }
    va_end(ap);
    return st;
}

/* The checks a mismatched model or group would otherwise turn into a
 * hang or garbage. */
static dt_status check_fit(dt_pipe *p)
{
    const dt_pipe_schedule *s = p->sched;
    const dt_pipe_stage *m = &p->m;
    int st = p->stage, first = m->l0 == 0, last = m->l1 == m->L;
    int size = p->comm ? dt_comm_size(p->comm) : 1;
    if (size != s->p)
        return pipe_fail(p, DT_EINVAL,
                         "the group has %d ranks, the "
                         "schedule %d stages",
                         size, s->p);
    if (first != (st == 0) || last != (st == s->p - 1))
        return pipe_fail(p, DT_EINVAL,
                         "its model owns blocks [%d, %d) of "
                         "%d, which is not stage %d of %d",
                         m->l0, m->l1, m->L, st, s->p);
    if (m->act_slots < s->act_slots[st] || m->grad_slots < s->grad_slots[st])
        return pipe_fail(p, DT_EINVAL,
                         "the %s schedule keeps %d micro-"
                         "batches (%d gradient sets) alive here, the model "
                         "has %d (%d)",
                         dt_pipe_kind_name(s->kind), s->act_slots[st], s->grad_slots[st],
                         m->act_slots, m->grad_slots);
    return DT_OK;
}

static bool is_recv(dt_pipe_op op)
{
    return op == DT_PIPE_RECV_ACT || op == DT_PIPE_RECV_GRAD;
}

/* For each receive, the last action before it that uses the set it
 * writes (its activation set for recv_act, its gradient set for
 * recv_grad) for another micro-batch: once that action is done the
 * receive may be posted. -1: the set is free from the start of the step. */
static void find_free_sets(dt_pipe *p)
{
    const dt_pipe_action *acts = p->sched->actions[p->stage];
    for (int r = 0; r < p->sched->n[p->stage]; r++) {
        const dt_pipe_action *a = &acts[r];
        int grad = a->op == DT_PIPE_RECV_GRAD, set = grad ? a->grad_slot : a->slot;
        p->free_after[r] = -1;
        for (int j = r - 1; j >= 0 && is_recv(a->op); j--)
            if ((grad ? acts[j].grad_slot : acts[j].slot) == set && acts[j].mb != a->mb) {
                p->free_after[r] = j;
                break;
            }
    }
}

dt_status dt_pipe_create(dt_pipe **out, dt_comm *group, dt_model *stage,
                         const dt_pipe_schedule *sched)
{
    dt_pipe_stage s = dt_pipe_stage_of_model(stage);
    return dt_pipe_create_stage(out, group, &s, sched);
}

dt_status dt_pipe_create_stage(dt_pipe **out, dt_comm *group, const dt_pipe_stage *stage,
                               const dt_pipe_schedule *sched)
{
    dt_pipe *p = calloc(1, sizeof *p);
    *out = p;
    if (!p)
        return DT_ENOMEM;
    *p = (dt_pipe){.comm = group,
                   .m = *stage,
                   .sched = sched,
                   .stage = group ? dt_comm_rank(group) : 0,
                   .p = sched->p};
    dt_status st = check_fit(p);
    if (st != DT_OK)
        return st;
    size_t n = (size_t)sched->n[p->stage], m = (size_t)sched->m;
    for (int k = 0; k < 2; k++) {
        p->pending[k] = calloc(m, sizeof(dt_work *));
        p->pending_mb[k] = calloc(m, sizeof(int));
        p->pending_at[k] = calloc(m, sizeof(int));
    }
    p->t_start = calloc(n, sizeof(double));
    p->t_end = calloc(n, sizeof(double));
    p->recvs = calloc(n, sizeof(dt_work *));
    p->recv_at = calloc(n, sizeof(int));
    p->free_after = calloc(n, sizeof(int));
    p->early = calloc(n, sizeof(dt_work *));
    p->losses = calloc(m, sizeof(float));
    p->last_weights = -1;
    for (int i = 0; i < sched->n[p->stage]; i++) {
        dt_pipe_op op = sched->actions[p->stage][i].op;
        if (op == (sched->split_backward ? DT_PIPE_W : DT_PIPE_B))
            p->last_weights = i;
    }
    if (!p->pending[0] || !p->pending[1] || !p->pending_mb[0] || !p->pending_mb[1] ||
        !p->pending_at[0] || !p->pending_at[1] || !p->recvs || !p->recv_at || !p->losses ||
        !p->t_start || !p->t_end || !p->free_after || !p->early)
        return pipe_fail(p, DT_ENOMEM, "out of memory");
    find_free_sets(p);
    return DT_OK;
}

void dt_pipe_destroy(dt_pipe *p)
{
    if (!p)
        return;
    for (int k = 0; k < 2; k++) {
        for (int i = 0; p->pending[k] && i < p->sched->m; i++)
            if (p->pending[k][i])
                dt_work_wait(p->pending[k][i]);
        free(p->pending[k]);
        free(p->pending_mb[k]);
        free(p->pending_at[k]);
    }
    free(p->t_start);
    free(p->t_end);
    for (int i = 0; p->early && i < p->sched->n[p->stage]; i++)
        if (p->early[i])
            dt_work_wait(p->early[i]);
    free(p->recvs);
    free(p->recv_at);
    free(p->free_after);
    free(p->early);
    free(p->losses);
    dt_act_wire_free(&p->wire);
    free(p);
}

const char *dt_pipe_error(const dt_pipe *p)
{
    return p ? p->err : "pipeline: out of memory";
}

void dt_pipe_set_act_comm_bf16(dt_pipe *p)
{
    p->act_bf16 = true;
}

void dt_pipe_set_grad_hook(dt_pipe *p, dt_grad_ready_fn fn, void *user)
{
    p->hook = fn;
    p->hook_user = user;
}

void dt_pipe_last_timeline(const dt_pipe *p, const double **start, const double **end)
{
    *start = p->t_start;
    *end = p->t_end;
}

void dt_pipe_last_stats(const dt_pipe *p, dt_pipe_stats *out)
{
    *out = p->stats;
}

/* ---- transfers -------------------------------------------------------------- */

static const char *describe(dt_pipe_op op)
{
    switch (op) {
    case DT_PIPE_SEND_ACT: return "sending the activations of";
    case DT_PIPE_RECV_ACT: return "receiving the activations of";
    case DT_PIPE_SEND_GRAD: return "sending the gradient of";
    default: return "receiving the gradient of";
    }
}

static int peer_of(const dt_pipe *p, dt_pipe_op op)
{
    return op == DT_PIPE_SEND_ACT || op == DT_PIPE_RECV_GRAD ? p->stage + 1 : p->stage - 1;
}

static dt_status transfer_failed(dt_pipe *p, const dt_pipe_action *a, dt_status st)
{
    const char *why = p->comm ? dt_comm_error(p->comm) : "";
    return pipe_fail(p, st, "%s micro-batch %d (stage %d): %s: %s", describe(a->op), a->mb,
                     peer_of(p, a->op), dt_status_name(st), why[0] ? why : "failed");
}

/* Waits for the send still leaving from one of a's slots for another
 * micro-batch, before a overwrites that slot. */
static dt_status free_slots(dt_pipe *p, const dt_pipe_action *a)
{
    int slots[2] = {a->slot, a->grad_slot};
    for (int k = 0; k < 2; k++) {
        if (slots[k] < 0 || !p->pending[k][slots[k]] || p->pending_mb[k][slots[k]] == a->mb)
            continue;
        dt_work *w = p->pending[k][slots[k]];
        p->pending[k][slots[k]] = NULL;
        dt_status st = dt_work_wait(w);
        p->t_end[p->pending_at[k][slots[k]]] = dt_now();
        if (st != DT_OK) {
            dt_pipe_action sent = {k ? DT_PIPE_SEND_GRAD : DT_PIPE_SEND_ACT,
                                   p->pending_mb[k][slots[k]], -1, -1};
            return transfer_failed(p, &sent, st);
        }
    }
    return DT_OK;
}

/* Posts one transfer in bf16: the send rounded into its slot's buffer,
 * the receive into its slot's inbox (widened once waited, run_batch). */
static dt_status post_bf16(dt_pipe *p, const dt_pipe_action *a, size_t count, uint32_t tag,
                           dt_work **w)
{
    const dt_pipe_stage *m = &p->m;
    int kind = a->op == DT_PIPE_SEND_GRAD || a->op == DT_PIPE_RECV_GRAD;
    int slot = kind ? a->grad_slot : a->slot, peer = peer_of(p, a->op);
    if (is_recv(a->op))
        return dt_recv_async(p->comm, dt_act_wire_inbox(&p->wire, kind, slot), count, DT_BF16, peer,
                             tag, NULL, w);
    const float *src = kind ? m->ops->input_grad(m->self) : m->ops->output(m->self);
    return dt_send_async(p->comm, dt_act_wire_pack(&p->wire, kind, slot, src, count), count,
                         DT_BF16, peer, tag, w);
}

/* A bf16 receive, waited: widened into the tensor its slot reads. */
static void unpack_bf16(dt_pipe *p, const dt_pipe_action *a, int B, int T)
{
    const dt_pipe_stage *m = &p->m;
    int kind = a->op == DT_PIPE_RECV_GRAD;
    m->ops->select(m->self, a->slot, a->grad_slot >= 0 ? a->grad_slot : 0);
    float *dst = kind ? m->ops->output_grad(m->self) : m->ops->input(m->self, B, T);
    dt_act_wire_unpack(&p->wire, kind, kind ? a->grad_slot : a->slot, dst, (size_t)B * T * m->C);
}

/* Posts one transfer, straight from or into the model's slot. */
static dt_status post(dt_pipe *p, const dt_pipe_action *a, int B, int T, dt_work **w)
{
    const dt_pipe_stage *m = &p->m;
    size_t count = (size_t)B * T * m->C;
    int kind = a->op == DT_PIPE_SEND_GRAD || a->op == DT_PIPE_RECV_GRAD;
    uint32_t tag = TAG_BASE + 2u * (uint32_t)a->mb + (uint32_t)kind;
    m->ops->select(m->self, a->slot, a->grad_slot >= 0 ? a->grad_slot : 0);
    if (p->act_bf16)
        return post_bf16(p, a, count, tag, w);
    switch (a->op) {
    case DT_PIPE_SEND_ACT:
        return dt_send_async(p->comm, m->ops->output(m->self), count, DT_F32, p->stage + 1, tag, w);
    case DT_PIPE_RECV_ACT:
        return dt_recv_async(p->comm, m->ops->input(m->self, B, T), count, DT_F32, p->stage - 1,
                             tag, NULL, w);
    case DT_PIPE_SEND_GRAD:
        return dt_send_async(p->comm, m->ops->input_grad(m->self), count, DT_F32, p->stage - 1, tag,
                             w);
    default:
        return dt_recv_async(p->comm, m->ops->output_grad(m->self), count, DT_F32, p->stage + 1,
                             tag, NULL, w);
    }
}

/* The run of transfers from action i: post all, wait the receives.
 * Returns the index after the run in *next. */
static dt_status run_batch(dt_pipe *p, int i, int B, int T, int *next)
{
    const dt_pipe_action *acts = p->sched->actions[p->stage];
    int end = i, nrecv = 0;
    while (end < p->sched->n[p->stage] && dt_pipe_is_transfer(acts[end].op))
        end++;
    *next = end;
    dt_status st = DT_OK;
    for (int k = i; k < end && st == DT_OK; k++) {
        const dt_pipe_action *a = &acts[k];
        dt_work *w = p->early[k];
        if (w) { /* posted ahead (post_ahead) */
            p->early[k] = NULL;
            p->recvs[nrecv] = w;
            p->recv_at[nrecv++] = k;
            continue;
        }
        if ((st = free_slots(p, a)) != DT_OK)
            break;
        p->t_start[k] = dt_now();
        if ((st = post(p, a, B, T, &w)) != DT_OK) {
            transfer_failed(p, a, st);
            break;
        }
        if (is_recv(a->op)) {
            p->recvs[nrecv] = w;
            p->recv_at[nrecv++] = k;
        } else {
            int kind = a->op == DT_PIPE_SEND_GRAD;
            int slot = kind ? a->grad_slot : a->slot;
            p->pending[kind][slot] = w;
            p->pending_mb[kind][slot] = a->mb;
            p->pending_at[kind][slot] = k;
        }
    }
    for (int r = 0; r < nrecv; r++) { /* wait each exactly once */
        dt_status rs = dt_work_wait(p->recvs[r]);
        p->t_end[p->recv_at[r]] = dt_now();
        if (rs != DT_OK && st == DT_OK)
            st = transfer_failed(p, &acts[p->recv_at[r]], rs);
        if (rs == DT_OK && p->act_bf16)
            unpack_bf16(p, &acts[p->recv_at[r]], B, T);
    }
    return st;
}

/* Is the send leaving from set `slot` of kind k (if any, and for another
 * micro-batch than mb) done? Then free_slots will not block on it. */
static bool send_gone(const dt_pipe *p, int k, int slot, int mb)
{
    dt_work *w = slot >= 0 ? p->pending[k][slot] : NULL;
    return !w || p->pending_mb[k][slot] == mb || dt_work_test(w);
}

/*
 * Posts, ahead of their place, the receives after action `from` whose set
 * is already free: its last user for another micro-batch is done, and no
 * send is still leaving from it. The data then lands while this stage
 * computes, and the wait at the receive's place finds it there instead of
 * starting the hand-off to the communicator thread and back. A receive
 * whose set is still busy is left to its place.
 */
static dt_status post_ahead(dt_pipe *p, int from, int B, int T)
{
    const dt_pipe_action *acts = p->sched->actions[p->stage];
    for (int r = from; r < p->sched->n[p->stage]; r++) {
        const dt_pipe_action *a = &acts[r];
        if (!is_recv(a->op) || p->early[r] || p->free_after[r] >= from ||
            !send_gone(p, 0, a->slot, a->mb) || !send_gone(p, 1, a->grad_slot, a->mb))
            continue;
        dt_status st = free_slots(p, a); /* reaps the finished sends only */
        p->t_start[r] = dt_now();
        if (st == DT_OK && (st = post(p, a, B, T, &p->early[r])) != DT_OK)
            return transfer_failed(p, a, st);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}

/* A failed step's receives posted ahead and never reached: the failed
 * communicator completes them at once. */
static void drop_early(dt_pipe *p)
{
    for (int r = 0; r < p->sched->n[p->stage]; r++)
        if (p->early[r]) {
            dt_work_wait(p->early[r]);
            p->early[r] = NULL;
        }
}

/* STEP: every send done. */
static dt_status wait_sends(dt_pipe *p)
{
    dt_status st = DT_OK;
    for (int k = 0; k < 2; k++)
        for (int s = 0; s < p->sched->m; s++) {
            dt_work *w = p->pending[k][s];
            if (!w)
                continue;
            p->pending[k][s] = NULL;
            dt_status ws = dt_work_wait(w);
            p->t_end[p->pending_at[k][s]] = dt_now();
            if (ws != DT_OK && st == DT_OK) {
                dt_pipe_action a = {k ? DT_PIPE_SEND_GRAD : DT_PIPE_SEND_ACT, p->pending_mb[k][s],
                                    -1, -1};
                st = transfer_failed(p, &a, ws);
            }
        }
    return st;
}

/* ---- compute ---------------------------------------------------------------- */

static dt_status compute(dt_pipe *p, const dt_pipe_action *a, const int *const *inputs,
                         const int *const *targets, int B, int T, bool hooked)
{
    const dt_pipe_stage *m = &p->m;
    dt_status st = free_slots(p, a);
    if (st != DT_OK)
        return st;
    m->ops->select(m->self, a->slot, a->grad_slot >= 0 ? a->grad_slot : 0);
    int last = p->stage == p->p - 1;
    float dloss = 1.0f / (float)p->sched->m;
    if (a->op == DT_PIPE_F) {
        st = m->ops->forward(m->self, p->stage == 0 ? inputs[a->mb] : NULL,
                             last ? targets[a->mb] : NULL, B, T, &p->losses[a->mb]);
    } else {
        dt_backward_part part = a->op == DT_PIPE_W         ? DT_BACKWARD_WEIGHT
                                : p->sched->split_backward ? DT_BACKWARD_INPUT
                                                           : DT_BACKWARD_ALL;
        hooked = hooked && m->ops->set_grad_hook;
        if (hooked)
            m->ops->set_grad_hook(m->self, p->hook, p->hook_user);
        st = m->ops->backward(m->self, dloss, part);
        if (hooked)
            m->ops->set_grad_hook(m->self, NULL, NULL);
    }
    if (st != DT_OK)
        return pipe_fail(p, st, "%s of micro-batch %d: %s", dt_pipe_op_name(a->op), a->mb,
                         m->ops->error(m->self));
    return DT_OK;
}

static dt_status check_batch(dt_pipe *p, const int *const *inputs, const int *const *targets)
{
    if (p->stage == 0 && !inputs)
        return pipe_fail(p, DT_EINVAL, "the first stage needs inputs");
    if (p->stage == p->p - 1 && !targets)
        return pipe_fail(p, DT_EINVAL, "the last stage needs targets");
    return DT_OK;
}

dt_status dt_pipe_run(dt_pipe *p, const int *const *inputs, const int *const *targets, int B, int T,
                      float *loss)
{
    const dt_pipe_schedule *s = p->sched;
    const dt_pipe_action *acts = s->actions[p->stage];
    dt_status st = check_batch(p, inputs, targets);
    memset(&p->stats, 0, sizeof p->stats); /* this step's, for dt_pipe_last_stats */
    const int slots[2] = {p->m.act_slots, p->m.grad_slots};
    if (st == DT_OK && p->act_bf16 &&
        dt_act_wire_reserve(&p->wire, (size_t)B * T * p->m.C, slots) != DT_OK)
        st = pipe_fail(p, DT_ENOMEM, "out of memory for the bf16 transfer buffers (%zu B)",
                       4 * (size_t)B * T * p->m.C * (size_t)(slots[0] + slots[1]));
    memset(p->t_start, 0, (size_t)s->n[p->stage] * sizeof(double));
    memset(p->t_end, 0, (size_t)s->n[p->stage] * sizeof(double));
    double t0 = dt_now();
    for (int i = 0; i < s->n[p->stage] && st == DT_OK;) {
        const dt_pipe_action *a = &acts[i];
        if (p->comm && (st = post_ahead(p, i, B, T)) != DT_OK)
            break;
        double ta = dt_now();
        if (dt_pipe_is_transfer(a->op)) {
            st = run_batch(p, i, B, T, &i);
        } else if (a->op == DT_PIPE_STEP) {
            p->t_start[i] = ta;
            st = wait_sends(p);
            p->t_end[i++] = dt_now();
        } else {
            p->t_start[i] = ta;
            st = compute(p, a, inputs, targets, B, T, p->hook && i == p->last_weights);
            p->t_end[i++] = dt_now();
        }
        p->stats.op_s[a->op] += dt_now() - ta;
    }
    if (st != DT_OK) { /* the failed communicator completes them at once */
        wait_sends(p);
        drop_early(p);
    }
    p->stats.wall_s = dt_now() - t0;
    float sum = 0.0f; /* the trainer's order: += loss_k / m, k = 0 .. m-1 */
    for (int k = 0; k < s->m && p->stage == s->p - 1; k++)
        sum += p->losses[k] / (float)s->m;
    if (loss)
        *loss = sum;
    return st;
}
