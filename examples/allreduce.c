/*
 * allreduce.c — the smallest program against an installed dtrain: 4 ranks
 * (forked processes) join through a rendezvous file and all-reduce a
 * vector; each checks the sum. It uses only the public API and builds with
 *
 *   cc allreduce.c $(pkg-config --cflags --libs dtrain) -o allreduce
 *
 * Exit 0 when every rank got the right answer. Cost: one ring all-reduce
 * of 1024 floats, 2 (p-1)/p of the vector on the wire per rank.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dt_comm.h>

enum { RANKS = 4, N = 1024 };

static int run_rank(int rank, const char *url)
{
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = rank;
    o.world_size = RANKS;
    o.init_url = url;
    dt_comm *c;
    if (dt_comm_init(&c, &o) != DT_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, dt_comm_error(c));
        dt_comm_destroy(c);
        return 1;
    }
    static float x[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)(rank + i);
    int bad = dt_allreduce(c, x, N, DT_F32, DT_SUM) != DT_OK;
    for (int i = 0; i < N && !bad; i++) /* sum over ranks r of (r + i) */
        bad = x[i] != (float)(RANKS * i + RANKS * (RANKS - 1) / 2);
    if (bad)
        fprintf(stderr, "rank %d: %s\n", rank, *dt_comm_error(c) ? dt_comm_error(c) : "wrong sum");
    dt_comm_destroy(c);
    return bad;
}

int main(void)
{
    char url[64];
    snprintf(url, sizeof url, "file:///tmp/dtrain-example-%d", (int)getpid());
    pid_t pids[RANKS];
    for (int r = 0; r < RANKS; r++)
        if ((pids[r] = fork()) == 0)
            _exit(run_rank(r, url));
    int failed = 0;
    for (int r = 0; r < RANKS; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    unlink(url + 7);
    printf("allreduce example: %s\n", failed ? "FAILED" : "4 ranks agree");
    return failed != 0;
}
