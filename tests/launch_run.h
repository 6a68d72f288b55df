/*
 * launch_run.h — running the built dtrain-launch from a test: start it on
 * tests/launch_worker with arguments ("DIR" becomes the test's temporary
 * directory), wait for it, read its exit status, stdout, stderr and the
 * pid files the workers write, and check that no worker outlived it.
 *
 * Each run has its own temporary directory. Waiting (for pid files, for
 * the launcher) is unbounded here and bounded by each test's Criterion
 * timeout, so a launcher that hangs fails the test instead of hanging it.
 *
 * "All workers gone" is checked after the launcher exits: the launcher
 * reaps its workers before it exits, so a worker pid that still answers
 * kill(pid, 0) is a worker the launcher left behind.
 */
#ifndef DT_TEST_LAUNCH_RUN_H
#define DT_TEST_LAUNCH_RUN_H

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#ifndef LAUNCH_BIN
#error "LAUNCH_BIN must name the built dtrain-launch"
#endif
#define W LAUNCH_WORKER_BIN

extern char **environ;

typedef struct launch_run {
    pid_t pid;
    char dir[64];
    char *out, *err; /* after launch_wait: the launcher's stdout and stderr */
    int code;        /* exit code, or 128+signal */
} launch_run;

/* The launcher's environment: ours without any inherited launch contract,
 * plus `extra` ("NAME=value" strings). */
static inline char **test_env(const char *const *extra)
{
    size_t n = 0, k = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 8, sizeof *env);
    cr_assert(env);
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "DT_", 3) && strncmp(environ[i], "RANK=", 5) &&
            strncmp(environ[i], "WORLD_SIZE=", 11))
            env[k++] = environ[i];
    for (; extra && *extra; extra++)
        env[k++] = (char *)*extra;
    return env;
}

static inline void launch_start_env(launch_run *r, const char *const *extra_env, const char **args)
{
    *r = (launch_run){0};
    snprintf(r->dir, sizeof r->dir, "/tmp/dt-launch-test-XXXXXX");
    cr_assert(mkdtemp(r->dir), "mkdtemp: %s", strerror(errno));
    char out[128], err[128];
    snprintf(out, sizeof out, "%s/stdout", r->dir);
    snprintf(err, sizeof err, "%s/stderr", r->dir);
    const char *argv[32] = {LAUNCH_BIN};
    int n = 1;
    for (; *args; args++)
        argv[n++] = strcmp(*args, "DIR") ? *args : r->dir;
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char **env = test_env(extra_env);
    int rc = posix_spawn(&r->pid, LAUNCH_BIN, &fa, NULL, (char **)argv, env);
    cr_assert_eq(rc, 0, "posix_spawn %s: %s", LAUNCH_BIN, strerror(rc));
    posix_spawn_file_actions_destroy(&fa);
    free(env);
}

static inline void launch_start(launch_run *r, const char **args)
{
    launch_start_env(r, NULL, args);
}

static inline char *slurp(const char *dir, const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot read %s", path);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t got;
    while ((got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len < 2)
            buf = realloc(buf, cap *= 2);
    }
    buf[len] = '\0';
    fclose(f);
    return buf;
}

static inline void launch_wait(launch_run *r)
{
    int status;
    while (waitpid(r->pid, &status, 0) < 0)
        cr_assert_eq(errno, EINTR);
    r->code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r->out = slurp(r->dir, "stdout");
    r->err = slurp(r->dir, "stderr");
}

static inline int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static inline void launch_cleanup(launch_run *r)
{
    free(r->out);
    free(r->err);
    nftw(r->dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

static inline pid_t wait_pid_file(const launch_run *r, int rank)
{
    char path[128];
    snprintf(path, sizeof path, "%s/pid_%d", r->dir, rank);
    FILE *f;
    while (!(f = fopen(path, "r")))
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    int pid = 0;
    cr_assert_eq(fscanf(f, "%d", &pid), 1);
    fclose(f);
    return pid;
}

static inline void assert_all_gone(const launch_run *r, int n)
{
    for (int i = 0; i < n; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/pid_%d", r->dir, i);
        FILE *f = fopen(path, "r");
        if (!f)
            continue; /* stopped before it wrote its pid */
        int pid = 0;
        cr_assert_eq(fscanf(f, "%d", &pid), 1);
        fclose(f);
        cr_assert(kill(pid, 0) != 0 && errno == ESRCH, "rank %d (pid %d) outlived the launcher", i,
                  pid);
    }
}

/* The value of NAME in the line "[rank] NAME=value" of `out`, copied to buf. */
static inline const char *value_of(const char *out, int rank, const char *name, char *buf,
                                   size_t len)
{
    char key[96];
    snprintf(key, sizeof key, "[%d] %s=", rank, name);
    for (const char *p = out; (p = strstr(p, key)); p++) {
        if (p != out && p[-1] != '\n')
            continue;
        p += strlen(key);
        size_t n = strcspn(p, "\n");
        cr_assert(n < len);
        memcpy(buf, p, n);
        buf[n] = '\0';
        return buf;
    }
    cr_assert_fail("no line '%s' in the launcher's output:\n%s", key, out);
    return NULL;
}

#endif /* DT_TEST_LAUNCH_RUN_H */
