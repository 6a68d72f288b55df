/*
 * pair.c — one connection per pair of ranks, made by gloo 5b14351's rule.
 *
 * Each pair has its own listening socket (bound to host:0, backlog 1),
 * whose address is what this rank publishes for that peer (the 136-byte
 * blob below). Given the peer's blob, the side with the larger address
 * connects and the other accepts: the IP bytes compare first (memcmp,
 * network order); on a tie the two ports compare as their network-order
 * bytes read as a little-endian u16 — the byte-swapped port number, which
 * is what gloo computes, so a plain numeric comparison would deadlock
 * against torch. The listener is closed once a connection it accepted has
 * proven itself the peer (held.c), or at once on the connecting side.
 *
 * There is no handshake: the first connection whose first message is a
 * gloo announcement is the peer. This wire therefore has no
 * authentication (dtrain's own wire has one), as torch's gloo. After
 * connecting: TCP_NODELAY, non-blocking (libuv), and reading starts
 * (frame.c).
 *
 * Cost: per rank p-1 listening ports and p-1 connections, once.
 */
#include <string.h>

#include "gloo.h"

/* gloo's tcp::Address: sockaddr_storage then an int64 sequence number (-1).
 * gloo leaves the unused sockaddr bytes as stack garbage; here they are 0. */
void comm_gloo_pair_address(const gloo_pair *p, uint8_t out[GLOO_ADDRESS_BYTES])
{
    memset(out, 0, GLOO_ADDRESS_BYTES);
    memcpy(out, &p->self, sizeof p->self);
    memset(out + sizeof(struct sockaddr_storage), 0xff, 8);
}

static void on_accept(uv_stream_t *server, int status)
{
    gloo_pair *p = server->data;
    gloo_ctx *c = p->ctx;
    if (status != 0) {
        comm_gloo_fail(c, DT_EPEER, "gloo rank %d: accepting peer %d: %s", c->rank, p->peer,
                       uv_strerror(status));
        return;
    }
    comm_gloo_held_accept(p); /* held until its first message proves it the peer */
}

static void on_connect(uv_connect_t *req, int status)
{
    gloo_pair *p = req->data;
    if (status == UV_ECANCELED)
        return;
    if (status != 0) {
        comm_gloo_fail(p->ctx, DT_EPEER, "gloo rank %d: connecting to peer %d: %s", p->ctx->rank,
                       p->peer, uv_strerror(status));
        return;
    }
    comm_gloo_frame_start(p);
}

dt_status comm_gloo_pair_listen(gloo_pair *p, const char *host)
{
    gloo_ctx *c = p->ctx;
    struct sockaddr_storage addr;
    int rc = uv_ip4_addr(host, 0, (struct sockaddr_in *)&addr);
    if (rc != 0)
        rc = uv_ip6_addr(host, 0, (struct sockaddr_in6 *)&addr);
    if (rc != 0)
        return comm_gloo_fail(c, DT_EINVAL, "gloo rank %d: '%s' is not an IP address to listen on",
                              c->rank, host);
    uv_tcp_init(&c->loop, &p->listener);
    p->listener.data = p;
    p->listener_open = true;
    int len = sizeof p->self;
    memset(&p->self, 0, sizeof p->self);
    if ((rc = uv_tcp_bind(&p->listener, (struct sockaddr *)&addr, 0)) != 0 ||
        (rc = uv_listen((uv_stream_t *)&p->listener, 1, on_accept)) != 0 ||
        (rc = uv_tcp_getsockname(&p->listener, (struct sockaddr *)&p->self, &len)) != 0)
        return comm_gloo_fail(c, DT_ESYS, "gloo rank %d: cannot listen on %s for peer %d: %s",
                              c->rank, host, p->peer, uv_strerror(rc));
    return DT_OK;
}

/* gloo's comparison: > 0 this side connects, < 0 it accepts, 0 is itself. */
static int compare(const uint8_t *self, const uint8_t *peer)
{
    uint16_t family;
    memcpy(&family, self, 2);
    int c = family == AF_INET6 ? memcmp(self + 8, peer + 8, 16) : memcmp(self + 4, peer + 4, 4);
    if (c != 0)
        return c;
    uint16_t sp = (uint16_t)(self[2] | self[3] << 8), pp = (uint16_t)(peer[2] | peer[3] << 8);
    return (int)sp - (int)pp;
}

dt_status comm_gloo_pair_connect(gloo_pair *p, const uint8_t addr[GLOO_ADDRESS_BYTES])
{
    gloo_ctx *c = p->ctx;
    uint8_t self[GLOO_ADDRESS_BYTES];
    comm_gloo_pair_address(p, self);
    if (memcmp(self, addr, 2) != 0)
        return comm_gloo_fail(c, DT_EPROTO,
                              "gloo rank %d: peer %d listens on another address family (IPv4 vs "
                              "IPv6): give every rank an address of the same family",
                              c->rank, p->peer);
    int order = compare(self, addr);
    if (order == 0)
        return comm_gloo_fail(c, DT_EPROTO,
                              "gloo rank %d: peer %d published this rank's own address", c->rank,
                              p->peer);
    if (order < 0)
        return DT_OK; /* the listener accepts (on_accept) */
    comm_gloo_close_listener(p);
    struct sockaddr_storage to;
    memcpy(&to, addr, sizeof to);
    uv_tcp_init(&c->loop, &p->tcp);
    p->conn = &p->tcp;
    p->tcp_open = true;
    p->connect_req.data = p;
    int rc = uv_tcp_connect(&p->connect_req, &p->tcp, (struct sockaddr *)&to, on_connect);
    if (rc != 0)
        return comm_gloo_fail(c, DT_EPEER, "gloo rank %d: connecting to peer %d: %s", c->rank,
                              p->peer, uv_strerror(rc));
    return DT_OK;
}
