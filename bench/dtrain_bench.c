/*
 * dtrain_bench.c — dtrain-bench: how fast are dtrain's collectives, in the
 * manner of nccl-tests.
 *
 *   dtrain-bench --ranks 4 -c allreduce -b 4 -e 64M -f 4 [--check]
 *   dtrain-launch -n 4 dtrain-bench -c all          (one rank per process)
 *
 * For each size from -b to -e (times -f each row) every rank runs -w
 * untimed ops, meets the others at a barrier, then runs -n ops back to back
 * and divides the elapsed time by -n (nccl-tests' method: it measures
 * throughput of a stream of ops, the way a training loop issues them). The
 * row shows the slowest rank's time (an all-reduce max over the ranks), so
 * one lagging rank cannot hide behind fast ones:
 *
 *   size count type op time_us algbw_GBps busbw_GBps wrong
 *
 * algbw = size / time; busbw = algbw × nccl-tests' factor for the
 * collective (bench_busbw_factor), comparable with a link's bandwidth.
 * `size` is the whole array; `count` is what the API takes (per rank for
 * reduce_scatter, allgather and alltoall). With --check each size runs one
 * more op on fresh deterministic inputs and counts the wrong elements of
 * every rank's output (summed over ranks); any wrong element makes the exit
 * status 1. A failed op prints the communicator's error and exits 1.
 *
 * --ranks N forks N ranks that meet through a fresh file:///tmp rendezvous
 * with a random job secret; without it the process is one rank of a job
 * described by the environment (dt_comm_options_from_env).
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "bench_case.h"
#include "bench_options.h"
#include "dt_clock.h"
#include "dt_comm.h"

/* ---- one row ------------------------------------------------------------------- */

/* Seconds per op: -w warm-up ops, a barrier, -n timed ops back to back; the
 * slowest rank's figure. */
static dt_status time_case(dt_comm *c, bench_case *bc, const bench_options *o, double *sec)
{
    dt_status st = DT_OK;
    for (int i = 0; i < o->warmup && st == DT_OK; i++) st = dt_run(c, &bc->op);
    if (st == DT_OK) st = dt_barrier(c);
    double t0 = dt_now();
    for (int i = 0; i < o->iters && st == DT_OK; i++) st = dt_run(c, &bc->op);
    *sec = (dt_now() - t0) / o->iters;
    if (st == DT_OK) st = dt_allreduce(c, sec, 1, DT_F64, DT_MAX);
    return st;
}

/* Wrong output elements of one op on fresh inputs, summed over the ranks. */
static dt_status check_case(dt_comm *c, bench_case *bc, int64_t *wrong)
{
    bench_case_fill(bc);
    dt_status st = dt_run(c, &bc->op);
    *wrong = st == DT_OK ? (int64_t)bench_case_count_wrong(bc) : 0;
    if (st == DT_OK) st = dt_allreduce(c, wrong, 1, DT_I64, DT_SUM);
    return st;
}

static void print_header(const bench_options *o, dt_op_kind kind, int p)
{
    bool reduces = kind == DT_OP_ALLREDUCE || kind == DT_OP_REDUCE_SCATTER;
    printf("# dtrain-bench %s: %d ranks, %s%s%s, algo %s, %d iters after %d warm-up%s\n",
           dt_op_name(kind), p, kind == DT_OP_BARRIER ? "no data" : dt_dtype_name(o->dtype),
           reduces ? " " : "", reduces ? dt_redop_name(o->redop) : "",
           bench_algo_name(o->algo), o->iters, o->warmup, o->check ? ", checked" : "");
    printf("# %10s %12s %6s %6s %12s %11s %11s %6s\n", "size", "count", "type", "op",
           "time_us", "algbw_GBps", "busbw_GBps", "wrong");
}

static void print_row(const bench_case *bc, double sec, bool checked, int64_t wrong)
{
    const dt_op *op = &bc->op;
    bool reduces = op->kind == DT_OP_ALLREDUCE || op->kind == DT_OP_REDUCE_SCATTER;
    double algbw = sec > 0 ? (double)bc->bytes / sec / 1e9 : 0;
    char wrong_text[24] = "N/A";
    if (checked) snprintf(wrong_text, sizeof wrong_text, "%lld", (long long)wrong);
    printf("%12zu %12zu %6s %6s %12.1f %11.3f %11.3f %6s\n", bc->bytes, op->count,
           op->kind == DT_OP_BARRIER ? "none" : dt_dtype_name(op->dtype),
           reduces ? dt_redop_name(op->redop) : "none", sec * 1e6, algbw,
           algbw * bench_busbw_factor(op->kind, bc->p), wrong_text);
    fflush(stdout);
}

/* ---- one collective, every size -------------------------------------------------- */

