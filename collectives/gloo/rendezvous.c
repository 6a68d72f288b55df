/*
 * rendezvous.c — joining a torch 1.13 gloo process group through the store.
 *
 * torch's init_process_group(backend="gloo") is, on the store (keys in
 * torch's key space, i.e. a dtrain store opened with job id ""):
 *
 *   1. SET  default_pg/<g>/0/rank_<r> = hostname; GET rank_<i> for i < r
 *   2. listen once per peer (pair.c); SET default_pg/<g>/0/<r> = the p-1
 *      136-byte addresses, peer i's at index i (i < r) or i-1 (i > r)
 *   3. for each peer i ascending: GET default_pg/<g>/0/<i>, take this
 *      rank's entry, connect or accept by gloo's rule
 *   4. the store barrier: ADD default_pg/store_based_barrier_key:<g+1> by 1,
 *      exactly once, then ADD 0 every 10 ms until it equals the number of
 *      ranks of the world (torch waits for `==`, so a second +1 would hang
 *      it)
 *   5. rank 0 SETs default_pg/<g>/SEQ_NUM_STORE_KEY (8 bytes LE; torch's
 *      value 1 + rand() = 0x6B8B4568); the others wait for it
 *
 * Group g > 0 is torch's new_group number g ("1", "2", ... in creation
 * order). Every rank of the world joins its barrier, members or not; a
 * non-member does step 4 alone. A new group makes no new TCPStore client,
 * so it counts nothing under "init/".
 *
 * On a tcp:// or env:// store each TCPStore client also adds 1 to the raw
 * key "init/" once, and a torch rank 0 that hosts the store waits for the
 * count: dtrain does the same. Here every peer's address is read first
 * and every connection then made at once (torch makes them one by one);
 * the connections are the same, and no wait can form a cycle because
 * every rank publishes before it reads. From the moment it listens until
 * the rendezvous ends, a rank runs its loop while it waits on the store,
 * so its listeners accept and vet connections meanwhile (held.c).
 *
 * Cost: O(p) store operations, p-1 connections per rank, and a barrier
 * that polls the store every 10 ms.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dt_clock.h"
#include "gloo.h"
#include "store_internal.h"

#define SEQ_VALUE 0x6B8B4568ull /* torch's 1 + rand() with glibc's unseeded rand */
#define BARRIER_POLL_S 0.01

static dt_status store_fail(gloo_ctx *c, dt_store *s, dt_status st, const char *doing)
{
    return comm_gloo_fail(c, st == DT_ETIMEDOUT ? DT_ETIMEDOUT : DT_ESTORE, "gloo rank %d: %s: %s",
                          c->rank, doing, dt_store_error(s));
}

static void key(char *out, size_t cap, const gloo_config *cfg, const char *name)
{
    snprintf(out, cap, "default_pg/%d/0/%s", cfg->group, name);
}

/* Steps 1 and 2: hostnames, then listen and publish the addresses. */
static dt_status publish(gloo_ctx *c, dt_store *s, const gloo_config *cfg)
{
    char k[128], host[256] = "";
    gethostname(host, sizeof host - 1);
    snprintf(k, sizeof k, "default_pg/%d/0/rank_%d", cfg->group, c->rank);
    if (dt_store_set(s, k, host, strlen(host)) != DT_OK)
        return store_fail(c, s, DT_ESTORE, "publishing the hostname");
    for (int i = 0; i < c->rank; i++) {
        void *v = NULL;
        size_t n;
        snprintf(k, sizeof k, "default_pg/%d/0/rank_%d", cfg->group, i);
        dt_status st = dt_store_get(s, k, &v, &n, c->init_timeout_s);
        free(v);
        if (st != DT_OK)
            return store_fail(c, s, st, "reading a lower rank's hostname");
    }
    uint8_t *all = malloc((size_t)(c->size - 1) * GLOO_ADDRESS_BYTES);
    if (!all)
        return comm_gloo_fail(c, DT_ENOMEM, "gloo rank %d: out of memory", c->rank);
    for (int i = 0, at = 0; i < c->size; i++) {
        if (i == c->rank)
            continue;
        if (comm_gloo_pair_listen(&c->pairs[i], cfg->host) != DT_OK) {
            free(all);
            return c->failed;
        }
        comm_gloo_pair_address(&c->pairs[i], all + (size_t)at++ * GLOO_ADDRESS_BYTES);
    }
    char name[16];
    snprintf(name, sizeof name, "%d", c->rank);
    key(k, sizeof k, cfg, name);
    dt_status st = dt_store_set(s, k, all, (size_t)(c->size - 1) * GLOO_ADDRESS_BYTES);
    free(all);
    return st == DT_OK ? DT_OK : store_fail(c, s, st, "publishing the addresses");
}

