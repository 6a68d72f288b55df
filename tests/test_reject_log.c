/*
 * test_reject_log.c — a stranger hammering a rank's port does not flood the
 * job's output: the first rejections are logged in full, then one summary
 * line per interval gives the count and the hosts, and destroy reports what
 * is left. Two ranks join as threads over loopback; the test connects to
 * rank 0's port many times, each time sending bytes that fail the
 * handshake, and reads the lines rank 0 logged through its log callback.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dt_comm.h"

typedef struct log_lines {
    pthread_mutex_t mu;
    char text[1 << 16];
    int full, summaries;
    unsigned long long summarized; /* the counts the summary lines give */
} log_lines;

static void collect(void *user, const char *line)
{
    log_lines *l = user;
    pthread_mutex_lock(&l->mu);
    size_t n = strlen(l->text);
    snprintf(l->text + n, sizeof l->text - n, "%s\n", line);
    const char *more = strstr(line, "rejected ");
    unsigned long long k;
    if (strstr(line, "rejected connection from"))
        l->full++;
    else if (more && sscanf(more, "rejected %llu more", &k) == 1) {
        l->summaries++;
        l->summarized += k;
    }
    pthread_mutex_unlock(&l->mu);
}

typedef struct joiner {
    dt_comm_options o;
    dt_comm *c;
    dt_status st;
} joiner;

static void *join(void *p)
{
    joiner *j = p;
    j->st = dt_comm_init(&j->c, &j->o);
    return NULL;
}

static void join_two(joiner j[2], log_lines *log)
{
    static int counter;
    char url[128];
    snprintf(url, sizeof url, "file:///tmp/dtrain-test-reject-%d-%d", (int)getpid(), counter++);
    pthread_t t[2];
    for (int r = 0; r < 2; r++) {
        dt_comm_options_default(&j[r].o);
        j[r].o.rank = r;
        j[r].o.world_size = 2;
        j[r].o.init_url = strdup(url);
        j[r].o.init_timeout_s = 20;
        j[r].o.timeout_s = 20;
        if (r == 0) {
            j[r].o.log = collect;
            j[r].o.log_user = log;
        }
        pthread_create(&t[r], NULL, join, &j[r]);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(j[r].st, DT_OK, "%s", dt_comm_error(j[r].c));
}

/* Connects, sends bytes that are not a dtrain HELLO and hangs up, as a
 * port scanner does. */
static void stranger(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    char junk[48];
    memset(junk, 'x', sizeof junk);
    cr_assert_eq(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    close(fd);
}

/* Waits (at most 20 s) until rank 0 has rejected n connections. */
static void await_rejected(dt_comm *c, unsigned long long n)
{
    for (int i = 0; i < 2000 && dt_comm_rejected_connections(c) < n; i++)
        usleep(10000);
    cr_assert_eq(dt_comm_rejected_connections(c), n);
}

static void destroy_two(joiner j[2])
{
    for (int r = 0; r < 2; r++) {
        dt_comm_destroy(j[r].c);
        free((char *)j[r].o.init_url);
    }
}

Test(reject_log, a_burst_logs_five_in_full_and_counts_the_rest, .timeout = 60)
{
    static log_lines log = {.mu = PTHREAD_MUTEX_INITIALIZER};
    joiner j[2];
    join_two(j, &log);
    int port = dt_comm_port(j[0].c);
    for (int i = 0; i < 200; i++)
        stranger(port);
    await_rejected(j[0].c, 200);
    destroy_two(j);
    cr_expect_eq(log.full, 5, "lines in full: %d\n%s", log.full, log.text);
    cr_expect_eq(log.full + log.summarized, 200, "counted %d + %llu:\n%s", log.full, log.summarized,
                 log.text);
    cr_expect(log.summaries >= 1 && log.summaries <= 5, "%d summaries:\n%s", log.summaries,
              log.text);
    cr_expect(strstr(log.text, "from 127.0.0.1"), "no host in:\n%s", log.text);
}

Test(reject_log, a_summary_line_comes_each_interval_while_the_job_runs, .timeout = 60)
{
    static log_lines log = {.mu = PTHREAD_MUTEX_INITIALIZER};
    joiner j[2];
    join_two(j, &log);
    int port = dt_comm_port(j[0].c);
    for (int i = 0; i < 20; i++)
        stranger(port);
    await_rejected(j[0].c, 20);
    sleep(6); /* one interval (5 s) and a tick */
    pthread_mutex_lock(&log.mu);
    int summaries = log.summaries;
    unsigned long long summarized = log.summarized;
    pthread_mutex_unlock(&log.mu);
    cr_expect_eq(summaries, 1, "summaries before destroy:\n%s", log.text);
    cr_expect_eq(summarized, 15, "summarized %llu:\n%s", summarized, log.text);
    destroy_two(j);
}
