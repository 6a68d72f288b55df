/*
 * cli.c — minigpt's command line, from one table.
 *
 * llm.c's train_gpt2.c parses flags in one place and describes them in
 * another, and the two drift apart. Here every flag is one row of
 * `flags[]`: its names, the kind of value, where it goes in mg_options and
 * its help line. The parser walks the table; the usage is printed from it,
 * defaults included (read from a default-initialised mg_options), so a flag
 * that parses is a flag that is documented.
 *
 * Presets (cli_presets.c) fill several fields at once and are applied
 * before any other flag, wherever --preset appears, so `--preset seed
 * --steps 5` means "the seed run, but 5 steps".
 *
 * Spelling and errors follow dt_flags.h, as in every dtrain program:
 * --grad-accum or --grad_accum, a value after a blank or '='; a bad flag or
 * value is one line naming it and a pointer to --help, exit code 2.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dt_flags.h"
#include "dt_pipe.h"

/* K_INT is a count (>= 0), K_POS a positive one (>= 1); K_U64 is
 * unsigned, a '-' refused rather than wrapped; K_POS_FLOAT is a finite
 * number > 0, K_SIZE_MB a finite one >= 0. */
typedef enum kind { K_INT, K_POS, K_U64, K_POS_FLOAT, K_SIZE_MB, K_STR, K_BOOL, K_PARALLEL } kind;

/* Compute threads per rank: a cap well above the cores one rank can use
 * on the machines dtrain is for, so that a typo (--threads 100000) is an
 * error at start instead of a pool of threads that only compete. */
#define MG_MAX_THREADS 256
#define MG_TEXT_(x) #x
#define MG_TEXT(x) MG_TEXT_(x) /* the number as a string, for the usage */

typedef struct flag {
    const char *name;  /* --name */
    const char *alias; /* -X, or NULL */
    kind kind;
    size_t offset;   /* into mg_options */
    const char *arg; /* placeholder in the usage */
    const char *help;
} flag;

#define OPT(f) offsetof(mg_options, f)

