/*
 * dt_pipe.h — the public interface of dtrain's pipeline layer.
 *
 * Pipeline parallelism cuts MiniGPT into p stages (contiguous block ranges,
 * model/'s dt_model_create_stage), one per rank of a pipeline group, and
 * streams m micro-batches through them: stage s runs forward on micro-batch
 * i while stage s+1 runs it on micro-batch i-1. The group is any dt_comm:
 * stage s is its rank s.
 *
 * Three pieces, each usable alone:
 *
 *   partition   which blocks each stage owns (by parameter count, or
 *               uniformly by blocks);
 *   schedule    what each stage does, in order, as DATA: a list of actions
 *               (forward F, backward B, weight-gradient W of a micro-batch;
 *               send/recv of activations or their gradients; the end of
 *               the step), one list per stage, as PyTorch's pipelining IR.
 *               GPipe, 1F1B and zero-bubble ZB-H1 are three functions that
 *               write such lists (schedule_*.c); tests check the lists
 *               alone, and a simulator (dt_pipe_simulate) runs them with
 *               unit costs to find deadlocks, bubbles and peak memory;
 *   executor    runs any list on real ranks (dt_pipe_run).
 *
 * Costs, for p stages, m >= p micro-batches, with F and B the times of a
 * forward and a whole backward, and Bi + W = B its input and weight
 * halves (B = 2F, Bi = W = F is a fair guess for a transformer; the
 * bubble/work column uses it):
 *
 *   schedule  step time (ideal: m(F+B))     bubble/work   live micro-batches
 *   gpipe     (m + p - 1)(F + B)            (p-1)/m       m on every stage
 *   1f1b      (m + p - 1)(F + B)            (p-1)/m       min(p - s, m) on s
 *   zb        m(F + B) + (p-1)(F + Bi - W)  (p-1)/(3m)    min(p, m) on each
 *
 * so ZB-H1's bubble is a third of 1F1B's at 1F1B's peak (stage 0's)
 * memory. As a fraction of the step, a bubble/work of x idles x/(1+x):
 * (p-1)/(m+p-1) for GPipe and 1F1B.
 *
 * Deadlock: a stage's list alternates sends and receives with both
 * neighbours. If a stage first *blocked* on a send while its neighbour
 * blocked on its own send to it, both would wait forever once the
 * messages outgrow the socket buffers. The executor never blocks on a
 * send: consecutive transfers in a list are posted together (async), only
 * the receives among them are waited, and a send is waited only before
 * its buffer is reused and at the end of the step. dt_pipe_simulate
 * models exactly that, with sends that complete only when the receiver
 * has posted (no buffering at all), and the tests run it on every
 * schedule for p = 1..8.
 */
#ifndef DT_PIPE_H
#define DT_PIPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "dt_comm.h"
#include "dt_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- partition ------------------------------------------------------------ */

typedef enum dt_pipe_partition_kind {
    DT_PARTITION_PARAMS = 0, /* balance parameter counts (the default) */
    DT_PARTITION_UNIFORM,    /* L/p blocks each, the remainder to the first */
} dt_pipe_partition_kind;

/*
 * Splits cfg's L blocks over p stages: stage s owns blocks
 * [bounds[s], bounds[s+1]), bounds[0] = 0, bounds[p] = L, the first stage
 * also the embeddings, the last ln_f and the head. By parameter count it
 * minimises the largest stage. Every stage gets at least one block:
 * p > L is DT_EINVAL with a message in err.
 */
dt_status dt_pipe_partition(int *bounds, const dt_config *cfg, int p, dt_pipe_partition_kind kind,
                            char *err, size_t errlen);
bool dt_pipe_partition_parse(const char *name, dt_pipe_partition_kind *out);

/* ---- schedules ------------------------------------------------------------ */

typedef enum dt_pipe_kind {
    DT_PIPE_GPIPE = 0, /* all forwards, then all backwards */
    DT_PIPE_1F1B,      /* warm-up, one forward one backward, cool-down */
    DT_PIPE_ZB,        /* ZB-H1: backward split into B and W, W in bubbles */
    DT_PIPE_NUM_KINDS
} dt_pipe_kind;

const char *dt_pipe_kind_name(dt_pipe_kind k); /* "gpipe", "1f1b", "zb" */
bool dt_pipe_kind_parse(const char *name, dt_pipe_kind *out);

