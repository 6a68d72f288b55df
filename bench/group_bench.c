/*
 * group_bench.c — group-bench: what a sub-communicator costs.
 *
 * Two questions, for N ranks as threads of one process (default 4):
 *   split     how long dt_comm_split takes (two all-gathers on the parent,
 *             then the child's handshakes), split into two groups by
 *             parity, and how long destroying the child takes;
 *   ops       whether an op on a child is as fast as the same op on the
 *             world of the same ranks: every rank splits with one colour,
 *             so the child and the world have the same members, and each
 *             round times an all-reduce on the world, then the same on the
 *             child, back to back and in alternating order, so that drift
 *             on a shared machine hits both alike.
 * Each time is measured on rank 0 from a barrier all ranks pass (on the
 * communicator the op runs on); the table shows medians over the rounds and
 * the child/world ratio.
 *
 * Usage: group-bench [--ranks N] [--rounds R]; the usage text and the
 * parser read one table (dt_flags.h's spellings and errors).
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dt_comm.h"
#include "dt_clock.h"
#include "dt_flags.h"

#define MAX_RANKS 8
#define MAX_ROUNDS 200
#define BIG (1u << 20) /* floats: 4 MiB */

enum { T_SPLIT, T_DESTROY, T_SMALL_WORLD, T_SMALL_CHILD, T_BIG_WORLD, T_BIG_CHILD, T_COUNT };

typedef struct bench {
    int n, rounds;
    char url[128];
    double t[T_COUNT][MAX_ROUNDS]; /* rank 0's seconds */
    int failed;
} bench;

typedef struct rank_arg {
    bench *b;
    int rank;
} rank_arg;


/* Times `call` on rank 0, from a barrier on `sync` that every rank passes. */
#define TIMED(b, rank, sync, slot, round, call)   \
    do {                                          \
        if (dt_barrier(sync) != DT_OK)            \
            goto fail;                            \
        double t0_ = dt_now();                    \
        if ((call) != DT_OK)                      \
            goto fail;                            \
        if ((rank) == 0)                          \
            (b)->t[slot][round] = dt_now() - t0_; \
    } while (0)

static void *rank_main(void *p)
{
    rank_arg *a = p;
    bench *b = a->b;
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = a->rank;
    o.world_size = b->n;
    o.init_url = b->url;
    o.job_id = "group-bench";
    dt_comm *world = NULL, *child = NULL, *same = NULL;
    float *big = calloc(BIG, sizeof *big), small = 1;
    if (!big || dt_comm_init(&world, &o) != DT_OK)
        goto fail;
    if (dt_comm_split(world, 0, a->rank, &same) != DT_OK)
        goto fail;
    for (int r = 0; r < b->rounds; r++) {
        TIMED(b, a->rank, world, T_SPLIT, r, dt_comm_split(world, a->rank % 2, a->rank, &child));
        TIMED(b, a->rank, world, T_DESTROY, r, (dt_comm_destroy(child), child = NULL, DT_OK));
        for (int k = 0; k < 2; k++) { /* world first on even rounds, child first on odd */
            bool on_child = (k + r) % 2;
            dt_comm *c = on_child ? same : world;
            TIMED(b, a->rank, c, on_child ? T_SMALL_CHILD : T_SMALL_WORLD, r,
                  dt_allreduce(c, &small, 1, DT_F32, DT_SUM));
            TIMED(b, a->rank, c, on_child ? T_BIG_CHILD : T_BIG_WORLD, r,
                  dt_allreduce(c, big, BIG, DT_F32, DT_SUM));
        }
    }
    goto done;
fail:
    fprintf(stderr, "rank %d: %s\n", a->rank, world ? dt_comm_error(world) : "could not start");
    __atomic_add_fetch(&b->failed, 1, __ATOMIC_SEQ_CST);
    if (world)
        dt_comm_abort(world, "group-bench failed");
done:
    dt_comm_destroy(child);
    dt_comm_destroy(same);
    dt_comm_destroy(world);
    free(big);
    return NULL;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Returns DT_FLAGS_OK, or DT_FLAGS_HELP after printing the usage, or
 * DT_FLAGS_ERROR after printing what was wrong. */
static int parse_args(bench *b, int argc, char **argv)
{
    const dt_flag flags[] = {
        {NULL, "--ranks", "N", &b->n, NULL, 2, MAX_RANKS, "ranks (threads)"},
        {NULL, "--rounds", "R", &b->rounds, NULL, 1, MAX_ROUNDS, "timed rounds"},
    };
    int n = (int)(sizeof flags / sizeof flags[0]);
    int rc = dt_flags_parse("group-bench", flags, n, argc, argv);
    if (rc == DT_FLAGS_HELP) {
        printf("usage: group-bench [--ranks N] [--rounds R]\n"
               "Times dt_comm_split and ops on a child against the world, ranks as threads.\n");
        dt_flags_usage(stdout, flags, n);
    }
    return rc;
}

int main(int argc, char **argv)
{
    static bench b = {.n = 4, .rounds = 30};
    int prc = parse_args(&b, argc, argv);
    if (prc)
        return prc == DT_FLAGS_HELP ? 0 : DT_FLAGS_USAGE_ERROR;
    snprintf(b.url, sizeof b.url, "file:///tmp/dtrain-group-bench-%d", (int)getpid());
    pthread_t t[MAX_RANKS];
    rank_arg args[MAX_RANKS];
    for (int r = 0; r < b.n; r++) {
        args[r] = (rank_arg){&b, r};
        pthread_create(&t[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < b.n; r++)
        pthread_join(t[r], NULL);
    if (b.failed)
        return 1;
    double m[T_COUNT];
    for (int k = 0; k < T_COUNT; k++)
        m[k] = median(b.t[k], b.rounds);
    printf("group-bench: %d ranks as threads, %d rounds, medians on rank 0\n", b.n, b.rounds);
    printf("  dt_comm_split into 2 groups (by parity)   %9.1f us\n", m[T_SPLIT] * 1e6);
    printf("  dt_comm_destroy of that child             %9.1f us\n", m[T_DESTROY] * 1e6);
    printf("  %-22s %12s %12s %8s\n", "allreduce f32", "world (us)", "child (us)", "ratio");
    printf("  %-22s %12.1f %12.1f %8.2f\n", "4 B", m[T_SMALL_WORLD] * 1e6, m[T_SMALL_CHILD] * 1e6,
           m[T_SMALL_CHILD] / m[T_SMALL_WORLD]);
    printf("  %-22s %12.1f %12.1f %8.2f\n", "4 MiB", m[T_BIG_WORLD] * 1e6, m[T_BIG_CHILD] * 1e6,
           m[T_BIG_CHILD] / m[T_BIG_WORLD]);
    return 0;
}
