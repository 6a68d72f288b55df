/*
 * dt_comm.h — the public interface of dtrain's collectives layer.
 *
 * A communicator (dt_comm) joins `world_size` ranks through a rendezvous
 * store, builds a full mesh of authenticated TCP connections, and runs
 * Gloo-style collectives over them. Every operation exists twice:
 *
 *   dt_allreduce_async(comm, ..., &work)   enqueue, return at once
 *   dt_allreduce(comm, ...)                enqueue + dt_work_wait
 *
 * Ordering contract (the same as Gloo's and NCCL's): every rank submits the
 * same collectives in the same order. The n-th collective submitted on one
 * rank meets the n-th on every other rank; its sequence number (#n in error
 * messages) is that position. A rank that disagrees (another op, another
 * count, dtype, reduction or root) gets DT_EPROTO with both sides' view.
 *
 * Threads: the API may be called from one thread at a time per communicator
 * (dt_comm_abort from any thread, at any time). Each communicator owns one
 * thread that runs queued (async) ops in submission order and, while it
 * waits for bytes, the libuv loop that moves them; a blocking collective
 * issued while nothing is queued runs on the caller's thread instead, with
 * no hand-off. Nothing is global; several
 * communicators (or several ranks of one job, as threads) share a process.
 *
 * Costs below use the α-β model: α = per-message latency, β = seconds per
 * byte, n = bytes of the whole buffer, p = world size.
 *
 *   allreduce       ring: 2(p-1)α + 2((p-1)/p)nβ; recursive doubling for
 *                   small n: ⌈log2 p⌉α + ⌈log2 p⌉nβ
 *   reduce_scatter  ring: (p-1)α + ((p-1)/p)nβ        (n = p·recvcount·size)
 *   allgather(v)    ring: (p-1)α + ((p-1)/p)nβ        (n = whole output)
 *   broadcast       binomial tree ⌈log2 p⌉(α + nβ) for small n;
 *                   pipelined chain (p-2+k)(α + nβ/k) with k segments
 *   reduce          binomial tree ⌈log2 p⌉(α + nβ)
 *   gather/scatter  linear at the root: (p-1)α + ((p-1)/p)nβ
 *   (each rooted op above also pays ⌈log2 p⌉α first: the ranks check that
 *   they name the same root, so a disagreement fails every rank in it)
 *   alltoall        pairwise exchange: (p-1)α + ((p-1)/p)nβ
 *   barrier         dissemination: ⌈log2 p⌉α
 *   send/recv       α + nβ
 */
#ifndef DT_COMM_H
#define DT_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status, dtypes, reductions ------------------------------------------ */

/* dt_status and dt_status_name: dt_status.h. */

typedef enum dt_dtype {
    DT_F32,
    DT_F64,
    DT_F16,
    DT_BF16,
    DT_I8,
    DT_U8,
    DT_I32,
    DT_I64,
    DT_NUM_DTYPES
} dt_dtype;

typedef enum dt_redop {
    DT_SUM,
    DT_PROD,
    DT_MIN,
    DT_MAX,
    DT_AVG,
    DT_BAND,
    DT_BOR,
    DT_BXOR,
    DT_NUM_REDOPS
} dt_redop;

size_t dt_dtype_size(dt_dtype t);                /* bytes per element; 0 if unknown */
const char *dt_dtype_name(dt_dtype t);           /* "f32" */
const char *dt_redop_name(dt_redop op);          /* "sum" */
bool dt_redop_supports(dt_redop op, dt_dtype t); /* band/bor/bxor: integers */
/* Parse "f32"/"bf16"/... and "sum"/"max"/...; false if not a name. */
bool dt_dtype_parse(const char *name, dt_dtype *out);
bool dt_redop_parse(const char *name, dt_redop *out);
/* n f32 values to bf16, rounded to nearest even as the collectives round
 * (NaN stays NaN, overflow is ±inf), and back (exact): for callers that
 * send f32 data as bf16 (minigpt --grad-comm bf16). Vectorised; O(n). */
void dt_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n);
void dt_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n);

/* ---- rendezvous store ----------------------------------------------------- */

