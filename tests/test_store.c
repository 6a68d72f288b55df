/*
 * test_store.c — the rendezvous store's behaviour, one test per promise.
 *
 * Ranks are played by threads (each with its own dt_store handle, as real
 * ranks in one process would have) and, once, by forked processes. Every
 * test uses its own file under /tmp (pid + counter + name), so suites may
 * run side by side. Helper threads never assert: they record what happened
 * and the test thread checks it, because a Criterion assertion must fail on
 * the test's own thread. Waits are bounded by store timeouts and by each
 * test's .timeout, so a bug fails instead of hanging.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dt_comm.h"

/* ---- helpers --------------------------------------------------------------- */

typedef struct test_file {
    char path[200];
    char url[220];
} test_file;

static test_file unique_file(const char *tag)
{
    static atomic_uint counter; /* test-local: only names files */
    test_file f;
    snprintf(f.path, sizeof f.path, "/tmp/dt-store-test-%d-%u-%s", (int)getpid(),
             atomic_fetch_add(&counter, 1), tag);
    snprintf(f.url, sizeof f.url, "file://%s", f.path);
    unlink(f.path);
    return f;
}

static void write_bytes(const char *path, const void *buf, size_t n, int flags)
{
    int fd = open(path, O_WRONLY | O_CREAT | flags, 0600);
    cr_assert(fd >= 0, "open %s: %s", path, strerror(errno));
    cr_assert_eq(write(fd, buf, n), (ssize_t)n);
    close(fd);
}

/* Reads a whole file into a malloc'ed buffer; *n gets its size. */
static uint8_t *read_bytes(const char *path, size_t *n)
{
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "stat %s: %s", path, strerror(errno));
    uint8_t *buf = malloc((size_t)st.st_size + 1);
    int fd = open(path, O_RDONLY);
    cr_assert(fd >= 0);
    cr_assert_eq(read(fd, buf, (size_t)st.st_size), st.st_size);
    close(fd);
    *n = (size_t)st.st_size;
    return buf;
}

/* Appends one record in PyTorch FileStore's layout, as a dead job left it. */
static void append_raw_record(const char *path, const char *key, const char *val)
{
    uint32_t kl = (uint32_t)strlen(key), vl = (uint32_t)strlen(val);
    uint8_t rec[256];
    memcpy(rec, &kl, 4);
    memcpy(rec + 4, key, kl);
    memcpy(rec + 4 + kl, &vl, 4);
    memcpy(rec + 8 + kl, val, vl);
    write_bytes(path, rec, 8 + kl + vl, O_APPEND);
}

static dt_store *open_ok(const test_file *f, const char *job)
{
    dt_store *s = NULL;
    dt_status st = dt_store_open(&s, f->url, job);
    cr_assert_not_null(s);
    cr_assert_eq(st, DT_OK, "open %s: %s", f->url, dt_store_error(s));
    return s;
}

