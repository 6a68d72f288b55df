/*
 * launch_worker.c — a worker program for test_launcher: each mode is one
 * behaviour of a rank that the launcher must handle.
 *
 *   launch_worker env                    print the launcher's contract names
 *   launch_worker lines COUNT            COUNT long lines, each written in two
 *                                        pieces, then a last line with no newline
 *   launch_worker streams                one line to stdout, one to stderr
 *   launch_worker sleep DIR              write DIR/pid_<RANK>, sleep until killed
 *   launch_worker sleep-ignore-term DIR  the same, ignoring SIGTERM
 *   launch_worker fail DIR RANK CODE     every rank writes its pid file; RANK waits
 *                                        until all have, prints, exits CODE; the
 *                                        others sleep until killed
 *   launch_worker fail-until K CODE      exit CODE while DT_RESTART_COUNT < K, else 0
 *   launch_worker allreduce              join the job from the environment
 *                                        (dt_comm_options_from_env), all-reduce
 *                                        rank+1 and print the sum
 *   launch_worker allreduce-loop DIR [H] join, write DIR/pid_<RANK>, all-reduce
 *                                        until an op fails (DT_TIMEOUT bounds
 *                                        each); print the error, exit 94. Rank H
 *                                        hangs instead, ignoring SIGTERM
 *   launch_worker join-sleep DIR         join the job, print its DT_INIT_URL, write
 *                                        the pid file, sleep until killed
 *   launch_worker abort-one DIR K CODE [MS]
 *                                        join, write the pid file; rank K prints an
 *                                        error, aborts the communicator with it,
 *                                        lingers MS ms (500) and exits CODE; the
 *                                        others' next all-reduce fails: print, exit 94
 *   launch_worker peer-died DIR K        every rank writes its pid file; rank K
 *                                        prints an error, lingers 0.5 s, exits 3;
 *                                        the others print what a rank prints when
 *                                        K's connection drops, and exit 1
 *   launch_worker long-error LEN CODE    one error line of about LEN bytes that
 *                                        names a rank at its start and another
 *                                        at its end, then exit CODE
 *
 * Pid files let the test signal a particular rank and later check that every
 * rank is gone. They are written to a temporary name and renamed, so the
 * test never reads half a number.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dt_comm.h"

static int env_int(const char *name)
{
    const char *v = getenv(name);
    return v ? atoi(v) : -1;
}

static void write_pid_file(const char *dir)
{
    char tmp[4096], path[4096];
    snprintf(tmp, sizeof tmp, "%s/.pid_%d", dir, env_int("RANK"));
    snprintf(path, sizeof path, "%s/pid_%d", dir, env_int("RANK"));
    FILE *f = fopen(tmp, "w");
    if (!f) {
        perror(tmp);
        exit(90);
    }
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    if (rename(tmp, path) != 0) {
        perror(path);
        exit(90);
    }
}

static _Noreturn void sleep_forever(void)
{
    for (;;)
        pause();
}

static void wait_for_pid_files(const char *dir, int n)
{
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/pid_%d", dir, i);
        while (access(path, F_OK) != 0)
            nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
}

static int mode_env(void)
{
    static const char *names[] = {"RANK",
                                  "LOCAL_RANK",
                                  "WORLD_SIZE",
                                  "LOCAL_WORLD_SIZE",
                                  "GROUP_RANK",
                                  "GROUP_WORLD_SIZE",
                                  "ROLE_RANK",
                                  "TORCHELASTIC_RESTART_COUNT",
                                  "DT_RESTART_COUNT",
                                  "TORCHELASTIC_RUN_ID",
                                  "DT_JOB_ID",
                                  "DT_INIT_URL",
                                  "DT_SECRET"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        printf("%s=%s\n", names[i], v ? v : "(unset)");
    }
    return 0;
}

/* Writes each line in two write() calls so the launcher sees partial lines. */
static int mode_lines(int count)
{
    int rank = env_int("RANK");
    for (int i = 0; i < count; i++) {
        char line[256];
        int n = snprintf(line, sizeof line, "rank=%d line=%d %s\n", rank, i,
                         "abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz");
        if (write(1, line, (size_t)n / 2) < 0 || write(1, line + n / 2, (size_t)(n - n / 2)) < 0)
            return 91;
    }
    char tail[64];
    int n = snprintf(tail, sizeof tail, "no-newline rank=%d", rank);
    return write(1, tail, (size_t)n) < 0 ? 91 : 0;
}

