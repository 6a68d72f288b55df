/*
 * dt_ckpt.h — the public interface of dtrain's checkpoint layer: sharded,
 * verified, atomically committed training state.
 *
 * On disk, under a root directory:
 *
 *   root/latest                  "step_00000010\n": the last committed step
 *   root/step_00000010/
 *       rank00000.bin ...        one shard per rank, written by that rank
 *       manifest.json            the commit marker, written last by rank 0
 *
 * Who writes what. The flat parameter buffer (and every optimizer array
 * laid out like it) is cut the way ZeRO-1 cuts it: s = ceil(Ψ/N), rank r
 * owns [r·s, (r+1)·s) clipped to Ψ. Rank r's shard holds exactly that
 * slice of the parameters, of AdamW's m and v and, under ZeRO-1, of the
 * fp32 master; plus the step count, the data position (next global row)
 * and the RNG state in its header. Under DDP every rank holds the full,
 * identical m and v: each still writes only its 1/N slice (the replicas
 * are bitwise equal, which the trainer checks), so the N writes are equal
 * in size and run in parallel, and no rank gathers anything.
 *
 * Commit protocol (dt_ckpt_save, collective):
 *   rank 0 creates the step directory and removes a stale manifest   barrier
 *   each rank: rankNNNNN.bin.tmp, SHA-256 while writing, fsync, rename
 *   gather (bytes, sha256, ok) to rank 0        = "all shards written"
 *   rank 0: manifest.json.tmp, fsync, rename, fsync(dir);
 *           latest.tmp, fsync, rename, fsync(root); rotation (--keep)
 *   all-reduce of the verdicts (the lowest failing rank's message is
 *   broadcast to all)                           = "manifest committed"
 * A crash anywhere leaves `latest` naming a complete, verified step: the
 * manifest is the commit marker, and `latest` moves only after it.
 *
 * Loading reads the shards named by the manifest, checks everything
 * (manifest present and valid JSON, schema version, world size, ranks in
 * range, unique and complete, safe file names, sizes, header fields,
 * coverage of [0, Ψ) for every array, SHA-256), and copies the
 * intersection of each shard's global ranges with what the caller holds —
 * which is all resharding N -> M needs. Each failure is a dt_status plus a
 * dt_ckpt_fault and a message naming the file and the field. The
 * collective load splits the hashing: shard r is hashed by rank r mod M
 * alone, every rank checks the structure of what it reads, and one
 * all-reduce makes the verdicts one.
 *
 * Cost: save writes (Ψ + [Ψ master] + 2Ψ)·4 bytes in total, 1/N per rank,
 * plus one SHA-256 pass over them. The collective load on M ranks hashes
 * 1/M of the checkpoint per rank and reads that plus the parameters and
 * the rank's optimizer slice; dt_ckpt_load (one process) reads and hashes
 * everything. Host memory only: a device backend stages through host
 * buffers. Byte order: little-endian hosts.
 */
#ifndef DT_CKPT_H
#define DT_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dt_comm.h"
#include "dt_model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_CKPT_SCHEMA_VERSION 1
/* The most ranks one checkpoint describes; with it, the manifest's size
 * cap (a bit over 2 MiB: 512 bytes a shard) bounds what reading one costs. */
#define DT_CKPT_MAX_WORLD 4096

typedef enum dt_ckpt_mode { DT_CKPT_DDP = 0, DT_CKPT_ZERO1 = 1 } dt_ckpt_mode;

/* What went wrong, for callers (and tests) that must tell corruptions
 * apart; the message says it in words. */
