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
 * Cost: one pass over 4Ψ bytes and an all-gather of 8p bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "dt_optim.h"

uint64_t dt_params_hash(const float *params, size_t n)
{
    const unsigned char *b = (const unsigned char *)params;
    uint64_t h = 14695981039346656037ULL; /* FNV offset basis */
    for (size_t i = 0; i < n * sizeof(float); i++) {
        h ^= b[i];
        h *= 1099511628211ULL; /* FNV prime */
    }
    return h;
}

dt_status dt_check_replicas(dt_comm *comm, const dt_model *m, bool *same, uint64_t *hashes)
{
    *same = true;
    float *host = malloc(m->num_params * sizeof(float));
    int p = comm ? dt_comm_size(comm) : 1;
    uint64_t *all = calloc((size_t)p, sizeof *all);
    if (!host || !all) {
        free(host);
        free(all);
        return DT_ENOMEM;
    }
    dt_model_get_params(m, host);
    uint64_t mine = dt_params_hash(host, m->num_params);
    free(host);
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
