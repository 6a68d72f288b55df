/*
 * lesson.c — the curriculum's pipeline lesson on real ranks (`minigpt
 * --preset pipeline`: 4 stages, 8 micro-batches): the Gantt chart of a
 * step and the bubble table, both measured, not simulated.
 *
 * --gantt: after training, every stage sends the executor's timeline of
 * its last step (dt_pipe_last_timeline: when each F, B and W began and
 * ended, CLOCK_MONOTONIC, shared by the ranks of one machine) to stage 0,
 * which prints one row per stage, one column per 1/WIDTH of the step: the
 * kind of the compute action that covers most of the column, '.' where
 * the stage was idle, and under it the micro-batch (mod 10). The lesson's
 * picture, drawn from clocks.
 *
 * --bubble-table: then, for GPipe, 1F1B and ZB-H1 and m = 1, 2, 4, ..., 64,
 * each stage builds that schedule and a stage model with its slots, runs
 * one warm-up step and REPS measured ones, and measures its bubble as
 * idle ÷ step time = 1 − (F + B + W time) / wall time of the step; stage 0
 * prints them beside the closed form (with F = 1, B = 2, W = 1), and the
 * peak activation memory each schedule needs per stage at m = 8 (the
 * activation and activation-gradient sets it keeps alive × bytes per
 * set). Costs: about 3 · 127 · (REPS + 1) micro-batches per stage.
 */
#include <stdlib.h>
#include <string.h>

#include "trainer.h"

enum { GANTT_WIDTH = 96, REPS = 2, MAX_M = 64 };
enum { G_KIND, G_MB, G_T0, G_T1, G_FIELDS };

/* This stage's compute actions of the last step, padded to 3m with
 * kind -1: (kind, mb, t0, t1) each. */
static void my_timeline(const mg_run *r, double *out, int cap)
{
    const double *t0, *t1;
    dt_pipe_last_timeline(r->pipe, &t0, &t1);
    const dt_pipe_schedule *s = r->sched;
    int k = 0;
    for (int i = 0; i < cap; i++)
        out[i * G_FIELDS + G_KIND] = -1;
    for (int i = 0; i < s->n[r->stage] && k < cap; i++) {
        const dt_pipe_action *a = &s->actions[r->stage][i];
        if (a->op != DT_PIPE_F && a->op != DT_PIPE_B && a->op != DT_PIPE_W)
            continue;
        double *e = out + (size_t)k++ * G_FIELDS;
        e[G_KIND] = a->op, e[G_MB] = a->mb, e[G_T0] = t0[i], e[G_T1] = t1[i];
    }
}

/* One stage's two rows: the kind and the micro-batch covering most of
 * each column of [origin, origin + span). */
static void draw_stage(FILE *f, int q, const double *ev, int cap, double origin, double span)
{
    char kind[GANTT_WIDTH + 1], mb[GANTT_WIDTH + 1];
    double best[GANTT_WIDTH] = {0};
    memset(kind, '.', GANTT_WIDTH);
    memset(mb, ' ', GANTT_WIDTH);
    kind[GANTT_WIDTH] = mb[GANTT_WIDTH] = '\0';
    double col = span / GANTT_WIDTH;
    for (int i = 0; i < cap; i++) {
        const double *e = ev + (size_t)i * G_FIELDS;
        if (e[G_KIND] < 0)
            continue;
        for (int c = 0; c < GANTT_WIDTH; c++) {
            double a = origin + c * col, b = a + col;
            double lo = e[G_T0] > a ? e[G_T0] : a;
            double hi = e[G_T1] < b ? e[G_T1] : b;
            if (hi - lo > best[c]) {
                best[c] = hi - lo;
                kind[c] = "FBW"[(int)e[G_KIND]];
                mb[c] = (char)('0' + (int)e[G_MB] % 10);
            }
        }
    }
    fprintf(f, "  stage %d |%s|\n          |%s|\n", q, kind, mb);
}

