/*
 * test_pipeline_failure.c — a pipeline stage that dies takes the whole
 * pipeline down at once, and every survivor's error names it.
 *
 * Stages are forked processes here, so one can really die (SIGKILL, no
 * goodbye). Three stages run 1F1B over loopback TCP; the middle one kills
 * itself during its third step. The first and last stages — one waiting
 * for a gradient, the other for activations, both from the dead rank —
 * must return from dt_pipe_run with an error naming rank 1, each writing
 * one line "<status> <message>" to a pipe the parent reads with a
 * deadline. The parent kills and reaps every child it started.
 */
#include <criterion/criterion.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dt_pipe.h"

enum { P = 3, M = 4, B = 2, T = 16, VICTIM = 1 };
static const dt_config cfg = {.V = 64, .T = 16, .L = 3, .H = 4, .C = 32};
static const uint8_t SECRET[] = "pipeline failure test";

static dt_comm *join(const char *url, int rank, FILE *report)
{
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = rank;
    o.world_size = P;
    o.init_url = url;
    o.job_id = "pipeline-failure";
    o.secret = SECRET;
    o.secret_len = sizeof SECRET;
    o.timeout_s = 20;
    o.init_timeout_s = 20;
    dt_comm *c;
    if (dt_comm_init(&c, &o) != DT_OK) {
        fprintf(report, "%d init: %s\n", DT_ESTORE, dt_comm_error(c));
        _exit(1);
    }
    return c;
}

/* One stage: steps until its pipeline fails (the victim dies instead). */
static void stage_main(const char *url, int rank, FILE *report)
{
    char err[256];
    dt_comm *c = join(url, rank, report);
    dt_pipe_schedule *s = dt_pipe_schedule_create(DT_PIPE_1F1B, P, M, err, sizeof err);
    dt_stage_spec sp = {rank, rank + 1, s->act_slots[rank], s->grad_slots[rank]};
    dt_model *m;
    dt_pipe *pp;
    if (dt_model_create_stage(&m, &cfg, dt_backend_cpu(), B, &sp) != DT_OK ||
        dt_pipe_create(&pp, c, m, s) != DT_OK) {
        fprintf(report, "%d setup failed\n", DT_EINVAL);
        _exit(1);
    }
    dt_model_init(m, 1);
    static int x[M][B * T]; /* token 0 everywhere: any data will do */
    const int *in[M] = {x[0], x[1], x[2], x[3]};
    dt_status st = DT_OK;
    for (int step = 0; step < 1000 && st == DT_OK; step++) {
        if (rank == VICTIM && step == 2)
            raise(SIGKILL);
        st = dt_pipe_run(pp, rank == 0 ? in : NULL, rank == P - 1 ? in : NULL, B, T, NULL);
    }
    fprintf(report, "%d %s\n", st, dt_pipe_error(pp));
    fflush(report);
    dt_pipe_destroy(pp);
    dt_model_destroy(m);
    dt_pipe_schedule_destroy(s);
    dt_comm_destroy(c);
}

/* One line from fd within timeout_s; "" on timeout. */
static void read_line(int fd, double timeout_s, char *line, size_t n)
{
    size_t got = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (got + 1 < n) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        double spent = (double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec);
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (spent >= timeout_s || poll(&pfd, 1, (int)((timeout_s - spent) * 1000) + 1) <= 0)
            break;
        if (read(fd, line + got, 1) <= 0 || line[got] == '\n')
            break;
        got++;
    }
    line[got] = '\0';
}

Test(pipeline_failure, a_killed_stage_fails_every_other_stage_naming_it, .timeout = 90)
{
    char url[128];
    snprintf(url, sizeof url, "file:///tmp/dtrain-test-pipe-kill-%d", (int)getpid());
    pid_t pid[P];
    int fd[P];
    for (int r = 0; r < P; r++) {
        int pfd[2];
        cr_assert_eq(pipe(pfd), 0);
        pid[r] = fork();
        cr_assert_neq(pid[r], -1);
        if (pid[r] == 0) {
            close(pfd[0]);
            FILE *report = fdopen(pfd[1], "w");
            stage_main(url, r, report);
            fclose(report);
            _exit(0);
        }
        close(pfd[1]);
        fd[r] = pfd[0];
    }
    char line[2048];
    for (int r = 0; r < P; r++) {
        if (r == VICTIM)
            continue;
        read_line(fd[r], 45, line, sizeof line);
        int status = atoi(line);
        cr_expect(line[0] && status != DT_OK, "stage %d did not fail: '%s'", r, line);
        cr_expect(strstr(line, "rank 1") != NULL, "stage %d's error does not name rank 1: %s", r,
                  line);
        cr_log_info("stage %d: %s", r, line);
    }
    for (int r = 0; r < P; r++) {
        kill(pid[r], SIGKILL);
        waitpid(pid[r], NULL, 0);
        close(fd[r]);
    }
}
