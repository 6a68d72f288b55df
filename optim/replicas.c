/*
 * replicas.c — are the ranks' model replicas still bitwise identical?
 *
 * Data parallelism is only correct while every rank applies the same update
 * to the same parameters. A drifted replica (a rank that skipped a step, an
 * optimizer that is not deterministic, a reduction whose result differs
 * between ranks) trains silently wrong, so the trainer and the tests check
 * it: each rank hashes its parameters' bytes (FNV-1a, 64 bits) and the
 * hashes are all-gathered — 8 bytes per rank instead of the parameters.
 *
 * Under ZeRO-3 no rank holds the parameters whole: dt_zero1_check_replicas
 * (zero_replicas.c) streams the hash through the units as they are gathered one
 * at a time (param_units.c, continuing it with dt_params_hash_more), the
 * same FNV-1a over the same bytes in the same order, so it equals
 * ZeRO-1's, and compares with optim_compare_hashes below.
 *
 * Cost: one pass over 4Ψ bytes and an all-gather of 8p bytes (ZeRO-3:
 * plus one all-gather of the model, unit by unit).
 */
#include <stdlib.h>
#include <string.h>

#include "dt_optim.h"
#include "optim_internal.h"

uint64_t dt_params_hash(const float *params, size_t n)
{
    return dt_params_hash_more(DT_PARAMS_HASH_BASIS, params, n);
}

uint64_t dt_params_hash_more(uint64_t h, const float *params, size_t n)
{
    const unsigned char *b = (const unsigned char *)params;
    for (size_t i = 0; i < n * sizeof(float); i++) {
        h ^= b[i];
        h *= 1099511628211ULL; /* FNV prime */
    }
    return h;
}

dt_status optim_compare_hashes(dt_comm *comm, uint64_t mine, bool *same, uint64_t *hashes)
{
    *same = true;
    int p = comm ? dt_comm_size(comm) : 1;
    uint64_t *all = calloc((size_t)p, sizeof *all);
    if (!all)
        return DT_ENOMEM;
    dt_status st = DT_OK;
    if (p > 1)
        st = dt_allgather(comm, &mine, all, 1, DT_I64);
    else
        all[0] = mine;
    for (int r = 1; st == DT_OK && r < p; r++)
        if (all[r] != all[0])
            *same = false;
    if (hashes && st == DT_OK)
        memcpy(hashes, all, (size_t)p * sizeof *all);
    free(all);
    return st;
}

dt_status dt_check_replicas(dt_comm *comm, const dt_model *m, bool *same, uint64_t *hashes)
{
    *same = true;
    float *host = malloc(m->num_params * sizeof(float));
    if (!host)
        return DT_ENOMEM;
    dt_model_get_params(m, host);
    uint64_t mine = dt_params_hash(host, m->num_params);
    free(host);
    return optim_compare_hashes(comm, mine, same, hashes);
}
