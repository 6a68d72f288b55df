/*
 * root_cause.c — the verdict on a failed group: which worker's failure
 * caused the others', and the report a person reads.
 *
 * The first worker to fail is the root cause, with one exception read from
 * the kernel rather than from the output: a rank that is stopped (SIGSTOP,
 * a debugger) says nothing at all, and its peers only time out.
 * worker_group.c notes the stopped workers at the first failure; if that
 * failure is a timeout, the stopped worker is the cause (see
 * worker_group.c's head comment).
 *
 * The launcher's exit code is not decided here: it is the first failure's
 * (what the job ended with), whoever caused it.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

/* The stopped worker the first failure was waiting for, or NULL: only a
 * timeout can be caused by a rank that merely stopped (its sockets stay
 * open, so its peers see silence, never an error). The lowest rank if
 * several were stopped. */
static const worker *stopped_culprit(const worker_group *g)
{
    const worker *first = g->first_failure;
    if (!first || first->spawn_error || !output_tail_mentions(&first->tail, "timed out"))
        return NULL;
    for (int i = 0; i < g->n; i++)
        if (g->workers[i].stopped_state) return &g->workers[i];
    return NULL;
}

static void print_last_lines(const worker *w)
{
    if (w->tail.count > 0) {
        fprintf(stderr, "dtrain-launch: last %d line%s of rank %d:\n", w->tail.count,
                w->tail.count == 1 ? "" : "s", w->rank);
        output_tail_print(&w->tail, w->rank, stderr);
    } else if (!w->spawn_error) {
        fprintf(stderr, "dtrain-launch: rank %d printed nothing\n", w->rank);
    }
}

static void report_stopped_cause(const worker_group *g, const worker *w)
{
    const worker *first = g->first_failure;
    double silent_s = (double)(g->first_failure_ms - w->last_output_ms) / 1000;
    fprintf(stderr, "dtrain-launch: ROOT CAUSE: rank %d (local rank %d on node %d, pid %d) "
            "was stopped (%s) and made no progress; the others timed out waiting for it\n",
            w->rank, w->local_rank, g->opts->node_rank, w->proc.pid, worker_stopped_how(w));
    if (w->tail.count)
        fprintf(stderr, "dtrain-launch: rank %d was in state %c when rank %d failed; its last "
                "output came %.1f s before that\n", w->rank, w->stopped_state, first->rank,
                silent_s);
    else
        fprintf(stderr, "dtrain-launch: rank %d was in state %c when rank %d failed and had "
                "printed nothing in the %.1f s since it started\n", w->rank, w->stopped_state,
                first->rank, silent_s);
    if (w->tail.count) print_last_lines(w);
}

static void report_first_failure(const worker_group *g, bool is_cause)
{
    const worker *w = g->first_failure;
    char what[128];
    worker_describe_exit(w, what, sizeof what);
    fprintf(stderr, "dtrain-launch: %s: rank %d (local rank %d on node %d, pid %d) %s\n",
            is_cause ? "ROOT CAUSE" : "first to fail", w->rank, w->local_rank,
            g->opts->node_rank, w->spawn_error ? 0 : w->proc.pid, what);
    print_last_lines(w);
}

void root_cause_report(const worker_group *g)
{
    const worker *culprit = stopped_culprit(g);
    if (culprit) report_stopped_cause(g, culprit);
    report_first_failure(g, !culprit);
    /* What became of the others: consequences, not causes. */
    int term = 0, killed = 0, clean = 0, failed = 0;
    for (int i = 0; i < g->n; i++) {
        const worker *o = &g->workers[i];
        if (!culprit && o->stopped_state)
            fprintf(stderr, "dtrain-launch: note: rank %d (pid %d) was stopped (%s) when rank %d "
                    "failed\n", o->rank, o->proc.pid, worker_stopped_how(o), g->first_failure->rank);
        if (o == g->first_failure || o == culprit || o->spawn_error || !o->proc.pid) continue;
        if (o->term_signal == SIGTERM) term++;
        else if (o->term_signal == SIGKILL) killed++;
        else if (!o->term_signal && o->exit_status == 0) clean++;
        else failed++;
    }
    if (term + killed + clean + failed > 0)
        fprintf(stderr, "dtrain-launch: the other workers: %d stopped by SIGTERM, %d by "
                "SIGKILL, %d failed after it, %d exited 0\n", term, killed, failed, clean);
}

