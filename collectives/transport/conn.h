/*
 * conn.h — internal to the transport: one TCP connection's state, and what
 * the transport's files share about connections (conn.c, handshake.c,
 * transport_read.c, transport.c, heartbeat.c, reject_log.c).
 *
 * A connection lives on the loop: every field is touched only by the thread
 * that holds it (comm_thread.c's rule, dt_transport's "loop owner only").
 * It belongs to one dt_transport (`tp`), in its `pending` list while it
 * handshakes and in its `peers` once the handshake proved who it is.
 */
#ifndef DT_CONN_H
#define DT_CONN_H

#include <sys/types.h>

#include "transport.h"

/* Receive states of one connection. */
enum {
    RX_HANDSHAKE,  /* reading a fixed-size handshake message into hs_buf */
    RX_HEADER,     /* reading a frame header */
    RX_WAIT_MATCH, /* header read, no receive posted for it yet: paused */
    RX_PAYLOAD,    /* reading the payload into rx_cur's buffer */
    RX_NOTICE,     /* reading an ABORT frame's text */
    RX_STOPPED,    /* failed or closing: nothing more is read */
};

/* Read-ahead per connection: a read at a frame boundary takes up to this
 * much, so a small frame (header + payload) costs one read(2). */
#define RX_STAGE_BYTES 16384

struct dt_conn {
    dt_transport *tp;
    uv_tcp_t tcp;
    uv_connect_t connect_req;
    int peer;        /* rank once known, else -1 */
    int expect_peer; /* outgoing connections: the rank we dialled */
    bool outgoing;
    bool authenticated;
    bool closing;
    bool bye;        /* peer said it is leaving */
    bool lost;       /* EOF or error seen */
    bool has_handle; /* tcp was initialised */
    bool shut_down;  /* our side is shut down (FIN queued): close once acknowledged */
    int hs_phase;    /* handshake step */
    char addr[64];   /* "host:port" of the peer */
    double deadline; /* handshake must finish by then */
    double retry_at; /* outgoing: reconnect after a refusal */
    struct sockaddr_storage dial_addr;
    struct dt_conn *next; /* in tp->pending while handshaking */

    int rx_state;
    size_t rx_got;  /* bytes of the current unit read so far */
    size_t rx_need; /* handshake/notice: bytes of the current unit */
    dt_frame_hdr rx_hdr;
    dt_xfer *rx_cur;                /* receive being filled */
    bool reading;                   /* uv_read_start is in effect */
    bool rx_into_stage;             /* the read in flight lands in rx_stage */
    int rx_deferred;                /* EOF/error that came behind staged frames */
    size_t stage_off, stage_len;    /* unconsumed read-ahead: [off, len) */
    char rx_stage[RX_STAGE_BYTES];  /* read-ahead at frame boundaries */
    dt_xfer *coll_head, *coll_tail; /* posted collective receives, in order */
    dt_xfer *failed_sends;          /* sends the peer refused, awaiting the reader's verdict */
    uint8_t hs_buf[128];            /* handshake messages in and out */
    uint8_t hs_hello[48];           /* kept: both MACs cover it */
    uint8_t hs_challenge[64];
    uint8_t hs_out[64];
    uv_write_t hs_write;
    char notice[DT_ERROR_MAX + 8]; /* ABORT frame: u32 status, text */
    uint32_t notice_status;

    /* liveness and progress (heartbeat.c) */
    double heard_at;  /* when bytes from the peer last arrived (or reading resumed) */
    double beat_at;   /* when we last sent it a heartbeat */
    bool peer_beat;   /* a heartbeat from it has arrived: the two below are known */
    bool peer_in_op;  /* it is running collective peer_at ... */
    uint64_t peer_at; /* ... or has not started it: the first it has not finished */
};

/* The files below come bottom first: each calls only the ones above it
 * here (tests/check_file_calls.py holds the layer to that). */

/* reject_log.c: a rejection to log or count (loop thread); the ticker's
 * summary once an interval has passed. */
void comm_reject_log_note(dt_transport *t, const char *addr, const char *why);
void comm_reject_log_tick(dt_transport *t);

/* conn.c: what the layers of a connection share (run on the loop) */
void comm_conn_release_xfer(dt_transport *t, dt_xfer *x, int state); /* hand back to owner */
void comm_conn_release_list(dt_transport *t, dt_xfer *x);            /* fail a list of receives */
void comm_conn_expect(dt_conn *cn, int state, size_t bytes);         /* the next unit to read */
void comm_conn_stop_reading(dt_conn *cn);
void comm_conn_watch_liveness(dt_conn *cn); /* the kernel watches the peer's host */
void comm_conn_close(dt_conn *cn);
void comm_conn_unlink_pending(dt_conn *cn); /* out of tp->pending */
/* During a shutdown, once no connection is left open: close the loop's own
 * handles (the ticker, the wake-up), so that the loop ends. */
void comm_conn_maybe_finish(dt_transport *t);

/* handshake.c, run on the loop: the first message of a new connection
 * (the caller then starts reading it); the next one, in hs_buf (rx_need
 * bytes), true when it proved that rank cn->expect_peer is on the other
 * end; a stranger turned away; the connection lost (err) mid-handshake. */
void comm_handshake_start_outgoing(dt_conn *cn);
void comm_handshake_start_incoming(dt_conn *cn);
bool comm_handshake_step(dt_conn *cn);
void comm_handshake_reject(dt_conn *cn, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void comm_handshake_lost(dt_conn *cn, ssize_t err);

/* transport_read.c: the reader of every connection, run on the loop:
 * reading on or off; a header that waited for its receive (rx_state
 * RX_WAIT_MATCH), matched again now that one was posted. */
void comm_transport_read_set(dt_conn *cn, bool on);
void comm_transport_read_header(dt_conn *cn);
/* Does anything posted still wait for data from this peer? */
bool comm_transport_expects_from(dt_transport *t, dt_conn *cn);
/* "send #3 with tag 7 (...)": a frame header, for messages. */
void comm_transport_describe_hdr(char *out, size_t n, const dt_frame_hdr *h);

/* transport.c, run on the loop: a send or a receive posted; a frame whose
 * bytes the loop owns (ABORT, BYE). */
void comm_transport_io_post(dt_transport *t, dt_xfer *x);
void comm_transport_send_control(dt_conn *cn, uint8_t kind, uint64_t seq, const void *payload,
                                 size_t len);

/* heartbeat.c, run on the loop: the ticker's turn (a heartbeat out to every
 * peer once a beat; a peer something posted waits on that has been silent
 * past the liveness limit fails the communicator). */
void comm_heartbeat_tick(dt_transport *t, double now);

#endif /* DT_CONN_H */
