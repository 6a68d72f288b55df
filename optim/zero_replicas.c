/*
 * zero_replicas.c — ZeRO's whole-model views: the replica check of a
 * dt_zero1 (are the ranks' parameters still bitwise identical?) and, for
 * a bf16 model, the fp32 masters gathered into every replica.
 *
 * ZeRO-1/2 check the model's replicas as DDP does (replicas.c). Of a bf16
 * model the replicas hold the masters rounded to bf16 (their gathers are
 * bf16's, zero_bf16_params.c), except after a checkpoint, which puts the
 * masters themselves back: every rank first rounds its replica in place
 * (what the model reads anyway) and the rounded replicas are compared;
 * then the fp32 masters are all-gathered exactly into every replica and
 * hashed: the hash is the masters', which is what DDP's fp32 replica
 * hashes, so the modes can be compared bit for bit. ZeRO-3 streams the
 * hash through its units, gathered in fp32 for it (param_units.c).
 *
 * Cost: a pass over 4Ψ bytes and an all-gather of 8p bytes; of a bf16
 * ZeRO-1/2 twice, plus an fp32 all-gather of the masters ((N-1)/N · 4Ψ
 * bytes a rank); ZeRO-3: one fp32 all-gather of the model, unit by unit.
 */
#include <stdio.h>

#include "dt_optim.h"
#include "optim_internal.h"

dt_status dt_zero1_masters_to_params(dt_zero1 *z)
{
    dt_status st = dt_zero1_wait_params(z);
    if (st == DT_OK)
        st = optim_zero_bf16_gather_masters(z);
    return st == DT_OK ? DT_OK : optim_zero1_fail(z, st, "all-gather of the fp32 masters");
}

/* ZeRO-1/2: the replicas as each reads them (rounded, for a bf16 model),
 * then the masters. */
static dt_status bf16_check(dt_zero1 *z, bool *same, uint64_t *hashes)
{
    if (z->param_bf16) {
        optim_zero_bf16_round_params(z);
        dt_status st = dt_check_replicas(z->comm, z->m, same, hashes);
        if (st != DT_OK || !*same)
            return st;
        if ((st = dt_zero1_masters_to_params(z)) != DT_OK)
            return st;
    }
    return dt_check_replicas(z->comm, z->m, same, hashes);
}

dt_status dt_zero1_check_replicas(dt_zero1 *z, bool *same, uint64_t *hashes)
{
    *same = true;
    if (!z->pu) { /* ZeRO-1/2; bf16: the rounded replicas, then the masters */
        dt_status st = dt_zero1_wait_params(z);
        if (st == DT_OK)
            st = bf16_check(z, same, hashes);
        if (st != DT_OK && !z->err[0])
            snprintf(z->err, sizeof z->err, "zero%d (rank %d): replica check: %s", z->stage,
                     z->rank, optim_zero1_cause(z, st));
        return st;
    }
    uint64_t mine;
    dt_status st = optim_param_units_hash(z->pu, &mine);
    if (st != DT_OK) {
        snprintf(z->err, sizeof z->err, "%s", optim_param_units_error(z->pu));
        return st;
    }
    st = optim_compare_hashes(z->comm, mine, same, hashes);
    if (st != DT_OK)
        snprintf(z->err, sizeof z->err,
                 "zero3 (rank %d): replica check: all-gather of the hashes: %s", z->rank,
                 optim_zero1_cause(z, st));
    return st;
}
