/*
 * transport_read.c — reading a connection: frames matched to the receives
 * ops posted, payloads read straight into their buffers, a peer's ABORT
 * notice, EOF; on the communicator thread's libuv loop.
 *
 * The idea: nothing is buffered "just in case". A payload is read straight
 * into the buffer of the receive that was posted for it. The one exception
 * is a small read-ahead per connection (RX_STAGE_BYTES): a read at a frame
 * boundary takes up to that much, so a small frame — header and payload —
 * costs one read(2) instead of three (header, payload, EAGAIN), and the
 * first bytes of a large payload are copied out of it before the rest is
 * read in place. When a header arrives and no receive matches it yet — the
 * peer is ahead of us — its frame waits in the stage, and reading goes on
 * into the stage's free room; only a full stage stops reading that socket
 * (uv_read_stop) until the op posts the matching receive (transport.c then
 * calls comm_transport_read_header again). So a peer a little ahead (the
 * common case: its next op's first small frame) costs no epoll_ctl, a peer
 * far ahead meets TCP's window as flow control, and memory stays bounded by
 * what the algorithms posted plus one stage per connection. An EOF or error
 * that arrives behind waiting frames is reported once they have been
 * consumed, in stream order.
 *
 * Matching: collective frames from one peer are matched in order against
 * the collective receives posted for that peer, and must agree exactly with
 * the receive's expected header (op, sequence number, count, dtype,
 * reduction, root, message index, length) — otherwise the ranks disagree
 * about the op, and both views go into a protocol error. Tagged p2p frames
 * are matched against posted p2p receives by (source or any, tag), oldest
 * first, and must then agree with the receive's dtype and count. A rooted
 * op's frames can only be matched if the ranks agree on the root, which
 * root_agreement.c checks before its data moves.
 *
 * The reader is every connection's: it reads a new connection's handshake
 * messages too, into hs_buf, and hands each to handshake.c; once the
 * handshake says the peer proved who it is, the connection becomes
 * tp->peers[rank] here and its next unit is a frame header.
 *
 * A HEARTBEAT frame (heartbeat.c) says the peer is alive and where it is;
 * any byte read stamps heard_at, the liveness clock's reading.
 *
 * Failure: EOF, a reset or a protocol error ends in report.h's fail (mesh.c then
 * lets go of everything and tells the peers). A peer's ABORT carries its
 * root cause, which becomes ours. A peer that said BYE (destroyed its
 * communicator) and then closes is not a failure unless something was
 * still expected from it.
 *
 * Cost per frame: one read for a frame that fits the stage (several small
 * frames that arrived together share it), else one for the stage and as
 * many as needed for the rest of the payload.
 */
#include <stdio.h>
#include <string.h>

#include "conn.h"

#define MAX_READ (1u << 30)

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void rx_on_notice(dt_conn *cn);
static void rx_resume(dt_conn *cn);

void comm_transport_read_set(dt_conn *cn, bool on)
{
    if (!on) {
        comm_conn_stop_reading(cn);
        return;
    }
    if (cn->closing || cn->reading)
        return;
    cn->reading = true;
    cn->heard_at = dt_now(); /* its silence counts from now: while we did not
                                read, the peer could not have reached us */
    uv_read_start((uv_stream_t *)&cn->tcp, on_alloc, on_read);
}

static bool stage_full(const dt_conn *cn)
{
    return cn->stage_off == 0 && cn->stage_len == sizeof cn->rx_stage;
}

static void next_header(dt_conn *cn)
{
    comm_conn_expect(cn, RX_HEADER, sizeof(dt_frame_hdr));
    cn->rx_cur = NULL;
}