typedef enum dt_ckpt_fault {
    DT_CKPT_FAULT_NONE = 0,
    DT_CKPT_FAULT_IO,            /* a system call failed */
    DT_CKPT_FAULT_NO_CHECKPOINT, /* no latest / directory without manifest */
    DT_CKPT_FAULT_BAD_JSON,      /* manifest is not valid JSON */
    DT_CKPT_FAULT_SCHEMA,        /* unknown schema version or format */
    DT_CKPT_FAULT_FIELD,         /* a manifest field missing or mistyped */
    DT_CKPT_FAULT_WORLD,         /* world size differs (and no reshard) */
    DT_CKPT_FAULT_CONFIG,        /* model config / parameter count differ */
    DT_CKPT_FAULT_RANK_RANGE,    /* a shard's rank outside [0, world) */
    DT_CKPT_FAULT_RANK_DUP,      /* two shards claim one rank */
    DT_CKPT_FAULT_RANK_MISSING,  /* a rank has no shard */
    DT_CKPT_FAULT_UNSAFE_NAME,   /* file name with '/', "..", absolute */
    DT_CKPT_FAULT_MISSING_FILE,  /* a shard file does not exist */
    DT_CKPT_FAULT_SIZE,          /* file size differs from the manifest */
    DT_CKPT_FAULT_HASH,          /* SHA-256 differs */
    DT_CKPT_FAULT_ABSURD,        /* sizes or offsets out of any sane range */
    DT_CKPT_FAULT_HEADER,        /* shard header disagrees with manifest */
    DT_CKPT_FAULT_COVERAGE,      /* ranges do not tile [0, Ψ) */
} dt_ckpt_fault;

const char *dt_ckpt_fault_name(dt_ckpt_fault f); /* "DT_CKPT_FAULT_HASH" */

/*
 * One rank's training state, described by pointers into the caller's
 * memory (save reads it, load fills it). params is the full replica
 * (num_params); the optimizer arrays cover [opt_lo, opt_lo + opt_n) of the
 * flat layout, index 0 = element opt_lo: the whole buffer under DDP, the
 * rank's shard under ZeRO-1. master is NULL under DDP. On save, rank r's
 * slice [r·s, r·s + n_r) must lie inside the optimizer range.
 */
typedef struct dt_ckpt_state {
    dt_config cfg;
    dt_ckpt_mode mode;
    int rank, world;
    long step;          /* optimizer steps done = AdamW's step count */
    uint64_t seed;      /* data and initialisation seed */
    uint64_t data_row;  /* next global row of the batch sequence */
    uint64_t rng_state; /* the trainer's RNG state */
    size_t num_params;
    float *params; /* (held_n, or num_params when held_n is 0) */
    /* What params holds: [held_lo, held_lo + held_n) of the flat buffer,
     * a pipeline stage's range; held_n = 0: all of it (a replica). */
    size_t held_lo, held_n;
    /* Who saves what: rank r's shard is [slices[r], slices[r + 1]) of the
     * flat buffer (world + 1 entries, nondecreasing from 0 to num_params,
     * the same on every rank: dt_ckpt_pipeline_slices), or with slices
     * NULL dt_ckpt_partition's r-th. Each slice lies in what its rank
     * holds (params and optimizer range). Loading ignores it. */
    const size_t *slices;
    /* With slices: rank r saves slice slice_order[r] (a permutation of
     * 0 .. world - 1, the same on every rank), so that ranks whose order
     * is not the buffer's can save consecutive pieces of it (a tp run:
     * dt_ckpt_tp_slices); NULL: rank r saves slice r. */
    const int *slice_order;
    /* 0 or 1: the flat buffer is the model's (dt_config_num_params). T > 1:
     * it is the T tensor-parallel shares of the model end to end (share t
     * = dt_tp_layout_slice's rank t without its vocabulary padding:
     * dt_tp_share_kept), num_params = dt_ckpt_flat_params, where
     * dt_ckpt_tp_range places a range of a share. A load refuses another T. */
    int tp;
    size_t opt_lo, opt_n;
    float *master; /* (opt_n) or NULL */
    float *adam_m; /* (opt_n) */
    float *adam_v; /* (opt_n) */
} dt_ckpt_state;

