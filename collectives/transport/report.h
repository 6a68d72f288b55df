/*
 * report.h — internal: how the rooms below the communicator report up.
 *
 * The transport, and the staging above the algorithms, see failures the
 * communicator must record (a peer gone, a frame that lies, a copy engine
 * that refuses) and lines worth a person's eye (a stranger turned away,
 * pinned memory refused); the transport also reads the failure record, and
 * completes p2p work handles. They neither call the communicator for that
 * nor see its struct: it hands each of them this table, with itself as an
 * opaque `owner`, when it is set up (comm.c: dt_transport's and dt_stager's
 * `report`), and they call through it. The floors then stay one way: the communicator calls
 * down into its rooms; a room calls only rooms below it, and up only
 * through what it was handed (tests/check_file_calls.py holds both).
 *
 * Cost: one indirect call per report; on a path that moves data, one per
 * p2p transfer completed (work_done_locked).
 */
#ifndef DT_REPORT_H
#define DT_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dt_comm.h"

/* The longest message a report carries (and a communicator keeps). */
#define DT_ERROR_MAX 1024

typedef struct dt_work dt_work;

/* Every entry takes the communicator the room was handed (its `owner`),
 * which the room passes back and never looks into. */
typedef struct comm_report {
    /* Record the first failure (any thread), wake everyone, and have the
     * loop fail every pending transfer and close the connections. */
    void (*fail)(dt_comm *c, dt_status st, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
    /* A failure a peer reported from a later op, held back until the op
     * running here has had its grace (comm_xfer_wait), becomes c's own. */
    void (*fail_deferred)(dt_comm *c);
    /* With the communicator's lock held: DT_OK while c has not failed,
     * else its first failure's status; its message ("" before a failure)
     * into why[0..n) when n > 0. */
    dt_status (*failure_locked)(const dt_comm *c, char *why, size_t n);
    /* With the lock held: the first collective this rank has not finished,
     * and whether it is running it. */
    uint64_t (*first_unfinished_locked)(const dt_comm *c);
    bool (*in_op_locked)(const dt_comm *c);
    /* A line for the person running the job (not a failure). */
    void (*log)(dt_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
    /* Label the address of an authenticated connection to `peer` (addr,
     * n bytes) with what names that peer to a person: a split's child adds
     * the peer's world rank. */
    void (*label_peer)(dt_comm *c, int peer, char *addr, size_t n);
    /* Wake the communicator thread: something was handed to the loop. */
    void (*wake_thread)(dt_comm *c);
    /* With the lock held: a p2p transfer let go of completes its work
     * handle with st, waking its waiters. */
    void (*work_done_locked)(dt_work *w, dt_status st);
} comm_report;

#endif /* DT_REPORT_H */
