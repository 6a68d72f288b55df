/*
 * fail.c — a communicator's failure: recorded once, on any thread, with
 * where it was seen, and spread to the communicators it shares a fate with.
 *
 * The first failure wins: `failed`, `fail_status` and `error` are set once
 * (comm_fail), and every later op returns that root cause — which rank, at
 * which address, during which op. Recording wakes everyone: API threads
 * waiting on work, and the loop, which then fails every pending transfer,
 * sends each peer an ABORT frame with the reason and closes the
 * connections (mesh.c); on the gloo wire it interrupts the gloo context,
 * which ends the op waiting there and closes its connections (comm_gloo.c).
 * dt_comm_abort is the same path with DT_EABORTED; it
 * may run on any thread, so recording is done with the communicator once it
 * lets go of the mutex that published the failure.
 *
 * One root cause per rank. A failure of a communicator spreads down its
 * family (family.c) to its descendants: a child's ranks are its parent's,
 * so a broken parent means a broken job, and a child must not sit waiting
 * on a rank that is gone. A peer failure (DT_EPEER: a peer died, its
 * connection broke, or it left a group while still expected) spreads up as
 * well, to the world and every group under it: the process that died was
 * in the world too, and whichever communicator noticed first writes the
 * message that every other one reports. Failures in a family are recorded
 * one at a time, under its mutex, so a second detector of the same death
 * finds its communicator already failed with the first one's words. A
 * child's other failures (a timeout, an abort, ranks that disagree about an
 * op) stay in that child and below; its peers hear of them through ABORT
 * frames, as ever.
 *
 * A peer that failed in an op later than the one running here is held back
 * (transport_read.c records it as deferred): comm_fail_deferred* turn it into
 * this communicator's failure once the op ends or its grace is over.
 * Cost: a mutex or two per failure; nothing on the success path.
 */
#include <stdio.h>

#include "family.h"
#include "gloo/gloo.h"

/* Where a failure was seen: " [rank 2 was running allreduce #17]"; a
 * group's member names itself by group and world rank (family.c), and says
 * so even when no op was running. */
static void append_context(dt_comm *c, char *out, size_t n)
{
    char who[256];
    bool in_group = comm_family_who(c, who, sizeof who);
    if (c->in_op)
        snprintf(out, n, " [%s was running %s #%llu]", who, dt_op_name(c->cur_kind),
                 (unsigned long long)c->cur_seq);
    else if (in_group)
        snprintf(out, n, " [seen by %s]", who);
}

/* Records the first failure on c alone (where it was seen appended), wakes
 * everyone; true if this call was the first. */
static bool record_failure(dt_comm *c, dt_status st, const char *fmt, va_list ap)
{
    pthread_mutex_lock(&c->mu);
    bool first = !c->failed;
    if (first) {
        c->failed = true;
        c->fail_status = st;
        int n = vsnprintf(c->error, sizeof c->error, fmt, ap);
        if (n > 0 && (size_t)n < sizeof c->error)
            append_context(c, c->error + n, sizeof c->error - (size_t)n);
    }
    c->tp.want_fail = true;
    pthread_cond_broadcast(&c->cv_api);
    /* The gloo wire: the op waiting there returns now, not at its timeout
     * (c->gloo is set before init_done, which mu publishes, and is cleared
     * under mu before the context goes). */
    if (first && c->init_done && c->gloo)
        comm_gloo_interrupt(c->gloo, st);
    /* Wake the loop before letting go of mu, and touch nothing after: a
     * thread woken by the failure may destroy c the moment mu is free
     * (dt_comm_abort is called from any thread). Every way out of an op,
     * and dt_comm_destroy itself, takes mu first. */
    comm_wake_thread(c);
    pthread_mutex_unlock(&c->mu);
    return first;
}

/* ---- one fate for a family ---------------------------------------------------- */

/* The lock that orders the failures of c's family; NULL: c never took
 * part in a split. */
static group_family *lock_family(dt_comm *c)
{
    dt_group *g = comm_family_get(c);
    if (!g)
        return NULL;
    pthread_mutex_lock(&g->family->mu);
    return g->family;
}

static void unlock_family(group_family *family)
{
    if (family)
        pthread_mutex_unlock(&family->mu);
}

/* Fail `top` and everything below it, except `origin` (already failed). */
static void fail_subtree(dt_comm *top, const dt_comm *origin, dt_status st, const char *text)
{
    if (top != origin)
        comm_fail_member(top, st, "%s", text);
    for (dt_comm *k = top->group->first_child; k; k = k->group->next_sibling)
        fail_subtree(k, origin, st, text);
}

/* With the family lock held, after c's first failure: fail the
 * communicators c shares a fate with. */
static void spread_failure(dt_comm *c)
{
    char text[DT_ERROR_MAX];
    pthread_mutex_lock(&c->mu);
    dt_group *g = c->group;
    dt_status st = c->fail_status;
    snprintf(text, sizeof text, "%s", c->error);
    pthread_mutex_unlock(&c->mu);
    if (g->detached)
        return;
    dt_comm *top = c;
    while (st == DT_EPEER && top->group->parent)
        top = top->group->parent;
    fail_subtree(top, c, st, text);
}

/* Under the family lock of c's groups, so that the first failure among
 * them reaches all the others before any of them records its own.
 * Spreading touches c after record_failure let go of its mutex; that is
 * safe because dt_comm_destroy detaches c under the same family lock first. */
void comm_failv(dt_comm *c, dt_status st, const char *fmt, va_list ap)
{
    group_family *family = lock_family(c);
    if (record_failure(c, st, fmt, ap) && family)
        spread_failure(c);
    unlock_family(family);
}

void comm_fail(dt_comm *c, dt_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    comm_failv(c, st, fmt, ap);
    va_end(ap);
}

void comm_fail_member(dt_comm *c, dt_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record_failure(c, st, fmt, ap);
    va_end(ap);
}

/* ---- failures held back from a later op ----------------------------------------- */

bool comm_fail_deferred_locked(dt_comm *c)
{
    if (!c->tp.fail_deferred)
        return false;
    c->tp.fail_deferred = false;
    if (c->failed)
        return false;
    c->failed = true;
    c->fail_status = c->tp.deferred_status;
    snprintf(c->error, sizeof c->error, "%s", c->tp.deferred_error);
    c->tp.want_fail = true;
    pthread_cond_broadcast(&c->cv_api);
    return true;
}

void comm_fail_deferred(dt_comm *c)
{
    pthread_mutex_lock(&c->mu);
    if (comm_fail_deferred_locked(c))
        comm_wake_thread(c);
    pthread_mutex_unlock(&c->mu);
}

bool comm_fail_in_op_locked(const dt_comm *c)
{
    return c->in_op;
}

dt_status comm_fail_status_locked(const dt_comm *c, char *why, size_t n)
{
    if (n > 0)
        snprintf(why, n, "%s", c->failed ? c->error : "");
    return c->failed ? c->fail_status : DT_OK;
}

uint64_t comm_fail_first_unfinished_locked(const dt_comm *c)
{
    if (c->in_op)
        return c->cur_seq;
    return c->q_head ? c->q_head->seq : c->next_seq;
}
