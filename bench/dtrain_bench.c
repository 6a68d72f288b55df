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
 * described by the environment (dt_comm_options_from_env). When a forked
 * rank dies, the others are given a moment to report their own failure,
 * then stopped; the bench exits with the dead rank's status (128 + signal
 * if it was killed) and removes the rendezvous file.
 *
 * --device NAME (fake, cuda, cuda:N) gives every rank that device and times
 * each size twice in the same run: on host buffers, then on device buffers
 * holding the same data, staged through pinned memory (collectives/staging/staging.c).
 * The two alternate for DEVICE_ROUNDS rounds; the rows show each one's
 * median, the last column says which buffers, and a comment line gives the
 * device's busbw as a share of the host's. With --check the device's output
 * is copied back and checked like the host's.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "bench_case.h"
#include "bench_device.h"
#include "bench_options.h"
#include "dt_clock.h"
#include "dt_comm.h"
#include "dt_flags.h"

#define DEVICE_ROUNDS 5

/* ---- one row ------------------------------------------------------------------- */

/* Seconds per op: -w warm-up ops, a barrier, -n timed ops back to back; the
 * slowest rank's figure. */
static dt_status time_case(dt_comm *c, bench_case *bc, const bench_options *o, double *sec)
{
    dt_status st = DT_OK;
    for (int i = 0; i < o->warmup && st == DT_OK; i++)
        st = dt_run(c, &bc->op);
    if (st == DT_OK)
        st = dt_barrier(c);
    double t0 = dt_now();
    for (int i = 0; i < o->iters && st == DT_OK; i++)
        st = dt_run(c, &bc->op);
    *sec = (dt_now() - t0) / o->iters;
    if (st == DT_OK)
        st = dt_allreduce(c, sec, 1, DT_F64, DT_MAX);
    return st;
}

/* Wrong output elements of one op on fresh inputs, summed over the ranks. */
static dt_status check_case(dt_comm *c, bench_case *bc, int64_t *wrong)
{
    bench_case_fill(bc);
    dt_status st = dt_run(c, &bc->op);
    *wrong = st == DT_OK ? (int64_t)bench_case_count_wrong(bc) : 0;
    if (st == DT_OK)
        st = dt_allreduce(c, wrong, 1, DT_I64, DT_SUM);
    return st;
}

static void print_header(const bench_options *o, dt_op_kind kind, int p)
{
    bool reduces = kind == DT_OP_ALLREDUCE || kind == DT_OP_REDUCE_SCATTER || kind == DT_OP_REDUCE;
    printf("# dtrain-bench %s: %d ranks, %s%s%s, algo %s, %d iters after %d warm-up%s\n",
           dt_op_name(kind), p, kind == DT_OP_BARRIER ? "no data" : dt_dtype_name(o->dtype),
           reduces ? " " : "", reduces ? dt_redop_name(o->redop) : "", bench_algo_name(o->algo),
           o->iters, o->warmup, o->check ? ", checked" : "");
    printf("# %10s %12s %6s %6s %12s %11s %11s %6s\n", "size", "count", "type", "op", "time_us",
           "algbw_GBps", "busbw_GBps", "wrong");
    fflush(stdout); /* seen now, and not lost if this rank is killed before its first row */
}

static void print_row(const bench_case *bc, double sec, bool checked, int64_t wrong,
                      const char *buffers)
{
    const dt_op *op = &bc->op;
    bool reduces = op->kind == DT_OP_ALLREDUCE || op->kind == DT_OP_REDUCE_SCATTER ||
                   op->kind == DT_OP_REDUCE;
    double algbw = sec > 0 ? (double)bc->bytes / sec / 1e9 : 0;
    char wrong_text[24] = "N/A";
    if (checked)
        snprintf(wrong_text, sizeof wrong_text, "%lld", (long long)wrong);
    printf("%12zu %12zu %6s %6s %12.1f %11.3f %11.3f %6s%s%s\n", bc->bytes, op->count,
           op->kind == DT_OP_BARRIER ? "none" : dt_dtype_name(op->dtype),
           reduces ? dt_redop_name(op->redop) : "none", sec * 1e6, algbw,
           algbw * bench_busbw_factor(op->kind, bc->p), wrong_text, buffers ? " " : "",
           buffers ? buffers : "");
    fflush(stdout);
}

