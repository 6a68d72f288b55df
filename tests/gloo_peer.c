/*
 * gloo_peer.c — a dtrain rank in a torch 1.13 gloo process group, for
 * tests/torch_gloo.py (./dev.sh test-torch).
 *
 *   gloo_peer URL RANK SIZE PLAN TIMEOUT_S
 *
 * Joins the group at URL (file:// or tcp://; a tcp:// rank 0 serves the
 * store itself, as torch's rank 0 does), then runs PLAN, a file of one
 * collective a line, on inputs every rank derives from (rank, line number)
 * exactly as the torch ranks do (torch_gloo.py says how), and prints
 * "LINE SHA256" of each result's bytes. On any failure it prints the
 * error to stderr and exits 1.
 *
 *   allreduce DTYPE OP N      broadcast DTYPE N ROOT   allgather DTYPE N
 *   reduce DTYPE OP N ROOT    gather DTYPE N ROOT      scatter DTYPE N ROOT
 *   alltoall DTYPE N          barrier                  p2p DTYPE N TAG
 *   async4 DTYPE N            (four sum all_reduces, torch issues them async)
 *
 * PLAN "split:C0,C1,..." is another program, through the communicator's
 * API on the gloo wire: dt_comm_split with colour C<rank> (-1: none) and
 * key = rank, an f32 sum of 1000 in the group (line 1, printed by members
 * only), then one in the world (line 2); torch_gloo.py's torch ranks do
 * all_gather of (colour, rank) and new_group per colour.
 *
 * PLAN "sendrecv" is tagged send/recv through the communicator's API
 * (dt_send_async, dt_recv_async, dt_recv from DT_ANY_SOURCE), mirrored by
 * torch's isend, irecv and recv(src=None):
 *   line 1  a ring: each rank sends 262145 f32 to rank+1 (tag 5) while it
 *           receives from rank-1, both posted before either is waited for
 *   line 2  rank 0 posts a receive of 1000 i64 from the last rank (tag 11);
 *           every rank sums 1000 f32 (printed) while it is in flight;
 *   line 3  then the last rank sends, and rank 0 prints what it got
 *   line 4  every other rank sends 1000 i32 to rank 0 (tag 9), which
 *           receives them from any source, each into its sender's block
 *   line 5  a sum of 1000 f32 in the world
 *
 * PLAN "abort": through the communicator's API, a receive from rank 1 that
 * never comes and an all-reduce no other rank joins, then dt_comm_abort;
 * exits 0 only if both ended DT_EABORTED with the abort's reason (the
 * torch ranks' ops must fail at once too: the abort closes the group's
 * connections).
 */
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dt_comm.h"
#include "gloo/gloo.h"
#include "half.h"

typedef struct peer {
    gloo_ctx *ctx;
    int rank, size;
} peer;

/* Element i of the input of (rank, line): exact in every dtype. */
static void fill(void *buf, dt_dtype t, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t a = ((uint64_t)i * 2654435761u + seed) & 0xffffffffu;
        int64_t m = (int64_t)(a % 2001) - 1000;
        switch (t) {
        case DT_F32: ((float *)buf)[i] = (float)ldexp((double)m, (int)((a >> 11) % 40) - 20); break;
        case DT_F64: ((double *)buf)[i] = ldexp((double)m, (int)((a >> 11) % 40) - 20); break;
        case DT_F16:
            ((uint16_t *)buf)[i] = half_f32_to_f16(
                (float)ldexp((double)m, (int)((a >> 11) % 8) - 6));
            break;
        case DT_I32: ((int32_t *)buf)[i] = (int32_t)m; break;
        case DT_I64: ((int64_t *)buf)[i] = ((int64_t)a - 2147483648LL) * 4099; break;
        case DT_U8: ((uint8_t *)buf)[i] = (uint8_t)a; break;
        case DT_I8: ((int8_t *)buf)[i] = (int8_t)((int)(a & 0xff) - 128); break;
        default: break;
        }
    }
}

static void print_sha(int line, const void *buf, size_t bytes)
{
    unsigned char md[32];
    unsigned len = 0;
    EVP_Digest(buf, bytes, md, &len, EVP_sha256(), NULL);
    printf("%d ", line);
    for (unsigned i = 0; i < len; i++)
        printf("%02x", md[i]);
    printf("\n");
    fflush(stdout);
}

static uint64_t seed_of(const peer *p, int line)
{
    return (uint64_t)p->rank * 1000003u + (uint64_t)line * 7919u;
}

/* p2p: rank 0 sends to every other rank (tag), each sends its own back
 * (tag + 1), received from any source into block[source]. */
