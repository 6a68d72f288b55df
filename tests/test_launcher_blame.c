/*
 * test_launcher_blame.c — which rank dtrain-launch names as the ROOT CAUSE
 * when ranks fail because of each other: the rank whose failure is its own
 * (followed through "rank K failed and reported" and "rank K died"), a
 * stopped (SIGSTOP) or hung rank the others timed out waiting for, and the
 * report's quoted lines keeping the ranks they name. First the line parser
 * alone (launcher/blame_line.c) on lines minigpt printed: a group's
 * messages name a rank inside the group and its world rank, and the world
 * rank is the one blamed.
 *
 * The launcher runs tests/launch_worker as in test_launcher.c (helpers in
 * launch_run.h); every wait is bounded by the test's Criterion timeout.
 */
#include "launch.h"
#include "launch_run.h"
#include "proc_state.h"

/* ---- one line: whom it blames ---------------------------------------------- */

/* World rank 1 of `minigpt --tp 2 --dp 2` when world rank 3 was killed:
 * in their dp group world rank 3 is rank 1. */
Test(launcher_blame, a_group_connection_loss_blames_the_world_rank_it_names)
{
    const char *line =
        "minigpt: rank 1: data parallel: gradient all-reduce: rank 0: connection to rank 1 "
        "(127.0.0.1:45182, world rank 3) lost: connection reset by peer; rank 1 died or its "
        "process was killed [rank 0 (world rank 1) of group 'split 2 colour 1' = world ranks "
        "1,3 was running allreduce #2398]";
    cr_expect_eq(launch_blamed_rank(line), 3);
}

/* World rank 0 of the same run: world rank 2 (rank 1 of their dp group)
 * reported what its tp group saw, rank 1 there (world rank 3) lost. */
Test(launcher_blame, a_report_across_groups_blames_the_innermost_world_rank)
{
    const char *line =
        "minigpt: rank 0: data parallel: gradient all-reduce: rank 0: rank 1 (127.0.0.1:54386, "
        "world rank 2) failed and reported: rank 0: connection to rank 1 (127.0.0.1:45962, world "
        "rank 3) lost: connection reset by peer; rank 1 died or its process was killed [rank 0 "
        "(world rank 2) of group 'split 1 colour 1' = world ranks 2,3 was running allgather "
        "#15586] [seen by rank 1 (world rank 2) of group 'split 2 colour 0' = world ranks 0,2] "
        "[rank 0 (world rank 0) of group 'split 2 colour 0' = world ranks 0,2 was running "
        "allreduce #2398]";
    cr_expect_eq(launch_blamed_rank(line), 3);
}

/* A group's ABORT whose reporter failed on its own: its world rank. */
Test(launcher_blame, a_group_abort_blames_the_reporters_world_rank)
{
    const char *line = "rank 0: rank 1 (127.0.0.1:54386, world rank 2) failed and reported: "
                       "rank 1: cannot open /nonexistent/data.bin [seen by rank 1 (world rank 2) "
                       "of group 'split 2 colour 0' = world ranks 0,2]";
    cr_expect_eq(launch_blamed_rank(line), 2);
}

/* A world's messages name world ranks already. */
Test(launcher_blame, a_world_message_blames_the_rank_it_names)
{
    cr_expect_eq(launch_blamed_rank("rank 0: connection to rank 2 (127.0.0.1:9) lost: end of "
                                    "file; rank 2 died or its process was killed"),
                 2);
    cr_expect_eq(launch_blamed_rank("rank 0: rank 2 (127.0.0.1:9) failed and reported: rank 2: "
                                    "cannot open /nonexistent/data.bin"),
                 2);
}

/* An op's progress limit names the rank that has not joined it: that
 * rank, alive but elsewhere, is the cause, not the one that timed out. */
Test(launcher_blame, a_progress_timeout_blames_the_rank_that_has_not_joined)
{
    cr_expect_eq(launch_blamed_rank("rank 0: allreduce #0 timed out after 3.0 s (progress limit: "
                                    "DT_PROGRESS_TIMEOUT or the op's timeout) waiting to receive "
                                    "8 B from rank 1: rank 2 (127.0.0.1:40095) is alive (heard "
                                    "0.1 s ago) but has not joined #0: it has not started it yet "
                                    "[rank 0 was running allreduce #0]"),
                 2);
}

/* A rank's own failure, even one that names its group, blames nobody. */
Test(launcher_blame, a_line_naming_no_failed_peer_blames_nobody)
{
    cr_expect_eq(launch_blamed_rank("rank 1: cannot open /nonexistent/data.bin [seen by rank 1 "
                                    "(world rank 3) of group 'split 1 colour 1' = world ranks "
                                    "2,3]"),
                 -1);
    cr_expect_eq(launch_blamed_rank("minigpt: rank 3: --die-at-step 3: SIGKILL"), -1);
}

/* ---- the launcher's verdict ------------------------------------------------- */

