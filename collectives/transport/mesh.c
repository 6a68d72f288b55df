/*
 * mesh.c — the connections' life: dial, accept, fail, shut down; and the
 * loop's own timers and wake-ups.
 *
 * Mesh rule: the higher rank dials, the lower rank accepts, so each pair
 * has exactly one connection. A connection is "pending" until its handshake
 * (handshake.c, fed by transport_read.c's reader) proves who is on the
 * other end; then the reader makes it tp->peers[rank] and it carries
 * frames (transport.c writes them).
 * Closing one, and letting go of its transfers, is conn.c's. A dial that is
 * refused is retried every 100 ms until the init deadline: a peer may have
 * published its address a moment before it listens on another interface.
 *
 * Failure: the first failure is recorded by the communicator (report.h's
 * fail, which asks the loop for this through want_fail); the loop then lets go
 * of every posted receive, sends each peer an ABORT frame carrying the
 * reason, and closes every connection after FAIL_GRACE_S, which also
 * cancels sends still in flight (their write callbacks release them).
 * Shutdown: BYE to every peer, a TCP shutdown (FIN after the last byte), and
 * a close once the peer has acknowledged every byte (the ticker asks the
 * kernel, SIOCOUTQ), or a forced one after SHUTDOWN_GRACE_S if a peer does
 * not read. Not at once: a peer's heartbeat may be unread in our socket,
 * and closing a socket with unread data resets the connection, which would
 * throw away what the peer has not read of ours yet.
 *
 * comm_mesh_start makes the loop, its timers and the listener (none on
 * the gloo wire, whose connections are gloo's own: the communicator says
 * whether to listen); comm_thread.c then starts the thread that runs it,
 * and joins it before comm_mesh_stop closes the loop. The transport's state
 * (dt_transport, transport.h) is set up and freed here too.
 *
 * The ticker (every TICK_MS) drives handshake deadlines, redials, the
 * forced closes, heartbeats and the liveness check (heartbeat.c), and bounds how long the communicator thread sleeps in the
 * loop before it checks an op's deadline again.
 *
 * Cost: p-1 connections per rank, one handshake each, once.
 */
#include <linux/sockios.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include "conn.h"

#define TICK_MS 20
#define HANDSHAKE_TIMEOUT_S 10.0
#define FAIL_GRACE_S 0.5
#define SHUTDOWN_GRACE_S 2.0

static void close_pending(dt_transport *t);

/* ---- failure and shutdown -------------------------------------------------- */

/* Let go of every receive, tell the peers why, close after a grace period. */
static void io_fail_cleanup(dt_transport *t)
{
    if (t->io_failed_done)
        return;
    t->io_failed_done = true;
    char text[sizeof(((dt_conn *)0)->notice)];
    uint32_t st;
    pthread_mutex_lock(t->mu);
    st = (uint32_t)t->report->failure_locked(t->owner, text + 4, sizeof text - 4);
    uint64_t unfinished = t->report->first_unfinished_locked(t->owner);
    pthread_mutex_unlock(t->mu);
    memcpy(text, &st, 4);
    for (int p = 0; p < t->size; p++) {
        dt_conn *cn = t->peers[p];
        if (!cn)
            continue;
        cn->rx_state = RX_STOPPED;
        comm_transport_read_set(cn, false);
        if (cn->rx_cur)
            comm_conn_release_xfer(t, cn->rx_cur, XFER_FAILED);
        cn->rx_cur = NULL;
        comm_conn_release_list(t, cn->coll_head);
        cn->coll_head = cn->coll_tail = NULL;
        comm_conn_release_list(t, cn->failed_sends);
        cn->failed_sends = NULL;
        comm_transport_send_control(cn, FRAME_ABORT, unfinished, text, 4 + strlen(text + 4));
    }
    comm_conn_release_list(t, t->p2p_head);
    t->p2p_head = t->p2p_tail = NULL;
    close_pending(t);
    t->close_at = dt_now() + FAIL_GRACE_S;
}

