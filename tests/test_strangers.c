/*
 * test_strangers.c — whoever connects to a rank's port without being a rank
 * of the job (random bytes, the wrong secret, a reset in the middle of the
 * handshake) is turned away, and the job goes on undisturbed.
 *
 * Ranks are forked processes (fork_job.h); the stranger is the test itself.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sodium.h>
#include <sys/socket.h>

#include "fork_job.h"

#define PROTOCOL_VERSION 2 /* collectives/transport/handshake.c's HS_VERSION */

/* ---- strangers on the port ------------------------------------------------------ */

/* The children report their port, wait for "go" (the stranger has been
 * rejected), then run collectives and report how many they rejected. */
static int go_pipe[2];

static void wait_then_allreduce(int rank, job *j, FILE *report)
{
    dt_comm *c = child_join(j, rank, 20, report);
    fprintf(report, "port %d\n", dt_comm_port(c));
    fflush(report);
    char go;
    if (read(go_pipe[0], &go, 1) != 1)
        _exit(2);
    int ok = 1;
    for (int i = 0; i < 10 && ok; i++) {
        int32_t x[3] = {rank, 1, i};
        ok = dt_allreduce(c, x, 3, DT_I32, DT_SUM) == DT_OK && x[0] == 3 && x[1] == 3 &&
             x[2] == 3 * i;
    }
    fprintf(report, "%d %llu %s\n", ok, (unsigned long long)dt_comm_rejected_connections(c),
            dt_comm_error(c));
    fflush(report);
    dt_comm_destroy(c);
}

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

/* True when the peer closes the connection within 5 s. */
static bool closed_by_peer(int fd)
{
    char buf[256];
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    double deadline = dt_now() + 5;
    while (dt_now() < deadline) {
        if (poll(&pfd, 1, 100) > 0 && read(fd, buf, sizeof buf) <= 0)
            return true;
    }
    return false;
}

static void stranger_test(void (*stranger)(int port))
{
    job j;
    char line[2048];
    cr_assert_eq(pipe(go_pipe), 0);
    start(&j, 3, "stranger", wait_then_allreduce);
    int port = 0;
    for (int r = 0; r < 3; r++) {
        report_of(&j, r, 30, line, sizeof line);
        if (r == 0)
            cr_assert_eq(sscanf(line, "port %d", &port), 1, "rank 0: '%s'", line);
    }
    stranger(port);
    cr_assert_eq(write(go_pipe[1], "ggg", 3), 3);
    for (int r = 0; r < 3; r++) {
        report_of(&j, r, 30, line, sizeof line);
        int ok = 0;
        unsigned long long rejected = 0;
        cr_assert_eq(sscanf(line, "%d %llu", &ok, &rejected), 2, "rank %d: '%s'", r, line);
        cr_expect_eq(ok, 1, "rank %d's all-reduces failed: %s", r, line);
        if (r == 0)
            cr_expect_eq(rejected, 1, "rank 0 rejected %llu connections", rejected);
    }
    finish(&j);
    close(go_pipe[0]);
    close(go_pipe[1]);
}

static void random_bytes(int port)
{
    int fd = connect_to(port);
    uint8_t junk[64];
    randombytes_buf(junk, sizeof junk);
    cr_assert_eq(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    cr_expect(closed_by_peer(fd), "rank 0 kept a connection that sent random bytes");
    close(fd);
}

Test(strangers, stranger_sending_random_bytes_is_rejected_while_the_job_goes_on, .timeout = 90)
{
    stranger_test(random_bytes);
}

/* Speak the handshake correctly, but with the wrong key. */
static void wrong_secret(int port)
{
    cr_assert_geq(sodium_init(), 0);
    int fd = connect_to(port);
    uint8_t hello[48] = {0}, challenge[64], msg[1 + 48 + 64], mac[32], key[32];
    uint32_t head[4] = {0x4e525444u, PROTOCOL_VERSION, 3, 2}; /* magic, version, world, rank */
    memcpy(hello, head, sizeof head);
    crypto_generichash(hello + 16, 16, (const uint8_t *)"failures", 8, NULL, 0);
    randombytes_buf(hello + 32, 16);
    cr_assert_eq(write(fd, hello, sizeof hello), (ssize_t)sizeof hello);
    size_t got = 0;
    while (got < sizeof challenge) {
        ssize_t k = read(fd, challenge + got, sizeof challenge - got);
        cr_assert_gt(k, 0, "rank 0 closed before its challenge");
        got += (size_t)k;
    }
    crypto_generichash(key, sizeof key, (const uint8_t *)"not the secret", 14, NULL, 0);
    msg[0] = 'D';
    memcpy(msg + 1, hello, 48);
    memcpy(msg + 49, challenge, 64);
    crypto_auth(mac, msg, sizeof msg, key);
    cr_assert_eq(write(fd, mac, sizeof mac), (ssize_t)sizeof mac);
    cr_expect(closed_by_peer(fd), "rank 0 kept a connection with the wrong secret");
    close(fd);
}

Test(strangers, stranger_with_the_wrong_secret_is_rejected_while_the_job_goes_on, .timeout = 90)
{
    stranger_test(wrong_secret);
}

/* A rank of this job built before HEARTBEAT frames (protocol version 1):
 * its HELLO is refused at once, before any challenge, by name. */
static void version_1_hello(int port)
{
    int fd = connect_to(port);
    uint8_t hello[48] = {0};
    uint32_t head[4] = {0x4e525444u, 1, 3, 2}; /* magic, version 1, world 3, rank 2 */
    memcpy(hello, head, sizeof head);
    crypto_generichash(hello + 16, 16, (const uint8_t *)"failures", 8, NULL, 0);
    cr_assert_eq(write(fd, hello, sizeof hello), (ssize_t)sizeof hello);
    uint8_t challenge[64];
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    ssize_t k = poll(&pfd, 1, 5000) == 1 ? read(fd, challenge, sizeof challenge) : -1;
    cr_expect_eq(k, 0, "rank 0 answered a version-1 HELLO (%zd bytes) instead of closing", k);
    close(fd);
}

Test(strangers, a_rank_of_protocol_version_1_is_refused_at_its_hello_while_the_job_goes_on,
     .timeout = 90)
{
    stranger_test(version_1_hello);
}

/* ---- a stranger that resets in the middle of the handshake ---------------------- */

/* A well-formed HELLO (the job hash is public: a hash of the job id), then
 * a reset: rank 0's answer to it meets a dead socket. */
static void hello_then_reset(int port)
{
    uint8_t hello[48] = {0};
    uint32_t head[4] = {0x4e525444u, PROTOCOL_VERSION, 2, 1}; /* magic, version, world, rank */
    memcpy(hello, head, sizeof head);
    crypto_generichash(hello + 16, 16, (const uint8_t *)"failures", 8, NULL, 0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        write(fd, hello, sizeof hello) == (ssize_t)sizeof hello) {
        struct linger now = {1, 0}; /* close sends RST */
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &now, sizeof now);
        shutdown(fd, SHUT_WR);
    }
    close(fd);
}

