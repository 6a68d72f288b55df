/*
 * shard_file.c — one rank's shard file: writing it with its SHA-256, and
 * reading it back against the manifest.
 *
 * Writing streams the header, the section table and each array straight
 * from the caller's memory to rankNNNNN.bin.tmp while a second thread
 * hashes the same bytes (hash_overlap.c: SHA-256 hidden behind the write
 * and the fsync, no copy). Then close, rename. The directory's fsync is rank 0's, after the manifest's
 * rename in the same directory, which makes every rename durable at once.
 *
 * Reading checks the file size against the manifest before reading
 * anything, every header field against the manifest, every section against
 * the manifest's ranges, and the hash of the whole file at the end. Bytes
 * a caller wants are read straight into its buffer (and hashed there);
 * the rest goes through a small scratch buffer, so memory stays bounded
 * for any file size. A reader never trusts a size from the file to
 * allocate: sizes are checked against the file's real length first.
 */
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_internal.h"

#define CHUNK_BYTES ((size_t)1 << 20)

const char *const ckpt_kind_names[KIND_COUNT] = {"params", "master", "m",
                                                 "v"};

static void to_hex(char *out, const unsigned char *h, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[h[i] >> 4];
        out[2 * i + 1] = digits[h[i] & 15];
    }
    out[2 * n] = '\0';
}

/* Fills the record and the header bytes for rank r's shard of s. */
static size_t build_header(unsigned char *hdr, ckpt_shard *rec,
                           const dt_ckpt_state *s, int r, int world,
                           size_t lo, size_t n)
{
    int nsec = s->mode == DT_CKPT_ZERO1 ? 4 : 3;
    memset(hdr, 0, SHARD_HEADER_BYTES + MAX_SECTIONS * SECTION_BYTES);
    memcpy(hdr, SHARD_MAGIC, 8);
    put_u32(hdr + 8, SHARD_VERSION);
    put_u32(hdr + 12, (uint32_t)r);
    put_u32(hdr + 16, (uint32_t)world);
    put_u32(hdr + 20, (uint32_t)s->mode);
    put_u32(hdr + 24, (uint32_t)nsec);
    put_u64(hdr + 32, (uint64_t)s->step);
    put_u64(hdr + 40, s->seed);
    put_u64(hdr + 48, s->data_row);
    put_u64(hdr + 56, s->rng_state);
    put_u64(hdr + 64, s->num_params);
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
        put_u32(t, (uint32_t)k);
        put_u64(t + 8, lo);
        put_u64(t + 16, n);
        put_u64(t + 24, fo);
        fo += n * sizeof(float);
        t += SECTION_BYTES;
    }
    rec->bytes = fo;
    return hbytes;
}

void ckpt_describe_shard(const dt_ckpt_state *s, int r, int world,
                         ckpt_shard *rec)
{
    unsigned char hdr[SHARD_HEADER_BYTES + MAX_SECTIONS * SECTION_BYTES];
    size_t lo, n;
    dt_ckpt_partition(s->num_params, world, r, &lo, &n);
    build_header(hdr, rec, s, r, world, lo, n);
}

dt_status ckpt_write_shard(dt_ckpt *ck, const char *dir,
                           const dt_ckpt_state *s, int r, int world,
                           ckpt_shard *rec)
{
    size_t lo, n;
    dt_ckpt_partition(s->num_params, world, r, &lo, &n);
    if (n > 0 && (lo < s->opt_lo || lo + n > s->opt_lo + s->opt_n))
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_FIELD,
                         "save: rank %d's slice [%zu, %zu) is outside the "
                         "optimizer range [%zu, %zu) it was given", r, lo,
                         lo + n, s->opt_lo, s->opt_lo + s->opt_n);
    if (s->mode == DT_CKPT_ZERO1 && !s->master)
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_FIELD,
                         "save: a ZeRO-1 state needs its master shard");
    unsigned char hdr[SHARD_HEADER_BYTES + MAX_SECTIONS * SECTION_BYTES];
    size_t hbytes = build_header(hdr, rec, s, r, world, lo, n);
    char tmp[CKPT_PATH_MAX], dst[CKPT_PATH_MAX];
    ckpt_join(tmp, dir, rec->file, ".tmp");
    ckpt_join(dst, dir, rec->file, "");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return ckpt_fail(ck, DT_ESYS, DT_CKPT_FAULT_IO, "creating %s: %s", tmp,
                         strerror(errno));
    size_t off = n > 0 ? lo - s->opt_lo : 0;
    const float *src[KIND_COUNT] = {
        s->params + lo, s->master ? s->master + off : NULL,
        s->adam_m ? s->adam_m + off : NULL, s->adam_v ? s->adam_v + off : NULL};
    ckpt_span spans[1 + KIND_COUNT] = {{hdr, hbytes}};
    int nspans = 1;
    for (int k = 0; k < KIND_COUNT; k++)
        if (rec->ranges[k].present) /* NULL m/v: zeros (before step 1) */
            spans[nspans++] = (ckpt_span){src[k], n * sizeof(float)};
    unsigned char digest[crypto_hash_sha256_BYTES];
    int e = ckpt_write_spans_hashed(fd, spans, nspans, digest);
    if (close(fd) != 0 && e == 0)
        e = errno;
    if (e != 0) {
        unlink(tmp);
        return ckpt_fail(ck, DT_ESYS, DT_CKPT_FAULT_IO, "writing %s: %s", tmp,
                         strerror(e));
    }
    if (rename(tmp, dst) != 0)
        return ckpt_fail(ck, DT_ESYS, DT_CKPT_FAULT_IO, "renaming %s: %s", tmp,
                         strerror(errno));
    to_hex(rec->sha256, digest, sizeof digest);
    return DT_OK;
}