/* A store get that keeps the listeners accepting and vetting connections
 * (held.c) while it waits, so a stranger is named at once, not when the
 * last peer has published. */
static dt_status get_listening(gloo_ctx *c, dt_store *s, const char *k, uint8_t **v, size_t *n)
{
    double deadline = dt_now() + c->init_timeout_s;
    for (;;) {
        bool there = false;
        dt_status st = dt_store_check(s, &k, 1, &there);
        if (st != DT_OK || there)
            return st != DT_OK ? st : dt_store_get(s, k, (void **)v, n, c->init_timeout_s);
        if (dt_now() > deadline)
            return comm_gloo_fail(c, DT_ETIMEDOUT,
                                  "gloo rank %d: timed out after %g s waiting for the store key "
                                  "%s: that rank has not published its addresses",
                                  c->rank, c->init_timeout_s, k);
        comm_gloo_idle(c, BARRIER_POLL_S);
        if (c->failed != DT_OK)
            return c->failed;
    }
}

/* Step 3: every peer's address for this rank, then connect or accept. */
static dt_status connect_all(gloo_ctx *c, dt_store *s, const gloo_config *cfg)
{
    for (int i = 0; i < c->size; i++) {
        if (i == c->rank)
            continue;
        char k[128], name[16];
        snprintf(name, sizeof name, "%d", i);
        key(k, sizeof k, cfg, name);
        uint8_t *v = NULL;
        size_t n = 0;
        dt_status st = get_listening(c, s, k, &v, &n);
        if (st != DT_OK)
            return store_fail(c, s, st, "reading a peer's addresses");
        if (n != (size_t)(c->size - 1) * GLOO_ADDRESS_BYTES) {
            free(v);
            return comm_gloo_fail(c, DT_EPROTO,
                                  "gloo rank %d: rank %d published %zu bytes of addresses, not "
                                  "%d × 136: another world size, or not torch 1.13's gloo",
                                  c->rank, i, n, c->size - 1);
        }
        size_t entry = (size_t)(c->rank > i ? c->rank - 1 : c->rank);
        st = comm_gloo_pair_connect(&c->pairs[i], v + entry * GLOO_ADDRESS_BYTES);
        free(v);
        if (st != DT_OK)
            return st;
    }
    return comm_gloo_wait_connected(c);
}

/* Steps 4 and 5. */
static dt_status barrier_and_seq(gloo_ctx *c, dt_store *s, const gloo_config *cfg)
{
    char k[128];
    snprintf(k, sizeof k, "default_pg/store_based_barrier_key:%d", cfg->group + 1);
    const int want = cfg->barrier_size > 0 ? cfg->barrier_size : c->size;
    int64_t count = 0;
    if (dt_store_add(s, k, 1, &count) != DT_OK)
        return store_fail(c, s, DT_ESTORE, "joining the store barrier");
    double deadline = dt_now() + c->init_timeout_s;
    while (count != want) {
        if (count > want)
            return comm_gloo_fail(c, DT_EPROTO,
                                  "gloo rank %d: the store barrier %s counts %lld ranks, more "
                                  "than the %d of the world",
                                  c->rank, k, (long long)count, want);
        if (dt_now() > deadline)
            return comm_gloo_fail(c, DT_ETIMEDOUT,
                                  "gloo rank %d: timed out after %g s in the store barrier %s: "
                                  "%lld of %d ranks arrived",
                                  c->rank, c->init_timeout_s, k, (long long)count, want);
        if (c->pairs) { /* meanwhile the listeners accept and vet (held.c) */
            comm_gloo_idle(c, BARRIER_POLL_S);
            if (c->failed != DT_OK)
                return c->failed;
        } else {
            struct timespec pause = {0, (long)(BARRIER_POLL_S * 1e9)};
            nanosleep(&pause, NULL);
        }
        if (dt_store_add(s, k, 0, &count) != DT_OK)
            return store_fail(c, s, DT_ESTORE, "polling the store barrier");
    }
    if (c->rank < 0) /* not a member: the barrier was all */
        return DT_OK;
    snprintf(k, sizeof k, "default_pg/%d/SEQ_NUM_STORE_KEY", cfg->group);
    if (c->rank == 0) {
        uint8_t v[8];
        for (int i = 0; i < 8; i++)
            v[i] = (uint8_t)(SEQ_VALUE >> (8 * i));
        if (dt_store_set(s, k, v, sizeof v) != DT_OK)
            return store_fail(c, s, DT_ESTORE, "setting the sequence number");
        return DT_OK;
    }
    void *v = NULL;
    size_t n;
    dt_status st = dt_store_get(s, k, &v, &n, c->init_timeout_s);
    free(v);
    return st == DT_OK ? DT_OK : store_fail(c, s, st, "reading the sequence number");
}

