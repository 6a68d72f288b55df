/*
 * test_groups_failure.c — the groups of a rank share one fate: a failure of
 * a parent fails its children with the parent's reason, a dead rank fails
 * every group it is in with one root cause (named by world rank), and a
 * child's own failure stays in that child.
 *
 * Threads (rank_threads.h) where an abort is the failure; forked processes
 * (fork_job.h) where a rank must really die (SIGKILL). Every wait is
 * bounded.
 */
#include <criterion/criterion.h>

#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fork_job.h"
#include "rank_threads.h"

/* ---- aborts --------------------------------------------------------------------- */

/* One rank aborts the parent: every child on every rank fails too, with
 * the abort's reason, instead of waiting for a rank that will not come. */
static void abort_parent(rank_ctx *rc)
{
    dt_comm *child = NULL;
    if (dt_comm_split(rc->comm, 0, rc->rank, &child) != DT_OK) {
        rank_fail(rc, "split: %s", dt_comm_error(rc->comm));
        return;
    }
    if (!rank_sync(rc)) {
        dt_comm_destroy(child);
        return;
    } /* every side is connected */
    if (rc->rank == 1)
        dt_comm_abort(rc->comm, "the test stops the job");
    float x[16] = {0};
    dt_status st = dt_allreduce(child, x, 16, DT_F32, DT_SUM);
    if (st != DT_EABORTED || !strstr(dt_comm_error(child), "the test stops the job"))
        rank_fail(rc, "child op after the parent's abort: %s: %s", dt_status_name(st),
                  dt_comm_error(child));
    dt_comm_destroy(child);
}

