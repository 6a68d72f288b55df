/*
 * simulate.c — run a schedule's lists against each other on paper: the
 * deadlock check, the bubble and the Gantt chart of a schedule, without a
 * network.
 *
 * Each stage has a clock and a position in its list. Compute actions take
 * their cost. Transfers follow the executor's rules (executor.c), in the
 * strictest network there is — no buffering at all:
 *
 *   - consecutive transfers in a list are posted together, at the stage's
 *     clock; the stage then waits for the receives among them;
 *   - a receive completes `latency` after both it and its send are posted;
 *     a send completes at the same moment (so a send waits for its
 *     receiver: a rendezvous, the worst a socket can do once full);
 *   - a send is waited only before its buffer is reused (the next
 *     micro-batch in the same slot) and at STEP.
 *
 * The executor may post a receive earlier than its place (once its buffer
 * is free); that only lets a send complete sooner, so lists that pass here
 * pass there.
 *
 * Stages are advanced in turn, each as far as it can go; when a full turn
 * moves nobody and some list is unfinished, the lists deadlock, and the
 * message names what every stuck stage is waiting for. Otherwise the
 * clocks give the makespan, each stage's busy time (its bubble is the
 * rest), and when every action ran. Cost: O(actions x stages) time.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipe_internal.h"

typedef struct sim {
    const dt_pipe_schedule *s;
    const dt_pipe_costs *c;
    dt_pipe_sim *out;
    int p, m;
    /* post times (NAN until posted), indexed [kind][sender stage][mb],
     * kind 0 = activations (s -> s+1), 1 = gradients (s -> s-1) */
    double *send_at[2], *recv_at[2];
    int *pc;           /* [p] next action */
    char *posted;      /* [p] the batch at pc is posted */
    double *clock;     /* [p] */
    int *slot_send[2]; /* [p * m] mb whose send left from a slot, or -1 */
} sim;

static double *post_time(sim *z, int recv, int kind, int sender, int mb)
{
    double *t = recv ? z->recv_at[kind] : z->send_at[kind];
    return &t[sender * z->m + mb];
}

/* The transfer's (kind, sender) as seen from stage st. */
static void transfer_id(dt_pipe_op op, int st, int *kind, int *sender, int *recv)
{
    *kind = op == DT_PIPE_SEND_GRAD || op == DT_PIPE_RECV_GRAD;
    *recv = op == DT_PIPE_RECV_ACT || op == DT_PIPE_RECV_GRAD;
    *sender = !*recv ? st : (*kind ? st + 1 : st - 1);
}

/* Completion of the transfer (kind, sender, mb) if both sides are posted;
 * NAN if not yet. */
static double matched_at(sim *z, int kind, int sender, int mb)
{
    double a = *post_time(z, 0, kind, sender, mb);
    double b = *post_time(z, 1, kind, sender, mb);
    return isnan(a) || isnan(b) ? NAN : fmax(a, b) + z->c->latency;
}

/* Before action a touches its slots: wait for a send still leaving from
 * them for another micro-batch. False if that send is not matched yet. */
static bool wait_slot_sends(sim *z, int st, const dt_pipe_action *a)
{
    int slots[2] = {a->slot, a->grad_slot};
    for (int kind = 0; kind < 2; kind++) {
        if (slots[kind] < 0)
            continue;
        int *pending = &z->slot_send[kind][st * z->m + slots[kind]];
        if (*pending < 0 || *pending == a->mb)
            continue;
        double t = matched_at(z, kind, st, *pending);
        if (isnan(t))
            return false;
        z->clock[st] = fmax(z->clock[st], t);
        *pending = -1;
    }
    return true;
}

static int batch_end(const dt_pipe_schedule *s, int st, int i)
{
    while (i < s->n[st] && dt_pipe_is_transfer(s->actions[st][i].op))
        i++;
    return i;
}

/* Posts the batch of transfers at pc (once), then completes it if every
 * receive in it is matched. Returns whether the stage moved. */
