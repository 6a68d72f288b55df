/*
 * loopback_streams.c — loopback-streams: the fastest a ring of local ranks
 * could possibly move bytes, as a reference for dtrain-bench's busbw.
 *
 *   loopback-streams [-n 4] [-s 256] [-b 4]
 *
 * N processes, like N ranks; process r sends -s MiB over one TCP connection
 * to process r+1 (mod N) while it receives as much from r-1: the traffic
 * pattern of every step of a ring all-reduce, with no framing, no reduction
 * and no event loop. All streams start together (the parent releases them
 * through a pipe once every connection is up) and each reports its
 * throughput, bytes / (last byte received - start). A ring collective's
 * busbw is bounded by the per-stream figure, since busbw counts the bytes
 * on each rank's outgoing link.
 *
 * Socket buffers are set like dtrain's default (-b MiB, SO_SNDBUF and
 * SO_RCVBUF). The usage text and the parser read the same table.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dt_clock.h"
#include "dt_flags.h"

#define MAX_STREAMS 64
#define CHUNK ((size_t)1 << 20)

typedef struct stream_job {
    int fd;
    size_t bytes;
    int failed;
} stream_job;

/* A listening socket on 127.0.0.1 and an ephemeral port; -1 on failure. */
static int listen_loopback(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 4) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        perror("loopback-streams: listen");
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static void set_buffers(int fd, int mib)
{
    int bytes = mib << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

static void *send_all(void *arg)
{
    stream_job *job = arg;
    char *buf = calloc(1, CHUNK);
    for (size_t sent = 0; buf && sent < job->bytes;) {
        size_t want = job->bytes - sent < CHUNK ? job->bytes - sent : CHUNK;
        ssize_t n = send(job->fd, buf, want, 0);
        if (n <= 0) {
            job->failed = 1;
            break;
        }
        sent += (size_t)n;
    }
    free(buf);
    return NULL;
}

/* One process of the ring: connect to the next, accept the previous, wait
 * for the start, send and receive at once; returns GB/s received or -1. */
static double run_stream(int listen_fd, int next_port, size_t bytes, int buf_mib, int ready_fd,
                         int go_fd)
{
    int out = socket(AF_INET, SOCK_STREAM, 0);
    set_buffers(out, buf_mib);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)next_port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(out, (struct sockaddr *)&a, sizeof a) != 0)
        return -1;
    int in = accept(listen_fd, NULL, NULL);
    if (in < 0)
        return -1;
    set_buffers(in, buf_mib);
    char b = 1;
    if (write(ready_fd, &b, 1) != 1 || read(go_fd, &b, 1) != 1)
        return -1;
    double t0 = dt_now();
    stream_job job = {.fd = out, .bytes = bytes};
    pthread_t sender;
    if (pthread_create(&sender, NULL, send_all, &job) != 0)
        return -1;
    char *buf = malloc(CHUNK);
    size_t got = 0;
    while (buf && got < bytes) {
        ssize_t n = recv(in, buf, CHUNK, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    double t = dt_now() - t0;
    pthread_join(sender, NULL);
    free(buf);
    close(in);
    close(out);
    return got == bytes && !job.failed ? (double)bytes / t / 1e9 : -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int n = 4, mib = 256, buf_mib = 4;
    const dt_flag flags[] = {
        {"-n", NULL, "N", &n, NULL, 2, MAX_STREAMS, "streams (processes in the ring)"},
        {"-s", NULL, "N", &mib, NULL, 1, 1 << 16, "MiB each stream sends"},
        {"-b", NULL, "N", &buf_mib, NULL, 1, 256, "socket buffer MiB (SO_SNDBUF/SO_RCVBUF)"},
    };
    int n_flags = (int)(sizeof flags / sizeof flags[0]);
    int prc = dt_flags_parse("loopback-streams", flags, n_flags, argc, argv);
    if (prc == DT_FLAGS_HELP) {
        printf("usage: loopback-streams [flags]\n");
        dt_flags_usage(stdout, flags, n_flags);
        return 0;
    }
    if (prc)
        return DT_FLAGS_USAGE_ERROR;

    int listen_fds[MAX_STREAMS], ports[MAX_STREAMS], ready[2], go[2], results[2];
    for (int r = 0; r < n; r++)
        if ((listen_fds[r] = listen_loopback(&ports[r])) < 0)
            return 1;
    if (pipe(ready) || pipe(go) || pipe(results))
        return 1;
    size_t bytes = (size_t)mib << 20;
    for (int r = 0; r < n; r++) {
        if (fork() == 0) {
            double gbps = run_stream(listen_fds[r], ports[(r + 1) % n], bytes, buf_mib, ready[1],
                                     go[0]);
            _exit(write(results[1], &gbps, sizeof gbps) == sizeof gbps ? 0 : 1);
        }
    }
    char b;
    for (int r = 0; r < n; r++)
        if (read(ready[0], &b, 1) != 1)
            return 1;
    for (int r = 0; r < n; r++)
        if (write(go[1], &b, 1) != 1)
            return 1;
    double gbps[MAX_STREAMS], sum = 0;
    int failed = 0;
    for (int r = 0; r < n; r++) {
        if (read(results[0], &gbps[r], sizeof gbps[r]) != sizeof gbps[r])
            gbps[r] = -1;
        if (gbps[r] < 0)
            failed++;
        sum += gbps[r];
    }
    while (wait(NULL) > 0) {}
    if (failed) {
        fprintf(stderr, "loopback-streams: %d of %d streams failed\n", failed, n);
        return 1;
    }
    qsort(gbps, (size_t)n, sizeof gbps[0], cmp_double);
    printf("# loopback-streams: %d concurrent TCP streams on 127.0.0.1, rank r -> r+1, "
           "%d MiB each, %d MiB socket buffers\n",
           n, mib, buf_mib);
    printf("per_stream_GBps min %.3f median %.3f max %.3f mean %.3f aggregate %.3f\n", gbps[0],
           (gbps[(n - 1) / 2] + gbps[n / 2]) / 2, gbps[n - 1], sum / n, sum);
    return 0;
}
