/*
 * cli.h — minigpt's options: one table of flags (cli.c) that both parses
 * the command line and prints the usage, so the two cannot disagree, and
 * the presets that fill several flags at once.
 */
#ifndef DT_TRAIN_CLI_H
#define DT_TRAIN_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dt_model.h"

typedef enum mg_parallel { MG_DDP = 0, MG_ZERO1, MG_ZERO2, MG_ZERO3 } mg_parallel;

/* "ddp", "zero1", "zero2", "zero3": the flag's spelling of a mode. */
const char *mg_parallel_name(mg_parallel p);

typedef struct mg_options {
    dt_config cfg;  /* -V -C -H -L -T */
    bool vocab_set; /* -V given: token shards do not resize it */
    int batch;      /* sequences per rank per micro-step */
    int steps;
    int grad_accum; /* micro-steps per optimizer step */
    float lr;
    uint64_t seed;
    const char *data; /* NULL: embedded task; "random"; an llm.c
                              token shard or a glob of them; else text */
    mg_parallel parallel;
    double bucket_mb;         /* DDP bucket cap; 0 = 25 MB */
    int log_every;            /* print a step line every N steps */
    int eval_every;           /* task accuracy every N steps; 0 = end only */
    int eval_prompts;         /* held-out prompts the accuracy grades; 0 = none */
    int sample;               /* tokens to generate at the end */
    const char *metrics;      /* JSONL file, or NULL */
    const char *preset;       /* the preset applied, or NULL */
    int expect_ranks;         /* the preset's world size; 0 = any */
    bool loss_table;          /* print every step's loss at the end */
    bool check_replicas;      /* compare parameter hashes after every step */
    int threads;              /* compute threads per rank; 0 until chosen */
    const char *device;       /* "cpu"; "cuda": GPU LOCAL_RANK of this node;
                              "cuda-host": the CUDA kernels on the host */
    const char *ckpt_dir;     /* checkpoint root, or NULL */
    int ckpt_every;           /* save every K steps; 0 = never */
    int keep;                 /* keep the K newest checkpoints; 0 = all */
    const char *resume;       /* "auto", a root or a step directory, or NULL */
    bool verify_resume;       /* reload the first checkpoint and compare */
    int die_at_step;          /* fault injection: the last rank SIGKILLs itself */
    int pp;                   /* pipeline stages; 0 = no pipeline */
    int dp;                   /* with --pp: replicas; 0 = world / pp */
    const char *trace;        /* Chrome trace-event JSON to write, or NULL */
    bool gantt;               /* --pp: print the last step as a Gantt chart */
    bool bubble_table;        /* --pp: measure every schedule's bubble */
    int microbatches;         /* per pipelined step; 0 = --grad-accum */
    const char *schedule;     /* gpipe, 1f1b or zb */
    const char *pp_partition; /* params or uniform */
    bool recompute;           /* blocks keep only their input; backward recomputes */
    int tp;                   /* tensor-parallel ranks per replica; 0 = none */
    const char *wire;         /* "dtrain" or "gloo": the communicator's wire; NULL = DT_WIRE's */
    const char *grad_comm;    /* "fp32" or "bf16": the gradients' type on the wire */
    const char *act_comm;     /* "fp32" or "bf16": --pp's activations on the wire */
    const char *precision;    /* "fp32" or "bf16": the model's compute (model/precision.c) */
    bool deterministic;       /* one summation order: every mode ends with the same bits */
} mg_options;

/* 0 if --act-comm fits the other flags, else 2 after printing why
 * (cli_act_comm.c). */
int mg_check_act_comm(const mg_options *o, const char *prog);

/* Defaults: the seed model on the embedded reverse task, DDP. */
void mg_options_default(mg_options *o);
/* Parses argv (a --preset anywhere applies first, then the other flags
 * override it). Returns 0 on success, 1 after printing the usage for
 * --help, 2 after printing one line naming what was wrong and a pointer
 * to --help (dt_flags.h). */
int mg_options_parse(mg_options *o, int argc, char **argv);
/* The usage text, generated from the flag table. */
void mg_usage(FILE *f, const char *prog);

/* --preset NAME (cli_presets.c): fills o as the named run; a usage error
 * naming an unknown one. mg_print_presets lists them for the usage. */
int mg_apply_preset(mg_options *o, const char *prog, const char *name);
void mg_print_presets(FILE *f);

#endif /* DT_TRAIN_CLI_H */
