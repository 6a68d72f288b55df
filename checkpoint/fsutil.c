/*
 * fsutil.c — the file-system moves a crash-safe checkpoint is built from.
 *
 * The one idiom: a file becomes visible under its name only complete.
 * Write name.tmp, fsync it (data on disk), rename over name (atomic in
 * POSIX: a reader sees the old file or the new one, never a mix), fsync
 * the directory (the rename itself on disk). A crash leaves at most a
 * stale .tmp, which rotation removes.
 *
 * Also here: the file-name check that keeps a hostile manifest from
 * reading outside its directory, the step directory's name, and rotation
 * (--keep K), which never removes the step `latest` names.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_internal.h"

/* A shard or manifest name must be a plain name inside the directory. */
bool ckpt_name_is_safe(const char *name)
{
    if (!name || !*name || strlen(name) >= 64 || name[0] == '.')
        return false;
    for (const char *p = name; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '/' || c == '\\' || c < 0x20 || c == 0x7f)
            return false;
    }
    return strstr(name, "..") == NULL;
}

int ckpt_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

bool ckpt_write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len < ((size_t)1 << 30) ? len : (size_t)1 << 30);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        len -= (size_t)w;
    }
    return true;
}

dt_status ckpt_write_atomic(dt_ckpt *ck, const char *dir, const char *name,
                            const void *data, size_t len)
{
    char tmp[CKPT_PATH_MAX], dst[CKPT_PATH_MAX];
    ckpt_join(tmp, dir, name, ".tmp");
    ckpt_join(dst, dir, name, "");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return ckpt_fail(ck, DT_ESYS, DT_CKPT_FAULT_IO, "creating %s: %s",
                         tmp, strerror(errno));
    bool ok = ckpt_write_all(fd, data, len) && fsync(fd) == 0;
    int e = errno;
    ok = close(fd) == 0 && ok;
    if (!ok) {
        unlink(tmp);
        return ckpt_fail(ck, DT_ESYS, DT_CKPT_FAULT_IO, "writing %s: %s",
                         tmp, strerror(e));
    }
    if (rename(tmp, dst) != 0 || ckpt_fsync_dir(dir) != 0)
        return ckpt_fail(ck, DT_ESYS, DT_CKPT_FAULT_IO,
                         "committing %s: %s", dst, strerror(errno));
    return DT_OK;
}

dt_status ckpt_read_small(dt_ckpt *ck, const char *path, size_t max,
                          char **out, size_t *len)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ckpt_fail(ck, errno == ENOENT ? DT_EINVAL : DT_ESYS,
                         errno == ENOENT ? DT_CKPT_FAULT_NO_CHECKPOINT
                                         : DT_CKPT_FAULT_IO,
                         "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_IO,
                         "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > max) {
        close(fd);
        return ckpt_fail(ck, DT_EPROTO, DT_CKPT_FAULT_ABSURD,
                         "%s: %lld bytes, more than the %zu allowed", path,
                         (long long)st.st_size, max);
    }
    size_t n = (size_t)st.st_size, got = 0;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return ckpt_fail(ck, DT_ENOMEM, DT_CKPT_FAULT_IO, "%s: out of memory",
                         path);
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return DT_OK;
}

void ckpt_step_name(char *buf, size_t len, long step)
{
    snprintf(buf, len, "step_%08ld", step);
}

/* step_NNNNNNNN -> NNNNNNNN, or -1 if the name is not a step directory. */
static long parse_step_name(const char *name)
{
    if (strncmp(name, "step_", 5) != 0 || !name[5])
        return -1;
    char *end = NULL;
    long v = strtol(name + 5, &end, 10);
    return *end == '\0' && v >= 0 ? v : -1;
}

/* Removes the regular files of dir, then dir. */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[CKPT_PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        ckpt_join(path, dir, e->d_name, "");
        unlink(path);
    }
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

/*
 * Rotation runs on rank 0 after a commit, when no save is in flight: every
 * step directory that is not among the `keep` newest committed ones, and
 * not the one latest names, is removed — uncommitted (crashed) ones too.
 */
void ckpt_rotate(dt_ckpt *ck, int keep, const char *latest_name)
{
    remove_tmp_files(ck->root);
    DIR *d = opendir(ck->root);
    if (!d)
        return;
    long *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long s = parse_step_name(e->d_name);
        if (s < 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            long *p = realloc(steps, cap * sizeof *p);
            if (!p)
                break;
            steps = p;
        }
        steps[n++] = s;
    }
    closedir(d);
    qsort(steps, n, sizeof *steps, cmp_long_desc);
    char name[64], dir[CKPT_PATH_MAX], man[CKPT_PATH_MAX];
    int kept = 0;
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
        remove_dir(dir);
    }
    free(steps);
    ckpt_fsync_dir(ck->root);
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