/*
 * A key-value store shared by the ranks of one job. `url` is
 * "file:///tmp/NAME": one file in PyTorch c10d FileStore's record format
 * (append-only `u32 len, key, u32 len, value`, flock, 10 ms polling).
 * Keys are scoped by `job_id`, so jobs sharing a file never see each
 * other's keys. The path must be a regular file of this user that others
 * cannot write (or nothing, and it is created); a symlink is never
 * followed. A file left by a dead job (no live process holds it open) is
 * reset on open if all its records are a store's; anything else is refused
 * with DT_ESTORE and left untouched. dt_store_close by the last holder
 * removes the file. "tcp://HOST:PORT" and "env://" (MASTER_ADDR,
 * MASTER_PORT) connect to a dt_store_server instead (below); open waits up
 * to 60 s (dt_store_open_within: connect_s) for it to listen, and fails at
 * once on a host name that does not resolve.
 */
typedef struct dt_store dt_store;

/* Always sets *out (NULL only on DT_ENOMEM); read dt_store_error on failure,
 * then dt_store_close. */
dt_status dt_store_open(dt_store **out, const char *url, const char *job_id);
dt_status dt_store_open_within(dt_store **out, const char *url, const char *job_id,
                               double connect_s);
void dt_store_close(dt_store *s);
/* The last handle to close a file:// store removes its file; after this,
 * this handle's close leaves it in place (a file that was there before the
 * job is its owner's, not the job's, to remove). */
void dt_store_keep_file(dt_store *s);
const char *dt_store_error(const dt_store *s);
/* Removes the file of a file:// store whose job is gone: no live handle
 * holds it, and it is all store records PyTorch has not used. A live
 * job's file, or anything else at the path, is left as it is and nothing
 * is written to it. *removed says whether it went; DT_OK also when it is
 * live or absent, DT_ESTORE when the path holds something not ours. */
dt_status dt_store_remove_if_dead(const char *url, bool *removed);

dt_status dt_store_set(dt_store *s, const char *key, const void *val, size_t len);
/* Waits until `key` exists or timeout_s passes (DT_ETIMEDOUT). *val is
 * malloc'ed and NUL-terminated past *len; the caller frees it. */
dt_status dt_store_get(dt_store *s, const char *key, void **val, size_t *len, double timeout_s);
/* Waits until every key in keys[0..n) exists. */
dt_status dt_store_wait(dt_store *s, const char *const *keys, int n, double timeout_s);
/* Atomically adds delta to the integer stored at key (absent = 0) and
 * returns the new value. */
dt_status dt_store_add(dt_store *s, const char *key, int64_t delta, int64_t *result);
/* PyTorch c10d Store's check, delete_key, num_keys and compare_set.
 * check: *all = every key of keys[0..n) exists now (no waiting). delete:
 * *deleted (may be NULL) = the key existed. num_keys: this job's keys on a
 * file:// store, every job's on a tcp:// one (its server counts them all).
 * compare_set: sets key to desired if it holds expected, or, with elen 0,
 * if it is absent; *now (malloc'd, NUL-terminated; now may be NULL) = its
 * value after: desired if set, else the value it holds, or expected if it
 * is absent. */
dt_status dt_store_check(dt_store *s, const char *const *keys, int n, bool *all);
dt_status dt_store_delete(dt_store *s, const char *key, bool *deleted);
dt_status dt_store_num_keys(dt_store *s, int64_t *n);
dt_status dt_store_compare_set(dt_store *s, const char *key, const void *expected, size_t elen,
                               const void *desired, size_t dlen, void **now, size_t *nlen);

/*
 * A store whose operations are the caller's: how a program that has a
 * key-value store of its own (PyTorch's c10d::Store, handed to a
 * torch.distributed backend) lets a communicator rendezvous through it
 * (dt_comm_options.store). Keys reach the functions scoped by job_id
 * ("<job_id>/<key>"). Each function returns DT_OK, or a failure with a
 * one-line message in err[0..errlen): DT_ETIMEDOUT when a wait ran out,
 * DT_ESTORE (or any other status) when the store failed. Values handed
 * back (*val, *now) are malloc'd and NUL-terminated past their length; the
 * store frees them. get and wait wait up to timeout_s; 0 means look once.
 * delete_key and num_keys may be NULL (those calls then fail, DT_EINVAL).
 * The functions are called from the thread that calls dt_store_* (for a
 * communicator: the thread in dt_comm_init), one call at a time per store.
 * Cost: whatever the caller's store costs; nothing is cached here.
 */
