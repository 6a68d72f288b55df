/*
 * test_failures.c — the communicator fails loudly, quickly and precisely.
 *
 * Ranks run as forked processes here, so a rank can really die (SIGKILL)
 * and a stranger can really connect from outside. Each child reports one
 * line back through a pipe: "<status> <seconds-since-boot> <message>". The
 * parent bounds every wait, and kills every child it started before the
 * test ends, so a bug fails the test instead of hanging CI.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dt_clock.h"
#include "dt_comm.h"

#define MAX_RANKS 8
static const uint8_t SECRET[] = "the job's secret";

typedef struct job {
    int n;
    char url[128];
    pid_t pid[MAX_RANKS];
    int fd[MAX_RANKS]; /* read end of each child's report pipe */
} job;

typedef void (*child_fn)(int rank, job *j, FILE *report);

static void job_url(job *j, const char *name)
{
    static int counter;
    snprintf(j->url, sizeof j->url, "file:///tmp/dtrain-test-fail-%s-%d-%d", name, getpid(),
             counter++);
}

/* A child's verdict on its op: "<status> <seconds> <message>". */
static void say(FILE *report, dt_status st, double seconds, const char *msg)
{
    fprintf(report, "%d %.6f %s\n", st, seconds, msg);
    fflush(report);
}

static dt_comm *child_join(job *j, int rank, double timeout_s, FILE *report)
{
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = rank;
    o.world_size = j->n;
    o.init_url = j->url;
    o.job_id = "failures";
    o.secret = SECRET;
    o.secret_len = sizeof SECRET;
    o.timeout_s = timeout_s;
    o.init_timeout_s = 20;
    o.log = NULL;
    dt_comm *c;
    dt_status st = dt_comm_init(&c, &o);
    if (st != DT_OK) {
        say(report, st, dt_now(), dt_comm_error(c));
        _exit(1);
    }
    return c;
}

static void start(job *j, int n, const char *name, child_fn fn)
{
    j->n = n;
    job_url(j, name);
    for (int r = 0; r < n; r++) {
        int p[2];
        cr_assert_eq(pipe(p), 0);
        pid_t pid = fork();
        cr_assert_neq(pid, -1);
        if (pid == 0) {
            close(p[0]);
            FILE *report = fdopen(p[1], "w");
            fn(r, j, report);
            fclose(report);
            _exit(0);
        }
        close(p[1]);
        j->pid[r] = pid;
        j->fd[r] = p[0];
    }
}

/* Read one report line from rank r within timeout_s; "" on timeout. */
static void report_of(job *j, int r, double timeout_s, char *line, size_t n)
{
    size_t got = 0;
    double deadline = dt_now() + timeout_s;
    line[0] = '\0';
    while (got + 1 < n) {
        int left = (int)((deadline - dt_now()) * 1000);
        struct pollfd pfd = {.fd = j->fd[r], .events = POLLIN};
        if (left <= 0 || poll(&pfd, 1, left) <= 0)
            break;
        ssize_t k = read(j->fd[r], line + got, 1);
        if (k <= 0 || line[got] == '\n')
            break;
        got += (size_t)k;
    }
    line[got] = '\0';
}

/* How a child ended, for failure messages: "running", "exit 3", "signal 11". */
static const char *child_state(job *j, int r, char *buf, size_t n)
{
    int status;
    pid_t p = waitpid(j->pid[r], &status, WNOHANG);
    if (p == 0)
        snprintf(buf, n, "running");
    else if (p < 0)
        snprintf(buf, n, "reaped");
    else if (WIFEXITED(status))
        snprintf(buf, n, "exit %d", WEXITSTATUS(status));
    else
        snprintf(buf, n, "signal %d", WTERMSIG(status));
    return buf;
}

/* Kill what is left of the job, and remove its rendezvous file: ranks
 * killed here never get to close it. */
typedef struct verdict {
    int status;
    double seconds;
    const char *msg; /* points into line */
    char line[2048];
} verdict;

/* Rank r's next verdict line (see say), asserting that one arrives. */
static void verdict_of(job *j, int r, double timeout_s, verdict *v)
{
    char state[32];
    int used = 0;
    report_of(j, r, timeout_s, v->line, sizeof v->line);
    cr_assert_eq(sscanf(v->line, "%d %lf %n", &v->status, &v->seconds, &used), 2,
                 "rank %d: no verdict ('%s', %s)", r, v->line,
                 child_state(j, r, state, sizeof state));
    v->msg = v->line + used;
}

static void finish(job *j)
{
    for (int r = 0; r < j->n; r++) {
        kill(j->pid[r], SIGKILL);
        waitpid(j->pid[r], NULL, 0);
        close(j->fd[r]);
    }
    unlink(j->url + strlen("file://"));
}

