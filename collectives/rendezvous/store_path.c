/*
 * store_path.c — what a rendezvous path may name before the store uses it.
 *
 * The path is untrusted (anyone can put something at a name under /tmp).
 * Open never follows a symlink (O_NOFOLLOW: a dangling one does not create
 * its target) and accepts only a regular file of this user that group and
 * others cannot write, checked before opening (lstat) and again on what
 * was opened (fstat); anything else is refused with DT_ESTORE, saying what
 * it is, and left as it is. A file is only ever reset when every record
 * in it is whole and has a key some writer of the format makes
 * (store_log.c): a file that merely parses, like 4 KiB of zeros, is not a
 * store.
 *
 * The checks cost two stat calls per open (lstat before, fstat after) and
 * nothing afterwards.
 */
#include "dt_file_kind.h"
#include "store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static dt_status refuse_kind(dt_store *s, mode_t mode)
{
    return comm_store_log_fail(s, DT_ESTORE,
                               "%s is %s, not a rendezvous file; it is "
                               "left as it is: remove it or choose another name",
                               s->path, dt_file_kind(mode));
}

/* A file fit to be this user's rendezvous file: a regular file of this
 * user that nobody else can write. Anything else is not ours to use,
 * reset or remove, and is left as it is. */
static dt_status check_trusted(dt_store *s, const struct stat *st)
{
    if (!S_ISREG(st->st_mode))
        return refuse_kind(s, st->st_mode);
    if (st->st_uid != geteuid())
        return comm_store_log_fail(s, DT_ESTORE,
                                   "%s belongs to uid %u, not to this "
                                   "user (uid %u); it is left as it is: choose another "
                                   "name",
                                   s->path, (unsigned)st->st_uid, (unsigned)geteuid());
    if (st->st_mode & (S_IWGRP | S_IWOTH))
        return comm_store_log_fail(s, DT_ESTORE,
                                   "%s is writable by %s (mode %04o); a "
                                   "rendezvous file must be writable by its owner only: "
                                   "it is left as it is",
                                   s->path, (st->st_mode & S_IWOTH) ? "others" : "its group",
                                   (unsigned)(st->st_mode & 07777));
    return DT_OK;
}

/* Before open: what is at the path is checked without opening it (opening
 * a FIFO or a device can have effects of its own). Nothing there is fine:
 * open creates the file. */
dt_status comm_store_path_check_before_open(dt_store *s)
{
    struct stat st;
    if (lstat(s->path, &st) != 0)
        return errno == ENOENT
                   ? DT_OK
                   : comm_store_log_fail(s, DT_ESYS, "lstat %s: %s", s->path, strerror(errno));
    return check_trusted(s, &st);
}

/* After open, the same on the inode actually opened: the path may have
 * been replaced since comm_store_path_check_before_open looked. */
dt_status comm_store_path_check_opened(dt_store *s)
{
    struct stat st;
    if (fstat(s->fd, &st) != 0)
        return comm_store_log_fail(s, DT_ESYS, "fstat %s: %s", s->path, strerror(errno));
    return check_trusted(s, &st);
}

/* open(2) refused the path: say what is there when that is the reason. */
dt_status comm_store_path_open_failed(dt_store *s, int err)
{
    struct stat st;
    if ((err == ELOOP || err == ENXIO || err == EISDIR || err == ENODEV) &&
        lstat(s->path, &st) == 0 && !S_ISREG(st.st_mode))
        return refuse_kind(s, st.st_mode);
    return comm_store_log_fail(s, DT_ESYS, "open %s: %s", s->path, strerror(err));
}
