/*
 * test_store_ops.c — a store of the caller's functions (dt_store_open_ops)
 * and a communicator that rendezvouses through one (options.store): what a
 * torch.distributed backend does with the store torch hands it. The
 * caller's store here is a table in memory behind a mutex, shared by ranks
 * running as threads.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dt_comm.h"

#define MEM_KEYS 64

/* The caller's store: keys and values in memory, waits on a condition. */
typedef struct mem_store {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
    char *key[MEM_KEYS];
    char *val[MEM_KEYS];
    size_t len[MEM_KEYS];
    int calls; /* how many times the table was called */
} mem_store;

static int find(mem_store *m, const char *key)
{
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->key[i], key) == 0)
            return i;
    return -1;
}

static void put(mem_store *m, const char *key, const void *val, size_t len)
{
    int i = find(m, key);
    if (i < 0) {
        cr_assert_lt(m->n, MEM_KEYS);
        i = m->n++;
        m->key[i] = strdup(key);
    } else {
        free(m->val[i]);
    }
    m->val[i] = malloc(len + 1);
    memcpy(m->val[i], val, len);
    m->val[i][len] = 0;
    m->len[i] = len;
    pthread_cond_broadcast(&m->cv);
}

static void *copy(const void *p, size_t n)
{
    char *c = malloc(n + 1);
    memcpy(c, p, n);
    c[n] = 0;
    return c;
}

static dt_status mem_set(void *u, const char *key, const void *val, size_t len, char *err,
                         size_t errlen)
{
    (void)err, (void)errlen;
    mem_store *m = u;
    pthread_mutex_lock(&m->mu);
    m->calls++;
    put(m, key, val, len);
    pthread_mutex_unlock(&m->mu);
    return DT_OK;
}

/* Waits until every key exists; holds m->mu. */
static dt_status wait_locked(mem_store *m, const char *const *keys, int n, double timeout_s,
                             char *err, size_t errlen)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)timeout_s;
    until.tv_nsec += (long)((timeout_s - (double)(time_t)timeout_s) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    for (int i = 0; i < n; i++)
        while (find(m, keys[i]) < 0)
            if (timeout_s <= 0 || pthread_cond_timedwait(&m->cv, &m->mu, &until) != 0) {
                snprintf(err, errlen, "memory store: no key '%s' within %g s", keys[i], timeout_s);
                return DT_ETIMEDOUT;
            }
    return DT_OK;
}

static dt_status mem_get(void *u, const char *key, double timeout_s, void **val, size_t *len,
                         char *err, size_t errlen)
{
    mem_store *m = u;
    pthread_mutex_lock(&m->mu);
    m->calls++;
    dt_status st = wait_locked(m, &key, 1, timeout_s, err, errlen);
    if (st == DT_OK) {
        int i = find(m, key);
        *val = copy(m->val[i], m->len[i]);
        *len = m->len[i];
    }
    pthread_mutex_unlock(&m->mu);
    return st;
}

static dt_status mem_wait(void *u, const char *const *keys, int n, double timeout_s, char *err,
                          size_t errlen)
{
    mem_store *m = u;
    pthread_mutex_lock(&m->mu);
    m->calls++;
    dt_status st = wait_locked(m, keys, n, timeout_s, err, errlen);
    pthread_mutex_unlock(&m->mu);
    return st;
}

static dt_status mem_check(void *u, const char *const *keys, int n, bool *all, char *err,
                           size_t errlen)
{
    (void)err, (void)errlen;
    mem_store *m = u;
    pthread_mutex_lock(&m->mu);
    m->calls++;
    *all = true;
    for (int i = 0; i < n; i++)
        *all = *all && find(m, keys[i]) >= 0;
    pthread_mutex_unlock(&m->mu);
    return DT_OK;
}

static dt_status mem_add(void *u, const char *key, int64_t delta, int64_t *result, char *err,
                         size_t errlen)
{
    (void)err, (void)errlen;
    mem_store *m = u;
    pthread_mutex_lock(&m->mu);
    m->calls++;
    int i = find(m, key);
    long long now = (i >= 0 ? atoll(m->val[i]) : 0) + delta;
    char text[32];
    int n = snprintf(text, sizeof text, "%lld", now);
    put(m, key, text, (size_t)n);
    *result = now;
    pthread_mutex_unlock(&m->mu);
    return DT_OK;
}

static dt_status mem_compare_set(void *u, const char *key, const void *expected, size_t elen,
                                 const void *desired, size_t dlen, void **now, size_t *nlen,
                                 char *err, size_t errlen)
{
    (void)err, (void)errlen;
    mem_store *m = u;
    pthread_mutex_lock(&m->mu);
    m->calls++;
    int i = find(m, key);
    bool match = i < 0 ? elen == 0 : m->len[i] == elen && memcmp(m->val[i], expected, elen) == 0;
    if (match)
        put(m, key, desired, dlen);
    i = find(m, key);
    *now = i >= 0 ? copy(m->val[i], m->len[i]) : copy(expected, elen);
    *nlen = i >= 0 ? m->len[i] : elen;
    pthread_mutex_unlock(&m->mu);
    return DT_OK;
}

