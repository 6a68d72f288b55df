/*
 * report.h — internal: how the rooms below the communicator report up.
 *
 * The transport, and the staging above the algorithms, see failures the
 * communicator must record (a peer gone, a frame that lies, a copy engine
 * that refuses) and lines worth a person's eye (a stranger turned away,
 * pinned memory refused). They do not call the communicator for that: it
 * hands them this table when it is set up (comm.c, c->report), and they
 * call through it. The floors then stay one way: the communicator calls
 * down into its rooms; a room calls only rooms below it, and up only
 * through what it was handed (tests/check_file_calls.py holds both).
 *
 * Cost: one indirect call per report; none on a path that moves data.
 */
#ifndef DT_REPORT_H
#define DT_REPORT_H

#include <stdint.h>

#include "dt_comm.h"

typedef struct dt_conn dt_conn;

typedef struct comm_report {
    /* Record the first failure (any thread), wake everyone, and have the
     * loop fail every pending transfer and close the connections. */
    void (*fail)(dt_comm *c, dt_status st, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
    /* A failure a peer reported from a later op, held back until the op
     * running here has had its grace (comm_xfer_wait), becomes c's own. */
    void (*fail_deferred)(dt_comm *c);
    /* With c->mu held: the first collective this rank has not finished. */
    uint64_t (*first_unfinished_locked)(const dt_comm *c);
    /* A line for the person running the job (not a failure). */
    void (*log)(dt_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
    /* Label an authenticated connection of a split's child with its peer's
     * world rank (the connection's address names it then). */
    void (*label_peer)(dt_conn *cn);
} comm_report;

#endif /* DT_REPORT_H */