typedef struct dt_store_ops {
    dt_status (*set)(void *user, const char *key, const void *val, size_t len, char *err,
                     size_t errlen);
    dt_status (*get)(void *user, const char *key, double timeout_s, void **val, size_t *len,
                     char *err, size_t errlen);
    dt_status (*wait)(void *user, const char *const *keys, int n, double timeout_s, char *err,
                      size_t errlen);
    dt_status (*check)(void *user, const char *const *keys, int n, bool *all, char *err,
                       size_t errlen);
    dt_status (*add)(void *user, const char *key, int64_t delta, int64_t *result, char *err,
                     size_t errlen);
    dt_status (*compare_set)(void *user, const char *key, const void *expected, size_t elen,
                             const void *desired, size_t dlen, void **now, size_t *nlen, char *err,
                             size_t errlen);
    dt_status (*delete_key)(void *user, const char *key, bool *deleted, char *err, size_t errlen);
    dt_status (*num_keys)(void *user, int64_t *n, char *err, size_t errlen);
} dt_store_ops;

/* Opens a store over `ops` (copied) and `user` (borrowed: it must outlive
 * the store). `name` names the store in messages ("torch store"). Always
 * sets *out (NULL only on DT_ENOMEM); dt_store_close frees the handle and
 * calls nothing. */
dt_status dt_store_open_ops(dt_store **out, const dt_store_ops *ops, void *user, const char *name,
                            const char *job_id);

/*
 * The TCP store's server: a key-value table in memory on a libuv loop in its
 * own thread, speaking PyTorch c10d TCPStore's protocol (docs/store-tcp.md),
 * so "tcp://HOST:PORT" stores and torch's TCPStore clients can use it.
 * port 0 picks a free port (read it with dt_store_server_port). No
 * authentication: anyone who can reach the port can read and write it.
 * On failure *out is NULL and err says why.
 */
typedef struct dt_store_server dt_store_server;
dt_status dt_store_server_start(dt_store_server **out, const char *host, int port, char *err,
                                size_t errlen);
int dt_store_server_port(const dt_store_server *s);
void dt_store_server_stop(dt_store_server *s);

/* ---- communicator --------------------------------------------------------- */

typedef struct dt_comm dt_comm;
typedef struct dt_work dt_work;

/* Algorithm override for tests and benchmarks; AUTO picks by size. */
typedef enum dt_algo {
    DT_ALGO_AUTO = 0,
    DT_ALGO_RING,               /* allreduce, reduce_scatter, allgather */
    DT_ALGO_RECURSIVE_DOUBLING, /* allreduce */
    DT_ALGO_TREE,               /* broadcast, reduce: binomial tree */
    DT_ALGO_CHAIN,              /* broadcast: pipelined chain */
    DT_ALGO_RANK_ORDER,         /* allreduce, reduce_scatter, reduce: summed
                                   x0 + x1 + ... + x(p-1) in rank order, the
                                   same bits for any chunking (rank_order.c) */
} dt_algo;

typedef void (*dt_log_fn)(void *user, const char *line);

/* Which wire a communicator speaks. DT_WIRE_DTRAIN: dtrain's own (an
 * authenticated handshake, frames that name op and size). DT_WIRE_GLOO:
 * torch 1.13 gloo's (collectives/gloo/README.md), so that PyTorch ranks
 * can be ranks of the job — with no authentication, as in torch; keys in
 * torch's key space of the store (job_id and secret unused). On it tagged
 * send/recv, groups and device buffers are not available yet (DT_EINVAL). */
typedef enum dt_wire { DT_WIRE_DTRAIN, DT_WIRE_GLOO } dt_wire;

