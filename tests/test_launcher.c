/*
 * test_launcher.c — dtrain-launch, tested as a user runs it: the built
 * program is started on tests/launch_worker (a worker whose behaviour is
 * chosen by its arguments), and the tests read its exit status, its stdout
 * and stderr (redirected to files), and the pid files the workers write.
 *
 * The helpers (launch_run.h) bound every wait by the test's Criterion
 * timeout; no assertion is about time. Which rank a failure is blamed on
 * is test_launcher_blame.c.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "dt_comm.h"
#include "launch_run.h"
#include "proc_state.h"

static bool is_hex(const char *s, size_t n)
{
    return strlen(s) == n && strspn(s, "0123456789abcdef") == n;
}

/* ---- the environment contract ------------------------------------------------- */

Test(launcher, every_rank_gets_the_torchrun_and_dtrain_environment, .timeout = 30)
{
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "3", W, "env", NULL});
    launch_wait(&r);
    cr_assert_eq(r.code, 0, "exit %d, stderr:\n%s", r.code, r.err);
    char v[256], secret0[256], url0[256], run_id[256], expect[300];
    for (int rank = 0; rank < 3; rank++) {
        char want[16];
        snprintf(want, sizeof want, "%d", rank);
        cr_assert_str_eq(value_of(r.out, rank, "RANK", v, sizeof v), want);
        cr_assert_str_eq(value_of(r.out, rank, "LOCAL_RANK", v, sizeof v), want);
        cr_assert_str_eq(value_of(r.out, rank, "WORLD_SIZE", v, sizeof v), "3");
        cr_assert_str_eq(value_of(r.out, rank, "LOCAL_WORLD_SIZE", v, sizeof v), "3");
        cr_assert_str_eq(value_of(r.out, rank, "GROUP_RANK", v, sizeof v), "0");
        cr_assert_str_eq(value_of(r.out, rank, "DT_RESTART_COUNT", v, sizeof v), "0");
        cr_assert_str_eq(value_of(r.out, rank, "TORCHELASTIC_RESTART_COUNT", v, sizeof v), "0");
        value_of(r.out, rank, "DT_SECRET", v, sizeof v);
        cr_assert(is_hex(v, 64), "DT_SECRET '%s' is not 64 hex digits", v);
        if (rank == 0)
            strcpy(secret0, v);
        cr_assert_str_eq(v, secret0, "ranks were given different secrets");
        value_of(r.out, rank, "DT_INIT_URL", v, sizeof v);
        cr_assert(!strncmp(v, "file:///tmp/dtrain-", 19), "DT_INIT_URL '%s'", v);
        if (rank == 0)
            strcpy(url0, v);
        cr_assert_str_eq(v, url0, "ranks were given different rendezvous URLs");
        value_of(r.out, rank, "TORCHELASTIC_RUN_ID", run_id, sizeof run_id);
        snprintf(expect, sizeof expect, "%s-r0", run_id);
        cr_assert_str_eq(value_of(r.out, rank, "DT_JOB_ID", v, sizeof v), expect);
    }
    launch_cleanup(&r);
}

Test(launcher, two_launches_get_different_secrets_and_run_ids, .timeout = 30)
{
    launch_run a, b;
    launch_start(&a, (const char *[]){W, "env", NULL});
    launch_wait(&a);
    launch_start(&b, (const char *[]){W, "env", NULL});
    launch_wait(&b);
    char va[256], vb[256];
    cr_assert_str_neq(value_of(a.out, 0, "DT_SECRET", va, sizeof va),
                      value_of(b.out, 0, "DT_SECRET", vb, sizeof vb));
    cr_assert_str_neq(value_of(a.out, 0, "DT_JOB_ID", va, sizeof va),
                      value_of(b.out, 0, "DT_JOB_ID", vb, sizeof vb));
    launch_cleanup(&a);
    launch_cleanup(&b);
}

