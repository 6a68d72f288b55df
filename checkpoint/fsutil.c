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
 * reading outside its directory, and the step directory's name. Which
 * step directories exist, and removing old ones, is rotate.c.
 */
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