typedef enum dt_pipe_op {
    DT_PIPE_F,         /* forward of micro-batch mb */
    DT_PIPE_B,         /* backward (its input half in a split schedule) */
    DT_PIPE_W,         /* weight half of the backward (split schedules) */
    DT_PIPE_SEND_ACT,  /* activations of mb to stage s+1 */
    DT_PIPE_RECV_ACT,  /* activations of mb from stage s-1 */
    DT_PIPE_SEND_GRAD, /* their gradient to stage s-1 */
    DT_PIPE_RECV_GRAD, /* their gradient from stage s+1 */
    DT_PIPE_STEP,      /* end of the step: sends done, gradients final */
    DT_PIPE_NUM_OPS
} dt_pipe_op;

const char *dt_pipe_op_name(dt_pipe_op op); /* "F", "send_act", ... */

typedef struct dt_pipe_action {
    dt_pipe_op op;
    int mb;        /* micro-batch 0 .. m-1; -1 for STEP */
    int slot;      /* the stage's activation set mb lives in */
    int grad_slot; /* its activation-gradient set (B, W, gradient transfers) */
} dt_pipe_action;

typedef struct dt_pipe_schedule {
    dt_pipe_kind kind;
    int p, m;
    bool split_backward;      /* B computes input gradients, W the rest */
    int *n;                   /* [p] actions of each stage */
    dt_pipe_action **actions; /* [p][n[s]] in execution order */
    int *act_slots;           /* [p] activation sets each stage needs */
    int *grad_slots;          /* [p] activation-gradient sets */
} dt_pipe_schedule;

/* The lists for p >= 1 stages and m >= 1 micro-batches (m < p works: the
 * pipeline is then never full). Slots are assigned lowest-free, from a
 * micro-batch's first action on a stage to its last, so act_slots[s] is
 * the peak of micro-batches alive on stage s. NULL with a message in err
 * on bad arguments or ENOMEM. */
dt_pipe_schedule *dt_pipe_schedule_create(dt_pipe_kind kind, int p, int m, char *err,
                                          size_t errlen);
void dt_pipe_schedule_destroy(dt_pipe_schedule *s);
/* One line per stage: "F0 send_act0 ..."; for docs and failures. */
void dt_pipe_schedule_print(const dt_pipe_schedule *s, FILE *f);

/* ---- simulation ----------------------------------------------------------- */

/* Durations of the compute actions (transfers cost `latency` once both
 * sides have posted). With `stage` set, stage s's actions cost
 * stage[3s + 0..2] = its own f, b, w instead (unequal stages: the last one
 * also runs the head and the loss). */
typedef struct dt_pipe_costs {
    double f, b, w; /* b is the whole backward; split: b_input = b - w */
    double latency;
    const double *stage; /* [p][3]: f, b, w per stage, or NULL */
} dt_pipe_costs;

typedef struct dt_pipe_sim {
    double makespan; /* the step: first action to the last STEP */
    double *busy;    /* [p] compute time of each stage */
    double **start;  /* [p][n[s]] when each action began (its post, */
    double **end;    /* for a transfer) and when it finished */
    char err[512];   /* the deadlock, if any */
} dt_pipe_sim;

/*
 * Runs the lists against each other: compute takes its cost, a receive
 * waits for its send to be posted, a send completes only once its receive
 * is posted (no buffering, the worst case), sends are waited only before
 * their buffer is reused and at STEP — the executor's rules. DT_EPROTO
 * with a message naming every blocked stage and what it waits for if the
 * lists deadlock. Free with dt_pipe_sim_free.
 */
dt_status dt_pipe_simulate(const dt_pipe_schedule *s, const dt_pipe_costs *c, dt_pipe_sim *out);
void dt_pipe_sim_free(const dt_pipe_schedule *s, dt_pipe_sim *sim);
/* The simulated run as text, one row per stage, one column per `unit` of
 * time: each compute action's micro-batch (mod 10), or with letters its
 * kind (F, B, W); '.' is idle. The head comments' pictures come from it. */
void dt_pipe_sim_draw(const dt_pipe_schedule *s, const dt_pipe_sim *sim, double unit, bool letters,
                      FILE *f);

/* ---- executor ------------------------------------------------------------- */

typedef struct dt_pipe dt_pipe;

/*
 * What the executor drives: one stage of a model, whatever holds it. A
 * plain stage (dt_model_create_stage; dt_pipe_stage_of_model) and a
 * tensor-parallel share of one (a 3-D run) both fit. The stage owns blocks
 * [l0, l1) of L, moves (B, T, C) activations across its boundaries, and
 * keeps act_slots activation sets and grad_slots gradient sets; select
 * picks the sets the next call works on, as dt_model_select does. forward
 * sets *loss on the last stage (the micro-batch's mean loss); backward
 * adds into the stage's parameter gradients. set_grad_hook may be NULL
 * (the stage then cannot overlap a gradient sync with its backward), and
 * so may backward for a part other than DT_BACKWARD_ALL refuse with a
 * message on error.
 */