Test(launcher, node_rank_offsets_ranks_and_multi_node_shares_the_given_secret, .timeout = 30)
{
    static const char secret[] = "DT_SECRET=00112233445566778899aabbccddeeff"
                                 "00112233445566778899aabbccddeeff";
    launch_run r;
    launch_start_env(&r, (const char *[]){secret, NULL},
                     (const char *[]){"--nproc-per-node=2", "--nnodes", "3", "--node-rank", "1",
                                      "--rdzv", "file:///tmp/dt-launch-test-shared", W, "env",
                                      NULL});
    launch_wait(&r);
    cr_assert_eq(r.code, 0, "exit %d, stderr:\n%s", r.code, r.err);
    char v[256];
    for (int rank = 2; rank < 4; rank++) {
        char want[16];
        snprintf(want, sizeof want, "%d", rank - 2);
        cr_assert_str_eq(value_of(r.out, rank, "LOCAL_RANK", v, sizeof v), want);
        cr_assert_str_eq(value_of(r.out, rank, "WORLD_SIZE", v, sizeof v), "6");
        cr_assert_str_eq(value_of(r.out, rank, "LOCAL_WORLD_SIZE", v, sizeof v), "2");
        cr_assert_str_eq(value_of(r.out, rank, "GROUP_RANK", v, sizeof v), "1");
        cr_assert_str_eq(value_of(r.out, rank, "DT_SECRET", v, sizeof v), secret + 10);
        cr_assert_str_eq(value_of(r.out, rank, "DT_INIT_URL", v, sizeof v),
                         "file:///tmp/dt-launch-test-shared");
    }
    launch_cleanup(&r);
}

/* ---- output --------------------------------------------------------------------- */

Test(launcher, output_lines_carry_their_rank_and_never_interleave, .timeout = 60)
{
    enum { RANKS = 3, LINES = 3000 };
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "3", W, "lines", "3000", NULL});
    launch_wait(&r);
    cr_assert_eq(r.code, 0, "exit %d, stderr:\n%s", r.code, r.err);
    int next[RANKS] = {0};
    bool tail[RANKS] = {false};
    char *save, *line = strtok_r(r.out, "\n", &save);
    for (; line; line = strtok_r(NULL, "\n", &save)) {
        int prefix, rank, i, used = 0;
        char payload[80];
        if (sscanf(line, "[%d] no-newline rank=%d%n", &prefix, &rank, &used) == 2 && !line[used]) {
            cr_assert_eq(prefix, rank, "line '%s' has another rank's prefix", line);
            tail[rank] = true;
            continue;
        }
        cr_assert_eq(sscanf(line, "[%d] rank=%d line=%d %79s%n", &prefix, &rank, &i, payload,
                            &used),
                     4, "malformed line '%s'", line);
        cr_assert(!line[used] && !strcmp(payload, "abcdefghijklmnopqrstuvwxyz0123456789"
                                                  "abcdefghijklmnopqrstuvwxyz"),
                  "mangled line '%s'", line);
        cr_assert_eq(prefix, rank, "line '%s' has another rank's prefix", line);
        cr_assert(rank >= 0 && rank < RANKS && i == next[rank], "line '%s' out of order", line);
        next[rank]++;
    }
    for (int k = 0; k < RANKS; k++) {
        cr_assert_eq(next[k], LINES, "rank %d: %d of %d lines", k, next[k], LINES);
        cr_assert(tail[k], "rank %d: the last line without newline was lost", k);
    }
    launch_cleanup(&r);
}

Test(launcher, stderr_stays_on_stderr_with_its_prefix, .timeout = 30)
{
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "2", W, "streams", NULL});
    launch_wait(&r);
    cr_assert_eq(r.code, 0);
    cr_assert(strstr(r.out, "[1] to-stdout rank=1\n") && !strstr(r.out, "to-stderr"), "%s", r.out);
    cr_assert(strstr(r.err, "[1] to-stderr rank=1\n") && !strstr(r.err, "to-stdout"), "%s", r.err);
    launch_cleanup(&r);
}

