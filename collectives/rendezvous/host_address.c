/*
 * host_address.c — which address a rank listens on and publishes.
 *
 * In order: DT_IFNAME's interface (its IPv4 address), DT_HOST as given, and
 * otherwise the address this machine's routing table would use to reach
 * the store's server, when the store is tcp://HOST:PORT or env://
 * (MASTER_ADDR) and that server is not on loopback: the interface that
 * reaches node 0 is, on every cluster we know, the one the other nodes
 * reach this one by too. It is found the way NCCL and Gloo find it: a UDP
 * socket "connected" to the server (no packet leaves; the kernel only
 * picks a route and a source address), then getsockname. Anything else
 * (a file:// store, a server on loopback) keeps 127.0.0.1: one machine.
 * Cost: one socket and one route lookup per communicator, at start-up.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uv.h>

#include "store_internal.h"

char *comm_host_address_of_interface(const char *name)
{
    uv_interface_address_t *ifs;
    int n;
    char ip[INET_ADDRSTRLEN], *found = NULL;
    if (uv_interface_addresses(&ifs, &n) != 0)
        return NULL;
    for (int i = 0; i < n && !found; i++) {
        if (strcmp(ifs[i].name, name) != 0 || ifs[i].address.address4.sin_family != AF_INET)
            continue;
        uv_ip4_name(&ifs[i].address.address4, ip, sizeof ip);
        found = strdup(ip);
    }
    uv_free_interface_addresses(ifs, n);
    return found;
}

char *comm_host_address_toward_store(const char *url)
{
    char host[256], port[64], ip[INET_ADDRSTRLEN];
    if (!url || comm_store_tcp_server(url, host, sizeof host, port, sizeof port) != NULL)
        return NULL;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    if (getaddrinfo(host, "9", &hints, &res) != 0 || !res)
        return NULL;
    struct sockaddr_in to = *(const struct sockaddr_in *)res->ai_addr, self;
    freeaddrinfo(res);
    if ((ntohl(to.sin_addr.s_addr) >> 24) == 127)
        return NULL; /* one machine */
    socklen_t len = sizeof self;
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    bool ok = fd >= 0 && connect(fd, (const struct sockaddr *)&to, sizeof to) == 0 &&
              getsockname(fd, (struct sockaddr *)&self, &len) == 0;
    if (fd >= 0)
        close(fd);
    if (!ok || !inet_ntop(AF_INET, &self.sin_addr, ip, sizeof ip))
        return NULL;
    return strdup(ip);
}
