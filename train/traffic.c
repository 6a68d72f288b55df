/*
 * traffic.c — the bytes a data-parallel step sends, measured by dtrain's
 * traffic counters (dt_comm_traffic) and printed beside the closed form:
 * minigpt's end-of-run "traffic per step" line (DDP, ZeRO-1/2/3).
 *
 * Measured: the payload bytes every rank sent from the start of the run's
 * first step to the end of its last, divided by ranks and steps: the mean
 * rank's step. (One rank's share depends on where the shard boundaries
 * fall in the chunks; summed over the ranks every chunk is counted N-1
 * times, so the mean is the closed form exactly.) The end waits (a
 * barrier, which sends no payload) for every op the steps queued, so the
 * last ZeRO gather, still in flight when its step returned, is counted
 * whole; whatever runs between steps (an evaluation, a checkpoint) is
 * counted too.
 *
 * Closed form, bytes one rank sends per step, with Ψ parameters, N ranks,
 * g bytes per gradient element (4, or 2 with --grad-comm bf16), w bytes
 * per gathered parameter (4, or 2 with --precision bf16: ZeRO gathers
 * the masters rounded, optim/zero_bf16_params.c and param_units.c):
 *
 *   DDP     gradients: the bucket all-reduces, 2(N-1)/N · gΨ (ring; a
 *           bf16 bucket goes by the rank-order all-reduce, the same
 *           bytes); an fp32 bucket of 64 KiB or less goes by recursive
 *           doubling instead (collectives/algorithms/algo_select.c):
 *           (2(N-q) + q·log2 q)/N · g·n, q the power of two <= N, the
 *           folded ranks sending twice
 *   ZeRO-1/2  gradients: each piece reduced to its owner, (N-1)/N · gΨ;
 *           parameters: the updated shards all-gathered, (N-1)/N · wΨ
 *   ZeRO-3  gradients as ZeRO-2; parameters gathered unit by unit for
 *           forward and again for backward, less the embeddings E (not
 *           read by backward) and the two units still held when forward
 *           ends, the last block B and the head H (ln_f + lm_head); and
 *           once in the run, the prefetch of the next step's first two
 *           units (E + B) that the last step launches, 1/S of it a step
 *           over S steps: (N-1)/N · w(2Ψ - E - B - H + (E + B)/S)
 *
 * plus the loss's 4-byte all-reduce. Ring and rank-order all-reduces send
 * exactly 2(N-1)/N of a buffer that N divides; a rank's shard of the rest
 * shifts the figures by a few elements.
 *
 * On the gloo wire (torch 1.13's) the measurement is printed alone: torch
 * runs every all-reduce on its ring and cuts its own messages.
 *
 * Cost: arithmetic, at the end of the run.
 */
#include <stdio.h>
#include <string.h>

#include "trainer.h"

/* Parameters one unit of each kind holds: the embeddings, a block, the
 * head. */
static size_t embedding_params(const dt_config *c)
{
    return ((size_t)c->V + (size_t)c->T) * (size_t)c->C;
}

static size_t head_params(const dt_config *c)
{
    return 2 * (size_t)c->C + (size_t)c->V * (size_t)c->C;
}

static size_t block_params(const dt_config *c)
{
    size_t C = (size_t)c->C;
    return 12 * C * C + 9 * C; /* qkv 3C², proj C², fc 4C² + 4C, fcproj 4C² + C, two LN 4C */
}

/* algo_select.c's threshold: fp32 all-reduces up to this size (or of
 * fewer elements than ranks) go by recursive doubling. */
#define RECURSIVE_DOUBLING_MAX_BYTES ((double)64 * 1024)

/* Bytes a rank sends, on the mean, all-reducing n elements of g bytes. */
static double allreduce_bytes(double n, double g, int N)
{
    bool widened = g == 2; /* bf16: rank order, the ring's bytes */
    if (widened || (n * g > RECURSIVE_DOUBLING_MAX_BYTES && n >= N))
        return 2.0 * (N - 1) / N * g * n;
    int q = 1, rounds = 0;
    while (2 * q <= N) {
        q *= 2;
        rounds++;
    }
    return (2.0 * (N - q) + (double)q * rounds) / N * g * n;
}

/* DDP's gradient term: its buckets' all-reduces. */
static double ddp_grads(const mg_run *r, double g)
{
    double sum = 0;
    for (int i = 0; i < dt_ddp_num_buckets(r->ddp); i++) {
        size_t lo, n;
        dt_ddp_bucket(r->ddp, i, &lo, &n);
        sum += allreduce_bytes((double)n, g, r->world);
    }
    return sum;
}

/* Bytes a gathered parameter travels in: 2 where ZeRO gathers bf16. */
static int param_wire_bytes(const mg_run *r)
{
    return r->o.parallel != MG_DDP && strcmp(r->o.precision, "bf16") == 0 ? 2 : 4;
}

/* The closed form's two terms, in bytes per rank per step, and the
 * parameters' term in words (how, len bytes). */
static void closed_form(const mg_run *r, double *grads, double *params, char *how, size_t len)
{
    const double N = r->world, psi = (double)r->m->num_params, share = (N - 1) / N;
    const double g = strcmp(r->o.grad_comm, "bf16") == 0 ? 2 : 4, w = param_wire_bytes(r);
    *params = 0;
    how[0] = '\0';
    if (r->o.parallel == MG_DDP) {
        *grads = ddp_grads(r, g);
        return;
    }
    *grads = share * g * psi;
    if (r->o.parallel == MG_ZERO3) {
        double first_two = (double)(embedding_params(&r->o.cfg) + block_params(&r->o.cfg));
        double held = first_two + (double)head_params(&r->o.cfg);
        *params = share * w * (2 * psi - held + first_two / r->traffic_steps);
        snprintf(how, len, "(N-1)/N x %.0f(2Ψ - E - B - H + (E + B)/S)", w);
    } else {
        *params = share * w * psi;
        snprintf(how, len, "(N-1)/N x %.0fΨ", w);
    }
}

void mg_report_traffic(FILE *f, const mg_run *r)
{
    if (r->world < 2 || r->pipe || r->tp || r->three_d || r->traffic_steps < 1)
        return;
    double grads, params, measured = (double)r->traffic_sent / r->traffic_steps / r->world;
    if (r->gloo_wire) { /* torch's ring always, and its own message sizes */
        fprintf(f,
                "traffic per step and rank (mean of %d steps, dtrain's counters): %.0f B sent "
                "(the gloo wire: no closed form here)\n",
                r->traffic_steps, measured);
        return;
    }
    char params_how[64];
    closed_form(r, &grads, &params, params_how, sizeof params_how);
    const char *g = strcmp(r->o.grad_comm, "bf16") == 0 ? "bf16" : "fp32";
    const char *g_how = r->o.parallel == MG_DDP ? "bucket all-reduces of" : "(N-1)/N x";
    fprintf(f,
            "traffic per step and rank (mean of %d steps, dtrain's counters): %.0f B sent; "
            "closed form %.0f B = gradients (%s) %s %dΨ %.0f",
            r->traffic_steps, measured, grads + params, g, g_how, g[0] == 'b' ? 2 : 4, grads);
    if (params > 0)
        fprintf(f, " + parameters (%s) %s %.0f", param_wire_bytes(r) == 2 ? "bf16" : "fp32",
                params_how, params);
    fprintf(f, "; measured / closed form %.4f\n", measured / (grads + params));
}
