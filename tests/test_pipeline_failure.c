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
 * deadline (fork_job.h). The parent kills and reaps every child it started.
 */
#include "dt_pipe.h"
#include "fork_job.h"

enum { P = 3, M = 4, B = 2, T = 16, VICTIM = 1 };
static const dt_config cfg = {.V = 64, .T = 16, .L = 3, .H = 4, .C = 32};

/* One stage: steps until its pipeline fails (the victim dies instead). */
static void stage_main(int rank, job *j, FILE *report)
{
    char err[256];
    dt_comm *c = child_join(j, rank, 20, report);
    dt_pipe_schedule *s = dt_pipe_schedule_create(DT_PIPE_1F1B, P, M, err, sizeof err);
    dt_stage_spec sp = {rank, rank + 1, s->act_slots[rank], s->grad_slots[rank], false};
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

Test(pipeline_failure, a_killed_stage_fails_every_other_stage_naming_it, .timeout = 90)
{
    job j;
    char line[2048];
    start(&j, P, "pipe-kill", stage_main);
    for (int r = 0; r < P; r++) {
        if (r == VICTIM)
            continue;
        report_of(&j, r, 45, line, sizeof line);
        int status = atoi(line);
        cr_expect(line[0] && status != DT_OK, "stage %d did not fail: '%s'", r, line);
        cr_expect(strstr(line, "rank 1") != NULL, "stage %d's error does not name rank 1: %s", r,
                  line);
        cr_log_info("stage %d: %s", r, line);
    }
    finish(&j);
}