static const flag flags[] = {
    {"--vocab", "-V", K_POS, OPT(cfg.V), "N", "vocabulary size"},
    {"--width", "-C", K_POS, OPT(cfg.C), "N", "embedding width"},
    {"--heads", "-H", K_POS, OPT(cfg.H), "N", "attention heads"},
    {"--layers", "-L", K_POS, OPT(cfg.L), "N", "blocks"},
    {"--context", "-T", K_POS, OPT(cfg.T), "N", "context length"},
    {"--batch", "-B", K_POS, OPT(batch), "N", "sequences per rank per micro-step"},
    {"--steps", "-n", K_POS, OPT(steps), "N", "optimizer steps"},
    {"--grad-accum", NULL, K_POS, OPT(grad_accum), "K",
     "micro-steps per step (DDP syncs only the last)"},
    {"--lr", NULL, K_POS_FLOAT, OPT(lr), "X", "AdamW learning rate"},
    {"--seed", NULL, K_U64, OPT(seed), "N", "seed of the weights and the data"},
    {"--data", NULL, K_STR, OPT(data), "SRC",
     "'task' (embedded digit reversal), 'random' (seed tokens), llm.c token "
     "shards (a file or a glob, 'train_*.bin'; the vocabulary becomes GPT-2's "
     "50257 unless -V is given) or a text file (bytes)"},
    {"--parallel", NULL, K_PARALLEL, OPT(parallel), "MODE", "ddp, zero1, zero2 or zero3"},
    {"--bucket-mb", NULL, K_SIZE_MB, OPT(bucket_mb), "MB", "DDP gradient bucket size (0 = 25 MB)"},
    {"--log-every", NULL, K_POS, OPT(log_every), "N", "print a step line every N steps"},
    {"--eval-every", NULL, K_INT, OPT(eval_every), "N",
     "task accuracy every N steps (0 = at the end only)"},
    {"--eval-prompts", NULL, K_INT, OPT(eval_prompts), "N",
     "held-out prompts the task's accuracy grades, dealt out to the ranks "
     "(0 = the validation loss only)"},
    {"--sample", NULL, K_INT, OPT(sample), "N", "tokens to generate at the end"},
    {"--metrics", NULL, K_STR, OPT(metrics), "FILE", "JSONL metrics (rank 0)"},
    {"--loss-table", NULL, K_BOOL, OPT(loss_table), NULL, "print every step's loss at the end"},
    {"--check-replicas", NULL, K_BOOL, OPT(check_replicas), NULL,
     "compare parameter hashes across ranks after every step"},
    {"--threads", "-t", K_POS, OPT(threads), "N",
     "compute threads per rank (1.." MG_TEXT(
         MG_MAX_THREADS) "; default OMP_NUM_THREADS, else the node's cores / its ranks)"},
    {"--device", NULL, K_STR, OPT(device), "DEV",
     "cpu; cuda (one GPU per rank: the rank's LOCAL_RANK); or cuda-host "
     "(the CUDA kernels run on the host: a slow check without a GPU)"},
    {"--ckpt-dir", NULL, K_STR, OPT(ckpt_dir), "DIR",
     "checkpoint root (step_NNNNNNNN/ per save, 'latest')"},
    {"--ckpt-every", NULL, K_INT, OPT(ckpt_every), "K",
     "save a checkpoint every K steps (0 = never)"},
    {"--keep", NULL, K_INT, OPT(keep), "K", "keep the K newest checkpoints (0 = all)"},
    {"--resume", NULL, K_STR, OPT(resume), "WHAT",
     "'auto' (latest under --ckpt-dir, if any), a root or a step directory"},
    {"--verify-resume", NULL, K_BOOL, OPT(verify_resume), NULL,
     "reload the first checkpoint saved and check it byte for byte"},
    {"--die-at-step", NULL, K_INT, OPT(die_at_step), "N",
     "fault injection, for tests: after step N's update (before its save) "
     "the last rank SIGKILLs itself, on the first attempt only "
     "(DT_RESTART_COUNT unset or 0); 0 = never"},
    {"--trace", NULL, K_STR, OPT(trace), "FILE",
     "write what every rank did, when, as Chrome trace-event JSON "
     "(Perfetto, chrome://tracing)"},
    {"--gantt", NULL, K_BOOL, OPT(gantt), NULL,
     "with --pp: print the last step as a Gantt chart from the ranks' clocks"},
    {"--bubble-table", NULL, K_BOOL, OPT(bubble_table), NULL,
     "with --pp: measure the bubble of GPipe, 1F1B and ZB-H1 for m = 1..64 "
     "beside the closed form, and their activation memory per stage"},
    {"--pp", NULL, K_INT, OPT(pp), "P",
     "pipeline stages, one rank each (with --tp, a tp group each); the world is D x P "
     "ranks (D x T x P), D data-parallel pipelines; 0 = no pipeline"},
    {"--dp", NULL, K_INT, OPT(dp), "D",
     "with --pp or --tp: data-parallel replicas of the pipeline or of the "
     "tensor-parallel group (0 = world / P or world / T)"},
    {"--microbatches", NULL, K_INT, OPT(microbatches), "M",
     "micro-batches per pipelined step, of --batch sequences each "
     "(0 = --grad-accum if > 1, else 4 per stage)"},
    {"--schedule", NULL, K_STR, OPT(schedule), "NAME",
     "pipeline schedule: gpipe, 1f1b or zb (ZB-H1)"},
    {"--pp-partition", NULL, K_STR, OPT(pp_partition), "HOW",
     "blocks per stage: params (balance parameter counts) or uniform"},
    {"--recompute", NULL, K_BOOL, OPT(recompute), NULL,
     "activation recomputation: a block keeps only its input in forward and "
     "recomputes the rest in backward (same bits, one more forward)"},
    {"--tp", NULL, K_INT, OPT(tp), "T",
     "tensor parallelism (Megatron): each block split over T adjacent ranks; "
     "the world is D x T ranks (D x T x P with --pp), DDP across the D replicas; 0 = none"},
    {"--wire", NULL, K_STR, OPT(wire), "W",
     "the communicator's wire: dtrain (its own) or gloo (torch 1.13's); default: DT_WIRE's"},
    {"--grad-comm", NULL, K_STR, OPT(grad_comm), "TYPE",
     "the gradients' type on the wire: fp32, or bf16 (rounded to bf16, summed in fp32 and "
     "rounded once; half the bytes; training stays fp32), DDP and ZeRO-1/2/3, with --pp too"},
    {"--act-comm", NULL, K_STR, OPT(act_comm), "TYPE",
     "with --pp, the type of the activations and their gradients between stages: fp32, or "
     "bf16 (rounded at each stage boundary, half the bytes; no longer one process's bits)"},
    {"--precision", NULL, K_STR, OPT(precision), "TYPE",
     "compute precision: fp32, or bf16 (every parameter read and the stored activations rounded "
     "to bf16, ZeRO's parameters gathered in bf16; fp32 master weights, gradients and AdamW "
     "state), single rank, DDP, ZeRO-1/2/3, --pp (stages exchange the fp32 residual stream), "
     "--tp and the 3-D grid (--tp with --pp), with --recompute and --deterministic"},
    {"--deterministic", NULL, K_BOOL, OPT(deterministic), NULL,
     "one summation order for the gradient (micro-steps left to right, ranks in rank "
     "order, one division by k x N): DDP and ZeRO-1/2/3 end with bitwise the same "
     "parameters, and N ranks with those of one process with --grad-accum N"},
};
#define NFLAGS (sizeof flags / sizeof flags[0])

