/*
 * gloo_bench.cc — gloo-bench: dtrain-bench's table, measured with Gloo.
 *
 *   gloo-bench --ranks 4 -c allreduce -b 4 -e 64M -f 4 [--check] [--algo ring|bcube]
 *
 * The yardstick for dtrain's collectives is what users would otherwise run
 * on CPUs: Gloo, the backend of torch.distributed for CPU tensors. This
 * driver is written against Debian's libgloo-dev (2022) and mirrors
 * dtrain-bench exactly: the same sizes and buffer layouts, the same inputs
 * and --check (it links bench_case.c and bench_values.c), the same timing
 * (warm-up, barrier, -n ops back to back, slowest rank's average), the
 * same columns. Only the transport and algorithms differ.
 *
 * Each op is called the way ProcessGroupGloo calls it: an options object
 * built per call, with a fresh tag. Collectives:
 *   allreduce       gloo::allreduce, --algo ring (default) or bcube
 *   reduce_scatter  gloo::ReduceScatterHalvingDoubling (Gloo's only
 *                   reduce-scatter; torch.distributed's Gloo backend has
 *                   none), built once per size, its result copied out
 *   allgather, broadcast, barrier, alltoall: gloo::allgather, ::broadcast,
 *                   ::barrier, ::alltoall
 * Types f32 and f64, reduction sum. Ranks are always local: --ranks N
 * forks N processes that rendezvous through a fresh FileStore directory
 * under /tmp, over Gloo's TCP device bound to 127.0.0.1.
 */
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

extern "C" {
#include "../bench_case.h"
}

namespace
{

using Algorithm = gloo::AllreduceOptions::Algorithm;
using Ctx = std::shared_ptr<gloo::Context>;

struct Options {
    std::vector<dt_op_kind> collectives{DT_OP_ALLREDUCE};
    size_t min_bytes = 4, max_bytes = size_t(64) << 20, factor = 4;
    dt_dtype dtype = DT_F32;
    int iters = 20, warmup = 5, root = 0, ranks = 4;
    bool check = false, help = false;
    Algorithm algo = Algorithm::RING;
};

/* ---- flags: one table for the parser and the usage text -------------------------- */

bool parse_size(const char *s, size_t *out)
{
    char *end;
    if (*s < '0' || *s > '9')
        return false;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = 0;
    if (*end == 'K' || *end == 'k')
        shift = 10, end++;
    else if (*end == 'M' || *end == 'm')
        shift = 20, end++;
    else if (*end == 'G' || *end == 'g')
        shift = 30, end++;
    if (*end || v > (SIZE_MAX >> shift))
        return false;
    *out = size_t(v) << shift;
    return true;
}

bool parse_int(const char *s, long lo, long hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi)
        return false;
    *out = int(v);
    return true;
}

bool set_collective(Options &o, const char *v)
{
    static const dt_op_kind all[] = {DT_OP_ALLREDUCE, DT_OP_REDUCE_SCATTER, DT_OP_ALLGATHER,
                                     DT_OP_BROADCAST, DT_OP_BARRIER,        DT_OP_ALLTOALL};
    if (strcmp(v, "all") == 0) {
        o.collectives.assign(std::begin(all), std::end(all));
        return true;
    }
    for (dt_op_kind k : all)
        if (strcmp(v, dt_op_name(k)) == 0) {
            o.collectives.assign(1, k);
            return true;
        }
    return false;
}

struct Flag {
    const char *short_name, *long_name, *metavar, *help;
    std::function<bool(Options &, const char *)> set;
};