static void expect_value(dt_store *s, const char *key, const char *want)
{
    void *val = NULL;
    size_t len = 0;
    dt_status st = dt_store_get(s, key, &val, &len, 5.0);
    cr_assert_eq(st, DT_OK, "get %s: %s", key, dt_store_error(s));
    cr_assert_eq(len, strlen(want));
    cr_assert_str_eq(val, want);
    free(val);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- values -------------------------------------------------------------------- */

Test(store, set_then_get_returns_binary_value_with_nul_after_it, .timeout = 10)
{
    test_file f = unique_file("roundtrip");
    dt_store *s = open_ok(&f, "job");
    const uint8_t val[] = {0, 1, 2, 0, 255, 'x'};
    cr_assert_eq(dt_store_set(s, "blob", val, sizeof val), DT_OK, "%s", dt_store_error(s));
    void *got = NULL;
    size_t len = 0;
    cr_assert_eq(dt_store_get(s, "blob", &got, &len, 1.0), DT_OK);
    cr_assert_eq(len, sizeof val);
    cr_assert_arr_eq(got, val, sizeof val);
    cr_assert_eq(((uint8_t *)got)[len], 0);
    free(got);
    cr_assert_eq(dt_store_set(s, "blob", "v2", 2), DT_OK);
    expect_value(s, "blob", "v2"); /* last write wins */
    dt_store_close(s);
}

Test(store, set_writes_pytorch_filestore_record_layout, .timeout = 10)
{
    test_file f = unique_file("layout");
    dt_store *s = open_ok(&f, "j1");
    cr_assert_eq(dt_store_set(s, "k", "abc", 3), DT_OK);
    size_t n;
    uint8_t *raw = read_bytes(f.path, &n);
    uint32_t kl = 4, vl = 3;
    uint8_t want[4 + 4 + 4 + 3];
    memcpy(want, &kl, 4);
    memcpy(want + 4, "j1/k", 4);
    memcpy(want + 8, &vl, 4);
    memcpy(want + 12, "abc", 3);
    /* the last record; before it, the handle's count in PyTorch's
     * "refcount/" (store_torch.c) */
    cr_assert_geq(n, sizeof want);
    cr_assert_arr_eq(raw + n - sizeof want, want, sizeof want);
    cr_assert(memmem(raw, n, "refcount/", 9), "the handle is not counted in refcount/");
    free(raw);
    dt_store_close(s);
}

/* ---- waiting ------------------------------------------------------------------- */

typedef struct late_setter {
    const test_file *file;
    const char *keys[4];
    int nkeys;
    dt_status status;
    char error[512];
} late_setter;

/* Opens its own handle, sleeps a little, then sets every key to "v". */
static void *set_keys_later(void *arg)
{
    late_setter *ls = arg;
    dt_store *s = NULL;
    ls->status = dt_store_open(&s, ls->file->url, "job");
    sleep_ms(50);
    for (int i = 0; i < ls->nkeys && ls->status == DT_OK; i++)
        ls->status = dt_store_set(s, ls->keys[i], "v", 1);
    snprintf(ls->error, sizeof ls->error, "%s", dt_store_error(s));
    dt_store_close(s);
    return NULL;
}

Test(store, get_waits_for_a_key_another_thread_sets_later, .timeout = 10)
{
    test_file f = unique_file("getwait");
    dt_store *s = open_ok(&f, "job");
    late_setter ls = {.file = &f, .keys = {"addr/1"}, .nkeys = 1};
    pthread_t t;
    pthread_create(&t, NULL, set_keys_later, &ls);
    expect_value(s, "addr/1", "v");
    pthread_join(t, NULL);
    cr_assert_eq(ls.status, DT_OK, "%s", ls.error);
    dt_store_close(s);
}

Test(store, get_times_out_with_a_message_naming_key_file_and_job, .timeout = 10)
{
    test_file f = unique_file("timeout");
    dt_store *s = open_ok(&f, "myjob");
    void *val = (void *)1;
    size_t len = 7;
    cr_assert_eq(dt_store_get(s, "addr/3", &val, &len, 0.05), DT_ETIMEDOUT);
    cr_assert_null(val);
    const char *msg = dt_store_error(s);
    cr_assert(strstr(msg, "addr/3"), "message: %s", msg);
    cr_assert(strstr(msg, f.path), "message: %s", msg);
    cr_assert(strstr(msg, "myjob"), "message: %s", msg);
    dt_store_close(s);
}

Test(store, wait_returns_once_every_key_exists, .timeout = 10)
{
    test_file f = unique_file("waitmany");
    dt_store *s = open_ok(&f, "job");
    late_setter ls = {.file = &f, .keys = {"a", "b", "c"}, .nkeys = 3};
    pthread_t t;
    pthread_create(&t, NULL, set_keys_later, &ls);
    const char *keys[] = {"a", "b", "c"};
    cr_assert_eq(dt_store_wait(s, keys, 3, 5.0), DT_OK, "%s", dt_store_error(s));
    pthread_join(t, NULL);
    cr_assert_eq(ls.status, DT_OK, "%s", ls.error);
    dt_store_close(s);
}

Test(store, wait_timeout_names_only_the_missing_keys, .timeout = 10)
{
    test_file f = unique_file("waitmissing");
    dt_store *s = open_ok(&f, "job");
    cr_assert_eq(dt_store_set(s, "here", "1", 1), DT_OK);
    const char *keys[] = {"here", "gone/1", "gone/2"};
    cr_assert_eq(dt_store_wait(s, keys, 3, 0.05), DT_ETIMEDOUT);
    const char *msg = dt_store_error(s);
    cr_assert(strstr(msg, "'gone/1'") && strstr(msg, "'gone/2'"), "message: %s", msg);
    cr_assert_null(strstr(msg, "'here'"), "message: %s", msg);
    dt_store_close(s);
}

/* ---- add ----------------------------------------------------------------------- */

typedef struct adder {
    const test_file *file;
    dt_status status;
    char error[512];
} adder;

static void *add_one_hundred_times(void *arg)
{
    adder *a = arg;
    dt_store *s = NULL;
    a->status = dt_store_open(&s, a->file->url, "job");
    for (int i = 0; i < 100 && a->status == DT_OK; i++) {
        int64_t now;
        a->status = dt_store_add(s, "counter", 1, &now);
    }
    snprintf(a->error, sizeof a->error, "%s", dt_store_error(s));
    dt_store_close(s);
    return NULL;
}

Test(store, add_from_8_threads_times_100_ends_at_800, .timeout = 30)
{
    test_file f = unique_file("add");
    dt_store *s = open_ok(&f, "job");
    adder a[8];
    pthread_t t[8];
    for (int i = 0; i < 8; i++) {
        a[i] = (adder){.file = &f};
        pthread_create(&t[i], NULL, add_one_hundred_times, &a[i]);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(a[i].status, DT_OK, "thread %d: %s", i, a[i].error);
    }
    int64_t total = -1;
    cr_assert_eq(dt_store_add(s, "counter", 0, &total), DT_OK);
    cr_assert_eq(total, 800);
    expect_value(s, "counter", "800"); /* stored as decimal text */
    dt_store_close(s);
}

Test(store, add_to_a_non_integer_value_is_einval, .timeout = 10)
{
    test_file f = unique_file("addtext");
    dt_store *s = open_ok(&f, "job");
    cr_assert_eq(dt_store_set(s, "name", "12abc", 5), DT_OK);
    int64_t r = 0;
    cr_assert_eq(dt_store_add(s, "name", 1, &r), DT_EINVAL);
    cr_assert(strstr(dt_store_error(s), "name"), "message: %s", dt_store_error(s));
    cr_assert_eq(dt_store_add(s, "fresh", -5, &r), DT_OK); /* absent = 0 */
    cr_assert_eq(r, -5);
    dt_store_close(s);
}

/* ---- scoping and lifecycle ------------------------------------------------------- */

Test(store, two_jobs_in_one_file_do_not_see_each_others_keys, .timeout = 10)
{
    test_file f = unique_file("twojobs");
    dt_store *a = open_ok(&f, "jobA");
    dt_store *b = open_ok(&f, "jobB");
    cr_assert_eq(dt_store_set(a, "addr/0", "from-a", 6), DT_OK);
    cr_assert_eq(dt_store_set(b, "addr/1", "from-b", 6), DT_OK);
    void *v = NULL;
    size_t len;
    cr_assert_eq(dt_store_get(b, "addr/0", &v, &len, 0.05), DT_ETIMEDOUT);
    cr_assert_eq(dt_store_get(a, "addr/1", &v, &len, 0.05), DT_ETIMEDOUT);
    expect_value(a, "addr/0", "from-a");
    expect_value(b, "addr/1", "from-b");
    dt_store_close(a);
    dt_store_close(b);
}

Test(store, stale_file_of_a_dead_job_is_reset_on_open, .timeout = 10)
{
    test_file f = unique_file("stale");
    append_raw_record(f.path, "job/addr/0", "old");
    append_raw_record(f.path, "job/secret", "stale");
    dt_store *s = open_ok(&f, "job");
    size_t n;
    uint8_t *raw = read_bytes(f.path, &n); /* now only this handle's count */
    cr_assert(!memmem(raw, n, "stale", 5) && !memmem(raw, n, "job/addr/0", 10),
              "the dead job's records are still there");
    free(raw);
    void *v = NULL;
    size_t len;
    cr_assert_eq(dt_store_get(s, "addr/0", &v, &len, 0.05), DT_ETIMEDOUT);
    cr_assert_eq(dt_store_set(s, "addr/0", "new", 3), DT_OK);
    expect_value(s, "addr/0", "new");
    dt_store_close(s);
}

Test(store, open_while_another_handle_lives_keeps_its_records, .timeout = 10)
{
    test_file f = unique_file("live");
    dt_store *a = open_ok(&f, "job");
    cr_assert_eq(dt_store_set(a, "addr/0", "live", 4), DT_OK);
    dt_store *b = open_ok(&f, "job");
    expect_value(b, "addr/0", "live");
    dt_store_close(b);
    dt_store_close(a);
}

Test(store, last_close_removes_the_file_and_earlier_closes_do_not, .timeout = 10)
{
    test_file f = unique_file("lastclose");
    dt_store *a = open_ok(&f, "job");
    dt_store *b = open_ok(&f, "job");
    cr_assert_eq(dt_store_set(a, "k", "v", 1), DT_OK);
    dt_store_close(a);
    cr_assert_eq(access(f.path, F_OK), 0, "the first close removed the file");
    dt_store_close(b);
    cr_assert_eq(access(f.path, F_OK), -1, "the last close left the file");
    cr_assert_eq(errno, ENOENT);
}

typedef struct rank_thread {
    const test_file *file;
    int rank, world;
    dt_status status;
    char error[512];
} rank_thread;

/* One rank of a rendezvous: publish addr/<rank>, wait for everyone's. */
static void *rendezvous_rank(void *arg)
{
    rank_thread *r = arg;
    dt_store *s = NULL;
    char key[32], names[8][32];
    const char *keys[8];
    snprintf(key, sizeof key, "addr/%d", r->rank);
    for (int i = 0; i < r->world; i++) {
        snprintf(names[i], sizeof names[i], "addr/%d", i);
        keys[i] = names[i];
    }
    r->status = dt_store_open(&s, r->file->url, "job");
    if (r->status == DT_OK)
        r->status = dt_store_set(s, key, "here", 4);
    if (r->status == DT_OK)
        r->status = dt_store_wait(s, keys, r->world, 10.0);
    snprintf(r->error, sizeof r->error, "%s", dt_store_error(s));
    dt_store_close(s);
    return NULL;
}

Test(store, eight_ranks_opening_at_once_over_a_stale_file_all_meet, .timeout = 30)
{
    test_file f = unique_file("meet");
    append_raw_record(f.path, "job/addr/0", "old"); /* a dead job's leftover */
    rank_thread r[8];
    pthread_t t[8];
    for (int i = 0; i < 8; i++) {
        r[i] = (rank_thread){.file = &f, .rank = i, .world = 8};
        pthread_create(&t[i], NULL, rendezvous_rank, &r[i]);
    }
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(r[i].status, DT_OK, "rank %d: %s", i, r[i].error);
    cr_assert_eq(access(f.path, F_OK), -1, "the last rank to leave left the file");
}

/* ---- files that are not stores ---------------------------------------------------- */

/* Opening `content` must fail with DT_ESTORE, say why, and change nothing. */
static void expect_refused_untouched(const char *tag, const uint8_t *content, size_t n,
                                     const char *why)
{
    test_file f = unique_file(tag);
    write_bytes(f.path, content, n, O_TRUNC);
    dt_store *s = NULL;
    cr_assert_eq(dt_store_open(&s, f.url, "job"), DT_ESTORE);
    cr_assert_not_null(s);
    const char *msg = dt_store_error(s);
    cr_assert(strstr(msg, f.url), "message: %s", msg);
    cr_assert(strstr(msg, "not a rendezvous store"), "message: %s", msg);
    cr_assert(strstr(msg, why), "message: %s", msg);
    void *v = NULL;
    size_t len;
    cr_assert_eq(dt_store_set(s, "k", "v", 1), DT_ESTORE);
    cr_assert_eq(dt_store_get(s, "k", &v, &len, 0), DT_ESTORE);
    dt_store_close(s);
    size_t m;
    uint8_t *after = read_bytes(f.path, &m);
    cr_assert_eq(m, n, "the file changed size: %zu -> %zu bytes", n, m);
    cr_assert_arr_eq(after, content, n, "the file's bytes changed");
    free(after);
    unlink(f.path);
}

Test(store, random_bytes_file_is_refused_and_left_byte_for_byte, .timeout = 10)
{
    uint8_t junk[120];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof junk; i++) {
        x = x * 1664525u + 1013904223u;
        junk[i] = (uint8_t)(x >> 24);
    }
    expect_refused_untouched("random", junk, sizeof junk, "record at byte 0");
}