/* Rank r's slice of a flat buffer of n elements over world ranks. */
void dt_ckpt_partition(size_t n, int world, int r, size_t *lo, size_t *count);
/*
 * The slices (P·D + 1 entries) of a pipelined world of P stages x D
 * replicas, rank g = stage g / D of replica g % D: stage s's range
 * [stage_bounds[s], stage_bounds[s + 1]) of the flat buffer cut over its
 * replicas as dt_ckpt_partition cuts (ZeRO-1's shards of the stage).
 * Ranks in order hold consecutive slices, so a checkpoint of a pipelined
 * run is one of another world size for whoever loads it.
 */
void dt_ckpt_pipeline_slices(size_t *slices, const size_t *stage_bounds, int P, int D);

/* ---- tensor-parallel checkpoints (tp_share.c) ---- */
/* The flat buffer's length for tp (0 or 1: the model's Ψ; T > 1: T shares
 * end to end, without their vocabulary padding); 0 if dt_tp_config_check
 * refuses T. */
size_t dt_ckpt_flat_params(const dt_config *cfg, int tp);
/*
 * Range [lo, lo + n) of tp rank t's share (dt_tp_num_params, padded) in
 * the flat buffer of a T checkpoint: its part that the checkpoint keeps
 * (no padding) is *kept elements at *flat_lo, which are elements [*skip,
 * *skip + *kept) of the range. *kept is 0 for a range of padding only.
 */
void dt_ckpt_tp_range(const dt_config *cfg, int T, int t, size_t lo, size_t n, size_t *flat_lo,
                      size_t *skip, size_t *kept);
/*
 * minigpt --tp T --dp D's layout (T·D + 1 slices, T·D orders): share t's
 * range of the flat buffer cut over the D replicas as dt_ckpt_partition
 * cuts the (padded) share, the padding left out, slice t·D + replica; world rank replica·T + t saves it
 * (slice_order). Ranks of one replica save pieces of different shares.
 */
void dt_ckpt_tp_slices(size_t *slices, int *order, const dt_config *cfg, int T, int D);
/*
 * A full state (every array over its whole flat buffer: held_n 0, opt_lo
 * 0, opt_n = num_params) of one tp layout as another: in's arrays cut or
 * joined into out's, malloc'ed (dt_ckpt_tp_free). To T = 1 the replicated
 * tensors (LayerNorms, wpe, mlp.proj.bias) are share 0's, which a tp run
 * keeps bitwise equal to the others'. Everything but the arrays, tp,
 * num_params and opt_n is in's. DT_EINVAL (dt_tp_config_check refuses T)
 * or DT_ENOMEM.
 */
dt_status dt_ckpt_tp_convert(dt_ckpt_state *out, const dt_ckpt_state *in, int tp);
void dt_ckpt_tp_free(dt_ckpt_state *s);
/*
 * minigpt --dp D --tp T --pp P's layout (grid_slices.c; T·P·D + 1 slices,
 * T·P·D orders): in share t of the flat buffer, stage s's range (blocks
 * [blocks[s], blocks[s + 1]), P + 1 bounds) cut over the D replicas as
 * dt_ckpt_partition cuts, slice (t·P + s)·D + replica; world rank
 * s·D·T + replica·T + t saves it (slice_order). T = 1 gives
 * dt_ckpt_pipeline_slices' slices, P = 1 dt_ckpt_tp_slices' (the padding
 * left out the same way). DT_EINVAL if dt_tp_config_check refuses T,
 * DT_ENOMEM.
 */
dt_status dt_ckpt_grid_slices(size_t *slices, int *order, const dt_config *cfg, int T, int P, int D,
                              const int *blocks);

/* What the manifest of one step directory says (dt_ckpt_inspect). */
typedef struct dt_ckpt_info {
    long step;
    int world;
    int tp; /* 1, or the manifest's "tp" */
    dt_ckpt_mode mode;
    dt_config cfg;
    size_t num_params;
    uint64_t seed, data_row, rng_state;
    uint64_t total_bytes; /* all shards */
} dt_ckpt_info;

