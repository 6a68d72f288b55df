/*
 * wake.c — how a communicator's threads wake each other: the communicator
 * thread (its condition variable, the loop's async handle when the loop
 * may be asleep in epoll, and on the gloo wire the gloo context's when the
 * thread waits there for sends and receives in flight), the API threads
 * waiting on a work handle (cv_api), and waits with a deadline.
 *
 * The loop's own wake-up is the transport's (comm_transport_wake_loop);
 * the transport reaches the two it needs of this file, a thread woken and
 * a work handle done, through report.h's table.
 *
 * Every file that changes what another thread should do ends with one of
 * these calls; none of them takes a lock, so each may be made with `mu`
 * held (comm_failv does, so that nothing touches the communicator after a
 * failure is published) or not, as the caller's comment says.
 * Cost: a futex wake-up, plus an eventfd write while the loop runs.
 */
#include <time.h>

#include "comm_internal.h"

void comm_wake_thread(dt_comm *c)
{
    pthread_cond_signal(&c->cv_thread);
    comm_transport_wake_loop(&c->tp);
    /* set only while the thread holds the gloo context, which outlives it */
    if (atomic_load(&c->gloo_turn))
        uv_async_send(c->gloo_waker);
}

void comm_wake_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, double deadline)
{
    struct timespec ts;
    double whole = (double)(long long)deadline;
    ts.tv_sec = (time_t)whole;
    ts.tv_nsec = (long)((deadline - whole) * 1e9);
    pthread_cond_timedwait(cv, mu, &ts);
}

void comm_wake_work_done(dt_work *w, dt_status st)
{
    w->status = st;
    w->done = true;
    if (w->op.kind == DT_OP_SEND || w->op.kind == DT_OP_RECV)
        w->comm->p2p_outstanding--;
    pthread_cond_broadcast(&w->comm->cv_api);
}
