/*
 * store_torch.c — sharing one rendezvous file with PyTorch's FileStore.
 *
 * PyTorch keeps what it knows of a file's users in the file itself, as
 * counter records: each FileStore handle adds 1 to "cleanup/" when it
 * closes (PyTorch 2 also adds 1 to "refcount/" when it opens and -1 when it
 * closes), and the close that brings "cleanup/" to the handle count the
 * program gave (and "refcount/" to 0) deletes the file. dtrain's liveness
 * is an OFD lock (store.c), which PyTorch cannot see. Left alone, each side
 * would take a file the other still uses for abandoned: PyTorch would
 * delete a file dtrain holds, dtrain would empty or delete one PyTorch
 * holds. So:
 *
 *   - each dtrain handle counts itself in PyTorch's counters while it is
 *     open: "refcount/" +1 and "cleanup/" -1 (a handle that has not
 *     finished), taken back when it closes; dtrain's share of "refcount/"
 *     is kept in "refcount/dtrain". A PyTorch handle that closes while
 *     dtrain holds the file then never reaches its deletion condition.
 *   - PyTorch has used a file when it holds a record in PyTorch's key space
 *     ("/k", "-/k") or counters that are not only dtrain's. PyTorch 1.13
 *     records nothing when a handle opens, so dtrain cannot tell a live
 *     PyTorch user from a finished one: such a file is never emptied as a
 *     dead job's leftover, nor removed at dtrain's last close. It stays
 *     PyTorch's to remove (its last handle does), or the user's.
 *
 * Cost: one scan of the file and three appended records per open and per
 * close of a file:// store.
 */
#include <stdio.h>
#include <string.h>

#include "store_internal.h"

static dt_status put_counter(dt_store *s, const char *key, int64_t value)
{
    char text[32];
    int n = snprintf(text, sizeof text, "%lld", (long long)value);
    return comm_store_log_append_raw(s, key, (const uint8_t *)text, (size_t)n);
}

/* This handle in (+1) or out (-1) of PyTorch's counters, as PyTorch's add
 * writes them (decimal text, the last record of a key wins). */
static dt_status count(dt_store *s, store_holders *h, int delta)
{
    h->refcount += delta;
    h->cleanup -= delta;
    h->dtrain += delta;
    dt_status st = put_counter(s, STORE_TORCH_REFCOUNT, h->refcount);
    if (st == DT_OK)
        st = put_counter(s, STORE_TORCH_CLEANUP, h->cleanup);
    if (st == DT_OK)
        st = put_counter(s, STORE_DTRAIN_REFCOUNT, h->dtrain);
    return st;
}

bool comm_store_torch_involved(const store_holders *h)
{
    return h->torch_keys || h->refcount != h->dtrain || h->cleanup != -h->dtrain;
}

dt_status comm_store_torch_join(dt_store *s)
{
    store_holders h;
    dt_status st = comm_store_log_check(s, &h);
    return st == DT_OK ? count(s, &h, +1) : st;
}

dt_status comm_store_torch_leave(dt_store *s, bool *torch)
{
    store_holders h;
    dt_status st = comm_store_log_check(s, &h);
    if (st == DT_OK)
        st = count(s, &h, -1);
    *torch = st != DT_OK || comm_store_torch_involved(&h); /* unsure: keep the file */
    return st;
}