/* Joins the job described by the environment; NULL (after printing why)
 * on failure. An op timeout from DT_TIMEOUT wins over the 20 s default. */
static dt_comm *join_from_env(void)
{
    uint8_t scratch[64];
    dt_comm_options o;
    char err[256];
    if (dt_comm_options_from_env(&o, scratch, sizeof scratch, err, sizeof err) != DT_OK) {
        fprintf(stderr, "options: %s\n", err);
        return NULL;
    }
    if (o.init_timeout_s == 0) /* 0: the environment named none */
        o.init_timeout_s = 20;
    if (o.timeout_s == 0)
        o.timeout_s = 20;
    dt_comm *c;
    if (dt_comm_init(&c, &o) != DT_OK) {
        fprintf(stderr, "init: %s\n", c ? dt_comm_error(c) : "out of memory");
        dt_comm_destroy(c);
        return NULL;
    }
    return c;
}

static int mode_allreduce(void)
{
    dt_comm *c = join_from_env();
    if (!c)
        return 93;
    int rank = dt_comm_rank(c), world = dt_comm_size(c);
    float v = (float)(rank + 1);
    dt_status st = dt_allreduce(c, &v, 1, DT_F32, DT_SUM);
    if (st == DT_OK)
        printf("rank=%d world=%d sum=%g\n", rank, world, v);
    else
        fprintf(stderr, "allreduce: %s\n", dt_comm_error(c));
    dt_comm_destroy(c);
    return st == DT_OK ? 0 : 94;
}

/* All-reduces until an op fails, as a training loop would; the test stops
 * one rank (SIGSTOP) once every pid file is there, or rank `hung` hangs on
 * its own (ignoring SIGTERM unless `term`), so the others time out. */
static int mode_allreduce_loop(const char *dir, int hung, bool term)
{
    dt_comm *c = join_from_env();
    if (!c)
        return 93;
    if (dt_comm_rank(c) == hung && !term)
        signal(SIGTERM, SIG_IGN);
    write_pid_file(dir);
    if (dt_comm_rank(c) == hung)
        sleep_forever();
    float v = 1;
    dt_status st;
    for (unsigned long i = 0;; i++) {
        if ((st = dt_allreduce(c, &v, 1, DT_F32, DT_MAX)) != DT_OK) {
            fprintf(stderr, "allreduce %lu: %s\n", i, dt_comm_error(c));
            break;
        }
    }
    dt_comm_destroy(c);
    return 94;
}

/* A rank that holds the rendezvous file open until it is killed. */
static int mode_join_sleep(const char *dir)
{
    dt_comm *c = join_from_env();
    if (!c)
        return 93;
    printf("init_url=%s\n", getenv("DT_INIT_URL"));
    write_pid_file(dir);
    sleep_forever();
}

/* Rank `culprit` fails on its own and tells its peers through the abort;
 * it lingers so that a peer, failing because of it, exits first. */
static int mode_abort_one(const char *dir, int culprit, int code, long linger_ms)
{
    dt_comm *c = join_from_env();
    if (!c)
        return 93;
    write_pid_file(dir);
    if (dt_comm_rank(c) == culprit) {
        char why[128];
        snprintf(why, sizeof why, "rank %d: cannot open /nonexistent/data.bin", culprit);
        fprintf(stderr, "%s\n", why);
        dt_comm_abort(c, why);
        nanosleep(&(struct timespec){linger_ms / 1000, linger_ms % 1000 * 1000000}, NULL);
        dt_comm_destroy(c);
        return code;
    }
    float v = 1;
    dt_status st = dt_allreduce(c, &v, 1, DT_F32, DT_SUM);
    if (st != DT_OK)
        fprintf(stderr, "allreduce: %s\n", dt_comm_error(c));
    dt_comm_destroy(c);
    return st == DT_OK ? 0 : 94;
}

