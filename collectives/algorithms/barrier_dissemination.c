/*
 * barrier_dissemination.c — the dissemination barrier (Hensgen, Finkel &
 * Manber): no rank leaves before every rank has arrived.
 *
 * The idea. In round k (distance d = 2^k) every rank sends an empty message
 * to rank+d and waits for one from rank-d (mod p). After round k a rank has
 * heard, directly or through the chain of messages, from the 2^(k+1) - 1
 * ranks before it; after ⌈log2 p⌉ rounds, from all p - 1 others, so all of
 * them have arrived. No root, no second "release" phase, and every rank
 * does the same work. With p = 5:
 *
 *   round 0 (d=1)   0→1  1→2  2→3  3→4  4→0
 *   round 1 (d=2)   0→2  1→3  2→4  3→0  4→1
 *   round 2 (d=4)   0→4  1→0  2→1  3→2  4→3
 *
 * Rank 0 hears from 4 in round 0; from 3, which had heard from 2, in
 * round 1; from 1 in round 2: all four others have arrived.
 *
 * Messages are zero-byte transfers: a frame header and nothing else. The
 * header carries the op's sequence number, so a rank that is in another op
 * is caught by the transport's checks, not by a wrong barrier.
 *
 * Cost (α-β): ⌈log2 p⌉α; no bytes. Invariant: round k's send and receive
 * pair up with round k's on the two partners because rounds run in order
 * on every rank; p = 1 returns at once.
 */
#include "algorithms.h"

dt_status comm_barrier_dissemination(dt_opctx *o)
{
    const int p = o->size, r = o->rank;
    char nothing = 0; /* a valid address for the zero-byte transfers */
    for (int d = 1; d < p; d *= 2) {
        dt_xfer xs[2];
        comm_xfer_recv(o, &xs[0], (r - d + p) % p, &nothing, 0);
        comm_xfer_send(o, &xs[1], (r + d) % p, &nothing, 0);
        dt_status st = comm_xfer_wait_all(o, xs, 2);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}
