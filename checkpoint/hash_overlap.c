/*
 * hash_overlap.c — writing a shard file while a second thread computes its
 * SHA-256, so the hash hides behind the write and the fsync instead of
 * adding to them.
 *
 * Why. Hashing inline made a save cost write + hash + fsync: 0.2-0.3x of
 * plain write + fsync with libsodium's portable SHA-256 (~250 MB/s a core);
 * with OpenSSL's (sha256.c, ~1.4 GB/s a core) the hash still costs about
 * as much CPU as the kernel's copy into the page cache.
 *
 * Idea. The bytes of a shard are spans of memory that nobody changes during
 * the save (the caller's parameter and optimizer arrays, the header), so
 * no buffer has to be handed over: the hashing thread walks the same span
 * list as the writer, from its own cursor, and the two never wait for each
 * other. The writer then fsyncs while the hasher may still be running; we
 * join at the end. A span with a NULL pointer stands for that many zero
 * bytes (AdamW's moments before the first step), read by both threads from
 * one shared, read-only zero buffer.
 *
 * Cost. Time ≈ max(write + fsync, hash) instead of their sum; one thread
 * per saving rank for the duration of the write; no copy and no extra
 * memory beyond the 1 MiB zero buffer. On a machine with fewer cores than
 * ranks the hash and the writes compete for CPU (the kernel's copy into
 * the page cache is CPU work too), so the gain shrinks there.
 *
 * Tried, measured side by side (ckpt-bench, 4 ranks on 2 cores, paired
 * rounds, 30 each) and dropped: one thread per rank writing 4 MiB chunks,
 * starting each chunk's writeback with sync_file_range(WRITE) and hashing
 * it while the disk works (so that the final fsync has little left); and
 * this design with the hasher started only once the writes are in the
 * page cache (so that the writers are not starved). Save medians 0.440 s
 * and 0.437 s against 0.446 s here: within noise. On 2 cores the hash is
 * the bottleneck either way, and with more cores than ranks two threads
 * per rank are the better shape, so this one stayed.
 *
 * Invariants: the digest is exactly SHA-256 of the bytes written, in order;
 * if the thread cannot be started the hash runs inline afterwards (same
 * result, old speed); a failure of the hashing library fails the write
 * (ENOMEM); the spans must not change until the call returns.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_internal.h"

#define ZERO_BYTES ((size_t)1 << 20)

typedef struct hash_job {
    const ckpt_span *spans;
    int n;
    const unsigned char *zeros; /* ZERO_BYTES of zeros, or NULL if unused */
    unsigned char digest[32];
    bool ok; /* the hashing library did not fail */
} hash_job;

static void *hash_spans(void *arg)
{
    hash_job *j = arg;
    ckpt_sha256 *h = ckpt_sha256_new();
    if (!h)
        return NULL; /* j->ok stays false */
    for (int i = 0; i < j->n; i++) {
        const ckpt_span *s = &j->spans[i];
        if (s->p) {
            ckpt_sha256_update(h, s->p, s->len);
            continue;
        }
        for (size_t done = 0; done < s->len; done += ZERO_BYTES)
            ckpt_sha256_update(h, j->zeros,
                               s->len - done < ZERO_BYTES ? s->len - done : ZERO_BYTES);
    }
    j->ok = ckpt_sha256_final(h, j->digest);
    ckpt_sha256_free(h);
    return NULL;
}

static bool write_spans(int fd, const ckpt_span *spans, int n, const unsigned char *zeros)
{
    for (int i = 0; i < n; i++) {
        const ckpt_span *s = &spans[i];
        if (s->p) {
            if (!ckpt_write_all(fd, s->p, s->len))
                return false;
            continue;
        }
        for (size_t done = 0; done < s->len; done += ZERO_BYTES)
            if (!ckpt_write_all(fd, zeros, s->len - done < ZERO_BYTES ? s->len - done : ZERO_BYTES))
                return false;
    }
    return true;
}

int ckpt_write_spans_hashed(int fd, const ckpt_span *spans, int n, unsigned char digest[32])
{
    bool need_zeros = false;
    for (int i = 0; i < n; i++)
        need_zeros |= spans[i].p == NULL && spans[i].len > 0;
    unsigned char *zeros = need_zeros ? calloc(1, ZERO_BYTES) : NULL;
    if (need_zeros && !zeros)
        return ENOMEM;
    hash_job job = {.spans = spans, .n = n, .zeros = zeros};
    pthread_t th;
    bool threaded = pthread_create(&th, NULL, hash_spans, &job) == 0;
    bool ok = write_spans(fd, spans, n, zeros) && fsync(fd) == 0;
    int err = ok ? 0 : (errno ? errno : EIO);
    if (threaded)
        pthread_join(th, NULL);
    else
        hash_spans(&job);
    if (err == 0 && !job.ok)
        err = ENOMEM; /* the hashing library could not run */
    free(zeros);
    memcpy(digest, job.digest, sizeof job.digest);
    return err;
}
