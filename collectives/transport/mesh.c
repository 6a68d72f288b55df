/*
 * mesh.c — the connections' life: dial, accept, fail, shut down; and the
 * loop's own timers and wake-ups.
 *
 * Mesh rule: the higher rank dials, the lower rank accepts, so each pair
 * has exactly one connection. A connection is "pending" until its handshake
 * (handshake.c, fed by transport_read.c's reader) proves who is on the
 * other end; then the reader makes it comm->peers[rank] and it carries
 * frames (transport.c writes them).
 * Closing one, and letting go of its transfers, is conn.c's. A dial that is
 * refused is retried every 100 ms until the init deadline: a peer may have
 * published its address a moment before it listens on another interface.
 *
 * Failure: the first failure is recorded by comm_fail; the loop then lets go
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
 * the gloo wire, whose connections are gloo's own); comm_thread.c then
 * starts the thread that runs it.
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

#include "comm_internal.h"

#define TICK_MS 20
#define HANDSHAKE_TIMEOUT_S 10.0
#define FAIL_GRACE_S 0.5
#define SHUTDOWN_GRACE_S 2.0

static void close_pending(dt_comm *c);

/* ---- failure and shutdown -------------------------------------------------- */

/* Let go of every receive, tell the peers why, close after a grace period. */
static void io_fail_cleanup(dt_comm *c)
{
    if (c->io_failed_done)
        return;
    c->io_failed_done = true;
    char text[sizeof(((dt_conn *)0)->notice)];
    uint32_t st;
    pthread_mutex_lock(&c->mu);
    st = c->fail_status;
    uint64_t unfinished = c->report->first_unfinished_locked(c);
    snprintf(text + 4, sizeof text - 4, "%s", c->error);
    pthread_mutex_unlock(&c->mu);
    memcpy(text, &st, 4);
    for (int p = 0; p < c->size; p++) {
        dt_conn *cn = c->peers[p];
        if (!cn)
            continue;
        cn->rx_state = RX_STOPPED;
        comm_transport_read_set(cn, false);
        if (cn->rx_cur)
            comm_conn_release_xfer(c, cn->rx_cur, XFER_FAILED);
        cn->rx_cur = NULL;
        comm_conn_release_list(c, cn->coll_head);
        cn->coll_head = cn->coll_tail = NULL;
        comm_conn_release_list(c, cn->failed_sends);
        cn->failed_sends = NULL;
        comm_transport_send_control(cn, FRAME_ABORT, unfinished, text, 4 + strlen(text + 4));
    }
    comm_conn_release_list(c, c->p2p_head);
    c->p2p_head = c->p2p_tail = NULL;
    close_pending(c);
    c->close_at = dt_now() + FAIL_GRACE_S;
}

