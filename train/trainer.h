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
#include "dt_device.h"
#include "dt_model.h"
#include "dt_optim.h"
#include "dt_pipe.h"
#include "dt_tp.h"

typedef struct mg_trace mg_trace;
typedef struct mg_tp_zero1 mg_tp_zero1;

/* One rank's training run. */
typedef struct mg_run {
    mg_options o;
    int rank, world;
    dt_comm *comm;  /* NULL when running alone */
    dt_device *dev; /* --device cuda with ranks: stages comm's ops */
    dt_model *m;
    dt_dataset *data;
    bool is_task;    /* the embedded task: has an accuracy */
    dt_ddp *ddp;     /* --parallel ddp */
    dt_zero1 *zero1; /* --parallel zero1 or zero2 (dt_zero1_stage) */
    dt_adamw_hparams h;
    int *x, *y;                         /* (batch, T) host tokens of one micro-batch */
    float *losses;                      /* [steps] mean loss over the global batch */
    dt_ckpt *ck;                        /* --ckpt-dir (or the seed's temporary root) */
    char ckpt_tmp[128];                 /* a temporary root made for the run, or "" */
    int start_step;                     /* first step to run: 0, or the resumed step */
    uint64_t row0;                      /* data position at start_step */
    bool verified;                      /* RESUME VERIFIED already printed */
    dt_pipe_schedule *sched;            /* --pp: the schedule, this rank's stage runs */
    dt_pipe *pipe;                      /* --pp: its executor; r->m is the stage */
    double pipe_wall_s, pipe_compute_s; /* summed over steps, for bubbles */
    double pipe_fbw_s[3];               /* F, B, W time summed over those steps */
    int pipe_steps;                     /* how many steps those sums hold */
    int stage, replica, dp;             /* --pp: world rank = stage · dp + replica */
    dt_comm *pipe_comm;                 /* --pp: this replica's stages (NULL: P = 1) */
    dt_comm *dp_comm;                   /* --pp: this stage's replicas (NULL: D = 1) */
    size_t *ckpt_slices;                /* --pp, --tp: [world + 1] who saves what */
    int *ckpt_order;                    /* --tp (3-D too): [world] the slice each rank saves */
    mg_trace *trace;                    /* --trace: this rank's slices, or NULL */
    dt_tp_model *tp;                    /* --tp: this rank's share; r->m the assembled copy */
    dt_comm *tp_comm;                   /* --tp: this replica's tp group */
    dt_comm *tp_dp_comm;                /* --tp: the same share in every replica (NULL: D = 1) */
    float *tp_shares;                   /* --tp: (T, share) all-gather buffer */
    struct mg_3d *three_d;              /* --tp with --pp: stage share, executor (three_d.c) */
    mg_tp_zero1 *tpz;                   /* --tp --parallel zero1: this rank's piece */
    uint64_t last_bytes_sent;           /* the last step's mg_step.bytes_sent */
    uint64_t traffic_sent_first;        /* sent when the run's first step began */
    uint64_t traffic_sent;              /* every rank's, from then to the end of the last step */
    int traffic_steps;                  /* the steps in between */
    bool gloo_wire;                     /* torch's gloo wire: its own messages */
    double peak_gflops;                 /* rank 0's sgemm rate at start; 0: none (cuda) */
    uint64_t *bytes_sent_by_rank;       /* [world], rank 0 after the run: each rank's */
    const char *phase;                  /* what the run is doing, for the failure line */
    char err[768];
} mg_run;

/* failure_line.c: the one line a failed rank prints ("rank 1: final
 * evaluation: <op, peer, cause>"): r->err, else built from r->phase and
 * the communicators' errors; never a bare status name. */
void mg_failure_line(const mg_run *r, dt_status st, char *out, size_t n);

/* What one optimizer step took. */
typedef struct mg_step {
    float loss;          /* mean over the global batch (all ranks) */
    double ms;           /* wall time of the step on this rank */
    double tokens_per_s; /* global tokens / ms */
    dt_comm_stats comm;
    /* payload bytes this rank's communicators (world and groups) sent and
     * received during the step, as the transport counts them (dt_comm_traffic) */
    uint64_t bytes_sent, bytes_recv;
} mg_step;

