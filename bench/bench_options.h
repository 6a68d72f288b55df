/*
 * bench_options.h — dtrain-bench's command line: what to measure.
 *
 * One table of flags (bench_options.c) drives both the parser and the usage
 * text, so the two cannot disagree. Parsing never exits the program: it
 * returns a status and a message naming the flag and the value, and main
 * decides (exit 2 for a malformed command line, as nccl-tests and getopt
 * programs do).
 */
#ifndef DT_BENCH_OPTIONS_H
#define DT_BENCH_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "dt_comm.h"

/* The collectives dtrain-bench measures, in the order `-c all` runs them. */
#define BENCH_MAX_COLLECTIVES 7

typedef struct bench_options {
    dt_op_kind collectives[BENCH_MAX_COLLECTIVES]; /* -c, in run order */
    int n_collectives;
    size_t min_bytes, max_bytes; /* -b, -e: whole-array sizes */
    size_t factor;               /* -f: next size = size * factor */
    dt_dtype dtype;              /* -d */
    dt_redop redop;              /* -o */
    int iters;                   /* -n: timed back-to-back ops per size */
    int warmup;                  /* -w: untimed ops before them */
    int root;                    /* -r: broadcast root */
    bool check;                  /* --check: verify one extra op per size */
    dt_algo algo;                /* --algo: DT_ALGO_AUTO unless forced */
    int ranks;                   /* --ranks: local ranks to fork; 0 = launched */
    const char *device;          /* --device: also time device buffers; NULL = host only */
    const char *wire;            /* --wire: "dtrain" or "gloo"; NULL = DT_WIRE's */
    bool help;                   /* -h */
} bench_options;

typedef enum bench_parse_result {
    BENCH_PARSE_OK,
    BENCH_PARSE_HELP,  /* -h given: print usage to stdout, exit 0 */
    BENCH_PARSE_ERROR, /* message in err: print it and a pointer to --help, exit 2 */
} bench_parse_result;

void bench_options_default(bench_options *o);

/* Fills o from argv[1..argc). On BENCH_PARSE_ERROR, err names the flag and
 * its value and what would be accepted. */
bench_parse_result bench_options_parse(bench_options *o, int argc, char **argv, char *err,
                                       size_t errlen);

/* The usage text, generated from the same table the parser reads. */
void bench_options_usage(FILE *out, const char *prog);

/* "allreduce" -> DT_OP_ALLREDUCE, for the six benchmarked collectives only. */
bool bench_collective_parse(const char *name, dt_op_kind *out);

/* "ring" for DT_ALGO_RING, "auto" for DT_ALGO_AUTO, ... */
const char *bench_algo_name(dt_algo a);

#endif /* DT_BENCH_OPTIONS_H */