const std::vector<Flag> &flags()
{
    static const std::vector<Flag> table = {
        {"-c", "--collective", "NAME",
         "allreduce|reduce_scatter|allgather|broadcast|barrier|"
         "alltoall|all (default allreduce)",
         set_collective},
        {"-b", "--minbytes", "SIZE", "smallest size, bytes with K/M/G suffix (default 4)",
         [](Options &o, const char *v) { return parse_size(v, &o.min_bytes); }},
        {"-e", "--maxbytes", "SIZE", "largest size (default 64M)",
         [](Options &o, const char *v) { return parse_size(v, &o.max_bytes); }},
        {"-f", "--stepfactor", "N", "multiply the size by N each row (default 4)",
         [](Options &o, const char *v) {
             int f;
             return parse_int(v, 2, 1 << 20, &f) && (o.factor = size_t(f), true);
         }},
        {"-d", "--datatype", "TYPE", "f32 or f64 (default f32); the reduction is sum",
         [](Options &o, const char *v) {
             return dt_dtype_parse(v, &o.dtype) && (o.dtype == DT_F32 || o.dtype == DT_F64);
         }},
        {"-n", "--iters", "N", "timed back-to-back ops per size (default 20)",
         [](Options &o, const char *v) { return parse_int(v, 1, 1000000, &o.iters); }},
        {"-w", "--warmup_iters", "N", "untimed ops before them (default 5)",
         [](Options &o, const char *v) { return parse_int(v, 0, 1000000, &o.warmup); }},
        {"-r", "--root", "RANK", "broadcast root (default 0)",
         [](Options &o, const char *v) { return parse_int(v, 0, 63, &o.root); }},
        {nullptr, "--check", nullptr, "verify one more op per size; exit 1 if any is wrong",
         [](Options &o, const char *) { return o.check = true; }},
        {nullptr, "--algo", "NAME", "allreduce: ring (default) or bcube",
         [](Options &o, const char *v) {
             if (strcmp(v, "ring") == 0)
                 return o.algo = Algorithm::RING, true;
             if (strcmp(v, "bcube") == 0)
                 return o.algo = Algorithm::BCUBE, true;
             return false;
         }},
        {nullptr, "--ranks", "N", "local ranks to fork (default 4)",
         [](Options &o, const char *v) { return parse_int(v, 1, 64, &o.ranks); }},
        {"-h", "--help", nullptr, "print this text",
         [](Options &o, const char *) { return o.help = true; }},
    };
    return table;
}

void usage(FILE *out)
{
    fprintf(out, "usage: gloo-bench [flags]\nTimes Gloo's collectives in dtrain-bench's "
                 "table; rank 0 prints.\n");
    for (const Flag &f : flags()) {
        std::string left = std::string(f.short_name ? f.short_name : "") +
                           (f.short_name ? ", " : "    ") + f.long_name +
                           (f.metavar ? std::string(" ") + f.metavar : "");
        fprintf(out, "  %-26s %s\n", left.c_str(), f.help);
    }
}

/* False after printing what was wrong (flag and value). */
bool parse(Options &o, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const Flag *hit = nullptr;
        for (const Flag &f : flags())
            if ((f.short_name && strcmp(argv[i], f.short_name) == 0) ||
                strcmp(argv[i], f.long_name) == 0)
                hit = &f;
        if (!hit) {
            fprintf(stderr, "gloo-bench: unknown flag '%s'\n", argv[i]);
            return false;
        }
        const char *v = "";
        if (hit->metavar) {
            if (i + 1 >= argc) {
                fprintf(stderr, "gloo-bench: %s needs a value (%s)\n", argv[i], hit->metavar);
                return false;
            }
            v = argv[++i];
        }
        if (!hit->set(o, v)) {
            fprintf(stderr, "gloo-bench: %s '%s': not accepted; %s\n", argv[i - 1], v, hit->help);
            return false;
        }
    }
    if (o.min_bytes > o.max_bytes || o.root >= o.ranks) {
        fprintf(stderr, "gloo-bench: -b must not exceed -e, and -r must name one of --ranks\n");
        return false;
    }
    return true;
}

/* ---- running Gloo's ops --------------------------------------------------------------- */

double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

/* One op of bench case bc, as ProcessGroupGloo would issue it. rs is the
 * reduce-scatter algorithm object for this size (reduce_scatter only). */
