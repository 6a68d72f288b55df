/*
 * zero_memory.c — what a ZeRO rank holds, stage by stage: the bytes that
 * minigpt's memory table reports for a dt_zero1 (zero1.c), and its shard.
 *
 * Per rank, with s = ceil(Ψ/N) (Ψ: the parameters of the model or of the
 * pipeline stage it holds):
 *
 *   stage   parameters          gradients              optimizer
 *   1       4Ψ                  4Ψ                     12s (master, m, v)
 *   2       4Ψ                  4s + buckets in flight 8s (m, v)
 *   3       4s + two units      4s + buckets in flight 8s (m, v)
 *
 * A pipeline stage under ZeRO-2 or -3 keeps its micro-batches' gradient
 * sum whole (4Ψ of the stage), and ZeRO-3's master is its parameters.
 * A bf16 model's ZeRO-1/2 gathers in bf16 (zero_bf16_params.c): ZeRO-2
 * then keeps an fp32 master too (optimizer 12s), and both a 2s send
 * buffer (staging); ZeRO-3's units add their bf16 buffers (param_units.c).
 * Reading these costs nothing: they are sizes, not measurements (the
 * trainer prints the allocator's and the kernel's figures beside them).
 */
#include "dt_optim.h"
#include "optim_internal.h"

void dt_zero1_shard(const dt_zero1 *z, size_t *lo, size_t *n)
{
    *lo = z->lo;
    *n = z->n;
}

size_t dt_zero1_optimizer_bytes(const dt_zero1 *z)
{
    return (z->own_master && !z->pu ? 3 : 2) * z->s * sizeof(float);
}

size_t dt_zero1_param_bytes(const dt_zero1 *z)
{
    return z->pu ? z->s * sizeof(float) + optim_param_units_bytes(z->pu)
                 : z->m->num_params * sizeof(float);
}

size_t dt_zero1_staging_bytes(const dt_zero1 *z)
{
    /* reduces run in place in the model's gradient buffer; a bf16
     * gather sends the master rounded */
    return optim_zero_bf16_bytes(z);
}

size_t dt_zero1_gradient_bytes(const dt_zero1 *z)
{
    return z->gs ? optim_grad_shards_bytes(z->gs) : z->m->num_params * sizeof(float);
}

int dt_zero1_stage(const dt_zero1 *z)
{
    return z->stage;
}

int dt_zero1_num_buckets(const dt_zero1 *z)
{
    return z->gs ? optim_grad_shards_num_buckets(z->gs) : z->nreduce;
}