typedef struct dt_comm_options {
    int rank;                  /* 0 .. world_size-1 */
    int world_size;            /* >= 1 */
    const char *init_url;      /* "file:///tmp/NAME", "tcp://HOST:PORT", "env://"; for the
                              last two rank 0 hosts the store while the job starts
                              when HOST is its machine and nobody serves PORT */
    const char *job_id;        /* scopes store keys and handshakes; NULL = the job id
                                 of mpirun/srun's environment, else "dtrain" */
    const uint8_t *secret;     /* per-job key for the handshake ...          */
    size_t secret_len;         /* ... NULL/0: rank 0 makes one, shares it via a file://
                                 store (a tcp:// or env:// store refuses: DT_EINVAL) */
    const char *host;          /* address to listen on and advertise; NULL (and no
                              ifname) = the one the route to a tcp:// or env://
                              server leaves by, else 127.0.0.1 */
    const char *ifname;        /* or: the network interface whose IPv4 address to use */
    double timeout_s;          /* liveness: a peer an op waits on that sends nothing, not
                              even a heartbeat, for this long is stopped, dead or cut
                              off; 0 = 30 s (DT_TIMEOUT) */
    double progress_timeout_s; /* progress: how long an op waits for live peers to
                                  join it and finish; 0 = 1800 s (DT_PROGRESS_TIMEOUT) */
    double init_timeout_s;     /* rendezvous + connecting; 0 = 60 s */
    bool keep_init_file;       /* a file:// store's file stays when the job ends (it was
                              there before: DT_KEEP_INIT_FILE=1 from dtrain-launch) */
    size_t socket_buffer;      /* SO_SNDBUF/SO_RCVBUF; 0 = the kernel's autotuning */
    dt_log_fn log;             /* rejected strangers etc.; NULL = stderr */
    void *log_user;
    struct dt_device *device; /* dt_device.h: ops on buffers this device owns are
                                 staged through pinned host memory; NULL = host
                                 buffers only. Must outlive the communicator. */
    dt_wire wire;             /* DT_WIRE_DTRAIN (0, the default) or DT_WIRE_GLOO */
    dt_store *store;          /* a store to rendezvous through instead of opening
                                 init_url (dt_store_open_ops); borrowed: it must stay
                                 open until dt_comm_init returns. With no secret, rank
                                 0 shares one through it, so it is as private as the
                                 caller's store. init_url, if set, then only picks
                                 the address to advertise (see host). dtrain's wire
                                 only. */
    const char *job_marker;   /* hex, the same on every rank whatever its secret
                                 (DT_JOB_MARKER from a multi-node dtrain-launch):
                                 a rank that joined it with another secret is named
                                 at once ("DT_SECRET differs"), not waited for */
} dt_comm_options;

void dt_comm_options_default(dt_comm_options *o);

/*
 * Fills all of *o: first the defaults (as dt_comm_options_default), then
 * rank, world size, init_url, job_id and secret from the environment the
 * launcher sets (RANK, WORLD_SIZE, DT_INIT_URL, DT_JOB_ID, DT_SECRET as
 * hex, DT_HOST or DT_IFNAME, DT_TIMEOUT, DT_PROGRESS_TIMEOUT, DT_INIT_TIMEOUT,
 * DT_KEEP_INIT_FILE, DT_WIRE = dtrain or gloo, DT_JOB_MARKER), falling back
 * to OMPI_COMM_WORLD_* and SLURM_*
 * for rank and size. *o need not be filled before, and what it held is
 * overwritten: set the fields the environment does not name (device, log,
 * ...) after this call.
 * Strings point into the environment or into `scratch` (>= 64 bytes for the
 * secret). On failure writes a message to err.
 */
dt_status dt_comm_options_from_env(dt_comm_options *o, uint8_t *scratch, size_t scratch_len,
                                   char *err, size_t errlen);

/* Joins the job. Always sets *out (NULL only on DT_ENOMEM); on failure read
 * dt_comm_error(*out), then dt_comm_destroy(*out). Blocks until every rank
 * is connected or init_timeout_s passes. */
dt_status dt_comm_init(dt_comm **out, const dt_comm_options *opts);

/* Waits for queued ops to finish (or fail), closes every connection, joins
 * the threads, frees everything. Unfinished dt_work handles stay valid only
 * until their dt_work_wait; wait for them first. */
void dt_comm_destroy(dt_comm *c);

