/*
 * shard_read.c — reading one shard file back against the manifest, in one
 * of two ways:
 *
 *   verifying  every byte streamed in file order through SHA-256, which
 *              must equal the manifest's. The parts the caller holds are
 *              read straight into its buffers (and hashed there), the rest
 *              through a 1 MiB scratch, so memory stays bounded.
 *   checking   no hash: the header and the section table are pread and
 *              checked, then only the parts the caller holds are pread
 *              into its buffers; bytes it does not hold are never read.
 *              The collective load reads this way the shards that another
 *              rank verifies (load.c), so each byte is hashed once per job.
 *
 * Both check, before trusting anything, that the file is a regular file
 * (opened without following a symlink or blocking on a FIFO, fsutil.c)
 * whose size equals the manifest's (before any read or allocation), every
 * header field against the manifest, and that the section table lists
 * exactly the manifest's ranges, back to back. A reader never trusts a
 * size from the file to allocate.
 *
 * Invariant of the checking reader: its caller must learn the verifying
 * reader's verdict on the same file before it trusts the bytes (load.c
 * agrees on one verdict collectively). The two read the same file at about
 * the same time; a file rewritten between the two reads is outside what
 * the hash protects against here (the committed files are never rewritten
 * in place: a re-save writes .tmp files and renames).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_internal.h"

#define CHUNK_BYTES ((size_t)1 << 20)
#define IO_MAX ((size_t)1 << 30)

typedef struct reader {
    dt_ckpt *ck;
    int fd;
    const char *path;
    bool verify;            /* stream and hash every byte */
    ckpt_sha256 *h;         /* verify: SHA-256 of the bytes so far */
    unsigned char *scratch; /* verify: CHUNK_BYTES for bytes nobody holds */
} reader;

static dt_status read_failed(reader *rd, ssize_t r)
{
    return ckpt_fail(rd->ck, r < 0 ? DT_ESYS : DT_EPROTO,
                     r < 0 ? DT_CKPT_FAULT_IO : DT_CKPT_FAULT_SIZE, "%s: %s", rd->path,
                     r < 0 ? strerror(errno) : "shorter than its header says");
}

/* Verifying: the next len bytes of the file into dst, hashed. */
static dt_status read_hashed(reader *rd, void *dst, size_t len)
{
    char *p = dst;
    while (len > 0) {
        ssize_t r = read(rd->fd, p, len < IO_MAX ? len : IO_MAX);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return read_failed(rd, r);
        ckpt_sha256_update(rd->h, (unsigned char *)p, (size_t)r);
        p += r;
        len -= (size_t)r;
    }
    return DT_OK;
}