/* ---- host buffers beside device buffers ------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The op on device buffers, checked: run on fresh inputs, copy back, count. */
static dt_status check_device_case(dt_comm *c, bench_case *bc, bench_device_case *dc,
                                   int64_t *wrong)
{
    bench_case_fill(bc);
    dt_status st = bench_device_case_upload(dc, bc);
    if (st == DT_OK)
        st = dt_run(c, &dc->op);
    if (st == DT_OK)
        st = bench_device_case_download(dc, bc);
    *wrong = st == DT_OK ? (int64_t)bench_case_count_wrong(bc) : 0;
    if (st == DT_OK)
        st = dt_allreduce(c, wrong, 1, DT_I64, DT_SUM);
    return st;
}

/* Host and device rows of one size: DEVICE_ROUNDS alternating rounds,
 * medians. */
static dt_status run_pair(dt_comm *c, dt_device *dev, bench_case *bc, const bench_options *o)
{
    bench_device_case dc;
    dt_status st = bench_device_case_init(&dc, dev, bc);
    if (st != DT_OK) {
        fprintf(stderr, "dtrain-bench: rank %d: device buffers: %s\n", dt_comm_rank(c),
                dt_device_error(dev));
        return st;
    }
    bench_case on_dev = *bc;
    on_dev.op = dc.op;
    double host[DEVICE_ROUNDS], devs[DEVICE_ROUNDS];
    for (int r = 0; r < DEVICE_ROUNDS && st == DT_OK; r++) {
        st = time_case(c, bc, o, &host[r]);
        if (st == DT_OK)
            st = time_case(c, &on_dev, o, &devs[r]);
    }
    int64_t wrong_host = 0, wrong_dev = 0;
    if (st == DT_OK && o->check)
        st = check_case(c, bc, &wrong_host);
    if (st == DT_OK && o->check)
        st = check_device_case(c, bc, &dc, &wrong_dev);
    bench_device_case_free(&dc);
    if (st != DT_OK || dt_comm_rank(c) != 0)
        return st;
    qsort(host, DEVICE_ROUNDS, sizeof *host, cmp_double);
    qsort(devs, DEVICE_ROUNDS, sizeof *devs, cmp_double);
    double h = host[DEVICE_ROUNDS / 2], d = devs[DEVICE_ROUNDS / 2];
    print_row(bc, h, o->check, wrong_host, "host");
    print_row(bc, d, o->check, wrong_dev, o->device);
    printf("#   %s buffers: %.1f%% of the host buffers' busbw (median of %d rounds)\n", o->device,
           d > 0 ? 100.0 * h / d : 0, DEVICE_ROUNDS);
    fflush(stdout); /* forked ranks leave through _exit */
    return (wrong_host || wrong_dev) ? DT_EPROTO : DT_OK;
}

/* ---- one collective, every size -------------------------------------------------- */

