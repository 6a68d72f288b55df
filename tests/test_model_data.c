/*
 * test_model_data.c — the model layer's data: byte-level text, the seed's
 * random tokens, the generated task, the stateless batch sampler, and the
 * llm.c token shard reader (which must refuse a bad file with a message
 * saying what is wrong).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dt_model.h"

/* Writes bytes to a fresh temporary file; returns its path (static buf). */
static const char *temp_file(char *path, const void *data, size_t n)
{
    strcpy(path, "/tmp/dt_test_data_XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, data, n), (ssize_t)n);
    close(fd);
    return path;
}

/* An llm.c shard: header (magic, version, count) then uint16 tokens;
 * `drop` bytes cut from the end. */
static const char *write_shard(char *path, int magic, int version, int count, size_t drop)
{
    size_t n = 1024 + 2 * (size_t)count;
    unsigned char *buf = calloc(1, n);
    int32_t hdr[3] = {magic, version, count};
    memcpy(buf, hdr, sizeof hdr);
    uint16_t *tok = (uint16_t *)(buf + 1024);
    for (int i = 0; i < count; i++)
        tok[i] = (uint16_t)(i * 7 % 50257);
    temp_file(path, buf, n - drop);
    free(buf);
    return path;
}

Test(shard, valid_shard_is_read_with_its_tokens, .timeout = 10)
{
    char path[64];
    write_shard(path, 20240520, 1, 1000, 0);
    dt_dataset *d;
    dt_status s = dt_dataset_open_shards(&d, path, NULL);
    cr_assert_eq(s, DT_OK, "%s", dt_dataset_error(d));
    cr_expect_eq(dt_dataset_tokens(d, DT_TRAIN), 900);
    cr_expect_eq(dt_dataset_tokens(d, DT_VAL), 100);
    cr_expect_eq(dt_dataset_vocab(d), 50257, "GPT-2's vocabulary, not max id + 1");
    cr_expect_eq(dt_dataset_max_token(d), 999 * 7 % 50257);
    int in[4], tg[4];
    cr_assert_eq(dt_dataset_batch(in, tg, d, DT_TRAIN, 1, 0, 1, 4), DT_OK);
    cr_expect_eq(tg[0], in[1], "targets are inputs shifted by one");
    cr_expect_eq((in[1] - in[0] + 50257) % 50257, 7, "consecutive tokens");
    dt_dataset_close(d);
    unlink(path);
}

static void expect_refused(const char *path, const char *words)
{
    dt_dataset *d;
    cr_assert_neq(dt_dataset_open_shards(&d, path, NULL), DT_OK);
    cr_expect(strstr(dt_dataset_error(d), words) != NULL, "message \"%s\" lacks \"%s\"",
              dt_dataset_error(d), words);
    cr_expect(strstr(dt_dataset_error(d), path) != NULL, "names the file");
    dt_dataset_close(d);
}

Test(shard, bad_magic_is_refused, .timeout = 10)
{
    char path[64];
    write_shard(path, 20240521, 1, 10, 0);
    expect_refused(path, "magic 20240521, expected 20240520");
    unlink(path);
}

Test(shard, bad_version_is_refused, .timeout = 10)
{
    char path[64];
    write_shard(path, 20240520, 2, 10, 0);
    expect_refused(path, "version 2");
    unlink(path);
}

Test(shard, truncated_file_is_refused, .timeout = 10)
{
    char path[64];
    write_shard(path, 20240520, 1, 10, 3);
    expect_refused(path, "truncated");
    unlink(path);
}

Test(shard, file_shorter_than_header_is_refused, .timeout = 10)
{
    char path[64];
    temp_file(path, "hello", 5);
    expect_refused(path, "shorter than the 1024-byte header");
    unlink(path);
}

Test(shard, missing_file_is_refused, .timeout = 10)
{
    expect_refused("/nonexistent/dt_shard.bin", "cannot open");
}

/* A shard of `count` copies of `token` at a path of our choosing. */
static void write_shard_of(const char *path, int count, uint16_t token)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    int32_t hdr[256] = {20240520, 1, count};
    fwrite(hdr, sizeof hdr, 1, f);
    for (int i = 0; i < count; i++)
        fwrite(&token, sizeof token, 1, f);
    fclose(f);
}

