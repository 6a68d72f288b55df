/*
 * store_reap.c — removing a dead job's rendezvous file without joining it.
 *
 * A job's file goes when its last handle closes (store.c). A job whose
 * processes were all killed outright leaves it: a SIGKILLed launcher takes
 * its workers with it, and nobody closes anything. dt_store_remove_if_dead
 * is how the launcher's side cleans up after such a job. It looks at the
 * liveness lock the way open does, with an exclusive try that never waits:
 * a live handle anywhere (shared lock held) means a live job, and its file
 * is left exactly as it is: not joined, not written, not reset. Only when
 * nobody holds the file, it is still the inode at the path, and it is all
 * store records that PyTorch has not used (the test open applies before it
 * resets a file, store_log.c, store_torch.c) is it unlinked, with the lock
 * still held, so a newcomer that opens the name afterwards creates a fresh
 * file, as after a last close.
 *
 * Nothing is appended, so a watcher may call it again and again while a
 * job winds down. Cost: an lstat, an open, one fcntl; when nobody holds the
 * file, one flock and one read of it.
 */
#include "store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

/* With the liveness lock held exclusively: whether the file is a dtrain
 * store PyTorch has not used, i.e. one open would reset as a leftover. */
static bool is_dead_store(dt_store *s)
{
    if (comm_store_flock(s, LOCK_EX) != DT_OK)
        return false;
    store_holders h;
    bool dead = comm_store_log_check(s, &h) == DT_OK && !comm_store_torch_involved(&h);
    comm_store_funlock(s);
    return dead;
}

dt_status dt_store_remove_if_dead(const char *url, bool *removed)
{
    *removed = false;
    if (!url || strncmp(url, "file:///", 8) != 0)
        return DT_EINVAL;
    dt_store s = {.fd = -1,
                  .url = (char *)url,
                  .path = (char *)url + 7,
                  .job_id = (char *)"dtrain-reap"};
    if (access(s.path, F_OK) != 0 && errno == ENOENT)
        return DT_OK; /* already gone */
    if (comm_store_path_check_before_open(&s) != DT_OK)
        return DT_ESTORE; /* not a file of ours: left alone */
    s.fd = open(s.path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK); /* F_WRLCK needs it */
    if (s.fd < 0)
        return errno == ENOENT ? DT_OK : DT_ESYS;
    dt_status st = comm_store_path_check_opened(&s);
    if (st == DT_OK && comm_store_liveness_lock(s.fd, F_WRLCK, false) == 0 &&
        comm_store_still_named(s.fd, s.path) && is_dead_store(&s))
        *removed = unlink(s.path) == 0;
    close(s.fd); /* drops the lock */
    return st;
}