/* Four ranks all-reduce in a loop with a 2 s op timeout; rank 2 is stopped.
 * The others time out one by one, blaming whichever rank they waited on;
 * the launcher must name rank 2, every time (an outside test saw a healthy
 * rank named in 6 of 6 runs). */
Test(launcher_blame, a_stopped_rank_is_named_as_the_root_cause_not_those_that_timed_out,
     .timeout = 120)
{
    for (int trial = 0; trial < 4; trial++) {
        launch_run r;
        launch_start_env(&r, (const char *[]){"DT_TIMEOUT=2", NULL},
                         (const char *[]){"-n", "4", "--grace", "1", W, "allreduce-loop", "DIR",
                                          NULL});
        for (int i = 0; i < 4; i++)
            wait_pid_file(&r, i);
        pid_t stopped = wait_pid_file(&r, 2);
        kill(stopped, SIGSTOP);
        while (proc_state(stopped) != 'T')
            nanosleep(&(struct timespec){0, 1000000}, NULL);
        launch_wait(&r);
        char want[128];
        snprintf(want, sizeof want,
                 "ROOT CAUSE: rank 2 (local rank 2 on node 0, pid %d) was "
                 "stopped (SIGSTOP)",
                 (int)stopped);
        cr_assert(strstr(r.err, want), "trial %d: '%s' missing from:\n%s", trial, want, r.err);
        cr_assert(strstr(r.err, "the others timed out waiting for it"), "trial %d:\n%s", trial,
                  r.err);
        cr_assert_eq(r.code, 94, "trial %d: exit %d (not the first failure's), stderr:\n%s", trial,
                     r.code, r.err);
        assert_all_gone(&r, 4);
        launch_cleanup(&r);
    }
}

/* Rank 2 fails on its own and aborts; the others fail because it did
 * ("rank 2 (ADDR) failed and reported: ...") and exit first, while rank 2
 * lingers. The launcher must follow the blame to rank 2 and show its own
 * error, not a bystander's report of it. */
Test(launcher_blame, the_rank_whose_failure_is_its_own_is_the_root_cause_not_the_first_to_exit,
     .timeout = 60)
{
    for (int trial = 0; trial < 3; trial++) {
        launch_run r;
        launch_start(&r, (const char *[]){"-n", "4", W, "abort-one", "DIR", "2", "3", NULL});
        launch_wait(&r);
        cr_assert(strstr(r.err, "ROOT CAUSE: rank 2 (local rank 2 on node 0"),
                  "trial %d: rank 2 is not the root cause:\n%s", trial, r.err);
        const char *report = strstr(r.err, "ROOT CAUSE");
        cr_assert(strstr(report, "[2] rank 2: cannot open /nonexistent/data.bin"),
                  "trial %d: rank 2's own error is not in the report:\n%s", trial, report);
        const char *first = strstr(report, "first to fail: rank ");
        cr_assert(first, "trial %d: the first failure is not shown:\n%s", trial, report);
        int first_code = -1;
        const char *said = strstr(first, "exited with code ");
        cr_assert(said && sscanf(said, "exited with code %d", &first_code) == 1, "%s", report);
        cr_assert_eq(r.code, first_code, "trial %d: exit %d, not the first failure's", trial,
                     r.code);
        assert_all_gone(&r, 4);
        launch_cleanup(&r);
    }
}

/* Rank 2 fails on its own, aborts, and is still leaving (30 s) when the
 * others' failures make the launcher stop the group: the SIGTERM that ends
 * it is the launcher's, and the report says so instead of "killed by
 * signal 15", which would send a reader looking for an outside killer. */
Test(launcher_blame, a_root_cause_the_launcher_stopped_is_said_to_be_stopped_by_it, .timeout = 60)
{
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "3", "--grace", "10", W, "abort-one", "DIR", "2", "3",
                                      "30000", NULL});
    launch_wait(&r);
    const char *report = strstr(r.err, "ROOT CAUSE: rank 2 (local rank 2 on node 0");
    cr_assert(report, "rank 2 is not the root cause:\n%s", r.err);
    cr_assert(strstr(report, "failed on its own, and its peers failed because it did; it was "
                             "stopped by dtrain-launch (SIGTERM) after rank "),
              "the report does not say the launcher stopped rank 2:\n%s", r.err);
    cr_assert(!strstr(r.err, "killed by signal 15"), "%s", r.err);
    assert_all_gone(&r, 3);
    launch_cleanup(&r);
}

/* Where no ABORT got through, the others only saw rank 1's connection
 * drop ("rank 1 died or its process was killed"); they exit first. */