static void close_pending(dt_comm *c)
{
    for (dt_conn *cn = c->pending, *next; cn; cn = next) {
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
static void close_shut_down(dt_comm *c)
{
    for (int p = 0; p < c->size && c->peers; p++) {
        dt_conn *cn = c->peers[p];
        uv_os_fd_t fd;
        int unacked = 0;
        if (!cn || !cn->shut_down || cn->closing)
            continue;
        if (uv_fileno((uv_handle_t *)&cn->tcp, &fd) != 0 || ioctl(fd, SIOCOUTQ, &unacked) != 0 ||
            unacked == 0)
            comm_conn_close(cn);
    }
}

static void io_shutdown(dt_comm *c)
{
    if (c->io_shutdown)
        return;
    c->io_shutdown = true;
    for (int p = 0; p < c->size; p++) {
        dt_conn *cn = c->peers[p];
        if (!cn)
            continue;
        if (cn->rx_cur)
            comm_conn_release_xfer(c, cn->rx_cur, XFER_FAILED);
        cn->rx_cur = NULL;
        if (cn->rx_state == RX_PAYLOAD) { /* its buffer is gone: read no more */
            cn->rx_state = RX_STOPPED;
            comm_transport_read_set(cn, false);
        }
        comm_conn_release_list(c, cn->coll_head);
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
    comm_conn_release_list(c, c->p2p_head);
    c->p2p_head = c->p2p_tail = NULL;
    close_pending(c);
    if (c->listener_open) {
        c->listener_open = false;
        uv_close((uv_handle_t *)&c->listener, NULL);
    }
    double t = dt_now() + SHUTDOWN_GRACE_S;
    if (c->close_at == 0 || c->close_at > t)
        c->close_at = t;
}

static void close_all_conns(dt_comm *c)
{
    for (int p = 0; p < c->size; p++)
        if (c->peers[p])
            comm_conn_close(c->peers[p]);
    close_pending(c);
}

/* ---- connecting ------------------------------------------------------------ */

static dt_conn *conn_new(dt_comm *c)
{
    dt_conn *cn = calloc(1, sizeof *cn);
    if (!cn)
        return NULL;
    cn->comm = c;
    cn->peer = -1;
    cn->expect_peer = -1;
    cn->tcp.data = cn;
    cn->next = c->pending;
    c->pending = cn;
    return cn;
}

/* No Nagle delay for the small frames; keepalive so a silent peer is
 * noticed (tightened once authenticated: comm_conn_watch_liveness); socket
 * buffers left to Linux's autotuning unless asked for, since autotuning (up
 * to net.ipv4.tcp_rmem's maximum) beat every fixed size on loopback: 64 MiB
 * all-reduce on 4 ranks, busbw 0.86-0.91 GB/s against 0.66-0.79 with 4 MiB
 * and 0.72-0.77 with 256 KiB, measured side by side. */
static void tune_socket(dt_comm *c, dt_conn *cn)
{
    uv_tcp_nodelay(&cn->tcp, 1);
    uv_tcp_keepalive(&cn->tcp, 1, 10);
    if (c->socket_buffer == 0)
        return;
    int size = (int)c->socket_buffer;
    uv_send_buffer_size((uv_handle_t *)&cn->tcp, &size);
    size = (int)c->socket_buffer;
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
    dt_comm *c = cn->comm;
    if (cn->closing)
        return;
    if (status < 0) {
        /* Not listening yet, or a transient refusal: dial again soon. */
        cn->retry_at = dt_now() + 0.1;
        cn->rx_state = RX_STOPPED;
        comm_conn_close(cn);
        dt_conn *again = conn_new(c);
        if (!again) {
            c->report->fail(c, DT_ENOMEM, "rank %d: out of memory", c->rank);
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
    tune_socket(c, cn);
    comm_handshake_start_outgoing(cn);
    comm_transport_read_set(cn, true); /* the reader hands it the replies */
}

static void io_dial(dt_conn *cn)
{
    dt_comm *c = cn->comm;
    cn->retry_at = 0;
    uv_tcp_init(&c->loop, &cn->tcp);
    cn->has_handle = true;
    c->open_handles++;
    cn->connect_req.data = cn;
    int rc = uv_tcp_connect(&cn->connect_req, &cn->tcp, (struct sockaddr *)&cn->dial_addr,
                            on_connected);
    if (rc < 0) {
        c->report->fail(c, DT_ESYS, "rank %d: connecting to rank %d (%s): %s", c->rank,
                        cn->expect_peer, cn->addr, uv_strerror(rc));
        comm_conn_close(cn);
    }
}

static void io_connect_all(dt_comm *c)
{
    double deadline = dt_now() + c->init_timeout_s;
    for (int j = 0; j < c->rank; j++) {
        dt_conn *cn = conn_new(c);
        if (!cn) {
            c->report->fail(c, DT_ENOMEM, "rank %d: out of memory", c->rank);
            return;
        }
        cn->outgoing = true;
        cn->expect_peer = j;
        cn->dial_addr = c->dial[j];
        cn->deadline = deadline;
        format_addr((struct sockaddr *)&cn->dial_addr, cn->addr, sizeof cn->addr);
        io_dial(cn);
    }
}

static void on_connection(uv_stream_t *server, int status)
{
    dt_comm *c = server->data;
    if (status < 0)
        return;
    dt_conn *cn = conn_new(c);
    if (!cn)
        return;
    uv_tcp_init(&c->loop, &cn->tcp);
    cn->has_handle = true;
    c->open_handles++;
    if (uv_accept(server, (uv_stream_t *)&cn->tcp) < 0) {
        comm_conn_close(cn);
        return;
    }
    struct sockaddr_storage sa;
    int len = sizeof sa;
    if (uv_tcp_getpeername(&cn->tcp, (struct sockaddr *)&sa, &len) == 0)
        format_addr((struct sockaddr *)&sa, cn->addr, sizeof cn->addr);
    if (c->io_shutdown || c->io_failed_done) {
        comm_conn_close(cn);
        return;
    }
    tune_socket(c, cn);
    cn->deadline = dt_now() + HANDSHAKE_TIMEOUT_S;
    comm_handshake_start_incoming(cn);
    comm_transport_read_set(cn, true);
}

/* ---- the loop's wake-ups ----------------------------------------------------- */

static void on_tick(uv_timer_t *t)
{
    dt_comm *c = t->data;
    double now = dt_now();
    for (dt_conn *cn = c->pending, *next; cn; cn = next) {
        next = cn->next;
        if (cn->closing)
            continue;
        if (cn->retry_at > 0 && now >= cn->retry_at && !c->io_failed_done) {
            if (now >= cn->deadline)
                c->report->fail(c, DT_ETIMEDOUT,
                                "rank %d: could not connect to rank %d at %s "
                                "within %.1f s",
                                c->rank, cn->expect_peer, cn->addr, c->init_timeout_s);
            else
                io_dial(cn);
        } else if (cn->retry_at == 0 && now >= cn->deadline) {
            if (cn->outgoing)
                c->report->fail(c, DT_ETIMEDOUT,
                                "rank %d: handshake with rank %d at %s did not "
                                "finish in time",
                                c->rank, cn->expect_peer, cn->addr);
            else
                comm_handshake_reject(cn, "handshake not completed within %.0f s",
                                      HANDSHAKE_TIMEOUT_S);
        }
    }
    if (c->close_at > 0 && now >= c->close_at)
        close_all_conns(c);
    comm_heartbeat_tick(c, now);
    close_shut_down(c);
    comm_reject_log_tick(c);
    comm_conn_maybe_finish(c);
}

static void on_wake(uv_async_t *a)
{
    dt_comm *c = a->data;
    pthread_mutex_lock(&c->mu);
    dt_xfer *list = c->inbox_head;
    c->inbox_head = c->inbox_tail = NULL;
    bool connect = c->want_connect, fail = c->want_fail;
    c->want_connect = false;
    pthread_mutex_unlock(&c->mu);
    if (connect && !c->io_failed_done)
        io_connect_all(c);
    if (fail)
        io_fail_cleanup(c);
    while (list) {
        dt_xfer *x = list;
        list = x->next;
        comm_transport_io_post(c, x);
    }
    comm_conn_maybe_finish(c);
}

/* Called by the communicator thread as it exits: say BYE, close everything,
 * and run the loop until the last handle is closed. */
void comm_mesh_shutdown(dt_comm *c)
{
    pthread_mutex_lock(&c->mu);
    bool failed = c->failed;
    pthread_mutex_unlock(&c->mu);
    /* A failure the loop has not acted on yet (dt_comm_abort, then at once
     * dt_comm_destroy): its ABORT frames go out before the BYEs, so peers
     * learn the reason rather than "destroyed its communicator". */
    if (failed)
        io_fail_cleanup(c);
    io_shutdown(c);
    comm_conn_maybe_finish(c);
    uv_run(&c->loop, UV_RUN_DEFAULT);
}

/* ---- start and stop (API thread) ------------------------------------------- */

static dt_status bind_listener(dt_comm *c)
{
    struct sockaddr_storage sa;
    int rc = uv_ip4_addr(c->host, 0, (struct sockaddr_in *)&sa);
    if (rc < 0)
        rc = uv_ip6_addr(c->host, 0, (struct sockaddr_in6 *)&sa);
    if (rc < 0) {
        c->report->fail(c, DT_EINVAL, "rank %d: host '%s' is not an IPv4 or IPv6 address", c->rank,
                        c->host);
        return DT_EINVAL;
    }
    uv_tcp_init(&c->loop, &c->listener);
    c->listener.data = c;
    c->listener_open = true;
    rc = uv_tcp_bind(&c->listener, (struct sockaddr *)&sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&c->listener, 128, on_connection);
    if (rc < 0) {
        c->report->fail(c, DT_ESYS, "rank %d: cannot listen on %s: %s", c->rank, c->host,
                        uv_strerror(rc));
        return DT_ESYS;
    }
    int len = sizeof sa;
    uv_tcp_getsockname(&c->listener, (struct sockaddr *)&sa, &len);
    c->port = ntohs(sa.ss_family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port
                                            : ((struct sockaddr_in6 *)&sa)->sin6_port);
    return DT_OK;
}

dt_status comm_mesh_start(dt_comm *c)
{
    int rc = uv_loop_init(&c->loop);
    if (rc < 0) {
        c->report->fail(c, DT_ESYS, "rank %d: uv_loop_init: %s", c->rank, uv_strerror(rc));
        return DT_ESYS;
    }
    c->loop_ready = true;
    uv_async_init(&c->loop, &c->wake, on_wake);
    c->wake.data = c;
    uv_timer_init(&c->loop, &c->ticker);
    c->ticker.data = c;
    uv_timer_start(&c->ticker, on_tick, TICK_MS, TICK_MS);
    /* gloo's wire listens per pair (gloo/pair.c), and only there */
    return c->size > 1 && !c->gloo_wire ? bind_listener(c) : DT_OK;
}

void comm_mesh_connect(dt_comm *c)
{
    pthread_mutex_lock(&c->mu);
    c->want_connect = true;
    pthread_mutex_unlock(&c->mu);
    comm_wake_thread(c);
}

static void close_any(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

void comm_mesh_stop(dt_comm *c)
{
    if (atomic_load(&c->io_running)) {
        pthread_mutex_lock(&c->mu);
        c->stopping = true;
        pthread_mutex_unlock(&c->mu);
        comm_wake_thread(c);
        uv_thread_join(&c->thread);
        /* under mu: a comm_wake_thread made under mu (a failure being recorded
         * on another thread) then never wakes a loop that is closing */
        pthread_mutex_lock(&c->mu);
        atomic_store(&c->io_running, false);
        pthread_mutex_unlock(&c->mu);
    }
    if (c->loop_ready) {
        /* Normally every handle is closed by now; if the thread never ran,
         * close what start created and let the loop finish the closes. */
        uv_walk(&c->loop, close_any, NULL);
        uv_run(&c->loop, UV_RUN_DEFAULT);
        uv_loop_close(&c->loop);
        c->loop_ready = false;
    }
}