/* ---- a rank dies mid all-reduce -------------------------------------------- */

static void allreduce_forever(int rank, job *j, FILE *report)
{
    dt_comm *c = child_join(j, rank, 30, report);
    size_t n = 1 << 20;
    float *buf = calloc(n, sizeof *buf);
    for (int i = 0;; i++) {
        dt_status st = dt_allreduce(c, buf, n, DT_F32, DT_SUM);
        if (st != DT_OK) {
            say(report, st, dt_now(), dt_comm_error(c));
            break;
        }
        if (i == 3) {
            fprintf(report, "running\n");
            fflush(report);
        }
    }
    fflush(report);
    dt_comm_destroy(c);
    free(buf);
}

Test(failures, killed_rank_is_named_by_every_survivor_within_5_seconds, .timeout = 60)
{
    job j;
    char line[2048];
    start(&j, 4, "kill", allreduce_forever);
    for (int r = 0; r < 4; r++) {
        report_of(&j, r, 30, line, sizeof line);
        cr_assert_str_eq(line, "running", "rank %d did not start: '%s'", r, line);
    }
    const int victim = 2;
    kill(j.pid[victim], SIGKILL);
    double killed_at = dt_now();
    for (int r = 0; r < 4; r++) {
        if (r == victim)
            continue;
        verdict v;
        verdict_of(&j, r, 10, &v);
        cr_assert_neq(v.status, DT_OK);
        cr_expect(strstr(v.msg, "rank 2") != NULL, "rank %d's error does not name rank 2: %s", r,
                  v.msg);
        cr_expect_lt(v.seconds - killed_at, 5.0, "rank %d noticed after %.2f s", r,
                     v.seconds - killed_at);
        cr_log_info("rank %d noticed after %.3f s: %s", r, v.seconds - killed_at, v.msg);
    }
    finish(&j);
}

/* ---- a rank never shows up for an op ---------------------------------------- */

static void one_rank_skips_the_op(int rank, job *j, FILE *report)
{
    dt_comm *c = child_join(j, rank, 30, report);
    if (rank == 1) {
        sleep(5); /* never calls the all-reduce */
        dt_comm_destroy(c);
        return;
    }
    float x[4] = {1, 2, 3, 4};
    dt_op op = {.kind = DT_OP_ALLREDUCE,
                .recv = x,
                .count = 4,
                .dtype = DT_F32,
                .redop = DT_SUM,
                .timeout_s = 0.5};
    double t0 = dt_now();
    dt_status st = dt_run(c, &op);
    say(report, st, dt_now() - t0, dt_comm_error(c));
    dt_comm_destroy(c);
}

Test(failures, op_timeout_fails_the_op_and_names_the_silent_peer, .timeout = 60)
{
    job j;
    verdict v;
    start(&j, 2, "timeout", one_rank_skips_the_op);
    verdict_of(&j, 0, 20, &v);
    cr_expect_eq(v.status, DT_ETIMEDOUT, "status %d: %s", v.status, v.msg);
    cr_expect(strstr(v.msg, "rank 1") != NULL, "%s", v.msg);
    cr_expect(strstr(v.msg, "allreduce #0") != NULL, "%s", v.msg);
    cr_expect(v.seconds >= 0.5 && v.seconds < 3.0, "took %.2f s", v.seconds);
    finish(&j);
}

/* ---- ranks disagree about the count ------------------------------------------ */

static void mismatched_counts(int rank, job *j, FILE *report)
{
    dt_comm *c = child_join(j, rank, 10, report);
    size_t count = rank == 0 ? 4096 : 8192;
    float *buf = calloc(count, sizeof *buf);
    dt_status st = dt_allreduce(c, buf, count, DT_F32, DT_SUM);
    say(report, st, dt_now(), dt_comm_error(c));
    dt_comm_destroy(c);
    free(buf);
}

Test(failures, different_counts_give_a_protocol_error_with_both_views, .timeout = 60)
{
    job j;
    start(&j, 2, "mismatch", mismatched_counts);
    for (int r = 0; r < 2; r++) {
        verdict v;
        verdict_of(&j, r, 20, &v);
        cr_expect_eq(v.status, DT_EPROTO, "rank %d: status %d: %s", r, v.status, v.msg);
        cr_expect(strstr(v.msg, "4096 x f32") && strstr(v.msg, "8192 x f32"),
                  "rank %d's error lacks both views: %s", r, v.msg);
    }
    finish(&j);
}

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

Test(failures, stranger_sending_random_bytes_is_rejected_while_the_job_goes_on, .timeout = 90)
{
    stranger_test(random_bytes);
}