static dt_status p2p(peer *p, int line, dt_dtype t, size_t n, uint32_t tag)
{
    const size_t b = n * dt_dtype_size(t);
    uint8_t *out = calloc((size_t)p->size, b ? b : 1), *tmp = calloc(1, b ? b : 1);
    dt_status st = DT_OK;
    if (p->rank == 0) {
        fill(tmp, t, n, seed_of(p, line));
        for (int q = 1; q < p->size && st == DT_OK; q++)
            st = comm_gloo_send(p->ctx, tmp, b, q, tag);
        for (int q = 1; q < p->size && st == DT_OK; q++) {
            int from = -1;
            st = comm_gloo_recv(p->ctx, tmp, b, -1, tag + 1, &from);
            if (st == DT_OK)
                memcpy(out + (size_t)from * b, tmp, b);
        }
        if (st == DT_OK)
            print_sha(line, out, (size_t)p->size * b);
    } else {
        st = comm_gloo_recv(p->ctx, out, b, 0, tag, NULL);
        fill(tmp, t, n, seed_of(p, line) + 13);
        if (st == DT_OK)
            st = comm_gloo_send(p->ctx, tmp, b, 0, tag + 1);
        if (st == DT_OK)
            print_sha(line, out, b);
    }
    free(out);
    free(tmp);
    return st;
}

static dt_status run_line(peer *p, int line, char *text)
{
    char op[32] = "", ty[16] = "f32", rd[16] = "sum";
    long a = 0, b = 0;
    dt_dtype t = DT_F32;
    dt_redop r = DT_SUM;
    sscanf(text, "%31s", op);
    bool reduces = !strcmp(op, "allreduce") || !strcmp(op, "reduce");
    if (reduces)
        sscanf(text, "%*s %15s %15s %ld %ld", ty, rd, &a, &b);
    else
        sscanf(text, "%*s %15s %ld %ld", ty, &a, &b);
    if (!dt_dtype_parse(ty, &t) || !dt_redop_parse(rd, &r) || a < 0) {
        fprintf(stderr, "gloo_peer: line %d: cannot parse '%s'\n", line, text);
        return DT_EINVAL;
    }
    const size_t n = (size_t)a, es = dt_dtype_size(t), bytes = n * es,
                 all = bytes * (size_t)p->size;
    const int root = (int)b;
    uint8_t *in = calloc(1, all + 8), *out = calloc(1, all + 8);
    dt_status st = DT_OK;
    size_t result = bytes;
    uint8_t *res = in;
    if (!strcmp(op, "allreduce")) {
        fill(in, t, n, seed_of(p, line));
        st = comm_gloo_allreduce(p->ctx, in, n, t, r);
    } else if (!strcmp(op, "async4")) {
        for (int j = 0; j < 4 && st == DT_OK; j++) {
            fill(in, t, n, seed_of(p, line) + (uint64_t)j);
            st = comm_gloo_allreduce(p->ctx, in, n, t, DT_SUM);
            memcpy(out + 0, in, bytes); /* each result hashed in turn */
            if (st == DT_OK)
                print_sha(line * 10 + j, out, bytes);
        }
        result = 0;
    } else if (!strcmp(op, "broadcast")) {
        fill(in, t, n, seed_of(p, line));
        st = comm_gloo_broadcast(p->ctx, in, bytes, root);
    } else if (!strcmp(op, "allgather")) {
        fill(in, t, n, seed_of(p, line));
        st = comm_gloo_allgather(p->ctx, out, in, bytes);
        res = out, result = all;
    } else if (!strcmp(op, "reduce")) {
        fill(in, t, n, seed_of(p, line));
        st = comm_gloo_reduce_root(p->ctx, in, n, t, r, root);
    } else if (!strcmp(op, "gather")) {
        fill(in, t, n, seed_of(p, line));
        st = comm_gloo_gather(p->ctx, out, in, bytes, root);
        res = out, result = p->rank == root ? all : 0;
    } else if (!strcmp(op, "scatter")) {
        if (p->rank == root)
            fill(in, t, n * (size_t)p->size, seed_of(p, line));
        st = comm_gloo_scatter(p->ctx, out, in, bytes, root);
        res = out;
    } else if (!strcmp(op, "alltoall")) {
        fill(in, t, n * (size_t)p->size, seed_of(p, line));
        st = comm_gloo_alltoall(p->ctx, out, in, bytes);
        res = out, result = all;
    } else if (!strcmp(op, "barrier")) {
        st = comm_gloo_barrier(p->ctx);
        result = 0;
    } else if (!strcmp(op, "p2p")) {
        st = p2p(p, line, t, n, (uint32_t)b);
        result = 0;
    } else {
        fprintf(stderr, "gloo_peer: line %d: no op '%s'\n", line, op);
        st = DT_EINVAL;
    }
    if (st == DT_OK && (result > 0 || !strcmp(op, "barrier") || !strcmp(op, "gather")))
        print_sha(line, res, result);
    free(in);
    free(out);
    return st;
}