static bool step_batch(sim *z, int st)
{
    const dt_pipe_action *acts = z->s->actions[st];
    int i0 = z->pc[st], i1 = batch_end(z->s, st, i0), kind, snd, recv;
    bool moved = false;
    if (!z->posted[st]) {
        for (int i = i0; i < i1; i++)
            if (!wait_slot_sends(z, st, &acts[i]))
                return false;
        for (int i = i0; i < i1; i++) {
            transfer_id(acts[i].op, st, &kind, &snd, &recv);
            *post_time(z, recv, kind, snd, acts[i].mb) = z->clock[st];
            if (!recv)
                z->slot_send[kind][st * z->m + (kind ? acts[i].grad_slot : acts[i].slot)] =
                    acts[i].mb;
            z->out->start[st][i] = z->out->end[st][i] = z->clock[st];
        }
        z->posted[st] = 1;
        moved = true;
    }
    double done = z->clock[st];
    for (int i = i0; i < i1; i++) {
        transfer_id(acts[i].op, st, &kind, &snd, &recv);
        if (!recv)
            continue;
        double t = matched_at(z, kind, snd, acts[i].mb);
        if (isnan(t))
            return moved;
        z->out->end[st][i] = t;
        done = fmax(done, t);
    }
    z->clock[st] = done;
    z->pc[st] = i1;
    z->posted[st] = 0;
    return true;
}

/* STEP: every send of this stage matched. */
static bool step_end(sim *z, int st)
{
    double t = z->clock[st];
    for (int mb = 0; mb < z->m; mb++)
        for (int kind = 0; kind < 2; kind++) {
            if ((kind == 0 && st == z->p - 1) || (kind == 1 && st == 0))
                continue;
            double d = matched_at(z, kind, st, mb);
            if (isnan(d))
                return false;
            t = fmax(t, d);
        }
    z->out->start[st][z->pc[st]] = z->clock[st];
    z->clock[st] = z->out->end[st][z->pc[st]] = t;
    z->pc[st]++;
    return true;
}

static double cost_of(const sim *z, int st, dt_pipe_op op)
{
    const dt_pipe_costs *c = z->c;
    double f = c->f, b = c->b, w = c->w;
    if (c->stage) {
        f = c->stage[3 * st];
        b = c->stage[3 * st + 1];
        w = c->stage[3 * st + 2];
    }
    if (op == DT_PIPE_F)
        return f;
    if (op == DT_PIPE_W)
        return w;
    return z->s->split_backward ? b - w : b;
}

/* Advances stage st by one action (or one batch); false if it cannot. */
static bool step_stage(sim *z, int st)
{
    if (z->pc[st] >= z->s->n[st])
        return false;
    const dt_pipe_action *a = &z->s->actions[st][z->pc[st]];
    if (dt_pipe_is_transfer(a->op))
        return step_batch(z, st);
    if (a->op == DT_PIPE_STEP)
        return step_end(z, st);
    if (!wait_slot_sends(z, st, a))
        return false;
    double d = cost_of(z, st, a->op);
    z->out->start[st][z->pc[st]] = z->clock[st];
    z->clock[st] += d;
    z->out->end[st][z->pc[st]] = z->clock[st];
    z->out->busy[st] += d;
    z->pc[st]++;
    return true;
}

/* The deadlock report: every unfinished stage and the action it is at. */
static void describe_stuck(sim *z)
{
    size_t len = 0, cap = sizeof z->out->err;
    len += (size_t)snprintf(z->out->err, cap,
                            "%s, p=%d m=%d deadlocks:", dt_pipe_kind_name(z->s->kind), z->p, z->m);
    for (int st = 0; st < z->p && len < cap; st++) {
        if (z->pc[st] >= z->s->n[st])
            continue;
        const dt_pipe_action *a = &z->s->actions[st][z->pc[st]];
        len += (size_t)snprintf(z->out->err + len, cap - len,
                                " stage %d waits at %s%d (action %d);", st, dt_pipe_op_name(a->op),
                                a->mb, z->pc[st]);
    }
}

