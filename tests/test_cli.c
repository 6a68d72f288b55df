/*
 * test_cli.c — every program's command line, as a person first meets it.
 *
 * `--help` prints a usage on stdout and exits 0 for each program (a help
 * that exits 2 reads as a failure to a script); a bad value is refused with
 * a message that names its flag and the value; dtrain-launch takes
 * torchrun's underscore spellings. The programs run as built, through
 * run_program.h; nothing here starts a training run longer than a step.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "run_program.h"

static char *run(const char *const *argv, int *code)
{
    char log[64];
    snprintf(log, sizeof log, "/tmp/dtrain-test-cli-%d.log", (int)getpid());
    char *out;
    *code = run_program(argv, log, &out);
    unlink(log);
    return out;
}

static void assert_help(const char *bin)
{
    int code;
    char *out = run((const char *[]){bin, "--help", NULL}, &code);
    cr_assert_eq(code, 0, "%s --help exited %d:\n%s", bin, code, out);
    cr_assert(strstr(out, "usage:"), "%s --help printed no usage:\n%s", bin, out);
    free(out);
}

Test(cli, help_exits_0_with_a_usage_in_every_program, .timeout = 60)
{
    const char *bins[] = {DTRAIN_DEMO_BIN,      DT_CKPT_BIN,      MINIGPT_BENCH_BIN, CKPT_BENCH_BIN,
                          LOOPBACK_STREAMS_BIN, DTRAIN_BENCH_BIN, LAUNCH_BIN,        MINIGPT_BIN};
    for (size_t i = 0; i < sizeof bins / sizeof bins[0]; i++)
        assert_help(bins[i]);
}

static void assert_refused(const char *const *argv, const char *needle)
{
    int code;
    char *out = run(argv, &code);
    cr_assert_eq(code, 2, "%s %s %s exited %d:\n%s", argv[0], argv[1], argv[2], code, out);
    cr_assert(strstr(out, needle), "expected \"%s\" in:\n%s", needle, out);
    free(out);
}

Test(cli, minigpt_names_the_flag_of_a_bad_value, .timeout = 30)
{
    assert_refused((const char *[]){MINIGPT_BIN, "--steps", "-5", NULL},
                   "--steps: must be a positive integer, got '-5'");
    assert_refused((const char *[]){MINIGPT_BIN, "--keep", "-1", NULL},
                   "--keep: must be a non-negative integer, got '-1'");
    assert_refused((const char *[]){MINIGPT_BIN, "-B", "two", NULL},
                   "--batch: must be a positive integer, got 'two'");
}

Test(cli, minigpt_refuses_a_negative_seed_rather_than_wrapping_it, .timeout = 30)
{
    assert_refused((const char *[]){MINIGPT_BIN, "--seed", "-1", NULL},
                   "--seed: must be a non-negative integer below 2^64, got '-1'");
}

/* ---- what minigpt says, read as a sentence ------------------------------------- */

Test(cli, minigpt_alone_says_1_rank_holds_the_parameters_not_all_1_ranks, .timeout = 60)
{
    int code;
    char *out = run((const char *[]){MINIGPT_BIN, "-n", "1", "--sample", "0", "--eval-every", "0",
                                     NULL},
                    &code);
    cr_assert_eq(code, 0, "minigpt -n 1 exited %d:\n%s", code, out);
    cr_expect(strstr(out, "replicas: 1 rank holds the parameters (hash "), "in:\n%s", out);
    cr_expect(!strstr(out, "all 1 ranks"), "in:\n%s", out);
    free(out);
}

Test(cli, minigpt_samples_after_a_prompt_that_reversing_changes, .timeout = 60)
{
    int code;
    char *out = run((const char *[]){MINIGPT_BIN, "-n", "1", "--sample", "8", "--eval-every", "0",
                                     NULL},
                    &code);
    cr_assert_eq(code, 0, "minigpt -n 1 exited %d:\n%s", code, out);
    const char *at = strstr(out, "sample: ");
    cr_assert(at, "no sample line in:\n%s", out);
    at += strlen("sample: ");
    size_t digits = strspn(at, "0123456789");
    cr_assert(digits > 0 && at[digits] == '=', "the prompt is not digits and '=':\n%s", out);
    bool palindrome = true;
    for (size_t i = 0; i < digits / 2; i++)
        palindrome = palindrome && at[i] == at[digits - 1 - i];
    cr_expect(!palindrome, "the prompt %.*s reads the same reversed: its sample shows no reversal",
              (int)digits, at);
    free(out);
}