static void close_pending(dt_transport *t)
{
    for (dt_conn *cn = t->pending, *next; cn; cn = next) {
        next = cn->next;
        comm_conn_close(cn);
    }
}

static void on_shutdown_done(uv_shutdown_t *req, int status)
{
    dt_conn *cn = req->data;
    free(req);
    if (status < 0)
        comm_conn_close(cn);
    else
        cn->shut_down = true; /* closed once the peer has it all (close_shut_down) */
}

/* Close each shut-down connection whose bytes, FIN included, the peer has
 * acknowledged: a reset from here can then cost it nothing. */
static void close_shut_down(dt_transport *t)
{
    for (int p = 0; p < t->size && t->peers; p++) {
        dt_conn *cn = t->peers[p];
        uv_os_fd_t fd;
        int unacked = 0;
        if (!cn || !cn->shut_down || cn->closing)
            continue;
        if (uv_fileno((uv_handle_t *)&cn->tcp, &fd) != 0 || ioctl(fd, SIOCOUTQ, &unacked) != 0 ||
            unacked == 0)
            comm_conn_close(cn);
    }
}

static void io_shutdown(dt_transport *t)
{
    if (t->io_shutdown)
        return;
    t->io_shutdown = true;
    for (int p = 0; p < t->size; p++) {
        dt_conn *cn = t->peers[p];
        if (!cn)
            continue;
        if (cn->rx_cur)
            comm_conn_release_xfer(t, cn->rx_cur, XFER_FAILED);
        cn->rx_cur = NULL;
        if (cn->rx_state == RX_PAYLOAD) { /* its buffer is gone: read no more */
            cn->rx_state = RX_STOPPED;
            comm_transport_read_set(cn, false);
        }
        comm_conn_release_list(t, cn->coll_head);
        cn->coll_head = cn->coll_tail = NULL;
        if (cn->closing)
            continue;
        comm_transport_send_control(cn, FRAME_BYE, 0, NULL, 0);
        uv_shutdown_t *req = malloc(sizeof *req);
        if (req)
            req->data = cn;
        if (!req || uv_shutdown(req, (uv_stream_t *)&cn->tcp, on_shutdown_done) < 0) {
            free(req);
            comm_conn_close(cn);
        }
    }
    comm_conn_release_list(t, t->p2p_head);
    t->p2p_head = t->p2p_tail = NULL;
    close_pending(t);
    if (t->listener_open) {
        t->listener_open = false;
        uv_close((uv_handle_t *)&t->listener, NULL);
    }
    double by = dt_now() + SHUTDOWN_GRACE_S;
    if (t->close_at == 0 || t->close_at > by)
        t->close_at = by;
}

static void close_all_conns(dt_transport *t)
{
    for (int p = 0; p < t->size; p++)
        if (t->peers[p])
            comm_conn_close(t->peers[p]);
    close_pending(t);
}

/* ---- connecting ------------------------------------------------------------ */

static dt_conn *conn_new(dt_transport *t)
{
    dt_conn *cn = calloc(1, sizeof *cn);
    if (!cn)
        return NULL;
    cn->tp = t;
    cn->peer = -1;
    cn->expect_peer = -1;
    cn->tcp.data = cn;
    cn->next = t->pending;
    t->pending = cn;
    return cn;
}

/* No Nagle delay for the small frames; keepalive so a silent peer is
 * noticed (tightened once authenticated: comm_conn_watch_liveness); socket
 * buffers left to Linux's autotuning unless asked for, since autotuning (up
 * to net.ipv4.tcp_rmem's maximum) beat every fixed size on loopback: 64 MiB
 * all-reduce on 4 ranks, busbw 0.86-0.91 GB/s against 0.66-0.79 with 4 MiB
 * and 0.72-0.77 with 256 KiB, measured side by side. */
