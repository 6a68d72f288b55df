/*
 * ckpt_internal.h — what the checkpoint layer's files share and the public
 * header does not say: the handle, the shard file's binary layout, the
 * in-memory manifest, and the small file-system helpers.
 *
 * Shard file layout (little-endian):
 *   header (SHARD_HEADER_BYTES)
 *     magic "DTCKSHD1", u32 version, u32 rank, u32 world, u32 mode,
 *     u32 num_sections, u32 reserved, u64 step, u64 seed, u64 data_row,
 *     u64 rng_state, u64 num_params
 *   section table: num_sections x (u32 kind, u32 reserved, u64 offset,
 *     u64 count, u64 file_offset)          offset/count in elements
 *   sections, in table order, f32 raw
 * The SHA-256 in the manifest covers the whole file, header included.
 */
#ifndef DT_CKPT_INTERNAL_H
#define DT_CKPT_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "dt_ckpt.h"

#define SHARD_MAGIC "DTCKSHD1"
#define SHARD_VERSION 1u
#define SHARD_HEADER_BYTES 72
#define SECTION_BYTES 32
#define MAX_SECTIONS 4
#define SHA256_HEX 65 /* 64 hex digits + NUL */
/* A manifest is about 370 bytes of header and one entry per shard, ~440
 * bytes with every number at its bound (JSON_INDENT(1)): these caps hold
 * any manifest the writer makes and refuse bigger ones before parsing
 * (a parse costs ~20x its size in memory). */
#define MANIFEST_HEADER_BYTES 4096
#define MANIFEST_SHARD_BYTES 512
#define MANIFEST_MAX_BYTES \
    ((size_t)MANIFEST_HEADER_BYTES + (size_t)MANIFEST_SHARD_BYTES * DT_CKPT_MAX_WORLD)
#define CKPT_PATH_MAX 4096

/* The arrays a checkpoint stores, in file order. */
typedef enum ckpt_kind { KIND_PARAMS = 0, KIND_MASTER, KIND_M, KIND_V, KIND_COUNT } ckpt_kind;
extern const char *const ckpt_kind_names[KIND_COUNT]; /* "params", ... */

typedef struct ckpt_range {
    bool present;
    uint64_t offset, count; /* elements of the flat layout */
} ckpt_range;

/* One shard as the manifest (or a writer) describes it. */
typedef struct ckpt_shard {
    int rank;
    char file[64];
    uint64_t bytes;
    char sha256[SHA256_HEX];
    ckpt_range ranges[KIND_COUNT];
} ckpt_shard;

_Static_assert(sizeof(long) >= 8, "a step is a 64-bit count (long)");

typedef struct ckpt_manifest {
    int schema;
    long step;
    int world;
    dt_ckpt_mode mode;
    int tp; /* 1, or "tp": T (written only when T > 1) */
    dt_config cfg;
    uint64_t num_params; /* of the flat buffer: dt_ckpt_flat_params */
    uint64_t seed, data_row, rng_state;
    ckpt_shard *shards; /* [world], index = rank after validation */
} ckpt_manifest;

struct dt_ckpt {
    char root[CKPT_PATH_MAX];
    dt_ckpt_options opts;
    dt_ckpt_fault fault;
    dt_status status; /* of the last failure since the call began */
    char err[1024];
    pthread_t reaper; /* rotate.c: removes rotated-out directories */
    bool reaping;     /* reaper started and not yet joined */
};

/* failure.c: every file of the layer reports through these. */
/* Records the failure (status, fault, message) and returns st. */
__attribute__((format(printf, 4, 5))) dt_status
ckpt_fail(dt_ckpt *ck, dt_status st, dt_ckpt_fault fault, const char *fmt, ...);
/* Clears the last failure: each public call reports only its own. */
void ckpt_reset(dt_ckpt *ck);

/* verdict.c */
/* Collective over comm (NULL: returns ck->status): every rank returns the
 * same status, and ranks other than the lowest one that failed take over
 * its fault and message, as "rank K of the <what> found: <message>".
 * Each rank's own outcome is ck->status. Cost: one 4-byte all-reduce,
 * plus one 1 KiB broadcast when a rank failed. */
dt_status ckpt_agree(dt_ckpt *ck, dt_comm *comm, const char *what);

/* fsutil.c */
bool ckpt_name_is_safe(const char *name);
/* Opens path read-only if it is a regular file: never through a symlink,
 * never blocking on a FIFO, the type checked on what was opened. Returns
 * the fd, or -1: errno ENOENT when nothing is there (nothing recorded: the
 * caller says what that means), else the failure is on ck. */
int ckpt_open_regular(dt_ckpt *ck, const char *path, struct stat *st);
/* DT_OK if dir is a directory and not a symlink to one. */
dt_status ckpt_check_dir(dt_ckpt *ck, const char *dir);
/* Creates a .tmp to write, never through what is at its name: a stale one
 * that is a regular file of this user is removed first, anything else is
 * refused. Returns the fd, or -1 with the failure on ck. */
int ckpt_create_tmp(dt_ckpt *ck, const char *path);
int ckpt_fsync_dir(const char *dir);
/* Writes data to dir/name through name.tmp, fsync, rename, fsync(dir). */
dt_status ckpt_write_atomic(dt_ckpt *ck, const char *dir, const char *name, const void *data,
                            size_t len);
