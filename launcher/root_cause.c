/*
 * root_cause.c — the verdict on a failed group: which worker's failure
 * caused the others', and the report a person reads.
 *
 * The first worker to fail is where the search starts, not always where it
 * ends. Workers fail because of each other: when a rank fails it aborts
 * its communicator, and its peers' ops fail with "rank K (ADDR) failed and
 * reported: <K's error>" (the ABORT frame carries K's status and error), or,
 * where no ABORT got through, "connection to rank K lost ...; rank K died
 * or its process was killed", or, when K was alive but never joined the
 * collective they waited in, their progress limit's "rank K (ADDR) is
 * alive ... but has not joined #N"; whichever of them exits first reaches the
 * launcher first, while K may still be closing its connections. So the
 * verdict follows the blame: from the first failure's last lines to the
 * rank they say failed first (the innermost report, when reports nest; by
 * its world rank when a group's message names it, blame_line.c), as
 * long as that rank is one of ours and failed too, until a worker whose
 * last lines blame nobody: its failure is its own. A chain that loops stops
 * at the first failure; one that leads to another node stops here and says
 * so.
 *
 * Silent ranks are found by their behaviour rather than their output: a
 * rank that is stopped (SIGSTOP) or hung says nothing at all, and its peers
 * only time out. worker_group.c notes the workers in state T at the first
 * failure and those still running when the grace period after SIGTERM
 * ends; if the failure the blame leads to is a timeout, such a worker is
 * the cause (see worker_group.c's head comment).
 *
 * The launcher's exit code is not decided here: it is the first failure's
 * (what the job ended with), whoever caused it.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

/* The rank w's last lines blame, newest line first, or -1. */
static int blamed_by(const worker *w)
{
    const output_tail *t = &w->tail;
    for (int i = 0; i < t->count; i++) {
        int slot = (t->next - 1 - i + 2 * OUTPUT_TAIL_LINES) % OUTPUT_TAIL_LINES;
        int k = launch_blamed_rank(t->lines[slot]);
        if (k >= 0)
            return k;
    }
    return -1;
}

static const worker *local_worker(const worker_group *g, int rank)
{
    int local = rank - g->opts->node_rank * g->opts->nproc_per_node;
    return rank >= 0 && local >= 0 && local < g->n ? &g->workers[local] : NULL;
}

/* From the first failure along the blame to the worker whose failure is
 * its own. *remote gets a rank on another node the chain ends at, or -1;
 * *reporter the worker whose lines blamed it (NULL: it is the first
 * failure). */
static const worker *own_failure(const worker_group *g, int *remote, const worker **reporter)
{
    const worker *w = g->first_failure;
    *remote = -1;
    *reporter = NULL;
    for (int hops = 0; hops < g->n; hops++) {
        int k = blamed_by(w);
        const worker *next = local_worker(g, k);
        if (k >= 0 && !next)
            *remote = k;
        bool next_failed = next && (next->term_signal || next->exit_status != 0);
        if (!next_failed || next == w)
            return w;
        *reporter = w;
        w = next;
    }
    *reporter = NULL;
    return g->first_failure; /* the lines blame each other in a loop: trust the order */
}

/* The silent worker that `cause` was waiting for, or NULL: only a timeout
 * can be caused by a rank that merely stopped or hung (its sockets stay
 * open, so its peers see silence, never an error). A stopped one first
 * (state T at the first failure), else one that printed nothing after the
 * first failure and outlived SIGTERM; the lowest rank of several. */
static const worker *silent_culprit(const worker_group *g, const worker *cause,
                                    const worker *reporter)
{
    /* what cause failed of: its own words, or, when it was stopped before it
     * could print them, the report of them its peer quoted */
    const output_tail *said = cause->tail.count == 0 && reporter ? &reporter->tail : &cause->tail;
    if (cause->spawn_error || !launch_output_tail_mentions(said, "timed out"))
        return NULL;
    for (int i = 0; i < g->n; i++)
        if (g->workers[i].stopped)
            return &g->workers[i];
    for (int i = 0; i < g->n; i++) {
        const worker *w = &g->workers[i];
        if (w->ignored_term && w->last_output_ms <= g->first_failure_ms)
            return w;
    }
    return NULL;
}

static void print_last_lines(const worker *w)
{
    if (w->tail.count > 0) {
        fprintf(stderr, "dtrain-launch: last %d line%s of rank %d:\n", w->tail.count,
                w->tail.count == 1 ? "" : "s", w->rank);
        launch_output_tail_print(&w->tail, w->rank, stderr);
    } else if (!w->spawn_error) {
        fprintf(stderr, "dtrain-launch: rank %d printed nothing\n", w->rank);
    }
}

