/*
 * test_comm.c — joining a job: options, environment, addresses, bad input.
 *
 * Each test pins one behaviour of dt_comm_init / dt_comm_options_from_env /
 * dt_submit's argument checks. Multi-rank cases run ranks as threads over
 * loopback TCP with bounded timeouts.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dt_comm.h"

static void unique_url(char *url, size_t n, const char *what)
{
    static int counter;
    snprintf(url, n, "file:///tmp/dtrain-test-comm-%s-%d-%d", what, getpid(), counter++);
}

typedef struct join_arg {
    dt_comm_options o;
    dt_status st;
    char error[1024];
    int32_t sum;
} join_arg;

static void *join_and_sum(void *p)
{
    join_arg *a = p;
    dt_comm *c;
    a->st = dt_comm_init(&c, &a->o);
    snprintf(a->error, sizeof a->error, "%s", dt_comm_error(c));
    if (a->st == DT_OK) {
        a->sum = a->o.rank + 1;
        a->st = dt_allreduce(c, &a->sum, 1, DT_I32, DT_SUM);
    }
    dt_comm_destroy(c);
    return NULL;
}

/* Runs `n` ranks as threads (listening on `ifname` when not NULL); each
 * rank's status, error and all-reduced sum land in args[rank]. */
static void run_job(join_arg *args, int n, const char *ifname, const char *what)
{
    char url[128];
    unique_url(url, sizeof url, what);
    pthread_t t[8];
    for (int r = 0; r < n; r++) {
        dt_comm_options_default(&args[r].o);
        args[r].o.rank = r;
        args[r].o.world_size = n;
        args[r].o.init_url = url;
        args[r].o.ifname = ifname;
        args[r].o.init_timeout_s = 10;
        args[r].o.timeout_s = 10;
        pthread_create(&t[r], NULL, join_and_sum, &args[r]);
    }
    for (int r = 0; r < n; r++)
        pthread_join(t[r], NULL);
}

Test(comm, ranks_join_on_the_address_of_a_named_interface, .timeout = 30)
{
    join_arg a[3];
    run_job(a, 3, "lo", "ifname");
    for (int r = 0; r < 3; r++) {
        cr_expect_eq(a[r].st, DT_OK, "rank %d: %s", r, a[r].error);
        cr_expect_eq(a[r].sum, 6);
    }
}

Test(comm, an_interface_without_an_address_is_einval_naming_it, .timeout = 30)
{
    join_arg a[1];
    run_job(a, 1, "no-such-if0", "noif");
    cr_expect_eq(a[0].st, DT_EINVAL);
    cr_expect(strstr(a[0].error, "no-such-if0") != NULL, "%s", a[0].error);
}

Test(comm, a_world_of_one_needs_no_rendezvous_and_reduces_locally, .timeout = 30)
{
    dt_comm_options o;
    dt_comm_options_default(&o);
    dt_comm *c;
    cr_assert_eq(dt_comm_init(&c, &o), DT_OK, "%s", dt_comm_error(c));
    float x[3] = {1, 2, 3};
    cr_expect_eq(dt_allreduce(c, x, 3, DT_F32, DT_AVG), DT_OK);
    cr_expect(x[0] == 1 && x[1] == 2 && x[2] == 3);
    cr_expect_eq(dt_barrier(c), DT_OK);
    dt_comm_destroy(c);
}

Test(comm, rank_outside_the_world_is_einval, .timeout = 10)
{
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = 4;
    o.world_size = 4;
    o.init_url = "file:///tmp/unused";
    dt_comm *c;
    cr_expect_eq(dt_comm_init(&c, &o), DT_EINVAL);
    cr_expect(strstr(dt_comm_error(c), "rank 4 of world size 4") != NULL, "%s", dt_comm_error(c));
    dt_comm_destroy(c);
}

Test(comm, a_bad_argument_is_einval_and_does_not_fail_the_communicator, .timeout = 10)
{
    dt_comm_options o;
    dt_comm_options_default(&o);
    dt_comm *c;
    cr_assert_eq(dt_comm_init(&c, &o), DT_OK);
    float x = 1;
    cr_expect_eq(dt_allreduce(c, &x, 1, DT_F32, DT_BXOR), DT_EINVAL);
    cr_expect(strstr(dt_comm_error(c), "not defined for f32") != NULL, "%s", dt_comm_error(c));
    cr_expect_eq(dt_broadcast(c, &x, 1, DT_F32, 3), DT_EINVAL);
    cr_expect(strstr(dt_comm_error(c), "root 3") != NULL, "%s", dt_comm_error(c));
    cr_expect_eq(dt_allreduce(c, NULL, 4, DT_F32, DT_SUM), DT_EINVAL);
    cr_expect_eq(dt_allreduce(c, &x, 1, DT_F32, DT_SUM), DT_OK, "still usable");
    dt_comm_destroy(c);
}

