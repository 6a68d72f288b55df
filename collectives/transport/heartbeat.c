/*
 * heartbeat.c — the two clocks an op waits by: liveness and progress.
 *
 * A peer an op waits for may be late for two different reasons, and they
 * deserve different patience:
 *
 *   liveness  its process is stopped, dead, or cut off from us. Nothing will
 *             ever come; the sooner it is named, the better. The limit is
 *             the communicator's timeout_s (DT_TIMEOUT, 30 s by default).
 *   progress  it is alive but busy elsewhere (rank 0 evaluating alone while
 *             the others wait in the next all-reduce, a slow checkpoint, a
 *             debugger). It will come; killing the job would be wrong. The
 *             limit is progress_timeout_s (DT_PROGRESS_TIMEOUT, 30 min by
 *             default, the default of torch's gloo timeout), checked by the
 *             op's waiter (xfer.c, work.c), which then asks this file who
 *             has not joined.
 *
 * Telling them apart needs a signal that a busy rank still gives and a
 * stopped one does not: every communicator's loop sends each peer a
 * HEARTBEAT frame once a beat (a tenth of the liveness limit, at most 1 s).
 * The loop runs while the rank computes — the communicator thread polls it
 * when no op runs — so a rank deep in its own work still beats. Any byte
 * read from a peer counts as hearing from it (transport_read.c stamps
 * heard_at), so a peer streaming a long payload needs no beat to be alive.
 * A heartbeat carries where its sender is — the first collective it has not
 * finished, and whether it is running it — so that a progress timeout can
 * name the ranks that have not joined the op instead of the neighbour the
 * waiter happened to wait on.
 *
 * Which silences count: only a peer something posted here waits on (a
 * receive from it, a send it has not taken) and whose connection is being
 * read. A peer we are not reading is a peer we are behind (its frames wait
 * for our receives, TCP holds the rest), and whatever it said since is
 * queued behind them; its silence counts again from when reading resumes.
 * An idle communicator waits on nobody, so idle ranks never fail each
 * other.
 *
 * Except a peer that has ended behind a parked frame: the reader stopped
 * on a frame no receive matches yet (RX_WAIT_MATCH), and behind it came
 * the connection's end — read into the stage (rx_deferred), or, when a
 * full stage stopped reading, seen in the socket itself (a reset, which
 * the dead peer's kernel sends when our next heartbeat reaches its closed
 * socket; or its FIN). Its silence then is no backlog of ours: if
 * something posted here waits on it, it is named at the liveness limit
 * as dead, with the frame that waits. (A stopped peer behind a parked
 * frame still meets only the progress limit: nothing tells it from a
 * busy one while its bytes wait unread.)
 *
 * The kernel's keepalive (conn.c) still names a peer whose host stopped
 * answering; it needs no process on the other side, and a stopped process's
 * kernel answers it, which is why this file exists.
 *
 * Cost: one 40-byte frame per peer per beat (at most one a second with the
 * default limit), a clock read per read(2); nothing on an op's path.
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "conn.h"

#define MAX_BEAT_S 1.0
/* Heartbeats are not queued behind this much unsent data: the peer is not
 * reading, and more of them would only grow the queue. */
#define BEAT_QUEUE_LIMIT (64u << 10)

static double beat_interval(const dt_transport *t)
{
    double beat = t->timeout_s / 10;
    return beat < MAX_BEAT_S ? beat : MAX_BEAT_S;
}

static void on_beat_written(uv_write_t *req, int status)
{
    (void)status; /* a broken connection is the reader's to report */
    free(req->data);
}

typedef struct beat_write {
    uv_write_t req;
    dt_frame_hdr hdr;
} beat_write;

static void send_beat(dt_conn *cn, uint64_t at, bool in_op)
{
    if (uv_stream_get_write_queue_size((uv_stream_t *)&cn->tcp) > BEAT_QUEUE_LIMIT)
        return;
    beat_write *w = calloc(1, sizeof *w);
    if (!w)
        return;
    w->hdr.kind = FRAME_HEARTBEAT;
    w->hdr.root = -1;
    w->hdr.seq = at;
    w->hdr.index = in_op ? 1 : 0;
    w->req.data = w;
    uv_buf_t buf = uv_buf_init((char *)&w->hdr, sizeof w->hdr);
    if (uv_write(&w->req, (uv_stream_t *)&cn->tcp, &buf, 1, on_beat_written) < 0)
        free(w);
}

static bool usable(const dt_conn *cn)
{
    return cn && cn->authenticated && !cn->closing && !cn->lost && !cn->bye;
}

/* Is something posted here waiting on this peer, while we read it? */
static bool waits_on(dt_transport *t, dt_conn *cn)
{
    bool read_now = cn->reading && (cn->rx_state == RX_HEADER || cn->rx_state == RX_PAYLOAD ||
                                    cn->rx_state == RX_NOTICE);
    if (!read_now)
        return false;
    return comm_transport_expects_from(t, cn) ||
           uv_stream_get_write_queue_size((uv_stream_t *)&cn->tcp) > 0;
}

/* A parked connection's end, as a libuv error (UV_EOF, UV_ECONNRESET...),
 * or 0 while the peer's side is open (or the connection is not parked). */