/* Rank 0 lets a resetting stranger in right before each barrier, so the
 * barrier's own loop (on this thread, SIGPIPE at its default: fatal) is
 * the one that answers it. */
static void barriers_beside_resetting_strangers(int rank, job *j, FILE *report)
{
    signal(SIGPIPE, SIG_DFL);
    cr_assert_geq(sodium_init(), 0);
    dt_comm *c = child_join(j, rank, 20, report);
    for (int i = 0; i < 20; i++) {
        if (rank == 0)
            hello_then_reset(dt_comm_port(c));
        dt_status st = dt_barrier(c);
        if (st != DT_OK) {
            say(report, st, dt_now(), dt_comm_error(c));
            return;
        }
    }
    say(report, DT_OK, dt_now(), "20 barriers");
    dt_comm_destroy(c);
}

Test(strangers, a_stranger_that_resets_mid_handshake_kills_no_rank, .timeout = 60)
{
    job j;
    verdict v;
    start(&j, 2, "reset", barriers_beside_resetting_strangers);
    for (int r = 0; r < 2; r++) {
        verdict_of(&j, r, 40, &v);
        cr_expect_eq(v.status, DT_OK, "rank %d: %s", r, v.msg);
    }
    finish(&j);
}

/* ---- a rank of the job that holds another secret --------------------------------- */

/* Ranks started by hand at an env:// store (rank 0 hosts it), one of them
 * with another DT_SECRET: it cannot pass the handshake with the others,
 * nor they with it. The rank that finds out tells the others through the
 * store, so nobody waits out the 60 s start-up deadline. */
static int odd_rank;
static char store_port[16];

static void join_holding_secret(int rank, job *j, FILE *report)
{
    static const uint8_t other[] = "another job's secret";
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", store_port, 1);
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = rank;
    o.world_size = j->n;
    o.init_url = "env://";
    o.job_id = "failures";
    o.secret = rank == odd_rank ? other : SECRET;
    o.secret_len = rank == odd_rank ? sizeof other : sizeof SECRET;
    o.init_timeout_s = 60;
    double t0 = dt_now();
    dt_comm *c;
    dt_status st = dt_comm_init(&c, &o);
    say(report, st, dt_now() - t0, dt_comm_error(c));
    dt_comm_destroy(c);
}

static int unused_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

/* Every rank fails within 10 s, saying that authentication failed and
 * naming the odd rank (its own message names the rank it could not
 * authenticate, and itself). */
static void every_rank_fails_fast_naming(int odd)
{
    job j;
    verdict v;
    char odd_name[16];
    odd_rank = odd;
    snprintf(store_port, sizeof store_port, "%d", unused_port());
    snprintf(odd_name, sizeof odd_name, "rank %d ", odd);
    start(&j, 3, "secret", join_holding_secret);
    for (int r = 0; r < 3; r++) {
        verdict_of(&j, r, 30, &v);
        cr_expect_eq(v.status, DT_EPEER, "rank %d: status %d: %s", r, v.status, v.msg);
        cr_expect_lt(v.seconds, 10.0, "rank %d failed after %.1f s: %s", r, v.seconds, v.msg);
        cr_expect(strstr(v.msg, "failed authentication"), "rank %d: %s", r, v.msg);
        cr_expect(strstr(v.msg, odd_name), "rank %d does not name rank %d: %s", r, odd, v.msg);
    }
    finish(&j);
}

Test(strangers, a_rank_with_another_secret_fails_every_rank_fast_when_it_accepts, .timeout = 60)
{
    every_rank_fails_fast_naming(0);
}

Test(strangers, a_rank_with_another_secret_fails_every_rank_fast_when_it_dials, .timeout = 60)
{
    every_rank_fails_fast_naming(2);
}
