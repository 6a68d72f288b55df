/*
 * schedule.c — a pipeline schedule as data: the lists of actions the
 * generators (schedule_gpipe.c, schedule_1f1b.c, schedule_zb.c) write,
 * completed with the transfers, the slots and the end-of-step marker.
 *
 * A generator decides only the order of compute on each stage. The
 * transfers follow from it, the same for every schedule:
 *
 *   F(mb)  is preceded by recv_act(mb)   (stages after the first)
 *          and followed by send_act(mb)  (stages before the last)
 *   B(mb)  is preceded by recv_grad(mb)  (stages before the last)
 *          and followed by send_grad(mb) (stages after the first)
 *
 * so where one compute action's send meets the next one's receive, the
 * two are adjacent in the list and the executor posts them together.
 * STEP ends every list.
 *
 * Slots: a micro-batch occupies an activation set on a stage from its
 * first action there (its receive or F) to its last (B, its send_grad, or
 * W when backward is split), and an activation-gradient set from its
 * recv_grad or B to its send_grad or W. Sets are handed out lowest-free,
 * so the number of sets a stage uses is its peak of micro-batches alive:
 * the memory the schedule costs, read off the list.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipe_internal.h"

static const char *const kind_names[DT_PIPE_NUM_KINDS] = {"gpipe", "1f1b", "zb"};
static const char *const op_names[DT_PIPE_NUM_OPS] = {"F",         "B",        "W",
                                                      "send_act",  "recv_act", "send_grad",
                                                      "recv_grad", "STEP"};

const char *dt_pipe_kind_name(dt_pipe_kind k)
{
    return k < DT_PIPE_NUM_KINDS ? kind_names[k] : "?";
}

bool dt_pipe_kind_parse(const char *name, dt_pipe_kind *out)
{
    for (int k = 0; k < DT_PIPE_NUM_KINDS; k++)
        if (strcmp(name, kind_names[k]) == 0) {
            *out = (dt_pipe_kind)k;
            return true;
        }
    return false;
}

const char *dt_pipe_op_name(dt_pipe_op op)
{
    return op < DT_PIPE_NUM_OPS ? op_names[op] : "?";
}

/* Compute order -> full list: transfers around each F and B, STEP last. */
static int add_transfers(dt_pipe_action *out, const dt_pipe_action *comp, int n, int s, int p)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        dt_pipe_action a = comp[i];
        if (a.op == DT_PIPE_F && s > 0)
            out[k++] = (dt_pipe_action){DT_PIPE_RECV_ACT, a.mb, -1, -1};
        if (a.op == DT_PIPE_B && s < p - 1)
            out[k++] = (dt_pipe_action){DT_PIPE_RECV_GRAD, a.mb, -1, -1};
        out[k++] = a;
        if (a.op == DT_PIPE_F && s < p - 1)
            out[k++] = (dt_pipe_action){DT_PIPE_SEND_ACT, a.mb, -1, -1};
        if (a.op == DT_PIPE_B && s > 0)
            out[k++] = (dt_pipe_action){DT_PIPE_SEND_GRAD, a.mb, -1, -1};
    }
    out[k++] = (dt_pipe_action){DT_PIPE_STEP, -1, -1, -1};
    return k;
}

static bool uses_grad_slot(dt_pipe_op op)
{
    return op == DT_PIPE_B || op == DT_PIPE_W || op == DT_PIPE_RECV_GRAD || op == DT_PIPE_SEND_GRAD;
}

/* Lowest-free assignment of one kind of set (grad = 0: activations, 1:
 * their gradients) over a stage's list; returns the sets used, -1 on
 * ENOMEM. */
static int assign_slots(dt_pipe_action *a, int n, int m, int grad)
{
    int *last = malloc((size_t)m * sizeof(int)); /* last action of mb */
    int *slot_of = malloc((size_t)m * sizeof(int));
    char *busy = calloc((size_t)m + 1, 1);
    int used = 0;
    if (!last || !slot_of || !busy) {
        free(last), free(slot_of), free(busy);
        return -1;
    }
    for (int i = 0; i < m; i++)
        last[i] = slot_of[i] = -1;
    for (int i = 0; i < n; i++)
        if (a[i].mb >= 0 && (!grad || uses_grad_slot(a[i].op)))
            last[a[i].mb] = i;
    for (int i = 0; i < n; i++) {
        int mb = a[i].mb;
        if (mb < 0 || (grad && !uses_grad_slot(a[i].op)))
            continue;
        if (slot_of[mb] < 0) {
            int k = 0;
            while (busy[k])
                k++;
            busy[k] = 1;
            slot_of[mb] = k;
            used = k + 1 > used ? k + 1 : used;
        }
        if (grad)
            a[i].grad_slot = slot_of[mb];
        else
            a[i].slot = slot_of[mb];
        if (i == last[mb])
            busy[slot_of[mb]] = 0;
    }
    free(last), free(slot_of), free(busy);
    return used > 0 ? used : 1;
}

