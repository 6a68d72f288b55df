/*
 * peer_name.c — how the wire names the far end of a connection in its
 * messages: "ip:port", or "?" when the socket cannot say.
 *
 * Two places need it: a connection held on a listener is named by its
 * address the moment it is accepted (held.c: a stranger's line names it),
 * and the communicator names each peer by its connection once the wire is
 * up (comm_gloo_peer_name). Both ask the kernel the same way, here, below
 * both, so that held.c and pair.c share it without calling each other.
 *
 * Cost: one getpeername(2) and a format per name; never on a data path.
 */
#include <stdio.h>

#include "gloo.h"

void comm_gloo_tcp_name(const uv_tcp_t *tcp, char *out, size_t n)
{
    struct sockaddr_storage sa;
    int len = sizeof sa;
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    snprintf(out, n, "?");
    if (uv_tcp_getpeername(tcp, (struct sockaddr *)&sa, &len) != 0)
        return;
    if (sa.ss_family == AF_INET) {
        uv_ip4_name((const struct sockaddr_in *)&sa, ip, sizeof ip);
        port = ntohs(((const struct sockaddr_in *)&sa)->sin_port);
    } else if (sa.ss_family == AF_INET6) {
        uv_ip6_name((const struct sockaddr_in6 *)&sa, ip, sizeof ip);
        port = ntohs(((const struct sockaddr_in6 *)&sa)->sin6_port);
    }
    snprintf(out, n, "%s:%d", ip, port);
}

void comm_gloo_peer_name(const gloo_ctx *c, int peer, char *out, size_t n)
{
    const gloo_pair *p = &c->pairs[peer];
    snprintf(out, n, "?");
    if (!p->connected && p->nheld == 1) { /* not proven yet, but the only one */
        for (int i = 0; i < GLOO_HELD_MAX; i++)
            if (p->held[i].state == GLOO_HELD_READING)
                snprintf(out, n, "%s", p->held[i].addr);
        return;
    }
    if (p->tcp_open && p->conn)
        comm_gloo_tcp_name(p->conn, out, n);
}
