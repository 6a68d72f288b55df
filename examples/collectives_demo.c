/*
 * collectives_demo.c — dtrain-demo: a tour of the collectives on N local
 * ranks, printing what each rank did and checking every result.
 *
 *   dtrain-demo [-n RANKS]
 *
 * The parent makes a fresh rendezvous file and job secret, forks RANKS
 * processes, and waits for them. Each rank joins the job over loopback TCP
 * and runs every collective once: all-reduce, broadcast, all-gather,
 * reduce-scatter, the rooted reduce, gather and scatter, all-to-all,
 * all-gather-v (a different count from each rank), a ring of tagged
 * send/recv, a barrier, and one timed 16 MiB all-reduce. A wrong result or
 * a failed op makes the demo exit non-zero.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "dt_clock.h"
#include "dt_comm.h"
#include "dt_flags.h"

static int check(int rank, const char *what, dt_status st, dt_comm *c, int ok)
{
    if (st != DT_OK) {
        printf("[%d] %-15s FAILED: %s\n", rank, what, dt_comm_error(c));
        return 1;
    }
    if (!ok) {
        printf("[%d] %-15s WRONG RESULT\n", rank, what);
        return 1;
    }
    return 0;
}

/* The rooted ops: reduce to the last rank, gather to rank 0, scatter from
 * rank 0. Only the root's result buffer means anything. */
static int tour_rooted(dt_comm *c)
{
    int r = dt_comm_rank(c), n = dt_comm_size(c), bad = 0, ok = 1;
    int32_t sum = r + 1;
    dt_status st = dt_reduce(c, &sum, 1, DT_I32, DT_SUM, n - 1);
    if (r == n - 1)
        printf("[%d] reduce         sum of rank+1 at root %d = %d\n", r, n - 1, (int)sum);
    bad += check(r, "reduce", st, c, r != n - 1 || sum == n * (n + 1) / 2);

    int32_t mine = 10 * r, gathered[64] = {0};
    st = dt_gather(c, &mine, gathered, 1, DT_I32, 0);
    if (r == 0) {
        printf("[%d] gather         10*rank of everyone at root 0:", r);
        for (int i = 0; i < n; i++) {
            printf(" %d", (int)gathered[i]);
            ok &= gathered[i] == 10 * i;
        }
        printf("\n");
    }
    bad += check(r, "gather", st, c, ok);

    int32_t deal[64], card = -1;
    for (int i = 0; i < n; i++)
        deal[i] = 1000 + i;
    st = dt_scatter(c, r == 0 ? deal : NULL, &card, 1, DT_I32, 0);
    printf("[%d] scatter        my card from root 0 = %d\n", r, (int)card);
    bad += check(r, "scatter", st, c, card == 1000 + r);
    return bad;
}

/* All-to-all: rank r sends 100*r + j to rank j, so it receives 100*i + r
 * from each rank i. All-gather-v: rank i contributes i+1 copies of i. */
static int tour_exchange(dt_comm *c)
{
    int r = dt_comm_rank(c), n = dt_comm_size(c), bad = 0, ok = 1;
    int32_t out[64], in[64] = {0};
    for (int j = 0; j < n; j++)
        out[j] = 100 * r + j;
    dt_status st = dt_alltoall(c, out, in, 1, DT_I32);
    printf("[%d] alltoall       received:", r);
    for (int i = 0; i < n; i++) {
        printf(" %d", (int)in[i]);
        ok &= in[i] == 100 * i + r;
    }
    printf("\n");
    bad += check(r, "alltoall", st, c, ok);

    size_t counts[64], total = 0;
    for (int i = 0; i < n; i++)
        total += counts[i] = (size_t)i + 1;
    int32_t mine[64], *all = calloc(total, sizeof *all);
    for (int k = 0; k <= r; k++)
        mine[k] = r;
    st = all ? dt_allgatherv(c, mine, all, counts, DT_I32) : DT_ENOMEM;
    ok = all != NULL;
    for (size_t k = 0, i = 0; ok && i < (size_t)n; i++)
        for (size_t m = 0; m < counts[i]; m++)
            ok &= all[k++] == (int32_t)i;
    printf("[%d] allgatherv     %zu values, rank i gave i+1 copies of i: %s\n", r, total,
           ok ? "as expected" : "wrong");
    free(all);
    bad += check(r, "allgatherv", st, c, ok);
    return bad;
}