/* Speak the handshake correctly, but with the wrong key. */
static void wrong_secret(int port)
{
    cr_assert_geq(sodium_init(), 0);
    int fd = connect_to(port);
    uint8_t hello[48] = {0}, challenge[64], msg[1 + 48 + 64], mac[32], key[32];
    uint32_t head[4] = {0x4e525444u, 1, 3, 2}; /* magic, version, world 3, "rank 2" */
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

Test(failures, stranger_with_the_wrong_secret_is_rejected_while_the_job_goes_on, .timeout = 90)
{
    stranger_test(wrong_secret);
}

/* ---- abort unblocks a waiter ---------------------------------------------------- */

static void abort_from_another_thread(int rank, job *j, FILE *report)
{
    dt_comm *c = child_join(j, rank, 60, report);
    if (rank == 1) {
        sleep(5);
        dt_comm_destroy(c);
        return;
    }
    float x = 1;
    dt_work *w;
    dt_status st = dt_allreduce_async(c, &x, 1, DT_F32, DT_SUM, &w);
    if (st != DT_OK) {
        say(report, st, 0, dt_comm_error(c));
        _exit(1);
    }
    usleep(200 * 1000);
    double t0 = dt_now();
    dt_comm_abort(c, "test says stop");
    st = dt_work_wait(w);
    say(report, st, dt_now() - t0, dt_comm_error(c));
    dt_comm_destroy(c);
}

Test(failures, abort_unblocks_a_pending_op_at_once, .timeout = 60)
{
    job j;
    verdict v;
    start(&j, 2, "abort", abort_from_another_thread);
    verdict_of(&j, 0, 20, &v);
    cr_expect_eq(v.status, DT_EABORTED, "%s", v.msg);
    cr_expect(strstr(v.msg, "test says stop") != NULL, "%s", v.msg);
    cr_expect_lt(v.seconds, 1.0);
    finish(&j);
}

/* Rank 1 aborts and destroys its communicator at once, while rank 0 waits
 * for it in an all-reduce: rank 0 still learns the abort's reason (the
 * ABORT frames go out before the BYEs), not merely that rank 1 left. */
static void abort_then_destroy_at_once(int rank, job *j, FILE *report)
{
    dt_comm *c = child_join(j, rank, 20, report);
    if (rank == 1) {
        usleep(200 * 1000); /* rank 0 is in its all-reduce by now */
        dt_comm_abort(c, "rank 1 gives up");
        dt_comm_destroy(c);
        return;
    }
    float x = 1;
    dt_status st = dt_allreduce(c, &x, 1, DT_F32, DT_SUM);
    say(report, st, dt_now(), dt_comm_error(c));
    dt_comm_destroy(c);
}

Test(failures, an_abort_then_destroy_tells_the_peers_why, .timeout = 60)
{
    job j;
    verdict v;
    start(&j, 2, "abortdestroy", abort_then_destroy_at_once);
    verdict_of(&j, 0, 20, &v);
    cr_expect_eq(v.status, DT_EABORTED, "%s", v.msg);
    cr_expect(strstr(v.msg, "rank 1 gives up") != NULL, "%s", v.msg);
    finish(&j);
}

/* ---- abort racing the destroy it causes ------------------------------------------ */

#define ABORT_RACE_ITERATIONS 3000

static void *abort_now(void *comm)
{
    dt_comm_abort(comm, "racing a destroy");
    return NULL;
}

/* A thread that sees the abort's failure destroys the communicator at once,
 * while the aborting thread may still be inside dt_comm_abort: abort must
 * not touch the communicator after it has published the failure. A world
 * of one makes the destroy as quick as it gets, so the window is widest;
 * the ASan build turns a touch of freed memory into a crash. */
Test(failures, abort_racing_the_destroy_it_wakes_touches_nothing_freed, .timeout = 120)
{
    for (int i = 0; i < ABORT_RACE_ITERATIONS; i++) {
        dt_comm_options o;
        dt_comm_options_default(&o);
        dt_comm *c;
        cr_assert_eq(dt_comm_init(&c, &o), DT_OK, "iteration %d: %s", i, dt_comm_error(c));
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, abort_now, c), 0);
        while (dt_barrier(c) == DT_OK) /* until the abort shows */
            ;
        cr_assert(strstr(dt_comm_error(c), "racing a destroy"), "%s", dt_comm_error(c));
        dt_comm_destroy(c);
        pthread_join(t, NULL);
    }
}

/* ---- a stranger that resets in the middle of the handshake ---------------------- */

/* A well-formed HELLO (the job hash is public: a hash of the job id), then
 * a reset: rank 0's answer to it meets a dead socket. */
