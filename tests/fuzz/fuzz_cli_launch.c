/*
 * fuzz_cli_launch.c — dtrain-launch's command line (launcher/
 * launch_options.c).
 *
 * Input: argv[1..], separated by NUL or newline bytes. Parsing may refuse;
 * what it accepts must hold what launch.h promises (at least one worker
 * and one node, this node's rank among them, a program to run).
 */
#include "fuzz_util.h"
#include "launch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *argv[64], *storage, err[512];
    int argc = fuzz_argv(data, size, "dtrain-launch", argv, 64, &storage);
    launch_options o;
    if (launch_options_parse(&o, argc, argv, err, sizeof err) == LAUNCH_PARSE_OK &&
        (o.nproc_per_node < 1 || o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes ||
         !o.program || !o.program[0]))
        abort();
    free(storage);
    return 0;
}
