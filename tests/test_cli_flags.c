/*
 * test_cli_flags.c — how every program reads its flags (dt_flags.h), and
 * dtrain-launch read as torchrun.
 *
 * A long flag's words join with '-' or '_' and the two spellings do the
 * same; a value follows a blank or '='. A bad flag or value prints exactly
 * two lines, the one naming it and a pointer to --help, and exits 2; --help
 * anywhere on the line prints the usage, exits 0 and does no work.
 * dtrain-launch takes the command line a PyTorch user types for torchrun,
 * refuses by name what it does not do (elastic node ranges, etcd), and
 * hands its workers torchrun's MASTER_ADDR/MASTER_PORT. The programs run
 * as built, through run_program.h; none trains for more than two steps.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "run_program.h"

__attribute__((noinline)) static char *run(const char *const *argv, int *code)
{
    char log[64];
    snprintf(log, sizeof log, "/tmp/dtrain-test-cli-flags-%d.log", (int)getpid());
    char *out;
    *code = run_program(argv, log, &out);
    unlink(log);
    return out;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* The lines of `out` that start with '[' (the workers'), in order. */
static void worker_lines(const char *out, char *dst, size_t len)
{
    size_t k = 0;
    for (const char *p = out; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p)) {
        size_t n = strcspn(p, "\n");
        if (*p == '[' && k + n + 2 < len) {
            memcpy(dst + k, p, n + 1);
            k += n + 1;
        }
    }
    dst[k] = '\0';
}

/* ---- bad flags: one line naming it, one pointing at --help, exit 2 ----------- */

/* Runs argv; asserts exit 2, exactly two lines, the first holding
 * `needle`, the second the pointer to --help. */
static void assert_one_line_and_a_hint(const char *const *argv, const char *needle)
{
    int code;
    char *out = run(argv, &code);
    cr_assert_eq(code, 2, "%s %s exited %d:\n%s", argv[0], argv[1], code, out);
    cr_assert_eq(count_lines(out), 2, "%s %s printed other than 2 lines:\n%s", argv[0], argv[1],
                 out);
    char *second = strchr(out, '\n') + 1;
    cr_assert(strstr(out, needle) && strstr(out, needle) < second, "no \"%s\" in line 1:\n%s",
              needle, out);
    cr_assert(!strncmp(second, "see '", 5) && strstr(second, " --help'\n"), "no hint:\n%s", out);
    free(out);
}

Test(cli_flags, an_unknown_flag_is_one_line_and_a_hint_in_every_program, .timeout = 60)
{
    const char *bins[] = {MINIGPT_BIN,     LAUNCH_BIN,     DTRAIN_BENCH_BIN,
                          GROUP_BENCH_BIN, CKPT_BENCH_BIN, MINIGPT_BENCH_BIN,
                          DTRAIN_DEMO_BIN, DT_CKPT_BIN,    LOOPBACK_STREAMS_BIN};
    for (size_t i = 0; i < sizeof bins / sizeof bins[0]; i++)
        assert_one_line_and_a_hint((const char *[]){bins[i], "--no-such-flag", NULL},
                                   "'--no-such-flag'");
}

Test(cli_flags, minigpt_says_lr_must_be_a_positive_number, .timeout = 30)
{
    assert_one_line_and_a_hint((const char *[]){MINIGPT_BIN, "--lr", "nan", NULL},
                               "--lr: must be a positive number, got 'nan'");
}

Test(cli_flags, minigpt_refuses_more_threads_than_its_cap, .timeout = 30)
{
    assert_one_line_and_a_hint((const char *[]){MINIGPT_BIN, "--threads", "100000", NULL},
                               "--threads: at most 256");
}

/* The CPUs this test may run on, as minigpt counts them. */
static int usable_cores(void)
{
    cpu_set_t set;
    return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
}

Test(cli_flags, minigpt_warns_when_its_threads_outnumber_the_cores, .timeout = 60)
{
    char threads[16];
    snprintf(threads, sizeof threads, "%d", usable_cores() + 1);
    int code;
    char *out = run((const char *[]){MINIGPT_BIN, "--threads", threads, "--steps", "1",
                                     "--eval-every", "0", "--sample", "0", NULL},
                    &code);
    cr_assert_eq(code, 0, "%s", out);
    cr_expect(strstr(out, "oversubscribed, every step will crawl"), "%s", out);
    free(out);
}