static void hello_then_reset(int port)
{
    uint8_t hello[48] = {0};
    uint32_t head[4] = {0x4e525444u, 1, 2, 1}; /* magic, version, world 2, "rank 1" */
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

Test(failures, a_stranger_that_resets_mid_handshake_kills_no_rank, .timeout = 60)
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

/* ---- an authenticated peer that sends garbage ------------------------------------ */

static void read_exactly(int fd, void *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t k = read(fd, (char *)buf + got, n - got);
        if (k <= 0)
            return;
        got += (size_t)k;
    }
}

typedef struct fake_peer {
    int listen_fd, done_pipe[2];
} fake_peer;

/* Plays rank 0 of a 2-rank job: answers rank 1's handshake with the job's
 * key, then sends an ABORT frame whose length (2000 B) no ABORT may have,
 * followed by that many bytes, and stays connected until told to go. */
static void *fake_rank0_sends_a_bad_abort(void *arg)
{
    fake_peer *f = arg;
    uint8_t key[32], hello[48], challenge[64], response[32], msg[1 + 48 + 32];
    crypto_generichash(key, sizeof key, SECRET, sizeof SECRET, NULL, 0);
    int fd = accept(f->listen_fd, NULL, NULL);
    read_exactly(fd, hello, sizeof hello);
    uint32_t head[4] = {0x4e525444u, 1, 2, 0}; /* magic, version, world 2, rank 0 */
    memcpy(challenge, head, sizeof head);
    randombytes_buf(challenge + 16, 16);
    msg[0] = 'A';
    memcpy(msg + 1, hello, 48);
    memcpy(msg + 49, challenge, 32);
    crypto_auth(challenge + 32, msg, sizeof msg, key);
    if (write(fd, challenge, sizeof challenge) == (ssize_t)sizeof challenge)
        read_exactly(fd, response, sizeof response);
    usleep(200 * 1000);
    static uint8_t frame[40 + 2000];
    memset(frame, 'x', sizeof frame);
    memset(frame, 0, 40);
    frame[0] = 3; /* kind: ABORT */
    int32_t root = -1;
    memcpy(frame + 4, &root, 4);
    uint64_t length = 2000;
    memcpy(frame + 32, &length, 8); /* over the longest notice */
    if (write(fd, frame, sizeof frame) != (ssize_t)sizeof frame)
        perror("fake rank 0");
    char go;
    if (read(f->done_pipe[0], &go, 1) < 0)
        perror("fake rank 0");
    close(fd);
    return NULL;
}

Test(failures, an_abort_frame_of_impossible_length_fails_the_op_and_stops, .timeout = 30)
{
    cr_assert_geq(sodium_init(), 0);
    fake_peer f;
    cr_assert_eq(pipe(f.done_pipe), 0);
    f.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    cr_assert_eq(bind(f.listen_fd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(f.listen_fd, 4), 0);
    cr_assert_eq(getsockname(f.listen_fd, (struct sockaddr *)&sa, &len), 0);

    job j = {.n = 2};
    job_url(&j, "abort");
    dt_store *s;
    cr_assert_eq(dt_store_open(&s, j.url, "failures"), DT_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "%d 127.0.0.1", ntohs(sa.sin_port));
    cr_assert_eq(dt_store_set(s, "addr/0", addr, strlen(addr)), DT_OK);
    pthread_t fake;
    cr_assert_eq(pthread_create(&fake, NULL, fake_rank0_sends_a_bad_abort, &f), 0);

    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = 1;
    o.world_size = 2;
    o.init_url = j.url;
    o.job_id = "failures";
    o.secret = SECRET;
    o.secret_len = sizeof SECRET;
    o.timeout_s = 5;
    o.init_timeout_s = 10;
    o.log = NULL;
    dt_comm *c;
    cr_assert_eq(dt_comm_init(&c, &o), DT_OK, "%s", dt_comm_error(c));
    usleep(400 * 1000); /* the frame is there before the op */
    double t0 = dt_now();
    dt_status st = dt_barrier(c);
    cr_expect_eq(st, DT_EPROTO, "barrier: %s: %s", dt_status_name(st), dt_comm_error(c));
    cr_expect_lt(dt_now() - t0, 4.0, "the failure took %.1f s to surface", dt_now() - t0);
    cr_expect_not_null(strstr(dt_comm_error(c), "ABORT frame of 2000 B"), "%s", dt_comm_error(c));
    dt_comm_destroy(c);
    cr_assert_eq(write(f.done_pipe[1], "g", 1), 1);
    pthread_join(fake, NULL);
    dt_store_close(s);
    close(f.listen_fd);
    close(f.done_pipe[0]);
    close(f.done_pipe[1]);
}
