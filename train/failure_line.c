/*
 * failure_line.c — the one line a failed minigpt rank prints: who, doing
 * what, with whom, and why.
 *
 * Most failures leave their own message in r->err, written where they
 * happened ("rank 1: data parallel: gradient all-reduce: <the
 * communicator's error>"), and that is the line. Some paths return only a
 * status: a collective of the end-of-run reports, a ZeRO-3 gather, a
 * communicator group's op. For those the line is built here from what the
 * run was doing (r->phase, set by minigpt.c as it moves from one phase to
 * the next) and the first communicator that has something to say — its
 * error names the op, its sequence number, the peer and the cause — or,
 * where none has, the status in words. Never a bare status name.
 *
 * Cost: nothing until a run fails.
 */
#include <stdio.h>
#include <string.h>

#include "trainer.h"

/* What a status means, for a failure no communicator explained. */
static const char *status_words(dt_status st)
{
    switch (st) {
    case DT_EINVAL: return "a bad argument";
    case DT_ETIMEDOUT: return "an operation passed its deadline";
    case DT_EPEER: return "a peer died or its connection failed";
    case DT_EPROTO: return "the ranks disagree about an operation";
    case DT_EABORTED: return "the job was aborted";
    case DT_ESTORE: return "the rendezvous store is unusable";
    case DT_ESYS: return "a system call failed";
    case DT_ENOMEM: return "out of memory";
    default: return "failed";
    }
}

/* The first of the run's communicators with an error to tell. */
static const char *comm_said(const mg_run *r)
{
    dt_comm *comms[] = {r->comm, r->dp_comm, r->pipe_comm, r->tp_comm, r->tp_dp_comm};
    for (size_t i = 0; i < sizeof comms / sizeof comms[0]; i++)
        if (comms[i] && *dt_comm_error(comms[i]))
            return dt_comm_error(comms[i]);
    return NULL;
}

void mg_failure_line(const mg_run *r, dt_status st, char *out, size_t n)
{
    if (r->err[0]) {
        snprintf(out, n, "%s", r->err);
        return;
    }
    const char *phase = r->phase ? r->phase : "run";
    const char *said = comm_said(r);
    char own[32];
    int k = snprintf(own, sizeof own, "rank %d: ", r->rank);
    if (said && !strncmp(said, own, (size_t)k)) /* the communicator's own rank prefix */
        said += k;
    if (said)
        snprintf(out, n, "rank %d: %s: %s", r->rank, phase, said);
    else
        snprintf(out, n, "rank %d: %s: %s (%s)", r->rank, phase, status_words(st),
                 dt_status_name(st));
}
