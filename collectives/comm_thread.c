/*
 * comm_thread.c — who runs the loop: the communicator's own thread, or the
 * caller of a blocking collective or of a tagged send or receive.
 *
 * The libuv loop may be run by one thread at a time; `loop_busy` (under
 * mu) says one is. Three kinds of thread take it:
 *
 *   the communicator thread  runs queued ops (async submissions, and
 *                            blocking ones that found the loop taken), and
 *                            runs the loop while something needs it: p2p
 *                            transfers in flight, init's handshakes, a
 *                            failure being cleaned up, work in the inbox.
 *                            With nothing to do it sleeps on cv_thread and
 *                            polls the loop every IDLE_POLL_S, so strangers
 *                            are rejected and dead peers noticed between
 *                            ops too.
 *   the caller of dt_run     when nothing is queued and the loop is free,
 *                            runs the collective itself, start to finish.
 *   the caller of a tagged   when the loop is free and the inbox empty,
 *   send or receive          posts it and turns the loop once without
 *                            blocking (comm_thread_post_p2p); the rest of
 *                            the transfer is the communicator thread's.
 *
 * Why the second: a blocking collective handed to another thread costs two
 * wake-ups (submit, then completion) on top of the ones the network needs.
 * With 4 ranks on 2 cores each wake-up can wait for a time slice, which
 * made a 4-byte all-reduce several times slower than its two network round
 * trips. Running it inline costs nothing extra; ordering is kept because it
 * only happens when no submitted op is queued or running.
 *
 * comm_thread_start makes the loop and the listener (mesh.c), then the
 * thread; comm_thread_stop joins it, and comm_mesh_stop then closes the
 * loop.
 *
 * SIGPIPE: a write to a socket the peer has reset raises it, and its
 * default action kills the process. Both loop runners block it while they
 * run (the caller only for the duration of the op, consuming any SIGPIPE
 * its writes caused before unblocking), so a dead peer is an EPIPE error,
 * never a crash, and the application's own signal handling is untouched.
 * Any write can raise it: a collective's, an ABORT's, or a handshake reply
 * to a stranger that reset its connection. A program that ignores SIGPIPE
 * (as dtrain-bench does, and most servers) spares each inline op the mask
 * calls: one sigaction query says so, and EPIPE is all a write can
 * produce then.
 */
#include <signal.h>
#include <time.h>

#include "comm_internal.h"

#define IDLE_POLL_S 0.05

/* Does the loop have to run now (with mu held)? */
static bool loop_needed(const dt_comm *c)
{
    return c->q_head || c->p2p_outstanding > 0 || c->tp.inbox_head || c->tp.want_fail ||
           c->tp.want_connect || !c->init_done || c->failed;
}

static void block_sigpipe(sigset_t *old)
{
    sigset_t pipe_only;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_only, old);
}

/* Undo block_sigpipe, first consuming a SIGPIPE our writes left pending. */
static void restore_sigpipe(const sigset_t *old)
{
    if (sigismember(old, SIGPIPE))
        return; /* it was blocked before us */
    sigset_t pending, pipe_only;
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
        struct timespec zero = {0, 0};
        sigemptyset(&pipe_only);
        sigaddset(&pipe_only, SIGPIPE);
        sigtimedwait(&pipe_only, NULL, &zero);
    }
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* Is SIGPIPE ignored right now? Then a write can only give EPIPE. Asked
 * per op, since the program may change its mind at any time. */
static bool sigpipe_ignored(void)
{
    struct sigaction now;
    return sigaction(SIGPIPE, NULL, &now) == 0 && now.sa_handler == SIG_IGN;
}

static void run_queued(dt_comm *c, dt_work *w)
{
    pthread_mutex_lock(&c->mu);
    bool failed = c->failed;
    dt_status st = c->fail_status;
    pthread_mutex_unlock(&c->mu);
    if (!failed)
        st = comm_executor_run(c, w);
    pthread_mutex_lock(&c->mu);
    c->in_op = false;
    if (!w->in_flight) /* a gloo send/recv completes later (p2p_gloo.c) */
        comm_wake_work_done(w, st);
    bool kick = comm_fail_deferred_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (kick)
        comm_wake_thread(c);
}

/* With mu held and the loop free: take it, and the next op if any. */
static dt_work *take_loop(dt_comm *c)
{
    c->loop_busy = true;
    dt_work *w = c->q_head;
    if (w) {
        c->q_head = w->next;
        if (!c->q_head)
            c->q_tail = NULL;
        c->in_op = true;
        c->cur_kind = w->op.kind;
        c->cur_seq = w->seq;
    }
    return w;
}

