/*
 * launch_children.h — find the workers a running dtrain-launch started, by
 * rank, from /proc: what a test needs to kill one rank of a live job and
 * watch the others. Linux only (/proc/PID/task/TID/children).
 */
#ifndef DT_TEST_LAUNCH_CHILDREN_H
#define DT_TEST_LAUNCH_CHILDREN_H

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include <criterion/criterion.h>

static inline void launch_nap_ms(long ms)
{
    nanosleep(&(struct timespec){ms / 1000, ms % 1000 * 1000000}, NULL);
}

/* The RANK a process was started with, or -1. */
static inline int launch_rank_of(pid_t pid)
{
    char path[64], env[8192];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(env, 1, sizeof env - 1, f);
    fclose(f);
    env[n] = '\0';
    for (size_t i = 0; i < n; i += strlen(env + i) + 1)
        if (!strncmp(env + i, "RANK=", 5))
            return atoi(env + i + 5);
    return -1;
}

/* The pids of the launcher's children started with RANK 0..n-1, by rank;
 * true once all n are there. */
static inline bool launch_children_by_rank(pid_t launcher, pid_t *pids, int n)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)launcher);
    DIR *d = opendir(dir);
    cr_assert(d, "the launcher is gone");
    for (struct dirent *e; (e = readdir(d));) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s/children", dir, e->d_name);
        FILE *f = e->d_name[0] == '.' ? NULL : fopen(path, "r");
        for (int pid, rank; f && fscanf(f, "%d", &pid) == 1;)
            if ((rank = launch_rank_of(pid)) >= 0 && rank < n)
                pids[rank] = pid;
        if (f)
            fclose(f);
    }
    closedir(d);
    for (int r = 0; r < n; r++)
        if (!pids[r])
            return false;
    return true;
}

#endif /* DT_TEST_LAUNCH_CHILDREN_H */