void comm_transport_describe_hdr(char *out, size_t n, const dt_frame_hdr *h)
{
    if (h->kind == FRAME_P2P) { /* seq: the sender's or receiver's own p2p count */
        snprintf(out, n, "%s #%llu with tag %u (%llu x %s; %llu B)",
                 h->op == DT_OP_RECV ? "recv" : "send", (unsigned long long)h->seq, h->index,
                 (unsigned long long)h->count,
                 h->dtype < DT_NUM_DTYPES ? dt_dtype_name(h->dtype) : "?",
                 (unsigned long long)h->length);
        return;
    }
    char redop[24] = "", root[24] = "";
    if (h->op == DT_OP_ALLREDUCE || h->op == DT_OP_REDUCE_SCATTER || h->op == DT_OP_REDUCE)
        snprintf(redop, sizeof redop, ", %s",
                 h->redop < DT_NUM_REDOPS ? dt_redop_name(h->redop) : "?");
    if (h->root >= 0)
        snprintf(root, sizeof root, ", root %d", (int)h->root);
    snprintf(out, n, "%s #%llu message %u (%llu x %s%s%s; %llu B)",
             h->op < DT_NUM_OP_KINDS ? dt_op_name(h->op) : "?", (unsigned long long)h->seq,
             h->index, (unsigned long long)h->count,
             h->dtype < DT_NUM_DTYPES ? dt_dtype_name(h->dtype) : "?", redop, root,
             (unsigned long long)h->length);
}

static void protocol_error(dt_conn *cn, const dt_frame_hdr *expected)
{
    dt_transport *t = cn->tp;
    char got[160], want[160];
    comm_transport_describe_hdr(got, sizeof got, &cn->rx_hdr);
    comm_transport_describe_hdr(want, sizeof want, expected);
    cn->rx_state = RX_STOPPED;
    comm_transport_read_set(cn, false);
    const char *rule = expected->kind == FRAME_P2P
                           ? "a receive must name the dtype and count of the send it matches"
                           : "every rank must submit the same collectives in the same order "
                             "with the same arguments";
    t->report->fail(t->owner, DT_EPROTO,
                    "rank %d: protocol mismatch: rank %d (%s) sent %s, rank %d "
                    "expected %s; %s",
                    t->rank, cn->peer, cn->addr, got, t->rank, want, rule);
}

static bool hdr_matches(const dt_frame_hdr *a, const dt_frame_hdr *b)
{
    return a->kind == b->kind && a->op == b->op && a->dtype == b->dtype && a->redop == b->redop &&
           a->root == b->root && a->index == b->index && a->seq == b->seq && a->count == b->count &&
           a->length == b->length;
}

/* A tagged send fits a receive of the same dtype and count: equal byte
 * counts of different types would be a silent reinterpretation. */
static bool p2p_fits(const dt_frame_hdr *want, const dt_frame_hdr *got)
{
    return want->dtype == got->dtype && want->count == got->count && want->length == got->length;
}

static void rx_start_payload(dt_conn *cn, dt_xfer *x)
{
    x->source = cn->peer;
    x->next = NULL;
    if (cn->rx_hdr.length == 0) {
        comm_conn_release_xfer(cn->tp, x, XFER_DONE);
        next_header(cn);
    } else {
        cn->rx_cur = x;
        x->done = 0;
        cn->rx_state = RX_PAYLOAD;
    }
}

/* The oldest posted p2p receive that takes (peer, tag), unlinked. */
static dt_xfer *p2p_take(dt_transport *t, int peer, uint32_t tag)
{
    dt_xfer **pp = &t->p2p_head, *prev = NULL;
    for (dt_xfer *x = t->p2p_head; x; prev = x, pp = &x->next, x = x->next) {
        if ((x->peer == peer || x->peer == DT_ANY_SOURCE) && x->hdr.index == tag) {
            *pp = x->next;
            if (t->p2p_tail == x)
                t->p2p_tail = prev;
            return x;
        }
    }
    return NULL;
}

/* The header in rx_hdr has no receive yet. Keep reading into the stage
 * while it has room (an early frame then costs no epoll_ctl at all); stop
 * when it is full, so what a peer can park here stays bounded. */
static void rx_pause(dt_conn *cn)
{
    cn->rx_state = RX_WAIT_MATCH;
    if (cn->stage_off > 0) { /* make the free room one piece, at the end */
        memmove(cn->rx_stage, cn->rx_stage + cn->stage_off, cn->stage_len - cn->stage_off);
        cn->stage_len -= cn->stage_off;
        cn->stage_off = 0;
    }
    if (stage_full(cn) || cn->rx_deferred)
        comm_transport_read_set(cn, false);
}

