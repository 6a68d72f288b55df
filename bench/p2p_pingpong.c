/*
 * p2p_pingpong.c — the round trip of a tagged send/recv through dt_comm,
 * the way a pipeline stage uses it: each rank posts its receive first
 * (dt_recv_async), then sends, so a send is queued while a receive is in
 * flight.
 *
 *   p2p-pingpong [--wire gloo|dtrain] [-b BYTES] [-n ROUNDS] [-w WARMUP]
 *
 * Forks two ranks that meet through a fresh file:///tmp rendezvous. Rank 0
 * posts a receive, sends BYTES to rank 1 and waits for the reply; rank 1
 * posts a receive, waits for it, and sends the same bytes back. Prints the
 * median, the 10th and the 90th percentile of ROUNDS round trips in
 * microseconds (rank 0's clock), after WARMUP untimed ones.
 *
 * Cost: 2 processes, ROUNDS × 2 messages of BYTES.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dt_clock.h"
#include "dt_comm.h"

typedef struct args {
    dt_wire wire;
    size_t bytes;
    int rounds, warmup;
    double gap_us; /* each rank's compute between posting a receive and sending */
} args;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The stage's compute between posting a receive and sending: a busy wait. */
static void compute(double us)
{
    double until = dt_now() + us * 1e-6;
    while (dt_now() < until)
        ;
}

/* Rank 0 sends round i and waits for the reply; rank 1 waits for round i
 * and replies. Each posts its receive of round i+1 before it computes and
 * sends, so every send is queued while a receive is in flight. Returns
 * rank 0's microseconds from its send to the reply, less rank 1's gap. */
static dt_status rounds(dt_comm *c, int rank, const args *a, uint8_t *buf, double *t)
{
    dt_work *w = NULL;
    dt_status st = dt_recv_async(c, buf, a->bytes, DT_U8, 1 - rank, 0, NULL, &w);
    for (int i = 0; st == DT_OK && i < a->warmup + a->rounds; i++) {
        double t0 = dt_now();
        if (rank == 0)
            st = dt_send(c, buf, a->bytes, DT_U8, 1, (uint32_t)i);
        dt_status got = dt_work_wait(w);
        w = NULL;
        double t1 = dt_now();
        st = st != DT_OK ? st : got;
        if (st == DT_OK && i >= a->warmup && rank == 0)
            t[i - a->warmup] = (t1 - t0) * 1e6 - a->gap_us;
        if (st == DT_OK && i + 1 < a->warmup + a->rounds)
            st = dt_recv_async(c, buf, a->bytes, DT_U8, 1 - rank, (uint32_t)(i + 1), NULL, &w);
        compute(a->gap_us);
        if (st == DT_OK && rank == 1)
            st = dt_send(c, buf, a->bytes, DT_U8, 0, (uint32_t)i);
    }
    if (w)
        dt_work_wait(w);
    return st;
}

static int rank_main(const args *a, int rank, const char *url)
{
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = rank;
    o.world_size = 2;
    o.init_url = url;
    o.job_id = "p2p-pingpong";
    o.host = "127.0.0.1";
    o.wire = a->wire;
    o.init_timeout_s = 60;
    dt_comm *c = NULL;
    dt_status st = dt_comm_init(&c, &o);
    uint8_t *buf = calloc(1, a->bytes);
    double *t = calloc((size_t)a->rounds, sizeof *t);
    if (st == DT_OK)
        st = rounds(c, rank, a, buf, t);
    if (st != DT_OK) {
        fprintf(stderr, "p2p-pingpong: rank %d: %s\n", rank, c ? dt_comm_error(c) : "no memory");
    } else if (rank == 0) {
        qsort(t, (size_t)a->rounds, sizeof *t, cmp_double);
        printf("wire %s, %zu bytes, gap %.0f us, %d round trips less the gap: median %.1f us, p10 "
               "%.1f us, p90 %.1f us\n",
               a->wire == DT_WIRE_GLOO ? "gloo" : "dtrain", a->bytes, a->gap_us, a->rounds,
               t[a->rounds / 2], t[a->rounds / 10], t[a->rounds * 9 / 10]);
        fflush(stdout); /* the rank ends in _exit */
    }
    dt_comm_destroy(c);
    free(buf);
    free(t);
    return st == DT_OK ? 0 : 1;
}

static int usage(void)
{
    fprintf(stderr, "usage: p2p-pingpong [--wire gloo|dtrain] [-b BYTES] [-n ROUNDS] "
                    "[-w WARMUP] [-g GAP_US]\n");
    return 2;
}

int main(int argc, char **argv)
{
    args a = {.wire = DT_WIRE_GLOO, .bytes = 4, .rounds = 200, .warmup = 20, .gap_us = 200};
    for (int i = 1; i < argc; i += 2) { /* FLAG VALUE pairs */
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return usage();
        if (!strcmp(argv[i], "--wire") && (!strcmp(v, "gloo") || !strcmp(v, "dtrain")))
            a.wire = !strcmp(v, "gloo") ? DT_WIRE_GLOO : DT_WIRE_DTRAIN;
        else if (!strcmp(argv[i], "-b") && atol(v) > 0)
            a.bytes = (size_t)atol(v);
        else if (!strcmp(argv[i], "-n") && atoi(v) > 0)
            a.rounds = atoi(v);
        else if (!strcmp(argv[i], "-w") && atoi(v) >= 0)
            a.warmup = atoi(v);
        else if (!strcmp(argv[i], "-g") && atof(v) >= 0)
            a.gap_us = atof(v);
        else
            return usage();
    }
    char url[128];
    snprintf(url, sizeof url, "file:///tmp/dtrain-p2p-pingpong-%d", (int)getpid());
    unlink(url + 7);
    pid_t kids[2];
    for (int r = 0; r < 2; r++)
        if ((kids[r] = fork()) == 0)
            _exit(rank_main(&a, r, url));
    int rc = 0;
    for (int r = 0; r < 2; r++) {
        int status = 0;
        if (kids[r] < 0 || waitpid(kids[r], &status, 0) < 0 || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0)
            rc = 1;
    }
    unlink(url + 7);
    return rc;
}