const char *mg_parallel_name(mg_parallel p)
{
    return p == MG_ZERO3 ? "zero3" : p == MG_ZERO2 ? "zero2" : p == MG_ZERO1 ? "zero1" : "ddp";
}

void mg_options_default(mg_options *o)
{
    *o = (mg_options){.cfg = dt_config_seed(),
                      .batch = 16,
                      .steps = 600,
                      .grad_accum = 1,
                      .lr = 3e-3f,
                      .seed = 1337,
                      .data = "task",
                      .parallel = MG_DDP,
                      .log_every = 50,
                      .eval_every = 200,
                      .eval_prompts = 200,
                      .sample = 48,
                      .threads = 0, /* 0: the default, chosen at start */
                      .schedule = "1f1b",
                      .pp_partition = "params",
                      .grad_comm = "fp32",
                      .act_comm = "fp32",
                      .precision = "fp32",
                      .device = "cpu"};
}

/* A preset is a function of the options: it sets what it names. */
static void print_default(FILE *f, const flag *fl, const mg_options *d)
{
    const char *p = (const char *)d + fl->offset;
    switch (fl->kind) {
    case K_INT: fprintf(f, " (default %d)", *(const int *)p); break;
    case K_POS: /* 0: a default chosen at start, which the text names */
        if (*(const int *)p)
            fprintf(f, " (default %d)", *(const int *)p);
        break;
    case K_U64: fprintf(f, " (default %llu)", (unsigned long long)*(const uint64_t *)p); break;
    case K_POS_FLOAT: fprintf(f, " (default %g)", (double)*(const float *)p); break;
    case K_SIZE_MB: fprintf(f, " (default %g)", *(const double *)p); break;
    case K_STR:
        fprintf(f, " (default %s)", *(const char *const *)p ? *(const char *const *)p : "none");
        break;
    case K_PARALLEL: fprintf(f, " (default %s)", mg_parallel_name(*(const mg_parallel *)p)); break;
    case K_BOOL: break;
    }
}

void mg_usage(FILE *f, const char *prog)
{
    mg_options d;
    mg_options_default(&d);
    fprintf(f,
            "usage: %s [--preset NAME] [flags]\n"
            "Trains MiniGPT as one rank of a job started by dtrain-launch,\n"
            "mpirun or srun (RANK/WORLD_SIZE/DT_INIT_URL from the environment),\n"
            "or alone when no world size is set. Words in a flag join with '-' or\n"
            "'_' (--grad-accum, --grad_accum); a value follows a blank or '='.\n\n",
            prog);
    for (size_t i = 0; i < NFLAGS; i++) {
        const flag *fl = &flags[i];
        char left[48];
        snprintf(left, sizeof left, "%s%s%s %s", fl->alias ? fl->alias : "", fl->alias ? ", " : "",
                 fl->name, fl->arg ? fl->arg : "");
        fprintf(f, "  %-24s %s", left, fl->help);
        print_default(f, fl, &d);
        fputc('\n', f);
    }
    fprintf(f, "  %-24s %s\n\npresets:\n", "--preset NAME", "apply a preset first");
    mg_print_presets(f);
}