template <typename T>
void run_op(const Ctx &ctx, bench_case &bc, gloo::Algorithm *rs, Algorithm algo, uint32_t tag)
{
    T *send = static_cast<T *>(bc.send), *recv = static_cast<T *>(bc.recv);
    size_t n = bc.op.count, p = size_t(bc.p);
    switch (bc.op.kind) {
    case DT_OP_ALLREDUCE: {
        gloo::AllreduceOptions opts(ctx);
        opts.setOutput(recv, n);
        opts.setAlgorithm(algo);
        opts.setReduceFunction(
            static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::sum<T>));
        opts.setTag(tag);
        gloo::allreduce(opts);
        break;
    }
    case DT_OP_REDUCE_SCATTER: /* in place in send; this rank's block lands first */
        rs->run();
        memcpy(recv, send, n * sizeof(T));
        break;
    case DT_OP_ALLGATHER: {
        gloo::AllgatherOptions opts(ctx);
        opts.setInput(send, n);
        opts.setOutput(recv, p * n);
        opts.setTag(tag);
        gloo::allgather(opts);
        break;
    }
    case DT_OP_BROADCAST: {
        gloo::BroadcastOptions opts(ctx);
        opts.setOutput(recv, n);
        opts.setRoot(bc.op.root);
        opts.setTag(tag);
        gloo::broadcast(opts);
        break;
    }
    case DT_OP_ALLTOALL: {
        gloo::AlltoallOptions opts(ctx);
        opts.setInput(send, p * n);
        opts.setOutput(recv, p * n);
        opts.setTag(tag);
        gloo::alltoall(opts);
        break;
    }
    default: {
        gloo::BarrierOptions opts(ctx);
        opts.setTag(tag);
        gloo::barrier(opts);
        break;
    }
    }
}

template <typename T> void allreduce_scalar(const Ctx &ctx, T *v, bool max, uint32_t tag)
{
    gloo::AllreduceOptions opts(ctx);
    opts.setOutput(v, 1);
    using Fn = void (*)(void *, const void *, const void *, size_t);
    opts.setReduceFunction(max ? static_cast<Fn>(&gloo::max<T>) : static_cast<Fn>(&gloo::sum<T>));
    opts.setTag(tag);
    gloo::allreduce(opts);
}

struct Runner {
    Ctx ctx;
    const Options &o;
    uint32_t tag = 0;

    template <typename T> void one(bench_case &bc, gloo::Algorithm *rs)
    {
        run_op<T>(ctx, bc, rs, o.algo, tag++);
    }

    /* Seconds per op (slowest rank) and wrong elements (all ranks). */
    template <typename T> void measure(bench_case &bc, double *sec, double *wrong)
    {
        std::unique_ptr<gloo::Algorithm> rs;
        if (bc.op.kind == DT_OP_REDUCE_SCATTER)
            rs.reset(new gloo::ReduceScatterHalvingDoubling<T>(ctx, {static_cast<T *>(bc.send)},
                                                               int(bc.send_count),
                                                               std::vector<int>(size_t(bc.p),
                                                                                int(bc.op.count))));
        for (int i = 0; i < o.warmup; i++)
            one<T>(bc, rs.get());
        gloo::BarrierOptions b(ctx);
        b.setTag(tag++);
        gloo::barrier(b);
        double t0 = now_s();
        for (int i = 0; i < o.iters; i++)
            one<T>(bc, rs.get());
        *sec = (now_s() - t0) / o.iters;
        allreduce_scalar(ctx, sec, true, tag++);
        *wrong = 0;
        if (!o.check)
            return;
        bench_case_fill(&bc);
        one<T>(bc, rs.get());
        *wrong = double(bench_case_count_wrong(&bc));
        allreduce_scalar(ctx, wrong, false, tag++);
    }
};

void print_header(const Options &o, dt_op_kind kind)
{
    bool reduces = kind == DT_OP_ALLREDUCE || kind == DT_OP_REDUCE_SCATTER;
    printf("# gloo-bench %s: %d ranks, %s%s, algo %s, %d iters after %d warm-up%s\n",
           dt_op_name(kind), o.ranks, kind == DT_OP_BARRIER ? "no data" : dt_dtype_name(o.dtype),
           reduces ? " sum" : "", o.algo == Algorithm::BCUBE ? "bcube" : "ring", o.iters, o.warmup,
           o.check ? ", checked" : "");
    printf("# %10s %12s %6s %6s %12s %11s %11s %6s\n", "size", "count", "type", "op", "time_us",
           "algbw_GBps", "busbw_GBps", "wrong");
}

