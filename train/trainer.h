/*
 * trainer.h — the pieces of the minigpt program, shared between its files:
 * the run's state (trainer.c steps it), the metrics file (metrics.c) and
 * the printed reports (report.c). Internal to train/.
 */
#ifndef DT_TRAIN_TRAINER_H
#define DT_TRAIN_TRAINER_H

#include <stdio.h>

#include "cli.h"
#include "dt_ckpt_train.h"
#include "dt_comm.h"
#include "dt_model.h"
#include "dt_optim.h"
#include "dt_pipe.h"

/* One rank's training run. */
typedef struct mg_run {
    mg_options o;
    int rank, world;
    dt_comm *comm;          /* NULL when running alone */
    dt_model *m;
    dt_dataset *data;
    bool is_task;           /* the embedded task: has an accuracy */
    dt_ddp *ddp;            /* --parallel ddp */
    dt_zero1 *zero1;        /* --parallel zero1 */
    dt_adamw_hparams h;
    int *x, *y;             /* (batch, T) host tokens of one micro-batch */
    float *losses;          /* [steps] mean loss over the global batch */
    dt_ckpt *ck;            /* --ckpt-dir (or the seed's temporary root) */
    char ckpt_tmp[128];     /* a temporary root made for the run, or "" */
    int start_step;         /* first step to run: 0, or the resumed step */
    uint64_t row0;          /* data position at start_step */
    bool verified;          /* RESUME VERIFIED already printed */
    dt_pipe_schedule *sched; /* --pp: the schedule, this rank's stage runs */
    dt_pipe *pipe;           /* --pp: its executor; r->m is the stage */
    double pipe_wall_s, pipe_compute_s; /* summed over steps, for bubbles */
    char err[768];
} mg_run;

/* What one optimizer step took. */
typedef struct mg_step {
    float loss;             /* mean over the global batch (all ranks) */
    double ms;              /* wall time of the step on this rank */
    double tokens_per_s;    /* global tokens / ms */
    dt_comm_stats comm;
} mg_step;

/* trainer.c */
dt_status mg_run_open(mg_run *r);      /* data, model, optimizer */
void mg_run_close(mg_run *r);
/* Optimizer step `step` (0-based): micro-steps, gradient sync, AdamW. */
dt_status mg_train_step(mg_run *r, int step, mg_step *out);
/* Mean loss over the validation split's first batches (this rank only). */
float mg_val_loss(mg_run *r);
/* Writes a sample of n tokens after a prompt from the validation split. */
void mg_sample(mg_run *r, FILE *f, int n);

/* pipelined.c: --pp (every rank calls each) */
int mg_microbatches(const mg_options *o);
dt_status mg_pipe_open(mg_run *r);     /* stage model, schedule, executor */
void mg_pipe_close(mg_run *r);
dt_status mg_pipe_step(mg_run *r, int step, mg_step *out);
/* Each stage's blocks, memory sets and bubble, gathered to rank 0. */
dt_status mg_report_pipeline(FILE *f, const mg_run *r);

/* checkpointing.c: collective (every rank calls) */
dt_status mg_ckpt_open(mg_run *r);
void mg_ckpt_close(mg_run *r);
/* --resume: loads the model and optimizer, sets start_step and row0. */
dt_status mg_ckpt_resume(mg_run *r);
/* After `done` steps: saves on the --ckpt-every cadence, verifies once. */
dt_status mg_ckpt_after_step(mg_run *r, int done);

/* metrics.c: JSONL, one object per line, rank 0 only */
typedef struct mg_metrics mg_metrics;
mg_metrics *mg_metrics_open(const char *path, const mg_run *r);
void mg_metrics_step(mg_metrics *mx, int step, const mg_step *s);
void mg_metrics_eval(mg_metrics *mx, int step, float val_loss, double acc);
void mg_metrics_summary(mg_metrics *mx, const mg_run *r, double secs,
                        double mean_hidden, double acc);
void mg_metrics_close(mg_metrics *mx);

/* report.c */
void mg_report_header(FILE *f, const mg_run *r);
void mg_report_step(FILE *f, int step, const mg_step *s);
/* Whether this rank draws a progress bar: rank 0 only, and only when the
 * output really ends on a terminal (see report.c). */
bool mg_progress_wanted(int rank);
void mg_progress(FILE *f, int done, int total, float loss);
void mg_progress_clear(FILE *f);
void mg_report_loss_table(FILE *f, const mg_run *r);
void mg_report_memory_model(FILE *f, const mg_run *r);
/* Every rank's memory, gathered to rank 0 (collective: all ranks call). */
dt_status mg_report_memory(FILE *f, const mg_run *r);

#endif /* DT_TRAIN_TRAINER_H */