static int bad(const char *prog, const char *what, const char *arg)
{
    return dt_flag_error(prog, "%s '%s'", what, arg);
}

/* What a value of each kind must be, for the message naming a bad one. */
static const char *kind_wants(kind k)
{
    switch (k) {
    case K_INT: return "a non-negative integer";
    case K_POS: return "a positive integer";
    case K_U64: return "a non-negative integer below 2^64";
    case K_POS_FLOAT: return "a positive number";
    case K_SIZE_MB: return "a number >= 0";
    case K_PARALLEL: return "ddp, zero1, zero2 or zero3";
    case K_STR:
    case K_BOOL: break;
    }
    return "a value";
}

/* Stores text into the field; false if it is not a value of that kind. */
static bool set_value(mg_options *o, const flag *fl, const char *text)
{
    char *p = (char *)o + fl->offset, *end = NULL;
    errno = 0;
    switch (fl->kind) {
    case K_INT:
    case K_POS: {
        long v = strtol(text, &end, 10);
        if (v < (fl->kind == K_POS) || v > 1000000000L)
            return false;
        *(int *)p = (int)v;
        break;
    }
    case K_U64:
        if (strchr(text, '-'))
            return false;
        *(uint64_t *)p = strtoull(text, &end, 10);
        break;
    case K_POS_FLOAT: {
        float v = strtof(text, &end);
        if (!(v > 0) || !isfinite(v))
            return false;
        *(float *)p = v;
        break;
    }
    case K_SIZE_MB: {
        double v = strtod(text, &end);
        if (!(v >= 0) || !isfinite(v))
            return false;
        *(double *)p = v;
        break;
    }
    case K_STR: *(const char **)p = text; return true;
    case K_PARALLEL:
        for (mg_parallel k = MG_DDP; k <= MG_ZERO3; k++)
            if (strcmp(text, mg_parallel_name(k)) == 0) {
                *(mg_parallel *)p = k;
                return true;
            }
        return false;
    case K_BOOL: *(bool *)p = true; return true;
    }
    return errno == 0 && end != text && *end == '\0';
}

/* "--steps: must be a positive integer, got '-5'", and where to look. */
static int bad_value(const char *prog, const flag *fl, const char *text)
{
    return dt_flag_error(prog, "%s: must be %s, got '%s'", fl->name, kind_wants(fl->kind), text);
}

/* The row `arg` names ("-t", "--grad-accum", "--grad_accum=4"); *value
 * gets what follows '=', else NULL. */
static const flag *find_flag(const char *arg, const char **value)
{
    for (size_t i = 0; i < NFLAGS; i++)
        if (dt_flag_is(arg, flags[i].name, value) ||
            (flags[i].alias && dt_flag_is(arg, flags[i].alias, value)))
            return &flags[i];
    return NULL;
}

