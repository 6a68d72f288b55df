/*
 * param_units.c — ZeRO stage 3's parameter path: the parameters live
 * sharded, and each unit of the model is all-gathered just before it is
 * read, into one of two buffers, and dropped once the layers past it run.
 *
 * The idea (Rajbhandari et al., "ZeRO", 2020, stage 3; PyTorch's FSDP).
 * After ZeRO-2 a rank still holds all 4Ψ bytes of weights although its
 * optimizer updates only its 1/p shard. Here the shard is all it keeps:
 * the model's parameter buffer is freed (dt_model_window_params) and the
 * model is cut into units — the embeddings, each block, ln_f with the
 * head — which forward reads one after another. Before forward reads
 * unit k, the unit is all-gathered from every rank's shard (an
 * allgatherv: counts = the unit ∩ each shard) into a buffer that is
 * mapped as the model's parameter window; at the same moment the gather
 * of unit k + 1 is launched into the other buffer, so it crosses the wire
 * while unit k computes (prefetch, one unit ahead; the step launches the
 * first two, since the embeddings are too quick to hide a block's
 * gather). Backward reads the units again in reverse, so they are
 * gathered again: from backward's parameter hook, just before each unit's
 * backward (and its recomputation), the unit is mapped and the gather of
 * the one below it launched. The
 * embeddings are not gathered for backward: the encoder's backward reads
 * only its output gradient and the token ids. The last block is still in
 * a buffer when forward ends, so it is not gathered twice.
 *
 * Cost. Per step each rank receives every unit twice (forward and
 * backward, less the embeddings and the last block once): about 2·4Ψ
 * bytes where ZeRO-1/2 gather 4Ψ once — with the gradient reduces that is
 * 1.5x DDP's traffic, the ZeRO paper's figure. Memory: the shard (4Ψ/p)
 * plus two units (2·4·max unit); with the gradient and optimizer shards,
 * 16Ψ/p + the units + ZeRO-2's gradient buckets. A model created sharded
 * (dt_model_create_sharded) never has a whole buffer: each rank draws its
 * own shard of the initial weights (dt_zero3_init_shard, the same bits as
 * the whole model's init), so the saving holds from start-up on. A model
 * created whole is sharded here, after rank 0's weights are broadcast.
 *
 * Ordering: every rank launches the same gathers in the same order
 * (forward's, then backward's), as the collectives require; whether a
 * unit is already in a buffer depends only on that order, so every rank
 * decides the same. A buffer is reused only after its gather is waited.
 * A failed gather still maps its buffer (forward must read something
 * until it returns); the error is kept and returned by the caller.
 *
 * A pipeline stage's units are its own (its blocks; the embeddings on
 * the first, ln_f and the head on the last), and its executor's
 * micro-batches interleave forwards and backwards: a unit not in a
 * buffer when it is needed is gathered then, and waited for.
 *
 * Under --precision bf16 (model/precision.c) a unit travels in bf16: each
 * rank rounds its share of the unit from its fp32 shard (the master) into
 * a bf16 send buffer, the allgatherv moves bf16 (bytes copied, nothing
 * summed, so nothing rounded in the collective), and the unit is widened
 * into its fp32 buffer when its gather is waited. Half the bytes; the
 * same bits, since the model reads every parameter rounded anyway (DDP
 * rounds its fp32 master on use to the same values). Memory: two bf16
 * send and receive buffers of a unit each, 2·2·2·max unit bytes. The
 * replica hash and a hold gather the fp32 shards exactly: they stand for
 * the masters, which checkpoints save.
 *
 * Outside training nothing needs the whole model at once either.
 * Evaluation and sampling run their forwards through the same units
 * (optim_param_units_inference: after the head the next forward's
 * embeddings are prefetched, as no backward follows), every rank running
 * the same forwards; the replica hash streams the units in order through
 * FNV-1a (optim_param_units_hash), which is the hash of the whole buffer;
 * checkpoints save and load the shard itself. A hold (one all-gather of
 * every shard into a full buffer, dt_model_hold_params) remains for a
 * caller that must have the whole model in one place.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_optim.h"
#include "optim_internal.h"

enum { BUFS = 2 }; /* gathered units: the one read, the next one arriving */

typedef struct punit {
    size_t lo, n;   /* elements of the flat buffer */
    size_t *counts; /* [world]: the unit ∩ each rank's shard */
} punit;

