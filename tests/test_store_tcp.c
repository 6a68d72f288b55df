/*
 * test_store_tcp.c — the TCP store (tcp://, env://): its server and its
 * client, on loopback, one test per promise.
 *
 * Each test starts its own server on 127.0.0.1 with a free port; ranks are
 * dt_store handles (threads where they must run at once). Strangers are raw
 * sockets speaking the wire format by hand (docs/store-tcp.md). Helper
 * threads never assert; the test thread checks what they recorded.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dt_clock.h"
#include "dt_comm.h"

typedef struct server {
    dt_store_server *srv;
    char url[64];
    int port;
} server;

static server start_server(void)
{
    server s;
    char err[256];
    cr_assert_eq(dt_store_server_start(&s.srv, "127.0.0.1", 0, err, sizeof err), DT_OK, "%s", err);
    s.port = dt_store_server_port(s.srv);
    snprintf(s.url, sizeof s.url, "tcp://127.0.0.1:%d", s.port);
    return s;
}

static dt_store *open_store(const char *url, const char *job)
{
    dt_store *st;
    dt_status rc = dt_store_open(&st, url, job);
    cr_assert_eq(rc, DT_OK, "open %s: %s", url, dt_store_error(st));
    return st;
}

static char *get_string(dt_store *st, const char *key)
{
    void *v;
    size_t n;
    cr_assert_eq(dt_store_get(st, key, &v, &n, 5.0), DT_OK, "%s", dt_store_error(st));
    return v;
}

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* True if the server closes fd within 5 s (recv sees EOF or a reset). */
static bool closed_by_server(int fd)
{
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b[16];
    return recv(fd, b, sizeof b, 0) <= 0 && (errno != EAGAIN && errno != EWOULDBLOCK);
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* ---- operations ----------------------------------------------------------------- */

Test(store_tcp, a_value_set_by_one_rank_is_read_by_another, .timeout = 20)
{
    server s = start_server();
    dt_store *a = open_store(s.url, "job"), *b = open_store(s.url, "job");
    cr_assert_eq(dt_store_set(a, "addr/0", "1234 10.0.0.1", 13), DT_OK);
    char *v = get_string(b, "addr/0");
    cr_expect_str_eq(v, "1234 10.0.0.1");
    free(v);
    dt_store_close(a);
    dt_store_close(b);
    dt_store_server_stop(s.srv);
}

typedef struct later_set {
    const char *url;
    dt_status rc;
} later_set;

static void *set_after_200ms(void *arg)
{
    later_set *l = arg;
    dt_store *st;
    l->rc = dt_store_open(&st, l->url, "job");
    struct timespec nap = {0, 200000000L};
    nanosleep(&nap, NULL);
    if (l->rc == DT_OK)
        l->rc = dt_store_set(st, "late", "yes", 3);
    dt_store_close(st);
    return NULL;
}

Test(store_tcp, get_waits_for_a_key_set_later, .timeout = 20)
{
    server s = start_server();
    dt_store *a = open_store(s.url, "job");
    later_set l = {.url = s.url};
    pthread_t t;
    pthread_create(&t, NULL, set_after_200ms, &l);
    char *v = get_string(a, "late");
    pthread_join(t, NULL);
    cr_expect_eq(l.rc, DT_OK);
    cr_expect_str_eq(v, "yes");
    free(v);
    dt_store_close(a);
    dt_store_server_stop(s.srv);
}

static void *add_100_times(void *arg)
{
    dt_store *st;
    if (dt_store_open(&st, arg, "job") == DT_OK)
        for (int i = 0; i < 100; i++)
            dt_store_add(st, "counter", 1, NULL);
    dt_store_close(st);
    return NULL;
}

Test(store_tcp, add_from_four_ranks_at_once_loses_no_increment, .timeout = 30)
{
    server s = start_server();
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, add_100_times, s.url);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    dt_store *a = open_store(s.url, "job");
    int64_t sum = 0;
    cr_assert_eq(dt_store_add(a, "counter", 0, &sum), DT_OK, "%s", dt_store_error(a));
    cr_expect_eq(sum, 400);
    char *v = get_string(a, "counter");
    cr_expect_str_eq(v, "400", "add stores decimal text, as torch's server does");
    free(v);
    dt_store_close(a);
    dt_store_server_stop(s.srv);
}