Test(cli_flags, minigpt_does_not_warn_when_its_threads_fit, .timeout = 60)
{
    int code;
    char *out = run((const char *[]){MINIGPT_BIN, "--threads", "1", "--steps", "1", "--eval-every",
                                     "0", "--sample", "0", NULL},
                    &code);
    cr_assert_eq(code, 0, "%s", out);
    cr_expect(!strstr(out, "oversubscribed"), "%s", out);
    free(out);
}

Test(cli_flags, minigpt_reports_a_bad_pipeline_combination_without_the_usage, .timeout = 30)
{
    assert_one_line_and_a_hint((const char *[]){MINIGPT_BIN, "--dp", "2", NULL}, "--dp");
}

Test(cli_flags, minigpt_refuses_a_tp_that_does_not_divide_the_heads_before_connecting,
     .timeout = 30)
{
    assert_one_line_and_a_hint((const char *[]){MINIGPT_BIN, "--tp", "3", NULL},
                               "--tp 3 does not divide the heads H = 4 (--heads)");
}

Test(cli_flags, the_launcher_refuses_an_empty_program_name, .timeout = 30)
{
    assert_one_line_and_a_hint((const char *[]){LAUNCH_BIN, "-n", "2", "", NULL}, "empty name");
}

/* ---- both spellings ------------------------------------------------------------ */

#define TINY_RUN                                                                             \
    "-C", "16", "-H", "2", "-L", "1", "-T", "8", "-B", "2", "--steps", "2", "--sample", "0", \
        "--eval-every", "0", "--log-every", "1"

Test(cli_flags, minigpt_grad_accum_in_either_spelling_trains_alike, .timeout = 120)
{
    int c1, c2;
    char *dashed = run((const char *[]){MINIGPT_BIN, "--grad-accum", "2", TINY_RUN, NULL}, &c1);
    char *under = run((const char *[]){MINIGPT_BIN, "--grad_accum=2", TINY_RUN, NULL}, &c2);
    cr_assert_eq(c1, 0, "--grad-accum exited %d:\n%s", c1, dashed);
    cr_assert_eq(c2, 0, "--grad_accum exited %d:\n%s", c2, under);
    cr_expect(strstr(dashed, "x accum 2 x") && strstr(under, "x accum 2 x"), "%s\n---\n%s", dashed,
              under);
    /* the parameters' hash after training: the same weights, bit for bit */
    const char *a = strstr(dashed, "(hash "), *b = strstr(under, "(hash ");
    cr_assert(a && b, "no parameter hash:\n%s\n---\n%s", dashed, under);
    cr_expect_eq(strncmp(a, b, 24), 0, "the runs differ:\n%s\n---\n%s", dashed, under);
    free(dashed);
    free(under);
}

Test(cli_flags, minigpt_and_dtrain_bench_refuse_a_wire_they_do_not_speak, .timeout = 30)
{
    assert_one_line_and_a_hint((const char *[]){MINIGPT_BIN, "--wire", "mpi", NULL},
                               "--wire is dtrain or gloo, not 'mpi'");
    assert_one_line_and_a_hint((const char *[]){DTRAIN_BENCH_BIN, "--wire", "mpi", NULL},
                               "--wire 'mpi': not a wire");
}

/* --wire gloo chooses torch's wire without DT_WIRE: its rank 0 says so. */
Test(cli_flags, wire_gloo_puts_minigpt_and_dtrain_bench_on_the_gloo_wire, .timeout = 120)
{
    const char *said = "the gloo wire (torch 1.13's) has no authentication";
    int code;
    char *out = run((const char *[]){LAUNCH_BIN, "-n", "2", MINIGPT_BIN, "--wire", "gloo", TINY_RUN,
                                     NULL},
                    &code);
    cr_assert_eq(code, 0, "minigpt --wire gloo exited %d:\n%s", code, out);
    cr_expect(strstr(out, said), "minigpt --wire gloo did not use the gloo wire:\n%s", out);
    free(out);
    out = run((const char *[]){DTRAIN_BENCH_BIN, "--ranks", "2", "--wire", "gloo", "-b", "4", "-e",
                               "4", "--check", NULL},
              &code);
    cr_assert_eq(code, 0, "dtrain-bench --wire gloo exited %d:\n%s", code, out);
    cr_expect(strstr(out, said), "dtrain-bench --wire gloo did not use the gloo wire:\n%s", out);
    free(out);
}