typedef struct dt_ckpt dt_ckpt;

typedef struct dt_ckpt_options {
    int keep;           /* keep the K newest steps (0 = all) */
    bool allow_reshard; /* load accepts another world size or mode */
    bool new_step_only; /* save refuses a step directory that exists, in any
                           state (dtrain-ckpt: a tool never replaces one) */
} dt_ckpt_options;

/* Opens the checkpoint root dir (created by save if missing). Always sets
 * *out (NULL only on DT_ENOMEM). opts may be NULL (keep all, no reshard). */
dt_status dt_ckpt_open(dt_ckpt **out, const char *root, const dt_ckpt_options *opts);
/* Waits for the handle's background removal of rotated-out steps (see
 * dt_ckpt_save), then frees it. */
void dt_ckpt_close(dt_ckpt *ck);
/* The last failure's message; control characters in it (from hostile
 * file names) come escaped as \xNN. */
const char *dt_ckpt_error(const dt_ckpt *ck);
dt_ckpt_fault dt_ckpt_last_fault(const dt_ckpt *ck);
/* s into out (cap bytes, cut if it does not fit) with every control
 * character written as \xNN, so a file name printed cannot drive the
 * terminal; returns out. */
const char *dt_ckpt_printable(char *out, size_t cap, const char *s);
const char *dt_ckpt_root(const dt_ckpt *ck);
/* SHA-256 of data[0..n) exactly as shards are hashed (out: 32 bytes);
 * DT_ENOMEM if the hashing library failed. */
dt_status dt_ckpt_sha256(unsigned char out[32], const void *data, size_t n);
/* Which SHA-256 code runs, e.g. "SHA-256 by OpenSSL 3.0.19 ..., EVP_sha256();
 * CPU SHA extensions: yes", written into out (cap bytes); returns out. */
const char *dt_ckpt_sha256_impl(char *out, size_t cap);

/*
 * Collective over comm (NULL: one process, world 1): writes this rank's
 * shard of s into root/step_<s->step>/, and rank 0 commits the manifest
 * and moves `latest` (protocol above), then rotates: the steps beyond
 * --keep stop being step directories at once (renamed), and their files
 * are removed by a thread of rank 0's handle while training goes on.
 * Every rank returns the same verdict, and a failing rank's message
 * reaches all. Blocks on disk and on the collectives.
 */
dt_status dt_ckpt_save(dt_ckpt *ck, dt_comm *comm, const dt_ckpt_state *s);

/*
 * One process writes all `world` shards of a full state (params, and every
 * optimizer array over [0, Ψ)) and commits: the offline reshard. Like
 * dt_ckpt_save, saving a step that exists replaces it (its shards beyond
 * `world` removed), unless the handle was opened with new_step_only.
 */
dt_status dt_ckpt_save_all(dt_ckpt *ck, const dt_ckpt_state *full, int world);

/* The step directory `latest` names, as a path under root, into buf.
 * DT_EINVAL with fault NO_CHECKPOINT if there is none. */
dt_status dt_ckpt_latest(dt_ckpt *ck, char *buf, size_t len);

/* Reads and checks a step directory's manifest (not the shards). */
dt_status dt_ckpt_inspect(dt_ckpt *ck, const char *step_dir, dt_ckpt_info *info);

/* Checks that every shard the manifest lists is there as a regular file of
 * the size it claims, with a header and section table that agree with it,
 * without hashing (W opens and ~200-byte reads). Run it before allocating
 * from dt_ckpt_inspect's sizes: a manifest alone is a few bytes that can
 * claim anything; shards that match it are real data. */
dt_status dt_ckpt_check(dt_ckpt *ck, const char *step_dir);

/*
 * Verifies the step directory and loads it into s: s->cfg, num_params,
 * mode, rank, world and the buffers say what this rank holds; step, seed,
 * data_row and rng_state are filled in. Another world size or mode is
 * refused unless allow_reshard. A ZeRO-1 state loaded from a DDP
 * checkpoint takes its master from the parameters. On failure the
 * buffers' contents are unspecified. s NULL: verify only.
 */
