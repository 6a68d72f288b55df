/*
 * root_agreement.c — a rooted op (broadcast, reduce, gather, scatter) first
 * checks that every rank names the same root; only then does data move.
 *
 * Why a rooted op needs this and the others do not. Every frame carries the
 * op's identity (kind, sequence number, count, dtype, reduction, root), and
 * a receiver compares it with the receive it posted (transport_read.c). In an
 * op whose pattern does not depend on its arguments — the ring, recursive
 * doubling, the barrier — each rank receives from the same peers whatever
 * it was told, so a rank that disagrees is caught by the first frame it
 * sends or receives. A rooted op's pattern is a function of the root, so
 * ranks that disagree about the root disagree about who talks to whom: a
 * rank that believes it is the root of a broadcast only sends, and its
 * frames land at ranks that expect nothing from it. Those frames wait
 * unread while every rank finishes "successfully" — rank 1 keeps its own
 * data, the others get rank 0's — which is the worst kind of failure.
 *
 * The check. To return DT_OK a rank must know that every other rank names
 * its root, i.e. it must have heard, directly or through others, from all
 * p-1 of them in this op: a barrier's worth of messages, no fewer. So
 * before the algorithm runs, the ranks run a dissemination barrier
 * (barrier_dissemination.c) under the op's own identity: zero-byte frames
 * whose headers carry the root. Its pattern does not depend on the root,
 * so it cannot deadlock on a disagreement: round 0 (rank i → i+1) runs on
 * every rank, and since not all roots are equal, some neighbour pair
 * differs and its receiver sees both views at once. That rank fails with
 * DT_EPROTO and sends every peer an ABORT carrying the message; no rank
 * can leave the barrier meanwhile, since each one's exit depends on every
 * rank's frames, so every rank fails in this op, with both views, and no
 * buffer has been touched. The messages of the barrier are part of the op:
 * they take the first message indices of each pair, the algorithm's
 * continue after them.
 *
 * The alternatives. Checking after the data (an acknowledgement to the
 * root, or a barrier at the end) costs the same latency but lets the data
 * phase run with disagreeing patterns, where ranks can wait on each other
 * until the timeout. A check folded into the algorithm (every rank sending
 * its root along a dissemination pattern that also carries the data) could
 * hide the latency for a small broadcast, at the price of a second version
 * of every rooted algorithm; not done.
 *
 * Cost (α-β): ⌈log2 p⌉α and no bytes, added to every rooted op with p > 1
 * (also to one of count 0: the ranks can still disagree). On small
 * messages that is about the tree's own latency; on large ones it vanishes
 * under nβ. It also makes a rooted op synchronise its ranks: the root can
 * no longer run ahead of the others. Measured back to back on 4 loopback
 * ranks (bench/compare_builds.sh, medians of 7 alternating runs of 200
 * ops): broadcast 4 B 16 → 129 µs per op, 1 MiB 3.2 → 1.2 ms (running
 * ahead made large ones contend); reduce 4 B 24 → 173 µs, 1 MiB 3.2 →
 * 2.0 ms. 129 µs is what a barrier costs on that machine.
 */
#include "algorithms.h"

dt_status comm_root_agree(dt_opctx *o)
{
    return comm_barrier_dissemination(o);
}
