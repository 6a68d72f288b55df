/*
 * run_program.h — run a built program from a test: argv in, exit code and
 * everything it printed (stdout and stderr, interleaved, in one file) out.
 *
 * The program gets our environment minus any inherited launch contract
 * (DT_*, RANK, WORLD_SIZE), so a test run inside a launcher still starts
 * clean. Waiting is unbounded here on purpose: the Criterion .timeout of
 * the calling test bounds it, and a hang fails that test.
 */
#ifndef DT_TEST_RUN_PROGRAM_H
#define DT_TEST_RUN_PROGRAM_H

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <criterion/criterion.h>

extern char **environ;

/* Reads a whole file into a malloc'ed, NUL-terminated string. */
static inline char *run_slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot read %s", path);
    size_t cap = 4096, len = 0, got;
    char *buf = malloc(cap);
    while ((got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len < 2)
            buf = realloc(buf, cap *= 2);
    }
    buf[len] = '\0';
    fclose(f);
    return buf;
}

/* Starts argv (NULL-terminated, argv[0] a path) with output to log_path;
 * returns its pid. */
static inline pid_t start_program(const char *const *argv, const char *log_path)
{
    size_t n = 0, k = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 1, sizeof *env);
    cr_assert(env);
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "DT_", 3) && strncmp(environ[i], "RANK=", 5) &&
            strncmp(environ[i], "WORLD_SIZE=", 11))
            env[k++] = environ[i];
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, (char **)argv, env);
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    cr_assert_eq(rc, 0, "posix_spawn %s: %s", argv[0], strerror(rc));
    return pid;
}

/* Waits for a program start_program started; returns the exit code, or
 * 128 + signal; *out (if not NULL) gets the output, malloc'ed. */
static inline int finish_program(pid_t pid, const char *log_path, char **out)
{
    int status;
    while (waitpid(pid, &status, 0) < 0)
        cr_assert_eq(errno, EINTR);
    if (out)
        *out = run_slurp(log_path);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Runs argv with output to log_path: start_program, then finish_program. */
static inline int run_program(const char *const *argv, const char *log_path, char **out)
{
    return finish_program(start_program(argv, log_path), log_path, out);
}

#endif /* DT_TEST_RUN_PROGRAM_H */
