/*
 * test_progress.c — minigpt's progress bar reaches a terminal and nothing
 * else.
 *
 * Rank 0 draws a bar ('\r' and escape codes) only when the output really
 * ends on a terminal: alone on one, or under dtrain-launch when the
 * launcher's stdout is one (DT_PROGRESS=1). Under mpirun, whose rank 0 gets
 * a pseudo-terminal even when mpirun's own output is a file, it does not.
 * The launcher draws '\r' status lines in place on a terminal and keeps
 * them out of pipes, files and logs. Programs run under a pseudo-terminal
 * (forkpty) or with a pipe; the bar is recognised by its "N/3 loss" text,
 * which no step line has.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pty.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch.h"

extern char **environ;

/* Our environment without any launch contract, plus `extra` (NULL-ended). */
static char **clean_env(const char *const *extra)
{
    static const char *const drop[] = {"DT_", "RANK=",  "WORLD_SIZE=", "OMPI_",
                                       "PMI", "SLURM_", "TERM="};
    size_t n = 0, k = 0, e = 0;
    while (environ[n])
        n++;
    while (extra && extra[e])
        e++;
    char **env = calloc(n + e + 2, sizeof *env);
    for (size_t i = 0; i < n; i++) {
        bool keep = true;
        for (size_t d = 0; d < sizeof drop / sizeof drop[0]; d++)
            keep = keep && strncmp(environ[i], drop[d], strlen(drop[d])) != 0;
        if (keep)
            env[k++] = environ[i];
    }
    env[k++] = "TERM=xterm";
    for (size_t i = 0; i < e; i++)
        env[k++] = (char *)extra[i];
    return env;
}

/* Runs argv with stdout and stderr on a pseudo-terminal (pty) or a pipe;
 * returns everything printed, malloc'ed, and the exit code in *code. */
static char *run_on(bool pty, const char *const *argv, const char *const *extra, int *code)
{
    char **env = clean_env(extra);
    int fd, p[2] = {-1, -1};
    pid_t pid;
    if (pty) {
        pid = forkpty(&fd, NULL, NULL, NULL);
    } else {
        cr_assert_eq(pipe(p), 0);
        pid = fork();
        fd = p[0];
    }
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        if (!pty) {
            dup2(p[1], 1);
            dup2(p[1], 2);
            close(p[0]);
        }
        execve(argv[0], (char **)argv, env);
        _exit(127);
    }
    if (!pty)
        close(p[1]);
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    for (;;) {
        if (cap - len < 4096)
            out = realloc(out, cap *= 2);
        ssize_t got = read(fd, out + len, cap - len - 1);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break; /* EOF, or EIO once the pty's last writer is gone */
        len += (size_t)got;
    }
    out[len] = '\0';
    close(fd);
    int status;
    waitpid(pid, &status, 0);
    *code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    free(env);
    return out;
}

#define MINIGPT_3_STEPS MINIGPT_BIN, "--steps", "3", "--log-every", "1", "--sample", "0"

Test(progress, alone_on_a_terminal_rank_0_draws_its_bar, .timeout = 60)
{
    int code;
    char *out = run_on(true, (const char *[]){MINIGPT_3_STEPS, NULL}, NULL, &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "3/3 loss"), "no bar:\n%s", out);
    free(out);
}