static void report_silent_cause(const worker_group *g, const worker *w)
{
    const worker *first = g->first_failure;
    double silent_s = (double)(g->first_failure_ms - w->last_output_ms) / 1000;
    fprintf(stderr,
            "dtrain-launch: ROOT CAUSE: rank %d (local rank %d on node %d, pid %d) %s; "
            "the others timed out waiting for it\n",
            w->rank, w->local_rank, g->opts->node_rank, w->proc.pid,
            w->stopped
                ? "was stopped (SIGSTOP) and made no progress"
                : "seems hung: it printed nothing after the first failure and ignored SIGTERM");
    fprintf(stderr, "dtrain-launch: when rank %d failed, rank %d %s", first->rank, w->rank,
            w->stopped ? "was in state T" : "was running (not stopped)");
    if (w->tail.count)
        fprintf(stderr, "; its last output came %.1f s before that\n", silent_s);
    else
        fprintf(stderr, " and had printed nothing in the %.1f s since it started\n", silent_s);
    if (w->tail.count)
        print_last_lines(w);
}

/* w's failure is its own; or, when the reporter's progress limit named it
 * absent (heartbeat.c: "is alive ... but has not joined"), it was alive
 * but elsewhere while the others waited for it in a collective. */
static void report_own_failure(const worker_group *g, const worker *w, const worker *reporter)
{
    char what[128];
    launch_worker_describe_exit(w, what, sizeof what);
    bool absent = reporter && launch_output_tail_mentions(&reporter->tail, "but has not joined");
    fprintf(stderr,
            "dtrain-launch: ROOT CAUSE: rank %d (local rank %d on node %d, pid %d) %s; it %s "
            "after rank %d failed first\n",
            w->rank, w->local_rank, g->opts->node_rank, w->proc.pid,
            absent ? "had not joined the collective its peers waited in when their progress "
                     "limit ran out (it was alive, elsewhere)"
                   : "failed on its own, and its peers failed because it did",
            what, g->first_failure->rank);
    print_last_lines(w);
}

static void report_first_failure(const worker_group *g, const worker *cause)
{
    const worker *w = g->first_failure;
    char what[128];
    launch_worker_describe_exit(w, what, sizeof what);
    fprintf(stderr, "dtrain-launch: %s: rank %d (local rank %d on node %d, pid %d) %s%s\n",
            cause == w ? "ROOT CAUSE" : "first to fail", w->rank, w->local_rank, g->opts->node_rank,
            w->spawn_error ? 0 : w->proc.pid, what,
            cause == w ? "" : ", because of the root cause above");
    print_last_lines(w);
}

/* What became of the others: consequences, not causes. */
static void report_the_others(const worker_group *g, const worker *cause)
{
    int term = 0, killed = 0, clean = 0, failed = 0;
    for (int i = 0; i < g->n; i++) {
        const worker *o = &g->workers[i];
        if (o != cause && o->stopped)
            fprintf(stderr,
                    "dtrain-launch: note: rank %d (pid %d) was stopped (SIGSTOP) when "
                    "rank %d failed\n",
                    o->rank, o->proc.pid, g->first_failure->rank);
        if (o == g->first_failure || o == cause || o->spawn_error || !o->proc.pid)
            continue;
        if (o->term_signal == SIGTERM)
            term++;
        else if (o->term_signal == SIGKILL)
            killed++;
        else if (!o->term_signal && o->exit_status == 0)
            clean++;
        else
            failed++;
    }
    if (term + killed + clean + failed > 0)
        fprintf(stderr,
                "dtrain-launch: the other workers: %d stopped by SIGTERM, %d by "
                "SIGKILL, %d failed after it, %d exited 0\n",
                term, killed, failed, clean);
}

void launch_root_cause_report(const worker_group *g)
{
    int remote;
    const worker *reporter;
    const worker *own = own_failure(g, &remote, &reporter);
    const worker *silent = silent_culprit(g, own, reporter);
    const worker *cause = silent ? silent : own;
    if (silent)
        report_silent_cause(g, silent);
    else if (own != g->first_failure)
        report_own_failure(g, own, reporter);
    report_first_failure(g, cause);
    if (remote >= 0)
        fprintf(stderr,
                "dtrain-launch: rank %d's error says rank %d failed first; it runs on "
                "another node, whose launcher reports its cause\n",
                own->rank, remote);
    report_the_others(g, cause);
}
