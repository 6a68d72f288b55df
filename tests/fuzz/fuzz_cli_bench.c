/*
 * fuzz_cli_bench.c — dtrain-bench's command line (bench/bench_options.c):
 * sizes with K/M/G suffixes, names of collectives, dtypes, reductions and
 * algorithms.
 *
 * Input: argv[1..], separated by NUL or newline bytes. Parsing may refuse
 * (with a message); what it accepts must be a plan dtrain-bench can run:
 * one to six collectives, and a size range it can step through.
 */
#include "bench_options.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *argv[64], *storage, err[512];
    int argc = fuzz_argv(data, size, "dtrain-bench", argv, 64, &storage);
    bench_options o;
    bench_options_default(&o);
    if (bench_options_parse(&o, argc, argv, err, sizeof err) == BENCH_PARSE_OK &&
        (o.n_collectives < 1 || o.n_collectives > BENCH_MAX_COLLECTIVES ||
         o.min_bytes > o.max_bytes || o.factor < 2))
        abort();
    free(storage);
    return 0;
}
