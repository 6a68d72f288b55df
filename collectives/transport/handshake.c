/*
 * handshake.c — who is on the other end of a new connection?
 *
 * The mesh rule: the higher rank dials, the lower rank accepts. Every new
 * TCP connection then runs three fixed-size messages before it may carry a
 * frame:
 *
 *   dialler  -> acceptor   HELLO      magic, version, world size, rank,
 *                                     job hash[16], nonce_d[16]      48 B
 *   acceptor -> dialler    CHALLENGE  magic, version, world size, rank,
 *                                     nonce_a[16], mac_a[32]         64 B
 *   dialler  -> acceptor   RESPONSE   mac_d[32]                      32 B
 *
 *   mac_a = HMAC(key, "A" || HELLO || CHALLENGE[0..32))
 *   mac_d = HMAC(key, "D" || HELLO || CHALLENGE)
 *
 * with key derived from the per-job secret and HMAC = libsodium's
 * crypto_auth (HMAC-SHA-512-256). Both sides prove they hold the secret, over
 * nonces the other side just chose, so a recorded handshake cannot be
 * replayed and a process that took over a stale port cannot pass as a rank.
 *
 * A stranger — bad magic, another version, another job, a wrong world size,
 * a rank out of range or already connected, a wrong MAC, silence — is
 * logged, counted and disconnected; the job goes on. A dialler that cannot
 * authenticate the rank it dialled fails the communicator instead: it cannot
 * complete the mesh without it.
 *
 * The reader (transport_read.c) reads each message into hs_buf and hands it to
 * comm_handshake_step; when that says the peer proved itself, the reader
 * takes the connection over for frames. A read or write that fails
 * mid-handshake ends in comm_handshake_lost.
 *
 * Cost: one round trip and a half per connection, once, at init.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "conn.h"

#define HS_MAGIC 0x4e525444u /* "DTRN" little-endian */
/* 2: HEARTBEAT frames (kind 5), which a version-1 rank calls a frame of
 * unknown kind; a mixed mesh fails here instead, naming both versions. */
#define HS_VERSION 2u
#define HELLO_BYTES 48
#define CHALLENGE_BYTES 64
#define RESPONSE_BYTES 32

enum { PHASE_WAIT_CHALLENGE = 1, PHASE_WAIT_HELLO, PHASE_WAIT_RESPONSE };

static void put_host_u32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}
static uint32_t get_host_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* HMAC over domain || hello || challenge[0..challenge_len). */
static void mac(dt_transport *t, uint8_t out[32], char domain, const uint8_t *hello,
                const uint8_t *challenge, size_t challenge_len)
{
    uint8_t msg[1 + HELLO_BYTES + CHALLENGE_BYTES];
    msg[0] = (uint8_t)domain;
    memcpy(msg + 1, hello, HELLO_BYTES);
    memcpy(msg + 1 + HELLO_BYTES, challenge, challenge_len);
    crypto_auth(out, msg, 1 + HELLO_BYTES + challenge_len, t->key);
}

static bool mac_ok(dt_transport *t, const uint8_t theirs[32], char domain, const uint8_t *hello,
                   const uint8_t *challenge, size_t challenge_len)
{
    uint8_t ours[32];
    mac(t, ours, domain, hello, challenge, challenge_len);
    return sodium_memcmp(ours, theirs, 32) == 0;
}

void comm_handshake_reject(dt_conn *cn, const char *fmt, ...)
{
    dt_transport *t = cn->tp;
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&t->rejected, 1);
    comm_reject_log_note(t, cn->addr[0] ? cn->addr : "?", why);
    cn->lost = true;
    comm_conn_close(cn);
}

void comm_handshake_lost(dt_conn *cn, ssize_t err)
{
    dt_transport *t = cn->tp;
    cn->lost = true;
    cn->rx_state = RX_STOPPED;
    comm_conn_stop_reading(cn);
    if (cn->outgoing) {
        pthread_mutex_lock(t->mu); /* comm.c then looks for why it left */
        t->lost_at_startup = t->report->failure_locked(t->owner, NULL, 0) == DT_OK;
        pthread_mutex_unlock(t->mu);
    }
    if (cn->outgoing)
        t->report->fail(t->owner, DT_EPEER,
                        "rank %d: rank %d (%s) closed the connection during the "
                        "handshake (%s): is it another job, or does it hold another secret?",
                        t->rank, cn->expect_peer, cn->addr, uv_strerror((int)err));
    else
        comm_handshake_reject(cn, "closed during the handshake (%s)", uv_strerror((int)err));
}

static void on_hs_write_done(uv_write_t *req, int status)
{
    dt_conn *cn = req->data;
    if (status < 0 && status != UV_ECANCELED && !cn->authenticated && !cn->closing)
        comm_handshake_lost(cn, status);
}

/* One handshake message out; a write that fails is a connection lost
 * during the handshake. */
static void hs_write(dt_conn *cn, uv_write_t *req, const void *buf, size_t len)
{
    uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
    req->data = cn;
    int rc = uv_write(req, (uv_stream_t *)&cn->tcp, &b, 1, on_hs_write_done);
    if (rc < 0)
        comm_handshake_lost(cn, rc);
}

void comm_handshake_start_outgoing(dt_conn *cn)
{
    dt_transport *t = cn->tp;
    uint8_t *h = cn->hs_hello;
    put_host_u32(h, HS_MAGIC);
    put_host_u32(h + 4, HS_VERSION);
    put_host_u32(h + 8, (uint32_t)t->size);
    put_host_u32(h + 12, (uint32_t)t->rank);
    memcpy(h + 16, t->job_hash, 16);
    randombytes_buf(h + 32, 16);
    cn->hs_phase = PHASE_WAIT_CHALLENGE;
    comm_conn_expect(cn, RX_HANDSHAKE, CHALLENGE_BYTES);
    hs_write(cn, &cn->hs_write, h, HELLO_BYTES);
}