Test(store_tcp, a_timed_out_wait_names_the_missing_key_and_the_store_still_works, .timeout = 20)
{
    server s = start_server();
    dt_store *a = open_store(s.url, "job");
    cr_assert_eq(dt_store_set(a, "here", "1", 1), DT_OK);
    const char *keys[] = {"here", "addr/3"};
    cr_assert_eq(dt_store_wait(a, keys, 2, 0.2), DT_ETIMEDOUT);
    cr_expect(strstr(dt_store_error(a), "'addr/3'"), "%s", dt_store_error(a));
    cr_expect(!strstr(dt_store_error(a), "'here'"), "%s", dt_store_error(a));
    char *v = get_string(a, "here");
    cr_expect_str_eq(v, "1");
    free(v);
    dt_store_close(a);
    dt_store_server_stop(s.srv);
}

Test(store_tcp, jobs_sharing_a_server_do_not_see_each_others_keys, .timeout = 20)
{
    server s = start_server();
    dt_store *a = open_store(s.url, "job-a"), *b = open_store(s.url, "job-b");
    cr_assert_eq(dt_store_set(a, "secretless", "a", 1), DT_OK);
    void *v;
    size_t n;
    cr_expect_eq(dt_store_get(b, "secretless", &v, &n, 0.2), DT_ETIMEDOUT);
    dt_store_close(a);
    dt_store_close(b);
    dt_store_server_stop(s.srv);
}

Test(store_tcp, env_url_without_master_port_says_which_variable_is_missing, .timeout = 10)
{
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    unsetenv("MASTER_PORT");
    dt_store *st;
    cr_expect_eq(dt_store_open(&st, "env://", "job"), DT_EINVAL);
    cr_expect(strstr(dt_store_error(st), "MASTER_PORT"), "%s", dt_store_error(st));
    dt_store_close(st);
}

Test(store_tcp, env_url_reaches_the_server_at_master_addr_and_port, .timeout = 20)
{
    server s = start_server();
    char port[16];
    snprintf(port, sizeof port, "%d", s.port);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port, 1);
    dt_store *a = open_store("env://", "job"), *b = open_store(s.url, "job");
    cr_assert_eq(dt_store_set(a, "k", "v", 1), DT_OK);
    char *v = get_string(b, "k");
    cr_expect_str_eq(v, "v");
    free(v);
    dt_store_close(a);
    dt_store_close(b);
    dt_store_server_stop(s.srv);
}

/* ---- a client that cannot reach its server ------------------------------------- */

/* A port nobody listens on: bound, never listened. With `held` the socket
 * stays bound (a connect is refused, and no other socket of the machine
 * can take the port meanwhile); without, it is closed. */
static int unbound_port(int *held)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t len = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    if (held)
        *held = fd;
    else
        close(fd);
    return ntohs(a.sin_port);
}

static int unused_port(void)
{
    return unbound_port(NULL);
}

Test(store_tcp, no_server_fails_at_the_connect_timeout_naming_the_refusal, .timeout = 20)
{
    char url[64];
    int held;
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", unbound_port(&held));
    dt_store *st;
    double t0 = dt_now();
    cr_assert_eq(dt_store_open_within(&st, url, "job", 1.0), DT_ETIMEDOUT, "%s",
                 dt_store_error(st));
    double took = dt_now() - t0;
    cr_expect(took >= 1.0 && took < 3.0, "gave up after %.2f s, not 1 s", took);
    cr_expect(strstr(dt_store_error(st), "within 1 s"), "%s", dt_store_error(st));
    cr_expect(strstr(dt_store_error(st), "Connection refused"), "%s", dt_store_error(st));
    dt_store_close(st);
    close(held);
}