/* Entry `rank` of a comma-separated list, or DT_UNDEFINED past its end. */
static int colour_of(const char *list, int rank)
{
    for (int r = 0; list; r++) {
        if (r == rank)
            return atoi(list);
        list = strchr(list, ',');
        list = list ? list + 1 : NULL;
    }
    return DT_UNDEFINED;
}

/* A communicator on the gloo wire, joined at url. */
static dt_status join_world(dt_comm **world, const char *url, int rank, int size, double timeout_s)
{
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = rank;
    o.world_size = size;
    o.init_url = url;
    o.wire = DT_WIRE_GLOO;
    o.host = "127.0.0.1";
    o.timeout_s = timeout_s;
    o.init_timeout_s = 60;
    return dt_comm_init(world, &o);
}

/* The PLAN "split:..." program (see the top). */
static int split(const char *url, int rank, int size, const char *colours, double timeout_s)
{
    const int colour = colour_of(colours, rank);
    dt_comm *world = NULL, *group = NULL;
    float x[1000];
    peer p = {.rank = rank, .size = size};
    dt_status st = join_world(&world, url, rank, size, timeout_s);
    if (st == DT_OK)
        st = dt_comm_split(world, colour, rank, &group);
    if (st == DT_OK && group) {
        fill(x, DT_F32, 1000, seed_of(&p, 1));
        if ((st = dt_allreduce(group, x, 1000, DT_F32, DT_SUM)) == DT_OK)
            print_sha(1, x, sizeof x);
        else
            fprintf(stderr, "gloo_peer: group: %s\n", dt_comm_error(group));
    }
    if (st == DT_OK) {
        fill(x, DT_F32, 1000, seed_of(&p, 2));
        if ((st = dt_allreduce(world, x, 1000, DT_F32, DT_SUM)) == DT_OK)
            print_sha(2, x, sizeof x);
    }
    if (st != DT_OK && world)
        fprintf(stderr, "gloo_peer: %s\n", dt_comm_error(world));
    dt_comm_destroy(group);
    dt_comm_destroy(world);
    return st == DT_OK ? 0 : 1;
}

/* Waits for both works (each NULL or posted), the first error kept. */
static dt_status wait_both(dt_work *a, dt_work *b, dt_status st)
{
    dt_status sa = a ? dt_work_wait(a) : st, sb = b ? dt_work_wait(b) : st;
    return st != DT_OK ? st : sa != DT_OK ? sa : sb;
}

/* The PLAN "sendrecv" program (see the top). */
static dt_status sendrecv_lines(dt_comm *c, const peer *p)
{
    enum { RING = 262145, N = 1000 };
    const int r = p->rank, n = p->size, last = n - 1;
    float *ring_out = malloc(RING * sizeof *ring_out), *ring_in = calloc(RING, sizeof *ring_in);
    float sum[N];
    int64_t late[N] = {0};
    int32_t *blocks = calloc((size_t)n * N, sizeof *blocks);
    dt_work *s = NULL, *v = NULL;
    fill(ring_out, DT_F32, RING, seed_of(p, 1));
    dt_status st = dt_send_async(c, ring_out, RING, DT_F32, (r + 1) % n, 5, &s);
    if (st == DT_OK)
        st = dt_recv_async(c, ring_in, RING, DT_F32, (r + n - 1) % n, 5, NULL, &v);
    if ((st = wait_both(s, v, st)) == DT_OK)
        print_sha(1, ring_in, RING * sizeof *ring_in);
    v = NULL;
    if (st == DT_OK && r == 0)
        st = dt_recv_async(c, late, N, DT_I64, last, 11, NULL, &v);
    fill(sum, DT_F32, N, seed_of(p, 2));
    if (st == DT_OK && (st = dt_allreduce(c, sum, N, DT_F32, DT_SUM)) == DT_OK)
        print_sha(2, sum, sizeof sum);
    if (st == DT_OK && r == last) {
        fill(late, DT_I64, N, seed_of(p, 3));
        st = dt_send(c, late, N, DT_I64, 0, 11);
    }
    if ((st = wait_both(v, NULL, st)) == DT_OK && r == 0)
        print_sha(3, late, sizeof late);
    for (int k = 1; k < n && st == DT_OK && r == 0; k++) {
        int32_t got[N];
        int from = -1;
        if ((st = dt_recv(c, got, N, DT_I32, DT_ANY_SOURCE, 9, &from)) == DT_OK)
            memcpy(blocks + (size_t)from * N, got, sizeof got);
    }
    if (st == DT_OK && r > 0) {
        fill(blocks, DT_I32, N, seed_of(p, 4));
        st = dt_send(c, blocks, N, DT_I32, 0, 9);
    } else if (st == DT_OK) {
        print_sha(4, blocks, (size_t)n * N * sizeof *blocks);
    }
    fill(sum, DT_F32, N, seed_of(p, 5));
    if (st == DT_OK && (st = dt_allreduce(c, sum, N, DT_F32, DT_SUM)) == DT_OK)
        print_sha(5, sum, sizeof sum);
    free(ring_out);
    free(ring_in);
    free(blocks);
    return st;
}

