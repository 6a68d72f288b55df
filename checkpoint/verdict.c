/*
 * verdict.c — one verdict for every rank of a collective checkpoint call.
 *
 * Why. A save or a load is a collective: its ranks do their parts of the
 * disk work independently, and each may find a different thing wrong (or
 * nothing). The callers act on the result collectively (resume or not,
 * train on or stop), so every rank must return the same status, and a
 * rank whose own part went fine must still be able to say what went
 * wrong elsewhere: "rank 2 of the load found: .../rank00002.bin: SHA-256
 * 9ea3…, the manifest says f2b9…".
 *
 * Idea. Each rank's outcome is the status on its handle. An all-reduce
 * (min) of "my rank if I failed, else world" names the lowest rank that
 * failed, or nobody; if somebody did, that rank broadcasts its status,
 * fault and message, and every other rank adopts them. The lowest failing
 * rank wins so that the choice is the same everywhere without a second
 * round; its message is the one reproduced, other ranks' own findings (if
 * any) are replaced, as a save or a load stops at its first failure too.
 *
 * Cost: one 4-byte all-reduce when all went well (the price of any
 * agreement); plus one broadcast of VERDICT_BYTES when something failed.
 * Every rank must call it, whatever happened before: in a load it is the
 * only collective, so a rank that failed early still meets the others
 * here and nobody waits for a rank that gave up.
 */
#include <string.h>

#include "ckpt_internal.h"

/* status u32 @0, fault u32 @4, message @8 (NUL-terminated) */
#define VERDICT_BYTES 1024

dt_status ckpt_agree(dt_ckpt *ck, dt_comm *comm, const char *what)
{
    if (!comm)
        return ck->status;
    int rank = dt_comm_rank(comm), world = dt_comm_size(comm);
    int32_t first = ck->status != DT_OK ? rank : world;
    dt_status st = dt_allreduce(comm, &first, 1, DT_I32, DT_MIN);
    if (st != DT_OK)
        return ckpt_fail(ck, st, DT_CKPT_FAULT_IO,
                         "%s: agreeing on the "
                         "verdict: %s",
                         what, dt_comm_error(comm));
    if (first >= world)
        return DT_OK;
    unsigned char rec[VERDICT_BYTES] = {0};
    if (rank == first) {
        put_le32(rec, (uint32_t)ck->status);
        put_le32(rec + 4, (uint32_t)ck->fault);
        memcpy(rec + 8, ck->err, strnlen(ck->err, VERDICT_BYTES - 9));
    }
    st = dt_broadcast(comm, rec, sizeof rec, DT_U8, (int)first);
    if (st != DT_OK)
        return ckpt_fail(ck, st, DT_CKPT_FAULT_IO,
                         "%s: hearing rank %d's "
                         "verdict: %s",
                         what, (int)first, dt_comm_error(comm));
    if (rank == first)
        return ck->status;
    dt_status theirs = (dt_status)get_le32(rec);
    dt_ckpt_fault fault = (dt_ckpt_fault)get_le32(rec + 4);
    rec[VERDICT_BYTES - 1] = '\0';
    return ckpt_fail(ck, theirs != DT_OK ? theirs : DT_EPROTO, fault, "rank %d of the %s found: %s",
                     (int)first, what, (const char *)rec + 8);
}
