/*
 * test_gloo_wire.c — a communicator on the gloo wire (DT_WIRE=gloo): dtrain's
 * API, torch 1.13 gloo's messages. Ranks are threads of this process; what
 * a torch rank sees of the same job is tests/torch_gloo.py's business.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dt_comm.h"

#define MAX_RANKS 4

typedef struct wire_rank {
    int rank, size;
    const char *url;
    void (*body)(struct wire_rank *);
    dt_comm *comm;
    char err[1024]; /* the first failure */
} wire_rank;

static void fail(wire_rank *r, const char *what)
{
    if (!r->err[0])
        snprintf(r->err, sizeof r->err, "rank %d: %s: %s", r->rank, what,
                 r->comm ? dt_comm_error(r->comm) : "");
}

static void *rank_main(void *p)
{
    wire_rank *r = p;
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = r->rank;
    o.world_size = r->size;
    o.init_url = r->url;
    o.wire = DT_WIRE_GLOO;
    o.timeout_s = 20;
    o.init_timeout_s = 20;
    if (dt_comm_init(&r->comm, &o) != DT_OK)
        fail(r, "init");
    else
        r->body(r);
    dt_comm_destroy(r->comm);
    return NULL;
}

static void run(int size, void (*body)(wire_rank *), wire_rank *ranks)
{
    static atomic_uint counter;
    static char url[128];
    snprintf(url, sizeof url, "file:///tmp/dtrain-test-gloo-wire-%d-%u", (int)getpid(),
             atomic_fetch_add(&counter, 1));
    /* torch's key space: no handle removes the file, and a stale one (an
     * earlier process of this pid) would hand out dead addresses */
    unlink(url + 7);
    pthread_t t[MAX_RANKS];
    for (int r = 0; r < size; r++) {
        ranks[r] = (wire_rank){.rank = r, .size = size, .url = url, .body = body};
        cr_assert_eq(pthread_create(&t[r], NULL, rank_main, &ranks[r]), 0);
    }
    for (int r = 0; r < size; r++)
        pthread_join(t[r], NULL);
    unlink(url + 7);
}

/* Every op of the API a training job uses, against its definition. */
static void dtrain_ops(wire_rank *r)
{
    const int p = r->size, me = r->rank;
    float x[6];
    for (int i = 0; i < 6; i++)
        x[i] = (float)(me + 1);
    if (dt_allreduce(r->comm, x, 6, DT_F32, DT_AVG) != DT_OK)
        return fail(r, "allreduce avg");
    if (x[5] != (float)(p + 1) / 2)
        return fail(r, "allreduce avg gave the wrong mean");
    int32_t blocks[MAX_RANKS * 2], mine[2];
    for (int i = 0; i < 2 * p; i++)
        blocks[i] = i;
    if (dt_reduce_scatter(r->comm, blocks, mine, 2, DT_I32, DT_SUM) != DT_OK)
        return fail(r, "reduce_scatter");
    if (mine[0] != 2 * me * p || mine[1] != (2 * me + 1) * p)
        return fail(r, "reduce_scatter gave the wrong block");
    size_t counts[MAX_RANKS];
    int32_t part[MAX_RANKS], all[MAX_RANKS * MAX_RANKS];
    for (int q = 0; q < p; q++)
        counts[q] = (size_t)q + 1;
    for (int i = 0; i <= me; i++)
        part[i] = 10 * me + i;
    if (dt_allgatherv(r->comm, part, all, counts, DT_I32) != DT_OK)
        return fail(r, "allgatherv");
    for (int q = 0, at = 0; q < p; at += q + 1, q++)
        if (all[at + q] != 10 * q + q)
            return fail(r, "allgatherv put a block in the wrong place");
    int32_t v[3] = {me + 1, me + 1, me + 1};
    if (dt_reduce(r->comm, v, 3, DT_I32, DT_SUM, 0) != DT_OK)
        return fail(r, "reduce");
    if ((me == 0 && v[2] != p * (p + 1) / 2) || (me != 0 && v[2] != me + 1))
        return fail(r, "reduce: the root's sum, the others' buffers unchanged");
    dt_work *w[4];
    float y[4][3];
    for (int k = 0; k < 4; k++) {
        y[k][0] = y[k][1] = y[k][2] = (float)k;
        if (dt_allreduce_async(r->comm, y[k], 3, DT_F32, DT_SUM, &w[k]) != DT_OK)
            return fail(r, "allreduce_async");
    }
    for (int k = 0; k < 4; k++)
        if (dt_work_wait(w[k]) != DT_OK || y[k][1] != (float)(k * p))
            return fail(r, "four async allreduces");
    if (dt_barrier(r->comm) != DT_OK)
        return fail(r, "barrier");
}

Test(gloo_wire, dtrains_collectives_run_on_the_gloo_wire, .timeout = 120)
{
    for (int p = 1; p <= 4; p++) {
        wire_rank ranks[MAX_RANKS];
        run(p, dtrain_ops, ranks);
        for (int r = 0; r < p; r++)
            cr_assert(!ranks[r].err[0], "p=%d: %s", p, ranks[r].err);
    }
}

static void send_and_split(wire_rank *r)
{
    int32_t v = 1;
    if (dt_send(r->comm, &v, 1, DT_I32, 1 - r->rank, 0) != DT_EINVAL)
        return fail(r, "send was not refused");
    if (!strstr(dt_comm_error(r->comm), "not on the gloo wire yet"))
        return fail(r, "send's refusal does not say why");
    dt_comm *child = NULL;
    if (dt_comm_split(r->comm, 0, r->rank, &child) != DT_EINVAL || child)
        return fail(r, "split was not refused");
    if (!strstr(dt_comm_error(r->comm), "dt_comm_split is not on the gloo wire yet"))
        return fail(r, "split's refusal does not say why");
}

Test(gloo_wire, tagged_send_and_split_are_refused_naming_the_wire, .timeout = 60)
{
    wire_rank ranks[2];
    run(2, send_and_split, ranks);
    for (int r = 0; r < 2; r++)
        cr_assert(!ranks[r].err[0], "%s", ranks[r].err);
}

Test(gloo_wire, dt_wire_in_the_environment_selects_the_wire)
{
    dt_comm_options o;
    uint8_t scratch[64];
    char err[256];
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("DT_WIRE", "gloo", 1);
    cr_assert_eq(dt_comm_options_from_env(&o, scratch, sizeof scratch, err, sizeof err), DT_OK,
                 "%s", err);
    cr_assert_eq(o.wire, DT_WIRE_GLOO);
    setenv("DT_WIRE", "dtrain", 1);
    cr_assert_eq(dt_comm_options_from_env(&o, scratch, sizeof scratch, err, sizeof err), DT_OK);
    cr_assert_eq(o.wire, DT_WIRE_DTRAIN);
    setenv("DT_WIRE", "mpi", 1);
    cr_assert_eq(dt_comm_options_from_env(&o, scratch, sizeof scratch, err, sizeof err), DT_EINVAL);
    cr_assert(strstr(err, "DT_WIRE is 'mpi'"), "%s", err);
}