Test(launcher, log_dir_gets_one_file_per_rank, .timeout = 30)
{
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "2", "--log-dir", "DIR", W, "streams", NULL});
    launch_wait(&r);
    cr_assert_eq(r.code, 0, "exit %d, stderr:\n%s", r.code, r.err);
    char *log1 = slurp(r.dir, "rank_00001.log");
    cr_assert(strstr(log1, "to-stdout rank=1\n") && strstr(log1, "to-stderr rank=1\n") &&
                  !strstr(log1, "rank=0"),
              "rank_00001.log:\n%s", log1);
    free(log1);
    launch_cleanup(&r);
}

/* ---- failures ----------------------------------------------------------------------- */

Test(launcher, a_failing_rank_stops_the_others_and_its_code_is_the_exit_code, .timeout = 30)
{
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "4", W, "fail", "DIR", "2", "3", NULL});
    launch_wait(&r);
    cr_assert_eq(r.code, 3, "exit %d, stderr:\n%s", r.code, r.err);
    cr_assert(strstr(r.err, "ROOT CAUSE: rank 2") && strstr(r.err, "exited with code 3"),
              "no root cause in:\n%s", r.err);
    cr_assert(strstr(r.err, "[2] rank 2 is about to fail with code 3"),
              "the failing rank's last lines are missing:\n%s", r.err);
    cr_assert(!strstr(r.err, "ROOT CAUSE: rank 0") && !strstr(r.err, "ROOT CAUSE: rank 1"));
    assert_all_gone(&r, 4);
    launch_cleanup(&r);
}

Test(launcher, a_killed_rank_is_named_with_its_signal_and_the_rest_stop, .timeout = 10)
{
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "3", W, "sleep", "DIR", NULL});
    for (int i = 0; i < 3; i++)
        wait_pid_file(&r, i);
    kill(wait_pid_file(&r, 1), SIGKILL);
    launch_wait(&r);
    cr_assert_eq(r.code, 128 + SIGKILL, "exit %d, stderr:\n%s", r.code, r.err);
    cr_assert(strstr(r.err, "ROOT CAUSE: rank 1") && strstr(r.err, "SIGKILL"),
              "no root cause in:\n%s", r.err);
    assert_all_gone(&r, 3);
    launch_cleanup(&r);
}

Test(launcher, a_worker_ignoring_sigterm_is_killed_after_the_grace_period, .timeout = 20)
{
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "2", "--grace", "0.2", W, "sleep-ignore-term", "DIR",
                                      NULL});
    for (int i = 0; i < 2; i++)
        wait_pid_file(&r, i);
    kill(wait_pid_file(&r, 0), SIGKILL);
    launch_wait(&r);
    cr_assert_eq(r.code, 128 + SIGKILL, "exit %d, stderr:\n%s", r.code, r.err);
    cr_assert(strstr(r.err, "sending SIGKILL"), "no escalation in:\n%s", r.err);
    assert_all_gone(&r, 2);
    launch_cleanup(&r);
}

Test(launcher, sigint_stops_every_worker_and_exits_130, .timeout = 20)
{
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "3", W, "sleep", "DIR", NULL});
    for (int i = 0; i < 3; i++)
        wait_pid_file(&r, i);
    kill(r.pid, SIGINT);
    launch_wait(&r);
    cr_assert_eq(r.code, 130, "exit %d, stderr:\n%s", r.code, r.err);
    cr_assert(!strstr(r.err, "ROOT CAUSE"), "workers we stopped were blamed:\n%s", r.err);
    assert_all_gone(&r, 3);
    launch_cleanup(&r);
}

Test(launcher, sigterm_stops_every_worker_and_exits_143, .timeout = 20)
{
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "2", W, "sleep", "DIR", NULL});
    for (int i = 0; i < 2; i++)
        wait_pid_file(&r, i);
    kill(r.pid, SIGTERM);
    launch_wait(&r);
    cr_assert_eq(r.code, 143, "exit %d, stderr:\n%s", r.code, r.err);
    assert_all_gone(&r, 2);
    launch_cleanup(&r);
}

Test(launcher, a_missing_program_exits_127_naming_it, .timeout = 20)
{
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "2", "/nonexistent/dt-program", NULL});
    launch_wait(&r);
    cr_assert_eq(r.code, 127, "exit %d, stderr:\n%s", r.code, r.err);
    cr_assert(strstr(r.err, "/nonexistent/dt-program"), "%s", r.err);
    launch_cleanup(&r);
}

