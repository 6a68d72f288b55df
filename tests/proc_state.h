/*
 * proc_state.h — a process's state letter, as the kernel reports it in
 * field 3 of /proc/PID/stat: R running, S sleeping, T stopped (SIGSTOP),
 * Z exited but not yet reaped, ... Tests use it to wait until a launcher
 * or a worker is stopped or gone without racing on signals.
 */
#ifndef DT_TEST_PROC_STATE_H
#define DT_TEST_PROC_STATE_H

#include <stdio.h>
#include <string.h>
#include <sys/types.h>

/* The state letter of `pid`, or '?' when it is gone or unreadable. The
 * command name in parentheses may hold spaces and ')', so the letter is
 * found after the last ')'. */
static inline char proc_state(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *close = strrchr(buf, ')');
    return close && close[1] == ' ' ? close[2] : '?';
}

#endif
