/*
 * fork_job.h — a job of ranks as forked processes, for the failure tests.
 *
 * A rank can really die (SIGKILL) and a stranger can really connect from
 * outside. Each child reports lines back through a pipe, a verdict being
 * "<status> <seconds-since-boot> <message>". The parent bounds every wait,
 * and finish() kills every child it started, so a bug fails the test
 * instead of hanging CI.
 */
#ifndef DT_TEST_FORK_JOB_H
#define DT_TEST_FORK_JOB_H

#include <criterion/criterion.h>

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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

static inline void job_url(job *j, const char *name)
{
    static int counter;
    snprintf(j->url, sizeof j->url, "file:///tmp/dtrain-test-fail-%s-%d-%d", name, getpid(),
             counter++);
}

/* A child's verdict on its op: "<status> <seconds> <message>". */
static inline void say(FILE *report, dt_status st, double seconds, const char *msg)
{
    fprintf(report, "%d %.6f %s\n", st, seconds, msg);
    fflush(report);
}

/* Joins as `rank` with liveness limit timeout_s and progress limit
 * progress_s (0: the default). */
static inline dt_comm *child_join_clocks(job *j, int rank, double timeout_s, double progress_s,
                                         FILE *report)
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
    o.progress_timeout_s = progress_s;
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

static inline dt_comm *child_join(job *j, int rank, double timeout_s, FILE *report)
{
    return child_join_clocks(j, rank, timeout_s, 0, report);
}

static inline void start(job *j, int n, const char *name, child_fn fn)
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
static inline void report_of(job *j, int r, double timeout_s, char *line, size_t n)
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
static inline const char *child_state(job *j, int r, char *buf, size_t n)
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

typedef struct verdict {
    int status;
    double seconds;
    const char *msg; /* points into line */
    char line[2048];
} verdict;

/* Rank r's next verdict line (see say), asserting that one arrives. */
static inline void verdict_of(job *j, int r, double timeout_s, verdict *v)
{
    char state[32];
    int used = 0;
    report_of(j, r, timeout_s, v->line, sizeof v->line);
    cr_assert_eq(sscanf(v->line, "%d %lf %n", &v->status, &v->seconds, &used), 2,
                 "rank %d: no verdict ('%s', %s)", r, v->line,
                 child_state(j, r, state, sizeof state));
    v->msg = v->line + used;
}

/* Kill what is left of the job, and remove its rendezvous file: ranks
 * killed here never get to close it. */
static inline void finish(job *j)
{
    for (int r = 0; r < j->n; r++) {
        kill(j->pid[r], SIGKILL);
        waitpid(j->pid[r], NULL, 0);
        close(j->fd[r]);
    }
    unlink(j->url + strlen("file://"));
}

#endif /* DT_TEST_FORK_JOB_H */