/* A process that still runs: one that is gone, or a zombie nobody has
 * reaped yet (its parent, the launcher, is dead), does not. */
static bool still_runs(pid_t pid)
{
    char state = proc_state(pid);
    return state != '?' && state != 'Z';
}

/* Workers run in sessions of their own, so no signal to the launcher
 * reaches them; yet when the launcher is SIGKILLed they must not live on
 * unwatched. Waits (bounded by the test's timeout) until every worker is
 * gone; any still alive at the end is killed here and reported. */
Test(launcher, workers_die_with_a_sigkilled_launcher, .timeout = 30)
{
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "2", W, "sleep", "DIR", NULL});
    pid_t pid[2];
    for (int i = 0; i < 2; i++)
        pid[i] = wait_pid_file(&r, i);
    kill(r.pid, SIGKILL);
    launch_wait(&r);
    int alive = 2;
    for (int tries = 0; alive > 0 && tries < 1000; tries++) {
        alive = 0;
        for (int i = 0; i < 2; i++)
            alive += still_runs(pid[i]);
        if (alive)
            nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    for (int i = 0; i < 2; i++)
        if (still_runs(pid[i])) {
            kill(pid[i], SIGKILL);
            cr_expect_fail("rank %d (pid %d) outlived its SIGKILLed launcher", i, (int)pid[i]);
        }
    launch_cleanup(&r);
}

/* ---- the rendezvous file ---------------------------------------------------------------- */

static bool exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* Two ranks join (the file now exists, held open by both) and sleep; Ctrl-C
 * kills them before they can remove it, so the launcher must. */
static void assert_ctrl_c_removes_the_rendezvous_file(const char *rdzv_flag)
{
    launch_run r;
    launch_start(&r, rdzv_flag ? (const char *[]){"-n", "2", "--rdzv", rdzv_flag, W, "join-sleep",
                                                  "DIR", NULL}
                               : (const char *[]){"-n", "2", W, "join-sleep", "DIR", NULL});
    for (int i = 0; i < 2; i++)
        wait_pid_file(&r, i);
    kill(r.pid, SIGINT);
    launch_wait(&r);
    cr_assert_eq(r.code, 130, "exit %d, stderr:\n%s", r.code, r.err);
    char url[256];
    value_of(r.out, 0, "init_url", url, sizeof url);
    cr_assert(!strncmp(url, "file://", 7), "%s", url);
    cr_assert(!exists(url + 7), "the rendezvous file %s outlived the launcher", url + 7);
    launch_cleanup(&r);
}

Test(launcher, ctrl_c_removes_the_rendezvous_file_the_launcher_named, .timeout = 60)
{
    assert_ctrl_c_removes_the_rendezvous_file(NULL);
}

Test(launcher, ctrl_c_removes_an_rdzv_file_that_did_not_exist_before_the_launch, .timeout = 60)
{
    char url[128];
    snprintf(url, sizeof url, "file:///tmp/dt-launch-test-rdzv-%d", (int)getpid());
    unlink(url + 7);
    assert_ctrl_c_removes_the_rendezvous_file(url);
}

/* A launcher SIGKILLed while its ranks hold the rendezvous file cannot
 * remove it; the next launch does, once the ranks are gone. (Any launch
 * sweeps, so one running beside this test may be the one that removes
 * it: what is pinned down is that none outlives the next launch.) */
Test(launcher, the_next_launch_removes_the_file_a_sigkilled_launcher_left, .timeout = 60)
{
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "2", W, "join-sleep", "DIR", NULL});
    pid_t pid[2];
    for (int i = 0; i < 2; i++)
        pid[i] = wait_pid_file(&r, i);
    kill(r.pid, SIGKILL);
    launch_wait(&r);
    const char *at = strstr(r.err, "rendezvous file://");
    cr_assert(at, "no rendezvous in the launcher's first line:\n%s", r.err);
    char path[128];
    snprintf(path, sizeof path, "%.*s", (int)strcspn(at + 18, "\n"), at + 18);
    for (int i = 0; i < 2; i++)
        while (still_runs(pid[i]))
            nanosleep(&(struct timespec){0, 10000000}, NULL);
    launch_run next;
    launch_start(&next, (const char *[]){"-n", "1", W, "env", NULL});
    launch_wait(&next);
    cr_assert_eq(next.code, 0, "exit %d, stderr:\n%s", next.code, next.err);
    cr_expect(!exists(path), "%s outlived the next launch:\n%s", path, next.err);
    unlink(path);
    launch_cleanup(&r);
    launch_cleanup(&next);
}