/* Fails every pending and later op with DT_EABORTED and unblocks every
 * waiter. Safe from any thread and from signal-free contexts; idempotent. */
void dt_comm_abort(dt_comm *c, const char *why);

int dt_comm_rank(const dt_comm *c);
int dt_comm_size(const dt_comm *c);
/* The first error this communicator met, or "" while healthy. */
const char *dt_comm_error(const dt_comm *c);
/* The TCP port this rank listens on for dtrain's wire; 0 on the gloo wire,
 * where each pair has a listener of its own, closed once connected. */
int dt_comm_port(const dt_comm *c);
/* Connections dropped because they failed the handshake. */
uint64_t dt_comm_rejected_connections(const dt_comm *c);

/*
 * What this communicator has moved since dt_comm_init, counted by the
 * transport as each transfer completes: payload bytes of the data frames
 * it wrote to its sockets and read from them (every collective's and every
 * send/recv's), and the frames themselves. Payload only: on dtrain's wire
 * each frame also carries a DT_FRAME_HEADER_BYTES header, so the bytes on
 * TCP are sent_bytes + sent_frames · DT_FRAME_HEADER_BYTES; the handshake
 * and the ABORT and BYE notices are not counted. The gloo wire is counted
 * too: its data messages and their payloads (each adds gloo's 48-byte
 * preamble), not its payload-free ready notifications.
 *
 * Per communicator: a group made by dt_comm_split has its own connections
 * and its own counts, so a rank's traffic is the sum over the
 * communicators it holds. Safe from any thread, also while ops run.
 */
#define DT_FRAME_HEADER_BYTES 40
typedef struct dt_traffic {
    uint64_t sent_bytes, recv_bytes;   /* payload */
    uint64_t sent_frames, recv_frames; /* data frames (gloo wire: data messages) */
} dt_traffic;
void dt_comm_traffic(const dt_comm *c, dt_traffic *out);

/* ---- groups (sub-communicators) ------------------------------------------ */

#define DT_UNDEFINED (-1) /* dt_comm_split colour: this rank joins no group */

/*
 * MPI_Comm_split's meaning: every rank of `parent` calls it (a collective,
 * blocking, in the parent's op order), and the ranks that pass the same
 * colour (>= 0) form one new communicator, ranked by `key`, ties broken by
 * parent rank. A negative colour (DT_UNDEFINED) joins nothing: DT_OK with
 * *child = NULL. A child is a communicator like any other — every op,
 * timeout and failure rule applies to it, ranks are its own 0..size-1 — and
 * has its own connections (group.c says why), so ops on several groups may
 * run at once from different threads.
 *
 * Failure: a failure of the parent (a dead rank, a timeout, an abort) fails
 * every child too, with the parent's message; a dead peer seen first by a
 * child fails the parent (and its other children) with the child's message,
 * so every group on a rank reports one root cause. Messages of a child name
 * ranks by group and world rank.
 *
 * Life: destroy a child whenever (the parent stays usable); destroying the
 * parent first is allowed too: its children keep working, on their own.
 * Cost: two small all-gathers on the parent, then g-1 connections and
 * handshakes per rank of a g-rank child, and one thread per child.
 * On failure *child is NULL and dt_comm_error(parent) says why.
 */
dt_status dt_comm_split(dt_comm *parent, int color, int key, dt_comm **child);
/* The rank of group rank `rank` in the world communicator the group was
 * split from (through any number of splits); the identity for a world
 * communicator; -1 if `rank` is not in 0..size-1. */
int dt_comm_world_rank(const dt_comm *c, int rank);

/* ---- work handles ---------------------------------------------------------- */

/* Blocks until the op finishes, releases the handle, returns its status.
 * Every handle must be waited exactly once. */
dt_status dt_work_wait(dt_work *w);
/* True once the op has finished (its dt_work_wait will not block). */
bool dt_work_test(dt_work *w);

/* ---- operations ------------------------------------------------------------ */