/* ---- reading ------------------------------------------------------------- */

typedef struct reader {
    dt_ckpt *ck;
    int fd;
    const char *path;
    ckpt_sha256 h;
    unsigned char *scratch; /* CHUNK_BYTES */
} reader;

static dt_status read_hashed(reader *rd, void *dst, size_t len)
{
    char *p = dst;
    while (len > 0) {
        ssize_t r = read(rd->fd, p, len < ((size_t)1 << 30) ? len : (size_t)1 << 30);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return ckpt_fail(rd->ck, r < 0 ? DT_ESYS : DT_EPROTO,
                             r < 0 ? DT_CKPT_FAULT_IO : DT_CKPT_FAULT_SIZE,
                             "%s: %s", rd->path,
                             r < 0 ? strerror(errno) : "shorter than its header says");
        ckpt_sha256_update(&rd->h, (unsigned char *)p, (size_t)r);
        p += r;
        len -= (size_t)r;
    }
    return DT_OK;
}

static dt_status skip_hashed(reader *rd, uint64_t len)
{
    while (len > 0) {
        size_t k = len < CHUNK_BYTES ? (size_t)len : CHUNK_BYTES;
        dt_status st = read_hashed(rd, rd->scratch, k);
        if (st != DT_OK)
            return st;
        len -= k;
    }
    return DT_OK;
}

/* Where kind k goes in s: buffer and the global range it holds. */
static float *dest_of(dt_ckpt_state *s, int k, uint64_t *lo, uint64_t *n)
{
    if (!s)
        return NULL;
    *lo = k == KIND_PARAMS ? 0 : s->opt_lo;
    *n = k == KIND_PARAMS ? s->num_params : s->opt_n;
    float *b[KIND_COUNT] = {s->params, s->master, s->adam_m, s->adam_v};
    return b[k];
}

/* Reads one section [off, off+count): the part inside the destination's
 * range straight into it, the rest through scratch. */
static dt_status read_section(reader *rd, int k, uint64_t off, uint64_t count,
                              dt_ckpt_state *s)
{
    uint64_t dlo = 0, dn = 0;
    float *dst = dest_of(s, k, &dlo, &dn);
    uint64_t a = off, b = off + count;
    uint64_t ia = a > dlo ? a : dlo, ib = b < dlo + dn ? b : dlo + dn;
    if (!dst || ia >= ib)
        return skip_hashed(rd, count * sizeof(float));
    dt_status st = skip_hashed(rd, (ia - a) * sizeof(float));
    if (st == DT_OK)
        st = read_hashed(rd, dst + (ia - dlo), (ib - ia) * sizeof(float));
    if (st == DT_OK)
        st = skip_hashed(rd, (b - ib) * sizeof(float));
    return st;
}

/* Header fields against the manifest. */
static dt_status check_header(reader *rd, const unsigned char *hdr,
                              const ckpt_manifest *m, int r)
{
    const char *bad = NULL;
    if (memcmp(hdr, SHARD_MAGIC, 8) != 0)
        bad = "magic";
    else if (get_u32(hdr + 8) != SHARD_VERSION)
        bad = "version";
    else if (get_u32(hdr + 12) != (uint32_t)r)
        bad = "rank";
    else if (get_u32(hdr + 16) != (uint32_t)m->world)
        bad = "world";
    else if (get_u32(hdr + 20) != (uint32_t)m->mode)
        bad = "mode";
    else if (get_u64(hdr + 32) != (uint64_t)m->step)
        bad = "step";
    else if (get_u64(hdr + 40) != m->seed || get_u64(hdr + 48) != m->data_row ||
             get_u64(hdr + 56) != m->rng_state)
        bad = "seed/data_row/rng_state";
    else if (get_u64(hdr + 64) != m->num_params)
        bad = "num_params";
    if (bad)
        return ckpt_fail(rd->ck, DT_EPROTO, DT_CKPT_FAULT_HEADER,
                         "%s: header field %s disagrees with the manifest",
                         rd->path, bad);
    return DT_OK;
}

/* The section table must list exactly the manifest's ranges, in order,
 * back to back. */