Test(launcher_blame, the_rank_whose_connection_dropped_first_is_the_root_cause, .timeout = 30)
{
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "3", W, "peer-died", "DIR", "1", NULL});
    launch_wait(&r);
    cr_assert(strstr(r.err, "ROOT CAUSE: rank 1 (local rank 1 on node 0"),
              "rank 1 is not the root cause:\n%s", r.err);
    cr_assert(strstr(strstr(r.err, "ROOT CAUSE"), "[1] rank 1: out of memory"), "%s", r.err);
    cr_assert_eq(r.code, 1, "exit %d, not the first failure's", r.code);
    assert_all_gone(&r, 3);
    launch_cleanup(&r);
}

/* Rank 1 hangs (not stopped: asleep, ignoring SIGTERM) and prints nothing;
 * its communicator still answers, so the others time out at the progress
 * limit. It is the one that outlives SIGTERM. */
Test(launcher_blame, a_hung_rank_that_ignores_sigterm_is_named_as_the_root_cause, .timeout = 60)
{
    launch_run r;
    launch_start_env(&r, (const char *[]){"DT_TIMEOUT=1", "DT_PROGRESS_TIMEOUT=1", NULL},
                     (const char *[]){"-n", "3", "--grace", "1", W, "allreduce-loop", "DIR", "1",
                                      NULL});
    launch_wait(&r);
    cr_assert(strstr(r.err, "ROOT CAUSE: rank 1 (local rank 1 on node 0"),
              "rank 1 is not the root cause:\n%s", r.err);
    cr_assert(strstr(r.err, "ignored SIGTERM"), "%s", r.err);
    cr_assert_eq(r.code, 94, "exit %d, not the first failure's:\n%s", r.code, r.err);
    assert_all_gone(&r, 3);
    launch_cleanup(&r);
}

/* Rank 1 sleeps instead of joining the all-reduce (alive: its communicator
 * beats) and ends on SIGTERM like any rank; the others reach the progress
 * limit, which names it. The launcher names it too, as absent, not the
 * rank that timed out first. */
Test(launcher_blame, a_rank_absent_from_the_collective_is_the_root_cause_not_those_that_waited,
     .timeout = 60)
{
    launch_run r;
    launch_start_env(&r, (const char *[]){"DT_TIMEOUT=1", "DT_PROGRESS_TIMEOUT=2", NULL},
                     (const char *[]){"-n", "3", "--grace", "5", W, "allreduce-loop", "DIR", "1",
                                      "term", NULL});
    launch_wait(&r);
    cr_assert(strstr(r.err, "ROOT CAUSE: rank 1 (local rank 1 on node 0"),
              "rank 1 is not the root cause:\n%s", r.err);
    cr_assert(strstr(r.err, "had not joined the collective its peers waited in"), "%s", r.err);
    cr_assert_eq(r.code, 94, "exit %d, not the first failure's:\n%s", r.code, r.err);
    assert_all_gone(&r, 3);
    launch_cleanup(&r);
}

/* A stopped worker cannot act on SIGTERM until it is resumed; the launcher
 * resumes it, so the group ends now and not after the 60 s grace period
 * (the test's 20 s timeout would fail first). */
Test(launcher_blame, a_stopped_worker_ends_on_sigterm_without_waiting_for_the_grace_period,
     .timeout = 20)
{
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "2", "--grace", "60", W, "sleep", "DIR", NULL});
    pid_t stopped = wait_pid_file(&r, 1);
    kill(stopped, SIGSTOP);
    while (proc_state(stopped) != 'T')
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    kill(wait_pid_file(&r, 0), SIGKILL);
    launch_wait(&r);
    cr_assert_eq(r.code, 128 + SIGKILL, "exit %d, stderr:\n%s", r.code, r.err);
    cr_assert(strstr(r.err, "ROOT CAUSE: rank 0"), "%s", r.err);
    cr_assert(strstr(r.err, "note: rank 1"), "the stopped rank is not mentioned:\n%s", r.err);
    assert_all_gone(&r, 2);
    launch_cleanup(&r);
}

/* The report quotes a rank's last lines; a long one must keep both ends,
 * where errors name the rank that reports and the rank it blames. */
Test(launcher_blame, a_long_error_line_keeps_the_ranks_it_names_in_the_report, .timeout = 20)
{
    launch_run r;
    launch_start(&r, (const char *[]){W, "long-error", "3000", "5", NULL});
    launch_wait(&r);
    cr_assert_eq(r.code, 5, "exit %d, stderr:\n%s", r.code, r.err);
    const char *report = strstr(r.err, "ROOT CAUSE");
    cr_assert(report, "no root cause in:\n%s", r.err);
    const char *quoted = strstr(report, "    [0] error on rank 0: ");
    cr_assert(quoted, "the quoted line lost its start:\n%s", report);
    size_t n = strcspn(quoted, "\n");
    cr_assert(n < 2000, "the quoted line is not shortened (%zu bytes)", n);
    cr_assert(n >= 18 && !strncmp(quoted + n - 18, "blamed peer rank 3", 18),
              "the quoted line lost its end:\n%.*s", (int)n, quoted);
    launch_cleanup(&r);
}