/* Without a next launch, and under a --run-id name no sweep knows: the
 * launcher's watcher (rdzv_watch.c) removes the file once the workers the
 * SIGKILL took with it have let go. Polled for up to 10 s. */
Test(launcher, a_sigkilled_launchers_rendezvous_file_goes_without_another_launch, .timeout = 30)
{
    char id[64], path[96];
    snprintf(id, sizeof id, "killed_%d", (int)getpid());
    snprintf(path, sizeof path, "/tmp/dtrain-%s", id);
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "2", "--run-id", id, W, "join-sleep", "DIR", NULL});
    for (int i = 0; i < 2; i++)
        wait_pid_file(&r, i);
    cr_assert(exists(path), "the ranks met elsewhere than %s:\n%s", path, r.err);
    kill(r.pid, SIGKILL);
    launch_wait(&r);
    bool gone = false;
    for (int i = 0; i < 1000 && !gone; i++) {
        gone = !exists(path);
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    unlink(path);
    cr_assert(gone, "%s outlived its SIGKILLed launcher by 10 s", path);
    launch_cleanup(&r);
}

/* The watcher never removes a file a live process still holds: here the
 * test itself joins the store before the launcher is killed. */
Test(launcher, a_sigkilled_launchers_file_stays_while_someone_still_holds_it, .timeout = 30)
{
    char id[64], url[96];
    snprintf(id, sizeof id, "held_%d", (int)getpid());
    snprintf(url, sizeof url, "file:///tmp/dtrain-%s", id);
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "2", "--run-id", id, W, "join-sleep", "DIR", NULL});
    pid_t pid[2];
    for (int i = 0; i < 2; i++)
        pid[i] = wait_pid_file(&r, i);
    dt_store *s = NULL;
    cr_assert_eq(dt_store_open(&s, url, "holder"), DT_OK, "%s", dt_store_error(s));
    kill(r.pid, SIGKILL);
    launch_wait(&r);
    for (int i = 0; i < 2; i++)
        while (still_runs(pid[i]))
            nanosleep(&(struct timespec){0, 10000000}, NULL);
    nanosleep(&(struct timespec){1, 0}, NULL); /* 50 of the watcher's tries */
    bool stayed = exists(url + 7);
    dt_store_close(s); /* the last holder: removes it */
    cr_assert(stayed, "a file still held was removed");
    cr_assert(!exists(url + 7), "the last holder's close left %s", url + 7);
    launch_cleanup(&r);
}

Test(launcher, an_rdzv_file_that_existed_before_the_launch_is_left_alone, .timeout = 30)
{
    char url[128];
    snprintf(url, sizeof url, "file:///tmp/dt-launch-test-keep-%d", (int)getpid());
    FILE *f = fopen(url + 7, "w");
    cr_assert(f);
    fputs("not ours to remove\n", f);
    fclose(f);
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "2", "--rdzv", url, W, "fail", "DIR", "1", "4", NULL});
    launch_wait(&r);
    cr_assert_eq(r.code, 4, "exit %d, stderr:\n%s", r.code, r.err);
    char *left = slurp("/tmp", strrchr(url, '/') + 1);
    cr_assert_str_eq(left, "not ours to remove\n", "the user's file was touched");
    free(left);
    unlink(url + 7);
    launch_cleanup(&r);
}

/* The file the ranks met in is theirs to remove at the end only when the
 * run created it: an empty file made beforehand (a store's file with no
 * records) is joined, used, and left where it was. */