struct optim_param_units {
    dt_model *m;
    dt_comm *comm;
    int rank, world;
    size_t s, my_lo, my_n; /* shard size; this rank's valid range */
    const float *shard;    /* (s) this rank's parameters (the optimizer's) */
    size_t *all_counts;    /* [world]: each rank's valid count, for a hold */
    punit *units;          /* [nu], in forward order */
    size_t *unit_counts;   /* [nu * world] */
    int nu, first_bwd;     /* first_bwd: the lowest unit backward reads */
    size_t max_unit;
    float *buf[BUFS];
    bool bf16;              /* gathers travel in bf16 (the model computes in bf16) */
    uint16_t *send16[BUFS]; /* (max_unit) this rank's share of a unit, rounded */
    uint16_t *recv16[BUFS]; /* (max_unit) the gathered unit, before widening */
    bool narrow[BUFS];      /* the gather into buf[i] in flight is bf16's */
    int held[BUFS];         /* unit in each buffer (arriving or there), -1: none */
    dt_work *work[BUFS];
    bool done[BUFS];
    double t_submit[BUFS], t_done[BUFS];
    int mapped;     /* unit mapped as the model's window, -1: none */
    bool inference; /* forwards without backward: the head is followed by
                       the next forward's embeddings, not backward's block */
    optim_overlap_clock clock;
    dt_status st;
    char err[512];
};

static dt_status pu_fail(optim_param_units *u, dt_status st, const char *what, int unit)
{
    if (u->st == DT_OK) {
        u->st = st;
        char name[48] = "";
        if (unit >= 0)
            snprintf(name, sizeof name, " of unit %d of %d", unit, u->nu);
        snprintf(u->err, sizeof u->err, "zero3 (rank %d): %s%s: %s", u->rank, what, name,
                 u->comm && *dt_comm_error(u->comm) ? dt_comm_error(u->comm) : dt_status_name(st));
    }
    return st;
}

/* Units: [0, block l0), each block, [ln_f, Ψ) — the bounds forward's
 * parameter hook reports — with each one's share of every shard. */
static int build_units(optim_param_units *u)
{
    const dt_model *m = u->m;
    size_t bound[m->l1 - m->l0 + 3];
    int nb = 0;
    bound[0] = 0;
    for (int l = m->l0; l < m->l1; l++) {
        size_t at = m->tensors[(m->l0 == 0 ? 2 : 0) + 10 * (l - m->l0)].offset;
        if (at > bound[nb])
            bound[++nb] = at;
    }
    if (m->l1 == m->cfg.L)
        bound[++nb] = m->tensors[m->num_tensors - 3].offset; /* ln_f */
    if (m->num_params > bound[nb])
        bound[++nb] = m->num_params;
    u->units = calloc((size_t)nb, sizeof *u->units);
    u->unit_counts = calloc((size_t)nb * (size_t)u->world, sizeof(size_t));
    if (!u->units || !u->unit_counts)
        return -1;
    for (int k = 0; k < nb; k++) {
        punit *p = &u->units[k];
        *p = (punit){.lo = bound[k],
                     .n = bound[k + 1] - bound[k],
                     .counts = u->unit_counts + (size_t)k * (size_t)u->world};
        for (int r = 0; r < u->world; r++) {
            size_t a = (size_t)r * u->s, b = a + u->all_counts[r];
            a = a > p->lo ? a : p->lo;
            b = b < p->lo + p->n ? b : p->lo + p->n;
            p->counts[r] = b > a ? b - a : 0;
        }
        if (p->n > u->max_unit)
            u->max_unit = p->n;
    }
    u->nu = nb;
    u->first_bwd = m->l0 == 0 && nb > 1 ? 1 : 0; /* the encoder's backward reads no weights */
    return nb;
}

dt_status optim_param_units_create(optim_param_units **out, dt_model *m, dt_comm *comm, size_t s,
                                   const float *shard)
{
    optim_param_units *u = calloc(1, sizeof *u);
    *out = u;
    if (!u)
        return DT_ENOMEM;
    u->m = m;
    u->comm = comm;
    u->rank = comm ? dt_comm_rank(comm) : 0;
    u->world = comm ? dt_comm_size(comm) : 1;
    u->s = s;
    u->shard = shard;
    u->mapped = -1;
    u->my_lo = (size_t)u->rank * s;
    u->all_counts = calloc((size_t)u->world, sizeof *u->all_counts);
    if (!u->all_counts)
        return pu_fail(u, DT_ENOMEM, "create: out of memory", -1);
    for (int r = 0; r < u->world; r++) {
        size_t lo = (size_t)r * s;
        u->all_counts[r] = lo >= m->num_params      ? 0
                           : m->num_params - lo < s ? m->num_params - lo
                                                    : s;
    }
    u->my_n = u->all_counts[u->rank];
    if (build_units(u) < 0)
        return pu_fail(u, DT_ENOMEM, "create: out of memory for the units", -1);
    u->bf16 = m->bf16 && u->world > 1;
    for (int i = 0; i < BUFS; i++) {
        u->held[i] = -1;
        if (!(u->buf[i] = m->be->alloc(u->max_unit * sizeof(float))))
            return pu_fail(u, DT_ENOMEM, "create: out of memory for the unit buffers", -1);
        if (u->bf16 && (!(u->send16[i] = malloc(u->max_unit * sizeof(uint16_t))) ||
                        !(u->recv16[i] = malloc(u->max_unit * sizeof(uint16_t)))))
            return pu_fail(u, DT_ENOMEM, "create: out of memory for the bf16 unit buffers", -1);
    }
    dt_model_window_params(m, NULL, 0, 0); /* frees the model's full buffer */
    return DT_OK;
}