Test(shard, a_glob_reads_every_matching_shard_in_sorted_order, .timeout = 10)
{
    char dir[64] = "/tmp/dt_test_shards_XXXXXX", a[96], b[96], other[96], pattern[96];
    cr_assert(mkdtemp(dir));
    snprintf(a, sizeof a, "%s/train_000001.bin", dir);
    snprintf(b, sizeof b, "%s/train_000000.bin", dir);
    snprintf(other, sizeof other, "%s/val_000000.bin", dir);
    write_shard_of(a, 50, 2);
    write_shard_of(b, 50, 1);
    write_shard_of(other, 50, 9);
    snprintf(pattern, sizeof pattern, "%s/train_*.bin", dir);
    dt_dataset *d;
    cr_assert_eq(dt_dataset_open_shard_glob(&d, pattern), DT_OK, "%s", dt_dataset_error(d));
    cr_expect_eq(dt_dataset_tokens(d, DT_TRAIN) + dt_dataset_tokens(d, DT_VAL), 100);
    cr_expect_eq(dt_dataset_max_token(d), 2, "val_000000.bin was not matched");
    int in[2], tg[2];
    cr_assert_eq(dt_dataset_batch(in, tg, d, DT_TRAIN, 1, 0, 1, 2), DT_OK);
    cr_expect_eq(dt_dataset_vocab(d), 50257);
    dt_dataset_close(d);
    cr_expect(dt_dataset_is_shard_file(a));
    cr_expect(!dt_dataset_is_shard_file("/nonexistent/x.bin"));
    unlink(a);
    unlink(b);
    unlink(other);
    rmdir(dir);
}

Test(shard, the_first_shard_comes_first, .timeout = 10)
{
    char dir[64] = "/tmp/dt_test_shards_XXXXXX", a[96], b[96], pattern[96];
    cr_assert(mkdtemp(dir));
    snprintf(a, sizeof a, "%s/s_1.bin", dir);
    snprintf(b, sizeof b, "%s/s_0.bin", dir);
    write_shard_of(a, 100, 7);
    write_shard_of(b, 100, 3);
    snprintf(pattern, sizeof pattern, "%s/s_*.bin", dir);
    dt_dataset *d;
    cr_assert_eq(dt_dataset_open_shard_glob(&d, pattern), DT_OK, "%s", dt_dataset_error(d));
    /* 200 tokens, 20 of validation at the end: the tail of s_1 (7s) */
    int in[4], tg[4];
    cr_assert_eq(dt_dataset_batch(in, tg, d, DT_VAL, 1, 0, 1, 4), DT_OK);
    cr_expect_eq(in[0], 7, "validation is the end of the last shard, s_1.bin");
    dt_dataset_close(d);
    unlink(a);
    unlink(b);
    rmdir(dir);
}

Test(shard, a_glob_matching_nothing_is_refused_naming_it, .timeout = 10)
{
    dt_dataset *d;
    cr_assert_eq(dt_dataset_open_shard_glob(&d, "/nonexistent/train_*.bin"), DT_EINVAL);
    cr_expect(strstr(dt_dataset_error(d), "/nonexistent/train_*.bin") &&
                  strstr(dt_dataset_error(d), "no file matches"),
              "%s", dt_dataset_error(d));
    dt_dataset_close(d);
}

Test(text, bytes_become_tokens_with_a_tail_validation_split, .timeout = 10)
{
    char path[64];
    const char *text = "hello, world. hello, again!";
    temp_file(path, text, strlen(text));
    dt_dataset *d;
    cr_assert_eq(dt_dataset_open_text(&d, path, 0.25), DT_OK);
    size_t n = strlen(text), nv = (size_t)(n * 0.25);
    cr_expect_eq(dt_dataset_tokens(d, DT_VAL), nv);
    cr_expect_eq(dt_dataset_tokens(d, DT_TRAIN), n - nv);
    cr_expect_eq(dt_dataset_vocab(d), 256);
    int in[3], tg[3]; /* the val split is the tail: 6 bytes "again!" */
    cr_assert_eq(dt_dataset_batch(in, tg, d, DT_VAL, 1, 0, 1, 3), DT_OK);
    cr_expect(strchr("again!", in[0]) != NULL);
    dt_dataset_close(d);
    unlink(path);
}

