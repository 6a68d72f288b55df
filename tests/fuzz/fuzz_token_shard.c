/*
 * fuzz_token_shard.c — llm.c's token shards (model/shard.c): a 1 KiB
 * header of int32 (magic, version, token count), then uint16 tokens.
 *
 * Input: the file's bytes, opened once as a training shard alone (10% of
 * it held out) and once as train and validation shards both. A shard that
 * is cut short, too long, or lies about its count must be refused with a
 * message; one that opens must hold exactly the tokens it declared.
 */
#include "dt_model.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tokens.bin", fuzz_scratch_dir("token_shard"));
    fuzz_write_file(path, data, size);
    for (int both = 0; both < 2; both++) {
        dt_dataset *d = NULL;
        if (dt_dataset_open_shards(&d, path, both ? path : NULL) == DT_OK) {
            size_t n = dt_dataset_tokens(d, DT_TRAIN) + dt_dataset_tokens(d, DT_VAL);
            if (n != (size - 1024) / 2 * (both ? 2 : 1))
                abort();
        }
        dt_dataset_close(d);
    }
    unlink(path);
    return 0;
}
