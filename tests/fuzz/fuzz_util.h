/*
 * fuzz_util.h — what the libFuzzer harnesses share: a private scratch
 * folder for the files a parser must read from disk, and turning fuzz
 * bytes into an argv.
 *
 * Each harness is one program (built only with -Dfuzz=true, by clang with
 * -fsanitize=fuzzer,address,undefined): libFuzzer calls
 * LLVMFuzzerTestOneInput with each input, and any crash, sanitizer report,
 * leak or hang is a finding. A harness must not keep state between inputs
 * beyond what it set up once, so that a finding replays from its file alone.
 */
#ifndef DT_FUZZ_UTIL_H
#define DT_FUZZ_UTIL_H

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <ftw.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char fuzz_scratch[256];
static int fuzz_stderr = 2;

/* libFuzzer's -close_fd_mask=3 silences the code under test; the
 * harness's own words about a finding still need a way out, so it keeps a
 * copy of stderr from before main. */
__attribute__((constructor)) static void fuzz_keep_stderr(void)
{
    int fd = dup(2);
    if (fd >= 0)
        fuzz_stderr = fd;
}

/* A finding the harness itself detected: say what, then crash (libFuzzer
 * saves the input). */
__attribute__((format(printf, 1, 2), noreturn)) static inline void fuzz_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vdprintf(fuzz_stderr, fmt, ap);
    va_end(ap);
    dprintf(fuzz_stderr, "\n");
    abort();
}

static inline int fuzz_remove_one(const char *path, const struct stat *sb, int flag,
                                  struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static inline void fuzz_remove_scratch(void)
{
    nftw(fuzz_scratch, fuzz_remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A folder of this process's own, in memory when /dev/shm exists; made on
 * the first call, removed at exit. `name` tells harnesses apart. */
static inline const char *fuzz_scratch_dir(const char *name)
{
    if (!fuzz_scratch[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(fuzz_scratch, sizeof fuzz_scratch, "%s/dtrain-fuzz-%s-%d", base, name,
                 (int)getpid());
        if (mkdir(fuzz_scratch, 0700) != 0) {
            perror(fuzz_scratch);
            abort();
        }
        atexit(fuzz_remove_scratch);
    }
    return fuzz_scratch;
}

/* Replaces path's contents with data[0..size); aborts if it cannot (the
 * harness, not the code under test, failed). */
static inline void fuzz_write_file(const char *path, const uint8_t *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        perror(path);
        abort();
    }
    for (size_t done = 0; done < size;) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) {
            perror(path);
            abort();
        }
        done += (size_t)w;
    }
    close(fd);
}

/* Splits data at NUL and newline bytes into argv[1..], after argv[0] =
 * prog; at most max - 1 entries, NULL-terminated. The strings live in
 * *storage (free it after use). Returns argc. */
static inline int fuzz_argv(const uint8_t *data, size_t size, const char *prog, char **argv,
                            int max, char **storage)
{
    char *text = malloc(size + 1);
    if (!text)
        abort();
    memcpy(text, data, size);
    text[size] = '\0';
    *storage = text;
    int argc = 0;
    argv[argc++] = (char *)prog;
    char *p = text, *end = text + size;
    while (p <= end && argc < max - 1) {
        char *q = p;
        while (q < end && *q != '\0' && *q != '\n')
            q++;
        *q = '\0';
        argv[argc++] = p;
        p = q + 1;
    }
    argv[argc] = NULL;
    return argc;
}

#endif /* DT_FUZZ_UTIL_H */