/* A loopback port nobody listens on now: the kernel's pick for port 0. */
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

Test(cli, minigpt_at_an_env_store_without_a_secret_says_the_store_has_no_authentication,
     .timeout = 60)
{
    char port[16], script[512];
    snprintf(port, sizeof port, "%d", free_port());
    snprintf(script, sizeof script,
             "DT_INIT_URL=env:// MASTER_ADDR=127.0.0.1 MASTER_PORT=%s WORLD_SIZE=2 RANK=0 "
             "DT_INIT_TIMEOUT=5 exec \"$0\" -n 1 --sample 0",
             port);
    int code;
    char *out = run((const char *[]){"/bin/sh", "-c", script, MINIGPT_BIN, NULL}, &code);
    cr_assert_neq(code, 0, "minigpt started without a secret:\n%s", out);
    cr_expect(strstr(out, "rank 0: the env:// store has no authentication"), "in:\n%s", out);
    free(out);
}

Test(cli, the_small_programs_name_the_flag_of_a_bad_value, .timeout = 30)
{
    assert_refused((const char *[]){DTRAIN_DEMO_BIN, "-n", "0", NULL}, "-n: must be");
    assert_refused((const char *[]){CKPT_BENCH_BIN, "--rounds", "x", NULL}, "--rounds");
    assert_refused((const char *[]){MINIGPT_BENCH_BIN, "-n", "x", NULL}, "-n: must be");
    assert_refused((const char *[]){LOOPBACK_STREAMS_BIN, "-n", "1", NULL}, "-n: must be");
}

Test(cli, launcher_takes_torchruns_underscore_spellings, .timeout = 30)
{
    int code;
    char *out = run((const char *[]){LAUNCH_BIN, "--nproc_per_node", "2", "--nnodes=1",
                                     "--node_rank", "0", "--max_restarts", "0", "/bin/sh", "-c",
                                     "echo hello from $RANK of $WORLD_SIZE", NULL},
                    &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_assert(strstr(out, "hello from 0 of 2"), "rank 0 missing:\n%s", out);
    cr_assert(strstr(out, "hello from 1 of 2"), "rank 1 missing:\n%s", out);
    free(out);
}

Test(cli, launcher_help_mentions_the_underscore_spellings, .timeout = 10)
{
    int code;
    char *out = run((const char *[]){LAUNCH_BIN, "--help", NULL}, &code);
    cr_assert(strstr(out, "--nproc_per_node"), "help:\n%s", out);
    free(out);
}

/* The launcher runs on one CPU (the affinity its children inherit). */
static char *launch_on_one_cpu(const char *nproc, int *code)
{
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &one);
    cr_assert_eq(sched_setaffinity(0, sizeof one, &one), 0);
    return run((const char *[]){LAUNCH_BIN, "-n", nproc, "/bin/true", NULL}, code);
}

Test(cli, launcher_warns_when_workers_far_exceed_the_cpus, .timeout = 30)
{
    int code;
    char *out = launch_on_one_cpu("5", &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "warning: 5 workers on 1 CPU core"), "no warning:\n%s", out);
    free(out);
}

Test(cli, launcher_is_quiet_about_a_few_workers_per_cpu, .timeout = 30)
{
    int code;
    char *out = launch_on_one_cpu("4", &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(!strstr(out, "warning"), "unexpected warning:\n%s", out);
    free(out);
}

Test(cli, launcher_init_timeout_reaches_the_workers_as_dt_init_timeout, .timeout = 30)
{
    int code;
    char *out = run((const char *[]){LAUNCH_BIN, "--init-timeout", "90", "/bin/sh", "-c",
                                     "echo deadline=$DT_INIT_TIMEOUT", NULL},
                    &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "deadline=90"), "DT_INIT_TIMEOUT not passed on:\n%s", out);
    free(out);
}

Test(cli, launcher_timeouts_reach_the_workers_as_dt_timeout_and_dt_progress_timeout, .timeout = 30)
{
    int code;
    char *out =
        run((const char *[]){LAUNCH_BIN, "--timeout", "12", "--progress-timeout", "600", "/bin/sh",
                             "-c", "echo liveness=$DT_TIMEOUT progress=$DT_PROGRESS_TIMEOUT", NULL},
            &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "liveness=12 progress=600"), "the timeouts not passed on:\n%s", out);
    free(out);
}