/* tensor_parallel.c: --tp (every rank calls each; world rank = replica · T + tp rank) */
dt_status mg_tp_open(mg_run *r); /* groups, share, the assembled copy */
void mg_tp_close(mg_run *r);
dt_status mg_tp_step(mg_run *r, int step, mg_step *out);
/* The tp group's shares into the assembled copy r->m (collective). */
dt_status mg_tp_assemble(mg_run *r);
/* Prints, for rank 0, m's precision line in bf16 and its activation
 * bytes (m: a share or a stage's core). */
void mg_tp_memory_line(const char *where, size_t bytes, const dt_tp_model *m);

/* tp_checkpoint.c: --tp's checkpoint state (the share, its AdamW moments,
 * the run's layout of shares x replicas) */
dt_status mg_tp_ckpt_state(mg_run *r, dt_ckpt_state *s);
void mg_tp_ckpt_free(mg_run *r);
/* AdamW's m and v of a share, allocated zeroed if the first step has not
 * made them yet (a state described before it). */
dt_status mg_tp_moments(dt_tp_model *m);

/* tp_zero1.c: --tp --dp D [--pp P] --parallel zero1 (ZeRO-1 on the dp
 * axis) over m's parameters, which start at share_lo in the tp rank's
 * share (0 for the share; lo for a stage's range [lo, hi) of it) */
dt_status mg_tp_zero1_open(mg_run *r, dt_tp_model *m, size_t share_lo);
void mg_tp_zero1_close(mg_run *r);
/* The dp group's reduce-scatter, AdamW on the piece, all-gather; *loss
 * averaged over the replicas unless loss is NULL. */
dt_status mg_tp_zero1_step(mg_run *r, int step, float *loss);
/* The optimizer part of s: mode, range and arrays of this rank's piece. */
void mg_tp_zero1_state(mg_run *r, dt_ckpt_state *s);

/* three_d.c: --tp with --pp (world rank = stage · D · T + replica · T + tp
 * rank; r->tp_comm, r->tp_dp_comm and r->pipe_comm are its groups) */
dt_status mg_3d_open(mg_run *r);
void mg_3d_close(mg_run *r);
dt_status mg_3d_step(mg_run *r, int step, mg_step *out);
/* Collective over the world: the whole model into r->m. */
dt_status mg_3d_assemble(mg_run *r);
/* This rank's share of its stage. */
struct dt_tp_stage *mg_3d_stage(mg_run *r);

/* three_d_checkpoint.c: a 3-D run's checkpoints (its layout of shares x
 * stages x replicas from the stages' block bounds, set up at open; the
 * state of this rank's range, st being its share of its stage: mg_3d_stage).
 * It calls nothing of three_d.c, which calls it. */
dt_status mg_3d_ckpt_layout(mg_run *r, const int *blocks);
dt_status mg_3d_ckpt_state(mg_run *r, struct dt_tp_stage *st, dt_ckpt_state *s);

/* trainer.c */
/* This rank's GPU on its node: LOCAL_RANK (or Open MPI's, Slurm's), 0. */
int mg_local_rank(void);
int mg_local_world_size(void);
/* Collective: refuses (on every rank) ranks that run different
 * --parallel modes, naming them. */
dt_status mg_check_modes(mg_run *r);
dt_status mg_run_open(mg_run *r); /* data, model, optimizer */
void mg_run_close(mg_run *r);
/* Optimizer step `step` (0-based): micro-steps, gradient sync, AdamW;
 * counts the bytes the step moved into out. */
dt_status mg_train_step(mg_run *r, int step, mg_step *out);
/* Collective over the world: each rank's last_bytes_sent into rank 0's
 * bytes_sent_by_rank. */
dt_status mg_gather_traffic(mg_run *r);
/* After the last step: waits (a barrier) for every op the steps queued, a
 * ZeRO gather in flight, then notes the run's bytes sent (traffic.c). */
dt_status mg_close_traffic(mg_run *r);
/* Waits for ZeRO-1's parameter all-gather left in flight by the last step:
 * call before reading the parameters outside a training forward. */
dt_status mg_settle_params(mg_run *r);
/* ZeRO-3: hold gathers the whole model on every rank (collective), for
 * what reads it outside training; release frees it. Nothing otherwise. */
dt_status mg_params_hold(mg_run *r, bool hold);
/* Whether evaluation and sampling are collective: ZeRO-3 (not on a
 * pipeline), whose forwards gather each unit from every rank, so every
 * rank runs the same forwards in step (rank 0 prints). */