Test(launcher, an_rdzv_file_the_ranks_joined_stays_when_it_existed_before_the_launch, .timeout = 60)
{
    char url[128];
    snprintf(url, sizeof url, "file:///tmp/dt-launch-test-joined-%d", (int)getpid());
    int fd = open(url + 7, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert(fd >= 0, "%s: %s", url + 7, strerror(errno));
    close(fd);
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "2", "--rdzv", url, W, "allreduce", NULL});
    launch_wait(&r);
    cr_assert_eq(r.code, 0, "exit %d, stderr:\n%s", r.code, r.err);
    cr_assert(strstr(r.out, "[1] rank=1 world=2 sum=3"), "the ranks did not meet:\n%s", r.out);
    cr_expect(exists(url + 7), "%s was removed at the end of the job", url + 7);
    unlink(url + 7);
    launch_cleanup(&r);
}

/* ---- restarts ------------------------------------------------------------------------- */

Test(launcher, max_restarts_restarts_the_group_until_it_succeeds, .timeout = 30)
{
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "2", "--max-restarts", "2", W, "fail-until", "2", "5",
                                      NULL});
    launch_wait(&r);
    cr_assert_eq(r.code, 0, "exit %d, stderr:\n%s", r.code, r.err);
    cr_assert(strstr(r.err, "restart 1 of 2") && strstr(r.err, "restart 2 of 2"), "%s", r.err);
    /* Either rank's line will do: the launcher may stop a rank of a failed
     * attempt before it prints, but the one whose exit it saw has printed. */
    char job0[128], job2[128];
    const char *a0 = strstr(r.out, "] attempt 0 job "), *a2 = strstr(r.out, "] attempt 2 job ");
    cr_assert(a0 && a2, "no attempt 0 or attempt 2 line:\n%s", r.out);
    cr_assert(sscanf(a0, "] attempt 0 job %127s", job0) == 1);
    cr_assert(sscanf(a2, "] attempt 2 job %127s", job2) == 1);
    size_t n = strlen(job0);
    cr_assert(n > 3 && !strcmp(job0 + n - 3, "-r0") && !strncmp(job0, job2, n - 3) &&
                  !strcmp(job2 + n - 3, "-r2"),
              "job ids %s then %s", job0, job2);
    launch_cleanup(&r);
}

Test(launcher, exhausted_restarts_exit_with_the_last_failure, .timeout = 30)
{
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "2", "--max-restarts", "1", W, "fail-until", "9", "5",
                                      NULL});
    launch_wait(&r);
    cr_assert_eq(r.code, 5, "exit %d, stderr:\n%s", r.code, r.err);
    cr_assert(strstr(r.err, "restart 1 of 1") && !strstr(r.err, "restart 2"), "%s", r.err);
    cr_assert(strstr(r.err, "giving up"), "%s", r.err);
    launch_cleanup(&r);
}

/* ---- flags ---------------------------------------------------------------------------- */

static void assert_usage_error(const char **args, const char *needle)
{
    launch_run r;
    launch_start(&r, args);
    launch_wait(&r);
    cr_assert_eq(r.code, 2, "exit %d, stderr:\n%s", r.code, r.err);
    cr_assert(strstr(r.err, needle), "expected '%s' in:\n%s", needle, r.err);
    launch_cleanup(&r);
}

Test(launcher, an_unknown_flag_exits_2_naming_it, .timeout = 10)
{
    assert_usage_error((const char *[]){"--nproc", "2", W, "env", NULL}, "unknown flag '--nproc'");
}

Test(launcher, an_unknown_flag_is_answered_with_the_closest_known_spelling, .timeout = 10)
{
    assert_usage_error((const char *[]){"--nproc_per_nod", "2", W, "env", NULL},
                       "unknown flag '--nproc_per_nod' (did you mean --nproc-per-node?)");
    assert_usage_error((const char *[]){"--max-restart", "1", W, "env", NULL},
                       "unknown flag '--max-restart' (did you mean --max-restarts?)");
    assert_usage_error((const char *[]){"--rdzv_i=x", W, "env", NULL}, "(did you mean --rdzv-id?)");
}

