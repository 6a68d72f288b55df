/*
 * dt_file_kind.h — what kind of file a mode says, in words, for the
 * messages of code that refuses what is not a regular file (a rendezvous
 * path, a checkpoint's shard or manifest): "/tmp/x is a FIFO, not ...".
 * Header-only (base/); cost: a few mode tests.
 */
#ifndef DT_FILE_KIND_H
#define DT_FILE_KIND_H

#include <sys/stat.h>

static inline const char *dt_file_kind(mode_t m)
{
    return S_ISFIFO(m)   ? "a FIFO"
           : S_ISSOCK(m) ? "a socket"
           : S_ISDIR(m)  ? "a directory"
           : S_ISLNK(m)  ? "a symbolic link"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISREG(m)  ? "a regular file"
                         : "of an unknown type";
}

#endif /* DT_FILE_KIND_H */
