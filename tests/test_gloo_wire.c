/*
 * test_gloo_wire.c — a communicator on the gloo wire (DT_WIRE=gloo): dtrain's
 * API, torch 1.13 gloo's messages. Ranks are threads of this process; what
 * a torch rank sees of the same job is tests/torch_gloo.py's business.
 */
#include <criterion/criterion.h>
#include <dirent.h>
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
    double timeout_s; /* the communicator's op timeout */
    void *arg;        /* the test's, shared by the ranks */
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
    o.timeout_s = r->timeout_s;
    o.init_timeout_s = 20;
    if (dt_comm_init(&r->comm, &o) != DT_OK)
        fail(r, "init");
    else
        r->body(r);
    dt_comm_destroy(r->comm);
    return NULL;
}

/* Runs body on size ranks as threads, with op timeout timeout_s and arg. */
static void run_with(int size, void (*body)(wire_rank *), wire_rank *ranks, double timeout_s,
                     void *arg)
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
        ranks[r] = (wire_rank){.rank = r,
                               .size = size,
                               .url = url,
                               .body = body,
                               .timeout_s = timeout_s,
                               .arg = arg};
        cr_assert_eq(pthread_create(&t[r], NULL, rank_main, &ranks[r]), 0);
    }
    for (int r = 0; r < size; r++)
        pthread_join(t[r], NULL);
    unlink(url + 7);
}