/* `--log_dir -n 2 ./prog` once made a directory named -n and ran `2`. */
Test(launcher, a_value_that_looks_like_a_flag_is_refused_and_nothing_is_made, .timeout = 10)
{
    char cwd[] = "/tmp/dt-launch-cwd-XXXXXX", dir[64];
    cr_assert(mkdtemp(cwd) && chdir(cwd) == 0); /* this test's process only */
    snprintf(dir, sizeof dir, "%s/-n", cwd);
    assert_usage_error((const char *[]){"--log_dir", "-n", "2", W, "env", NULL},
                       "--log-dir needs a value (D), and the next argument '-n' is a flag");
    bool made = access(dir, F_OK) == 0;
    rmdir(dir);
    rmdir(cwd);
    cr_assert_not(made, "the launcher made a directory named -n");
    assert_usage_error((const char *[]){"--run-id", "--nnodes", "1", W, "env", NULL},
                       "write --run-id=--nnodes");
}

Test(launcher, a_bad_number_exits_2_with_the_range, .timeout = 10)
{
    assert_usage_error((const char *[]){"-n", "0", W, "env", NULL}, "--nproc-per-node: '0'");
    assert_usage_error((const char *[]){"--grace=soon", W, "env", NULL}, "--grace: 'soon'");
}

Test(launcher, a_flag_without_its_value_or_no_program_exits_2, .timeout = 10)
{
    assert_usage_error((const char *[]){"--max-restarts", NULL}, "needs a value");
    assert_usage_error((const char *[]){"-n", "2", NULL}, "no PROGRAM");
}

Test(launcher, multi_node_needs_rdzv_node_rank_and_a_shared_secret, .timeout = 10)
{
    assert_usage_error((const char *[]){"--nnodes", "2", "--node-rank", "0", W, "env", NULL},
                       "--rdzv");
    assert_usage_error((const char *[]){"--nnodes", "2", "--rdzv", "file:///tmp/x", W, "env", NULL},
                       "--node-rank");
    assert_usage_error((const char *[]){"--nnodes", "2", "--node-rank", "1", "--rdzv",
                                        "file:///tmp/x", W, "env", NULL},
                       "DT_SECRET");
}