static void thread_main(void *arg)
{
    dt_comm *c = arg;
    sigset_t ignored;
    block_sigpipe(&ignored);
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (c->loop_busy) {
            c->thread_awaits_loop = true;
            pthread_cond_wait(&c->cv_thread, &c->mu);
        }
        c->thread_awaits_loop = false;
        /* a peer's failure held back (transport_read.c) while no op runs here */
        if (c->tp.fail_deferred && dt_now() >= c->tp.deferred_until && comm_fail_deferred_locked(c))
            comm_wake_thread(c);
        if (c->stopping && !c->q_head)
            break;
        bool needed = loop_needed(c);
        if (!needed) {
            comm_wake_wait_until(&c->cv_thread, &c->mu, dt_now() + IDLE_POLL_S);
            if (c->loop_busy || (c->stopping && !c->q_head))
                continue;
            needed = loop_needed(c);
        }
        dt_work *w = take_loop(c);
        /* we own the loop now; with gloo sends/recvs in flight, wait on that
         * wire until it moves or comm_wake_thread wakes it (p2p_gloo.c) */
        const bool gloo_p2p = !w && c->init_done && c->gloo && c->gloo_p2p;
        if (gloo_p2p)
            atomic_store(&c->gloo_turn, true);
        pthread_mutex_unlock(&c->mu);
        if (w)
            run_queued(c, w);
        else if (gloo_p2p)
            comm_gloo_p2p_progress(c);
        else
            uv_run(&c->tp.loop, needed ? UV_RUN_ONCE : UV_RUN_NOWAIT);
        pthread_mutex_lock(&c->mu);
        atomic_store(&c->gloo_turn, false);
        c->loop_busy = false;
    }
    c->loop_busy = true;
    pthread_mutex_unlock(&c->mu);
    comm_mesh_shutdown(&c->tp);
}

/* A caller that ran the loop hands it back (c->mu held; released here): a
 * deferred failure is failed now, and the communicator thread is woken
 * only if it waits for the loop or has work: an idle one wakes on its own
 * poll, and a needless wake-up per op is a context switch the next op's
 * latency pays for. */
static void loop_release_unlock(dt_comm *c)
{
    bool kick = comm_fail_deferred_locked(c);
    c->loop_busy = false;
    bool wake = c->thread_awaits_loop || loop_needed(c) || c->stopping;
    pthread_mutex_unlock(&c->mu);
    if (kick)
        comm_wake_thread(c);
    else if (wake)
        pthread_cond_signal(&c->cv_thread);
}

bool comm_thread_run_inline(dt_comm *c, dt_work *w, dt_status *st)
{
    pthread_mutex_lock(&c->mu);
    if (c->loop_busy || loop_needed(c) || c->stopping) {
        pthread_mutex_unlock(&c->mu);
        return false;
    }
    c->loop_busy = true;
    w->seq = c->next_seq++;
    c->in_op = true;
    c->cur_kind = w->op.kind;
    c->cur_seq = w->seq;
    pthread_mutex_unlock(&c->mu);

    if (sigpipe_ignored()) {
        *st = comm_executor_run(c, w);
    } else {
        sigset_t old;
        block_sigpipe(&old);
        *st = comm_executor_run(c, w);
        restore_sigpipe(&old);
    }

    pthread_mutex_lock(&c->mu);
    c->in_op = false;
    loop_release_unlock(c);
    return true;
}

/*
 * A tagged send or receive, posted by the caller itself when the loop is
 * free and nothing waits for it (no queued op, nothing in the inbox, so
 * the transport sees transfers in the order they were submitted): the
 * frame is written, or the receive matched to a frame that already
 * arrived and its payload read, before dt_submit returns — the hand-off to
 * the communicator thread and back, which a pipeline stage otherwise pays
 * at every receive even when the data is there, is gone. Whatever is left
 * in flight is the communicator thread's, woken for it.
 */
void comm_thread_post_p2p(dt_comm *c, dt_xfer *x)
{
    pthread_mutex_lock(&c->mu);
    if (c->loop_busy || c->q_head || c->tp.inbox_head || c->stopping || !c->init_done ||
        c->failed || c->tp.want_fail || c->tp.want_connect) {
        pthread_mutex_unlock(&c->mu);
        comm_transport_post(&c->tp, x);
        return;
    }
    c->loop_busy = true;
    pthread_mutex_unlock(&c->mu);

    bool ignored = sigpipe_ignored();
    sigset_t old;
    if (!ignored)
        block_sigpipe(&old);
    comm_transport_post_here(&c->tp, x);
    uv_run(&c->tp.loop, UV_RUN_NOWAIT);
    if (!ignored)
        restore_sigpipe(&old);

    pthread_mutex_lock(&c->mu);
    loop_release_unlock(c);
}

/* The loop and the listener (mesh.c), then the thread that runs them. A
 * listener that failed still gets its thread (its failure is recorded),
 * so that dt_comm_destroy stops both the same way. */
dt_status comm_thread_start(dt_comm *c)
{
    dt_status st = comm_mesh_start(&c->tp, !c->gloo_wire);
    if (!c->tp.loop_ready)
        return st;
    atomic_store(&c->tp.io_running, true); /* before the thread can fail anything */
    int rc = uv_thread_create(&c->thread, thread_main, c);
    if (rc < 0) {
        atomic_store(&c->tp.io_running, false);
        comm_fail(c, DT_ESYS, "rank %d: cannot start the communicator thread: %s", c->rank,
                  uv_strerror(rc));
        return DT_ESYS;
    }
    return st;
}

/* dt_comm_destroy: the thread ends once the queue is empty, saying BYE and
 * closing the mesh on its way out (thread_main). */
void comm_thread_stop(dt_comm *c)
{
    if (!atomic_load(&c->tp.io_running))
        return;
    pthread_mutex_lock(&c->mu);
    c->stopping = true;
    pthread_mutex_unlock(&c->mu);
    comm_wake_thread(c);
    uv_thread_join(&c->thread);
    /* under mu: a comm_wake_thread made under mu (a failure being recorded
     * on another thread) then never wakes a loop that is closing */
    pthread_mutex_lock(&c->mu);
    atomic_store(&c->tp.io_running, false);
    pthread_mutex_unlock(&c->mu);
}