static void tune_socket(dt_transport *t, dt_conn *cn)
{
    uv_tcp_nodelay(&cn->tcp, 1);
    uv_tcp_keepalive(&cn->tcp, 1, 10);
    if (t->socket_buffer == 0)
        return;
    int size = (int)t->socket_buffer;
    uv_send_buffer_size((uv_handle_t *)&cn->tcp, &size);
    size = (int)t->socket_buffer;
    uv_recv_buffer_size((uv_handle_t *)&cn->tcp, &size);
}

static void format_addr(const struct sockaddr *sa, char *out, size_t n)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const void *)sa;
        uv_ip4_name(in, ip, sizeof ip);
        port = ntohs(in->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const void *)sa;
        uv_ip6_name(in6, ip, sizeof ip);
        port = ntohs(in6->sin6_port);
    }
    snprintf(out, n, "%s:%d", ip, port);
}

static void on_connected(uv_connect_t *req, int status)
{
    dt_conn *cn = req->data;
    dt_transport *t = cn->tp;
    if (cn->closing)
        return;
    if (status < 0) {
        /* Not listening yet, or a transient refusal: dial again soon. */
        cn->retry_at = dt_now() + 0.1;
        cn->rx_state = RX_STOPPED;
        comm_conn_close(cn);
        dt_conn *again = conn_new(t);
        if (!again) {
            t->report->fail(t->owner, DT_ENOMEM, "rank %d: out of memory", t->rank);
            return;
        }
        again->outgoing = true;
        again->expect_peer = cn->expect_peer;
        again->dial_addr = cn->dial_addr;
        again->retry_at = cn->retry_at;
        again->deadline = cn->deadline;
        snprintf(again->addr, sizeof again->addr, "%s", cn->addr);
        return;
    }
    tune_socket(t, cn);
    comm_handshake_start_outgoing(cn);
    comm_transport_read_set(cn, true); /* the reader hands it the replies */
}

static void io_dial(dt_conn *cn)
{
    dt_transport *t = cn->tp;
    cn->retry_at = 0;
    uv_tcp_init(&t->loop, &cn->tcp);
    cn->has_handle = true;
    t->open_handles++;
    cn->connect_req.data = cn;
    int rc = uv_tcp_connect(&cn->connect_req, &cn->tcp, (struct sockaddr *)&cn->dial_addr,
                            on_connected);
    if (rc < 0) {
        t->report->fail(t->owner, DT_ESYS, "rank %d: connecting to rank %d (%s): %s", t->rank,
                        cn->expect_peer, cn->addr, uv_strerror(rc));
        comm_conn_close(cn);
    }
}

static void io_connect_all(dt_transport *t)
{
    double deadline = dt_now() + t->init_timeout_s;
    for (int j = 0; j < t->rank; j++) {
        dt_conn *cn = conn_new(t);
        if (!cn) {
            t->report->fail(t->owner, DT_ENOMEM, "rank %d: out of memory", t->rank);
            return;
        }
        cn->outgoing = true;
        cn->expect_peer = j;
        cn->dial_addr = t->dial[j];
        cn->deadline = deadline;
        format_addr((struct sockaddr *)&cn->dial_addr, cn->addr, sizeof cn->addr);
        io_dial(cn);
    }
}

static void on_connection(uv_stream_t *server, int status)
{
    dt_transport *t = server->data;
    if (status < 0)
        return;
    dt_conn *cn = conn_new(t);
    if (!cn)
        return;
    uv_tcp_init(&t->loop, &cn->tcp);
    cn->has_handle = true;
    t->open_handles++;
    if (uv_accept(server, (uv_stream_t *)&cn->tcp) < 0) {
        comm_conn_close(cn);
        return;
    }
    struct sockaddr_storage sa;
    int len = sizeof sa;
    if (uv_tcp_getpeername(&cn->tcp, (struct sockaddr *)&sa, &len) == 0)
        format_addr((struct sockaddr *)&sa, cn->addr, sizeof cn->addr);
    if (t->io_shutdown || t->io_failed_done) {
        comm_conn_close(cn);
        return;
    }
    tune_socket(t, cn);
    cn->deadline = dt_now() + HANDSHAKE_TIMEOUT_S;
    comm_handshake_start_incoming(cn);
    comm_transport_read_set(cn, true);
}