static int tour(dt_comm *c)
{
    int r = dt_comm_rank(c), n = dt_comm_size(c), bad = 0;
    float v[2] = {(float)(r + 1), 1.0f};
    dt_status st = dt_allreduce(c, v, 2, DT_F32, DT_SUM);
    printf("[%d] allreduce      sum of (rank+1, 1) = (%g, %g)\n", r, v[0], v[1]);
    bad += check(r, "allreduce", st, c, v[0] == n * (n + 1) / 2.0f && v[1] == (float)n);

    int64_t word = r == n - 1 ? 0x5eed : 0;
    st = dt_broadcast(c, &word, 1, DT_I64, n - 1);
    printf("[%d] broadcast      from rank %d: 0x%llx\n", r, n - 1, (long long)word);
    bad += check(r, "broadcast", st, c, word == 0x5eed);

    int32_t mine = r * r, all[64] = {0};
    st = dt_allgather(c, &mine, all, 1, DT_I32);
    printf("[%d] allgather      rank^2 of everyone:", r);
    int ok = 1;
    for (int i = 0; i < n; i++) {
        printf(" %d", all[i]);
        ok &= all[i] == i * i;
    }
    printf("\n");
    bad += check(r, "allgather", st, c, ok);

    double contrib[64], shard = 0;
    for (int i = 0; i < n; i++)
        contrib[i] = i + 0.5;
    st = dt_reduce_scatter(c, contrib, &shard, 1, DT_F64, DT_AVG);
    printf("[%d] reduce_scatter avg, my shard = %g\n", r, shard);
    bad += check(r, "reduce_scatter", st, c, shard == r + 0.5);
    bad += tour_rooted(c);
    bad += tour_exchange(c);

    if (n > 1) {
        int token = r * 100, got = -1, from = -1;
        dt_work *w;
        st = dt_send_async(c, &token, 1, DT_I32, (r + 1) % n, 7, &w);
        dt_status st2 = dt_recv(c, &got, 1, DT_I32, DT_ANY_SOURCE, 7, &from);
        if (st == DT_OK)
            st = dt_work_wait(w);
        if (st == DT_OK)
            st = st2;
        printf("[%d] send/recv      got %d from rank %d (tag 7)\n", r, got, from);
        bad += check(r, "send/recv", st, c, from == (r + n - 1) % n && got == from * 100);
    }

    st = dt_barrier(c);
    bad += check(r, "barrier", st, c, 1);

    size_t count = (16u << 20) / sizeof(float);
    float *big = malloc(count * sizeof *big);
    for (size_t i = 0; i < count; i++)
        big[i] = 1.0f;
    dt_allreduce(c, big, count, DT_F32, DT_SUM); /* warm-up */
    double t0 = dt_now();
    st = dt_allreduce(c, big, count, DT_F32, DT_SUM);
    double dt = dt_now() - t0;
    double busbw = 2.0 * (n - 1) / n * (double)(count * sizeof(float)) / dt / 1e9;
    printf("[%d] allreduce      16 MiB f32 in %.1f ms, busbw %.2f GB/s\n", r, dt * 1e3, busbw);
    bad += check(r, "allreduce 16M", st, c,
                 big[0] == (float)n * n && big[count - 1] == (float)n * n);
    free(big);
    return bad;
}

static int run_rank(int rank, int n, const char *url, const uint8_t *secret)
{
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = rank;
    o.world_size = n;
    o.init_url = url;
    o.job_id = "demo";
    o.secret = secret;
    o.secret_len = 32;
    dt_comm *c;
    double t0 = dt_now();
    dt_status st = dt_comm_init(&c, &o);
    if (st != DT_OK) {
        printf("[%d] init FAILED: %s\n", rank, c ? dt_comm_error(c) : "out of memory");
        dt_comm_destroy(c);
        return 1;
    }
    printf("[%d] joined         listening on 127.0.0.1:%d, %d peers authenticated in %.0f ms\n",
           rank, dt_comm_port(c), n - 1, (dt_now() - t0) * 1e3);
    fflush(stdout);
    int bad = tour(c);
    fflush(stdout);
    dt_comm_destroy(c);
    return bad ? 1 : 0;
}

/* Returns DT_FLAGS_OK, or DT_FLAGS_HELP after printing the usage, or
 * DT_FLAGS_ERROR after printing what was wrong. */
static int parse_args(int argc, char **argv, int *n)
{
    const dt_flag flags[] = {{"-n", "--ranks", "RANKS", n, NULL, 1, 64, "local ranks"}};
    int rc = dt_flags_parse(argv[0], flags, 1, argc, argv);
    if (rc == DT_FLAGS_HELP) {
        printf("usage: %s [-n RANKS]\n"
               "Forks RANKS local ranks that run every collective once and check it.\n",
               argv[0]);
        dt_flags_usage(stdout, flags, 1);
    }
    return rc;
}

int main(int argc, char **argv)
{
    int n = 4;
    int prc = parse_args(argc, argv, &n);
    if (prc)
        return prc == DT_FLAGS_HELP ? 0 : DT_FLAGS_USAGE_ERROR;
    if (sodium_init() < 0)
        return 1;
    uint8_t secret[32];
    randombytes_buf(secret, sizeof secret);
    char url[128];
    snprintf(url, sizeof url, "file:///tmp/dtrain-demo-%d", (int)getpid());
    printf("dtrain-demo: %d ranks, rendezvous %s\n", n, url);
    fflush(stdout);
    pid_t pids[64];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            setvbuf(stdout, NULL, _IOLBF, 0);
            _exit(run_rank(r, n, url, secret));
        }
    }
    int failed = 0;
    for (int r = 0; r < n; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            failed++;
    }
    printf("dtrain-demo: %s (%d of %d ranks failed)\n", failed ? "FAILED" : "all results correct",
           failed, n);
    return failed ? 1 : 0;
}