typedef enum dt_op_kind {
    DT_OP_ALLREDUCE,
    DT_OP_REDUCE_SCATTER,
    DT_OP_ALLGATHER,
    DT_OP_ALLGATHERV,
    DT_OP_BROADCAST,
    DT_OP_BARRIER,
    DT_OP_REDUCE,
    DT_OP_GATHER,
    DT_OP_SCATTER,
    DT_OP_ALLTOALL,
    DT_OP_SEND,
    DT_OP_RECV,
    DT_NUM_OP_KINDS
} dt_op_kind;

const char *dt_op_name(dt_op_kind k); /* "allreduce" */

#define DT_ANY_SOURCE (-1)

/*
 * One operation, described explicitly (Gloo's habit). The typed wrappers
 * below fill it in; tests and benchmarks fill it directly to force an
 * algorithm or a timeout. Buffers are the caller's and must stay valid until
 * the op's dt_work_wait returns. On a communicator with a device
 * (options.device) any buffer may be that device's memory: it is staged
 * through pinned host memory, with the copies overlapped with the wire.
 *
 *   kind            send                      recv                    count
 *   allreduce       -                         buf, in place           elements
 *   reduce_scatter  [p·count]                 [count]                 per rank
 *   allgather       [count]                   [p·count]               per rank
 *   allgatherv      [counts[rank]]            [Σ counts]              counts[p]
 *   broadcast       -                         buf (root sends it)     elements
 *   reduce          -                         buf, in place; result   elements
 *                                             at root, others unchanged
 *   gather          [count]                   [p·count] at root       per rank
 *   scatter         [p·count] at root         [count]                 per rank
 *   alltoall        [p·count]                 [p·count]               per peer
 *   send            buf                       -                       elements
 *   recv            -                         buf                     elements
 */
typedef struct dt_op {
    dt_op_kind kind;
    const void *send;
    void *recv;
    size_t count;
    const size_t *counts; /* allgatherv only: p entries */
    dt_dtype dtype;
    dt_redop redop;   /* reductions only */
    int root;         /* broadcast, reduce, gather, scatter */
    int peer;         /* send: destination; recv: source or DT_ANY_SOURCE */
    uint32_t tag;     /* send/recv */
    int *source;      /* recv: where the message came from (may be NULL) */
    double timeout_s; /* this op's progress limit; 0 = the communicator's */
    dt_algo algo;     /* DT_ALGO_AUTO unless forcing one */
} dt_op;

/* Validates and enqueues `op`; on success *work is the handle to wait. */
dt_status dt_submit(dt_comm *c, const dt_op *op, dt_work **work);
/* dt_submit + dt_work_wait. */
dt_status dt_run(dt_comm *c, const dt_op *op);

/* Blocking forms. The _async forms take the same arguments plus dt_work**. */
dt_status dt_allreduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_redop op);
dt_status dt_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t recvcount, dt_dtype t,
                            dt_redop op);
dt_status dt_allgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t);
dt_status dt_allgatherv(dt_comm *c, const void *send, void *recv, const size_t *counts, dt_dtype t);
dt_status dt_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root);
dt_status dt_barrier(dt_comm *c);
dt_status dt_reduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_redop op, int root);
dt_status dt_gather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root);
dt_status dt_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root);
dt_status dt_alltoall(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t);
/* A send completes once the kernel has its bytes. The receive that matches
 * it must name its dtype and count: otherwise DT_EPROTO with both views, on
 * the receiver at once and on the sender at its next op. */
dt_status dt_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer, uint32_t tag);
/* peer may be DT_ANY_SOURCE; *source (if not NULL) gets the sender. */
dt_status dt_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, uint32_t tag,
                  int *source);

dt_status dt_allreduce_async(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_redop op,
                             dt_work **w);
dt_status dt_reduce_scatter_async(dt_comm *c, const void *send, void *recv, size_t recvcount,
                                  dt_dtype t, dt_redop op, dt_work **w);
dt_status dt_allgather_async(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                             dt_work **w);
dt_status dt_broadcast_async(dt_comm *c, void *buf, size_t count, dt_dtype t, int root,
                             dt_work **w);
dt_status dt_send_async(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer,
                        uint32_t tag, dt_work **w);
dt_status dt_recv_async(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, uint32_t tag,
                        int *source, dt_work **w);

#ifdef __cplusplus
}
#endif
#endif /* DT_COMM_H */