/* One row per size; returns 0, 1 (wrong elements) or -1 (an op failed). */
static int run_collective(dt_comm *c, const bench_options *o, dt_op_kind kind)
{
    int rank = dt_comm_rank(c), p = dt_comm_size(c), result = 0;
    if (rank == 0) print_header(o, kind, p);
    size_t last_bytes = SIZE_MAX;
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes;) {
        bench_case bc;
        if (bench_case_init(&bc, kind, bytes, o->dtype, o->redop, o->root, o->algo, rank,
                            p) != DT_OK) {
            fprintf(stderr, "dtrain-bench: rank %d: out of memory for %zu B\n", rank, bytes);
            return -1;
        }
        double sec = 0;
        int64_t wrong = 0;
        dt_status st = DT_OK;
        if (bc.bytes != last_bytes) { /* sizes that round alike run once */
            st = time_case(c, &bc, o, &sec);
            if (st == DT_OK && o->check) st = check_case(c, &bc, &wrong);
            if (st == DT_OK && rank == 0) print_row(&bc, sec, o->check, wrong);
        }
        last_bytes = bc.bytes;
        bench_case_free(&bc);
        if (st != DT_OK) {
            fprintf(stderr, "dtrain-bench: rank %d: %s of %zu B failed: %s\n", rank,
                    dt_op_name(kind), bytes, dt_comm_error(c));
            return -1;
        }
        if (wrong) result = 1;
        if (kind == DT_OP_BARRIER || bytes > o->max_bytes / o->factor) break;
        bytes = bytes ? bytes * o->factor : 1;
    }
    return result;
}

/* Joins the job, runs every requested collective, leaves. Exit status. */
static int run_rank(const dt_comm_options *co, const bench_options *o)
{
    if (o->root >= co->world_size) {
        fprintf(stderr, "dtrain-bench: -r '%d': no such rank in a job of %d\n", o->root,
                co->world_size);
        return 2;
    }
    dt_comm *c;
    if (dt_comm_init(&c, co) != DT_OK) {
        fprintf(stderr, "dtrain-bench: rank %d: joining the job failed: %s\n", co->rank,
                c ? dt_comm_error(c) : "out of memory");
        dt_comm_destroy(c);
        return 1;
    }
    int status = 0;
    for (int i = 0; i < o->n_collectives; i++) {
        int r = run_collective(c, o, o->collectives[i]);
        if (r < 0) {
            status = 1;
            break;
        }
        if (r > 0) status = 1;
    }
    dt_comm_destroy(c);
    return status;
}

/* ---- local ranks ------------------------------------------------------------------- */

/* Waits for every child; when one fails the others are stopped, since they
 * would only wait for it until their timeout. Returns the first failure's
 * exit status, or 0. */
static int wait_ranks(const pid_t *pids, int n)
{
    int result = 0, left = n;
    while (left > 0) {
        int status;
        pid_t pid = wait(&status);
        if (pid < 0) break;
        left--;
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        if (code != 0 && result == 0) {
            result = code;
            for (int r = 0; r < n; r++)
                if (pids[r] != pid) kill(pids[r], SIGTERM);
        }
    }
    return result;
}

static int run_local_ranks(const bench_options *o)
{
    if (o->root >= o->ranks) {
        fprintf(stderr, "dtrain-bench: -r '%d': no such rank among --ranks %d\n", o->root,
                o->ranks);
        return 2;
    }
    if (sodium_init() < 0) return 1;
    uint8_t secret[32];
    randombytes_buf(secret, sizeof secret);
    char url[128];
    snprintf(url, sizeof url, "file:///tmp/dtrain-bench-%d-%08x", (int)getpid(),
             randombytes_random());
    fflush(stdout);
    pid_t pids[64];
    for (int r = 0; r < o->ranks; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            perror("dtrain-bench: fork");
            for (int k = 0; k < r; k++) kill(pids[k], SIGTERM);
            wait_ranks(pids, r);
            return 1;
        }
        if (pids[r] == 0) {
            dt_comm_options co;
            dt_comm_options_default(&co);
            co.rank = r;
            co.world_size = o->ranks;
            co.init_url = url;
            co.job_id = "bench";
            co.secret = secret;
            co.secret_len = sizeof secret;
            _exit(run_rank(&co, o));
        }
    }
    return wait_ranks(pids, o->ranks);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN); /* EPIPE instead: a dead peer is an error, not a kill */
    bench_options o;
    bench_options_default(&o);
    char err[256];
    switch (bench_options_parse(&o, argc, argv, err, sizeof err)) {
    case BENCH_PARSE_HELP:
        bench_options_usage(stdout, "dtrain-bench");
        return 0;
    case BENCH_PARSE_ERROR:
        fprintf(stderr, "dtrain-bench: %s\n(dtrain-bench --help lists the flags)\n", err);
        return 2;
    default:
        break;
    }
    if (o.ranks > 0) return run_local_ranks(&o);

    dt_comm_options co;
    dt_comm_options_default(&co);
    uint8_t scratch[64];
    if (dt_comm_options_from_env(&co, scratch, sizeof scratch, err, sizeof err) != DT_OK) {
        fprintf(stderr, "dtrain-bench: %s (or use --ranks N to start N local ranks)\n", err);
        return 2;
    }
    return run_rank(&co, &o);
}