dt_status mg_lesson_gantt(FILE *f, mg_run *r)
{
    int P = r->o.pp, cap = 3 * r->sched->m;
    size_t per = (size_t)cap * G_FIELDS;
    double *mine = malloc(per * sizeof *mine);
    double *all = calloc(per * (size_t)P, sizeof *all);
    dt_status st = mine && all ? DT_OK : DT_ENOMEM;
    if (st == DT_OK) {
        my_timeline(r, mine, cap);
        if (r->pipe_comm)
            st = dt_gather(r->pipe_comm, mine, all, per, DT_F64, 0);
        else
            memcpy(all, mine, per * sizeof *mine);
    }
    if (st == DT_OK && r->rank == 0) {
        double origin = 0, end = 0;
        for (size_t i = 0; i < (size_t)P * cap; i++) {
            const double *e = all + i * G_FIELDS;
            if (e[G_KIND] < 0)
                continue;
            origin = origin == 0 || e[G_T0] < origin ? e[G_T0] : origin;
            end = e[G_T1] > end ? e[G_T1] : end;
        }
        fprintf(f,
                "gantt: the last step of %s on %d stages, %d micro-batches,"
                " measured (%.2f ms, one column = %.3f ms; F forward, B "
                "backward%s, . idle; below: micro-batch mod 10)\n",
                dt_pipe_kind_name(r->sched->kind), P, r->sched->m, 1e3 * (end - origin),
                1e3 * (end - origin) / GANTT_WIDTH,
                r->sched->split_backward ? " (input half), W weight half" : "");
        for (int q = 0; q < P; q++)
            draw_stage(f, q, all + (size_t)q * per, cap, origin, end - origin);
    }
    free(mine);
    free(all);
    if (st != DT_OK)
        snprintf(r->err, sizeof r->err, "rank %d: gantt: %s", r->rank,
                 r->pipe_comm ? dt_comm_error(r->pipe_comm) : dt_status_name(st));
    return st;
}

/* ---- the bubble table ------------------------------------------------------- */

static const int sweep_m[] = {1, 2, 4, 8, 16, 32, 64};
enum { NM = sizeof sweep_m / sizeof sweep_m[0], M_MEM = 3 /* m = 8 */ };
enum { S_WALL, S_COMPUTE, S_ACT_BYTES, S_ACT_SETS, S_FIELDS };

/* One schedule at m micro-batches on this stage, REPS steps after a
 * warm-up: out[S_*]. x, y: MAX_M micro-batches of (B, T) tokens. */
static dt_status measure(mg_run *r, dt_pipe_kind kind, int m, const int *x, const int *y,
                         double *out)
{
    const mg_options *o = &r->o;
    char err[256];
    size_t rows = (size_t)o->batch * o->cfg.T;
    dt_pipe_schedule *s = dt_pipe_schedule_create(kind, o->pp, m, err, sizeof err);
    if (!s)
        return DT_EINVAL;
    dt_stage_spec sp = {r->m->l0, r->m->l1, s->act_slots[r->stage], s->grad_slots[r->stage], false};
    dt_model *sm = NULL;
    dt_pipe *pp = NULL;
    dt_status st = dt_model_create_stage(&sm, &o->cfg, dt_backend_cpu(), o->batch, &sp);
    if (st == DT_OK) {
        dt_model_init(sm, o->seed);
        st = dt_pipe_create(&pp, r->pipe_comm, sm, s);
    }
    const int *in[MAX_M], *tg[MAX_M];
    for (int j = 0; j < m; j++)
        in[j] = x + j * rows, tg[j] = y + j * rows;
    int first = r->stage == 0, last = r->stage == o->pp - 1;
    for (int rep = 0; rep <= REPS && st == DT_OK; rep++) {
        dt_model_zero_grad(sm);
        st = dt_pipe_run(pp, first ? in : NULL, last ? tg : NULL, o->batch, o->cfg.T, NULL);
        dt_pipe_stats ps;
        dt_pipe_last_stats(pp, &ps);
        if (rep > 0) { /* the first warms up */
            out[S_WALL] += ps.wall_s;
            out[S_COMPUTE] += ps.op_s[DT_PIPE_F] + ps.op_s[DT_PIPE_B] + ps.op_s[DT_PIPE_W];
        }
    }
    if (st != DT_OK && pp)
        snprintf(r->err, sizeof r->err, "rank %d: bubble table: %s", r->rank, dt_pipe_error(pp));
    out[S_ACT_SETS] = sp.act_slots + sp.grad_slots;
    out[S_ACT_BYTES] = out[S_ACT_SETS] * (sm ? (double)sm->num_acts * 4 : 0);
    dt_pipe_destroy(pp);
    dt_model_destroy(sm);
    dt_pipe_schedule_destroy(s);
    return st;
}