static const dt_store_ops mem_ops = {mem_set, mem_get,         mem_wait, mem_check,
                                     mem_add, mem_compare_set, NULL,     NULL};

static void mem_init(mem_store *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
}

static void mem_free(mem_store *m)
{
    for (int i = 0; i < m->n; i++) {
        free(m->key[i]);
        free(m->val[i]);
    }
}

Test(store_ops, every_operation_is_one_call_of_the_table_with_the_key_scoped_by_the_job)
{
    mem_store m;
    mem_init(&m);
    dt_store *s = NULL;
    cr_assert_eq(dt_store_open_ops(&s, &mem_ops, &m, "memory store", "job7"), DT_OK);
    cr_assert_eq(dt_store_set(s, "a", "xyz", 3), DT_OK, "%s", dt_store_error(s));
    cr_expect_eq(find(&m, "job7/a"), 0, "the key reaches the table as <job>/<key>");
    void *v = NULL;
    size_t n = 0;
    cr_assert_eq(dt_store_get(s, "a", &v, &n, 1.0), DT_OK, "%s", dt_store_error(s));
    cr_expect(n == 3 && strcmp(v, "xyz") == 0);
    free(v);
    int64_t r = 0;
    cr_assert_eq(dt_store_add(s, "c", 5, &r), DT_OK);
    cr_assert_eq(dt_store_add(s, "c", -2, &r), DT_OK);
    cr_expect_eq(r, 3);
    cr_assert_eq(dt_store_compare_set(s, "d", NULL, 0, "new", 3, &v, &n), DT_OK);
    cr_expect(n == 3 && memcmp(v, "new", 3) == 0, "absent and nothing expected: set");
    free(v);
    cr_expect_eq(m.calls, 5, "one call of the table per operation, nothing cached");
    dt_store_close(s);
    mem_free(&m);
}

Test(store_ops, a_missing_key_times_out_with_the_tables_message)
{
    mem_store m;
    mem_init(&m);
    dt_store *s = NULL;
    cr_assert_eq(dt_store_open_ops(&s, &mem_ops, &m, "memory store", "job"), DT_OK);
    void *v = NULL;
    size_t n = 0;
    cr_expect_eq(dt_store_get(s, "nobody", &v, &n, 0), DT_ETIMEDOUT);
    cr_expect(strstr(dt_store_error(s), "memory store") && strstr(dt_store_error(s), "job/nobody"),
              "the message names the store and the key: %s", dt_store_error(s));
    bool deleted;
    cr_expect_eq(dt_store_delete(s, "x", &deleted), DT_EINVAL, "the table has no delete_key");
    dt_store_close(s);
    mem_free(&m);
}

Test(store_ops, a_table_without_set_is_refused_at_open)
{
    dt_store_ops bad = mem_ops;
    bad.set = NULL;
    dt_store *s = NULL;
    cr_expect_eq(dt_store_open_ops(&s, &bad, NULL, "memory store", "job"), DT_EINVAL);
    cr_expect(strstr(dt_store_error(s), "set"), "%s", dt_store_error(s));
    dt_store_close(s);
}

/* ---- a communicator through the caller's store ---------------------------- */

#define RANKS 3

typedef struct rank_arg {
    mem_store *m;
    int rank;
    dt_status st;
    float sum;
    char err[512];
} rank_arg;

static void *rank_main(void *p)
{
    rank_arg *a = p;
    dt_store *s = NULL;
    a->st = dt_store_open_ops(&s, &mem_ops, a->m, "memory store", "torch");
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = a->rank;
    o.world_size = RANKS;
    o.store = s; /* no init_url, no secret: rank 0 shares one through the store */
    o.init_timeout_s = 20;
    o.timeout_s = 20;
    dt_comm *c = NULL;
    if (a->st == DT_OK)
        a->st = dt_comm_init(&c, &o);
    dt_store_close(s); /* the communicator no longer needs it */
    float x = (float)(a->rank + 1);
    if (a->st == DT_OK)
        a->st = dt_allreduce(c, &x, 1, DT_F32, DT_SUM);
    a->sum = x;
    snprintf(a->err, sizeof a->err, "%s", c ? dt_comm_error(c) : "no communicator");
    dt_comm_destroy(c);
    return NULL;
}

Test(store_ops, ranks_rendezvous_through_the_callers_store_and_run_collectives, .timeout = 60)
{
    mem_store m;
    mem_init(&m);
    pthread_t t[RANKS];
    rank_arg a[RANKS];
    for (int r = 0; r < RANKS; r++) {
        a[r] = (rank_arg){.m = &m, .rank = r};
        pthread_create(&t[r], NULL, rank_main, &a[r]);
    }
    for (int r = 0; r < RANKS; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < RANKS; r++) {
        cr_expect_eq(a[r].st, DT_OK, "rank %d: %s", r, a[r].err);
        cr_expect_eq(a[r].sum, 6.0f, "rank %d: 1 + 2 + 3", r);
    }
    cr_expect(find(&m, "torch/addr/0") >= 0, "the addresses went through the caller's store");
    mem_free(&m);
}