/* A name the resolver says does not exist fails at once; only a resolver
 * that cannot answer (no DNS reachable) is waited for, like a server that is
 * not up yet, and is named when the time is up. */
Test(store_tcp, a_store_host_that_does_not_resolve_is_named, .timeout = 60)
{
    const char *host = "no-such-host.invalid"; /* RFC 2606: never resolves */
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int gai = getaddrinfo(host, "29500", &hints, &ai);
    if (ai)
        freeaddrinfo(ai);
    cr_assert_neq(gai, 0, "%s resolved", host);
    dt_store *st;
    double t0 = dt_now();
    dt_status rc = dt_store_open_within(&st, "tcp://no-such-host.invalid:29500", "job", 20.0);
    double took = dt_now() - t0;
    const char *msg = dt_store_error(st);
    cr_expect(strstr(msg, host), "%s", msg);
    if (gai == EAI_AGAIN) {
        cr_expect_eq(rc, DT_ETIMEDOUT, "%s", msg);
        cr_expect(strstr(msg, gai_strerror(EAI_AGAIN)), "%s", msg);
    } else {
        cr_expect_eq(rc, DT_EINVAL, "%s", msg);
        cr_expect(strstr(msg, "cannot resolve"), "%s", msg);
        cr_expect_lt(took, 10.0, "a name that does not exist was waited for %.1f s", took);
    }
    dt_store_close(st);
}

/* Something that is not a store listens at the port (a web server, say). */
static void *answer_like_http(void *arg)
{
    int lfd = *(int *)arg, fd = accept(lfd, NULL, NULL);
    char buf[256];
    if (fd >= 0 && recv(fd, buf, sizeof buf, 0) > 0) {
        const char reply[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
        (void)send(fd, reply, sizeof reply - 1, MSG_NOSIGNAL);
        while (recv(fd, buf, sizeof buf, 0) > 0) /* until the client hangs up: */
            ; /* closing while it still writes would make its next write fail first */
    }
    if (fd >= 0)
        close(fd);
    return NULL;
}

Test(store_tcp, a_port_that_answers_like_no_store_is_named_not_waited_on, .timeout = 20)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t len = sizeof a;
    cr_assert_eq(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(lfd, 1), 0);
    cr_assert_eq(getsockname(lfd, (struct sockaddr *)&a, &len), 0);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, answer_like_http, &lfd), 0);
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", ntohs(a.sin_port));
    dt_store *st = open_store(url, "job");
    void *v = NULL;
    size_t n;
    cr_expect_eq(dt_store_get(st, "k", &v, &n, 10.0), DT_ESTORE, "%s", dt_store_error(st));
    cr_expect(strstr(dt_store_error(st), "('H'), which no TCPStore server sends"), "%s",
              dt_store_error(st));
    dt_store_close(st);
    pthread_join(t, NULL);
    close(lfd);
}

/* ---- strangers -------------------------------------------------------------------- */

Test(store_tcp, a_stranger_sending_an_unknown_query_is_disconnected_and_others_go_on, .timeout = 20)
{
    server s = start_server();
    dt_store *a = open_store(s.url, "job");
    cr_assert_eq(dt_store_set(a, "before", "1", 1), DT_OK);
    int fd = raw_connect(s.port);
    const char garbage[] = "GET / HTTP/1.1\r\n\r\n";
    cr_assert_eq(send(fd, garbage, sizeof garbage - 1, 0), (ssize_t)sizeof garbage - 1);
    cr_expect(closed_by_server(fd), "the server kept a connection that spoke garbage");
    close(fd);
    char *v = get_string(a, "before");
    cr_expect_str_eq(v, "1");
    free(v);
    dt_store_close(a);
    dt_store_server_stop(s.srv);
}

