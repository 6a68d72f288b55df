/*
 * test_store_keys.c — the store's operations on its set of keys (check,
 * delete, num_keys, compare_set), as PyTorch's Store has them, on a
 * file:// store and on a tcp:// one: each behaviour is checked on both.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dt_comm.h"

/* A fresh store of either kind, and a second handle on it. */
typedef struct kind {
    char url[160];
    dt_store_server *srv; /* tcp:// only */
} kind;

static kind make(bool tcp, const char *tag)
{
    static int counter; /* one test process each: no sharing */
    kind k = {0};
    if (tcp) {
        char err[256];
        cr_assert_eq(dt_store_server_start(&k.srv, "127.0.0.1", 0, err, sizeof err), DT_OK, "%s",
                     err);
        snprintf(k.url, sizeof k.url, "tcp://127.0.0.1:%d", dt_store_server_port(k.srv));
    } else {
        snprintf(k.url, sizeof k.url, "file:///tmp/dt-store-keys-%d-%d-%s", (int)getpid(),
                 counter++, tag);
        unlink(k.url + 7);
    }
    return k;
}

static dt_store *open_on(const kind *k, const char *job)
{
    dt_store *s = NULL;
    cr_assert_eq(dt_store_open(&s, k->url, job), DT_OK, "%s", dt_store_error(s));
    return s;
}

static void done(kind *k)
{
    if (k->srv)
        dt_store_server_stop(k->srv);
}

static void check_says_whether_every_key_exists(bool tcp)
{
    kind k = make(tcp, "check");
    dt_store *s = open_on(&k, "job");
    const char *keys[] = {"a", "b"};
    bool all = true;
    cr_assert_eq(dt_store_check(s, keys, 2, &all), DT_OK, "%s", dt_store_error(s));
    cr_expect(!all, "no key exists yet");
    cr_assert_eq(dt_store_set(s, "a", "1", 1), DT_OK);
    cr_assert_eq(dt_store_check(s, keys, 2, &all), DT_OK);
    cr_expect(!all, "b does not exist");
    cr_assert_eq(dt_store_set(s, "b", "2", 1), DT_OK);
    cr_assert_eq(dt_store_check(s, keys, 2, &all), DT_OK);
    cr_expect(all, "both exist");
    dt_store_close(s);
    done(&k);
}
Test(store_keys, file_check_says_whether_every_key_exists_without_waiting, .timeout = 10)
{
    check_says_whether_every_key_exists(false);
}
Test(store_keys, tcp_check_says_whether_every_key_exists_without_waiting, .timeout = 10)
{
    check_says_whether_every_key_exists(true);
}

static void delete_removes_a_key_for_every_handle(bool tcp)
{
    kind k = make(tcp, "delete");
    dt_store *a = open_on(&k, "job"), *b = open_on(&k, "job");
    cr_assert_eq(dt_store_set(a, "k", "v", 1), DT_OK);
    bool deleted = false, all = true;
    const char *key[] = {"k"};
    cr_assert_eq(dt_store_check(b, key, 1, &all), DT_OK);
    cr_assert(all);
    cr_assert_eq(dt_store_delete(a, "k", &deleted), DT_OK, "%s", dt_store_error(a));
    cr_expect(deleted, "k existed");
    cr_assert_eq(dt_store_check(b, key, 1, &all), DT_OK);
    cr_expect(!all, "the other handle still sees k");
    cr_assert_eq(dt_store_delete(b, "k", &deleted), DT_OK);
    cr_expect(!deleted, "k was deleted already");
    void *v = NULL;
    size_t n;
    cr_expect_eq(dt_store_get(b, "k", &v, &n, 0.05), DT_ETIMEDOUT);
    cr_assert_eq(dt_store_set(b, "k", "again", 5), DT_OK); /* a key can come back */
    cr_assert_eq(dt_store_get(a, "k", &v, &n, 1.0), DT_OK);
    cr_expect(n == 5 && memcmp(v, "again", 5) == 0);
    free(v);
    dt_store_close(a);
    dt_store_close(b);
    done(&k);
}
Test(store_keys, file_delete_removes_a_key_for_every_handle, .timeout = 10)
{
    delete_removes_a_key_for_every_handle(false);
}
Test(store_keys, tcp_delete_removes_a_key_for_every_handle, .timeout = 10)
{
    delete_removes_a_key_for_every_handle(true);
}