/* Checking: len bytes at file offset off into dst. */
static dt_status read_at(reader *rd, void *dst, size_t len, uint64_t off)
{
    char *p = dst;
    while (len > 0) {
        ssize_t r = pread(rd->fd, p, len < IO_MAX ? len : IO_MAX, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return read_failed(rd, r);
        p += r;
        off += (uint64_t)r;
        len -= (size_t)r;
    }
    return DT_OK;
}

/* len bytes at file offset off into dst. The verifying reader is at off
 * already (it reads every byte in order). */
static dt_status read_into(reader *rd, void *dst, size_t len, uint64_t off)
{
    return rd->verify ? read_hashed(rd, dst, len) : read_at(rd, dst, len, off);
}

/* Bytes the caller does not hold: hashed through scratch when verifying,
 * not read at all when checking. */
static dt_status skip(reader *rd, uint64_t len)
{
    while (rd->verify && len > 0) {
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
    *lo = k == KIND_PARAMS ? s->held_lo : s->opt_lo;
    *n = k != KIND_PARAMS ? s->opt_n : s->held_n ? s->held_n : s->num_params;
    float *b[KIND_COUNT] = {s->params, s->master, s->adam_m, s->adam_v};
    return b[k];
}

/* Reads one section, elements [off, off+count) stored at file offset fo:
 * the part inside the destination's range straight into it, the rest
 * skipped. */
static dt_status read_section(reader *rd, int k, uint64_t off, uint64_t count, uint64_t fo,
                              dt_ckpt_state *s)
{
    uint64_t dlo = 0, dn = 0;
    float *dst = dest_of(s, k, &dlo, &dn);
    uint64_t a = off, b = off + count;
    uint64_t ia = a > dlo ? a : dlo, ib = b < dlo + dn ? b : dlo + dn;
    if (!dst || ia >= ib)
        return skip(rd, count * sizeof(float));
    dt_status st = skip(rd, (ia - a) * sizeof(float));
    if (st == DT_OK)
        st = read_into(rd, dst + (ia - dlo), (ib - ia) * sizeof(float),
                       fo + (ia - a) * sizeof(float));
    if (st == DT_OK)
        st = skip(rd, (b - ib) * sizeof(float));
    return st;
}

/* Header fields against the manifest. */
static dt_status check_header(reader *rd, const unsigned char *hdr, const ckpt_manifest *m, int r)
{
    const char *bad = NULL;
    if (memcmp(hdr, SHARD_MAGIC, 8) != 0)
        bad = "magic";
    else if (get_le32(hdr + 8) != SHARD_VERSION)
        bad = "version";
    else if (get_le32(hdr + 12) != (uint32_t)r)
        bad = "rank";
    else if (get_le32(hdr + 16) != (uint32_t)m->world)
        bad = "world";
    else if (get_le32(hdr + 20) != (uint32_t)m->mode)
        bad = "mode";
    else if (get_le64(hdr + 32) != (uint64_t)m->step)
        bad = "step";
    else if (get_le64(hdr + 40) != m->seed || get_le64(hdr + 48) != m->data_row ||
             get_le64(hdr + 56) != m->rng_state)
        bad = "seed/data_row/rng_state";
    else if (get_le64(hdr + 64) != m->num_params)
        bad = "num_params";
    if (bad)
        return ckpt_fail(rd->ck, DT_EPROTO, DT_CKPT_FAULT_HEADER,
                         "%s: header field %s disagrees with the manifest", rd->path, bad);
    return DT_OK;
}

/* The section table must list exactly the manifest's ranges, each kind
 * once, in order, back to back; kinds[i] and file_offsets[i] say what
 * section i is. */
static dt_status check_sections(reader *rd, const unsigned char *t, int nsec, const ckpt_shard *sh,
                                uint64_t *kinds, uint64_t *file_offsets)
{
    uint64_t fo = SHARD_HEADER_BYTES + (uint64_t)nsec * SECTION_BYTES;
    int listed = 0;
    for (int k = 0; k < KIND_COUNT; k++)
        listed += sh->ranges[k].present;
    if (listed != nsec)
        return ckpt_fail(rd->ck, DT_EPROTO, DT_CKPT_FAULT_HEADER,
                         "%s: %d sections, the manifest lists %d", rd->path, nsec, listed);
    unsigned seen = 0; /* kinds listed so far: each at most once */
    for (int i = 0; i < nsec; i++, t += SECTION_BYTES) {
        uint32_t k = get_le32(t);
        const ckpt_range *want = k < KIND_COUNT ? &sh->ranges[k] : NULL;
        if (want && (seen & (1u << k)))
            return ckpt_fail(rd->ck, DT_EPROTO, DT_CKPT_FAULT_HEADER,
                             "%s: section %d repeats kind %u (%s)", rd->path, i, k,
                             ckpt_kind_names[k]);
        if (!want || !want->present || get_le64(t + 8) != want->offset ||
            get_le64(t + 16) != want->count || get_le64(t + 24) != fo)
            return ckpt_fail(rd->ck, DT_EPROTO, DT_CKPT_FAULT_HEADER,
                             "%s: section %d (kind %u) disagrees with the "
                             "manifest's ranges",
                             rd->path, i, k);
        seen |= 1u << k;
        kinds[i] = k;
        file_offsets[i] = fo;
        fo += want->count * sizeof(float);
    }
    if (fo != sh->bytes)
        return ckpt_fail(rd->ck, DT_EPROTO, DT_CKPT_FAULT_SIZE,
                         "%s: sections end at byte %llu, the manifest says "
                         "%llu bytes",
                         rd->path, (unsigned long long)fo, (unsigned long long)sh->bytes);
    return DT_OK;
}

static dt_status check_digest(reader *rd, const ckpt_shard *sh)
{
    unsigned char digest[32];
    char hex[SHA256_HEX];
    if (!ckpt_sha256_final(rd->h, digest))
        return ckpt_fail(rd->ck, DT_ENOMEM, DT_CKPT_FAULT_IO,
                         "%s: the SHA-256 library failed (out of memory?)", rd->path);
    ckpt_to_hex(hex, digest, sizeof digest);
    if (strcmp(hex, sh->sha256) != 0)
        return ckpt_fail(rd->ck, DT_EPROTO, DT_CKPT_FAULT_HASH,
                         "%s: SHA-256 %s, the manifest says %s", rd->path, hex, sh->sha256);
    return DT_OK;
}

static dt_status read_body(reader *rd, const ckpt_manifest *m, int r, dt_ckpt_state *s)
{
    const ckpt_shard *sh = &m->shards[r];
    unsigned char hdr[SHARD_HEADER_BYTES + MAX_SECTIONS * SECTION_BYTES];
    dt_status st = read_into(rd, hdr, SHARD_HEADER_BYTES, 0);
    if (st != DT_OK)
        return st;
    if ((st = check_header(rd, hdr, m, r)) != DT_OK)
        return st;
    uint32_t nsec = get_le32(hdr + 24);
    if (nsec < 1 || nsec > MAX_SECTIONS)
        return ckpt_fail(rd->ck, DT_EPROTO, DT_CKPT_FAULT_ABSURD, "%s: %u sections (at most %d)",
                         rd->path, nsec, MAX_SECTIONS);
    unsigned char *t = hdr + SHARD_HEADER_BYTES;
    if ((st = read_into(rd, t, nsec * SECTION_BYTES, SHARD_HEADER_BYTES)) != DT_OK)
        return st;
    uint64_t kinds[MAX_SECTIONS], fos[MAX_SECTIONS];
    if ((st = check_sections(rd, t, (int)nsec, sh, kinds, fos)) != DT_OK)
        return st;
    for (uint32_t i = 0; i < nsec && st == DT_OK; i++) {
        const ckpt_range *g = &sh->ranges[kinds[i]];
        st = read_section(rd, (int)kinds[i], g->offset, g->count, fos[i], s);
    }
    if (st != DT_OK || !rd->verify)
        return st;
    return check_digest(rd, sh);
}

dt_status ckpt_read_shard(dt_ckpt *ck, const char *dir, const ckpt_manifest *m, int r,
                          dt_ckpt_state *s, bool verify)
{
    const ckpt_shard *sh = &m->shards[r];
    char path[CKPT_PATH_MAX];
    ckpt_join(path, dir, sh->file, "");
    reader rd = {.ck = ck, .path = path, .verify = verify};
    struct stat stt;
    rd.fd = ckpt_open_regular(ck, path, &stt);
    if (rd.fd < 0 && errno == ENOENT)
        return ckpt_fail(ck, DT_EPROTO, DT_CKPT_FAULT_MISSING_FILE, "%s (rank %d's shard): %s",
                         path, r, strerror(ENOENT));
    if (rd.fd < 0)
        return ck->status;
    dt_status st = DT_OK;
    if ((uint64_t)stt.st_size != sh->bytes)
        st = ckpt_fail(ck, DT_EPROTO, DT_CKPT_FAULT_SIZE,
                       "%s: %lld bytes on disk, the manifest says %llu "
                       "(truncated or replaced?)",
                       path, (long long)stt.st_size, (unsigned long long)sh->bytes);
    if (st == DT_OK && verify &&
        (!(rd.scratch = malloc(CHUNK_BYTES)) || !(rd.h = ckpt_sha256_new())))
        st = ckpt_fail(ck, DT_ENOMEM, DT_CKPT_FAULT_IO, "out of memory");
    if (st == DT_OK)
        st = read_body(&rd, m, r, s);
    ckpt_sha256_free(rd.h);
    free(rd.scratch);
    close(rd.fd);
    return st;
}