typedef struct dt_pipe_stage_ops {
    void (*select)(void *self, int slot, int grad_slot);
    float *(*input)(void *self, int B, int T);    /* (B, T, C): receive here */
    const float *(*output)(const void *self);     /* (B, T, C): send this */
    float *(*output_grad)(void *self);            /* (B, T, C): receive here */
    const float *(*input_grad)(const void *self); /* (B, T, C): send this */
    dt_status (*forward)(void *self, const int *inputs, const int *targets, int B, int T,
                         float *loss);
    dt_status (*backward)(void *self, float dloss, dt_backward_part part);
    void (*set_grad_hook)(void *self, dt_grad_ready_fn fn, void *user);
    const char *(*error)(const void *self);
} dt_pipe_stage_ops;

typedef struct dt_pipe_stage {
    const dt_pipe_stage_ops *ops;
    void *self;
    int l0, l1, L, C;
    int act_slots, grad_slots;
} dt_pipe_stage;

/* A dt_model_create_stage model as a stage (pipeline/stage_model.c). */
dt_pipe_stage dt_pipe_stage_of_model(dt_model *m);

/*
 * One stage's executor: rank s of `group` runs actions[s] of `sched` on
 * `stage` (a dt_model_create_stage model with at least the schedule's
 * act_slots[s] and grad_slots[s] sets). Checks that the group has p ranks
 * and the model's slots suffice. group may be NULL for a one-stage
 * schedule (p = 1: no transfers). Always sets *out (NULL only on ENOMEM);
 * on failure read dt_pipe_error.
 */
dt_status dt_pipe_create(dt_pipe **out, dt_comm *group, dt_model *stage,
                         const dt_pipe_schedule *sched);
/* The same for any stage (copied; its self must outlive the executor). */
dt_status dt_pipe_create_stage(dt_pipe **out, dt_comm *group, const dt_pipe_stage *stage,
                               const dt_pipe_schedule *sched);
void dt_pipe_destroy(dt_pipe *p);
const char *dt_pipe_error(const dt_pipe *p);

/*
 * One step's forwards and backwards over the schedule's m micro-batches of
 * (B, T): the first stage reads inputs[mb] (B, T) token ids, the last
 * targets[mb]; the others pass NULL. Each micro-batch's loss is scaled by
 * 1/m, so the stage's gradients (added into its model's, not zeroed here)
 * are those of the mean loss over the m micro-batches, exactly as
 * `--grad-accum m` in one process. On the last stage *loss is that mean
 * (summed in micro-batch order, as the trainer does); elsewhere 0. Returns
 * at STEP: gradients final, every send done; the caller syncs and steps.
 */
dt_status dt_pipe_run(dt_pipe *p, const int *const *inputs, const int *const *targets, int B, int T,
                      float *loss);

/*
 * Installs backward's progress hook (model/'s dt_grad_ready_fn; NULL
 * clears it) for the one action of each step after which the stage's
 * parameter gradients are final: its last B (its last W in a split
 * schedule). DDP over the stage's data-parallel group passes the hook of
 * dt_ddp_arm, so its buckets go out during that backward.
 */
void dt_pipe_set_grad_hook(dt_pipe *p, dt_grad_ready_fn fn, void *user);

/*
 * Sends the activations and their gradients between stages rounded to
 * bf16 (half the bytes; pipeline/act_comm.c), widened back to fp32 on
 * arrival. Set before the first run; the stages of a pipeline must agree
 * (a receive of another size fails with DT_EPROTO naming both sides).
 */
void dt_pipe_set_act_comm_bf16(dt_pipe *p);

/* Seconds this stage spent in each kind of action in the last run, and
 * the run's wall time: idle = wall - compute is the stage's bubble (plus
 * transfer time). */
typedef struct dt_pipe_stats {
    double wall_s;
    double op_s[DT_PIPE_NUM_OPS]; /* transfers: time blocked waiting */
} dt_pipe_stats;
void dt_pipe_last_stats(const dt_pipe *p, dt_pipe_stats *out);
/* The last run's timeline, one entry per action of this stage's list
 * (sched->actions[stage]), seconds on CLOCK_MONOTONIC: compute and STEP
 * from start to end; a transfer from its post to its completion as this
 * rank saw it (a receive's wait returning; a send's wait, before its slot
 * was reused or at STEP). 0 for what did not run (a failed step). Valid
 * until the next run; for traces and the measured Gantt chart. */
void dt_pipe_last_timeline(const dt_pipe *p, const double **start, const double **end);

#ifdef __cplusplus
}
#endif
#endif /* DT_PIPE_H */