/* How often `word` occurs in the line of `text` that holds `at`. */
static int count_in_line(const char *text, const char *at, const char *word)
{
    const char *start = at, *end = strchr(at, '\n');
    while (start > text && start[-1] != '\n')
        start--;
    int n = 0;
    for (const char *p = start; (p = strstr(p, word)) && (!end || p < end); p += strlen(word))
        n++;
    return n;
}

/* More stages than blocks is a partition the pipeline layer refuses; its
 * message already names the layer, and minigpt puts only its rank in
 * front: "minigpt: rank 0: pipeline: 2 stages for 1 blocks: ...". */
Test(cli_flags, a_partition_minigpt_cannot_make_says_pipeline_once, .timeout = 60)
{
    const char *refusal = "pipeline: 2 stages for 1 blocks: every stage must own at least one "
                          "block (use --pp <= 1 or more layers)";
    int code;
    char *out = run((const char *[]){LAUNCH_BIN, "-n", "2", MINIGPT_BIN, "--pp", "2", TINY_RUN,
                                     NULL},
                    &code);
    cr_assert_neq(code, 0, "--pp 2 over 1 block ran:\n%s", out);
    const char *line = strstr(out, refusal);
    cr_assert(line, "no \"%s\" in:\n%s", refusal, out);
    for (; line; line = strstr(line + 1, refusal))
        cr_expect_eq(count_in_line(out, line, "pipeline"), 1, "\"pipeline\" said twice:\n%s", out);
    cr_expect(strstr(out, "minigpt: rank 0: pipeline: 2 stages") ||
                  strstr(out, "minigpt: rank 1: pipeline: 2 stages"),
              "the rank does not lead the message:\n%s", out);
    free(out);
}

/* Each program recognises an underscored multi-word flag: the message is
 * about its value, under the flag's own (dashed) name. */
Test(cli_flags, every_program_reads_an_underscore_spelling_as_its_flag, .timeout = 60)
{
    assert_one_line_and_a_hint((const char *[]){MINIGPT_BIN, "--grad_accum", "0", NULL},
                               "--grad-accum: must be a positive integer");
    assert_one_line_and_a_hint((const char *[]){DTRAIN_BENCH_BIN, "--warmup_iters", "x", NULL},
                               "not a warm-up count");
    assert_one_line_and_a_hint((const char *[]){DTRAIN_BENCH_BIN, "--warmup-iters=x", NULL},
                               "not a warm-up count");
    assert_one_line_and_a_hint((const char *[]){LAUNCH_BIN, "--max_restarts", "x", "true", NULL},
                               "--max-restarts: 'x'");
    assert_one_line_and_a_hint((const char *[]){DT_CKPT_BIN, "reshard", "a", "b", "2",
                                                "--pp_partition", "x", NULL},
                               "--pp-partition: must be params or uniform");
}

Test(cli_flags, the_one_word_flags_take_a_value_after_equals, .timeout = 60)
{
    assert_one_line_and_a_hint((const char *[]){GROUP_BENCH_BIN, "--rounds=0", NULL},
                               "--rounds: must be an integer in 1..");
    assert_one_line_and_a_hint((const char *[]){CKPT_BENCH_BIN, "--rounds=x", NULL},
                               "--rounds: must be an integer in 1..");
    assert_one_line_and_a_hint((const char *[]){DTRAIN_DEMO_BIN, "--ranks=0", NULL},
                               "--ranks: must be an integer in 1..64");
}

/* ---- --help answers help and does nothing else ------------------------------- */

static void assert_help_only(const char *const *argv, const char *work)
{
    int code;
    char *out = run(argv, &code);
    cr_assert_eq(code, 0, "%s ... --help exited %d:\n%s", argv[0], code, out);
    cr_assert(!strncmp(out, "usage:", 6), "no usage first:\n%s", out);
    cr_assert(!strstr(out, work), "it did the work (\"%s\"):\n%s", work, out);
    free(out);
}

Test(cli_flags, help_after_other_flags_prints_the_usage_and_runs_nothing, .timeout = 60)
{
    assert_help_only((const char *[]){GROUP_BENCH_BIN, "--rounds", "1", "--help", NULL},
                     "medians on rank 0");
    assert_help_only((const char *[]){MINIGPT_BIN, "--steps", "1", "--help", NULL}, "tokens/s");
    assert_help_only((const char *[]){DTRAIN_BENCH_BIN, "--ranks", "2", "-h", NULL}, "# ");
    assert_help_only((const char *[]){DTRAIN_DEMO_BIN, "-n", "2", "--help", NULL}, "rank 0");
    assert_help_only((const char *[]){CKPT_BENCH_BIN, "--rounds", "1", "--help", NULL}, "ratio");
    assert_help_only((const char *[]){DT_CKPT_BIN, "verify", "/nonexistent", "--help", NULL},
                     "dtrain-ckpt:");
}