/* ---- the loop's wake-ups ----------------------------------------------------- */

static void on_tick(uv_timer_t *timer)
{
    dt_transport *t = timer->data;
    double now = dt_now();
    for (dt_conn *cn = t->pending, *next; cn; cn = next) {
        next = cn->next;
        if (cn->closing)
            continue;
        if (cn->retry_at > 0 && now >= cn->retry_at && !t->io_failed_done) {
            if (now >= cn->deadline)
                t->report->fail(t->owner, DT_ETIMEDOUT,
                                "rank %d: could not connect to rank %d at %s "
                                "within %.1f s",
                                t->rank, cn->expect_peer, cn->addr, t->init_timeout_s);
            else
                io_dial(cn);
        } else if (cn->retry_at == 0 && now >= cn->deadline) {
            if (cn->outgoing)
                t->report->fail(t->owner, DT_ETIMEDOUT,
                                "rank %d: handshake with rank %d at %s did not "
                                "finish in time",
                                t->rank, cn->expect_peer, cn->addr);
            else
                comm_handshake_reject(cn, "handshake not completed within %.0f s",
                                      HANDSHAKE_TIMEOUT_S);
        }
    }
    if (t->close_at > 0 && now >= t->close_at)
        close_all_conns(t);
    comm_heartbeat_tick(t, now);
    close_shut_down(t);
    comm_reject_log_tick(t);
    comm_conn_maybe_finish(t);
}

static void on_wake(uv_async_t *a)
{
    dt_transport *t = a->data;
    pthread_mutex_lock(t->mu);
    dt_xfer *list = t->inbox_head;
    t->inbox_head = t->inbox_tail = NULL;
    bool connect = t->want_connect, fail = t->want_fail;
    t->want_connect = false;
    pthread_mutex_unlock(t->mu);
    if (connect && !t->io_failed_done)
        io_connect_all(t);
    if (fail)
        io_fail_cleanup(t);
    while (list) {
        dt_xfer *x = list;
        list = x->next;
        comm_transport_io_post(t, x);
    }
    comm_conn_maybe_finish(t);
}

/* Called by the communicator thread as it exits: say BYE, close everything,
 * and run the loop until the last handle is closed. */
void comm_mesh_shutdown(dt_transport *t)
{
    pthread_mutex_lock(t->mu);
    bool failed = t->report->failure_locked(t->owner, NULL, 0) != DT_OK;
    pthread_mutex_unlock(t->mu);
    /* A failure the loop has not acted on yet (dt_comm_abort, then at once
     * dt_comm_destroy): its ABORT frames go out before the BYEs, so peers
     * learn the reason rather than "destroyed its communicator". */
    if (failed)
        io_fail_cleanup(t);
    io_shutdown(t);
    comm_conn_maybe_finish(t);
    uv_run(&t->loop, UV_RUN_DEFAULT);
}

/* ---- start and stop (API thread) ------------------------------------------- */

