/*
 * evaluation.c — the held-out evaluation, dealt out to every rank.
 *
 * Two numbers: the validation loss, the mean of MG_VAL_BATCHES forward
 * passes over --batch validation rows each, and for the embedded task the
 * exact-match accuracy on the first --eval-prompts held-out prompts, each
 * answer decoded greedily (a KV cache makes a token one row of work).
 *
 * Under DDP and ZeRO-1/2 every rank holds the whole model when this
 * runs (the replicas are bitwise identical; the 3-D grid assembles it
 * first; --tp runs on its shares, below), so the
 * work is split instead of repeated: rank p of N takes the loss
 * batches k = p, p + N, ... and the prompts i = p, p + N, ... (strided,
 * so long and short prompts spread evenly), and one all-reduce of
 * 2 · MG_VAL_BATCHES + 1 doubles brings the pieces together: each batch's
 * loss in its own slot (the others add 0, exactly), whether it ran, and
 * the count of exact answers. Every rank then sums the batch losses in
 * batch order, as one rank alone would: the same loss bit for bit and the
 * same accuracy as a single-rank evaluation, at 1/N of its time. No rank
 * waits alone in a collective while another evaluates.
 *
 * ZeRO-3 (not on a pipeline) holds no whole model: its forwards gather
 * each unit from every rank as they reach it (mg_eval_params), so each
 * forward is a collective and every rank must run as many as the others.
 * There the split runs in lockstep: each rank takes the same shares, and
 * a rank whose share has run out runs a forward of one token that counts
 * nothing, so that it joins every gather. The prompts are graded in
 * batches (model/task.c: teacher forcing, a batch of prompts per
 * forward), so the whole evaluation costs ceil(4 / N) + ceil(batches / N)
 * forwards per rank, each one gather of the model (4Ψ bytes received):
 * the 29M model on 4 ranks, 200 prompts in batches of 2 (B 1, T 32),
 * takes 26 gathers where every rank decoding every prompt token by token
 * took about 800 (4 + 200 prompts x ~4 answer tokens).
 *
 * A rank that cannot allocate its grading scratch (dt_task_scratch_bytes)
 * cannot take its share. It used to skip it silently (a count of 0) and
 * go on to the all-reduce while, in lockstep (ZeRO-3's gathers, a
 * pipeline's streamed forwards), its peers waited for it in the next
 * collective until the progress limit. Now the scratch is allocated
 * before any prompt is graded and a rank without it fails, naming the
 * bytes; minigpt's failure path aborts the communicator with that line
 * (abort_job), so every peer, in whatever collective it has reached,
 * fails at once with the same text (the ABORT frame, docs/02).
 * (MINIGPT_TEST_EVAL_NOMEM=RANK, a test hook, fails rank RANK's.)
 *
 * A pipeline stage (--pp without --tp) holds a slice of the model, and
 * no rank assembles the whole: each forward streams through the stages
 * as training's do (eval_forward). Stage s receives the (B, T, C)
 * activations of stage s - 1, runs its blocks and sends its output on;
 * the last stage computes the loss and the logits, and only it counts.
 * The work is split over the replicas (replica p of D takes batches
 * p, p + D, ...), every stage of a replica running the same share, and
 * the same all-reduce brings it together (the other stages add 0). Per
 * forward, B·T·C floats cross each stage boundary once; a stage holds
 * its own weights and one batch's activations, where gathering the whole
 * model for the purpose held P times the weights. The stages run one
 * after another, not overlapped: evaluation is a small share of a run.
 * (The 3-D grid still assembles its whole model, in mg_params_hold.)
 *
 * A tensor-parallel share (--tp without --pp) runs its own forward
 * (tp_eval_forward): no rank reads the assembled model. Every forward is
 * a collective of the tp group (its all-reduces), so the ranks of a
 * group run the same share, their replica's (as a pipeline's stages do);
 * the loss is the vocabulary-parallel cross-entropy's, and the grading's
 * greedy tokens come from dt_tp_argmax, two all-reduces of (B, T) floats
 * per forward where gathering the logits would move (B, T, V). Only tp
 * rank 0 of each replica adds its share to the all-reduce (the others
 * hold the same numbers).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer.h"

#define MG_VAL_BATCHES 4
#define MG_EVAL_TAG 0x6e000000u /* a pipeline's evaluation forwards */

static dt_status eval_fail(mg_run *r, dt_status st, const char *what, const char *detail)
{
    snprintf(r->err, sizeof r->err, "rank %d: evaluation: %s: %s", r->rank, what,
             detail && *detail ? detail : dt_status_name(st));
    return st;
}