/* One row per size; returns 0, 1 (wrong elements) or -1 (an op failed). */
static int run_collective(dt_comm *c, dt_device *dev, const bench_options *o, dt_op_kind kind)
{
    int rank = dt_comm_rank(c), p = dt_comm_size(c), result = 0;
    if (rank == 0)
        print_header(o, kind, p);
    size_t last_bytes = SIZE_MAX;
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes;) {
        bench_case bc;
        if (bench_case_init(&bc, kind, bytes, o->dtype, o->redop, o->root, o->algo, rank, p) !=
            DT_OK) {
            fprintf(stderr, "dtrain-bench: rank %d: out of memory for %zu B\n", rank, bytes);
            return -1;
        }
        double sec = 0;
        int64_t wrong = 0;
        dt_status st = DT_OK;
        if (bc.bytes != last_bytes && dev) {
            st = run_pair(c, dev, &bc, o);
            if (st == DT_EPROTO) { /* wrong elements, already printed */
                st = DT_OK;
                wrong = 1;
            }
        } else if (bc.bytes != last_bytes) { /* sizes that round alike run once */
            st = time_case(c, &bc, o, &sec);
            if (st == DT_OK && o->check)
                st = check_case(c, &bc, &wrong);
            if (st == DT_OK && rank == 0)
                print_row(&bc, sec, o->check, wrong, NULL);
        }
        last_bytes = bc.bytes;
        bench_case_free(&bc);
        if (st != DT_OK) {
            fprintf(stderr, "dtrain-bench: rank %d: %s of %zu B failed: %s\n", rank,
                    dt_op_name(kind), bytes, dt_comm_error(c));
            return -1;
        }
        if (wrong)
            result = 1;
        if (kind == DT_OP_BARRIER || bytes > o->max_bytes / o->factor)
            break;
        bytes = bytes ? bytes * o->factor : 1;
    }
    return result;
}

/* Joins the job, runs every requested collective, leaves. Exit status. */
static int run_rank(const dt_comm_options *opts, const bench_options *o)
{
    if (o->root >= opts->world_size) {
        fprintf(stderr, "dtrain-bench: -r '%d': no such rank in a job of %d\n", o->root,
                opts->world_size);
        return 2;
    }
    dt_comm_options co = *opts;
    if (o->wire)
        co.wire = strcmp(o->wire, "gloo") == 0 ? DT_WIRE_GLOO : DT_WIRE_DTRAIN;
    dt_device *dev = NULL;
    char err[512];
    if (o->device && dt_device_open(&dev, o->device, err, sizeof err) != DT_OK) {
        fprintf(stderr, "dtrain-bench: rank %d: --device %s: %s\n", co.rank, o->device, err);
        dt_device_close(dev);
        return 1;
    }
    co.device = dev;
    dt_comm *c;
    if (dt_comm_init(&c, &co) != DT_OK) {
        fprintf(stderr, "dtrain-bench: rank %d: joining the job failed: %s\n", co.rank,
                c ? dt_comm_error(c) : "out of memory");
        dt_comm_destroy(c);
        dt_device_close(dev);
        return 1;
    }
    int status = 0;
    for (int i = 0; i < o->n_collectives; i++) {
        int r = run_collective(c, dev, o, o->collectives[i]);
        if (r < 0) {
            status = 1;
            break;
        }
        if (r > 0)
            status = 1;
    }
    dt_comm_destroy(c);
    dt_device_close(dev);
    return status;
}

/* ---- local ranks ------------------------------------------------------------------- */

/* When a rank dies its peers notice within milliseconds (their connections
 * to it close) and fail with their own message naming it; they are given
 * this long to do so before they are told to stop, and as long again
 * before they are killed. Bounded, so a rank stuck elsewhere cannot keep
 * the bench alive. */
#define SURVIVORS_GRACE_S 2.0