Test(comm, environment_gives_rank_size_url_job_and_secret, .timeout = 10)
{
    setenv("RANK", "2", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("DT_INIT_URL", "file:///tmp/env-job", 1);
    setenv("DT_JOB_ID", "run42", 1);
    setenv("DT_SECRET", "00ff10", 1);
    dt_comm_options o;
    dt_comm_options_default(&o);
    uint8_t scratch[64];
    char err[256] = "";
    cr_assert_eq(dt_comm_options_from_env(&o, scratch, sizeof scratch, err, sizeof err), DT_OK,
                 "%s", err);
    cr_expect_eq(o.rank, 2);
    cr_expect_eq(o.world_size, 4);
    cr_expect_str_eq(o.init_url, "file:///tmp/env-job");
    cr_expect_str_eq(o.job_id, "run42");
    cr_expect_eq(o.secret_len, 3);
    cr_expect(o.secret[0] == 0x00 && o.secret[1] == 0xff && o.secret[2] == 0x10);
}

Test(comm, mpi_and_slurm_variables_give_rank_and_size, .timeout = 10)
{
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    setenv("DT_INIT_URL", "file:///tmp/env-job", 1);
    dt_comm_options o;
    dt_comm_options_default(&o);
    uint8_t scratch[64];
    char err[256] = "";
    cr_assert_eq(dt_comm_options_from_env(&o, scratch, sizeof scratch, err, sizeof err), DT_OK,
                 "%s", err);
    cr_expect(o.rank == 1 && o.world_size == 3);
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "2", 1);
    cr_assert_eq(dt_comm_options_from_env(&o, scratch, sizeof scratch, err, sizeof err), DT_OK,
                 "%s", err);
    cr_expect(o.rank == 0 && o.world_size == 2);
}

/* Options nobody filled first with dt_comm_options_default: what a stack
 * struct holds before anything is written to it, made the same every run. */
static void stale_options(dt_comm_options *o)
{
    memset(o, 0xa5, sizeof *o);
}

Test(comm, options_filled_only_from_the_environment_start_a_communicator, .timeout = 10)
{
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    dt_comm_options o;
    stale_options(&o);
    uint8_t scratch[64];
    char err[256] = "";
    cr_assert_eq(dt_comm_options_from_env(&o, scratch, sizeof scratch, err, sizeof err), DT_OK,
                 "%s", err);
    dt_comm *c;
    cr_expect_eq(dt_comm_init(&c, &o), DT_OK, "%s", dt_comm_error(c));
    cr_expect_eq(dt_comm_size(c), 1);
    dt_comm_destroy(c);
}

Test(comm, options_from_the_environment_take_defaults_where_it_says_nothing, .timeout = 10)
{
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("DT_INIT_URL", "file:///tmp/env-job", 1);
    dt_comm_options o, d;
    stale_options(&o);
    dt_comm_options_default(&d);
    uint8_t scratch[64];
    char err[256] = "";
    cr_assert_eq(dt_comm_options_from_env(&o, scratch, sizeof scratch, err, sizeof err), DT_OK,
                 "%s", err);
    cr_expect(o.job_id == d.job_id && o.secret == d.secret && o.secret_len == d.secret_len);
    cr_expect(o.host == d.host && o.ifname == d.ifname);
    cr_expect(o.timeout_s == d.timeout_s && o.init_timeout_s == d.init_timeout_s);
    cr_expect(o.socket_buffer == d.socket_buffer && o.log == d.log && o.log_user == d.log_user);
    cr_expect(o.device == d.device);
}

/* A forked rank of a 2-rank job under "srun" (SLURM_JOB_ID=job), with no
 * DT_JOB_ID: exits 0 once it has met its peer, 1 if it never did. */
static pid_t srun_rank(const char *url, int rank, const char *job)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    unsetenv("DT_JOB_ID");
    unsetenv("OMPI_MCA_ess_base_jobid");
    unsetenv("PMIX_NAMESPACE");
    setenv("SLURM_JOB_ID", job, 1);
    setenv("SLURM_STEP_ID", "0", 1);
    static const uint8_t secret[16] = {7};
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = rank;
    o.world_size = 2;
    o.init_url = url;
    o.secret = secret;
    o.secret_len = sizeof secret;
    o.init_timeout_s = 3;
    dt_comm *c;
    dt_status st = dt_comm_init(&c, &o);
    dt_comm_destroy(c);
    _exit(st == DT_OK ? 0 : 1);
}