static bool sim_alloc(sim *z)
{
    size_t pm = (size_t)z->p * z->m;
    bool ok = true;
    for (int k = 0; k < 2; k++) {
        z->send_at[k] = malloc(pm * sizeof(double));
        z->recv_at[k] = malloc(pm * sizeof(double));
        z->slot_send[k] = malloc(pm * sizeof(int));
        ok = ok && z->send_at[k] && z->recv_at[k] && z->slot_send[k];
        for (size_t i = 0; ok && i < pm; i++) {
            z->send_at[k][i] = z->recv_at[k][i] = NAN;
            z->slot_send[k][i] = -1;
        }
    }
    z->pc = calloc((size_t)z->p, sizeof(int));
    z->posted = calloc((size_t)z->p, 1);
    z->clock = calloc((size_t)z->p, sizeof(double));
    z->out->busy = calloc((size_t)z->p, sizeof(double));
    z->out->start = calloc((size_t)z->p, sizeof(double *));
    z->out->end = calloc((size_t)z->p, sizeof(double *));
    ok = ok && z->pc && z->posted && z->clock && z->out->busy && z->out->start && z->out->end;
    for (int st = 0; ok && st < z->p; st++) {
        z->out->start[st] = calloc((size_t)z->s->n[st], sizeof(double));
        z->out->end[st] = calloc((size_t)z->s->n[st], sizeof(double));
        ok = z->out->start[st] && z->out->end[st];
    }
    return ok;
}

static void sim_release(sim *z)
{
    for (int k = 0; k < 2; k++) {
        free(z->send_at[k]);
        free(z->recv_at[k]);
        free(z->slot_send[k]);
    }
    free(z->pc);
    free(z->posted);
    free(z->clock);
}

dt_status dt_pipe_simulate(const dt_pipe_schedule *s, const dt_pipe_costs *c, dt_pipe_sim *out)
{
    memset(out, 0, sizeof *out);
    sim z = {.s = s, .c = c, .out = out, .p = s->p, .m = s->m};
    if (!sim_alloc(&z)) {
        sim_release(&z);
        snprintf(out->err, sizeof out->err, "simulate: out of memory");
        return DT_ENOMEM;
    }
    bool moved = true, done = false;
    while (moved && !done) {
        moved = false;
        done = true;
        for (int st = 0; st < s->p; st++) {
            while (step_stage(&z, st))
                moved = true;
            done = done && z.pc[st] >= s->n[st];
        }
    }
    for (int st = 0; st < s->p; st++)
        out->makespan = fmax(out->makespan, z.clock[st]);
    if (!done)
        describe_stuck(&z);
    sim_release(&z);
    return done ? DT_OK : DT_EPROTO;
}

void dt_pipe_sim_free(const dt_pipe_schedule *s, dt_pipe_sim *sim)
{
    for (int st = 0; sim->start && st < s->p; st++)
        free(sim->start[st]);
    for (int st = 0; sim->end && st < s->p; st++)
        free(sim->end[st]);
    free(sim->start);
    free(sim->end);
    free(sim->busy);
    memset(sim, 0, sizeof *sim);
}

void dt_pipe_sim_draw(const dt_pipe_schedule *s, const dt_pipe_sim *sim, double unit, bool letters,
                      FILE *f)
{
    int cols = (int)ceil(sim->makespan / unit);
    char *row = malloc((size_t)cols + 1);
    for (int st = 0; row && st < s->p; st++) {
        memset(row, '.', (size_t)cols);
        row[cols] = '\0';
        for (int i = 0; i < s->n[st]; i++) {
            const dt_pipe_action *a = &s->actions[st][i];
            if (a->op > DT_PIPE_W)
                continue;
            char ch = letters ? "FBW"[a->op] : (char)('0' + a->mb % 10);
            int c0 = (int)floor(sim->start[st][i] / unit + 0.5);
            int c1 = (int)floor(sim->end[st][i] / unit + 0.5);
            for (int k = c0; k < c1 && k < cols; k++)
                row[k] = ch;
        }
        fprintf(f, "s%d %s\n", st, row);
    }
    free(row);
}