/* A whole header is in cn->rx_hdr: find where its payload goes. */
void comm_transport_read_header(dt_conn *cn)
{
    dt_transport *t = cn->tp;
    dt_frame_hdr *h = &cn->rx_hdr;
    dt_xfer *x;
    bool was_paused = cn->rx_state == RX_WAIT_MATCH;
    switch (h->kind) {
    case FRAME_COLL:
        x = cn->coll_head;
        if (!x) {
            rx_pause(cn);
            return;
        }
        if (!hdr_matches(&x->hdr, h)) {
            protocol_error(cn, &x->hdr);
            return;
        }
        cn->coll_head = x->next;
        if (!cn->coll_head)
            cn->coll_tail = NULL;
        rx_start_payload(cn, x);
        break;
    case FRAME_P2P:
        x = p2p_take(t, cn->peer, h->index);
        if (!x) {
            rx_pause(cn);
            return;
        }
        if (!p2p_fits(&x->hdr, h)) {
            /* Record the failure before letting go: the receive's waiter
             * wakes on the release and must find the reason in place. */
            x->next = NULL;
            protocol_error(cn, &x->hdr);
            comm_conn_release_xfer(t, x, XFER_FAILED);
            return;
        }
        rx_start_payload(cn, x);
        break;
    case FRAME_ABORT:
        if (h->length < 4 || h->length >= sizeof cn->notice) {
            cn->rx_state = RX_STOPPED; /* nothing after it can be parsed */
            comm_transport_read_set(cn, false);
            t->report->fail(t->owner, DT_EPROTO,
                            "rank %d: rank %d (%s) sent an ABORT frame of %llu B", t->rank,
                            cn->peer, cn->addr, (unsigned long long)h->length);
            return;
        }
        comm_conn_expect(cn, RX_NOTICE, h->length);
        break;
    case FRAME_BYE:
        cn->bye = true;
        next_header(cn);
        break;
    case FRAME_HEARTBEAT: /* the peer is alive, and where it is (heartbeat.c) */
        cn->peer_beat = true;
        cn->peer_at = h->seq;
        cn->peer_in_op = h->index & 1;
        next_header(cn);
        break;
    default:
        cn->rx_state = RX_STOPPED;
        comm_transport_read_set(cn, false);
        t->report->fail(t->owner, DT_EPROTO,
                        "rank %d: rank %d (%s) sent a frame of unknown kind %u "
                        "(another protocol version?)",
                        t->rank, cn->peer, cn->addr, h->kind);
        return;
    }
    if (was_paused)
        rx_resume(cn);
}

/* A peer failed and said why. If it had already finished the op this rank
 * is running or will run next (it failed in a later one), that op can still
 * finish here — everything the peer owed it came before the ABORT — so the
 * failure waits until it ends and fails the op after it instead of one that
 * was fine. But only for DEFERRED_FAIL_GRACE_S (comm_xfer_wait, and the idle
 * communicator thread, watch): a third rank that never reached this op
 * fails without sending its part, and this op must not wait for its own
 * timeout to learn that. */
#define DEFERRED_FAIL_GRACE_S 1.0

static void rx_on_notice(dt_conn *cn)
{
    dt_transport *t = cn->tp;
    uint32_t st;
    memcpy(&st, cn->notice, 4);
    cn->notice[cn->rx_need] = '\0';
    if (st == DT_OK || st > DT_ENOMEM)
        st = DT_EPEER;
    cn->rx_state = RX_STOPPED;
    comm_transport_read_set(cn, false);
    pthread_mutex_lock(t->mu);
    bool later = t->report->failure_locked(t->owner, NULL, 0) == DT_OK &&
                 t->report->first_unfinished_locked(t->owner) < cn->rx_hdr.seq;
    if (later && !t->fail_deferred) {
        t->fail_deferred = true;
        t->deferred_until = dt_now() + DEFERRED_FAIL_GRACE_S;
        t->deferred_status = (dt_status)st;
        snprintf(t->deferred_error, sizeof t->deferred_error,
                 "rank %d: rank %d (%s) failed "
                 "and reported: %s",
                 t->rank, cn->peer, cn->addr, cn->notice + 4);
    }
    pthread_mutex_unlock(t->mu);
    if (later)
        return;
    /* launcher/blame_line.c follows this wording ("failed and reported:",
     * "died or its process was killed", and a group's ", world rank W" in
     * the address) to the rank that failed first. */
    t->report->fail(t->owner, (dt_status)st, "rank %d: rank %d (%s) failed and reported: %s",
                    t->rank, cn->peer, cn->addr, cn->notice + 4);
}

