/*
 * cli_presets.c — minigpt's named runs: --preset seed, 865k, pipeline, 3d,
 * gpt2-small.
 *
 * A preset is a function that fills several fields of mg_options at once,
 * the curriculum's lessons and the sizes the benchmarks name, so that one
 * word reproduces a run a document describes. cli.c applies it before any
 * other flag, wherever --preset appears on the line, so the flags given
 * with it refine it. Cost: nothing at run time; a table of five rows.
 */
#include <string.h>

#include "cli.h"
#include "dt_flags.h"

typedef struct preset {
    const char *name, *help;
    void (*apply)(mg_options *o);
} preset;

/* The seed curriculum's end-to-end run: 4 ranks x 4 sequences, ZeRO-1. */
static void preset_seed(mg_options *o)
{
    o->cfg = dt_config_seed();
    o->expect_ranks = 4;
    o->steps = 20;
    o->batch = 4;
    o->lr = 5e-3f;
    o->parallel = MG_ZERO1;
    o->data = "random";
    o->log_every = 1;
    o->eval_every = 0;
    o->loss_table = true;
    o->sample = 16;
    o->ckpt_every = 10;      /* the curriculum's step-10 checkpoint ... */
    o->verify_resume = true; /* ... reloaded: RESUME VERIFIED */
}

/* The 865k-parameter config of the performance targets, DDP, 1 MB
 * buckets so that backward has several to overlap. */
static void preset_865k(mg_options *o)
{
    o->cfg = (dt_config){.V = 256, .T = 64, .L = 4, .H = 4, .C = 128};
    o->batch = 8;
    o->steps = 30;
    o->lr = 1e-3f;
    o->data = "random";
    o->parallel = MG_DDP;
    o->bucket_mb = 1;
    o->log_every = 5;
    o->eval_every = 0;
    o->sample = 0;
}

/* The curriculum's pipeline lesson on real ranks: 4 stages of one block,
 * 8 micro-batches of 1F1B, the last step's Gantt chart and the bubble
 * table of every schedule for m = 1..64. */
static void preset_pipeline(mg_options *o)
{
    o->cfg = (dt_config){.V = 64, .T = 32, .L = 4, .H = 4, .C = 64};
    o->expect_ranks = 4;
    o->pp = 4;
    o->microbatches = 8;
    o->schedule = "1f1b";
    o->batch = 4;
    o->steps = 6;
    o->lr = 3e-3f;
    o->data = "random";
    o->log_every = 1;
    o->eval_every = 0;
    o->sample = 0;
    o->gantt = true;
    o->bubble_table = true;
}

/* The curriculum's 3-D lesson: 8 ranks = 2 replicas x 2 tp ranks x 2
 * stages of the embedded task's model, 1F1B over 8 micro-batches, until
 * the task is learnt (100% exact match at step 300). */
static void preset_3d(mg_options *o)
{
    o->expect_ranks = 8;
    o->dp = 2;
    o->tp = 2;
    o->pp = 2;
    o->microbatches = 8;
    o->schedule = "1f1b";
    o->steps = 300;
    o->log_every = 50;
    o->eval_every = 100;
    o->sample = 0;
}

/* GPT-2 small's shapes (V 50257, C 768, H 12, L 12: 124M parameters in
 * GPT-2, whose head is tied to wte; MiniGPT's untied head makes it
 * 162M) with T and B cut for a CPU: a short context, one sequence per
 * rank on 2 ranks, three steps on random tokens of GPT-2's vocabulary,
 * and GPT-2 small's lr. */
static void preset_gpt2_small(mg_options *o)
{
    o->cfg = (dt_config){.V = 50257, .T = 64, .L = 12, .H = 12, .C = 768};
    o->expect_ranks = 2;
    o->batch = 1;
    o->steps = 3;
    o->lr = 6e-4f;
    o->data = "random";
    o->log_every = 1;
    o->eval_every = 0;
    o->sample = 16;
}

static const preset presets[] = {
    {"seed",
     "4 ranks, 20 steps, batch 4, lr 5e-3, ZeRO-1, random tokens, "
     "checkpoint at step 10 verified (RESUME VERIFIED)",
     preset_seed},
    {"865k", "V=256 C=128 H=4 L=4 T=64, batch 8, DDP with 1 MB buckets", preset_865k},
    {"pipeline",
     "the pipeline lesson: 4 ranks = 4 stages, 8 micro-batches "
     "of 1F1B, a measured Gantt chart and bubble table",
     preset_pipeline},
    {"3d",
     "the 3-D lesson: 8 ranks = 2 replicas x 2 tp ranks x 2 stages, 1F1B over 8 "
     "micro-batches, 300 steps of the embedded task",
     preset_3d},
    {"gpt2-small",
     "GPT-2 small's shapes: V=50257 C=768 H=12 L=12, with T=64 and batch 1 for a CPU "
     "(162M parameters, the head untied), 2 ranks, 3 steps on random tokens, lr 6e-4",
     preset_gpt2_small},
};
#define NPRESETS (sizeof presets / sizeof presets[0])

void mg_print_presets(FILE *f)
{
    for (size_t i = 0; i < NPRESETS; i++)
        fprintf(f, "  %-10s %s\n", presets[i].name, presets[i].help);
}

int mg_apply_preset(mg_options *o, const char *prog, const char *name)
{
    for (size_t i = 0; i < NPRESETS; i++)
        if (strcmp(name, presets[i].name) == 0) {
            presets[i].apply(o);
            o->preset = presets[i].name;
            return 0;
        }
    return dt_flag_error(prog, "unknown preset '%s'", name);
}