Test(cli_flags, dev_sh_help_lists_every_command_it_runs, .timeout = 30)
{
    int code;
    char *out = run((const char *[]){"/bin/bash", DEV_SH, "--help", NULL}, &code);
    cr_assert_eq(code, 0, "dev.sh --help exited %d:\n%s", code, out);
    char *script = run_slurp(DEV_SH);
    int commands = 0;
    for (char *line = strtok(script, "\n"); line; line = strtok(NULL, "\n")) {
        size_t n = strspn(line, "abcdefghijklmnopqrstuvwxyz-");
        if (n == 0 || strcmp(line + n, ")") != 0) /* a case label: "demo)" */
            continue;
        line[n] = '\0';
        char shown[64];
        snprintf(shown, sizeof shown, "./dev.sh %s", line);
        cr_expect(strstr(out, shown), "--help does not list %s:\n%s", shown, out);
        commands++;
    }
    cr_assert_gt(commands, 8, "found only %d commands in %s", commands, DEV_SH);
    free(script);
    free(out);
}

/* ---- dtrain-launch as torchrun ------------------------------------------------- */

Test(cli_flags, the_launcher_runs_torchruns_standalone_command_line, .timeout = 30)
{
    int code;
    char *out = run((const char *[]){LAUNCH_BIN, "--standalone", "--nproc_per_node=2",
                                     "--no_python", "--monitor_interval", "1", "/bin/sh", "-c",
                                     "echo rank $RANK of $WORLD_SIZE", NULL},
                    &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "[0] rank 0 of 2") && strstr(out, "[1] rank 1 of 2"), "%s", out);
    free(out);
}

Test(cli_flags, the_launchers_two_spellings_give_workers_the_same_environment, .timeout = 30)
{
    const char *show = "echo $RANK $WORLD_SIZE $TORCHELASTIC_MAX_RESTARTS $DT_INIT_TIMEOUT";
    int c1, c2;
    char *dashed = run((const char *[]){LAUNCH_BIN, "--nproc-per-node", "1", "--max-restarts", "2",
                                        "--init-timeout", "30", "/bin/sh", "-c", show, NULL},
                       &c1);
    char *under = run((const char *[]){LAUNCH_BIN, "--nproc_per_node=1", "--max_restarts=2",
                                       "--init_timeout", "30", "/bin/sh", "-c", show, NULL},
                      &c2);
    cr_assert(c1 == 0 && c2 == 0, "exits %d, %d:\n%s\n---\n%s", c1, c2, dashed, under);
    char a[512], b[512];
    worker_lines(dashed, a, sizeof a);
    worker_lines(under, b, sizeof b);
    cr_expect_str_eq(a, "[0] 0 1 2 30\n");
    cr_expect_str_eq(a, b);
    free(dashed);
    free(under);
}

Test(cli_flags, nproc_per_node_auto_starts_one_worker_per_usable_cpu, .timeout = 30)
{
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &one);
    cr_assert_eq(sched_setaffinity(0, sizeof one, &one), 0);
    int code;
    char *out = run((const char *[]){LAUNCH_BIN, "--nproc-per-node", "auto", "/bin/sh", "-c",
                                     "echo world $WORLD_SIZE", NULL},
                    &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "[0] world 1"), "%s", out);
    free(out);
}

Test(cli_flags, the_launcher_refuses_an_elastic_node_range_by_name, .timeout = 30)
{
    assert_one_line_and_a_hint((const char *[]){LAUNCH_BIN, "--nnodes", "1:4", "true", NULL},
                               "--nnodes '1:4': elastic ranges (MIN:MAX) are not supported");
}

Test(cli_flags, the_launcher_reads_a_fixed_node_range_as_its_count, .timeout = 30)
{
    int code;
    char *out = run((const char *[]){LAUNCH_BIN, "--nnodes=1:1", "/bin/sh", "-c",
                                     "echo nodes $GROUP_WORLD_SIZE", NULL},
                    &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "[0] nodes 1"), "%s", out);
    free(out);
}

