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
 *
 * Paths under a root are untrusted: anyone who can write there can put a
 * symlink or a FIFO at a name we are about to use. So nothing here follows
 * a symlink at the last component (O_NOFOLLOW), a .tmp is created only
 * when nothing is at its name (O_EXCL), reads open with O_NONBLOCK (a FIFO
 * must not hang a reader) and check the type on what was opened (fstat)
 * before reading a byte; every message escapes control characters
 * (dt_ckpt_printable, failure.c), so a hostile name cannot drive a terminal.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_internal.h"
#include "dt_file_kind.h"

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

static dt_status refuse_symlink(dt_ckpt *ck, const char *path)
{
    return ckpt_fail(ck, DT_EPROTO, DT_CKPT_FAULT_UNSAFE_NAME,
                     "%s: is a "
                     "symbolic link; a checkpoint never follows one (it could "
                     "point anywhere): remove it",
                     path);
}

/* open(2) of path failed with err: say what is there when that is why. */
static dt_status open_refused(dt_ckpt *ck, const char *path, int err, const char *want)
{
    struct stat st; /* O_DIRECTORY | O_NOFOLLOW on a symlink says ENOTDIR */
    if (err == ELOOP || (err == ENOTDIR && lstat(path, &st) == 0 && S_ISLNK(st.st_mode)))
        return refuse_symlink(ck, path);
    if ((err == ENXIO || err == ENOTDIR || err == ENODEV || err == EISDIR) && lstat(path, &st) == 0)
        return ckpt_fail(ck, DT_EPROTO, DT_CKPT_FAULT_IO, "%s: is %s, not %s", path,
                         dt_file_kind(st.st_mode), want);
    return ckpt_fail(ck, DT_ESYS, DT_CKPT_FAULT_IO, "%s: %s", path, strerror(err));
}

int ckpt_open_regular(dt_ckpt *ck, const char *path, struct stat *st)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        if (e != ENOENT)
            open_refused(ck, path, e, "a regular file");
        errno = e;
        return -1;
    }
    if (fstat(fd, st) != 0)
        ckpt_fail(ck, DT_ESYS, DT_CKPT_FAULT_IO, "%s: fstat: %s", path, strerror(errno));
    else if (!S_ISREG(st->st_mode))
        ckpt_fail(ck, DT_EPROTO, DT_CKPT_FAULT_IO,
                  "%s: is %s, not a regular "
                  "file",
                  path, dt_file_kind(st->st_mode));
    else
        return fd;
    close(fd);
    errno = EINVAL; /* not ENOENT: the failure is recorded */
    return -1;
}

dt_status ckpt_check_dir(dt_ckpt *ck, const char *dir)
{
    char path[CKPT_PATH_MAX];
    snprintf(path, sizeof path, "%s", dir);
    for (size_t n = strlen(path); n > 1 && path[n - 1] == '/'; n--)
        path[n - 1] = '\0'; /* "d/" would follow a symlink d */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK);
    if (fd >= 0) {
        close(fd);
        return DT_OK;
    }
    if (errno == ENOENT)
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_NO_CHECKPOINT, "%s: no such directory", path);
    return open_refused(ck, path, errno, "a directory");
}

int ckpt_create_tmp(dt_ckpt *ck, const char *path)
{
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
            ckpt_fail(ck, DT_EPROTO, DT_CKPT_FAULT_UNSAFE_NAME,
                      "creating "
                      "%s: something is in the way (%s of uid %u), and a save "
                      "never writes through it: remove it",
                      path, dt_file_kind(st.st_mode), (unsigned)st.st_uid);
            return -1;
        }
        (void)unlink(path); /* a crashed save's; O_EXCL below catches a race */
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    int e = errno;
    if (fd < 0)
        ckpt_fail(ck, DT_ESYS, DT_CKPT_FAULT_IO, "creating %s: %s%s", path, strerror(e),
                  e == EEXIST ? " (it appeared while saving: is "
                                "another job writing here?)"
                              : "");
    return fd;
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

dt_status ckpt_write_atomic(dt_ckpt *ck, const char *dir, const char *name, const void *data,
                            size_t len)
{
    char tmp[CKPT_PATH_MAX], dst[CKPT_PATH_MAX];
    ckpt_join(tmp, dir, name, ".tmp");
    ckpt_join(dst, dir, name, "");
    int fd = ckpt_create_tmp(ck, tmp);
    if (fd < 0)
        return ck->status;
    bool ok = ckpt_write_all(fd, data, len) && fsync(fd) == 0;
    int e = errno;
    ok = close(fd) == 0 && ok;
    if (!ok) {
        unlink(tmp);
        return ckpt_fail(ck, DT_ESYS, DT_CKPT_FAULT_IO, "writing %s: %s", tmp, strerror(e));
    }
    if (rename(tmp, dst) != 0 || ckpt_fsync_dir(dir) != 0)
        return ckpt_fail(ck, DT_ESYS, DT_CKPT_FAULT_IO, "committing %s: %s", dst, strerror(errno));
    return DT_OK;
}

dt_status ckpt_read_small(dt_ckpt *ck, const char *path, size_t max, char **out, size_t *len)
{
    *out = NULL;
    struct stat st;
    int fd = ckpt_open_regular(ck, path, &st);
    if (fd < 0 && errno == ENOENT)
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_NO_CHECKPOINT, "%s: %s", path,
                         strerror(ENOENT));
    if (fd < 0)
        return ck->status;
    if ((uint64_t)st.st_size > max) {
        close(fd);
        return ckpt_fail(ck, DT_EPROTO, DT_CKPT_FAULT_ABSURD,
                         "%s: %lld bytes, more than the %zu allowed", path, (long long)st.st_size,
                         max);
    }
    size_t n = (size_t)st.st_size, got = 0;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return ckpt_fail(ck, DT_ENOMEM, DT_CKPT_FAULT_IO, "%s: out of memory", path);
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