bool mg_eval_collective(const mg_run *r);
/* Whether evaluation's forwards gather the units, so that every rank runs
 * them in step: ZeRO-3, a pipeline stage's too (mg_eval_params). */
bool mg_eval_units(const mg_run *r);
/* Makes the parameters readable by evaluation's and sampling's forwards
 * (on) and goes back to training (off): ZeRO-3 arms its units
 * (dt_zero1_arm_inference), no whole model; otherwise mg_params_hold. */
dt_status mg_eval_params(mg_run *r, bool on);
/* evaluation.c: what the held-out evaluation found. */
typedef struct mg_eval {
    float val_loss;  /* mean over the validation split's first batches; -1: none */
    double accuracy; /* the task's exact-match accuracy; -1: none */
    size_t prompts;  /* the held-out prompts it graded */
} mg_eval;
/* Collective over the world, after mg_eval_params(r, true): each rank
 * evaluates its share, one all-reduce sums them; the same result on every
 * rank, equal to one rank's evaluation alone. Under ZeRO-3 every forward
 * is itself collective, so every rank runs the whole evaluation in step
 * instead (mg_eval_collective). Under --pp each forward streams through
 * the pipeline's stages and its replicas split the work. */
dt_status mg_evaluate(mg_run *r, mg_eval *out);
/* Writes a sample of n tokens after a prompt from the validation split
 * (f NULL: runs its forwards only, for a ZeRO-3 rank that does not print). */
void mg_sample(mg_run *r, FILE *f, int n);

/* pipelined.c: --pp (every rank calls each) */
/* The default micro-batches of a pipeline, per stage (pipelined.c). */
#define MG_MICROBATCHES_PER_STAGE 4
int mg_microbatches(const mg_options *o);
/* The step's M micro-batches into r->x, r->y: replica r's rows of the
 * global batch, as DDP rank r's micro-steps (pipelined.c; --pp and 3-D
 * runs). The dataset's status. */
dt_status mg_pipe_load_microbatches(mg_run *r, int step, int M);
dt_status mg_pipe_open(mg_run *r); /* stage model, schedule, executor */
void mg_pipe_close(mg_run *r);
dt_status mg_pipe_step(mg_run *r, int step, mg_step *out);
/* Every stage's replicas hold bitwise identical parameters (one verdict
 * for the world; prints it on rank 0 unless quiet). units: ZeRO-3 hashes
 * through the stage's units (mg_eval_units), no stage held whole. */
dt_status mg_pipe_check_replicas(mg_run *r, int step, bool quiet, bool units);
/* The idle share of a step with unit costs F = 1, B = 2 (ZB-H1: input
 * half 1, W 1; meaningful for m >= p only). */
double mg_closed_form_bubble(dt_pipe_kind k, int p, int m);
/* lesson.c (--pp, collective over the pipeline group): the last step as
 * a text Gantt chart from the executor's clocks; the measured bubble of
 * every schedule for m = 1 .. 64 beside the closed form, and each
 * schedule's peak activation memory per stage. Rank 0 prints. */
dt_status mg_lesson_gantt(FILE *f, mg_run *r);
dt_status mg_lesson_bubbles(FILE *f, mg_run *r);
/* Each stage's blocks, memory sets and bubble, gathered to rank 0. */
dt_status mg_report_pipeline(FILE *f, const mg_run *r);

/* trace.c: --trace. Slice kinds beyond the pipeline's dt_pipe_op. */
enum mg_event_kind {
    MG_EV_FORWARD = DT_PIPE_NUM_OPS, /* a data-parallel micro-step's */
    MG_EV_BACKWARD,
    MG_EV_ALLREDUCE,     /* a DDP bucket */
    MG_EV_OPTIMIZER,     /* AdamW (ZeRO-1: with its collectives) */
    MG_EV_TP_ALLREDUCE,  /* an f or g of tensor parallelism (arg: the layer, or -1) */
    MG_EV_TP_GATHER,     /* --tp: the all-gather of the shares after a step */
    MG_EV_TP_DP,         /* --tp --dp: the all-reduce of the share's gradients */
    MG_EV_TP_DP_SCATTER, /* --tp --dp --parallel zero1: their reduce-scatter */
    MG_EV_TP_DP_GATHER,  /* ... and the all-gather of the updated pieces */
    MG_EV_REDUCE,        /* a ZeRO gradient piece's reduce to its owner */
};
mg_trace *mg_trace_open(void);
void mg_trace_close(mg_trace *t);
/* The step the next slices belong to. Every mg_trace_* ignores t NULL. */
void mg_trace_set_step(mg_trace *t, int step);
/* One slice [t0, t1] in seconds on CLOCK_MONOTONIC; arg -1 for none. */
void mg_trace_add(mg_trace *t, int kind, int arg, double t0, double t1);
/* A collective's slice with its buffer's bytes and the payload this rank
 * sent for it; site: a dt_tp_site for MG_EV_TP_ALLREDUCE, else -1. */