Test(store, text_file_is_refused_and_left_byte_for_byte, .timeout = 10)
{
    const char *text = "# my notes\nthis is a text file, not a store\n";
    expect_refused_untouched("text", (const uint8_t *)text, strlen(text), "but the file has");
}

Test(store, a_cut_record_appended_during_use_is_estore, .timeout = 10)
{
    test_file f = unique_file("cut");
    dt_store *s = open_ok(&f, "job");
    cr_assert_eq(dt_store_set(s, "k", "v", 1), DT_OK);
    uint32_t huge = 1000;
    write_bytes(f.path, &huge, 4, O_APPEND); /* a key length, then nothing */
    cr_assert_eq(dt_store_set(s, "k2", "v", 1), DT_ESTORE);
    /* after the handle's three counter records (60 bytes) and k's (14) */
    cr_assert(strstr(dt_store_error(s), "record at byte 74"), "message: %s", dt_store_error(s));
    dt_store_close(s);
    cr_assert_eq(access(f.path, F_OK), 0, "a corrupt file must be kept");
    unlink(f.path);
}

/* ---- arguments --------------------------------------------------------------------- */

Test(store, url_of_no_known_scheme_or_a_relative_file_path_is_einval, .timeout = 10)
{
    const char *bad[] = {"http://127.0.0.1:29500", "file://relative/x", "/tmp/x", "", NULL};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dt_store *s = NULL;
        cr_assert_eq(dt_store_open(&s, bad[i], NULL), DT_EINVAL, "url %s", bad[i]);
        cr_assert_not_null(s);
        const char *msg = dt_store_error(s);
        cr_assert(strstr(msg, "file:///"), "message: %s", msg);
        if (bad[i])
            cr_assert(strstr(msg, bad[i]), "message: %s", msg);
        dt_store_close(s);
    }
}