bool comm_transport_expects_from(dt_transport *t, dt_conn *cn)
{
    if (cn->coll_head || cn->rx_cur)
        return true;
    for (dt_xfer *x = t->p2p_head; x; x = x->next)
        if (x->peer == cn->peer)
            return true;
    return false;
}

static void conn_lost(dt_conn *cn, ssize_t err)
{
    dt_transport *t = cn->tp;
    if (!cn->authenticated) {
        comm_handshake_lost(cn, err);
        return;
    }
    cn->lost = true;
    cn->rx_state = RX_STOPPED;
    comm_transport_read_set(cn, false);
    if (cn->bye && !comm_transport_expects_from(t, cn)) {
        comm_conn_close(cn);
        return;
    }
    pthread_mutex_lock(t->mu); /* comm.c then looks for why it left */
    t->lost_at_startup = t->report->failure_locked(t->owner, NULL, 0) == DT_OK && !t->mesh_ready;
    pthread_mutex_unlock(t->mu);
    if (cn->bye)
        t->report->fail(t->owner, DT_EPEER,
                        "rank %d: rank %d (%s) destroyed its communicator while "
                        "rank %d still expected data from it",
                        t->rank, cn->peer, cn->addr, t->rank);
    else if (err == UV_ETIMEDOUT)
        t->report->fail(t->owner, DT_EPEER,
                        "rank %d: connection to rank %d (%s) lost: its host stopped "
                        "answering (no TCP acknowledgement within %.1f s); is its network link "
                        "up, is the machine alive?",
                        t->rank, cn->peer, cn->addr, t->timeout_s / 2);
    else if (err == UV_EHOSTUNREACH || err == UV_ENETUNREACH || err == UV_EHOSTDOWN)
        t->report->fail(t->owner, DT_EPEER,
                        "rank %d: connection to rank %d (%s) lost: its host cannot be reached "
                        "(%s); is its network link up, is the machine alive?",
                        t->rank, cn->peer, cn->addr, uv_strerror((int)err));
    else
        t->report->fail(t->owner, DT_EPEER,
                        "rank %d: connection to rank %d (%s) lost: %s; rank %d died "
                        "or its process was killed",
                        t->rank, cn->peer, cn->addr,
                        err == UV_EOF ? "end of file" : uv_strerror((int)err), cn->peer);
}

/* n more bytes of the current payload are in its buffer; at the end the
 * receive is done and the next header is due. */
static void rx_payload_got(dt_conn *cn, size_t n)
{
    dt_xfer *x = cn->rx_cur;
    x->done += n;
    if (x->done < x->len)
        return;
    cn->rx_cur = NULL;
    comm_conn_release_xfer(cn->tp, x, XFER_DONE);
    next_header(cn);
}

/* The handshake proved that rank cn->expect_peer is on the other end: from
 * now on cn is tp->peers[rank] and carries frames; the mesh is ready
 * once every peer has come. */
static void authenticated(dt_conn *cn)
{
    dt_transport *t = cn->tp;
    int peer = cn->expect_peer;
    comm_conn_watch_liveness(cn);
    cn->authenticated = true;
    cn->peer = peer;
    t->report->label_peer(t->owner, peer, cn->addr, sizeof cn->addr);
    comm_conn_unlink_pending(cn);
    cn->next = NULL;
    t->peers[peer] = cn;
    next_header(cn);
    comm_transport_read_set(cn, true);
    pthread_mutex_lock(t->mu);
    if (++t->connected == t->size - 1) {
        t->mesh_ready = true;
        pthread_cond_broadcast(t->cv_api);
    }
    pthread_mutex_unlock(t->mu);
}

/* The current fixed-size unit (header, handshake message, notice) is in. */
static void rx_unit_done(dt_conn *cn)
{
    switch (cn->rx_state) {
    case RX_HEADER: comm_transport_read_header(cn); break;
    case RX_HANDSHAKE:
        if (comm_handshake_step(cn))
            authenticated(cn);
        break;
    case RX_NOTICE: rx_on_notice(cn); break;
    default: break;
    }
}

/* Consumes read-ahead bytes frame by frame: headers are matched, payloads
 * copied to their receives, notices collected. Stops, keeping the rest,
 * when a header has no receive yet (reading is paused then) or the
 * connection stopped. */