Test(store_tcp, a_stranger_announcing_a_huge_key_is_disconnected_at_once, .timeout = 20)
{
    server s = start_server();
    int fd = raw_connect(s.port);
    uint8_t req[9] = {0 /* SET */};
    uint64_t len = 1ull << 40; /* 1 TiB: the server must not wait for it or allocate it */
    memcpy(req + 1, &len, 8);
    cr_assert_eq(send(fd, req, sizeof req, 0), (ssize_t)sizeof req);
    cr_expect(closed_by_server(fd), "the server waited for a 1 TiB key");
    close(fd);
    dt_store *a = open_store(s.url, "job");
    cr_expect_eq(dt_store_set(a, "after", "1", 1), DT_OK, "%s", dt_store_error(a));
    dt_store_close(a);
    dt_store_server_stop(s.srv);
}

/* Whether the server still has its end of the connection from client_port
 * (a row of /proc/net/tcp from server_port to client_port, established or
 * waiting for the server's close). Counting this process's descriptors
 * instead is not precise enough: the test runner opens its own. */
static bool server_end_open(int server_port, int client_port)
{
    FILE *f = fopen("/proc/net/tcp", "r");
    char line[512];
    bool open = false;
    if (!f)
        return true;
    while (!open && fgets(line, sizeof line, f)) {
        unsigned lport, rport, state;
        if (sscanf(line, " %*d: %*x:%x %*x:%x %x", &lport, &rport, &state) == 3)
            open = (int)lport == server_port && (int)rport == client_port &&
                   (state == 0x01 || state == 0x08); /* ESTABLISHED, CLOSE_WAIT */
    }
    fclose(f);
    return open;
}

Test(store_tcp, a_client_that_vanishes_mid_wait_is_forgotten, .timeout = 20)
{
    server s = start_server();
    dt_store *a = open_store(s.url, "job");
    int fd = raw_connect(s.port);
    struct sockaddr_in me;
    socklen_t mlen = sizeof me;
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&me, &mlen), 0);
    int cport = ntohs(me.sin_port);
    uint8_t req[1 + 8 + 8 + 4] = {5 /* WAIT */};
    uint64_t one = 1, klen = 4;
    memcpy(req + 1, &one, 8);
    memcpy(req + 9, &klen, 8);
    memcpy(req + 17, "gone", 4);
    cr_assert_eq(send(fd, req, sizeof req, 0), (ssize_t)sizeof req);
    close(fd);
    cr_assert_eq(dt_store_set(a, "gone", "x", 1), DT_OK); /* wakes nobody, crashes nothing */
    for (int i = 0; i < 500 && server_end_open(s.port, cport); i++) {
        struct timespec nap = {0, 10000000L};
        nanosleep(&nap, NULL);
    }
    cr_expect(!server_end_open(s.port, cport),
              "the server still holds the vanished client's "
              "socket (port %d)",
              cport);
    int64_t n;
    cr_expect_eq(dt_store_add(a, "alive", 1, &n), DT_OK, "%s", dt_store_error(a));
    dt_store_close(a);
    dt_store_server_stop(s.srv);
}

Test(store_tcp, a_thousand_connect_close_cycles_leak_no_descriptors, .timeout = 60)
{
    server s = start_server();
    int before = count_fds();
    for (int i = 0; i < 1000; i++)
        close(raw_connect(s.port));
    for (int i = 0; i < 500 && count_fds() != before; i++) {
        struct timespec nap = {0, 10000000L};
        nanosleep(&nap, NULL);
    }
    cr_expect_eq(count_fds(), before, "descriptors before %d, after 1000 cycles %d", before,
                 count_fds());
    dt_store_server_stop(s.srv);
}

/* ---- a communicator over a TCP store ---------------------------------------------- */

typedef struct tcp_rank {
    const char *url;
    int rank;
    bool with_secret;
    dt_status rc;
    float value;
    char msg[512];
} tcp_rank;

