/*
 * bench_options.c — dtrain-bench's flags: one table, read by the parser and
 * by the usage text.
 *
 * Each row of `flags` names a flag (short and long spelling), its value's
 * placeholder (NULL for a switch), its help line with the default, and the
 * setter that parses the value. Adding a flag is adding a row; the usage
 * text cannot forget it and the parser cannot accept an undocumented one
 * (STYLE.md: llm.c's usage and parser disagree; ours must not).
 *
 * Accepted spellings: `-b 4K`, `--minbytes 4K`, `--minbytes=4K`, and a long
 * name's words joined by '-' or '_' (`--warmup-iters`, nccl-tests'
 * `--warmup_iters`; dt_flags.h). Sizes are
 * bytes with an optional K, M or G suffix (powers of 1024, as nccl-tests).
 * Setters write why a value is wrong; the parser prefixes the flag and the
 * value, so every message reads "-b '12Q': not a size ...".
 */
#include "bench_options.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dt_flags.h"
#include "dt_parse.h"

typedef bool (*flag_setter)(bench_options *o, const char *value, char *why, size_t whylen);

typedef struct flag {
    const char *short_name; /* "-c", or NULL */
    const char *long_name;  /* "--collective" */
    const char *metavar;    /* "NAME"; NULL for a switch */
    const char *help;       /* one line, with the default */
    flag_setter set;
} flag;

/* ---- values ---------------------------------------------------------------- */

static const struct {
    const char *name;
    dt_op_kind kind;
} collective_names[BENCH_MAX_COLLECTIVES] = {
    {"allreduce", DT_OP_ALLREDUCE}, {"reduce_scatter", DT_OP_REDUCE_SCATTER},
    {"allgather", DT_OP_ALLGATHER}, {"broadcast", DT_OP_BROADCAST},
    {"barrier", DT_OP_BARRIER},     {"alltoall", DT_OP_ALLTOALL},
    {"reduce", DT_OP_REDUCE},
};

static const struct {
    const char *name;
    dt_algo algo;
} algo_names[] = {
    {"auto", DT_ALGO_AUTO}, {"ring", DT_ALGO_RING},   {"rd", DT_ALGO_RECURSIVE_DOUBLING},
    {"tree", DT_ALGO_TREE}, {"chain", DT_ALGO_CHAIN}, {"rank", DT_ALGO_RANK_ORDER},
};

bool bench_collective_parse(const char *name, dt_op_kind *out)
{
    for (int i = 0; i < BENCH_MAX_COLLECTIVES; i++)
        if (strcmp(name, collective_names[i].name) == 0) {
            *out = collective_names[i].kind;
            return true;
        }
    return false;
}

const char *bench_algo_name(dt_algo a)
{
    for (size_t i = 0; i < sizeof algo_names / sizeof algo_names[0]; i++)
        if (algo_names[i].algo == a)
            return algo_names[i].name;
    return "?";
}

/* Bytes with an optional K/M/G suffix (x1024 each), e.g. "64M". */
static bool parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    if (*s < '0' || *s > '9')
        return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return false;
    unsigned shift = 0;
    switch (*end) {
    case 'k':
    case 'K':
        shift = 10;
        end++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        end++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        end++;
        break;
    default: break;
    }
    if (*end != '\0' || v > (SIZE_MAX >> shift))
        return false;
    *out = (size_t)v << shift;
    return true;
}

/* ---- setters: one per flag -------------------------------------------------- */

static bool set_collective(bench_options *o, const char *v, char *why, size_t n)
{
    if (strcmp(v, "all") == 0) {
        for (int i = 0; i < BENCH_MAX_COLLECTIVES; i++)
            o->collectives[i] = collective_names[i].kind;
        o->n_collectives = BENCH_MAX_COLLECTIVES;
        return true;
    }
    if (bench_collective_parse(v, &o->collectives[0])) {
        o->n_collectives = 1;
        return true;
    }
    snprintf(why, n,
             "not a collective: use allreduce, reduce_scatter, allgather, "
             "broadcast, barrier, alltoall, reduce or all");
    return false;
}

static bool set_min_bytes(bench_options *o, const char *v, char *why, size_t n)
{
    if (parse_size(v, &o->min_bytes))
        return true;
    snprintf(why, n, "not a size: give bytes, optionally with a K, M or G suffix");
    return false;
}

static bool set_max_bytes(bench_options *o, const char *v, char *why, size_t n)
{
    if (parse_size(v, &o->max_bytes))
        return true;
    snprintf(why, n, "not a size: give bytes, optionally with a K, M or G suffix");
    return false;
}