/* Waits for buffer i's gather, if one is in flight; a bf16 one is then
 * widened into the unit's fp32 buffer. */
static void wait_buf(optim_param_units *u, int i)
{
    if (!u->work[i])
        return;
    dt_status st = optim_overlap_clock_wait(&u->clock, &u->work[i], &u->done[i], u->t_submit[i],
                                            &u->t_done[i]);
    if (st != DT_OK)
        pu_fail(u, st, "all-gather of the parameters", u->held[i]);
    else if (u->narrow[i])
        dt_bf16_to_f32_n(u->buf[i], u->recv16[i], u->units[u->held[i]].n);
    u->narrow[i] = false;
}

void optim_param_units_destroy(optim_param_units *u)
{
    if (!u)
        return;
    for (int i = 0; i < BUFS; i++) {
        if (u->work[i])
            dt_work_wait(u->work[i]);
        if (u->buf[i])
            u->m->be->free(u->buf[i]);
        free(u->send16[i]);
        free(u->recv16[i]);
    }
    free(u->all_counts);
    free(u->units);
    free(u->unit_counts);
    free(u);
}

const char *optim_param_units_error(const optim_param_units *u)
{
    return u->err;
}

dt_status optim_param_units_status(const optim_param_units *u)
{
    return u->st;
}

size_t optim_param_units_bytes(const optim_param_units *u)
{
    size_t wire = u->bf16 ? 2 * sizeof(uint16_t) : 0; /* bf16's send and receive buffers */
    return (size_t)BUFS * u->max_unit * (sizeof(float) + wire);
}

int optim_param_units_count(const optim_param_units *u)
{
    return u->nu;
}

/* Launches unit k's gather into buffer i (after that buffer's last one):
 * in bf16 when the model computes in bf16, unless exact (the fp32
 * masters, for the replica hash). */
static void gather(optim_param_units *u, int k, int i, bool exact)
{
    wait_buf(u, i);
    const punit *p = &u->units[k];
    u->held[i] = k;
    if (u->world == 1) {
        u->m->be->copy(u->buf[i], u->shard + p->lo, p->n * sizeof(float));
        return;
    }
    size_t from = p->lo > u->my_lo ? p->lo - u->my_lo : 0;
    dt_op op = {.kind = DT_OP_ALLGATHERV,
                .send = p->counts[u->rank] ? u->shard + from : u->shard,
                .recv = u->buf[i],
                .counts = p->counts,
                .dtype = DT_F32};
    u->narrow[i] = u->bf16 && !exact;
    if (u->narrow[i]) { /* this rank's share rounded; the unit arrives in bf16 */
        dt_f32_to_bf16_n(u->send16[i], op.send, p->counts[u->rank]);
        op.send = u->send16[i];
        op.recv = u->recv16[i];
        op.dtype = DT_BF16;
    }
    u->done[i] = false;
    u->t_submit[i] = dt_now();
    if (u->st != DT_OK)
        return; /* after a failure nothing more is sent */
    dt_status st = dt_submit(u->comm, &op, &u->work[i]);
    if (st != DT_OK) {
        u->work[i] = NULL;
        pu_fail(u, st, "launching the all-gather", k);
    }
}

static int find(const optim_param_units *u, int k)
{
    for (int i = 0; i < BUFS; i++)
        if (u->held[i] == k)
            return i;
    return -1;
}

/* Notes, for the timing, which gathers have finished. */
static void poll(optim_param_units *u)
{
    for (int i = 0; i < BUFS; i++)
        if (u->work[i] && !u->done[i] && dt_work_test(u->work[i])) {
            u->done[i] = true;
            u->t_done[i] = dt_now();
        }
}

/* Unit k is about to be read: waits for it (gathering it now if no
 * prefetch did), maps it, and launches the gather of unit next (-1:
 * none) into the other buffer. */
static void need(optim_param_units *u, int k, int next)
{
    poll(u);
    int i = find(u, k);
    if (i < 0) {
        i = next >= 0 && u->held[0] == next ? 1 : 0;
        gather(u, k, i, false);
    }
    wait_buf(u, i);
    dt_model_window_params(u->m, u->buf[i], u->units[k].lo, u->units[k].n);
    u->mapped = k;
    if (next >= 0 && find(u, next) < 0)
        gather(u, next, 1 - i, false);
}

