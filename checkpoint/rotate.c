/*
 * rotate.c — the step directories under a root: which are committed, and
 * rotation (--keep K), which removes the old ones off the save's critical
 * path.
 *
 * Rotation runs on rank 0 after a commit: every step directory that is
 * not among the `keep` newest committed ones, and not the one `latest`
 * names, goes — uncommitted (crashed) ones too — and so do stale .tmp
 * files in the root.
 *
 * Why in the background. Removing a directory of shard files costs
 * little CPU but a lot of waiting: on ext4 an unlink of a written-back
 * 44 MB shard blocks ~15 ms (freeing its extents), one after the other
 * within a directory. That was ~60 ms of every save (4 shards, --keep 1),
 * spent after the commit by rank 0 alone while the other ranks waited
 * for its verdict.
 *
 * Idea. Deciding is cheap and stays synchronous; a doomed directory is
 * renamed to ".removing-step_N" at once (one atomic rename: from that
 * instant it is not a step directory for anyone — no scan, no load, no
 * `latest` ever names it), and a reaper thread owned by the handle
 * empties and removes such directories while training goes on. The
 * reaper first fsyncs the root, so that no shard is gone on disk while
 * its directory could still come back under its step name after a crash.
 * A leftover ".removing-" directory (a crash mid-reap) is removed by the
 * next rotation's reaper, which starts for it even when that rotation
 * renames nothing itself. At most one reaper runs per handle: the next
 * rotation and dt_ckpt_close join it first.
 *
 * When a directory cannot be renamed (its trash name is taken by a
 * leftover), it is removed synchronously, manifest first and the
 * directory fsynced: it is uncommitted, durably, before any of its shards
 * disappear.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_internal.h"

#define TRASH_PREFIX ".removing-"

/* step_NNNNNNNN -> NNNNNNNN, or -1 if the name is not a step directory. */
static long parse_step_name(const char *name)
{
    if (strncmp(name, "step_", 5) != 0 || !name[5])
        return -1;
    char *end = NULL;
    long v = strtol(name + 5, &end, 10);
    return *end == '\0' && v >= 0 ? v : -1;
}

/* Removes the manifest of dir (if any), its other regular files, then dir.
 * Through a descriptor opened with O_NOFOLLOW: a symlink planted at a step
 * name is removed itself, never the files of the directory it points to. */
static void remove_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP || errno == ENOTDIR)
            unlink(dir);
        return;
    }
    if (unlinkat(fd, "manifest.json", 0) == 0)
        fsync(fd); /* uncommitted, durably, before a shard goes */
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlinkat(fd, e->d_name, 0);
    closedir(d);
    rmdir(dir);
}

/* Removes *.tmp files from dir. */
static void remove_tmp_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[CKPT_PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n > 4 && strcmp(e->d_name + n - 4, ".tmp") == 0) {
            ckpt_join(path, dir, e->d_name, "");
            unlink(path);
        }
    }
    closedir(d);
}

static int cmp_long_desc(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The reaper: its own copy of the root, nothing shared with the handle. */
typedef struct reaper_job {
    char root[CKPT_PATH_MAX];
} reaper_job;

static void *reap(void *arg)
{
    reaper_job *j = arg;
    ckpt_fsync_dir(j->root); /* the renames reach the disk before any unlink */
    DIR *d = opendir(j->root);
    struct dirent *e;
    char path[CKPT_PATH_MAX];
    while (d && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, TRASH_PREFIX, strlen(TRASH_PREFIX)) != 0)
            continue;
        ckpt_join(path, j->root, e->d_name, "");
        remove_dir(path);
    }
    if (d)
        closedir(d);
    free(j);
    return NULL;
}

void ckpt_rotate_wait(dt_ckpt *ck)
{
    if (ck->reaping)
        pthread_join(ck->reaper, NULL);
    ck->reaping = false;
}

/* Starts a reaper (inline if no thread can be had). */
static void start_reaper(dt_ckpt *ck)
{
    reaper_job *j = malloc(sizeof *j);
    if (!j)
        return; /* the next rotation's reaper removes the renamed ones */
    memcpy(j->root, ck->root, sizeof j->root);
    ck->reaping = pthread_create(&ck->reaper, NULL, reap, j) == 0;
    if (!ck->reaping)
        reap(j);
}

/* The step numbers under root, newest first; *n of them (malloc'ed).
 * *trash: whether a renamed-away step (an interrupted removal) is there. */
static long *list_steps(const char *root, size_t *n, bool *trash)
{
    *n = 0;
    *trash = false;
    DIR *d = opendir(root);
    if (!d)
        return NULL;
    long *steps = NULL;
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long s = parse_step_name(e->d_name);
        *trash |= strncmp(e->d_name, TRASH_PREFIX, strlen(TRASH_PREFIX)) == 0;
        if (s < 0)
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            long *p = realloc(steps, cap * sizeof *p);
            if (!p)
                break;
            steps = p;
        }
        steps[(*n)++] = s;
    }
    closedir(d);
    if (steps)
        qsort(steps, *n, sizeof *steps, cmp_long_desc);
    return steps;
}

void ckpt_rotate(dt_ckpt *ck, int keep, const char *latest_name)
{
    ckpt_rotate_wait(ck);
    remove_tmp_files(ck->root);
    size_t n;
    bool leftovers;
    long *steps = list_steps(ck->root, &n, &leftovers);
    char name[64], dir[CKPT_PATH_MAX], man[CKPT_PATH_MAX], trash[CKPT_PATH_MAX];
    int kept = 0;
    bool renamed = false;
    for (size_t i = 0; i < n; i++) {
        ckpt_step_name(name, sizeof name, steps[i]);
        ckpt_join(dir, ck->root, name, "");
        ckpt_join(man, dir, "manifest.json", "");
        bool committed = access(man, F_OK) == 0;
        bool is_latest = latest_name && strcmp(name, latest_name) == 0;
        if (is_latest || (committed && (keep <= 0 || kept < keep))) {
            kept += committed;
            remove_tmp_files(dir);
            continue;
        }
        ckpt_join(trash, ck->root, TRASH_PREFIX, name);
        if (rename(dir, trash) == 0)
            renamed = true;
        else
            remove_dir(dir);
    }
    free(steps);
    if (renamed || leftovers) /* leftovers: an earlier removal was cut short */
        start_reaper(ck);
}

/* The newest committed step directory other than `except`, into name
 * (64 bytes); false if there is none. */
bool ckpt_newest_committed(const dt_ckpt *ck, long except, char *name)
{
    DIR *d = opendir(ck->root);
    if (!d)
        return false;
    long best = -1;
    struct dirent *e;
    char path[CKPT_PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        long s = parse_step_name(e->d_name);
        if (s < 0 || s == except || s <= best)
            continue;
        ckpt_join(path, ck->root, e->d_name, "/manifest.json");
        if (access(path, F_OK) == 0)
            best = s;
    }
    closedir(d);
    if (best >= 0)
        ckpt_step_name(name, 64, best);
    return best >= 0;
}
