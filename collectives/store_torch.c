/*
 * store_torch.c — sharing one rendezvous file with PyTorch's FileStore.
 *
 * PyTorch keeps a file's liveness in the file itself: every FileStore
 * handle adds 1 to the counter record "refcount/" when it opens and -1 when
 * it closes, and the close that brings the count to 0 deletes the file.
 * dtrain's liveness is an OFD lock (store.c), which PyTorch cannot see; left
 * alone, each side would take a file the other still uses for abandoned
 * and delete or empty it. So a dtrain handle takes part in PyTorch's count:
 * it adds 1 to "refcount/" when it opens and takes it back when it closes,
 * and keeps dtrain's share of the count in "refcount/dtrain". Then:
 *   - a PyTorch handle that closes while dtrain holds the file sees a count
 *     above 0, and leaves the file;
 *   - PyTorch's own handles are "refcount/" minus "refcount/dtrain"; while
 *     any is counted, dtrain neither empties the file as a dead job's
 *     leftover nor removes it at its last close. A PyTorch process that
 *     died without closing stays counted: PyTorch holds no lock, so dtrain
 *     cannot tell it from a live one, and the rule errs toward keeping the
 *     file.
 * What stays PyTorch's own rule: its last handle deletes the file when the
 * count reaches 0, whoever else may open the name next.
 * Cost: one scan of the file and two appended records per open and per
 * close of a file:// store.
 */
#include <stdio.h>
#include <string.h>

#include "store_internal.h"

/* Appends "refcount/" = refcount + delta and "refcount/dtrain" = dtrain +
 * delta, as PyTorch's add writes them (decimal text). */
static dt_status count(dt_store *s, const store_holders *h, int delta)
{
    char text[32];
    int n = snprintf(text, sizeof text, "%lld", (long long)(h->refcount + delta));
    dt_status st = comm_store_log_append_raw(s, STORE_TORCH_REFCOUNT, (const uint8_t *)text,
                                             (size_t)n);
    if (st != DT_OK)
        return st;
    n = snprintf(text, sizeof text, "%lld", (long long)(h->dtrain + delta));
    return comm_store_log_append_raw(s, STORE_DTRAIN_REFCOUNT, (const uint8_t *)text,
                                     (size_t)n);
}

int64_t comm_store_torch_holders(const store_holders *h)
{
    return h->refcount - h->dtrain;
}

dt_status comm_store_torch_join(dt_store *s)
{
    store_holders h;
    dt_status st = comm_store_log_check(s, &h);
    return st == DT_OK ? count(s, &h, +1) : st;
}

dt_status comm_store_torch_leave(dt_store *s, int64_t *torch)
{
    store_holders h;
    dt_status st = comm_store_log_check(s, &h);
    if (st == DT_OK)
        st = count(s, &h, -1);
    *torch = st == DT_OK ? comm_store_torch_holders(&h) : 1; /* unsure: keep the file */
    return st;
}