Test(store, job_id_with_a_slash_is_einval, .timeout = 10)
{
    test_file f = unique_file("badjob");
    dt_store *s = NULL;
    cr_assert_eq(dt_store_open(&s, f.url, "a/b"), DT_EINVAL);
    cr_assert(strstr(dt_store_error(s), "a/b"), "message: %s", dt_store_error(s));
    dt_store_close(s);
    cr_assert_eq(access(f.path, F_OK), -1, "a refused open created the file");
}

/* ---- processes ---------------------------------------------------------------------- */

Test(store, records_set_by_4_forked_processes_are_seen, .timeout = 20)
{
    test_file f = unique_file("fork");
    dt_store *s = open_ok(&f, "job");
    pid_t kids[4];
    for (int i = 0; i < 4; i++) {
        kids[i] = fork();
        cr_assert(kids[i] >= 0, "fork: %s", strerror(errno));
        if (kids[i] == 0) {
            dt_store *c = NULL;
            char key[32], val[32];
            snprintf(key, sizeof key, "child/%d", i);
            int n = snprintf(val, sizeof val, "pid %d", (int)getpid());
            dt_status st = dt_store_open(&c, f.url, "job");
            if (st == DT_OK)
                st = dt_store_set(c, key, val, (size_t)n);
            dt_store_close(c);
            _exit(st == DT_OK ? 0 : 10 + (int)st);
        }
    }
    for (int i = 0; i < 4; i++) {
        char key[32], want[32];
        snprintf(key, sizeof key, "child/%d", i);
        snprintf(want, sizeof want, "pid %d", (int)kids[i]);
        expect_value(s, key, want);
    }
    for (int i = 0; i < 4; i++) {
        int status = 0;
        cr_assert_eq(waitpid(kids[i], &status, 0), kids[i]);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d exited with status %#x",
                  i, status);
    }
    dt_store_close(s);
    cr_assert_eq(access(f.path, F_OK), -1, "the last close left the file");
}