Test(cli_flags, the_launcher_refuses_an_unsupported_rdzv_backend_by_name, .timeout = 30)
{
    assert_one_line_and_a_hint((const char *[]){LAUNCH_BIN, "--rdzv_backend", "etcd",
                                                "--rdzv_endpoint", "127.0.0.1:1", "true", NULL},
                               "--rdzv-backend 'etcd' is not supported");
}

Test(cli_flags, standalone_workers_get_a_local_master_addr_and_port, .timeout = 30)
{
    int code;
    char *out = run((const char *[]){LAUNCH_BIN, "--standalone", "-n", "2", "/bin/sh", "-c",
                                     "echo $MASTER_ADDR:$MASTER_PORT $TORCHELASTIC_USE_AGENT_STORE",
                                     NULL},
                    &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    unsigned p0 = 0, p1 = 0;
    const char *r0 = strstr(out, "[0] 127.0.0.1:"), *r1 = strstr(out, "[1] 127.0.0.1:");
    cr_assert(r0 && r1, "no MASTER_ADDR 127.0.0.1:\n%s", out);
    cr_assert(sscanf(r0 + 14, "%u False", &p0) == 1 && sscanf(r1 + 14, "%u False", &p1) == 1, "%s",
              out);
    cr_expect(p0 > 0 && p0 < 65536 && p0 == p1, "ports %u and %u:\n%s", p0, p1, out);
    free(out);
}

/* A TCP port on 127.0.0.1 that nothing listens on now. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

Test(cli_flags, with_a_tcp_rendezvous_master_addr_and_port_name_the_store, .timeout = 30)
{
    char endpoint[32], want[64];
    int port = free_port();
    snprintf(endpoint, sizeof endpoint, "127.0.0.1:%d", port);
    snprintf(want, sizeof want, "[0] 127.0.0.1 %d True", port);
    int code;
    char *out = run((const char *[]){LAUNCH_BIN, "--rdzv_backend=c10d", "--rdzv_endpoint", endpoint,
                                     "/bin/sh", "-c",
                                     "echo $MASTER_ADDR $MASTER_PORT $TORCHELASTIC_USE_AGENT_STORE",
                                     NULL},
                    &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, want), "no \"%s\" in:\n%s", want, out);
    free(out);
}

Test(cli_flags, redirects_sends_a_stream_to_the_log_file_only, .timeout = 30)
{
    char dir[64], log[96];
    snprintf(dir, sizeof dir, "/tmp/dtrain-test-cli-flags-logs-%d", (int)getpid());
    int code;
    char *out = run((const char *[]){LAUNCH_BIN, "--redirects", "1", "--log_dir", dir, "/bin/sh",
                                     "-c", "echo to-stdout; echo to-stderr >&2", NULL},
                    &code);
    snprintf(log, sizeof log, "%s/rank_00000.log", dir);
    char *logged = run_slurp(log);
    unlink(log);
    rmdir(dir);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(!strstr(out, "to-stdout") && strstr(out, "[0] to-stderr"), "shown:\n%s", out);
    cr_expect(strstr(logged, "to-stdout") && strstr(logged, "to-stderr"), "logged:\n%s", logged);
    free(logged);
    free(out);
}

Test(cli_flags, tee_without_a_log_dir_is_refused, .timeout = 30)
{
    assert_one_line_and_a_hint((const char *[]){LAUNCH_BIN, "--tee", "3", "true", NULL},
                               "--tee 3 sends output to log files: give --log-dir");
}

Test(cli_flags, the_oversubscription_warning_prints_a_fraction_as_it_is, .timeout = 30)
{
    cpu_set_t mine, two;
    cr_assert_eq(sched_getaffinity(0, sizeof mine, &mine), 0);
    CPU_ZERO(&two);
    for (int c = 0, n = 0; c < CPU_SETSIZE && n < 2; c++)
        if (CPU_ISSET(c, &mine))
            CPU_SET(c, &two), n++;
    cr_assert_eq(CPU_COUNT(&two), 2, "this test needs 2 CPUs to run on");
    cr_assert_eq(sched_setaffinity(0, sizeof two, &two), 0);
    int code;
    char *out = run((const char *[]){LAUNCH_BIN, "-n", "9", "/bin/true", NULL}, &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "9 workers on 2 CPU cores (4.5 per core)"), "%s", out);
    free(out);
}