static int generate(dt_pipe_kind kind, dt_pipe_action **comp, int *n, int p, int m)
{
    switch (kind) {
    case DT_PIPE_GPIPE: return dt_sched_gpipe(comp, n, p, m);
    case DT_PIPE_1F1B: return dt_sched_1f1b(comp, n, p, m);
    default: return dt_sched_zb(comp, n, p, m);
    }
}

/* Every stage's full list, from the compute orders in comp. */
static int complete_lists(dt_pipe_schedule *s, dt_pipe_action **comp)
{
    for (int st = 0; st < s->p; st++) {
        /* each F and B gains at most one transfer before and after */
        s->actions[st] = malloc((size_t)(3 * s->n[st] + 1) * sizeof(dt_pipe_action));
        if (!s->actions[st])
            return -1;
        s->n[st] = add_transfers(s->actions[st], comp[st], s->n[st], st, s->p);
        s->act_slots[st] = assign_slots(s->actions[st], s->n[st], s->m, 0);
        s->grad_slots[st] = assign_slots(s->actions[st], s->n[st], s->m, 1);
        if (s->act_slots[st] < 0 || s->grad_slots[st] < 0)
            return -1;
    }
    return 0;
}

dt_pipe_schedule *dt_pipe_schedule_create(dt_pipe_kind kind, int p, int m, char *err, size_t errlen)
{
    if (kind >= DT_PIPE_NUM_KINDS || p < 1 || m < 1) {
        snprintf(err, errlen,
                 "pipeline schedule: %s with %d stages and %d "
                 "micro-batches: need a known schedule, p >= 1 and m >= 1",
                 dt_pipe_kind_name(kind), p, m);
        return NULL;
    }
    dt_pipe_schedule *s = calloc(1, sizeof *s);
    dt_pipe_action **comp = calloc((size_t)p, sizeof *comp);
    int ok = s && comp;
    if (ok) {
        *s = (dt_pipe_schedule){kind,
                                p,
                                m,
                                kind == DT_PIPE_ZB,
                                calloc((size_t)p, sizeof(int)),
                                calloc((size_t)p, sizeof(dt_pipe_action *)),
                                calloc((size_t)p, sizeof(int)),
                                calloc((size_t)p, sizeof(int))};
        ok = s->n && s->actions && s->act_slots && s->grad_slots;
    }
    for (int st = 0; ok && st < p; st++)
        ok = (comp[st] = malloc((size_t)3 * m * sizeof **comp)) != NULL;
    ok = ok && generate(kind, comp, s->n, p, m) == 0 && complete_lists(s, comp) == 0;
    for (int st = 0; comp && st < p; st++)
        free(comp[st]);
    free(comp);
    if (!ok) {
        snprintf(err, errlen, "pipeline schedule: out of memory");
        dt_pipe_schedule_destroy(s);
        return NULL;
    }
    return s;
}

void dt_pipe_schedule_destroy(dt_pipe_schedule *s)
{
    if (!s)
        return;
    for (int st = 0; s->actions && st < s->p; st++)
        free(s->actions[st]);
    free(s->actions);
    free(s->n);
    free(s->act_slots);
    free(s->grad_slots);
    free(s);
}

void dt_pipe_schedule_print(const dt_pipe_schedule *s, FILE *f)
{
    for (int st = 0; st < s->p; st++) {
        fprintf(f, "stage %d:", st);
        for (int i = 0; i < s->n[st]; i++) {
            const dt_pipe_action *a = &s->actions[st][i];
            if (a->mb >= 0)
                fprintf(f, " %s%d", dt_pipe_op_name(a->op), a->mb);
            else
                fprintf(f, " %s", dt_pipe_op_name(a->op));
        }
        fputc('\n', f);
    }
}
