/*
 * store_host.c — rank 0 serves a tcp:// or env:// store when nobody else
 * does, as PyTorch's rank 0 does (its TCPStore is_master).
 *
 * Under dtrain-launch the launcher of node 0 hosts the store; under srun or
 * mpirun with MASTER_ADDR and MASTER_PORT exported (torch's recipe), nobody
 * would, and every rank would wait out its start-up deadline. So rank 0,
 * before it opens the store, looks at the URL's HOST:PORT:
 *
 *   - HOST is not an address of this machine (bind says EADDRNOTAVAIL): the
 *     server is elsewhere; rank 0 is a client like the others.
 *   - something already listens there (EADDRINUSE): the launcher, or a
 *     program that hosts; rank 0 is a client.
 *   - the port is free on a local address: rank 0 starts a dt_store_server
 *     there, then opens it as a client like every rank.
 *
 * The server lives only while the job starts: rank 0's communicator is
 * ready once every other rank has connected to it, and a rank dials only
 * after it has read every address from the store, so by then nobody needs
 * the store any more; rank 0 stops it and frees the port (also when its
 * start-up fails, in dt_comm_destroy).
 *
 * Cost: one getaddrinfo and one test bind per address of HOST, on rank 0
 * only; the server is a thread with a libuv loop for the start-up's length.
 * The test bind sets SO_REUSEADDR as libuv's does, so a port left in
 * TIME_WAIT by an earlier job still counts as free.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "store_internal.h"

/* 0 if addr:port is a free local address, else bind's errno. */
static int try_bind(const struct addrinfo *a)
{
    int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return errno;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int err = bind(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    close(fd);
    return err;
}

/* Starts a server on the first address of host that is this machine's and
 * free, and says which in where; NULL when the store is someone else's. */
static dt_store_server *host_if_free(const char *host, const char *port, char *where, size_t n)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
    if (getaddrinfo(host, port, &hints, &ai) != 0)
        return NULL; /* the client's open names the resolver's answer */
    dt_store_server *server = NULL;
    for (struct addrinfo *a = ai; a && !server; a = a->ai_next) {
        char numeric[INET6_ADDRSTRLEN], err[256];
        int rc = try_bind(a);
        if (rc == EADDRINUSE)
            break; /* somebody hosts it */
        if (rc != 0 || getnameinfo(a->ai_addr, a->ai_addrlen, numeric, sizeof numeric, NULL, 0,
                                   NI_NUMERICHOST) != 0)
            continue;
        if (dt_store_server_start(&server, numeric, atoi(port), err, sizeof err) == DT_OK)
            snprintf(where, n, "%s:%s", numeric, port);
    }
    freeaddrinfo(ai);
    return server;
}

dt_store_server *comm_store_host_start(const char *url, char *where, size_t n)
{
    char host[256], port[64];
    if (!url || comm_store_tcp_server(url, host, sizeof host, port, sizeof port) != NULL)
        return NULL; /* not a TCP store, or malformed: the store's open says how */
    return host_if_free(host, port, where, n);
}
