/*
 * test_checkpoint_sha256.c — the checkpoint's SHA-256 is the standard one,
 * whoever computes it. The manifest records SHA-256 of each shard file;
 * checkpoint/sha256.c computes it through OpenSSL's libcrypto. These tests
 * pin that choice to the format, so that changing the library can never
 * change (or silently corrupt) what is written: FIPS 180 test vectors,
 * equality with libsodium's independent implementation on every length
 * around the 64-byte block and on a large buffer, and the hash a real
 * save writes into the manifest equal to libsodium's hash of the file.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_fixture.h"

static void hex(char out[65], const unsigned char d[32])
{
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void expect_ours(const void *data, size_t n, const char *want_hex)
{
    unsigned char d[32];
    char got[65];
    cr_assert_eq(dt_ckpt_sha256(d, data, n), DT_OK);
    hex(got, d);
    cr_assert_str_eq(got, want_hex, "SHA-256 of %zu bytes", n);
}

Test(checkpoint_sha256, matches_the_fips_180_test_vectors, .timeout = 30)
{
    expect_ours("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    expect_ours("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    expect_ours(two_blocks, strlen(two_blocks),
                "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    size_t million = 1000000;
    char *a = malloc(million);
    cr_assert_not_null(a);
    memset(a, 'a', million);
    expect_ours(a, million, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);
}

Test(checkpoint_sha256, equals_libsodium_on_every_length_up_to_300_and_on_4_mib, .timeout = 30)
{
    cr_assert_geq(sodium_init(), 0);
    size_t big = ((size_t)4 << 20) + 17;
    unsigned char *buf = malloc(big);
    cr_assert_not_null(buf);
    randombytes_buf(buf, big);
    unsigned char ours[32], theirs[32];
    for (size_t n = 0; n <= 301; n++) {
        size_t len = n == 301 ? big : n;
        cr_assert_eq(dt_ckpt_sha256(ours, buf, len), DT_OK);
        crypto_hash_sha256(theirs, buf, (unsigned long long)len);
        cr_assert_arr_eq(ours, theirs, 32,
                         "%zu bytes: OpenSSL and libsodium "
                         "disagree",
                         len);
    }
    free(buf);
}

/* The streaming path of a real save (its hashing thread, the header and
 * each section as a span) against libsodium over the file. */
Test(checkpoint_sha256, a_saved_shard_hash_is_libsodium_sha256_of_its_file, .timeout = 30)
{
    cr_assert_geq(sodium_init(), 0);
    char root[128], step_dir[256], path[320];
    fixture_mkroot(root, sizeof root);
    dt_ckpt *ck = NULL;
    cr_assert_eq(dt_ckpt_open(&ck, root, NULL), DT_OK);
    full_state f;
    full_state_init(&f, DT_CKPT_ZERO1, 7);
    cr_assert_eq(dt_ckpt_save_all(ck, &f.s, 2), DT_OK, "%s", dt_ckpt_error(ck));
    snprintf(step_dir, sizeof step_dir, "%s/step_00000007", root);
    snprintf(path, sizeof path, "%s/manifest.json", step_dir);
    json_error_t e;
    json_t *man = json_load_file(path, 0, &e);
    cr_assert_not_null(man, "manifest: %s", e.text);
    for (int r = 0; r < 2; r++) {
        json_t *sh = json_array_get(json_object_get(man, "shards"), (size_t)r);
        snprintf(path, sizeof path, "%s/%s", step_dir,
                 json_string_value(json_object_get(sh, "file")));
        FILE *fp = fopen(path, "rb");
        cr_assert_not_null(fp, "%s", path);
        unsigned char chunk[4096], d[32];
        crypto_hash_sha256_state h;
        crypto_hash_sha256_init(&h);
        size_t got;
        while ((got = fread(chunk, 1, sizeof chunk, fp)) > 0)
            crypto_hash_sha256_update(&h, chunk, got);
        fclose(fp);
        crypto_hash_sha256_final(&h, d);
        char want[65];
        hex(want, d);
        cr_assert_str_eq(json_string_value(json_object_get(sh, "sha256")), want, "shard %d", r);
    }
    json_decref(man);
    dt_ckpt_close(ck);
    full_state_free(&f);
    fixture_rmtree(root);
}