static void *join_and_reduce(void *arg)
{
    tcp_rank *r = arg;
    static const uint8_t secret[16] = "the job's secret";
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = r->rank;
    o.world_size = 2;
    o.init_url = r->url;
    o.job_id = "tcp-job";
    o.secret = r->with_secret ? secret : NULL;
    o.secret_len = r->with_secret ? sizeof secret : 0;
    o.timeout_s = o.init_timeout_s = 10;
    dt_comm *c;
    r->value = (float)(r->rank + 1);
    r->rc = dt_comm_init(&c, &o);
    if (r->rc == DT_OK)
        r->rc = dt_allreduce(c, &r->value, 1, DT_F32, DT_SUM);
    snprintf(r->msg, sizeof r->msg, "%s", c ? dt_comm_error(c) : "out of memory");
    dt_comm_destroy(c);
    return NULL;
}

/* Runs two ranks of a job and expects both to reduce 1 + 2. */
static void run_two_ranks(tcp_rank r[2])
{
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, join_and_reduce, &r[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(r[i].rc, DT_OK, "rank %d: %s", i, r[i].msg);
        cr_expect_eq(r[i].value, 3.0f, "rank %d", i);
    }
}

Test(store_tcp, two_ranks_with_a_secret_meet_at_the_server_and_reduce, .timeout = 30)
{
    server s = start_server();
    tcp_rank r[2] = {{.url = s.url, .rank = 0, .with_secret = true},
                     {.url = s.url, .rank = 1, .with_secret = true}};
    run_two_ranks(r);
    dt_store_server_stop(s.srv);
}

/* True if nothing listens at 127.0.0.1:port any more. */
static bool port_is_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    bool refused = connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno == ECONNREFUSED;
    close(fd);
    return refused;
}

Test(store_tcp, rank_0_hosts_a_store_nobody_serves_and_frees_its_port_once_started, .timeout = 30)
{
    int port = unused_port();
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    tcp_rank r[2] = {{.url = url, .rank = 0, .with_secret = true},
                     {.url = url, .rank = 1, .with_secret = true}};
    run_two_ranks(r);
    cr_expect(port_is_free(port), "rank 0's store still listens on %d after the job", port);
}

/* torch's recipe under srun or mpirun: MASTER_ADDR and MASTER_PORT, no
 * launcher to host the store. */
Test(store_tcp, env_ranks_without_a_launcher_meet_at_rank_0s_store, .timeout = 30)
{
    char port[16];
    snprintf(port, sizeof port, "%d", unused_port());
    setenv("MASTER_ADDR", "localhost", 1);
    setenv("MASTER_PORT", port, 1);
    tcp_rank r[2] = {{.url = "env://", .rank = 0, .with_secret = true},
                     {.url = "env://", .rank = 1, .with_secret = true}};
    run_two_ranks(r);
}

Test(store_tcp, rank_0_is_a_client_where_a_server_already_listens, .timeout = 30)
{
    server s = start_server();
    tcp_rank r[2] = {{.url = s.url, .rank = 0, .with_secret = true},
                     {.url = s.url, .rank = 1, .with_secret = true}};
    run_two_ranks(r);
    dt_store *a = open_store(s.url, "tcp-job");
    const char *keys[2] = {"addr/0", "addr/1"};
    bool all = false;
    cr_expect_eq(dt_store_check(a, keys, 2, &all), DT_OK, "%s", dt_store_error(a));
    cr_expect(all, "the ranks' addresses are not on the server that was already listening");
    dt_store_close(a);
    dt_store_server_stop(s.srv);
}

Test(store_tcp, a_tcp_store_refuses_to_carry_a_generated_job_secret, .timeout = 30)
{
    server s = start_server();
    tcp_rank r = {.url = s.url, .rank = 0, .with_secret = false};
    join_and_reduce(&r);
    cr_expect_eq(r.rc, DT_EINVAL, "%s", r.msg);
    cr_expect(strstr(r.msg, "DT_SECRET"), "%s", r.msg);
    dt_store *a = open_store(s.url, "tcp-job");
    const char *key = "secret";
    cr_expect_eq(dt_store_wait(a, &key, 1, 0.1), DT_ETIMEDOUT, "the secret was stored");
    dt_store_close(a);
    dt_store_server_stop(s.srv);
}