Test(cli, launcher_wire_reaches_the_workers_as_dt_wire_and_refuses_other_wires, .timeout = 30)
{
    int code;
    char *out = run((const char *[]){LAUNCH_BIN, "--wire", "gloo", "/bin/sh", "-c",
                                     "echo wire=$DT_WIRE", NULL},
                    &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "wire=gloo"), "DT_WIRE not passed on:\n%s", out);
    free(out);
    out = run((const char *[]){LAUNCH_BIN, "--wire", "mpi", "/bin/true", NULL}, &code);
    cr_expect_eq(code, 2, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "--wire 'mpi': use dtrain or gloo"), "%s", out);
    free(out);
}

/* ---- minigpt's checkpoint flags, checked at start -------------------------- */

Test(cli, an_unwritable_ckpt_dir_fails_before_step_1, .timeout = 60)
{
    char file[64], dir[96];
    snprintf(file, sizeof file, "/tmp/dtrain-test-cli-file-%d", (int)getpid());
    FILE *f = fopen(file, "w");
    cr_assert(f);
    fclose(f);
    snprintf(dir, sizeof dir, "%s/ckpt", file); /* under a regular file */
    int code;
    char *out = run((const char *[]){MINIGPT_BIN, "--steps", "20", "--ckpt-every", "10",
                                     "--ckpt-dir", dir, NULL},
                    &code);
    unlink(file);
    cr_assert_eq(code, 1, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "--ckpt-dir") && strstr(out, "Not a directory"), "%s", out);
    cr_expect(!strstr(out, "step      loss"), "training started before the check:\n%s", out);
    free(out);
}

Test(cli, a_ckpt_dir_without_a_scheduled_save_is_reported, .timeout = 60)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/dtrain-test-cli-ckpt-%d", (int)getpid());
    int code;
    char *out = run((const char *[]){MINIGPT_BIN, "--steps", "1", "--sample", "0", "--ckpt-dir",
                                     dir, NULL},
                    &code);
    rmdir(dir);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "no save is scheduled"), "%s", out);
    free(out);
}

/* ---- minigpt --data with llm.c token shards ---------------------------------- */

static void write_token_shard(const char *path, int count, int stride)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    int32_t hdr[256] = {20240520, 1, count};
    fwrite(hdr, sizeof hdr, 1, f);
    for (int i = 0; i < count; i++) {
        uint16_t t = (uint16_t)(i * stride % 50257);
        fwrite(&t, sizeof t, 1, f);
    }
    fclose(f);
}

#define TINY_MODEL                                                                           \
    "-C", "16", "-H", "2", "-L", "1", "-T", "8", "-B", "2", "--steps", "2", "--sample", "0", \
        "--eval-every", "0"

Test(cli, minigpt_trains_on_an_llm_c_shard_with_gpt2s_vocabulary, .timeout = 120)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/dtrain-test-cli-shard-%d.bin", (int)getpid());
    write_token_shard(path, 4000, 7919);
    int code;
    char *out = run((const char *[]){MINIGPT_BIN, "--data", path, TINY_MODEL, NULL}, &code);
    unlink(path);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "llm.c token shards") && strstr(out, "3600 train + 400 validation"), "%s",
              out);
    cr_expect(strstr(out, "V=50257"), "the model did not take GPT-2's vocabulary:\n%s", out);
    free(out);
}

Test(cli, minigpt_takes_a_glob_of_shards, .timeout = 120)
{
    char a[64], b[64], pattern[64];
    snprintf(a, sizeof a, "/tmp/dtrain-test-cli-%d-train_000000.bin", (int)getpid());
    snprintf(b, sizeof b, "/tmp/dtrain-test-cli-%d-train_000001.bin", (int)getpid());
    snprintf(pattern, sizeof pattern, "/tmp/dtrain-test-cli-%d-train_*.bin", (int)getpid());
    write_token_shard(a, 1000, 13);
    write_token_shard(b, 1000, 17);
    int code;
    char *out = run((const char *[]){MINIGPT_BIN, "--data", pattern, "-V", "20000", TINY_MODEL,
                                     NULL},
                    &code);
    unlink(a);
    unlink(b);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "1800 train + 200 validation") && strstr(out, "V=20000"), "%s", out);
    free(out);
}