/* One evaluation forward of inputs (B, T) on this rank's model; *logits
 * (and m->mean_loss, with targets) when m then holds the batch's output.
 * A pipeline stage streams it: it receives the (B, T, C) activations of
 * the stage before, runs its blocks and sends its output on; only the
 * last stage holds logits. */
static dt_status eval_forward(void *user, dt_model *m, const int *inputs, const int *targets, int B,
                              int T, bool *logits)
{
    mg_run *r = user;
    *logits = true;
    if (!r->pipe || !r->pipe_comm)
        return dt_model_forward(m, inputs, targets, B, T);
    int P = dt_comm_size(r->pipe_comm), s = dt_comm_rank(r->pipe_comm);
    size_t n = (size_t)B * (size_t)T * (size_t)r->o.cfg.C;
    dt_status st = dt_model_select(m, 0, 0);
    if (st == DT_OK && s > 0)
        st = dt_recv(r->pipe_comm, dt_model_input(m, B, T), n, DT_F32, s - 1, MG_EVAL_TAG, NULL);
    if (st == DT_OK)
        st = dt_model_forward(m, s == 0 ? inputs : NULL, targets, B, T);
    if (st == DT_OK && s < P - 1)
        st = dt_send(r->pipe_comm, dt_model_output(m), n, DT_F32, s + 1, MG_EVAL_TAG);
    *logits = s == P - 1;
    return st;
}

/* A tensor-parallel share's evaluation: the greedy tokens of its last
 * grading forward, (B, T) of them. */
typedef struct tp_eval {
    mg_run *r;
    int *ids; /* (batch, cfg.T) */
    int T;    /* of the last forward */
} tp_eval;

/* One forward on the share (m, the assembled copy, only sized the batch);
 * without targets, the greedy tokens too. Collective over the tp group. */
static dt_status tp_eval_forward(void *user, dt_model *m, const int *inputs, const int *targets,
                                 int B, int T, bool *logits)
{
    tp_eval *e = user;
    (void)m;
    *logits = true;
    e->T = T;
    dt_status st = dt_tp_forward(e->r->tp, inputs, targets, B, T);
    if (st == DT_OK && !targets)
        st = dt_tp_argmax(e->r->tp, e->ids);
    return st;
}

static int tp_eval_argmax(void *user, int b, int t)
{
    const tp_eval *e = user;
    return e->ids[b * e->T + t];
}

/* The loss of the forward fwd just ran. */
static float last_loss(const mg_run *r, const dt_model *m)
{
    return r->tp ? r->tp->mean_loss : m->mean_loss;
}

/* This rank's validation batches on m: their losses into loss[k], 1
 * into ran[k] for each that ran (on a pipeline, on the last stage). With
 * lockstep, as many forwards as the longest share (ZeRO-3: each is a
 * gather): an idle one of one token for a batch past the end or one the
 * split is too short to cut. */
static void val_loss_share(mg_run *r, dt_model *m, int part, int parts, bool lockstep,
                           const dt_forward_fn *fwd, double *loss, double *ran)
{
    const mg_options *o = &r->o;
    int rounds = (MG_VAL_BATCHES + parts - 1) / parts;
    bool logits;
    for (int i = 0; i < rounds; i++) {
        int k = part + i * parts;
        bool cut = k < MG_VAL_BATCHES &&
                   dt_dataset_batch(r->x, r->y, r->data, DT_VAL, o->seed + 1,
                                    (uint64_t)k * (uint64_t)o->batch, o->batch, o->cfg.T) == DT_OK;
        if (!cut) {
            r->x[0] = 0;
            if (lockstep)
                fwd->fn(fwd->user, m, r->x, NULL, 1, 1, &logits);
            continue;
        }
        if (fwd->fn(fwd->user, m, r->x, r->y, o->batch, o->cfg.T, &logits) != DT_OK || !logits)
            continue;
        loss[k] = (double)last_loss(r, m);
        ran[k] = 1;
    }
}

/* MINIGPT_TEST_EVAL_NOMEM=RANK: rank RANK's grading scratch "fails". */
static bool scratch_fails_here(const mg_run *r)
{
    const char *hook = getenv("MINIGPT_TEST_EVAL_NOMEM");
    int rank;
    return hook && sscanf(hook, "%d", &rank) == 1 && rank == r->rank;
}

/* This rank's share of the held-out prompts on m, each forward run by
 * fwd: the exact answers into
 * *right (-1: the data cannot be graded, the same on every rank), the
 * prompts of every share into *graded. A scratch this rank cannot
 * allocate fails the evaluation (the file comment). */