/* The words of collectives/transport/transport_read.c when a peer's connection drops
 * without an ABORT (a rank killed mid-handshake, say); the culprit lingers
 * so that the others exit first. */
static int mode_peer_died(const char *dir, int culprit)
{
    int rank = env_int("RANK");
    char said[4096];
    snprintf(said, sizeof said, "%s/said", dir);
    write_pid_file(dir);
    if (rank == culprit) {
        fprintf(stderr, "rank %d: out of memory for the activations\n", rank);
        FILE *f = fopen(said, "w"); /* the others fail once it has spoken */
        if (!f)
            return 90;
        fclose(f);
        nanosleep(&(struct timespec){0, 500 * 1000 * 1000}, NULL);
        return 3;
    }
    while (access(said, F_OK) != 0)
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    fprintf(stderr,
            "rank %d: connection to rank %d (127.0.0.1:9) lost: end of file; rank %d "
            "died or its process was killed\n",
            rank, culprit, culprit);
    return 1;
}

/* One line of about `len` bytes naming this rank first and rank 3 last, the
 * way an error names the rank that reports it and the peer it blames. */
static int mode_long_error(int len, int code)
{
    char *line = malloc((size_t)len + 64);
    if (!line)
        return 95;
    int n = sprintf(line, "error on rank %d: ", env_int("RANK"));
    for (; n < len; n++)
        line[n] = n % 10 ? '.' : '|';
    sprintf(line + n, " blamed peer rank 3");
    fprintf(stderr, "%s\n", line);
    free(line);
    return code;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "env"))
        return mode_env();
    if (!strcmp(mode, "lines") && argc > 2)
        return mode_lines(atoi(argv[2]));
    if (!strcmp(mode, "streams")) {
        printf("to-stdout rank=%d\n", env_int("RANK"));
        fprintf(stderr, "to-stderr rank=%d\n", env_int("RANK"));
        return 0;
    }
    if ((!strcmp(mode, "sleep") || !strcmp(mode, "sleep-ignore-term")) && argc > 2) {
        if (!strcmp(mode, "sleep-ignore-term"))
            signal(SIGTERM, SIG_IGN);
        write_pid_file(argv[2]);
        sleep_forever();
    }
    if (!strcmp(mode, "fail") && argc > 4) {
        write_pid_file(argv[2]);
        if (env_int("RANK") != atoi(argv[3]))
            sleep_forever();
        wait_for_pid_files(argv[2], env_int("WORLD_SIZE"));
        printf("rank %d is about to fail with code %d\n", env_int("RANK"), atoi(argv[4]));
        return atoi(argv[4]);
    }
    if (!strcmp(mode, "fail-until") && argc > 3) {
        int restart = env_int("DT_RESTART_COUNT");
        printf("attempt %d job %s\n", restart, getenv("DT_JOB_ID"));
        return restart < atoi(argv[2]) ? atoi(argv[3]) : 0;
    }
    if (!strcmp(mode, "allreduce"))
        return mode_allreduce();
    if (!strcmp(mode, "allreduce-loop") && argc > 2)
        return mode_allreduce_loop(argv[2], argc > 3 ? atoi(argv[3]) : -1,
                                   argc > 4 && !strcmp(argv[4], "term"));
    if (!strcmp(mode, "join-sleep") && argc > 2)
        return mode_join_sleep(argv[2]);
    if (!strcmp(mode, "abort-one") && argc > 4)
        return mode_abort_one(argv[2], atoi(argv[3]), atoi(argv[4]),
                              argc > 5 ? atol(argv[5]) : 500);
    if (!strcmp(mode, "peer-died") && argc > 3)
        return mode_peer_died(argv[2], atoi(argv[3]));
    if (!strcmp(mode, "long-error") && argc > 3)
        return mode_long_error(atoi(argv[2]), atoi(argv[3]));
    fprintf(stderr, "launch_worker: unknown mode '%s'\n", mode);
    return 99;
}