static bool set_factor(bench_options *o, const char *v, char *why, size_t n)
{
    int f;
    if (dt_parse_int(v, 2, 1 << 20, &f)) {
        o->factor = (size_t)f;
        return true;
    }
    snprintf(why, n, "not an integer factor of at least 2");
    return false;
}

static bool set_dtype(bench_options *o, const char *v, char *why, size_t n)
{
    if (dt_dtype_parse(v, &o->dtype))
        return true;
    snprintf(why, n, "not a dtype: use f32, f64, f16, bf16, i8, u8, i32 or i64");
    return false;
}

static bool set_redop(bench_options *o, const char *v, char *why, size_t n)
{
    if (dt_redop_parse(v, &o->redop))
        return true;
    snprintf(why, n, "not a reduction: use sum, prod, min, max, avg, band, bor or bxor");
    return false;
}

static bool set_iters(bench_options *o, const char *v, char *why, size_t n)
{
    if (dt_parse_int(v, 1, 1000000, &o->iters))
        return true;
    snprintf(why, n, "not an iteration count in 1..1000000");
    return false;
}

static bool set_warmup(bench_options *o, const char *v, char *why, size_t n)
{
    if (dt_parse_int(v, 0, 1000000, &o->warmup))
        return true;
    snprintf(why, n, "not a warm-up count in 0..1000000");
    return false;
}

static bool set_root(bench_options *o, const char *v, char *why, size_t n)
{
    if (dt_parse_int(v, 0, 1 << 20, &o->root))
        return true;
    snprintf(why, n, "not a rank number");
    return false;
}

static bool set_check(bench_options *o, const char *v, char *why, size_t n)
{
    (void)v, (void)why, (void)n;
    o->check = true;
    return true;
}

static bool set_algo(bench_options *o, const char *v, char *why, size_t n)
{
    for (size_t i = 0; i < sizeof algo_names / sizeof algo_names[0]; i++)
        if (strcmp(v, algo_names[i].name) == 0) {
            o->algo = algo_names[i].algo;
            return true;
        }
    snprintf(why, n, "not an algorithm: use auto, ring, rd, tree, chain or rank");
    return false;
}

static bool set_ranks(bench_options *o, const char *v, char *why, size_t n)
{
    if (dt_parse_int(v, 1, 64, &o->ranks))
        return true;
    snprintf(why, n, "not a number of local ranks in 1..64");
    return false;
}

static bool set_device(bench_options *o, const char *v, char *why, size_t n)
{
    if (strcmp(v, "fake") == 0 || strcmp(v, "cuda") == 0 || strncmp(v, "cuda:", 5) == 0) {
        o->device = v;
        return true;
    }
    snprintf(why, n, "not a device: use fake, cuda or cuda:N");
    return false;
}

static bool set_wire(bench_options *o, const char *v, char *why, size_t n)
{
    if (strcmp(v, "dtrain") == 0 || strcmp(v, "gloo") == 0) {
        o->wire = v;
        return true;
    }
    snprintf(why, n, "not a wire: use dtrain or gloo");
    return false;
}

static bool set_help(bench_options *o, const char *v, char *why, size_t n)
{
    (void)v, (void)why, (void)n;
    o->help = true;
    return true;
}

static const flag flags[] = {
    {"-c", "--collective", "NAME",
     "allreduce|reduce_scatter|allgather|broadcast|barrier|"
     "alltoall|reduce|all (default allreduce)",
     set_collective},
    {"-b", "--minbytes", "SIZE", "smallest size, bytes with K/M/G suffix (default 4)",
     set_min_bytes},
    {"-e", "--maxbytes", "SIZE", "largest size (default 64M)", set_max_bytes},
    {"-f", "--stepfactor", "N", "multiply the size by N each row (default 4)", set_factor},
    {"-d", "--datatype", "TYPE", "f32 f64 f16 bf16 i8 u8 i32 i64 (default f32)", set_dtype},
    {"-o", "--op", "OP", "sum prod min max avg band bor bxor (default sum)", set_redop},
    {"-n", "--iters", "N", "timed back-to-back ops per size (default 20)", set_iters},
    {"-w", "--warmup-iters", "N", "untimed ops before them (default 5)", set_warmup},
    {"-r", "--root", "RANK", "broadcast and reduce root (default 0)", set_root},
    {NULL, "--check", NULL, "verify one more op per size; exit 1 if any element is wrong",
     set_check},
    {NULL, "--algo", "NAME", "force auto|ring|rd|tree|chain|rank (default auto)", set_algo},
    {NULL, "--ranks", "N",
     "fork N local ranks (default: be one rank of a launched job, "
     "from RANK, WORLD_SIZE, DT_INIT_URL, ...)",
     set_ranks},
    {NULL, "--device", "NAME",
     "also time each size on buffers of device fake|cuda|cuda:N, "
     "staged through pinned memory, beside host buffers (medians of 5 rounds)",
     set_device},
    {"-h", "--help", NULL, "print this text", set_help},
    {NULL, "--wire", "NAME",
     "dtrain (its own, the default) or gloo (torch 1.13's); default: DT_WIRE's", set_wire},
};
#define N_FLAGS (sizeof flags / sizeof flags[0])