static dt_status count_tcp_client(gloo_ctx *c, dt_store *s, const gloo_config *cfg)
{
    if (!s->tcp || cfg->group > 0)
        return DT_OK;
    char err[256];
    int64_t ignored;
    if (comm_tcp_client_add(s->tcp, "init/", 1, &ignored, err, sizeof err) != DT_OK)
        return comm_gloo_fail(c, DT_ESTORE, "gloo rank %d: counting in at the TCP store: %s",
                              c->rank, err);
    return DT_OK;
}

static dt_status setup(gloo_ctx *c, const gloo_config *cfg)
{
    c->rank = cfg->rank;
    c->size = cfg->size;
    c->first_gone = -1;
    c->timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 1800.0; /* torch's default */
    c->init_timeout_s = cfg->init_timeout_s > 0 ? cfg->init_timeout_s : c->timeout_s;
    c->note = cfg->note;
    c->note_arg = cfg->note_arg;
    if (cfg->rank == -1 && cfg->group > 0)
        return DT_OK; /* not a member: no pairs, only the barrier */
    if (cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size)
        return comm_gloo_fail(c, DT_EINVAL, "gloo: rank %d of world size %d is not a rank",
                              cfg->rank, cfg->size);
    c->pairs = calloc((size_t)c->size, sizeof *c->pairs);
    if (!c->pairs || uv_loop_init(&c->loop) != 0) {
        free(c->pairs);
        c->pairs = NULL;
        return comm_gloo_fail(c, DT_ENOMEM, "gloo rank %d: out of memory", c->rank);
    }
    uv_timer_init(&c->loop, &c->timer);
    c->timer.data = c;
    comm_gloo_waker_init(c);
    for (int i = 0; i < 4; i++)
        atomic_init(&c->traffic[i], 0);
    for (int i = 0; i < c->size; i++)
        c->pairs[i] = (gloo_pair){.ctx = c, .peer = i};
    return DT_OK;
}

dt_status comm_gloo_connect(gloo_ctx **out, dt_store *store, const gloo_config *cfg, char *err,
                            size_t errlen)
{
    gloo_ctx *c = calloc(1, sizeof *c);
    *out = c;
    if (!c) {
        snprintf(err, errlen, "gloo: out of memory");
        return DT_ENOMEM;
    }
    dt_status st = setup(c, cfg);
    if (st == DT_OK && c->size > 1 && c->rank >= 0 &&
        (st = count_tcp_client(c, store, cfg)) == DT_OK && (st = publish(c, store, cfg)) == DT_OK)
        st = connect_all(c, store, cfg);
    if (st == DT_OK && store) /* a world of one has no store, and no one to wait for */
        st = barrier_and_seq(c, store, cfg);
    comm_gloo_held_joined(c);
    if (st != DT_OK)
        snprintf(err, errlen, "%s", c->err);
    return st;
}

void comm_gloo_traffic(gloo_ctx *c, uint64_t out[4])
{
    for (int i = 0; i < 4; i++)
        out[i] = atomic_load_explicit(&c->traffic[i], memory_order_relaxed);
}

void comm_gloo_destroy(gloo_ctx *c)
{
    if (!c)
        return;
    if (c->pairs) {
        comm_gloo_close_all(c);
        uv_close((uv_handle_t *)&c->timer, NULL);
        uv_close((uv_handle_t *)&c->waker, NULL);
        uv_run(&c->loop, UV_RUN_DEFAULT); /* every close callback has run */
        uv_loop_close(&c->loop);
        for (int i = 0; i < c->size; i++) {
            comm_gloo_match_free(&c->pairs[i]);
            comm_gloo_wire_drop(&c->pairs[i]);
            comm_gloo_wire_early_free(&c->pairs[i]);
        }
        free(c->pairs);
    }
    while (c->any) {
        gloo_any_recv *next = c->any->next;
        free(c->any);
        c->any = next;
    }
    free(c);
}

const char *comm_gloo_error(const gloo_ctx *c)
{
    return c->err;
}