static int parked_end(const dt_conn *cn)
{
    if (cn->rx_state != RX_WAIT_MATCH)
        return 0;
    if (cn->rx_deferred)
        return cn->rx_deferred;
    int fd = -1, err = 0;
    socklen_t len = sizeof err;
    if (uv_fileno((const uv_handle_t *)&cn->tcp, &fd) != 0)
        return 0;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0)
        return uv_translate_sys_error(err);
#ifdef TCP_INFO
    struct tcp_info ti;
    len = sizeof ti;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
        (ti.tcpi_state == TCP_CLOSE_WAIT || ti.tcpi_state == TCP_CLOSE))
        return UV_EOF;
#endif
    return 0;
}

/* launcher/blame_line.c follows "died or its process was killed". */
static void ended_behind_parked(dt_transport *t, dt_conn *cn, int end, double silent_s)
{
    char frame[160];
    comm_transport_describe_hdr(frame, sizeof frame, &cn->rx_hdr);
    t->report->fail(t->owner, DT_EPEER,
                    "rank %d: connection to rank %d (%s) lost: %s behind its %s, which no "
                    "receive here has matched, and nothing heard for %.1f s while rank %d waits "
                    "on it; rank %d died or its process was killed",
                    t->rank, cn->peer, cn->addr, end == UV_EOF ? "end of file" : uv_strerror(end),
                    frame, silent_s, t->rank, cn->peer);
}

/* launcher/root_cause.c looks for "timed out" to suspect a stopped rank. */
static void silent_peer(dt_transport *t, dt_conn *cn, double silent_s)
{
    t->report->fail(t->owner, DT_ETIMEDOUT,
                    "rank %d: timed out waiting on rank %d (%s): it has sent nothing, not even "
                    "a heartbeat, for %.1f s; its process is stopped, hung or cut off "
                    "(liveness limit: DT_TIMEOUT, %.1f s)",
                    t->rank, cn->peer, cn->addr, silent_s, t->timeout_s);
}

void comm_heartbeat_tick(dt_transport *t, double now)
{
    if (!t->peers || t->io_failed_done || t->io_shutdown)
        return;
    bool beat = false;
    uint64_t at = 0;
    bool in_op = false;
    for (int p = 0; p < t->size && !beat; p++)
        beat = usable(t->peers[p]) && now - t->peers[p]->beat_at >= beat_interval(t);
    if (beat) {
        pthread_mutex_lock(t->mu);
        at = t->report->first_unfinished_locked(t->owner);
        in_op = t->report->in_op_locked(t->owner);
        pthread_mutex_unlock(t->mu);
    }
    for (int p = 0; p < t->size; p++) {
        dt_conn *cn = t->peers[p];
        if (!usable(cn))
            continue;
        if (beat && now - cn->beat_at >= beat_interval(t)) {
            cn->beat_at = now;
            send_beat(cn, at, in_op);
        }
        if (now - cn->heard_at > t->timeout_s && waits_on(t, cn)) {
            silent_peer(t, cn, now - cn->heard_at);
            return; /* the first failure is the one that counts */
        }
        int end = now - cn->heard_at > t->timeout_s ? parked_end(cn) : 0;
        if (end && (comm_transport_expects_from(t, cn) ||
                    uv_stream_get_write_queue_size((uv_stream_t *)&cn->tcp) > 0)) {
            ended_behind_parked(t, cn, end, now - cn->heard_at);
            return;
        }
    }
}

/* Has the peer joined collective seq, as its last heartbeat tells? */
static bool joined(const dt_conn *cn, uint64_t seq)
{
    return cn->peer_beat && (cn->peer_at > seq || (cn->peer_at == seq && cn->peer_in_op));
}

static void describe_absent(const dt_conn *cn, uint64_t seq, double now, char *out, size_t n)
{
    if (!cn->peer_beat) {
        snprintf(out, n, "rank %d (%s) has sent no heartbeat yet", cn->peer, cn->addr);
        return;
    }
    char where[96];
    if (cn->peer_in_op)
        snprintf(where, sizeof where, "it is still running collective #%llu",
                 (unsigned long long)cn->peer_at);
    else if (cn->peer_at == seq)
        snprintf(where, sizeof where, "it has not started it yet");
    else
        snprintf(where, sizeof where, "collective #%llu is its next",
                 (unsigned long long)cn->peer_at);
    snprintf(out, n, "rank %d (%s) is alive (heard %.1f s ago) but has not joined #%llu: %s",
             cn->peer, cn->addr, now - cn->heard_at, (unsigned long long)seq, where);
}

void comm_heartbeat_absent(dt_transport *t, uint64_t seq, int waited_on, char *out, size_t n)
{
    double now = dt_now();
    size_t used = 0;
    int absent = 0;
    out[0] = '\0';
    for (int p = 0; p < t->size && used + 1 < n; p++) {
        dt_conn *cn = t->peers ? t->peers[p] : NULL;
        if (p == t->rank || !cn || joined(cn, seq))
            continue;
        char one[320];
        describe_absent(cn, seq, now, one, sizeof one);
        int k = snprintf(out + used, n - used, "%s%s", absent ? "; " : "", one);
        used += k > 0 ? (size_t)k : 0;
        absent++;
    }
    if (absent == 0 && waited_on >= 0)
        snprintf(out, n,
                 "every rank has joined it, and rank %d (%s), which rank %d waits on, is alive "
                 "but has not sent what it owes (do the ranks post matching sends and receives?)",
                 waited_on, t->peer_addr[waited_on], t->rank);
}
