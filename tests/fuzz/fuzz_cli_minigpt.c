/*
 * fuzz_cli_minigpt.c — minigpt's command line (train/cli.c): the flag
 * table, the presets, and every number and name a user can type.
 *
 * Input: argv[1..], separated by NUL or newline bytes. Parsing may refuse
 * (and print why); it must never crash or read past an argument.
 */
#include "cli.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *argv[64], *storage;
    int argc = fuzz_argv(data, size, "minigpt", argv, 64, &storage);
    mg_options o;
    mg_options_default(&o);
    if (mg_options_parse(&o, argc, argv) == 0) {
        char err[256];
        (void)dt_config_check(&o.cfg, err, sizeof err);
    }
    free(storage);
    return 0;
}