static int status_code(int status)
{
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void signal_ranks(const pid_t *pids, const bool *reaped, int n, int sig)
{
    for (int r = 0; r < n; r++)
        if (!reaped[r])
            kill(pids[r], sig);
}

static void report_failure(int rank, int status)
{
    if (WIFEXITED(status))
        fprintf(stderr,
                "dtrain-bench: rank %d exited with code %d; waiting up to %g s for the "
                "others to report\n",
                rank, WEXITSTATUS(status), SURVIVORS_GRACE_S);
    else
        fprintf(stderr,
                "dtrain-bench: rank %d was killed by signal %d (%s); waiting up to %g s "
                "for the others to report\n",
                rank, WTERMSIG(status), strsignal(WTERMSIG(status)), SURVIVORS_GRACE_S);
}

/* Waits for every child. After the first failure the others get
 * SURVIVORS_GRACE_S to fail and say why on their own, then SIGTERM, then
 * SIGKILL after as long again. Returns the first failure's status (its exit
 * code, or 128 + the signal that killed it), or 0; a rank killed from
 * outside counts as first even when a peer that saw it die was reaped
 * before it. */
static int wait_ranks(const pid_t *pids, int n)
{
    bool reaped[64] = {false};
    int result = 0, left = n, sent = 0;
    bool killed = false; /* a rank died of a signal the bench did not send */
    double failed_at = 0;
    while (left > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, result ? WNOHANG : 0);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid < 0)
            break;
        if (pid == 0) { /* a rank failed; the others are still running */
            double waited = dt_now() - failed_at;
            int due = waited > 2 * SURVIVORS_GRACE_S ? SIGKILL
                      : waited > SURVIVORS_GRACE_S   ? SIGTERM
                                                     : 0;
            if (due && due != sent) {
                signal_ranks(pids, reaped, n, sent = due);
                signal_ranks(pids, reaped, n, SIGCONT); /* a stopped rank acts on TERM */
            }
            nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
            continue;
        }
        int rank = 0;
        while (rank < n && pids[rank] != pid)
            rank++;
        if (rank == n)
            continue; /* not one of ours */
        reaped[rank] = true;
        left--;
        if (status_code(status) == 0)
            continue;
        if (result == 0) {
            result = status_code(status);
            failed_at = dt_now();
            report_failure(rank, status);
        } else if (WIFSIGNALED(status) && !killed && !sent) {
            /* Killed from outside, but reaped after a peer that noticed its
             * death first (a process closes its sockets before its parent
             * can reap it): the kill is the root cause, not the peer. */
            result = status_code(status);
            report_failure(rank, status);
        }
        if (WIFSIGNALED(status) && !sent)
            killed = true;
    }
    return result;
}

/* The ranks remove the file when they all leave cleanly; one that died
 * leaves it behind. Its name was ours alone (pid and random), and every
 * rank is reaped by now, so nobody else can be using it. */
static void remove_rendezvous_file(const char *url)
{
    const char *path = url + strlen("file://");
    if (unlink(path) != 0 && errno != ENOENT)
        fprintf(stderr, "dtrain-bench: could not remove the rendezvous file %s: %s\n", path,
                strerror(errno));
}

static int run_local_ranks(const bench_options *o)
{
    if (o->root >= o->ranks) {
        fprintf(stderr, "dtrain-bench: -r '%d': no such rank among --ranks %d\n", o->root,
                o->ranks);
        return 2;
    }
    if (sodium_init() < 0)
        return 1;
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
            for (int k = 0; k < r; k++)
                kill(pids[k], SIGTERM);
            wait_ranks(pids, r);
            remove_rendezvous_file(url);
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
            int status = run_rank(&co, o);
            fflush(NULL); /* _exit skips stdio; the parent's atexit work is not ours */
            _exit(status);
        }
    }
    int status = wait_ranks(pids, o->ranks);
    remove_rendezvous_file(url);
    return status;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN); /* EPIPE instead: a dead peer is an error, not a kill */
    bench_options o;
    bench_options_default(&o);
    char err[256];
    switch (bench_options_parse(&o, argc, argv, err, sizeof err)) {
    case BENCH_PARSE_HELP: bench_options_usage(stdout, "dtrain-bench"); return 0;
    case BENCH_PARSE_ERROR: return dt_flag_error("dtrain-bench", "%s", err);
    default: break;
    }
    if (o.ranks > 0)
        return run_local_ranks(&o);

    dt_comm_options co;
    dt_comm_options_default(&co);
    uint8_t scratch[64];
    if (dt_comm_options_from_env(&co, scratch, sizeof scratch, err, sizeof err) != DT_OK) {
        fprintf(stderr, "dtrain-bench: %s (or use --ranks N to start N local ranks)\n", err);
        return 2;
    }
    return run_rank(&co, &o);
}
