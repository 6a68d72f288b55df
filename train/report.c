/*
 * report.c — what minigpt prints: the run header, one line per logged
 * step, a progress bar on a terminal, and the end-of-run tables (losses,
 * the memory model, every rank's memory).
 *
 * Memory is reported twice on purpose. "Accounted" adds up the buffers the
 * program knows it owns — parameters, gradients, optimizer state,
 * activations, staging — from their sizes; "measured" asks the allocator
 * what is really in use (mallinfo2: heap plus mmap'ed blocks, which
 * includes the communicator's and OpenBLAS's own memory) and the kernel
 * for the peak resident set. A gap between them is worth a look; the
 * accounted optimizer bytes are what ZeRO-1 divides by N.
 *
 * The memory model table counts model states (weights, gradients,
 * optimizer state) per rank in every mode, so its ZeRO-1 row is what the
 * accounted table's params + grads + optimizer add up to on a ZeRO-1 run.
 */
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "trainer.h"

/* 29824 -> "29,824" */
static const char *commas(char *buf, size_t len, size_t v)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%zu", v), o = 0;
    for (int i = 0; i < n && (size_t)o + 2 < len; i++) {
        if (i > 0 && (n - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = tmp[i];
    }
    buf[o] = '\0';
    return buf;
}

/* "ZeRO-1", "ZeRO-2" or "ZeRO-3" for a sharded run, "DDP" otherwise. */
static const char *mode_title(const mg_run *r)
{
    static const char *const names[] = {"DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"};
    return names[r->zero1 ? dt_zero1_stage(r->zero1) : 0];
}

/* More threads on the node than it has cores: an OpenMP team spins while
 * it waits for its members, so a step slows by far more than the ratio.
 * Said only where --threads chose it (one thread per rank is the
 * launcher's own warning, with more ranks than cores). */
static void warn_if_oversubscribed(FILE *f, int threads)
{
    int cores = dt_threads_default(1), local = mg_local_world_size();
    if (threads > 1 && threads * local > cores)
        fprintf(f,
                "compute: warning: %d rank%s x %d threads on %d core%s: oversubscribed, every "
                "step will crawl; --threads %d fits\n",
                local, local == 1 ? "" : "s", threads, cores, cores == 1 ? "" : "s",
                cores / local > 0 ? cores / local : 1);
}

void mg_report_header(FILE *f, const mg_run *r)
{
    const mg_options *o = &r->o;
    char pc[32];
    /* each pipeline (each tp group) is one replica; its micro-batches, the
     * accumulation */
    int replicas = r->pipe || r->tp || r->three_d ? r->dp : r->world;
    int accum = r->pipe || r->three_d ? mg_microbatches(o) : o->grad_accum;
    char who[48];
    snprintf(who, sizeof who, "%d %s%s", replicas,
             r->pipe || r->three_d ? "pipeline"
             : r->tp               ? "tp group"
                                   : "rank",
             replicas == 1 ? "" : "s");
    fprintf(f,
            "minigpt: V=%d C=%d H=%d L=%d T=%d, %s parameters; %s x "
            "batch %d x accum %d x T %d = %d tokens/step; lr %g; %s%s%s; "
            "data %s\n",
            o->cfg.V, o->cfg.C, o->cfg.H, o->cfg.L, o->cfg.T,
            commas(pc, sizeof pc, dt_config_num_params(&o->cfg)), who, o->batch, accum, o->cfg.T,
            replicas * o->batch * accum * o->cfg.T, (double)o->lr,
            r->pipe ? "pipeline" : mode_title(r), o->preset ? ", preset " : "",
            o->preset ? o->preset : "", o->data ? o->data : "embedded task (reverse digits)");
    if (r->pipe) {
        int M = mg_microbatches(o);
        bool chosen = o->microbatches > 0 || o->grad_accum > 1;
        fprintf(f,
                "pipeline: %s over %d stages (one per rank) x %d "
                "data-parallel replica%s, %d micro-batch%s of %d "
                "sequence%s per step%s\n",
                o->schedule, o->pp, r->dp, r->dp == 1 ? "" : "s", M, M == 1 ? "" : "es", o->batch,
                o->batch == 1 ? "" : "s",
                chosen ? "" : " (the default: 4 per stage; --microbatches M to choose)");
    }
    if (o->pp > 0 && strcmp(o->act_comm, "bf16") == 0) /* a plain pipeline or a 3-D grid */
        fprintf(f, "pipeline transfers: activations and their gradients rounded to bf16 "
                   "(--act-comm bf16: half the bytes, the residual stream rounded at each "
                   "stage boundary)\n");
    if (r->m && strcmp(r->m->be->name, "cpu") != 0)
        fprintf(f, "backend: %s%s%s\n", r->m->be->name,
                strcmp(r->m->be->name, "cuda") == 0 ? " (one GPU per rank, by LOCAL_RANK)" : "",
                r->dev ? "; collectives staged through pinned host memory" : "");
    if (r->m && r->m->bf16)
        fprintf(f,
                "precision: bf16 compute, fp32 master weights, gradients and AdamW state; "
                "path: %s\n",
                dt_bf16_path());
    if (r->m && r->m->recompute)
        fprintf(f, "recompute: blocks keep only their input; backward runs each block's "
                   "forward again\n");
    if (r->ddp && replicas > 1) /* one replica has no gradients to all-reduce */
        fprintf(f, "ddp: %d gradient bucket%s\n", dt_ddp_num_buckets(r->ddp),
                dt_ddp_num_buckets(r->ddp) == 1 ? "" : "s");
    if (r->zero1) {
        size_t lo, n;
        dt_zero1_shard(r->zero1, &lo, &n);
        fprintf(f,
                "zero%d: shard of %zu elements per rank, optimizer state "
                "%zu bytes per rank, gradients %zu bytes per rank\n",
                dt_zero1_stage(r->zero1), n, dt_zero1_optimizer_bytes(r->zero1),
                dt_zero1_gradient_bytes(r->zero1));
        if (dt_zero1_stage(r->zero1) == 3)
            fprintf(f, "zero3: parameters %zu bytes per rank (the shard and two gathered units)\n",
                    dt_zero1_param_bytes(r->zero1));
    }
    if (r->peak_gflops > 0)
        fprintf(f,
                "compute: %d thread%s per rank; sgemm %.1f GFLOP/s on them at start, the MFU "
                "column's 100%%\n",
                o->threads, o->threads == 1 ? "" : "s", r->peak_gflops);
    warn_if_oversubscribed(f, o->threads);
    fprintf(f, "%6s %9s %11s %9s %9s %7s %8s %5s\n", "step", "loss", "tokens/s", "ms/step",
            "comm ms", "hidden", "GFLOP/s", "MFU");
}

/* A rank's model FLOPs per second: the step's FLOPs (the usual count,
 * dt_config_flops_per_step) shared evenly among the ranks. */
static double rank_gflops(const mg_run *r, const mg_step *s)
{
    const dt_config *c = &r->o.cfg;
    double per_token = dt_config_flops_per_step(c, 1, c->T) / c->T;
    return s->tokens_per_s * per_token / r->world * 1e-9;
}

void mg_report_step(FILE *f, int step, const mg_step *s, const mg_run *r)
{
    char hidden[16] = "-", mfu[16] = "-";
    if (s->comm.hidden >= 0)
        snprintf(hidden, sizeof hidden, "%.0f%%", 100 * s->comm.hidden);
    double g = rank_gflops(r, s);
    if (r->peak_gflops > 0)
        snprintf(mfu, sizeof mfu, "%.0f%%", 100 * g / r->peak_gflops);
    fprintf(f, "%6d %9.4f %11.0f %9.2f %9.2f %7s %8.1f %5s\n", step + 1, (double)s->loss,
            s->tokens_per_s, s->ms, s->comm.comm_ms, hidden, g, mfu);
}

/*
 * A bar is escape codes and '\r's: right on a terminal, noise in a file.
 * Our stdout being a terminal is not enough: mpirun and srun hand rank 0 a
 * pseudo-terminal even when their own output goes to a file. So the rule:
 * a launcher that knows says so in DT_PROGRESS (dtrain-launch sets 1 when
 * its stdout is a terminal, where it draws '\r' lines in place; 0 when
 * not); under another launcher (OpenMPI, PMI, Slurm) without DT_PROGRESS,
 * no bar; alone, a bar when stdout is a terminal that is not "dumb".
 */
bool mg_progress_wanted(int rank)
{
    if (rank != 0)
        return false;
    const char *says = getenv("DT_PROGRESS");
    if (says && *says)
        return strcmp(says, "1") == 0;
    static const char *const foreign[] = {"OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMIX_RANK",
                                          "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++)
        if (getenv(foreign[i]))
            return false;
    const char *term = getenv("TERM");
    return isatty(STDOUT_FILENO) == 1 && !(term && strcmp(term, "dumb") == 0);
}

void mg_progress(FILE *f, int done, int total, float loss)
{
    enum { W = 30 };
    int fill = (int)((long)W * done / total);
    fputs("\r[", f);
    for (int i = 0; i < W; i++)
        fputc(i < fill ? '#' : '.', f);
    fprintf(f, "] %d/%d loss %.4f", done, total, (double)loss);
    fflush(f);
}

void mg_progress_clear(FILE *f)
{
    fputs("\r\033[K", f);
}

void mg_report_loss_table(FILE *f, const mg_run *r)
{
    fprintf(f, "loss table (%d steps, mean over the global batch):\n", r->o.steps - r->start_step);
    fprintf(f, "  step   loss\n");
    for (int s = r->start_step; s < r->o.steps; s++) /* resumed: from there */
        fprintf(f, "  %4d   %.4f\n", s + 1, (double)r->losses[s]);
}

/*
 * --precision bf16's rows (model/precision.c): the ZeRO paper's
 * mixed-precision accounting, 2Ψ bf16 weights + 2Ψ bf16 gradients + 12Ψ
 * fp32 master, m and v, per mode, beside what this run holds: the fp32
 * rows above, since the portable path rounds every parameter on use from
 * an fp32 buffer and keeps fp32 gradients — but for ZeRO-2, which gathers
 * its parameters in bf16 and so keeps an fp32 master of its shard as
 * ZeRO-1 does (4Ψ/N more: optim/zero_bf16_params.c).
 */
static void memory_model_bf16(FILE *f, size_t P, size_t s)
{
    char a[32], b[32], c[32], d[32];
    fprintf(f,
            "  bf16 compute (this run): the fp32 rows above (every parameter rounded to bf16 on "
            "use, no bf16 copy; fp32 gradients; ZeRO gathers the parameters in bf16, so ZeRO-2 "
            "keeps an fp32 master, 4Ψ/N more). The ZeRO paper's mixed precision, 2Ψ + 2Ψ + 12Ψ: "
            "DDP 16Ψ "
            "%s, ZeRO-1 4Ψ + 12Ψ/N %s, ZeRO-2 2Ψ + 14Ψ/N %s, ZeRO-3 16Ψ/N %s\n",
            commas(a, sizeof a, 16 * P), commas(b, sizeof b, 4 * P + 12 * s),
            commas(c, sizeof c, 2 * P + 14 * s), commas(d, sizeof d, 16 * s));
}

/*
 * The model states per rank in each mode, as formulas and bytes for this
 * run's Ψ and N: weights + gradients + optimizer state, every column
 * counted (activations are not model states: the table after this one has
 * them). dtrain's ZeRO-1 keeps an fp32 master of its shard beside AdamW's
 * m and v (12Ψ/N where the ZeRO paper's fp32 Adam has 8Ψ/N); ZeRO-2 keeps
 * none (its parameters are the master) and holds its gradient buckets in
 * flight (bk) beside its shard; ZeRO-3's master is all it keeps of the
 * weights, plus two gathered units (un: the unit buffers).
 */
void mg_report_memory_model(FILE *f, const mg_run *r)
{
    size_t P = r->m->num_params, N = (size_t)r->world, s = (P + N - 1) / N;
    size_t bk = 0, un = 0; /* the buckets in flight (ZeRO-2, 3), the units (ZeRO-3) */
    if (r->zero1 && dt_zero1_stage(r->zero1) >= 2)
        bk = dt_zero1_gradient_bytes(r->zero1) - 4 * s;
    if (r->zero1 && dt_zero1_stage(r->zero1) == 3)
        un = dt_zero1_param_bytes(r->zero1) - 4 * s;
    char a[32], b[32];
    fprintf(f,
            "memory model per rank, model states = weights + gradients + optimizer "
            "(Ψ = %s parameters, N = %zu, fp32):\n",
            commas(a, sizeof a, P), N);
    /* Ψ is two bytes in UTF-8, one column: the formulas are padded by hand */
    fprintf(f,
            "  mode    weights   gradients       optimizer              total             %12s\n",
            "bytes");
    const char *mine = mode_title(r);
    fprintf(f, "  %-7s 4Ψ        4Ψ              8Ψ (AdamW m, v)        16Ψ               %12s%s\n",
            "DDP", commas(a, sizeof a, 16 * P), strcmp(mine, "DDP") ? "" : "  <- this run");
    fprintf(f, "  %-7s 4Ψ        4Ψ              12Ψ/N (m, v, master)   8Ψ + 12Ψ/N        %12s%s\n",
            "ZeRO-1", commas(a, sizeof a, 8 * P + 12 * s),
            strcmp(mine, "ZeRO-1") ? "" : "  <- this run");
    char c[32];
    snprintf(b, sizeof b, " + %s", commas(c, sizeof c, bk));
    fprintf(f,
            "  %-7s 4Ψ        4Ψ/N + buckets  8Ψ/N (m, v)            4Ψ + 12Ψ/N + bk   %12s%s%s\n",
            "ZeRO-2", commas(a, sizeof a, 4 * P + 12 * s), bk ? b : " + bk",
            strcmp(mine, "ZeRO-2") ? "" : "  <- this run");
    char d[32], e[80] = " + un + bk";
    if (un)
        snprintf(e, sizeof e, " + %s + %s", commas(c, sizeof c, un), commas(d, sizeof d, bk));
    fprintf(f,
            "  %-7s 4Ψ/N + un 4Ψ/N + buckets  8Ψ/N (m, v)            16Ψ/N + un + bk   %12s%s%s\n",
            "ZeRO-3", commas(a, sizeof a, 16 * s), e,
            strcmp(mine, "ZeRO-3") ? "" : "  <- this run");
    fprintf(f, "  (the ZeRO paper's fp32 Adam: 16Ψ, 8Ψ + 8Ψ/N, 4Ψ + 12Ψ/N, 16Ψ/N; dtrain's ZeRO-1 "
               "adds an fp32 master, 4Ψ/N; bk = the gradient buckets in flight, un = ZeRO-3's "
               "two gathered units. The table below shows what this run allocated.)\n");
    if (r->m->bf16)
        memory_model_bf16(f, P, s);
}

enum { MEM_PARAMS, MEM_GRADS, MEM_OPTIM, MEM_STAGING, MEM_ACTS, MEM_HEAP, MEM_RSS, MEM_FIELDS };

static void my_memory(const mg_run *r, int64_t v[MEM_FIELDS])
{
    const dt_model *m = r->m;
    size_t P4 = m->num_params * sizeof(float);
    v[MEM_PARAMS] = r->zero1 ? (int64_t)dt_zero1_param_bytes(r->zero1) : (int64_t)P4;
    v[MEM_GRADS] = r->zero1 ? (int64_t)dt_zero1_gradient_bytes(r->zero1) : (int64_t)P4;
    v[MEM_OPTIM] = r->zero1    ? (int64_t)dt_zero1_optimizer_bytes(r->zero1)
                   : m->adam_m ? (int64_t)(2 * P4)
                               : 0;
    v[MEM_STAGING] = r->zero1 ? (int64_t)dt_zero1_staging_bytes(r->zero1) : 0;
    v[MEM_ACTS] = (int64_t)dt_model_activation_bytes(m);
    struct mallinfo2 mi = mallinfo2();
    v[MEM_HEAP] = (int64_t)(mi.uordblks + mi.hblkhd);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    v[MEM_RSS] = (int64_t)ru.ru_maxrss * 1024;
}

dt_status mg_report_memory(FILE *f, const mg_run *r)
{
    int64_t mine[MEM_FIELDS], *all = calloc((size_t)r->world * MEM_FIELDS, sizeof *all);
    if (!all)
        return DT_ENOMEM;
    my_memory(r, mine);
    dt_status st = DT_OK;
    if (r->comm)
        st = dt_gather(r->comm, mine, all, MEM_FIELDS, DT_I64, 0);
    else
        memcpy(all, mine, sizeof mine);
    if (st == DT_OK && r->rank == 0) {
        fprintf(f, "memory per rank (bytes; accounted from buffer sizes, states = params + "
                   "grads + optimizer; measured from the allocator and the kernel):\n");
        fprintf(f, "  %4s %11s %11s %11s %11s %11s %11s | %13s %13s\n", "rank", "params", "grads",
                "optimizer", "states", "staging", "activations", "measured heap", "peak RSS");
        for (int q = 0; q < r->world; q++) {
            int64_t *v = all + (size_t)q * MEM_FIELDS;
            /* a sanitizer's allocator reports 0 to mallinfo2 */
            char heap[24] = "n/a";
            if (v[MEM_HEAP] > 0)
                snprintf(heap, sizeof heap, "%lld", (long long)v[MEM_HEAP]);
            long long states = (long long)(v[MEM_PARAMS] + v[MEM_GRADS] + v[MEM_OPTIM]);
            fprintf(f, "  %4d %11lld %11lld %11lld %11lld %11lld %11lld | %13s %13lld\n", q,
                    (long long)v[MEM_PARAMS], (long long)v[MEM_GRADS], (long long)v[MEM_OPTIM],
                    states, (long long)v[MEM_STAGING], (long long)v[MEM_ACTS], heap,
                    (long long)v[MEM_RSS]);
        }
    }
    free(all);
    return st;
}