/* The pipeline flags, and what does not combine with them yet. */
static int check_pipeline(const mg_options *o, const char *prog)
{
    dt_pipe_kind k;
    dt_pipe_partition_kind pk;
    if (o->pp < 0 || o->dp < 0 || o->microbatches < 0)
        return bad(prog, "counts must be >= 0:", "--pp/--dp/--microbatches");
    if (o->dp > 0 && o->pp == 0 && o->tp == 0)
        return bad(prog,
                   "--dp counts the replicas of a pipeline or a tp group; without "
                   "--pp or --tp every rank is one:",
                   "--dp");
    if (o->tp > 0 && o->recompute)
        return dt_flag_error(prog,
                             "--recompute with --tp: a tensor-parallel share keeps its "
                             "activations (recomputation is not built for it); drop one of them");
    if (o->tp > 1 && o->cfg.H % o->tp != 0) /* the vocabulary is checked once the data has one */
        return dt_flag_error(prog, "--tp %d does not divide the heads H = %d (--heads)", o->tp,
                             o->cfg.H);
    if (!dt_pipe_kind_parse(o->schedule, &k))
        return bad(prog, "not a schedule (gpipe, 1f1b, zb):", o->schedule);
    if (!dt_pipe_partition_parse(o->pp_partition, &pk))
        return bad(prog, "not a partition (params, uniform):", o->pp_partition);
    if (o->pp == 0 && (o->gantt || o->bubble_table))
        return bad(prog,
                   "a Gantt chart and the bubble table need a "
                   "pipeline:",
                   "--gantt/--bubble-table without --pp");
    if (o->pp == 0)
        return 0;
    if (o->tp > 0 && (o->gantt || o->bubble_table))
        return bad(prog, "the Gantt chart and the bubble table read a plain pipeline's stages:",
                   "--gantt/--bubble-table with --tp");
    if (o->microbatches > 0 && o->grad_accum > 1 && o->microbatches != o->grad_accum)
        return bad(prog,
                   "--microbatches and --grad-accum disagree (they "
                   "are the same thing in a pipeline):",
                   "--microbatches");
    return 0;
}

/* DT_WIRE=gloo: the wire a run without --wire joins (the communicator
 * reads it when the job is joined, after the options; it is read here too
 * so that what --deterministic cannot run on is refused with the flags,
 * whichever way the gloo wire was chosen). */
static bool env_chooses_gloo(void)
{
    const char *wire = getenv("DT_WIRE");
    return wire && strcmp(wire, "gloo") == 0;
}

/* --grad-comm bf16 rounds the gradients dtrain's collectives sum on the
 * host, in the data-parallel modes (the others send activations and
 * shares that this flag does not cover yet). */
static int check_grad_comm(const mg_options *o, const char *prog)
{
    if (strcmp(o->grad_comm, "fp32") && strcmp(o->grad_comm, "bf16"))
        return bad(prog, "--grad-comm is fp32 or bf16, not", o->grad_comm);
    if (strcmp(o->grad_comm, "bf16"))
        return 0;
    if (o->deterministic)
        return bad(prog, "--grad-comm bf16 rounds the gradients; drop", "--deterministic");
    if (o->tp > 0)
        return bad(prog,
                   "--grad-comm bf16 covers DDP and ZeRO-1/2/3, on a pipeline's stages too; drop",
                   "--tp");
    if (strcmp(o->device, "cpu"))
        return bad(prog, "--grad-comm bf16 converts on the host: the CPU backend only; drop",
                   "--device");
    if ((o->wire && strcmp(o->wire, "gloo") == 0) || (!o->wire && env_chooses_gloo()))
        return bad(prog, "--grad-comm bf16: torch 1.13's gloo has no bfloat16; use",
                   "--wire dtrain");
    return 0;
}

/* --precision bf16 (model/precision.c) covers a whole model or a
 * pipeline's stage on the host, alone, replicated or sharded (DDP,
 * ZeRO-1/2/3, on a pipeline's data-parallel axis too), with or without
 * --deterministic and --recompute, and a tensor-parallel share or a 3-D
 * stage (tensor/tp_precision.c: --tp, and --tp with --pp); the rest is
 * refused by name. */
static int check_precision(const mg_options *o, const char *prog)
{
    if (strcmp(o->precision, "fp32") && strcmp(o->precision, "bf16"))
        return bad(prog, "--precision is fp32 or bf16, not", o->precision);
    if (strcmp(o->precision, "bf16"))
        return 0;
    const char *drop = strcmp(o->device, "cpu") ? "--device" : NULL;
    if (drop)
        return bad(prog,
                   "--precision bf16 covers one rank, DDP, ZeRO-1/2/3, --pp and --tp on the CPU "
                   "for now; drop",
                   drop);
    bool gloo = (o->wire && strcmp(o->wire, "gloo") == 0) || (!o->wire && env_chooses_gloo());
    if (gloo && o->parallel != MG_DDP) /* ZeRO's gathers travel in bf16 */
        return bad(prog,
                   "--precision bf16 gathers ZeRO's parameters in bf16: torch 1.13's gloo "
                   "has no bfloat16; use",
                   "--wire dtrain");
    return 0;
}