static void run(int size, void (*body)(wire_rank *), wire_rank *ranks)
{
    run_with(size, body, ranks, 20, NULL);
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

/* An allreduce of world rank + 1 over the world. */
static void sum_in_world(wire_rank *r)
{
    int32_t v = r->rank + 1;
    if (dt_allreduce(r->comm, &v, 1, DT_I32, DT_SUM) != DT_OK)
        return fail(r, "allreduce in the world");
    if (v != r->size * (r->size + 1) / 2)
        fail(r, "allreduce in the world: wrong sum");
}

/* ---- tagged send/recv: the tag is the slot, as torch's ---------------------- */

#define BIG (1 << 20) /* floats: far more than any socket buffer holds */

/* Both ranks send first and receive second, as a pipeline's 1F1B does:
 * only sends that stay in flight while the receive is posted complete. */
static void crossing_sends(wire_rank *r)
{
    float *out = malloc(BIG * sizeof *out), *in = malloc(BIG * sizeof *in);
    for (int i = 0; i < BIG; i++)
        out[i] = (float)(r->rank * BIG + i);
    dt_work *s = NULL, *v = NULL;
    const int peer = 1 - r->rank;
    if (dt_send_async(r->comm, out, BIG, DT_F32, peer, 7, &s) != DT_OK ||
        dt_recv_async(r->comm, in, BIG, DT_F32, peer, 7, NULL, &v) != DT_OK)
        fail(r, "posting a send and a receive");
    else if (dt_work_wait(v) != DT_OK || dt_work_wait(s) != DT_OK)
        fail(r, "crossing send and receive");
    else if (in[0] != (float)(peer * BIG) || in[BIG - 1] != (float)(peer * BIG + BIG - 1))
        fail(r, "the receive holds other data than the peer sent");
    free(out);
    free(in);
}

Test(gloo_wire, two_ranks_that_both_send_first_both_complete, .timeout = 60)
{
    wire_rank ranks[2];
    run(2, crossing_sends, ranks);
    for (int r = 0; r < 2; r++)
        cr_assert(!ranks[r].err[0], "%s", ranks[r].err);
}

/* Ranks 1 and 2 send to rank 0, which receives from any source; a
 * collective runs while rank 1's send is in flight. */
static void any_source(wire_rank *r)
{
    int32_t v = 100 + r->rank;
    if (r->rank == 0) {
        int seen = 0;
        for (int k = 0; k < 2; k++) {
            int32_t got = 0;
            int from = -1;
            if (dt_recv(r->comm, &got, 1, DT_I32, DT_ANY_SOURCE, 5, &from) != DT_OK)
                return fail(r, "recv from any source");
            if (from < 1 || from > 2 || got != 100 + from)
                return fail(r, "recv from any source: wrong source or data");
            seen |= 1 << from;
        }
        if (seen != 6)
            return fail(r, "one sender's message was received twice");
        sum_in_world(r);
    } else if (r->rank == 1) {
        dt_work *w = NULL;
        if (dt_send_async(r->comm, &v, 1, DT_I32, 0, 5, &w) != DT_OK)
            return fail(r, "send");
        sum_in_world(r);
        if (dt_work_wait(w) != DT_OK)
            fail(r, "a send in flight across a collective");
    } else {
        if (dt_send(r->comm, &v, 1, DT_I32, 0, 5) != DT_OK)
            return fail(r, "send");
        sum_in_world(r);
    }
}

Test(gloo_wire, a_receive_from_any_source_names_each_sender, .timeout = 60)
{
    wire_rank ranks[3];
    run(3, any_source, ranks);
    for (int r = 0; r < 3; r++)
        cr_assert(!ranks[r].err[0], "%s", ranks[r].err);
}

/* Rank 0 keeps a receive in flight and sends; rank 1 replies only to that
 * send. The communicator thread waits on the wire for the receive, with no
 * timer: only the send's queueing can wake it to post the send. */
static void send_while_a_receive_waits(wire_rank *r)
{
    int32_t v = 7, got = 0;
    if (r->rank == 0) {
        dt_work *w = NULL;
        if (dt_recv_async(r->comm, &got, 1, DT_I32, 1, 1, NULL, &w) != DT_OK)
            return fail(r, "posting the receive");
        if (dt_send(r->comm, &v, 1, DT_I32, 1, 2) != DT_OK)
            fail(r, "a send queued while a receive is in flight");
        if (dt_work_wait(w) != DT_OK || got != 8)
            fail(r, "the reply");
    } else if (dt_recv(r->comm, &got, 1, DT_I32, 0, 2, NULL) != DT_OK) {
        fail(r, "recv");
    } else if ((v = got + 1), dt_send(r->comm, &v, 1, DT_I32, 0, 1) != DT_OK) {
        fail(r, "reply");
    }
}

Test(gloo_wire, a_send_queued_while_a_receive_is_in_flight_is_posted_at_once, .timeout = 60)
{
    wire_rank ranks[2];
    run(2, send_while_a_receive_waits, ranks);
    for (int r = 0; r < 2; r++)
        cr_assert(!ranks[r].err[0], "%s", ranks[r].err);
}

/* Rank 0 waits 1 s for a message rank 1 never sends. */
static void receive_that_times_out(wire_rank *r)
{
    atomic_int *rank_0_done = r->arg;
    float y = 0;
    if (r->rank == 1) {
        while (!atomic_load(rank_0_done))
            usleep(1000);
        return;
    }
    if (dt_recv(r->comm, &y, 1, DT_F32, 1, 4, NULL) != DT_ETIMEDOUT)
        fail(r, "the receive did not time out");
    else if (!strstr(dt_comm_error(r->comm), "recv #0 with tag 4 from rank 1 (127.0.0.1:"))
        fail(r, "the timeout does not name the peer and its address");
    atomic_store(rank_0_done, 1);
}

Test(gloo_wire, a_receive_that_times_out_names_the_peer_its_address_and_the_tag, .timeout = 30)
{
    wire_rank ranks[2];
    atomic_int rank_0_done = 0;
    run_with(2, receive_that_times_out, ranks, 1, &rank_0_done);
    for (int r = 0; r < 2; r++)
        cr_assert(!ranks[r].err[0], "%s", ranks[r].err);
}

/* ---- dt_comm_abort: every local op ends now, not at its timeout ------------- */

/* Rank 0: a receive in flight, an allreduce running (rank 1 never joins
 * it), another queued behind it; then dt_comm_abort. Rank 1, once rank 0
 * is done, waits for a message from rank 0. Op timeout 600 s, test 30 s. */
static void abort_while_ops_wait(wire_rank *r)
{
    atomic_int *rank_0_done = r->arg;
    float x[4] = {1, 2, 3, 4}, z[4] = {5, 6, 7, 8}, y = 0;
    if (r->rank == 1) {
        while (!atomic_load(rank_0_done))
            usleep(1000);
        if (dt_recv(r->comm, &y, 1, DT_F32, 0, 3, NULL) != DT_EPEER)
            fail(r, "the aborted peer's receive did not fail as a peer's failure");
        return;
    }
    dt_work *w[3] = {NULL, NULL, NULL};
    if (dt_recv_async(r->comm, &y, 1, DT_F32, 1, 3, NULL, &w[0]) != DT_OK ||
        dt_allreduce_async(r->comm, x, 4, DT_F32, DT_SUM, &w[1]) != DT_OK ||
        dt_allreduce_async(r->comm, z, 4, DT_F32, DT_SUM, &w[2]) != DT_OK)
        fail(r, "submitting");
    usleep(100 * 1000); /* the allreduce is waiting on the wire by now, most likely */
    dt_comm_abort(r->comm, "the test says stop");
    static const char *what[3] = {"the receive in flight", "the running allreduce",
                                  "the allreduce queued behind it"};
    for (int k = 0; k < 3; k++)
        if (w[k] && dt_work_wait(w[k]) != DT_EABORTED)
            fail(r, what[k]);
    if (!strstr(dt_comm_error(r->comm), "rank 0: aborted: the test says stop"))
        fail(r, "the error is not the abort's");
    atomic_store(rank_0_done, 1);
}

Test(gloo_wire, an_abort_ends_every_local_op_at_once_and_the_peer_hears_of_it, .timeout = 30)
{
    wire_rank ranks[2];
    atomic_int rank_0_done = 0;
    run_with(2, abort_while_ops_wait, ranks, 600, &rank_0_done);
    for (int r = 0; r < 2; r++)
        cr_assert(!ranks[r].err[0], "%s", ranks[r].err);
}

/* A tag of 2^31 or more could be a collective's slot: refused, no failure. */
static void tag_too_big(wire_rank *r)
{
    int32_t v = 1;
    if (dt_send(r->comm, &v, 1, DT_I32, 1 - r->rank, 0x80000000u) != DT_EINVAL)
        return fail(r, "a tag of 2^31 was not refused");
    if (!strstr(dt_comm_error(r->comm), "over 2^31-1"))
        return fail(r, "the refusal does not say why");
    sum_in_world(r);
}

Test(gloo_wire, a_tag_of_2_to_the_31_is_refused_and_the_world_goes_on, .timeout = 60)
{
    wire_rank ranks[2];
    run(2, tag_too_big, ranks);
    for (int r = 0; r < 2; r++)
        cr_assert(!ranks[r].err[0], "%s", ranks[r].err);
}

/* ---- the ports a rank opens: gloo's only ------------------------------------- */

/* Is `inode` one of this process's sockets? */
static bool ours(unsigned long inode)
{
    char want[64], path[300], link[64];
    snprintf(want, sizeof want, "socket:[%lu]", inode);
    DIR *d = opendir("/proc/self/fd");
    bool found = false;
    for (struct dirent *e; d && !found && (e = readdir(d)) != NULL;) {
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        found = n > 0 && (link[n] = 0, strcmp(link, want) == 0);
    }
    if (d)
        closedir(d);
    return found;
}

/* TCP sockets of this process in state LISTEN, IPv4 and IPv6. */
static int listening_sockets(void)
{
    int n = 0;
    const char *tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (int t = 0; t < 2; t++) {
        FILE *f = fopen(tables[t], "r");
        char line[512];
        for (int row = 0; f && fgets(line, sizeof line, f); row++) {
            unsigned st = 0;
            unsigned long inode = 0;
            if (row > 0 &&
                sscanf(line, "%*s %*s %*s %x %*s %*s %*s %*s %*s %lu", &st, &inode) == 2 &&
                st == 0x0A && ours(inode))
                n++;
        }
        if (f)
            fclose(f);
    }
    return n;
}

/* Once every rank has joined (gloo's pair listeners closed after their one
 * connection), rank 0 counts the ports this process listens on. */
static void count_listeners(wire_rank *r)
{
    int *listening = r->arg;
    if (dt_barrier(r->comm) != DT_OK)
        return fail(r, "barrier");
    if (r->rank == 0)
        *listening = listening_sockets();
    if (dt_comm_port(r->comm) != 0)
        fail(r, "dt_comm_port names a port of dtrain's");
    if (dt_barrier(r->comm) != DT_OK)
        fail(r, "barrier");
}

Test(gloo_wire, a_joined_rank_listens_on_no_port_of_dtrains, .timeout = 60)
{
    wire_rank ranks[2];
    int listening = -1;
    run_with(2, count_listeners, ranks, 20, &listening);
    for (int r = 0; r < 2; r++)
        cr_assert(!ranks[r].err[0], "%s", ranks[r].err);
    cr_assert_eq(listening, 0, "%d sockets listen in a 2-rank gloo world over file://", listening);
}

/* ---- dt_comm_split: torch's new_group, one per colour ------------------------ */

/* Sums world ranks + 1 over c; want: the sum over its members. */
static void sum_in(wire_rank *r, dt_comm *c, int want, const char *what)
{
    int32_t v = r->rank + 1;
    if (dt_allreduce(c, &v, 1, DT_I32, DT_SUM) != DT_OK)
        return fail(r, what);
    if (v != want)
        return fail(r, what[0] ? "a group summed other ranks than its members" : what);
}

/* minigpt --pp 2 --dp 2: stage = rank / 2, replica = rank % 2; the
 * pipeline of a replica and the data-parallel group of a stage. */
static void pipeline_and_data_groups(wire_rank *r)
{
    const int stage = r->rank / 2, replica = r->rank % 2;
    dt_comm *pipe = NULL, *dp = NULL;
    if (dt_comm_split(r->comm, replica, stage, &pipe) != DT_OK)
        return fail(r, "pipeline split");
    if (dt_comm_split(r->comm, stage, replica, &dp) != DT_OK) {
        dt_comm_destroy(pipe);
        return fail(r, "data-parallel split");
    }
    if (dt_comm_rank(pipe) != stage || dt_comm_size(pipe) != 2 || dt_comm_rank(dp) != replica ||
        dt_comm_size(dp) != 2)
        fail(r, "a group's rank or size is not the split's");
    /* replica q's pipeline: world ranks q, q+2; stage s's group: 2s, 2s+1 */
    sum_in(r, pipe, (replica + 1) + (replica + 3), "allreduce in the pipeline group");
    sum_in(r, dp, (2 * stage + 1) + (2 * stage + 2), "allreduce in the data-parallel group");
    sum_in(r, r->comm, 10, "allreduce in the world after the splits");
    dt_comm_destroy(pipe);
    dt_comm_destroy(dp);
}

Test(gloo_wire, minigpt_splits_make_working_pipeline_and_data_groups, .timeout = 60)
{
    wire_rank ranks[4];
    run(4, pipeline_and_data_groups, ranks);
    for (int r = 0; r < 4; r++)
        cr_assert(!ranks[r].err[0], "%s", ranks[r].err);
}

/* Rank 2 of 3 passes DT_UNDEFINED: it gets no group but joins the barrier. */
static void undefined_rank(wire_rank *r)
{
    dt_comm *g = NULL;
    if (dt_comm_split(r->comm, r->rank == 2 ? DT_UNDEFINED : 7, 0, &g) != DT_OK)
        return fail(r, "split with an undefined rank");
    if ((r->rank == 2) != (g == NULL))
        fail(r, "an undefined rank got a group, or a member none");
    if (g)
        sum_in(r, g, 3, "allreduce among the members");
    sum_in(r, r->comm, 6, "allreduce in the world after the split");
    dt_comm_destroy(g);
}

Test(gloo_wire, an_undefined_rank_gets_no_group_and_the_others_one, .timeout = 60)
{
    wire_rank ranks[3];
    run(3, undefined_rank, ranks);
    for (int r = 0; r < 3; r++)
        cr_assert(!ranks[r].err[0], "%s", ranks[r].err);
}

/* Keys that reverse the world order: refused on every rank, world intact. */
static void reversed_keys(wire_rank *r)
{
    dt_comm *g = NULL;
    if (dt_comm_split(r->comm, 0, -r->rank, &g) != DT_EINVAL || g)
        return fail(r, "keys against the world order were not refused");
    if (!strstr(dt_comm_error(r->comm), "sorts them"))
        return fail(r, "the refusal does not say torch sorts a group's ranks");
    sum_in(r, r->comm, 3, "allreduce in the world after the refusal");
}

Test(gloo_wire, keys_that_reorder_ranks_are_refused_on_every_rank, .timeout = 60)
{
    wire_rank ranks[2];
    run(2, reversed_keys, ranks);
    for (int r = 0; r < 2; r++)
        cr_assert(!ranks[r].err[0], "%s", ranks[r].err);
}

/* A group's own split has no torch form: refused, the group usable. */
static void split_of_a_group(wire_rank *r)
{
    dt_comm *g = NULL, *gg = NULL;
    if (dt_comm_split(r->comm, 0, 0, &g) != DT_OK)
        return fail(r, "split of the world");
    if (dt_comm_split(g, 0, 0, &gg) != DT_EINVAL || gg)
        fail(r, "a group's split was not refused");
    else if (!strstr(dt_comm_error(g), "only the world splits"))
        fail(r, "the refusal does not say only the world splits");
    sum_in(r, g, 3, "allreduce in the group after the refusal");
    dt_comm_destroy(g);
}

Test(gloo_wire, a_groups_own_split_is_refused, .timeout = 60)
{
    wire_rank ranks[2];
    run(2, split_of_a_group, ranks);
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
