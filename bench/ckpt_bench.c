/*
 * ckpt_bench.c — ckpt-bench: checkpoint save and load throughput against
 * writing (and fsyncing) the same bytes with plain write(2), and against
 * the bound the hashing sets.
 *
 * Setup: a ~10.9M-parameter MiniGPT config (V=512 T=128 L=6 H=6 C=384),
 * ZeRO-1, 4 ranks as threads of one process, each with its own
 * communicator (save and load are the real collectives: shards in
 * parallel, rank 0's manifest and `latest`, one verdict). Every round
 * runs, back to back and in this order, so that drift on a shared machine
 * hits all alike:
 *   plain     each rank write()s as many bytes as its shard file, fsync,
 *             close
 *   hash      each rank computes the SHA-256 of as many bytes, in memory:
 *             the checkpoint's hashing alone, on all cores at once
 *   save      dt_ckpt_save (shard + SHA-256 + fsync + rename, manifest,
 *             latest, rotation)
 *   load      dt_ckpt_load_collective: shard r hashed by rank r alone,
 *             every rank reads the parameters and its optimizer slice
 *   load-all  dt_ckpt_load on every rank: each reads and hashes every
 *             shard (the single-process load; what resume did before)
 *   read      each rank read()s every shard file, no checks
 * Each phase is timed from a barrier all ranks pass to the barrier after
 * the slowest one; the table shows medians over the rounds. MB/s is the
 * checkpoint's bytes (all shards) over the time.
 *
 * The bound. SHA-256 of every byte is part of both save and load (the
 * checkpoint layer's, dt_ckpt_sha256: OpenSSL, ~1.4 GB/s a core with the
 * CPU's SHA instructions; the header names the path that ran), so on a
 * machine with fewer cores than ranks the hash row can approach plain
 * write + fsync: a save can at best take max(plain, hash) and a load
 * (whose reads come from the page cache) hash. The report gives the
 * ratios save / plain and load / plain twice: of the phases' medians, and
 * the median of the per-round ratios (the phases of one round run back to
 * back, so that one cancels the machine's load best); then those bounds
 * as ratios and how near save and load are to them.
 *
 * Files stay in the page cache (reads come from memory); fsync makes the
 * writes reach the disk. Usage: ckpt-bench [--rounds N] [--dir D]
 * (D: a directory on the disk to measure; default $TMPDIR or /tmp).
 */
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dt_ckpt.h"
#include "dt_clock.h"
#include "dt_flags.h"

#define WORLD 4
#define MAX_ROUNDS 64
enum { PH_PLAIN, PH_HASH, PH_SAVE, PH_LOAD, PH_LOAD_ALL, PH_READ, PH_COUNT };
static const char *const phase_names[PH_COUNT] = {
    "plain write+fsync",
    "hash only (SHA-256 of the same bytes, 4 threads)",
    "ckpt save",
    "ckpt load (collective: each shard hashed once)",
    "ckpt load, every rank hashes every shard (dt_ckpt_load)",
    "plain read (every shard, every rank)"};

typedef struct bench {
    char dir[512], url[600];
    dt_config cfg;
    size_t num_params;
    int rounds;
    pthread_barrier_t bar;
    double t[PH_COUNT][MAX_ROUNDS];
    uint64_t ckpt_bytes;
    atomic_int failed;
} bench;

typedef struct rank_arg {
    bench *b;
    int rank;
} rank_arg;

static int rm_one(const char *p, const struct stat *sb, int f, struct FTW *w)
{
    (void)sb;
    (void)f;
    (void)w;
    return remove(p);
}

static int write_plain(const char *path, const void *buf, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    const char *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w <= 0)
            break;
        p += w;
        len -= (size_t)w;
    }
    int rc = len == 0 && fsync(fd) == 0 ? 0 : -1;
    return close(fd) == 0 ? rc : -1;
}

/* Reads a file to the end through buf (cap bytes); returns bytes read. */
static size_t read_plain(const char *path, void *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t total = 0;
    ssize_t r;
    while ((r = read(fd, buf, cap)) > 0)
        total += (size_t)r;
    close(fd);
    return total;
}

/* Times one phase: barrier, body, barrier; rank 0 records. */
#define TIMED(b, rank, ph, round, body)         \
    do {                                        \
        pthread_barrier_wait(&(b)->bar);        \
        double t0_ = dt_now();                  \
        body;                                   \
        pthread_barrier_wait(&(b)->bar);        \
        if ((rank) == 0)                        \
            (b)->t[ph][round] = dt_now() - t0_; \
    } while (0)