/* ---- parser and usage ----------------------------------------------------------- */

void bench_options_default(bench_options *o)
{
    memset(o, 0, sizeof *o);
    o->collectives[0] = DT_OP_ALLREDUCE;
    o->n_collectives = 1;
    o->min_bytes = 4;
    o->max_bytes = (size_t)64 << 20;
    o->factor = 4;
    o->dtype = DT_F32;
    o->redop = DT_SUM;
    o->iters = 20;
    o->warmup = 5;
    o->algo = DT_ALGO_AUTO;
}

/* The row for `arg` ("-b", "--minbytes" or "--minbytes=4K"); *inline_value
 * gets what follows '=' in the last form. */
static const flag *find_flag(const char *arg, const char **inline_value)
{
    *inline_value = NULL;
    for (size_t i = 0; i < N_FLAGS; i++) {
        const flag *f = &flags[i];
        if (f->short_name && strcmp(arg, f->short_name) == 0)
            return f;
        if (dt_flag_is(arg, f->long_name, f->metavar ? inline_value : NULL))
            return f;
    }
    return NULL;
}

/* Checks that need every flag: sizes in order, a reduction the dtype has. */
static bench_parse_result check_combination(const bench_options *o, char *err, size_t errlen)
{
    if (o->min_bytes > o->max_bytes) {
        snprintf(err, errlen, "-b %zu is larger than -e %zu", o->min_bytes, o->max_bytes);
        return BENCH_PARSE_ERROR;
    }
    if (!dt_redop_supports(o->redop, o->dtype)) {
        snprintf(err, errlen,
                 "-o '%s' does not apply to -d '%s' (bitwise reductions "
                 "take integer types)",
                 dt_redop_name(o->redop), dt_dtype_name(o->dtype));
        return BENCH_PARSE_ERROR;
    }
    return BENCH_PARSE_OK;
}

bench_parse_result bench_options_parse(bench_options *o, int argc, char **argv, char *err,
                                       size_t errlen)
{
    if (dt_flag_help_asked(argc, argv))
        return BENCH_PARSE_HELP;
    for (int i = 1; i < argc; i++) {
        const char *value;
        const flag *f = find_flag(argv[i], &value);
        if (!f) {
            snprintf(err, errlen,
                     argv[i][0] == '-' ? "unknown flag '%s'"
                                       : "unexpected argument '%s' (every value follows its flag)",
                     argv[i]);
            return BENCH_PARSE_ERROR;
        }
        /* the flag as the user spelled it: -w, or --warmup-iters for --warmup_iters */
        const char *shown = f->short_name && argv[i][1] != '-' ? f->short_name : f->long_name;
        if (f->metavar && !value) {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "%s needs a value (%s)", shown, f->metavar);
                return BENCH_PARSE_ERROR;
            }
            value = argv[++i];
        }
        char why[160] = "";
        if (!f->set(o, value, why, sizeof why)) {
            snprintf(err, errlen, "%s '%s': %s", shown, value, why);
            return BENCH_PARSE_ERROR;
        }
    }
    if (o->help)
        return BENCH_PARSE_HELP;
    return check_combination(o, err, errlen);
}

void bench_options_usage(FILE *out, const char *prog)
{
    fprintf(out,
            "usage: %s [flags]\n"
            "Times collectives like nccl-tests: one row per size, rank 0 prints.\n",
            prog);
    for (size_t i = 0; i < N_FLAGS; i++) {
        const flag *f = &flags[i];
        char left[48];
        snprintf(left, sizeof left, "%s%s%s%s%s", f->short_name ? f->short_name : "",
                 f->short_name ? ", " : "    ", f->long_name, f->metavar ? " " : "",
                 f->metavar ? f->metavar : "");
        fprintf(out, "  %-26s %s\n", left, f->help);
    }
}