dt_status dt_ckpt_load(dt_ckpt *ck, const char *step_dir, dt_ckpt_state *s);

/* Verifies everything load checks, reading every shard, loading nothing. */
dt_status dt_ckpt_verify(dt_ckpt *ck, const char *step_dir);

/*
 * Collective over comm (NULL: dt_ckpt_load): the same load and the same
 * checks as dt_ckpt_load, with the hashing split over the ranks. Shard r
 * is verified (read whole, SHA-256) by rank r mod world only; every other
 * rank checks its size, header and section table and reads just the bytes
 * it holds. Then one all-reduce (plus a broadcast on failure): every rank
 * returns the same status, the lowest failing rank's fault, and its
 * message naming the shard file and what was wrong ("rank 2 of the load
 * found: …" on the others). s->rank and s->world must be the
 * communicator's. Every rank must call it, even one that cannot load (pass
 * s NULL to take part as a verifier only). Blocks on disk and on the
 * collective.
 */
dt_status dt_ckpt_load_collective(dt_ckpt *ck, dt_comm *comm, const char *step_dir,
                                  dt_ckpt_state *s);

/*
 * The offline reshard without the whole state in memory: verifies every
 * shard of in's step_dir, then writes it into out's root as `world`
 * shards (laid out by slices and slice_order, as a state's; NULL: the
 * even partition) one at a time, each read from the input shards that
 * hold its slice, and commits; the same bytes as dt_ckpt_load +
 * dt_ckpt_save_all. Holds 16 bytes per parameter of the largest output
 * slice. Not for a --tp checkpoint (DT_EINVAL). Failures on out.
 */
dt_status dt_ckpt_reshard_streamed(dt_ckpt *out, dt_ckpt *in, const char *step_dir, int world,
                                   const size_t *slices, const int *slice_order);

/*
 * Writes the parameters of a full state as a safetensors file: 8-byte
 * little-endian header length, a JSON header naming each tensor of the
 * model's table (dtype F32, shape, data_offsets), then the raw data.
 */
dt_status dt_ckpt_export_safetensors(dt_ckpt *ck, const char *path, const dt_config *cfg,
                                     const float *params);

/* Whose state_dict names an export uses: dtrain's own (model/minigpt_torch.py's,
 * "wte.weight", "blocks.0.mlp.fc.weight", "lm_head.weight"), or those of the
 * seed curriculum's MiniGPT module ("tok_embed.weight", "blocks.0.mlp.0.weight",
 * "head.weight"), so that its load_state_dict(strict=True) takes the file. */
typedef enum dt_ckpt_names { DT_CKPT_NAMES_DTRAIN, DT_CKPT_NAMES_SEED } dt_ckpt_names;

/* How an export is written: whose names, and the data's dtype, DT_F32 (the
 * checkpoint's values) or DT_BF16 (each rounded to the nearest bf16, ties
 * to even: half the bytes). Zeroed: dtrain's names, F32. */
typedef struct dt_ckpt_export_options {
    dt_ckpt_names names;
    dt_dtype dtype;
} dt_ckpt_export_options;

/* dt_ckpt_export_safetensors, written as o says. */
dt_status dt_ckpt_export_safetensors_as(dt_ckpt *ck, const char *path, const dt_config *cfg,
                                        const float *params, const dt_ckpt_export_options *o);
/*
 * The parameters of a step directory as a safetensors file, streamed:
 * every shard verified (SHA-256), then the data written a 4 MiB window at
 * a time, read from the shards; never the whole model in memory. Not for
 * a --tp checkpoint (DT_EINVAL: its shares must be joined in memory).
 */
dt_status dt_ckpt_export_dir(dt_ckpt *ck, const char *step_dir, const char *path,
                             const dt_ckpt_export_options *o);

#ifdef __cplusplus
}
#endif
#endif /* DT_CKPT_H */