static dt_status grade_prompts(mg_run *r, dt_model *m, int part, int parts, bool lockstep,
                               const dt_forward_fn *fwd, long *right, size_t *graded)
{
    size_t n = (size_t)r->o.eval_prompts, bytes = dt_task_scratch_bytes(m, r->data, n);
    *right = -1;
    *graded = 0;
    if (bytes == 0)
        return DT_OK;
    void *scratch = scratch_fails_here(r) ? NULL : malloc(bytes);
    if (!scratch) { /* the caller's failure tells the peers (the file comment) */
        snprintf(r->err, sizeof r->err,
                 "rank %d: evaluation: allocation of %zu bytes for grading the held-out prompts "
                 "failed",
                 r->rank, bytes);
        return DT_ENOMEM;
    }
    *right = dt_task_count_exact_in(scratch, m, r->data, n, part, parts, lockstep, fwd, graded);
    free(scratch);
    return DT_OK;
}

/* The mean over the leading batches that ran (a batch that cannot be cut
 * from the split ends the series, as it always did); -1 if none ran. */
static float mean_of_leading(const double *loss, const double *ran)
{
    double sum = 0;
    int n = 0;
    while (n < MG_VAL_BATCHES && ran[n] > 0)
        sum += loss[n++]; /* a float's value: what one rank alone added */
    return n ? (float)(sum / n) : -1.0f;
}

/* This rank's share of the evaluation into sums (loss[0..B), ran[0..B),
 * right), each forward run by fwd: *right -1 where the data cannot be
 * graded (the same on every rank), *graded the prompts of every share. */
static dt_status eval_share(mg_run *r, int part, int parts, bool lockstep, const dt_forward_fn *fwd,
                            double *sums, long *right, size_t *graded)
{
    dt_status st = DT_OK;
    val_loss_share(r, r->m, part, parts, lockstep, fwd, sums, sums + MG_VAL_BATCHES);
    if (r->is_task && r->o.eval_prompts > 0)
        st = grade_prompts(r, r->m, part, parts, lockstep, fwd, right, graded);
    sums[2 * MG_VAL_BATCHES] = *right > 0 ? (double)*right : 0;
    return st;
}

/* A tensor-parallel share's part: its replica's, every rank of the tp
 * group running it; tp rank 0 alone adds it (the file comment). */
static dt_status tp_eval_share(mg_run *r, double *sums, long *right, size_t *graded)
{
    tp_eval e = {.r = r, .ids = malloc((size_t)r->o.batch * (size_t)r->o.cfg.T * sizeof(int))};
    if (!e.ids)
        return eval_fail(r, DT_ENOMEM, "the greedy tokens of a batch", "out of memory");
    dt_tp_trace_fn trace = r->tp->trace; /* --trace draws the steps' all-reduces */
    r->tp->trace = NULL;
    dt_status st = eval_share(r, r->replica, r->dp, false,
                              &(dt_forward_fn){tp_eval_forward, &e, tp_eval_argmax}, sums, right,
                              graded);
    free(e.ids);
    r->tp->trace = trace;
    if (dt_comm_rank(r->tp_comm) != 0)
        memset(sums, 0, (2 * MG_VAL_BATCHES + 1) * sizeof *sums);
    return st;
}

dt_status mg_evaluate(mg_run *r, mg_eval *out)
{
    *out = (mg_eval){.val_loss = -1, .accuracy = -1, .prompts = 0};
    dt_status st = mg_settle_params(r);
    if (st != DT_OK)
        return st;
    /* ZeRO-3's forwards gather each unit from every rank: the shares
     * run in lockstep. A pipeline's stages grade the same share, its
     * replica's: the forwards stream through them. */
    bool split = r->comm != NULL, lockstep = mg_eval_units(r);
    bool piped = r->pipe && r->pipe_comm;
    int parts = !split ? 1 : piped ? r->dp : r->world;
    int part = !split ? 0 : piped ? r->replica : r->rank;
    /* loss[0..B), ran[0..B), right */
    double sums[2 * MG_VAL_BATCHES + 1] = {0};
    long right = -1;
    size_t graded = 0;
    st = r->tp && r->tp_comm
             ? tp_eval_share(r, sums, &right, &graded)
             : eval_share(r, part, parts, lockstep, &(dt_forward_fn){eval_forward, r, NULL}, sums,
                          &right, &graded);
    if (st != DT_OK)
        return st;
    if (split &&
        (st = dt_allreduce(r->comm, sums, 2 * MG_VAL_BATCHES + 1, DT_F64, DT_SUM)) != DT_OK)
        return eval_fail(r, st, "all-reduce of the losses and counts", dt_comm_error(r->comm));
    out->val_loss = mean_of_leading(sums, sums + MG_VAL_BATCHES);
    if (right >= 0 && graded > 0) { /* -1 on one rank is -1 on all: same data */
        out->accuracy = sums[2 * MG_VAL_BATCHES] / (double)graded;
        out->prompts = graded;
    }
    return DT_OK;
}
