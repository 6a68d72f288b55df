/*
 * fuzz_store_log.c — the rendezvous store's record log, read from a file
 * anybody may have written.
 *
 * Input: the file's bytes. Two paths read them:
 *   - replay into a store handle, in two pieces (the first byte says where
 *     the file is cut), as a live store replays what other ranks appended
 *     since its last look: comm_store_log_replay's incremental offsets and the
 *     table it fills, with this job's prefix and others' records mixed;
 *   - dt_store_open on a file holding the bytes: the public path, which
 *     must refuse what is not a store and take over only a dead store.
 * Either may fail; neither may crash, leak, or read out of bounds.
 */
#include <sys/mman.h>

#include "fuzz_util.h"
#include "store_internal.h"

static void replay_in_two_pieces(const uint8_t *data, size_t size)
{
    int fd = memfd_create("store", MFD_CLOEXEC);
    if (fd < 0)
        abort();
    size_t cut = size ? data[0] % (size + 1) : 0;
    char url[] = "memfd", job[] = "job", prefix[] = "job/";
    dt_store s = {.fd = fd,
                  .healthy = true,
                  .url = url,
                  .path = url,
                  .job_id = job,
                  .prefix = prefix,
                  .prefix_len = strlen(prefix)};
    bool ok = write(fd, data, cut) == (ssize_t)cut && comm_store_log_replay(&s) == DT_OK;
    if (ok && write(fd, data + cut, size - cut) == (ssize_t)(size - cut))
        (void)comm_store_log_replay(&s);
    (void)comm_store_log_check(&s, NULL);
    comm_store_map_free(&s.map);
    close(fd);
}

static void open_as_a_store(const uint8_t *data, size_t size)
{
    char path[512], url[600];
    snprintf(path, sizeof path, "%s/store", fuzz_scratch_dir("store_log"));
    snprintf(url, sizeof url, "file://%s", path);
    fuzz_write_file(path, data, size);
    dt_store *st = NULL;
    if (dt_store_open(&st, url, "job") == DT_OK) {
        void *val = NULL;
        size_t len = 0;
        if (dt_store_set(st, "k", "v", 1) == DT_OK &&
            dt_store_get(st, "k", &val, &len, 0) == DT_OK && (len != 1 || memcmp(val, "v", 1)))
            abort(); /* a store that opened must read back what it was given */
        free(val);
    }
    dt_store_close(st);
    unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    replay_in_two_pieces(data, size);
    open_as_a_store(data, size);
    return 0;
}