static int check(const mg_options *o, const char *prog)
{
    char err[256];
    if (dt_config_check(&o->cfg, err, sizeof err) != DT_OK)
        return bad(prog, err, "model config");
    if (o->batch < 1 || o->steps < 1 || o->grad_accum < 1 || o->log_every < 1 ||
        o->eval_every < 0 || o->sample < 0 || o->threads < 0 || o->ckpt_every < 0 || o->keep < 0 ||
        o->die_at_step < 0)
        return bad(prog, "counts must be positive:",
                   "batch/steps/grad-accum/"
                   "log-every/threads >= 1, eval-every/sample/ckpt-every/keep/"
                   "die-at-step >= 0");
    if (o->threads > MG_MAX_THREADS)
        return dt_flag_error(prog, "--threads: at most %d compute threads per rank, got %d",
                             MG_MAX_THREADS, o->threads);
    if (o->resume && strcmp(o->resume, "auto") == 0 && !o->ckpt_dir)
        return bad(prog, "--resume auto needs", "--ckpt-dir");
    if (!(o->lr > 0) || !isfinite(o->lr))
        return dt_flag_error(prog, "--lr: must be a positive number, got %g", (double)o->lr);
    if (strcmp(o->device, "cpu") && strcmp(o->device, "cuda") && strcmp(o->device, "cuda-host"))
        return bad(prog, "--device is cpu, cuda or cuda-host, not", o->device);
    if (o->pp > 0 && strcmp(o->device, "cpu"))
        return bad(prog, "--pp runs on the CPU backend for now; drop", "--device");
    if (o->wire && strcmp(o->wire, "dtrain") && strcmp(o->wire, "gloo"))
        return bad(prog, "--wire is dtrain or gloo, not", o->wire);
    if (o->deterministic && o->tp > 0)
        return bad(prog, "--deterministic does not cover tensor parallelism yet; drop", "--tp");
    if (o->deterministic && o->wire && strcmp(o->wire, "gloo") == 0)
        return bad(prog, "--deterministic needs dtrain's rank-order collectives; drop",
                   "--wire gloo");
    if (o->deterministic && !o->wire && env_chooses_gloo())
        return bad(prog,
                   "--deterministic needs dtrain's rank-order collectives; add --wire dtrain or "
                   "unset",
                   "DT_WIRE=gloo");
    if (o->deterministic && strcmp(o->device, "cpu"))
        return bad(prog, "--deterministic sums on host memory: the CPU backend only; drop",
                   "--device");
    int rc = check_grad_comm(o, prog);
    if (!rc)
        rc = check_precision(o, prog);
    if (!rc)
        rc = mg_check_act_comm(o, prog);
    return rc ? rc : check_pipeline(o, prog);
}

int mg_options_parse(mg_options *o, int argc, char **argv)
{
    const char *prog = argv[0];
    if (dt_flag_help_asked(argc, argv)) {
        mg_usage(stdout, prog);
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (dt_flag_is(argv[i], "--preset", &v)) {
            if (!v && i + 1 < argc)
                v = argv[i + 1];
            if (!v)
                return bad(prog, "missing the preset name after", argv[i]);
            int rc = mg_apply_preset(o, prog, v);
            if (rc)
                return rc;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (dt_flag_is(a, "--preset", &v)) {
            i += v == NULL;
            continue;
        }
        const flag *fl = find_flag(a, &v);
        if (!fl)
            return bad(prog, "unknown flag", a);
        if (fl->kind == K_BOOL && v)
            return bad(prog, "takes no value:", a);
        if (fl->kind == K_BOOL)
            v = "1";
        else if (!v && i + 1 < argc)
            v = argv[++i];
        if (!v)
            return bad(prog, "missing a value after", a);
        if (!set_value(o, fl, v))
            return bad_value(prog, fl, v);
        o->vocab_set |= fl->offset == OPT(cfg.V);
    }
    if (o->data && strcmp(o->data, "task") == 0)
        o->data = NULL;
    return check(o, prog);
}
