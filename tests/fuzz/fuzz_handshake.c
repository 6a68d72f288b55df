/*
 * fuzz_handshake.c — what a stranger on a rank's port can say to it: the
 * HELLO and the RESPONSE of the acceptor's side of the handshake
 * (collectives/transport/handshake.c, read through collectives/transport/transport.c).
 *
 * Set-up (once): rank 0 of a two-rank job, on a thread, inside
 * dt_comm_init: its listener is up and its loop runs while it waits for a
 * rank 1 that never comes. Per input: a TCP connection to rank 0's port
 * sends the input's bytes, then EOF. Rank 0 must drop the stranger (it
 * cannot know the job's secret) and go on listening: the connection must
 * be closed by rank 0 within 10 s, or the input is a finding (a stranger
 * that can hold a connection open forever, or crash the rank). Any
 * sanitizer report in rank 0's threads is a finding too.
 *
 * A valid HELLO is public knowledge (magic, version, world size, a rank,
 * the hash of the job id), so the seed is one: it gets as far as rank 0's
 * CHALLENGE, and the bytes after it are the stranger's RESPONSE.
 *
 * DT_FUZZ_SEED_OUT=FILE: write that valid HELLO there.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <sys/socket.h>
#include <time.h>

#include "dt_comm.h"
#include "fuzz_util.h"

#define JOB "fuzz"
static char url[600];
static int port;

static void quiet(void *user, const char *line)
{
    (void)user, (void)line;
}

/* Rank 0 waits in init for as long as the fuzzing lasts. */
static void *rank0_main(void *arg)
{
    (void)arg;
    static const uint8_t secret[] = "a secret no stranger holds";
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = 0;
    o.world_size = 2;
    o.init_url = url;
    o.job_id = JOB;
    o.secret = secret;
    o.secret_len = sizeof secret;
    o.init_timeout_s = 1e9;
    o.log = quiet;
    dt_comm *c = NULL;
    dt_status st = dt_comm_init(&c, &o);
    /* nothing may end it: no rank 1 ever passes the handshake */
    fuzz_fail("fuzz_handshake: rank 0's init returned %s: %s", dt_status_name(st),
              c ? dt_comm_error(c) : "");
}

/* Rank 0's port, from the address it published in the store. */
static int published_port(void)
{
    dt_store *s = NULL;
    void *val = NULL;
    size_t len = 0;
    int p = 0;
    if (dt_store_open(&s, url, JOB) != DT_OK ||
        dt_store_get(s, "addr/0", &val, &len, 30) != DT_OK || sscanf(val, "%d", &p) != 1)
        abort();
    free(val);
    dt_store_close(s);
    return p;
}

static void write_seed(const char *path)
{
    uint8_t hello[48] = {0};
    uint32_t head[4] = {0x4e525444u, 2, 2, 1}; /* magic, version (handshake.c), world, rank */
    memcpy(hello, head, sizeof head);
    crypto_generichash(hello + 16, 16, (const uint8_t *)JOB, strlen(JOB), NULL, 0);
    fuzz_write_file(path, hello, sizeof hello);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    signal(SIGPIPE, SIG_IGN);
    if (sodium_init() < 0)
        abort();
    snprintf(url, sizeof url, "file://%s/store", fuzz_scratch_dir("handshake"));
    pthread_t t;
    if (pthread_create(&t, NULL, rank0_main, NULL) != 0)
        abort();
    pthread_detach(t);
    port = published_port();
    const char *seed_out = getenv("DT_FUZZ_SEED_OUT");
    if (seed_out)
        write_seed(seed_out);
    return 0;
}

/* poll(2) for up to ms milliseconds in all, resumed after a signal (libFuzzer
 * interrupts with its timers): a signal is not the silence we test for. */
static int poll_retrying(struct pollfd *p, int ms)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        int spent = (int)((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
        int rc = poll(p, 1, spent < ms ? ms - spent : 0);
        if (rc >= 0 || errno != EINTR)
            return rc;
    }
}

/* A connect(2) a signal interrupted completes on its own: wait until the
 * socket is writable and read its outcome. 0, or -1 with errno. */
static int finish_interrupted_connect(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    if (poll_retrying(&p, 10000) != 1) {
        errno = ETIMEDOUT;
        return -1;
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        return -1;
    if (err) {
        errno = err;
        return -1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* The machine's ephemeral ports can run short for a moment (other
     * sockets in TIME_WAIT): wait for one rather than call that a finding. */
    int rc, tries = 0;
    while ((rc = connect(fd, (struct sockaddr *)&sa, sizeof sa)) != 0 &&
           (errno == EADDRNOTAVAIL || errno == EAGAIN) && ++tries < 500)
        usleep(10 * 1000);
    if (rc != 0 && errno == EINTR) /* a signal (libFuzzer's timer): the connect goes on */
        rc = finish_interrupted_connect(fd);
    if (fd < 0 || rc != 0)
        fuzz_fail("fuzz_handshake: connecting to rank 0's port %d: %s", port, strerror(errno));
    for (size_t done = 0; done < size;) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0)
            break; /* rank 0 already hung up */
        done += (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    uint8_t sink[256];
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll_retrying(&p, 10000) != 1)
            fuzz_fail("fuzz_handshake: rank 0 kept a stranger's connection open for 10 s");
        if (read(fd, sink, sizeof sink) <= 0)
            break; /* closed (EOF or reset) */
    }
    /* Rank 0 has closed its end: drop ours at once rather than leave it in
     * TIME_WAIT, or a long run uses up the ephemeral ports. */
    struct linger now = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &now, sizeof now);
    close(fd);
    return 0;
}