void print_row(const Options &o, const bench_case &bc, double sec, double wrong)
{
    bool reduces = bc.op.kind == DT_OP_ALLREDUCE || bc.op.kind == DT_OP_REDUCE_SCATTER;
    double algbw = sec > 0 ? double(bc.bytes) / sec / 1e9 : 0;
    std::string w = o.check ? std::to_string((long long)wrong) : "N/A";
    printf("%12zu %12zu %6s %6s %12.1f %11.3f %11.3f %6s\n", bc.bytes, bc.op.count,
           bc.op.kind == DT_OP_BARRIER ? "none" : dt_dtype_name(bc.op.dtype),
           reduces ? "sum" : "none", sec * 1e6, algbw, algbw * bench_busbw_factor(bc.op.kind, bc.p),
           w.c_str());
    fflush(stdout);
}

/* Every size of one collective; returns true if every element was right. */
bool run_collective(Runner &run, dt_op_kind kind, int rank)
{
    const Options &o = run.o;
    bool all_right = true;
    if (rank == 0)
        print_header(o, kind);
    size_t last = SIZE_MAX;
    for (size_t bytes = o.min_bytes; bytes <= o.max_bytes;) {
        bench_case bc;
        if (bench_case_init(&bc, kind, bytes, o.dtype, DT_SUM, o.root, DT_ALGO_AUTO, rank,
                            o.ranks) != DT_OK)
            throw std::bad_alloc();
        if (bc.bytes != last) {
            double sec, wrong;
            if (o.dtype == DT_F64)
                run.measure<double>(bc, &sec, &wrong);
            else
                run.measure<float>(bc, &sec, &wrong);
            if (rank == 0)
                print_row(o, bc, sec, wrong);
            all_right = all_right && wrong == 0;
        }
        last = bc.bytes;
        bench_case_free(&bc);
        if (kind == DT_OP_BARRIER || bytes > o.max_bytes / o.factor)
            break;
        bytes = bytes ? bytes * o.factor : 1;
    }
    return all_right;
}

int run_rank(const Options &o, int rank, const std::string &dir)
{
    try {
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        gloo::rendezvous::FileStore store(dir);
        auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, o.ranks);
        ctx->setTimeout(std::chrono::seconds(60));
        ctx->connectFullMesh(store, dev);
        Runner run{ctx, o};
        bool right = true;
        for (dt_op_kind k : o.collectives)
            right = run_collective(run, k, rank) && right;
        return right ? 0 : 1;
    } catch (const std::exception &e) {
        fprintf(stderr, "gloo-bench: rank %d: %s\n", rank, e.what());
        return 1;
    }
}

void remove_dir(const std::string &dir)
{
    if (DIR *d = opendir(dir.c_str())) {
        while (struct dirent *e = readdir(d))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
                unlink((dir + "/" + e->d_name).c_str());
        closedir(d);
    }
    rmdir(dir.c_str());
}

} // namespace

int main(int argc, char **argv)
{
    Options o;
    if (!parse(o, argc, argv)) {
        fprintf(stderr, "(gloo-bench --help lists the flags)\n");
        return 2;
    }
    if (o.help) {
        usage(stdout);
        return 0;
    }
    char dir[] = "/tmp/gloo-bench-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("gloo-bench: mkdtemp");
        return 1;
    }
    fflush(stdout);
    std::vector<pid_t> pids;
    for (int r = 0; r < o.ranks; r++) {
        pid_t pid = fork();
        if (pid == 0)
            _exit(run_rank(o, r, dir));
        pids.push_back(pid);
    }
    int result = 0;
    for (size_t left = pids.size(); left > 0; left--) {
        int status;
        pid_t pid = wait(&status);
        if (pid < 0)
            break;
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        if (code && !result) {
            result = code;
            for (pid_t other : pids)
                if (other != pid)
                    kill(other, SIGTERM);
        }
    }
    remove_dir(dir);
    return result;
}