static int exit_code(pid_t pid)
{
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

Test(comm, srun_ranks_of_one_job_meet_without_dt_job_id, .timeout = 30)
{
    char url[128];
    unique_url(url, sizeof url, "srun-same");
    pid_t a = srun_rank(url, 0, "4242"), b = srun_rank(url, 1, "4242");
    cr_expect_eq(exit_code(a), 0);
    cr_expect_eq(exit_code(b), 0);
}

/* Without a job id of their own both jobs would be "dtrain": rank 0 of one
 * and rank 1 of the other would meet. */
Test(comm, ranks_of_two_srun_jobs_sharing_an_init_url_never_meet, .timeout = 30)
{
    char url[128];
    unique_url(url, sizeof url, "srun-two");
    pid_t a = srun_rank(url, 0, "4242"), b = srun_rank(url, 1, "4243");
    cr_expect_eq(exit_code(a), 1, "rank 0 of job 4242 met a rank of another job");
    cr_expect_eq(exit_code(b), 1, "rank 1 of job 4243 met a rank of another job");
}

Test(comm, malformed_environment_is_einval_naming_the_variable, .timeout = 10)
{
    dt_comm_options o;
    uint8_t scratch[64];
    char err[256] = "";
    setenv("RANK", "two", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("DT_INIT_URL", "file:///tmp/env-job", 1);
    cr_expect_eq(dt_comm_options_from_env(&o, scratch, sizeof scratch, err, sizeof err), DT_EINVAL);
    cr_expect(strstr(err, "RANK='two'") != NULL, "%s", err);
    setenv("RANK", "1", 1);
    setenv("DT_SECRET", "xyz", 1);
    cr_expect_eq(dt_comm_options_from_env(&o, scratch, sizeof scratch, err, sizeof err), DT_EINVAL);
    cr_expect(strstr(err, "DT_SECRET") != NULL, "%s", err);
    unsetenv("DT_SECRET");
    unsetenv("DT_INIT_URL");
    cr_expect_eq(dt_comm_options_from_env(&o, scratch, sizeof scratch, err, sizeof err), DT_EINVAL);
    cr_expect(strstr(err, "DT_INIT_URL") != NULL, "%s", err);
}

Test(comm, a_rank_that_never_joins_times_out_init_naming_it, .timeout = 30)
{
    char url[128];
    unique_url(url, sizeof url, "absent");
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = 0;
    o.world_size = 2;
    o.init_url = url;
    o.init_timeout_s = 0.5;
    dt_comm *c;
    cr_expect_eq(dt_comm_init(&c, &o), DT_ETIMEDOUT);
    cr_expect(strstr(dt_comm_error(c), "rank 1") != NULL, "%s", dt_comm_error(c));
    dt_comm_destroy(c);
}

Test(comm, dt_init_timeout_sets_the_start_up_deadline, .timeout = 10)
{
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("DT_INIT_URL", "file:///tmp/env-job", 1);
    setenv("DT_INIT_TIMEOUT", "240", 1);
    dt_comm_options o;
    dt_comm_options_default(&o);
    uint8_t scratch[64];
    char err[256] = "";
    cr_assert_eq(dt_comm_options_from_env(&o, scratch, sizeof scratch, err, sizeof err), DT_OK,
                 "%s", err);
    cr_expect(o.init_timeout_s == 240.0, "init_timeout_s %g", o.init_timeout_s);
    setenv("DT_INIT_TIMEOUT", "soon", 1);
    cr_expect_eq(dt_comm_options_from_env(&o, scratch, sizeof scratch, err, sizeof err), DT_EINVAL);
    cr_expect(strstr(err, "DT_INIT_TIMEOUT='soon'") != NULL, "%s", err);
}

/* Rank 1 joins late and rank 2 never: by the time rank 0 waits for rank 2
 * most of the deadline is spent, and the message must give the time that
 * passed (the whole deadline), not the slice that was left. */
static void *join_late(void *p)
{
    usleep(1200 * 1000);
    return join_and_sum(p);
}

Test(comm, a_start_up_timeout_gives_the_time_that_passed, .timeout = 30)
{
    char url[128];
    unique_url(url, sizeof url, "late");
    join_arg a[2];
    pthread_t t[2];
    for (int r = 0; r < 2; r++) {
        dt_comm_options_default(&a[r].o);
        a[r].o.rank = r;
        a[r].o.world_size = 3;
        a[r].o.init_url = url;
        a[r].o.init_timeout_s = 2.0;
        pthread_create(&t[r], NULL, r == 0 ? join_and_sum : join_late, &a[r]);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
    cr_assert_eq(a[0].st, DT_ETIMEDOUT, "%s", a[0].error);
    const char *after = strstr(a[0].error, "timed out after ");
    cr_assert(after && strstr(a[0].error, "rank 2"), "%s", a[0].error);
    double waited = atof(after + strlen("timed out after "));
    cr_expect(waited >= 1.9, "reported %.1f s, but the whole 2 s deadline passed: %s", waited,
              a[0].error);
    cr_expect(strstr(a[0].error, "DT_INIT_TIMEOUT") != NULL, "%s", a[0].error);
}
