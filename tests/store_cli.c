/*
 * store_cli.c — dtrain's rendezvous store from the command line, for the
 * tests that drive it beside another program (tests/torch_filestore.py,
 * against PyTorch's FileStore).
 *
 *   store_cli URL JOB set KEY VALUE
 *   store_cli URL JOB get KEY [SECONDS]   prints the value
 *   store_cli URL JOB hold SECONDS        prints "open", keeps the store open
 *
 * JOB "" is PyTorch's key space ("/<key>"). Exit status 0, or 1 with the
 * store's message on stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dt_comm.h"

static int fail(dt_store *s, const char *what)
{
    fprintf(stderr, "store_cli: %s: %s\n", what, dt_store_error(s));
    dt_store_close(s);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: store_cli URL JOB set KEY VALUE | get KEY [SECONDS] | "
                        "hold SECONDS\n");
        return 2;
    }
    dt_store *s = NULL;
    if (dt_store_open(&s, argv[1], argv[2]) != DT_OK)
        return fail(s, "open");
    const char *cmd = argv[3];
    if (strcmp(cmd, "set") == 0 && argc == 6) {
        if (dt_store_set(s, argv[4], argv[5], strlen(argv[5])) != DT_OK)
            return fail(s, "set");
    } else if (strcmp(cmd, "get") == 0) {
        void *v = NULL;
        size_t n = 0;
        if (dt_store_get(s, argv[4], &v, &n, argc > 5 ? atof(argv[5]) : 5.0) != DT_OK)
            return fail(s, "get");
        printf("%.*s\n", (int)n, (const char *)v);
        free(v);
    } else if (strcmp(cmd, "hold") == 0) {
        printf("open\n");
        fflush(stdout);
        double t = atof(argv[4]);
        struct timespec nap = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
        nanosleep(&nap, NULL);
    } else {
        fprintf(stderr, "store_cli: unknown command '%s'\n", cmd);
        dt_store_close(s);
        return 2;
    }
    dt_store_close(s);
    return 0;
}
