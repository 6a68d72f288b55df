/*
 * test_gloo_strangers.c — a stranger on a gloo-wire rank's listener during
 * the rendezvous is named "not a gloo peer" and dropped, or held until the
 * real peer proves itself, and the job starts either way.
 *
 * The gloo wire has no handshake (torch 1.13's), so which side of a pair
 * accepts is gloo's address rule: rank 1 listens on 127.0.0.2 and rank 0
 * on 127.0.0.1, so rank 1 connects and rank 0 accepts. The test starts
 * rank 0 alone, reads the address rank 0 published for rank 1 from the
 * store, connects to it as the stranger, and only then starts rank 1.
 * Ranks are threads of this process.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dt_clock.h"
#include "dt_comm.h"

typedef struct gloo_rank {
    int rank;
    const char *url, *host;
    dt_comm *comm;
    int ok;            /* the allreduce after the rendezvous gave 1 + 2 */
    uint64_t rejected; /* dt_comm_rejected_connections at the end */
    dt_status st;      /* the allreduce's */
    char log[8][512];  /* the communicator's log lines */
    atomic_int nlog;
    char err[1024];
} gloo_rank;

static void keep_line(void *user, const char *line)
{
    gloo_rank *r = user;
    int i = atomic_load(&r->nlog);
    if (i < 8) {
        snprintf(r->log[i], sizeof r->log[i], "%s", line);
        atomic_store(&r->nlog, i + 1);
    }
}

static void *rank_main(void *arg)
{
    gloo_rank *r = arg;
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = r->rank;
    o.world_size = 2;
    o.init_url = r->url;
    o.host = r->host;
    o.wire = DT_WIRE_GLOO;
    o.timeout_s = 20;
    o.init_timeout_s = 20;
    o.log = keep_line;
    o.log_user = r;
    if (dt_comm_init(&r->comm, &o) != DT_OK) {
        snprintf(r->err, sizeof r->err, "rank %d: init: %s", r->rank, dt_comm_error(r->comm));
    } else {
        float x[2] = {(float)(r->rank + 1), 1};
        r->st = dt_allreduce(r->comm, x, 2, DT_F32, DT_SUM);
        r->ok = r->st == DT_OK && x[0] == 3 && x[1] == 2;
        if (!r->ok)
            snprintf(r->err, sizeof r->err, "rank %d: allreduce: %s", r->rank,
                     dt_comm_error(r->comm));
        r->rejected = dt_comm_rejected_connections(r->comm);
    }
    dt_comm_destroy(r->comm);
    return NULL;
}

/* The port rank 0's listener for rank 1 has, from what rank 0 published. */
static int rank0_port(const char *url)
{
    dt_store *s = NULL;
    cr_assert_eq(dt_store_open_within(&s, url, "", 20), DT_OK);
    uint8_t *v = NULL;
    size_t n = 0;
    cr_assert_eq(dt_store_get(s, "default_pg/0/0/0", (void **)&v, &n, 20), DT_OK,
                 "rank 0 published no address: %s", dt_store_error(s));
    cr_assert_eq(n, 136, "one 136-byte address for the one peer");
    int port = v[2] << 8 | v[3];
    free(v);
    dt_store_close(s);
    return port;
}

static int connect_to(int port, char *addr, size_t n)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    socklen_t len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);
    snprintf(addr, n, "127.0.0.1:%d", ntohs(sa.sin_port));
    return fd;
}

/* True when the other end closes fd within limit_s. */
static bool closed_within(int fd, double limit_s)
{
    char buf[64];
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    double deadline = dt_now() + limit_s;
    while (dt_now() < deadline)
        if (poll(&pfd, 1, 50) > 0 && read(fd, buf, sizeof buf) <= 0)
            return true;
    return false;
}

static bool logged(gloo_rank *r, const char *a, const char *b)
{
    for (int i = 0; i < atomic_load(&r->nlog); i++)
        if (strstr(r->log[i], a) && strstr(r->log[i], b))
            return true;
    return false;
}

typedef struct job {
    char url[128];
    gloo_rank ranks[2];
    pthread_t t[2];
} job;

static void start_rank(job *j, int rank)
{
    j->ranks[rank] =
        (gloo_rank){.rank = rank, .url = j->url, .host = rank == 0 ? "127.0.0.1" : "127.0.0.2"};
    cr_assert_eq(pthread_create(&j->t[rank], NULL, rank_main, &j->ranks[rank]), 0);
}

