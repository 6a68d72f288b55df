/*
 * fuzz_manifest.c — a checkpoint's manifest.json (checkpoint/manifest.c),
 * the file every resume, verify and reshard trusts first.
 *
 * Input: the manifest's bytes, placed in a step directory of a scratch
 * checkpoint root (no shard files beside it). dt_ckpt_inspect must parse
 * and check it or refuse it with a fault and a message; dt_ckpt_verify
 * then goes on to the shards it names (all missing here) and must refuse.
 * Neither may crash, leak, or allocate what the manifest merely claims.
 */
#include "dt_ckpt.h"
#include "fuzz_util.h"

static char root[512], step_dir[600], manifest[700];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    snprintf(root, sizeof root, "%s/root", fuzz_scratch_dir("manifest"));
    snprintf(step_dir, sizeof step_dir, "%s/step_00000010", root);
    snprintf(manifest, sizeof manifest, "%s/manifest.json", step_dir);
    if (mkdir(root, 0700) != 0 || mkdir(step_dir, 0700) != 0)
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_write_file(manifest, data, size);
    dt_ckpt *ck = NULL;
    if (dt_ckpt_open(&ck, root, NULL) != DT_OK)
        abort();
    dt_ckpt_info info;
    if (dt_ckpt_inspect(ck, step_dir, &info) == DT_OK && info.world < 1)
        abort();
    if (dt_ckpt_verify(ck, step_dir) == DT_OK)
        abort(); /* no shard exists */
    dt_ckpt_close(ck);
    return 0;
}