static void fill(float *p, size_t n, int seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((i * 2654435761u + (size_t)seed) % 1000) * 1e-3f;
}

static void run_rounds(bench *b, int rank, dt_comm *comm, dt_ckpt *ck, dt_ckpt_state *s,
                       void *shard_bytes, size_t shard_len)
{
    char path[800], step_dir[600];
    unsigned char digest[32];
    for (int i = 0; i < b->rounds; i++) {
        s->step = i + 1;
        snprintf(path, sizeof path, "%s/plain/rank%d.bin", b->dir, rank);
        TIMED(b, rank, PH_PLAIN, i,
              if (write_plain(path, shard_bytes, shard_len) != 0) b->failed = 1);
        TIMED(b, rank, PH_HASH, i,
              if (dt_ckpt_sha256(digest, shard_bytes, shard_len) != DT_OK) b->failed = 1);
        TIMED(b, rank, PH_SAVE, i, if (dt_ckpt_save(ck, comm, s) != DT_OK) b->failed = 1);
        snprintf(step_dir, sizeof step_dir, "%.500s/ckpt/step_%08d", b->dir, i + 1);
        TIMED(b, rank, PH_LOAD, i,
              if (dt_ckpt_load_collective(ck, comm, step_dir, s) != DT_OK) b->failed = 1);
        TIMED(b, rank, PH_LOAD_ALL, i, if (dt_ckpt_load(ck, step_dir, s) != DT_OK) b->failed = 1);
        TIMED(
            b, rank, PH_READ, i, for (int r = 0; r < WORLD; r++) {
                snprintf(path, sizeof path, "%s/rank%05d.bin", step_dir, r);
                read_plain(path, shard_bytes, shard_len);
            });
        if (rank == 0 && b->failed)
            fprintf(stderr, "rank 0: %s\n", dt_ckpt_error(ck));
    }
}