static dt_status check_sections(reader *rd, const unsigned char *t, int nsec,
                                const ckpt_shard *sh, uint64_t *kinds)
{
    uint64_t fo = SHARD_HEADER_BYTES + (uint64_t)nsec * SECTION_BYTES;
    int listed = 0;
    for (int k = 0; k < KIND_COUNT; k++)
        listed += sh->ranges[k].present;
    if (listed != nsec)
        return ckpt_fail(rd->ck, DT_EPROTO, DT_CKPT_FAULT_HEADER,
                         "%s: %d sections, the manifest lists %d", rd->path,
                         nsec, listed);
    for (int i = 0; i < nsec; i++, t += SECTION_BYTES) {
        uint32_t k = get_u32(t);
        const ckpt_range *want = k < KIND_COUNT ? &sh->ranges[k] : NULL;
        if (!want || !want->present || get_u64(t + 8) != want->offset ||
            get_u64(t + 16) != want->count || get_u64(t + 24) != fo)
            return ckpt_fail(rd->ck, DT_EPROTO, DT_CKPT_FAULT_HEADER,
                             "%s: section %d (kind %u) disagrees with the "
                             "manifest's ranges", rd->path, i, k);
        kinds[i] = k;
        fo += want->count * sizeof(float);
    }
    if (fo != sh->bytes)
        return ckpt_fail(rd->ck, DT_EPROTO, DT_CKPT_FAULT_SIZE,
                         "%s: sections end at byte %llu, the manifest says "
                         "%llu bytes", rd->path, (unsigned long long)fo,
                         (unsigned long long)sh->bytes);
    return DT_OK;
}

static dt_status read_body(reader *rd, const ckpt_manifest *m, int r,
                           dt_ckpt_state *s)
{
    const ckpt_shard *sh = &m->shards[r];
    unsigned char hdr[SHARD_HEADER_BYTES + MAX_SECTIONS * SECTION_BYTES];
    dt_status st = read_hashed(rd, hdr, SHARD_HEADER_BYTES);
    if (st != DT_OK)
        return st;
    if ((st = check_header(rd, hdr, m, r)) != DT_OK)
        return st;
    uint32_t nsec = get_u32(hdr + 24);
    if (nsec < 1 || nsec > MAX_SECTIONS)
        return ckpt_fail(rd->ck, DT_EPROTO, DT_CKPT_FAULT_ABSURD,
                         "%s: %u sections (at most %d)", rd->path, nsec,
                         MAX_SECTIONS);
    unsigned char *t = hdr + SHARD_HEADER_BYTES;
    if ((st = read_hashed(rd, t, nsec * SECTION_BYTES)) != DT_OK)
        return st;
    uint64_t kinds[MAX_SECTIONS];
    if ((st = check_sections(rd, t, (int)nsec, sh, kinds)) != DT_OK)
        return st;
    for (uint32_t i = 0; i < nsec && st == DT_OK; i++) {
        const ckpt_range *g = &sh->ranges[kinds[i]];
        st = read_section(rd, (int)kinds[i], g->offset, g->count, s);
    }
    if (st != DT_OK)
        return st;
    unsigned char digest[crypto_hash_sha256_BYTES];
    char hex[SHA256_HEX];
    ckpt_sha256_final(&rd->h, digest);
    to_hex(hex, digest, sizeof digest);
    if (strcmp(hex, sh->sha256) != 0)
        return ckpt_fail(rd->ck, DT_EPROTO, DT_CKPT_FAULT_HASH,
                         "%s: SHA-256 %s, the manifest says %s", rd->path,
                         hex, sh->sha256);
    return DT_OK;
}

dt_status ckpt_read_shard(dt_ckpt *ck, const char *dir,
                          const ckpt_manifest *m, int r, dt_ckpt_state *s)
{
    const ckpt_shard *sh = &m->shards[r];
    char path[CKPT_PATH_MAX];
    ckpt_join(path, dir, sh->file, "");
    reader rd = {.ck = ck, .path = path};
    rd.fd = open(path, O_RDONLY | O_CLOEXEC);
    if (rd.fd < 0)
        return ckpt_fail(ck, errno == ENOENT ? DT_EPROTO : DT_ESYS,
                         errno == ENOENT ? DT_CKPT_FAULT_MISSING_FILE
                                         : DT_CKPT_FAULT_IO,
                         "%s (rank %d's shard): %s", path, r, strerror(errno));
    struct stat stt;
    dt_status st = DT_OK;
    if (fstat(rd.fd, &stt) != 0 || !S_ISREG(stt.st_mode))
        st = ckpt_fail(ck, DT_EPROTO, DT_CKPT_FAULT_IO,
                       "%s: not a regular file", path);
    else if ((uint64_t)stt.st_size != sh->bytes)
        st = ckpt_fail(ck, DT_EPROTO, DT_CKPT_FAULT_SIZE,
                       "%s: %lld bytes on disk, the manifest says %llu "
                       "(truncated or replaced?)", path,
                       (long long)stt.st_size,
                       (unsigned long long)sh->bytes);
    if (st == DT_OK && !(rd.scratch = malloc(CHUNK_BYTES)))
        st = ckpt_fail(ck, DT_ENOMEM, DT_CKPT_FAULT_IO, "out of memory");
    if (st == DT_OK) {
        ckpt_sha256_init(&rd.h);
        st = read_body(&rd, m, r, s);
    }
    free(rd.scratch);
    close(rd.fd);
    return st;
}