void comm_handshake_start_incoming(dt_conn *cn)
{
    cn->hs_phase = PHASE_WAIT_HELLO;
    comm_conn_expect(cn, RX_HANDSHAKE, HELLO_BYTES);
}

/* Dialler: the acceptor answered; is it the rank we dialled, of our job?
 * True: it is, and our reply is on its way. */
static bool on_challenge(dt_conn *cn)
{
    dt_transport *t = cn->tp;
    const uint8_t *m = cn->hs_buf;
    uint32_t magic = get_host_u32(m), version = get_host_u32(m + 4);
    uint32_t world = get_host_u32(m + 8), rank = get_host_u32(m + 12);
    const char *why = NULL;
    char other[96];
    if (magic != HS_MAGIC)
        why = "it does not speak dtrain's protocol";
    else if (version != HS_VERSION) {
        snprintf(other, sizeof other,
                 "it speaks protocol version %u, this rank %u (run one dtrain build on every rank)",
                 version, HS_VERSION);
        why = other;
    } else if (world != (uint32_t)t->size || rank != (uint32_t)cn->expect_peer)
        why = "it is another rank or another job";
    if (!why && mac_ok(t, m + 32, 'A', cn->hs_hello, m, 32)) {
        memcpy(cn->hs_challenge, m, CHALLENGE_BYTES);
        mac(t, cn->hs_out, 'D', cn->hs_hello, cn->hs_challenge, CHALLENGE_BYTES);
        hs_write(cn, &cn->hs_write, cn->hs_out, RESPONSE_BYTES);
        return true;
    }
    cn->rx_state = RX_STOPPED;
    comm_conn_stop_reading(cn);
    if (why)
        t->report->fail(t->owner, DT_EPEER,
                        "rank %d: the process at %s, published as rank %d, is not a peer: %s",
                        t->rank, cn->addr, cn->expect_peer, why);
    else /* both sides hold a secret; which one is odd, only the others can tell */
        t->report->fail(
            t->owner, DT_EPEER,
            "rank %d: rank %d (%s) failed authentication in the handshake: rank %d and "
            "rank %d hold different job secrets (is DT_SECRET the same for every rank?)",
            t->rank, cn->expect_peer, cn->addr, cn->expect_peer, t->rank);
    return false;
}

/* Acceptor: a dialler introduced itself. */
static void on_hello(dt_conn *cn)
{
    dt_transport *t = cn->tp;
    const uint8_t *m = cn->hs_buf;
    uint32_t magic = get_host_u32(m), version = get_host_u32(m + 4);
    uint32_t world = get_host_u32(m + 8), rank = get_host_u32(m + 12);
    if (magic != HS_MAGIC)
        return comm_handshake_reject(cn, "bad magic 0x%08x (not a dtrain peer)", magic);
    if (version != HS_VERSION)
        return comm_handshake_reject(cn,
                                     "protocol version %u, this rank speaks %u (another dtrain "
                                     "build?)",
                                     version, HS_VERSION);
    if (sodium_memcmp(m + 16, t->job_hash, 16) != 0)
        return comm_handshake_reject(cn, "it belongs to another job");
    if (world != (uint32_t)t->size)
        return comm_handshake_reject(cn, "it says world size %u, this job has %d", world, t->size);
    if (rank <= (uint32_t)t->rank || rank >= (uint32_t)t->size)
        return comm_handshake_reject(cn, "it says rank %u; rank %d accepts ranks %d..%d", rank,
                                     t->rank, t->rank + 1, t->size - 1);
    /* "Already connected?" waits until the dialler has proved itself: a
     * stranger learns nothing about the job from a rejection. */
    memcpy(cn->hs_hello, m, HELLO_BYTES);
    uint8_t *ch = cn->hs_challenge;
    put_host_u32(ch, HS_MAGIC);
    put_host_u32(ch + 4, HS_VERSION);
    put_host_u32(ch + 8, (uint32_t)t->size);
    put_host_u32(ch + 12, (uint32_t)t->rank);
    randombytes_buf(ch + 16, 16);
    mac(t, ch + 32, 'A', cn->hs_hello, ch, 32);
    cn->expect_peer = (int)rank;
    cn->hs_phase = PHASE_WAIT_RESPONSE;
    comm_conn_expect(cn, RX_HANDSHAKE, RESPONSE_BYTES);
    hs_write(cn, &cn->hs_write, ch, CHALLENGE_BYTES);
}

/* Acceptor: the dialler answered the challenge. True: it proved itself. */
static bool on_response(dt_conn *cn)
{
    dt_transport *t = cn->tp;
    if (!mac_ok(t, cn->hs_buf, 'D', cn->hs_hello, cn->hs_challenge, CHALLENGE_BYTES)) {
        comm_handshake_reject(cn,
                              "it claims rank %d but failed authentication (wrong job "
                              "secret)",
                              cn->expect_peer);
        return false;
    }
    if (t->peers[cn->expect_peer]) {
        comm_handshake_reject(cn, "rank %d is already connected", cn->expect_peer);
        return false;
    }
    return true;
}

bool comm_handshake_step(dt_conn *cn)
{
    switch (cn->hs_phase) {
    case PHASE_WAIT_CHALLENGE: return on_challenge(cn);
    case PHASE_WAIT_HELLO: on_hello(cn); return false;
    case PHASE_WAIT_RESPONSE: return on_response(cn);
    default: return false;
    }
}