void mg_trace_add_comm(mg_trace *t, int kind, int arg, int site, uint64_t bytes, uint64_t sent,
                       double t0, double t1);
/* --tp: the tensor layer's all-reduce callback (dt_tp_trace_fn), user = the mg_trace. */
void mg_trace_tp(void *user, dt_tp_site site, int layer, size_t bytes, uint64_t sent, double t0,
                 double t1);
/* The executor's last step, every action of this stage's list. */
void mg_trace_pipe(mg_trace *t, const dt_pipe *p, const dt_pipe_schedule *s, int stage);
/* The buckets of DDP's last synced backward. */
void mg_trace_ddp(mg_trace *t, const dt_ddp *d);
/* The gradient pieces ZeRO reduced to their owners in its last step
 * (ZeRO-1, and -2, -3 on a pipeline stage: pieces of a whole gradient). */
void mg_trace_zero1(mg_trace *t, const dt_zero1 *z);
/* Collective: every rank's slices to rank 0, which writes the JSON. */
dt_status mg_trace_write(mg_trace *t, mg_run *r, const char *path);

/* checkpointing.c: collective (every rank calls) */
dt_status mg_ckpt_open(mg_run *r);
void mg_ckpt_close(mg_run *r);
/* --resume: loads the model and optimizer, sets start_step and row0. */
dt_status mg_ckpt_resume(mg_run *r);
/* After `done` steps: saves on the --ckpt-every cadence, verifies once. */
dt_status mg_ckpt_after_step(mg_run *r, int done);

/* ckpt_staging.c: the checkpoint layer reads host memory; on a device
 * backend the state is mirrored (host arrays malloc'd, same lengths). */
bool mg_state_on_device(const mg_run *r);
/* host = dev with host copies of its arrays (filled when copy_out). */
dt_status mg_state_mirror(mg_run *r, const dt_ckpt_state *dev, dt_ckpt_state *host, bool copy_out);
/* Copies the host mirror's arrays into the device state's. */
void mg_state_copy_in(mg_run *r, const dt_ckpt_state *dev, const dt_ckpt_state *host);
void mg_state_mirror_free(mg_run *r, dt_ckpt_state *host);

/* metrics.c: JSONL, one object per line, rank 0 only */
typedef struct mg_metrics mg_metrics;
mg_metrics *mg_metrics_open(const char *path, const mg_run *r);
void mg_metrics_step(mg_metrics *mx, int step, const mg_step *s);
void mg_metrics_eval(mg_metrics *mx, int step, float val_loss, double acc);
void mg_metrics_summary(mg_metrics *mx, const mg_run *r, double secs, double mean_hidden,
                        double acc);
void mg_metrics_close(mg_metrics *mx);

/* report.c */
void mg_report_header(FILE *f, const mg_run *r);
void mg_report_step(FILE *f, int step, const mg_step *s, const mg_run *r);
/* Whether this rank draws a progress bar: rank 0 only, and only when the
 * output really ends on a terminal (see report.c). */
bool mg_progress_wanted(int rank);
void mg_progress(FILE *f, int done, int total, float loss);
void mg_progress_clear(FILE *f);
void mg_report_loss_table(FILE *f, const mg_run *r);
void mg_report_memory_model(FILE *f, const mg_run *r);
/* traffic.c: rank 0's bytes sent per step beside the closed form (DDP, ZeRO). */
void mg_report_traffic(FILE *f, const mg_run *r);
/* Every rank's memory, gathered to rank 0 (collective: all ranks call). */
dt_status mg_report_memory(FILE *f, const mg_run *r);

#endif /* DT_TRAIN_TRAINER_H */