static void num_keys_counts_keys_set_and_not_deleted(bool tcp)
{
    kind k = make(tcp, "num");
    dt_store *s = open_on(&k, "job");
    int64_t n = -1;
    cr_assert_eq(dt_store_num_keys(s, &n), DT_OK, "%s", dt_store_error(s));
    cr_expect_eq(n, 0);
    cr_assert_eq(dt_store_set(s, "a", "1", 1), DT_OK);
    cr_assert_eq(dt_store_set(s, "b", "1", 1), DT_OK);
    cr_assert_eq(dt_store_set(s, "a", "2", 1), DT_OK); /* the same key again */
    cr_assert_eq(dt_store_delete(s, "b", NULL), DT_OK);
    cr_assert_eq(dt_store_num_keys(s, &n), DT_OK);
    cr_expect_eq(n, 1);
    dt_store_close(s);
    done(&k);
}
Test(store_keys, file_num_keys_counts_keys_set_and_not_deleted, .timeout = 10)
{
    num_keys_counts_keys_set_and_not_deleted(false);
}
Test(store_keys, tcp_num_keys_counts_keys_set_and_not_deleted, .timeout = 10)
{
    num_keys_counts_keys_set_and_not_deleted(true);
}

Test(store_keys, file_num_keys_counts_only_this_jobs_keys, .timeout = 10)
{
    kind k = make(false, "numjobs");
    dt_store *a = open_on(&k, "one"), *b = open_on(&k, "two");
    cr_assert_eq(dt_store_set(b, "x", "1", 1), DT_OK);
    int64_t n = -1;
    cr_assert_eq(dt_store_num_keys(a, &n), DT_OK);
    cr_expect_eq(n, 0);
    dt_store_close(a);
    dt_store_close(b);
}

/* compare_set's three answers: set (absent, nothing expected), kept (a
 * different value expected), set again (the value expected). */
static void expect_cas(dt_store *s, const char *expected, const char *desired, const char *now)
{
    void *v = NULL;
    size_t n = 0;
    cr_assert_eq(dt_store_compare_set(s, "owner", expected, strlen(expected), desired,
                                      strlen(desired), &v, &n),
                 DT_OK, "%s", dt_store_error(s));
    cr_expect(n == strlen(now) && memcmp(v, now, n) == 0,
              "compare_set('%s' -> '%s') left "
              "'%.*s', want '%s'",
              expected, desired, (int)n, (const char *)v, now);
    free(v);
}

static void compare_set_sets_only_on_a_match(bool tcp)
{
    kind k = make(tcp, "cas");
    dt_store *s = open_on(&k, "job");
    expect_cas(s, "x", "y", "x");        /* absent, "x" expected: unchanged, PyTorch answers x */
    expect_cas(s, "", "rank0", "rank0"); /* absent, nothing expected: set */
    expect_cas(s, "", "rank1", "rank0"); /* present: "" does not match */
    expect_cas(s, "rank1", "rank2", "rank0");
    expect_cas(s, "rank0", "rank3", "rank3");
    dt_store_close(s);
    done(&k);
}
Test(store_keys, file_compare_set_sets_only_on_a_match, .timeout = 10)
{
    compare_set_sets_only_on_a_match(false);
}
Test(store_keys, tcp_compare_set_sets_only_on_a_match, .timeout = 10)
{
    compare_set_sets_only_on_a_match(true);
}

typedef struct racer {
    const char *url;
    int id;
    bool won;
    dt_status st;
} racer;

static void *race(void *p)
{
    racer *r = p;
    dt_store *s = NULL;
    char me[16];
    snprintf(me, sizeof me, "rank%d", r->id);
    if ((r->st = dt_store_open(&s, r->url, "job")) == DT_OK) {
        void *v = NULL;
        size_t n = 0;
        r->st = dt_store_compare_set(s, "leader", "", 0, me, strlen(me), &v, &n);
        r->won = r->st == DT_OK && n == strlen(me) && memcmp(v, me, n) == 0;
        free(v);
    }
    dt_store_close(s);
    return NULL;
}

static void one_of_8_racers_wins(bool tcp)
{
    kind k = make(tcp, "race");
    dt_store *keep = open_on(&k, "job"); /* holds the file across the racers */
    racer r[8];
    pthread_t t[8];
    for (int i = 0; i < 8; i++) {
        r[i] = (racer){.url = k.url, .id = i};
        pthread_create(&t[i], NULL, race, &r[i]);
    }
    int winners = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        cr_expect_eq(r[i].st, DT_OK, "racer %d", i);
        winners += r[i].won;
    }
    cr_expect_eq(winners, 1, "%d racers won", winners);
    dt_store_close(keep);
    done(&k);
}
Test(store_keys, file_compare_set_from_8_threads_elects_exactly_one, .timeout = 20)
{
    one_of_8_racers_wins(false);
}
Test(store_keys, tcp_compare_set_from_8_threads_elects_exactly_one, .timeout = 20)
{
    one_of_8_racers_wins(true);
}
