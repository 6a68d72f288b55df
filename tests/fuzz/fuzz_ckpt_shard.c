/*
 * fuzz_ckpt_shard.c — a checkpoint shard file (checkpoint/shard_read.c):
 * its 72-byte header, its section table and the sections it points to.
 *
 * Set-up (once): a genuine two-rank ZeRO-1 checkpoint of a tiny model in a
 * scratch root. Input: the bytes of rank 0's shard. The manifest is
 * rewritten to vouch for exactly these bytes (size and SHA-256), so the
 * file gets past the hash and the reader's own checks of the header and
 * the table against the manifest are what stand between the bytes and the
 * caller's buffers. Both readers run: the verifying one (dt_ckpt_load,
 * dt_ckpt_verify) and the checking one a collective load uses for shards
 * another rank hashes (no hash at all). Refusing is fine; crashing,
 * leaking, or writing outside the state's arrays is a finding.
 *
 * DT_FUZZ_SEED_OUT=FILE: also copy the genuine shard there (how the
 * committed seed was made).
 */
#include <jansson.h>

#include "ckpt_internal.h"
#include "fuzz_util.h"

#define STEP 10

static dt_config cfg = {.V = 8, .T = 4, .L = 1, .H = 1, .C = 4};
static char root[512], dir[600], shard_path[700];
static json_t *manifest; /* the genuine manifest, patched per input */
static float *arrays;    /* params, master, m, v: 4 x num_params */
static size_t num_params;

/* Rank 0's state of the job: full parameters, its ZeRO-1 slice of the rest. */
static dt_ckpt_state rank0_state(void)
{
    size_t lo, n;
    dt_ckpt_partition(num_params, 2, 0, &lo, &n);
    float *a = arrays;
    return (dt_ckpt_state){.cfg = cfg,
                           .mode = DT_CKPT_ZERO1,
                           .rank = 0,
                           .world = 2,
                           .num_params = num_params,
                           .params = a,
                           .opt_lo = lo,
                           .opt_n = n,
                           .master = a + num_params,
                           .adam_m = a + 2 * num_params,
                           .adam_v = a + 3 * num_params};
}

static void save_genuine_checkpoint(void)
{
    num_params = dt_config_num_params(&cfg);
    arrays = malloc(4 * num_params * sizeof *arrays);
    if (!arrays)
        abort();
    for (size_t i = 0; i < 4 * num_params; i++)
        arrays[i] = (float)i * 0.25f;
    dt_ckpt_state full = {.cfg = cfg,
                          .mode = DT_CKPT_ZERO1,
                          .rank = 0,
                          .world = 1,
                          .step = STEP,
                          .seed = 1337,
                          .data_row = 640,
                          .rng_state = 99,
                          .num_params = num_params,
                          .params = arrays,
                          .opt_lo = 0,
                          .opt_n = num_params,
                          .master = arrays + num_params,
                          .adam_m = arrays + 2 * num_params,
                          .adam_v = arrays + 3 * num_params};
    dt_ckpt *ck = NULL;
    if (dt_ckpt_open(&ck, root, NULL) != DT_OK || dt_ckpt_save_all(ck, &full, 2) != DT_OK) {
        fprintf(stderr, "fuzz_ckpt_shard: set-up: %s\n", ck ? dt_ckpt_error(ck) : "no memory");
        abort();
    }
    dt_ckpt_close(ck);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    snprintf(root, sizeof root, "%s/root", fuzz_scratch_dir("ckpt_shard"));
    snprintf(dir, sizeof dir, "%s/step_%08d", root, STEP);
    snprintf(shard_path, sizeof shard_path, "%s/rank00000.bin", dir);
    save_genuine_checkpoint();
    char path[700];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    manifest = json_load_file(path, 0, NULL);
    if (!manifest)
        abort();
    const char *seed_out = getenv("DT_FUZZ_SEED_OUT");
    if (seed_out) {
        FILE *f = fopen(shard_path, "rb");
        uint8_t buf[1 << 16];
        size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
        if (f)
            fclose(f);
        fuzz_write_file(seed_out, buf, n);
    }
    return 0;
}

/* manifest.json now vouches for data[0..size) as rank 0's shard. */
static void vouch_for(const uint8_t *data, size_t size)
{
    unsigned char digest[32];
    char hex[2 * sizeof digest + 1], path[700];
    dt_ckpt_sha256(digest, data, size);
    for (size_t i = 0; i < sizeof digest; i++)
        sprintf(hex + 2 * i, "%02x", digest[i]);
    json_t *shard0 = json_array_get(json_object_get(manifest, "shards"), 0);
    json_object_set_new(shard0, "bytes", json_integer((json_int_t)size));
    json_object_set_new(shard0, "sha256", json_string(hex));
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if (json_dump_file(manifest, path, 0) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_write_file(shard_path, data, size);
    vouch_for(data, size);
    dt_ckpt_options opts = {.allow_reshard = false};
    dt_ckpt *ck = NULL;
    if (dt_ckpt_open(&ck, root, &opts) != DT_OK)
        abort();
    dt_ckpt_state s = rank0_state();
    (void)dt_ckpt_load(ck, dir, &s);
    (void)dt_ckpt_verify(ck, dir);
    ckpt_manifest m;
    if (ckpt_manifest_read(ck, dir, &m) == DT_OK) {
        (void)ckpt_read_shard(ck, dir, &m, 0, &s, false);
        ckpt_manifest_free(&m);
    }
    dt_ckpt_close(ck);
    return 0;
}