void optim_param_units_forward_hook(void *user, size_t hi)
{
    optim_param_units *u = user;
    for (int k = 0; k < u->nu; k++)
        if (u->units[k].lo + u->units[k].n == hi) {
            /* after the head, backward's first block (or, in inference,
             * the next forward's first unit) */
            int next = k + 1 < u->nu               ? k + 1
                       : u->inference              ? 0
                       : u->nu - 2 >= u->first_bwd ? u->nu - 2
                                                   : -1;
            need(u, k, next);
            return;
        }
}

void optim_param_units_backward_hook(void *user, size_t lo)
{
    optim_param_units *u = user;
    for (int k = u->first_bwd; k < u->nu; k++)
        if (u->units[k].lo == lo) {
            need(u, k, k - 1 >= u->first_bwd ? k - 1 : -1);
            return;
        }
}

void optim_param_units_forget(optim_param_units *u)
{
    for (int i = 0; i < BUFS; i++) {
        wait_buf(u, i);
        u->held[i] = -1;
    }
    if (u->mapped >= 0 && !u->m->params_memory)
        dt_model_window_params(u->m, NULL, 0, 0);
    u->mapped = -1;
}

void optim_param_units_prefetch(optim_param_units *u)
{
    optim_param_units_forget(u);
    for (int k = 0; k < BUFS && k < u->nu; k++) /* the embeddings compute too little */
        gather(u, k, k, false);                 /* to hide the first block's gather */
}

dt_status optim_param_units_hold(optim_param_units *u, bool hold)
{
    optim_param_units_forget(u);
    if (u->st != DT_OK)
        return u->st;
    dt_model *m = u->m;
    dt_status st = dt_model_hold_params(m, hold);
    if (st != DT_OK)
        return pu_fail(u, st, dt_model_error(m), -1);
    if (!hold)
        return DT_OK;
    if (u->world == 1) {
        m->be->copy(m->params_memory, u->shard, m->num_params * sizeof(float));
        return DT_OK;
    }
    dt_op op = {.kind = DT_OP_ALLGATHERV,
                .send = u->shard,
                .recv = m->params_memory,
                .counts = u->all_counts,
                .dtype = DT_F32};
    dt_work *w = NULL;
    if ((st = dt_submit(u->comm, &op, &w)) == DT_OK)
        st = dt_work_wait(w);
    return st == DT_OK ? DT_OK : pu_fail(u, st, "all-gather of the whole model", -1);
}

void optim_param_units_take_clock(optim_param_units *u, optim_overlap_clock *into)
{
    into->busy_s += u->clock.busy_s;
    into->exposed_s += u->clock.exposed_s;
    into->ops += u->clock.ops;
    u->clock.busy_s = u->clock.exposed_s = 0;
    u->clock.ops = 0;
}

void optim_param_units_inference(optim_param_units *u, bool on)
{
    optim_param_units_forget(u);
    u->inference = on;
}

/* Continues h over unit k's gathered bytes, staged to the host in chunks
 * of `cap` floats through host (a device's buffer cannot be read here). */
static uint64_t hash_unit(const optim_param_units *u, int i, int k, uint64_t h, float *host,
                          size_t cap)
{
    const punit *p = &u->units[k];
    for (size_t at = 0; at < p->n; at += cap) {
        size_t c = p->n - at < cap ? p->n - at : cap;
        u->m->be->to_host(host, u->buf[i] + at, c * sizeof(float));
        h = dt_params_hash_more(h, host, c);
    }
    return h;
}

dt_status optim_param_units_hash(optim_param_units *u, uint64_t *hash)
{
    enum { CAP = 1 << 18 }; /* floats staged at a time: 1 MiB */
    *hash = 0;
    dt_status st = optim_param_units_hold(u, false); /* forgets the buffers too */
    float *host = malloc(CAP * sizeof(float));
    if (st != DT_OK || !host) {
        free(host);
        return st != DT_OK ? st : pu_fail(u, DT_ENOMEM, "hash: out of memory", -1);
    }
    uint64_t h = DT_PARAMS_HASH_BASIS;
    for (int k = 0; k < BUFS && k < u->nu; k++)
        gather(u, k, k, true);
    for (int k = 0; k < u->nu && u->st == DT_OK; k++) {
        int i = find(u, k);
        wait_buf(u, i);
        if (u->st == DT_OK)
            h = hash_unit(u, i, k, h, host, CAP);
        if (k + BUFS < u->nu)
            gather(u, k + BUFS, i, true); /* the one after next, into this buffer */
    }
    optim_param_units_forget(u);
    free(host);
    *hash = h;
    return u->st;
}