Test(groups_failure, aborting_the_parent_fails_every_child_with_its_reason, .timeout = 60)
{
    rank_job job;
    rank_threads_run(&job, 3, abort_parent, NULL);
    for (int r = 0; r < 3; r++)
        cr_expect(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
}

/* A child's own failure (here an abort) stays in that child. */
static void abort_child(rank_ctx *rc)
{
    dt_comm *child = NULL;
    if (dt_comm_split(rc->comm, 0, rc->rank, &child) != DT_OK) {
        rank_fail(rc, "split: %s", dt_comm_error(rc->comm));
        return;
    }
    if (!rank_sync(rc)) {
        dt_comm_destroy(child);
        return;
    } /* every side is connected */
    if (rc->rank == 0)
        dt_comm_abort(child, "only this group");
    float x[16] = {0};
    dt_status st = dt_allreduce(child, x, 16, DT_F32, DT_SUM);
    if (st != DT_EABORTED)
        rank_fail(rc, "child op after its abort: %s: %s", dt_status_name(st), dt_comm_error(child));
    dt_comm_destroy(child);
    int32_t sum = rc->rank;
    if (dt_allreduce(rc->comm, &sum, 1, DT_I32, DT_SUM) != DT_OK || sum != 3 ||
        dt_comm_error(rc->comm)[0] != '\0')
        rank_fail(rc, "parent after a child was aborted: sum %d, error '%s'", sum,
                  dt_comm_error(rc->comm));
}

Test(groups_failure, aborting_a_child_leaves_the_parent_working, .timeout = 60)
{
    rank_job job;
    int failed = rank_threads_run(&job, 3, abort_child, NULL);
    for (int r = 0; r < 3; r++)
        cr_expect(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    cr_assert_eq(failed, 0);
}

/* A split is a collective: a rank that cannot take part (nowhere to put the
 * child) fails the parent, so its peers are not left in the all-gather. */
static void split_without_a_child_pointer(rank_ctx *rc)
{
    if (!rank_sync(rc))
        return; /* every side is connected */
    dt_status st = dt_comm_split(rc->comm, 0, 0, rc->rank == 0 ? NULL : &(dt_comm *){NULL});
    if (st == DT_OK) {
        rank_fail(rc, "a split with a NULL child pointer succeeded");
    } else if (rc->rank == 0 &&
               (st != DT_EINVAL || !strstr(dt_comm_error(rc->comm), "child is NULL"))) {
        rank_fail(rc, "rank 0: %s: %s", dt_status_name(st), dt_comm_error(rc->comm));
    }
}

Test(groups_failure, a_split_with_a_null_child_pointer_fails_it_on_every_rank, .timeout = 60)
{
    rank_job job;
    rank_threads_run(&job, 3, split_without_a_child_pointer, NULL);
    for (int r = 0; r < 3; r++)
        cr_expect(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
}

static void split_failed_parent(rank_ctx *rc)
{
    if (!rank_sync(rc))
        return; /* every side is connected */
    dt_comm_abort(rc->comm, "already broken");
    dt_comm *child = (dt_comm *)&child;
    dt_status st = dt_comm_split(rc->comm, 0, 0, &child);
    if (st != DT_EABORTED || child != NULL || !strstr(dt_comm_error(rc->comm), "already broken"))
        rank_fail(rc, "split of an aborted parent: %s, child %p: %s", dt_status_name(st),
                  (void *)child, dt_comm_error(rc->comm));
}

Test(groups_failure, splitting_a_failed_parent_returns_its_error_and_no_child, .timeout = 60)
{
    rank_job job;
    rank_threads_run(&job, 2, split_failed_parent, NULL);
    for (int r = 0; r < 2; r++)
        cr_expect(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
}

/* World ranks 1 and 2 form a group (2 first, by key); world rank 1 runs an
 * all-reduce that world rank 2 never joins. The timeout names the silent
 * peer by group and world rank, and stays in the group: the world goes on. */
static void child_times_out(rank_ctx *rc)
{
    dt_comm *child = NULL;
    int color = rc->rank == 0 ? DT_UNDEFINED : 0;
    if (dt_comm_split(rc->comm, color, -rc->rank, &child) != DT_OK) {
        rank_fail(rc, "split: %s", dt_comm_error(rc->comm));
        return;
    }
    if (!rank_sync(rc)) {
        dt_comm_destroy(child);
        return;
    }
    if (rc->rank == 1) {
        float x[4] = {0};
        dt_op op = {.kind = DT_OP_ALLREDUCE,
                    .recv = x,
                    .count = 4,
                    .dtype = DT_F32,
                    .redop = DT_SUM,
                    .timeout_s = 0.5};
        dt_status st = dt_run(child, &op);
        const char *e = dt_comm_error(child);
        if (st != DT_ETIMEDOUT || !strstr(e, "rank 0 (") || !strstr(e, ", world rank 2)") ||
            !strstr(e, "rank 1 (world rank 1) of group"))
            rank_fail(rc, "the child's timeout: %s: %s", dt_status_name(st), e);
    }
    if (!rank_sync(rc)) {
        dt_comm_destroy(child);
        return;
    }
    int32_t sum = rc->rank;
    if (dt_allreduce(rc->comm, &sum, 1, DT_I32, DT_SUM) != DT_OK || sum != 3)
        rank_fail(rc, "the world after a child's timeout: %d: %s", sum, dt_comm_error(rc->comm));
    dt_comm_destroy(child);
}

Test(groups_failure, a_timeout_in_a_child_names_the_peer_by_world_rank_and_stays_there,
     .timeout = 60)
{
    rank_job job;
    int failed = rank_threads_run(&job, 3, child_times_out, NULL);
    for (int r = 0; r < 3; r++)
        cr_expect(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    cr_assert_eq(failed, 0);
}

/* ---- a killed rank, seen through a child ------------------------------------------ */

/*
 * Four forked ranks, dp × pp = 2 × 2: pipeline groups {0,1} {2,3}, data-
 * parallel groups {0,2} {1,3}. Rank 3 is SIGKILLed while the others wait in
 * an op that needs it: rank 1 in its data-parallel group, rank 2 in its
 * pipeline group (both children), rank 0 in the world. Each survivor then
 * reports the status and error of all three of its communicators.
 */
#define KILL_N 4
#define VICTIM 3

/* One line to the parent, at once (the parent reads with a deadline). */
static void report(FILE *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void report(FILE *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    if (fputc('\n', out) == EOF || fflush(out) != 0)
        _exit(3);
}

static void killed_rank_child(int rank, job *j, FILE *out)
{
    dt_comm *world = child_join(j, rank, 15, out), *dp = NULL, *pp = NULL;
    if (dt_comm_split(world, rank / 2, rank, &pp) != DT_OK ||
        dt_comm_split(world, rank % 2, rank, &dp) != DT_OK || dt_barrier(world) != DT_OK) {
        report(out, "setup failed: %s", dt_comm_error(world));
        _exit(1);
    }
    report(out, "ready");
    if (rank == VICTIM)
        pause(); /* until the test kills it */
    float x[1024] = {0};
    dt_comm *first = rank == 1 ? dp : rank == 2 ? pp : world;
    dt_status st = dt_allreduce(first, x, 1024, DT_F32, DT_SUM);
    report(out, "%d", st);
    dt_comm *all[3] = {world, dp, pp};
    for (int i = 0; i < 3; i++) {
        /* every group fails fast now, not after its timeout */
        dt_status again = dt_allreduce(all[i], x, 1024, DT_F32, DT_SUM);
        report(out, "%d %s", again, dt_comm_error(all[i]));
    }
    _exit(0);
}

/* Rank r's next line within timeout_s, asserting that one arrives. */
static void line_of(job *j, int r, double timeout_s, char *line, size_t n)
{
    report_of(j, r, timeout_s, line, n);
    cr_assert(line[0], "rank %d said nothing within %.0f s", r, timeout_s);
}

/* Does the message name the dead rank by its world rank? As the world saw
 * it ("rank 3 (addr)") or as a group did ("(addr, world rank 3)"). */
static bool names_victim(const char *msg)
{
    return strstr(msg, "rank 3 (") || strstr(msg, "world rank 3)");
}

Test(groups_failure, a_killed_rank_fails_every_group_with_one_root_cause, .timeout = 90)
{
    job j;
    char line[2048], errors[3][2048];
    start(&j, KILL_N, "groups-kill", killed_rank_child);
    for (int r = 0; r < KILL_N; r++) {
        line_of(&j, r, 40, line, sizeof line);
        cr_assert_str_eq(line, "ready", "rank %d: %s", r, line);
    }
    kill(j.pid[VICTIM], SIGKILL);
    const char *names[3] = {"world", "dp", "pp"};
    for (int r = 0; r < KILL_N; r++) {
        if (r == VICTIM)
            continue;
        line_of(&j, r, 10, line, sizeof line);
        cr_expect_eq(atoi(line), DT_EPEER, "rank %d's first op: %s", r, line);
        size_t shortest = 0;
        for (int i = 0; i < 3; i++) {
            line_of(&j, r, 10, line, sizeof line);
            int st = -1, used = 0;
            sscanf(line, "%d %n", &st, &used);
            snprintf(errors[i], sizeof errors[i], "%s", line + used);
            cr_expect_eq(st, DT_EPEER, "rank %d, %s: %s", r, names[i], line);
            if (strlen(errors[i]) < strlen(errors[shortest]))
                shortest = (size_t)i;
        }
        /* The first to notice wrote the root cause; the others repeat it
         * and add where they saw it. */
        const char *root = errors[shortest];
        cr_expect(names_victim(root), "rank %d: the root cause does not name world rank 3: %s", r,
                  root);
        for (int i = 0; i < 3; i++)
            cr_expect(strncmp(errors[i], root, strlen(root)) == 0,
                      "rank %d: %s's error does not start with the root cause\n  %s\n  %s", r,
                      names[i], errors[i], root);
        cr_log_info("rank %d: %s", r, root);
    }
    finish(&j);
}