/* Reads a whole small file (at most max bytes) into a malloc'ed,
 * NUL-terminated buffer. */
dt_status ckpt_read_small(dt_ckpt *ck, const char *path, size_t max, char **out, size_t *len);
void ckpt_step_name(char *buf, size_t len, long step);

/* rotate.c */
bool ckpt_newest_committed(const dt_ckpt *ck, long except, char *name);
/* Removes step directories beyond the newest `keep` committed ones (never
 * the one latest names) and stale .tmp files. Best effort. A removed
 * directory stops being a step directory before this returns (renamed);
 * its files go in a background thread, joined by ckpt_rotate_wait. */
void ckpt_rotate(dt_ckpt *ck, int keep, const char *latest_name);
/* Waits for the handle's background removal, if one is running. */
void ckpt_rotate_wait(dt_ckpt *ck);

/* shard_file.c */
/* Writes rank r's shard of s (partition over world) to dir, filling rec. */
dt_status ckpt_write_shard(dt_ckpt *ck, const char *dir, const dt_ckpt_state *s, int r, int world,
                           ckpt_shard *rec);
/* The record of rank r's shard (all but its sha256), as every rank can
 * compute it from the partition. */
void ckpt_describe_shard(const dt_ckpt_state *s, int r, int world, ckpt_shard *rec);
/* Rank r's slice [lo, lo + n) of full's layout (its slices, or the even
 * partition). */
void ckpt_slice_of(const dt_ckpt_state *s, int r, int world, size_t *lo, size_t *n);

/* ckpt.c: dt_ckpt_save_all's shards one at a time, each from what
 * fill(user, full, r, world, slice) puts in *slice (a copy of full to
 * start with): a state holding at least rank r's slice, so that full
 * itself need hold no data (reshard_stream.c). fill NULL: full's arrays. */
typedef dt_status (*ckpt_slice_fn)(void *user, const dt_ckpt_state *full, int r, int world,
                                   dt_ckpt_state *slice);
dt_status ckpt_save_each(dt_ckpt *ck, const dt_ckpt_state *full, int world, ckpt_slice_fn fill,
                         void *user);

/* shard_read.c */
/* Reads shard r's file, checking it against m->shards[r] and copying its
 * intersections with what s holds into s (s NULL: copy nothing). verify:
 * every byte is read and hashed against the manifest's SHA-256; otherwise
 * only the header, the section table and the bytes s holds are read, and
 * the hash is another reader's job (the collective load). */
dt_status ckpt_read_shard(dt_ckpt *ck, const char *dir, const ckpt_manifest *m, int r,
                          dt_ckpt_state *s, bool verify);

/* sha256.c: SHA-256 as a stream (OpenSSL libcrypto; the one file that
 * names the implementation). new: NULL when out of memory. final: false
 * if any step failed inside the library (then out is not the digest);
 * call it once, then free. */
typedef struct ckpt_sha256 ckpt_sha256;
ckpt_sha256 *ckpt_sha256_new(void);
void ckpt_sha256_update(ckpt_sha256 *h, const void *data, size_t n);
bool ckpt_sha256_final(ckpt_sha256 *h, unsigned char out[32]);
void ckpt_sha256_free(ckpt_sha256 *h);

/* fsutil.c: write all of data[0..len), retrying short writes; false on error */
bool ckpt_write_all(int fd, const void *data, size_t len);

/* hash_overlap.c */
/* A run of bytes to write: p NULL stands for len zero bytes. */
typedef struct ckpt_span {
    const void *p;
    size_t len;
} ckpt_span;
/* Writes the spans to fd and fsyncs it while a second thread computes
 * their SHA-256 into digest. Returns 0 or the errno of the failure. */
int ckpt_write_spans_hashed(int fd, const ckpt_span *spans, int n, unsigned char digest[32]);

/* manifest.c */
dt_status ckpt_manifest_write(dt_ckpt *ck, const char *dir, const ckpt_manifest *m);
/* Parses and validates dir/manifest.json; m->shards malloc'ed. */
dt_status ckpt_manifest_read(dt_ckpt *ck, const char *dir, ckpt_manifest *m);
void ckpt_manifest_free(ckpt_manifest *m);

/* buf (CKPT_PATH_MAX) = dir/name suffix; the root's length is bounded at
 * open, so a path never truncates (an empty one would fail to open). */
static inline void ckpt_join(char *buf, const char *dir, const char *name, const char *suffix)
{
    if (snprintf(buf, CKPT_PATH_MAX, "%s/%s%s", dir, name, suffix) >= CKPT_PATH_MAX)
        buf[0] = '\0';
}

/* out (2n + 1 chars) = lowercase hex of h[0..n) */
static inline void ckpt_to_hex(char *out, const unsigned char *h, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[h[i] >> 4];
        out[2 * i + 1] = digits[h[i] & 15];
    }
    out[2 * n] = '\0';
}

/* Little-endian field access. */
static inline void put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static inline void put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t get_le32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static inline uint64_t get_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

#endif /* DT_CKPT_INTERNAL_H */