static void rx_drain(dt_conn *cn)
{
    while (cn->stage_off < cn->stage_len) {
        const char *src = cn->rx_stage + cn->stage_off;
        size_t avail = cn->stage_len - cn->stage_off, k;
        if (cn->rx_state == RX_PAYLOAD) {
            dt_xfer *x = cn->rx_cur;
            k = x->len - x->done < avail ? x->len - x->done : avail;
            memcpy(x->buf + x->done, src, k);
            cn->stage_off += k;
            rx_payload_got(cn, k);
            continue;
        }
        char *dst = cn->rx_state == RX_HEADER   ? (char *)&cn->rx_hdr
                    : cn->rx_state == RX_NOTICE ? cn->notice
                                                : NULL;
        if (!dst)
            return; /* waiting for a match, or stopped */
        k = cn->rx_need - cn->rx_got < avail ? cn->rx_need - cn->rx_got : avail;
        memcpy(dst + cn->rx_got, src, k);
        cn->rx_got += k;
        cn->stage_off += k;
        if (cn->rx_got < cn->rx_need)
            continue;
        rx_unit_done(cn);
        /* every outcome starts a new unit or stops the connection; a state
         * left at "unit complete" would be parsed again forever */
        if ((cn->rx_state == RX_HEADER || cn->rx_state == RX_NOTICE) && cn->rx_got == cn->rx_need) {
            cn->rx_state = RX_STOPPED;
            comm_transport_read_set(cn, false);
            return;
        }
    }
}

/* A waiting header found its receive: use up what is staged, then read
 * the socket again (rx_pause decides, if another frame has to wait), or
 * report the EOF or error that had come in behind the staged frames. */
static void rx_resume(dt_conn *cn)
{
    rx_drain(cn);
    if (cn->rx_state == RX_WAIT_MATCH || cn->rx_state == RX_STOPPED)
        return;
    if (cn->rx_deferred)
        conn_lost(cn, cn->rx_deferred);
    else
        comm_transport_read_set(cn, true);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    dt_conn *cn = h->data;
    char *base = NULL;
    size_t len = 0;
    cn->rx_into_stage = false;
    switch (cn->rx_state) {
    case RX_HEADER: /* a frame boundary: the stage is empty here */
        cn->stage_off = cn->stage_len = 0;
        /* fall through */
    case RX_WAIT_MATCH: /* rx_pause left the free room at the end */
        cn->rx_into_stage = true;
        *buf = uv_buf_init(cn->rx_stage + cn->stage_len,
                           (unsigned)(sizeof cn->rx_stage - cn->stage_len));
        return;
    case RX_PAYLOAD:
        base = cn->rx_cur->buf + cn->rx_cur->done;
        len = cn->rx_cur->len - cn->rx_cur->done;
        if (len > MAX_READ)
            len = MAX_READ;
        break;
    case RX_HANDSHAKE:
        base = (char *)cn->hs_buf + cn->rx_got;
        len = cn->rx_need - cn->rx_got;
        break;
    case RX_NOTICE:
        base = cn->notice + cn->rx_got;
        len = cn->rx_need - cn->rx_got;
        break;
    default: break;
    }
    *buf = uv_buf_init(base, (unsigned)len);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    dt_conn *cn = s->data;
    if (nread == 0 || nread == UV_ENOBUFS)
        return;
    if (nread > 0)
        cn->heard_at = dt_now(); /* liveness: any byte will do (heartbeat.c) */
    if (nread < 0 && cn->rx_state == RX_WAIT_MATCH) {
        cn->rx_deferred = (int)nread; /* after the frames staged before it */
        comm_transport_read_set(cn, false);
        return;
    }
    if (nread < 0) {
        conn_lost(cn, nread);
        return;
    }
    if (cn->rx_into_stage) {
        cn->stage_len += (size_t)nread;
        if (cn->rx_state != RX_WAIT_MATCH)
            rx_drain(cn);
        else if (stage_full(cn))
            comm_transport_read_set(cn, false);
        return;
    }
    if (cn->rx_state == RX_PAYLOAD) {
        rx_payload_got(cn, (size_t)nread);
        return;
    }
    cn->rx_got += (size_t)nread;
    if (cn->rx_got == cn->rx_need)
        rx_unit_done(cn);
}