static int sendrecv(const char *url, int rank, int size, double timeout_s)
{
    dt_comm *world = NULL;
    peer p = {.rank = rank, .size = size};
    dt_status st = join_world(&world, url, rank, size, timeout_s);
    if (st == DT_OK)
        st = sendrecv_lines(world, &p);
    if (st != DT_OK && world)
        fprintf(stderr, "gloo_peer: %s\n", dt_comm_error(world));
    dt_comm_destroy(world);
    return st == DT_OK ? 0 : 1;
}

static int abort_plan(const char *url, int rank, int size, double timeout_s)
{
    dt_comm *world = NULL;
    float x[4] = {0}, y[4] = {0};
    dt_work *recv = NULL, *sum = NULL;
    dt_status st = join_world(&world, url, rank, size, timeout_s), s1 = st, s2 = st;
    if (st == DT_OK && (st = dt_recv_async(world, x, 4, DT_F32, 1, 3, NULL, &recv)) == DT_OK)
        st = dt_allreduce_async(world, y, 4, DT_F32, DT_SUM, &sum);
    if (recv) {
        usleep(300 * 1000); /* the all-reduce and the torch ranks are waiting by now */
        dt_comm_abort(world, "gloo_peer's abort plan");
        s1 = dt_work_wait(recv);
        s2 = sum ? dt_work_wait(sum) : st;
    }
    const char *e = world ? dt_comm_error(world) : "out of memory";
    fprintf(stderr, "gloo_peer: receive %s, all-reduce %s: %s\n", dt_status_name(s1),
            dt_status_name(s2), e);
    int ok = s1 == DT_EABORTED && s2 == DT_EABORTED && strstr(e, "aborted: gloo_peer's abort plan");
    dt_comm_destroy(world);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: gloo_peer URL RANK SIZE PLAN TIMEOUT_S\n");
        return 2;
    }
    peer p = {.rank = atoi(argv[2]), .size = atoi(argv[3])};
    const char *url = argv[1];
    if (strncmp(argv[4], "split:", 6) == 0)
        return split(url, p.rank, p.size, argv[4] + 6, atof(argv[5]));
    if (strcmp(argv[4], "sendrecv") == 0)
        return sendrecv(url, p.rank, p.size, atof(argv[5]));
    if (strcmp(argv[4], "abort") == 0)
        return abort_plan(url, p.rank, p.size, atof(argv[5]));
    dt_store_server *server = NULL;
    char err[512];
    if (p.rank == 0 && strncmp(url, "tcp://", 6) == 0) {
        char host[256];
        int port = 0;
        if (sscanf(url + 6, "%255[^:]:%d", host, &port) != 2 ||
            dt_store_server_start(&server, host, port, err, sizeof err) != DT_OK) {
            fprintf(stderr, "gloo_peer: serving %s: %s\n", url, err);
            return 1;
        }
    }
    dt_store *store = NULL;
    if (dt_store_open(&store, url, "") != DT_OK) {
        fprintf(stderr, "gloo_peer: %s\n", dt_store_error(store));
        return 1;
    }
    gloo_config cfg = {.rank = p.rank,
                       .size = p.size,
                       .host = "127.0.0.1",
                       .timeout_s = atof(argv[5]),
                       .init_timeout_s = 60};
    int rc = 0;
    if (comm_gloo_connect(&p.ctx, store, &cfg, err, sizeof err) != DT_OK) {
        fprintf(stderr, "gloo_peer: %s\n", err);
        rc = 1;
    }
    FILE *plan = rc ? NULL : fopen(argv[4], "r");
    char text[256];
    for (int line = 1; plan && fgets(text, sizeof text, plan); line++)
        if (run_line(&p, line, text) != DT_OK) {
            fprintf(stderr, "gloo_peer: line %d: %s\n", line, comm_gloo_error(p.ctx));
            rc = 1;
            break;
        }
    if (plan)
        fclose(plan);
    comm_gloo_destroy(p.ctx);
    dt_store_close(store);
    if (server)
        dt_store_server_stop(server);
    return rc;
}