static dt_status bind_listener(dt_transport *t)
{
    struct sockaddr_storage sa;
    int rc = uv_ip4_addr(t->host, 0, (struct sockaddr_in *)&sa);
    if (rc < 0)
        rc = uv_ip6_addr(t->host, 0, (struct sockaddr_in6 *)&sa);
    if (rc < 0) {
        t->report->fail(t->owner, DT_EINVAL, "rank %d: host '%s' is not an IPv4 or IPv6 address",
                        t->rank, t->host);
        return DT_EINVAL;
    }
    uv_tcp_init(&t->loop, &t->listener);
    t->listener.data = t;
    t->listener_open = true;
    rc = uv_tcp_bind(&t->listener, (struct sockaddr *)&sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&t->listener, 128, on_connection);
    if (rc < 0) {
        t->report->fail(t->owner, DT_ESYS, "rank %d: cannot listen on %s: %s", t->rank, t->host,
                        uv_strerror(rc));
        return DT_ESYS;
    }
    int len = sizeof sa;
    uv_tcp_getsockname(&t->listener, (struct sockaddr *)&sa, &len);
    t->port = ntohs(sa.ss_family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port
                                            : ((struct sockaddr_in6 *)&sa)->sin6_port);
    return DT_OK;
}

dt_status comm_mesh_start(dt_transport *t, bool listen)
{
    int rc = uv_loop_init(&t->loop);
    if (rc < 0) {
        t->report->fail(t->owner, DT_ESYS, "rank %d: uv_loop_init: %s", t->rank, uv_strerror(rc));
        return DT_ESYS;
    }
    t->loop_ready = true;
    uv_async_init(&t->loop, &t->wake, on_wake);
    t->wake.data = t;
    uv_timer_init(&t->loop, &t->ticker);
    t->ticker.data = t;
    uv_timer_start(&t->ticker, on_tick, TICK_MS, TICK_MS);
    /* gloo's wire listens per pair (gloo/pair.c), and only there */
    return t->size > 1 && listen ? bind_listener(t) : DT_OK;
}

void comm_mesh_connect(dt_transport *t)
{
    pthread_mutex_lock(t->mu);
    t->want_connect = true;
    pthread_mutex_unlock(t->mu);
    t->report->wake_thread(t->owner);
}

static void close_any(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* The loop's thread has ended (comm_thread.c joined it). Normally every
 * handle is closed by now; if the thread never ran, close what start
 * created and let the loop finish the closes. */
void comm_mesh_stop(dt_transport *t)
{
    if (!t->loop_ready)
        return;
    uv_walk(&t->loop, close_any, NULL);
    uv_run(&t->loop, UV_RUN_DEFAULT);
    uv_loop_close(&t->loop);
    t->loop_ready = false;
}

void comm_transport_wake_loop(dt_transport *t)
{
    if (atomic_load(&t->io_running))
        uv_async_send(&t->wake);
}

/* ---- the transport's state (API thread) ------------------------------------ */

void comm_transport_init(dt_transport *t, dt_comm *owner, const comm_report *report,
                         pthread_mutex_t *mu, pthread_cond_t *cv_api)
{
    t->owner = owner;
    t->report = report;
    t->mu = mu;
    t->cv_api = cv_api;
    atomic_init(&t->io_running, false);
    atomic_init(&t->rejected, 0);
    for (int i = 0; i < 4; i++)
        atomic_init(&t->traffic[i], 0);
}

dt_status comm_transport_alloc(dt_transport *t)
{
    t->peers = calloc((size_t)t->size, sizeof *t->peers);
    t->dial = calloc((size_t)t->size, sizeof *t->dial);
    t->peer_addr = calloc((size_t)t->size, sizeof *t->peer_addr);
    t->sent_index = calloc((size_t)t->size, sizeof *t->sent_index);
    t->recv_index = calloc((size_t)t->size, sizeof *t->recv_index);
    return t->peers && t->dial && t->peer_addr && t->sent_index && t->recv_index ? DT_OK
                                                                                 : DT_ENOMEM;
}

void comm_transport_free(dt_transport *t)
{
    for (int i = 0; i < 2; i++)
        free(t->scratch[i]);
    free(t->peers);
    free(t->dial);
    free(t->peer_addr);
    free(t->sent_index);
    free(t->recv_index);
    sodium_memzero(t->key, sizeof t->key);
}