static void start_rank0(job *j, const char *name)
{
    snprintf(j->url, sizeof j->url, "file:///tmp/dtrain-test-gloo-strangers-%d-%s", (int)getpid(),
             name);
    unlink(j->url + 7); /* torch's key space: no handle removes it */
    start_rank(j, 0);
}

static void finish(job *j)
{
    for (int r = 0; r < 2; r++)
        pthread_join(j->t[r], NULL);
    unlink(j->url + 7);
    for (int r = 0; r < 2; r++)
        cr_expect(j->ranks[r].ok, "%s", j->ranks[r].err);
}

Test(gloo_strangers, a_stranger_that_sends_no_gloo_preamble_is_named_and_dropped_and_the_peer_joins,
     .timeout = 60)
{
    static job j;
    start_rank0(&j, "garbage");
    char addr[64];
    int fd = connect_to(rank0_port(j.url), addr, sizeof addr);
    const char hello[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    cr_assert_eq(write(fd, hello, sizeof hello - 1), (ssize_t)(sizeof hello - 1));
    /* rank 1 has not started: only rank 0 can have ended the connection */
    cr_expect(closed_within(fd, 5), "rank 0 kept a connection that sent HTTP");
    close(fd);
    start_rank(&j, 1);
    finish(&j);
    cr_expect(logged(&j.ranks[0], "not a gloo peer", addr), "rank 0 names the stranger (%s): %s",
              addr, j.ranks[0].log[1]);
    cr_expect(logged(&j.ranks[0], "gloo rank 0", "during the rendezvous"));
    cr_expect_eq(j.ranks[0].rejected, 1, "counted as a rejected connection");
}

Test(gloo_strangers, a_silent_stranger_is_held_until_the_peer_proves_itself_then_dropped,
     .timeout = 60)
{
    static job j;
    start_rank0(&j, "silent");
    char addr[64];
    int fd = connect_to(rank0_port(j.url), addr, sizeof addr);
    start_rank(&j, 1);
    finish(&j);
    cr_expect(closed_within(fd, 5), "rank 0 kept the silent stranger after the peer spoke");
    close(fd);
    cr_expect(logged(&j.ranks[0], addr, "sent nothing"),
              "rank 0 names the silent stranger (%s) it dropped", addr);
}

/* Rank 1 is the test, by hand: it publishes its address, connects to
 * rank 0's listener, says nothing, closes, and only then joins the store
 * barrier, so rank 0 sees its one connection end unproven during the
 * rendezvous. That was the peer's end (every peer connects before the
 * barrier), so rank 0's allreduce fails at once naming peer 1, not at the
 * op timeout (20 s). */
Test(gloo_strangers, a_peer_that_leaves_before_it_spoke_is_lost_not_waited_for, .timeout = 60)
{
    static job j;
    start_rank0(&j, "leaves");
    int port = rank0_port(j.url);
    dt_store *s = NULL;
    cr_assert_eq(dt_store_open_within(&s, j.url, "", 20), DT_OK);
    cr_assert_eq(dt_store_set(s, "default_pg/0/0/rank_1", "test", 4), DT_OK);
    uint8_t blob[136] = {2, 0, 0x30, 0x39, 127, 0, 0, 2}; /* 127.0.0.2:12345: rank 0 accepts */
    memset(blob + 128, 0xff, 8);
    cr_assert_eq(dt_store_set(s, "default_pg/0/0/1", blob, sizeof blob), DT_OK);
    char addr[64];
    int fd = connect_to(port, addr, sizeof addr);
    usleep(200 * 1000); /* rank 0 holds it */
    close(fd);
    usleep(200 * 1000); /* rank 0 reads its end, still in the rendezvous */
    int64_t count = 0;
    double t0 = dt_now();
    cr_assert_eq(dt_store_add(s, "default_pg/store_based_barrier_key:1", 1, &count), DT_OK);
    pthread_join(j.t[0], NULL);
    double took = dt_now() - t0;
    dt_store_close(s);
    unlink(j.url + 7);
    cr_expect_eq(j.ranks[0].st, DT_EPEER, "%s", j.ranks[0].err);
    cr_expect(strstr(j.ranks[0].err, "lost peer 1"), "%s", j.ranks[0].err);
    cr_expect(took < 10, "rank 0 waited %.1f s: the op timeout, not the peer's end", took);
}