/* What is not a regular file is refused at once, saying what it is: a
 * device would be read forever, a FIFO would block, a directory has no
 * bytes. */
static void expect_text_refused(const char *path, const char *what)
{
    dt_dataset *d;
    cr_assert_eq(dt_dataset_open_text(&d, path, 0.1), DT_EINVAL, "%s", path);
    cr_expect(strstr(dt_dataset_error(d), path) && strstr(dt_dataset_error(d), what), "%s",
              dt_dataset_error(d));
    dt_dataset_close(d);
}

Test(text, a_directory_is_refused_as_a_directory, .timeout = 10)
{
    expect_text_refused("/tmp", "is a directory, not a regular file");
}

Test(text, a_device_is_refused_before_a_byte_is_read, .timeout = 10)
{
    expect_text_refused("/dev/zero", "is a character device, not a regular file");
}

Test(text, a_fifo_is_refused_without_waiting_for_a_writer, .timeout = 10)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/dt_test_fifo_%d", (int)getpid());
    cr_assert_eq(mkfifo(path, 0600), 0);
    expect_text_refused(path, "is a FIFO, not a regular file");
    cr_expect_not(dt_dataset_is_shard_file(path), "a FIFO taken for a shard");
    unlink(path);
}

Test(text, a_file_over_the_size_limit_is_refused_before_it_is_read, .timeout = 10)
{
    char path[64];
    temp_file(path, "x", 1);
    cr_assert_eq(truncate(path, (off_t)3 << 30), 0); /* 3 GiB, sparse: no disk used */
    expect_text_refused(path, "over the 1.0 GiB");
    unlink(path);
}

Test(batch, split_shorter_than_a_row_is_refused, .timeout = 10)
{
    dt_dataset *d;
    cr_assert_eq(dt_dataset_random(&d, 10, 50, 1), DT_OK); /* 5 val tokens */
    int in[8], tg[8];
    cr_assert_eq(dt_dataset_batch(in, tg, d, DT_VAL, 1, 0, 1, 8), DT_EINVAL);
    cr_expect(strstr(dt_dataset_error(d), "validation split has 5 tokens"), "%s",
              dt_dataset_error(d));
    dt_dataset_close(d);
}

Test(batch, rows_depend_only_on_seed_and_row_index, .timeout = 10)
{
    dt_dataset *d;
    cr_assert_eq(dt_dataset_random(&d, 64, 100000, 2), DT_OK);
    int a[4 * 8], ta[4 * 8], b[2 * 8], tb[2 * 8];
    dt_dataset_batch(a, ta, d, DT_TRAIN, 9, 100, 4, 8); /* rows 100..103 */
    dt_dataset_batch(b, tb, d, DT_TRAIN, 9, 102, 2, 8); /* rows 102..103 */
    cr_expect(memcmp(a + 16, b, sizeof b) == 0, "row 102 differs");
    dt_dataset_batch(b, tb, d, DT_TRAIN, 10, 102, 2, 8);
    cr_expect(memcmp(a + 16, b, sizeof b) != 0, "the seed changes rows");
    for (int i = 0; i < 32; i++)
        cr_assert(a[i] >= 0 && a[i] < 64);
    dt_dataset_close(d);
}

/* Every task line is DIGITS=ANSWER\n with the answer right. */
static void check_lines(const int *tok, int n, dt_task_kind kind)
{
    int i = 0;
    while (i < n && tok[i] != '\n') /* rows start at a line: first is whole */
        i++;
    int start = 0, eq = -1;
    for (int k = 0; k <= i && k < n; k++)
        if (tok[k] == '=')
            eq = k;
    cr_assert(eq > 0 && i < n, "row does not start with a whole line");
    int nd = eq - start;
    cr_assert_eq(i - eq - 1, nd, "answer length");
    int count[10] = {0};
    for (int k = 0; k < nd; k++) {
        cr_assert(tok[k] >= '0' && tok[k] <= '9');
        count[tok[k] - '0']++;
        if (kind == DT_TASK_REVERSE)
            cr_assert_eq(tok[eq + 1 + k], tok[nd - 1 - k]);
        else if (k > 0)
            cr_assert(tok[eq + 1 + k] >= tok[eq + k], "sorted");
    }
    for (int k = 0; k < nd; k++)
        count[tok[eq + 1 + k] - '0']--;
    for (int k = 0; k < 10; k++)
        cr_assert_eq(count[k], 0, "answer is a permutation of the prompt");
}