/* MAX_M micro-batches of the training split, rows 0 .. MAX_M·B. */
static dt_status sweep_data(mg_run *r, int **x, int **y)
{
    const mg_options *o = &r->o;
    size_t rows = (size_t)o->batch * o->cfg.T;
    *x = malloc(MAX_M * rows * sizeof(int));
    *y = malloc(MAX_M * rows * sizeof(int));
    if (!*x || !*y)
        return DT_ENOMEM;
    for (int j = 0; j < MAX_M; j++) {
        dt_status st = dt_dataset_batch(*x + j * rows, *y + j * rows, r->data, DT_TRAIN, o->seed,
                                        (uint64_t)j * o->batch, o->batch, o->cfg.T);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}

static double measured(const double *v)
{
    return v[S_WALL] > 0 ? 100 * (1 - v[S_COMPUTE] / v[S_WALL]) : 0;
}

/* all: [stage][kind][m][S_FIELDS] */
static void print_bubbles(FILE *f, const mg_run *r, const double *all)
{
    int P = r->o.pp;
    size_t per_stage = (size_t)DT_PIPE_NUM_KINDS * NM * S_FIELDS;
    fprintf(f,
            "bubble: idle / step time of each stage (measured: 1 - "
            "compute/wall over %d steps after a warm-up) beside the closed "
            "form (F = 1, B = 2, W = 1), p = %d\n  %4s",
            REPS, P, "m");
    for (int k = 0; k < DT_PIPE_NUM_KINDS; k++) {
        fprintf(f, " | %-5s closed", dt_pipe_kind_name((dt_pipe_kind)k));
        for (int q = 0; q < P; q++)
            fprintf(f, "   s%d", q);
    }
    fprintf(f, "\n");
    for (int i = 0; i < NM; i++) {
        fprintf(f, "  %4d", sweep_m[i]);
        for (int k = 0; k < DT_PIPE_NUM_KINDS; k++) {
            char closed[16] = "-"; /* ZB-H1 has none for m < p */
            if (k != DT_PIPE_ZB || sweep_m[i] >= P)
                snprintf(closed, sizeof closed, "%.1f%%",
                         100 * mg_closed_form_bubble((dt_pipe_kind)k, P, sweep_m[i]));
            fprintf(f, " | %12s", closed);
            for (int q = 0; q < P; q++)
                fprintf(f, " %3.0f%%",
                        measured(all + q * per_stage + ((size_t)k * NM + i) * S_FIELDS));
        }
        fprintf(f, "\n");
    }
    fprintf(f,
            "peak activation memory per stage at m = %d (activation + "
            "gradient sets alive x bytes per set):\n  %5s",
            sweep_m[M_MEM], "stage");
    for (int k = 0; k < DT_PIPE_NUM_KINDS; k++)
        fprintf(f, " %20s", dt_pipe_kind_name((dt_pipe_kind)k));
    fprintf(f, "\n");
    for (int q = 0; q < P; q++) {
        fprintf(f, "  %5d", q);
        for (int k = 0; k < DT_PIPE_NUM_KINDS; k++) {
            const double *v = all + q * per_stage + ((size_t)k * NM + M_MEM) * S_FIELDS;
            fprintf(f, " %5.0f sets %9.0f B", v[S_ACT_SETS], v[S_ACT_BYTES]);
        }
        fprintf(f, "\n");
    }
}

dt_status mg_lesson_bubbles(FILE *f, mg_run *r)
{
    int P = r->o.pp;
    size_t per = (size_t)DT_PIPE_NUM_KINDS * NM * S_FIELDS;
    double *mine = calloc(per, sizeof *mine);
    double *all = calloc(per * (size_t)P, sizeof *all);
    int *x = NULL, *y = NULL;
    dt_status st = mine && all ? sweep_data(r, &x, &y) : DT_ENOMEM;
    for (int k = 0; k < DT_PIPE_NUM_KINDS && st == DT_OK; k++)
        for (int i = 0; i < NM && st == DT_OK; i++)
            st = measure(r, (dt_pipe_kind)k, sweep_m[i], x, y,
                         mine + ((size_t)k * NM + i) * S_FIELDS);
    if (st == DT_OK && r->pipe_comm)
        st = dt_gather(r->pipe_comm, mine, all, per, DT_F64, 0);
    else if (st == DT_OK)
        memcpy(all, mine, per * sizeof *mine);
    if (st == DT_OK && r->rank == 0)
        print_bubbles(f, r, all);
    if (st != DT_OK && !r->err[0])
        snprintf(r->err, sizeof r->err, "rank %d: bubble table: %s", r->rank, dt_status_name(st));
    free(x);
    free(y);
    free(mine);
    free(all);
    return st;
}