Test(launcher, help_lists_every_flag_and_exits_0, .timeout = 10)
{
    launch_run r;
    launch_start(&r, (const char *[]){"--help", NULL});
    launch_wait(&r);
    cr_assert_eq(r.code, 0);
    const char *flags[] = {"-n, --nproc-per-node N", "--nnodes M",
                           "--node-rank K",          "--rdzv URL",
                           "--max-restarts R",       "--log-dir D",
                           "--grace SECONDS",        "--run-id ID"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        cr_assert(strstr(r.out, flags[i]), "'%s' missing from:\n%s", flags[i], r.out);
    launch_cleanup(&r);
}

/* ---- a real job: the environment is enough to form a communicator -------------------- */

Test(launcher, ranks_form_a_communicator_from_the_environment_alone, .timeout = 60)
{
    launch_run r;
    launch_start(&r, (const char *[]){"-n", "3", W, "allreduce", NULL});
    launch_wait(&r);
    cr_assert_eq(r.code, 0, "exit %d, stderr:\n%s", r.code, r.err);
    for (int rank = 0; rank < 3; rank++) {
        char want[64];
        snprintf(want, sizeof want, "[%d] rank=%d world=3 sum=6\n", rank, rank);
        cr_assert(strstr(r.out, want), "'%s' missing from:\n%s", want, r.out);
    }
    launch_cleanup(&r);
}

Test(launcher, two_launchers_as_two_nodes_form_one_job, .timeout = 60)
{
    static const char secret[] = "DT_SECRET=ffeeddccbbaa99887766554433221100"
                                 "ffeeddccbbaa99887766554433221100";
    char url[128];
    snprintf(url, sizeof url, "file:///tmp/dt-launch-test-nodes-%d", (int)getpid());
    launch_run node[2];
    for (int k = 0; k < 2; k++)
        launch_start_env(&node[k], (const char *[]){secret, NULL},
                         (const char *[]){"-n", "2", "--nnodes", "2", "--node-rank", k ? "1" : "0",
                                          "--rdzv", url, W, "allreduce", NULL});
    for (int k = 0; k < 2; k++) {
        launch_wait(&node[k]);
        cr_assert_eq(node[k].code, 0, "node %d: exit %d, stderr:\n%s", k, node[k].code,
                     node[k].err);
        for (int rank = 2 * k; rank < 2 * k + 2; rank++) {
            char want[64];
            snprintf(want, sizeof want, "[%d] rank=%d world=4 sum=10\n", rank, rank);
            cr_assert(strstr(node[k].out, want), "'%s' missing from:\n%s", want, node[k].out);
        }
    }
    for (int k = 0; k < 2; k++)
        launch_cleanup(&node[k]);
}

/* docs/12's command with a different DT_SECRET on node 1 and no --run-id:
 * each node derives another run id from its secret, so without the job
 * marker they never met and both waited out the 60 s start-up deadline. */
Test(launcher, nodes_with_different_secrets_are_told_so_within_10_s, .timeout = 60)
{
    static const char *const secrets[2] = {
        "DT_SECRET=00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
        "DT_SECRET=ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"};
    char url[128];
    snprintf(url, sizeof url, "file:///tmp/dt-launch-test-secrets-%d", (int)getpid());
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    launch_run node[2];
    for (int k = 0; k < 2; k++)
        launch_start_env(&node[k], (const char *[]){secrets[k], NULL},
                         (const char *[]){"-n", "2", "--nnodes", "2", "--node-rank", k ? "1" : "0",
                                          "--rdzv", url, W, "allreduce", NULL});
    for (int k = 0; k < 2; k++)
        launch_wait(&node[k]);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    for (int k = 0; k < 2; k++) {
        cr_assert_neq(node[k].code, 0, "node %d started a job with another secret", k);
        cr_assert(strstr(node[k].err, "DT_SECRET differs"), "node %d does not name the secret:\n%s",
                  k, node[k].err);
    }
    cr_assert_lt(took, 10.0, "the nodes took %.1f s to fail", took);
    unlink(url + 7);
    for (int k = 0; k < 2; k++)
        launch_cleanup(&node[k]);
}

/* A port nobody listens on now (the kernel's pick for a closed socket). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

Test(launcher, two_launchers_meet_at_node_0s_tcp_store_by_master_addr_and_port, .timeout = 60)
{
    static const char secret[] = "DT_SECRET=00112233445566778899aabbccddeeff"
                                 "00112233445566778899aabbccddeeff";
    char port[16];
    snprintf(port, sizeof port, "%d", free_port());
    launch_run node[2];
    for (int k = 0; k < 2; k++)
        launch_start_env(&node[k], (const char *[]){secret, NULL},
                         (const char *[]){"-n", "2", "--nnodes", "2", "--node-rank", k ? "1" : "0",
                                          "--master-addr", "127.0.0.1", "--master-port", port, W,
                                          "allreduce", NULL});
    for (int k = 0; k < 2; k++) {
        launch_wait(&node[k]);
        cr_assert_eq(node[k].code, 0, "node %d: exit %d, stderr:\n%s", k, node[k].code,
                     node[k].err);
        for (int rank = 2 * k; rank < 2 * k + 2; rank++) {
            char want[64];
            snprintf(want, sizeof want, "[%d] rank=%d world=4 sum=10\n", rank, rank);
            cr_assert(strstr(node[k].out, want), "'%s' missing from:\n%s", want, node[k].out);
        }
    }
    for (int k = 0; k < 2; k++)
        launch_cleanup(&node[k]);
}

Test(launcher, rdzv_endpoint_and_master_addr_together_are_a_usage_error, .timeout = 10)
{
    assert_usage_error((const char *[]){"--rdzv-endpoint", "127.0.0.1:1", "--master-addr",
                                        "127.0.0.1", "--master-port", "2", W, "env", NULL},
                       "give one of");
    assert_usage_error((const char *[]){"--master-addr", "127.0.0.1", W, "env", NULL},
                       "go together");
}