Test(task, rows_start_at_a_correct_line, .timeout = 10)
{
    for (int kind = 0; kind < 2; kind++) {
        dt_dataset *d;
        cr_assert_eq(dt_dataset_task(&d, kind, 6, 2000, 200, 3), DT_OK);
        int in[32 * 15], tg[32 * 15];
        for (int split = 0; split < 2; split++) {
            cr_assert_eq(dt_dataset_batch(in, tg, d, split, 1, 0, 32, 15), DT_OK);
            for (int b = 0; b < 32; b++)
                check_lines(in + b * 15, 15, kind);
        }
        cr_expect_lt(dt_dataset_vocab(d), 65, "fits the seed's V=64");
        dt_dataset_close(d);
    }
}

/* Collect every prompt of a split as a string set (by linear scan). */
static int prompt_in(const char *prompt, char (*set)[8], int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(prompt, set[i]) == 0)
            return 1;
    return 0;
}

Test(task, validation_prompts_never_occur_in_training, .timeout = 30)
{
    dt_dataset *d;
    cr_assert_eq(dt_dataset_task(&d, DT_TASK_REVERSE, 3, 3000, 300, 5), DT_OK);
    static char val[300][8];
    int nval = 0;
    /* T = 7 rows hold one 3-digit line "ddd=ddd"; walk rows to gather */
    int in[7], tg[7];
    for (int r = 0; r < 3000 && nval < 300; r++) {
        dt_dataset_batch(in, tg, d, DT_VAL, 1, (uint64_t)r, 1, 7);
        char p[8];
        int k = 0;
        while (k < 7 && in[k] != '=')
            p[k] = (char)in[k], k++;
        p[k] = '\0';
        if (!prompt_in(p, val, nval))
            strcpy(val[nval++], p);
    }
    cr_assert_gt(nval, 20);
    for (int r = 0; r < 20000; r++) {
        dt_dataset_batch(in, tg, d, DT_TRAIN, 2, (uint64_t)r, 1, 7);
        char p[8];
        int k = 0;
        while (k < 7 && in[k] != '=')
            p[k] = (char)in[k], k++;
        p[k] = '\0';
        cr_assert(!prompt_in(p, val, nval), "prompt %s in both splits", p);
    }
    dt_dataset_close(d);
}

Test(task, same_seed_generates_the_same_data, .timeout = 10)
{
    dt_dataset *a, *b;
    cr_assert_eq(dt_dataset_task(&a, DT_TASK_SORT, 7, 500, 50, 11), DT_OK);
    cr_assert_eq(dt_dataset_task(&b, DT_TASK_SORT, 7, 500, 50, 11), DT_OK);
    cr_assert_eq(dt_dataset_tokens(a, DT_TRAIN), dt_dataset_tokens(b, DT_TRAIN));
    int x[64 * 16], y[64 * 16], tx[64 * 16], ty[64 * 16];
    dt_dataset_batch(x, tx, a, DT_TRAIN, 1, 0, 64, 16);
    dt_dataset_batch(y, ty, b, DT_TRAIN, 1, 0, 64, 16);
    cr_assert(memcmp(x, y, sizeof x) == 0);
    dt_dataset_close(a);
    dt_dataset_close(b);
}

Test(task, accuracy_refuses_a_context_too_short_for_the_task, .timeout = 10)
{
    dt_dataset *d;
    cr_assert_eq(dt_dataset_task(&d, DT_TASK_REVERSE, 7, 100, 100, 1), DT_OK);
    dt_config c = dt_config_seed();
    c.T = 8; /* 7 digits need 15 tokens of context */
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, &c, dt_backend_cpu(), 1), DT_OK);
    cr_expect_eq(dt_task_accuracy(m, d, 0), -1.0);
    dt_model_destroy(m);
    dt_dataset_close(d);
}
