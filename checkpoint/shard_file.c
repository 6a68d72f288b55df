/*
 * shard_file.c — writing one rank's shard file with its SHA-256 (reading
 * it back is shard_read.c).
 *
 * Writing streams the header, the section table and each array straight
 * from the caller's memory to rankNNNNN.bin.tmp while a second thread
 * hashes the same bytes (hash_overlap.c: SHA-256 hidden behind the write
 * and the fsync, no copy). Then close, rename. The directory's fsync is
 * rank 0's, after the manifest's rename in the same directory, which makes
 * every rename durable at once.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_internal.h"

const char *const ckpt_kind_names[KIND_COUNT] = {"params", "master", "m", "v"};

void dt_ckpt_partition(size_t n, int world, int r, size_t *lo, size_t *count)
{
    size_t s = (n + (size_t)world - 1) / (size_t)world;
    *lo = (size_t)r * s;
    if (*lo > n)
        *lo = n;
    *count = n - *lo < s ? n - *lo : s;
}

void dt_ckpt_pipeline_slices(size_t *slices, const size_t *stage_bounds, int P, int D)
{
    for (int s = 0; s < P; s++)
        for (int r = 0; r < D; r++) {
            size_t lo, n;
            dt_ckpt_partition(stage_bounds[s + 1] - stage_bounds[s], D, r, &lo, &n);
            slices[s * D + r] = stage_bounds[s] + lo;
        }
    slices[P * D] = stage_bounds[P];
}

/* Fills the record and the header bytes for rank r's shard of s. */
static size_t build_header(unsigned char *hdr, ckpt_shard *rec, const dt_ckpt_state *s, int r,
                           int world, size_t lo, size_t n)
{
    int nsec = s->mode == DT_CKPT_ZERO1 ? 4 : 3;
    memset(hdr, 0, SHARD_HEADER_BYTES + MAX_SECTIONS * SECTION_BYTES);
    memcpy(hdr, SHARD_MAGIC, 8);
    put_le32(hdr + 8, SHARD_VERSION);
    put_le32(hdr + 12, (uint32_t)r);
    put_le32(hdr + 16, (uint32_t)world);
    put_le32(hdr + 20, (uint32_t)s->mode);
    put_le32(hdr + 24, (uint32_t)nsec);
    put_le64(hdr + 32, (uint64_t)s->step);
    put_le64(hdr + 40, s->seed);
    put_le64(hdr + 48, s->data_row);
    put_le64(hdr + 56, s->rng_state);
    put_le64(hdr + 64, s->num_params);
    size_t hbytes = SHARD_HEADER_BYTES + (size_t)nsec * SECTION_BYTES;
    uint64_t fo = hbytes;
    memset(rec, 0, sizeof *rec);
    rec->rank = r;
    snprintf(rec->file, sizeof rec->file, "rank%05d.bin", r);
    unsigned char *t = hdr + SHARD_HEADER_BYTES;
    for (int k = 0; k < KIND_COUNT; k++) {
        if (k == KIND_MASTER && s->mode != DT_CKPT_ZERO1)
            continue;
        rec->ranges[k] = (ckpt_range){true, lo, n};
        put_le32(t, (uint32_t)k);
        put_le64(t + 8, lo);
        put_le64(t + 16, n);
        put_le64(t + 24, fo);
        fo += n * sizeof(float);
        t += SECTION_BYTES;
    }
    rec->bytes = fo;
    return hbytes;
}

/* Rank r's slice: the state's own layout (in its order), or the even
 * partition. */
void ckpt_slice_of(const dt_ckpt_state *s, int r, int world, size_t *lo, size_t *n)
{
    if (s->slices) {
        int k = s->slice_order ? s->slice_order[r] : r;
        *lo = s->slices[k];
        *n = s->slices[k + 1] - s->slices[k];
    } else {
        dt_ckpt_partition(s->num_params, world, r, lo, n);
    }
}

void ckpt_describe_shard(const dt_ckpt_state *s, int r, int world, ckpt_shard *rec)
{
    unsigned char hdr[SHARD_HEADER_BYTES + MAX_SECTIONS * SECTION_BYTES];
    size_t lo, n;
    ckpt_slice_of(s, r, world, &lo, &n);
    build_header(hdr, rec, s, r, world, lo, n);
}

dt_status ckpt_write_shard(dt_ckpt *ck, const char *dir, const dt_ckpt_state *s, int r, int world,
                           ckpt_shard *rec)
{
    size_t lo, n;
    ckpt_slice_of(s, r, world, &lo, &n);
    size_t held_n = s->held_n ? s->held_n : s->num_params;
    if (n > 0 && (lo < s->opt_lo || lo + n > s->opt_lo + s->opt_n))
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_FIELD,
                         "save: rank %d's slice [%zu, %zu) is outside the "
                         "optimizer range [%zu, %zu) it was given",
                         r, lo, lo + n, s->opt_lo, s->opt_lo + s->opt_n);
    if (n > 0 && (lo < s->held_lo || lo + n > s->held_lo + held_n))
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_FIELD,
                         "save: rank %d's slice [%zu, %zu) is outside the "
                         "parameters [%zu, %zu) it holds",
                         r, lo, lo + n, s->held_lo, s->held_lo + held_n);
    if (s->mode == DT_CKPT_ZERO1 && !s->master)
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_FIELD,
                         "save: a ZeRO-1 state needs its master shard");
    unsigned char hdr[SHARD_HEADER_BYTES + MAX_SECTIONS * SECTION_BYTES];
    size_t hbytes = build_header(hdr, rec, s, r, world, lo, n);
    char tmp[CKPT_PATH_MAX], dst[CKPT_PATH_MAX];
    ckpt_join(tmp, dir, rec->file, ".tmp");
    ckpt_join(dst, dir, rec->file, "");
    int fd = ckpt_create_tmp(ck, tmp);
    if (fd < 0)
        return ck->status;
    size_t off = n > 0 ? lo - s->opt_lo : 0;
    const float *src[KIND_COUNT] = {s->params + (n > 0 ? lo - s->held_lo : 0),
                                    s->master ? s->master + off : NULL,
                                    s->adam_m ? s->adam_m + off : NULL,
                                    s->adam_v ? s->adam_v + off : NULL};
    ckpt_span spans[1 + KIND_COUNT] = {{hdr, hbytes}};
    int nspans = 1;
    for (int k = 0; k < KIND_COUNT; k++)
        if (rec->ranges[k].present) /* NULL m/v: zeros (before step 1) */
            spans[nspans++] = (ckpt_span){src[k], n * sizeof(float)};
    unsigned char digest[32];
    int e = ckpt_write_spans_hashed(fd, spans, nspans, digest);
    if (close(fd) != 0 && e == 0)
        e = errno;
    if (e != 0) {
        unlink(tmp);
        return ckpt_fail(ck, DT_ESYS, DT_CKPT_FAULT_IO, "writing %s: %s", tmp, strerror(e));
    }
    if (rename(tmp, dst) != 0)
        return ckpt_fail(ck, DT_ESYS, DT_CKPT_FAULT_IO, "renaming %s: %s", tmp, strerror(errno));
    ckpt_to_hex(rec->sha256, digest, sizeof digest);
    return DT_OK;
}