static void *rank_main(void *arg)
{
    rank_arg *a = arg;
    bench *b = a->b;
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = a->rank;
    o.world_size = WORLD;
    o.init_url = b->url;
    dt_comm *comm = NULL;
    dt_ckpt *ck = NULL;
    char root[600];
    snprintf(root, sizeof root, "%s/ckpt", b->dir);
    dt_ckpt_options co = {.keep = 1};
    size_t lo, n;
    dt_ckpt_partition(b->num_params, WORLD, a->rank, &lo, &n);
    float *params = malloc(b->num_params * sizeof(float));
    float *opt = malloc(3 * n * sizeof(float));
    /* Exactly a ZeRO-1 shard file: 72-byte header, 4 sections of 32. */
    size_t shard_len = 200 + 4 * n * sizeof(float);
    void *plain = malloc(shard_len);
    if (dt_comm_init(&comm, &o) != DT_OK || dt_ckpt_open(&ck, root, &co) != DT_OK || !params ||
        !opt || !plain) {
        fprintf(stderr, "rank %d: setup failed\n", a->rank);
        exit(1);
    }
    fill(params, b->num_params, 1);
    fill(opt, 3 * n, 2 + a->rank);
    fill(plain, shard_len / sizeof(float), 3);
    dt_ckpt_state s = {.cfg = b->cfg,
                       .mode = DT_CKPT_ZERO1,
                       .rank = a->rank,
                       .world = WORLD,
                       .seed = 1,
                       .num_params = b->num_params,
                       .params = params,
                       .opt_lo = lo,
                       .opt_n = n,
                       .master = opt,
                       .adam_m = opt + n,
                       .adam_v = opt + 2 * n};
    run_rounds(b, a->rank, comm, ck, &s, plain, shard_len);
    dt_ckpt_close(ck);
    dt_comm_destroy(comm);
    free(params);
    free(opt);
    free(plain);
    return NULL;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static double median(const double *v, int n)
{
    double c[MAX_ROUNDS];
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    return n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
}

/* The median over rounds of plain / phase, each ratio from one round. */
static double median_ratio(const bench *b, int phase)
{
    double r[MAX_ROUNDS];
    for (int i = 0; i < b->rounds; i++)
        r[i] = b->t[PH_PLAIN][i] / b->t[phase][i];
    return median(r, b->rounds);
}

static void report(const bench *b)
{
    double med[PH_COUNT];
    double mb = (double)b->ckpt_bytes / 1e6;
    printf("ckpt-bench: %zu parameters, ZeRO-1, %d ranks (threads), %.1f MB "
           "per checkpoint, %d rounds, medians\n",
           b->num_params, WORLD, mb, b->rounds);
    char impl[200];
    printf("hash path: %s\n", dt_ckpt_sha256_impl(impl, sizeof impl));
    printf("| phase | seconds | MB/s |\n|---|---|---|\n");
    for (int p = 0; p < PH_COUNT; p++) {
        med[p] = median(b->t[p], b->rounds);
        printf("| %s | %.3f | %.0f |\n", phase_names[p], med[p], mb / med[p]);
    }
    double plain = med[PH_PLAIN], hash = med[PH_HASH];
    double save_best = plain > hash ? plain : hash;
    printf("ratio save / plain write+fsync: %.2f (bound plain / max(plain, "
           "hash): %.2f; save at %.0f%% of it)\n",
           plain / med[PH_SAVE], plain / save_best, 100.0 * save_best / med[PH_SAVE]);
    printf("ratio load / plain write+fsync: %.2f (bound plain / hash: %.2f; "
           "load at %.0f%% of it)\n",
           plain / med[PH_LOAD], plain / hash, 100.0 * hash / med[PH_LOAD]);
    printf("ratio load-all / plain write+fsync: %.2f\n", plain / med[PH_LOAD_ALL]);
    printf("per-round ratios, median: save / plain %.2f, load / plain %.2f\n",
           median_ratio(b, PH_SAVE), median_ratio(b, PH_LOAD));
}

/* Returns DT_FLAGS_OK, or DT_FLAGS_HELP after printing the usage, or
 * DT_FLAGS_ERROR after printing what was wrong. */
static int parse_args(int argc, char **argv, int *rounds, const char **dir)
{
    const dt_flag flags[] = {
        {NULL, "--rounds", "R", rounds, NULL, 1, MAX_ROUNDS, "timed rounds of each phase"},
        {NULL, "--dir", "D", NULL, dir, 0, 0, "where the checkpoints are written"},
    };
    int n = (int)(sizeof flags / sizeof flags[0]);
    int rc = dt_flags_parse("ckpt-bench", flags, n, argc, argv);
    if (rc == DT_FLAGS_HELP) {
        printf("usage: ckpt-bench [--rounds R] [--dir D]\n");
        dt_flags_usage(stdout, flags, n);
    }
    return rc;
}

int main(int argc, char **argv)
{
    static bench b;
    b.rounds = 5;
    const char *base = getenv("TMPDIR");
    base = base && *base ? base : "/tmp";
    int prc = parse_args(argc, argv, &b.rounds, &base);
    if (prc)
        return prc == DT_FLAGS_HELP ? 0 : DT_FLAGS_USAGE_ERROR;
    snprintf(b.dir, sizeof b.dir, "%s/ckpt-bench-XXXXXX", base);
    if (!mkdtemp(b.dir))
        return perror("mkdtemp"), 1;
    char plain[600];
    snprintf(plain, sizeof plain, "%s/plain", b.dir);
    snprintf(b.url, sizeof b.url, "file://%s/rdzv", b.dir);
    mkdir(plain, 0755);
    b.cfg = (dt_config){.V = 512, .T = 128, .L = 6, .H = 6, .C = 384};
    b.num_params = dt_config_num_params(&b.cfg);
    pthread_barrier_init(&b.bar, NULL, WORLD);
    pthread_t th[WORLD];
    rank_arg args[WORLD];
    for (int r = 0; r < WORLD; r++) {
        args[r] = (rank_arg){&b, r};
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < WORLD; r++)
        pthread_join(th[r], NULL);
    dt_ckpt *ck = NULL;
    char root[600], latest[700];
    dt_ckpt_info info = {0};
    snprintf(root, sizeof root, "%s/ckpt", b.dir);
    if (dt_ckpt_open(&ck, root, NULL) == DT_OK &&
        dt_ckpt_latest(ck, latest, sizeof latest) == DT_OK &&
        dt_ckpt_inspect(ck, latest, &info) == DT_OK)
        b.ckpt_bytes = info.total_bytes;
    dt_ckpt_close(ck);
    nftw(b.dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    if (b.failed || b.ckpt_bytes == 0) {
        fprintf(stderr, "ckpt-bench: a save or load failed\n");
        return 1;
    }
    report(&b);
    return 0;
}