Test(progress, under_mpirun_a_terminal_is_not_enough, .timeout = 60)
{
    int code;
    char *out = run_on(true, (const char *[]){MINIGPT_3_STEPS, NULL},
                       (const char *[]){"OMPI_COMM_WORLD_SIZE=1", "OMPI_COMM_WORLD_RANK=0", NULL},
                       &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(!strstr(out, "/3 loss"), "a bar was drawn under mpirun:\n%s", out);
    free(out);
}

Test(progress, dt_progress_0_keeps_the_bar_off_a_terminal, .timeout = 60)
{
    int code;
    char *out = run_on(true, (const char *[]){MINIGPT_3_STEPS, NULL},
                       (const char *[]){"DT_PROGRESS=0", NULL}, &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(!strstr(out, "/3 loss"), "a bar was drawn:\n%s", out);
    free(out);
}

Test(progress, the_launcher_on_a_terminal_shows_rank_0s_bar_in_place, .timeout = 60)
{
    int code;
    char *out = run_on(true, (const char *[]){LAUNCH_BIN, "-n", "1", MINIGPT_3_STEPS, NULL}, NULL,
                       &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "\r[0] [") && strstr(out, "/3 loss"), "no bar:\n%s", out);
    free(out);
}

Test(progress, the_launcher_into_a_pipe_gets_no_bar, .timeout = 60)
{
    int code;
    char *out = run_on(false, (const char *[]){LAUNCH_BIN, "-n", "1", MINIGPT_3_STEPS, NULL}, NULL,
                       &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(!strchr(out, '\r') && !strstr(out, "/3 loss"), "a bar in a pipe:\n%s", out);
    free(out);
}

Test(progress, status_lines_stay_out_of_pipes_and_logs, .timeout = 30)
{
    char dir[64], log[96];
    snprintf(dir, sizeof dir, "/tmp/dtrain-test-progress-%d", (int)getpid());
    int code;
    char *out = run_on(false,
                       (const char *[]){LAUNCH_BIN, "--log-dir", dir, "/bin/sh", "-c",
                                        "printf '\\rbar 1\\rbar 2\\r\\033[Kline one\\n'", NULL},
                       NULL, &code);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "[0] line one\n") && !strstr(out, "bar"), "%s", out);
    snprintf(log, sizeof log, "%s/rank_00000.log", dir);
    FILE *f = fopen(log, "r");
    cr_assert(f, "no %s", log);
    char text[256] = "";
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    unlink(log);
    rmdir(dir);
    cr_expect_str_eq(text, "line one\n");
    free(out);
}

/* The launcher's relay itself, on a pseudo-terminal: a worker's bar followed
 * by the next '\r' within one read (fast steps) is drawn all the same, so
 * whether the bar shows does not depend on how the pipe splits the bytes. */
Test(progress, a_bar_superseded_within_one_read_is_still_drawn_on_a_terminal, .timeout = 10)
{
    int master, slave;
    cr_assert_eq(openpty(&master, &slave, NULL, NULL, NULL), 0, "openpty: %s", strerror(errno));
    output_tail tail = {0};
    output_stream s;
    launch_output_init(&s, 0, slave, -1, &tail);
    const char worker[] = "\r[#.........] 1/3 loss 4.3547\r[##########] 2/3 loss 4.2816"
                          "\r\033[Kreplicas: identical\n";
    launch_output_feed(&s, worker, sizeof worker - 1);
    launch_output_finish(&s);
    launch_output_free(&s);
    close(slave);
    char out[4096];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof out - 1 && (r = read(master, out + n, sizeof out - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = '\0';
    close(master);
    cr_expect(strstr(out, "\r[0] [#.........] 1/3 loss 4.3547"), "bar 1 not drawn:\n%s", out);
    cr_expect(strstr(out, "\r[0] [##########] 2/3 loss 4.2816"), "bar 2 not drawn:\n%s", out);
    cr_expect(strstr(out, "[0] replicas: identical"), "the line is missing:\n%s", out);
}

/* How often `needle` occurs in `text`. */
static int occurrences(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* A worker that flushes each step's bar on its own (the usual case: one
 * read per bar) has each bar drawn once: the bar held at the end of one
 * read was drawn then, and the next read's '\r' does not draw it again. */
Test(progress, a_bar_in_a_read_of_its_own_is_drawn_once, .timeout = 10)
{
    int master, slave;
    cr_assert_eq(openpty(&master, &slave, NULL, NULL, NULL), 0, "openpty: %s", strerror(errno));
    output_tail tail = {0};
    output_stream s;
    launch_output_init(&s, 0, slave, -1, &tail);
    const char *reads[] = {"\r[#.........] 1/3 loss 4.3547", "\r[######....] 2/3 loss 4.2816",
                           "\r[##########] 3/3 loss 4.1002", "\r\033[Kdone\n"};
    for (size_t i = 0; i < sizeof reads / sizeof reads[0]; i++)
        launch_output_feed(&s, reads[i], strlen(reads[i]));
    launch_output_finish(&s);
    launch_output_free(&s);
    close(slave);
    char out[4096];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof out - 1 && (r = read(master, out + n, sizeof out - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = '\0';
    close(master);
    cr_expect_eq(occurrences(out, "1/3 loss"), 1, "bar 1 drawn other than once:\n%s", out);
    cr_expect_eq(occurrences(out, "2/3 loss"), 1, "bar 2 drawn other than once:\n%s", out);
    cr_expect_eq(occurrences(out, "3/3 loss"), 1, "bar 3 drawn other than once:\n%s", out);
    cr_expect(strstr(out, "[0] done"), "the line is missing:\n%s", out);
}
