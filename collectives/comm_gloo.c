/*
 * comm_gloo.c — a communicator on the gloo wire (options.wire =
 * DT_WIRE_GLOO, or DT_WIRE=gloo): the communicator's side of
 * collectives/gloo/.
 *
 * dt_comm_init on this wire opens the store in torch's key space (job id
 * ""), hosts a tcp:// store as rank 0 when nobody serves it (torch's rank 0
 * would), starts the communicator thread (async ops run there, in
 * submission order, as on dtrain's wire) with no listener of dtrain's
 * (the only ports it opens are gloo's, one per pair), and joins the group as torch's
 * init_process_group does (gloo/rendezvous.c). Every collective then runs
 * through comm_gloo_run (gloo/run.c), called by the executor, so a torch rank
 * that calls the same torch.distributed collectives in the same order is a
 * rank of the job. It says once, at start-up, that this wire has no
 * authentication.
 *
 * dt_comm_split on this wire is torch's new_group (group_gloo.c), whose
 * children join through comm_gloo_wire_join too.
 *
 * Tagged send/recv on this wire stay in flight across later ops
 * (p2p_gloo.c).
 *
 * A failure of the communicator (dt_comm_abort, a peer's, a waiter's
 * timeout) interrupts the gloo context (fail.c calls comm_gloo_interrupt
 * on c->gloo once joined): the op waiting on the wire returns at once, on
 * whichever thread runs it, every connection closes, and every local op
 * ends with the communicator's first error.
 *
 * Not here yet: device buffers.
 *
 * Cost: the gloo wire's (collectives/gloo/README.md); no handshakes.
 */
#include <stdlib.h>

#include "comm_internal.h"
#include "gloo/gloo.h"

/* A stranger on one of gloo's listeners, dropped (gloo/held.c): logged and
 * counted as dtrain's wire counts a failed handshake. */
void comm_gloo_note_stranger(void *arg, const char *line)
{
    dt_comm *c = arg;
    atomic_fetch_add(&c->tp.rejected, 1);
    comm_log(c, "%s", line);
}

dt_status comm_gloo_wire_init(dt_comm *c, const dt_comm_options *o)
{
    if (o->device) {
        comm_fail(c, DT_EINVAL, "rank %d: the gloo wire takes host buffers only (no device)",
                  c->rank);
        return DT_EINVAL;
    }
    if (c->rank == 0)
        comm_log(c, "rank 0: the gloo wire (torch 1.13's) has no authentication: whoever first "
                    "sends a well-formed gloo message on a rank's port is taken for the peer; use "
                    "it on loopback or a trusted network");
    dt_status st = DT_OK;
    if (c->size > 1)
        st = dt_store_open_within(&c->store, c->init_url, "", c->init_timeout_s);
    if (st != DT_OK) {
        comm_fail(c, st == DT_ETIMEDOUT ? DT_ETIMEDOUT : DT_ESTORE,
                  "rank %d: opening the rendezvous store: %s", c->rank,
                  c->store ? dt_store_error(c->store) : "out of memory");
        return st;
    }
    if (o->keep_init_file && c->store)
        dt_store_keep_file(c->store);
    if ((st = comm_thread_start(c)) != DT_OK)
        return st;
    gloo_config cfg = {.rank = c->rank,
                       .size = c->size,
                       .group = 0,
                       .host = c->host,
                       .timeout_s = c->timeout_s,
                       .init_timeout_s = c->init_timeout_s,
                       .note = comm_gloo_note_stranger,
                       .note_arg = c};
    return comm_gloo_wire_join(c, c->store, &cfg);
}

dt_status comm_gloo_wire_join(dt_comm *c, dt_store *store, const gloo_config *cfg)
{
    char err[GLOO_ERR_LEN];
    dt_status st = comm_gloo_connect(&c->gloo, store, cfg, err, sizeof err);
    if (st != DT_OK) {
        comm_fail(c, st, "%s", err);
        return st;
    }
    for (int r = 0; r < c->size; r++) /* for messages that name a peer (work.c) */
        if (r != cfg->rank)
            comm_gloo_peer_name(c->gloo, r, c->tp.peer_addr[r], sizeof c->tp.peer_addr[r]);
    pthread_mutex_lock(&c->mu);
    c->gloo_waker = &c->gloo->waker;
    c->init_done = true; /* from now on a blocking op may run on its caller's thread, and a
                            failure interrupts c->gloo (fail.c) */
    pthread_mutex_unlock(&c->mu);
    comm_wake_thread(c);
    return DT_OK;
}

void comm_gloo_wire_destroy(dt_comm *c)
{
    comm_gloo_p2p_forget(c);
    pthread_mutex_lock(&c->mu); /* an abort on another thread no longer reaches it */
    struct gloo_ctx *g = c->gloo;
    c->gloo = NULL;
    pthread_mutex_unlock(&c->mu);
    comm_gloo_destroy(g);
}

void comm_gloo_wire_traffic(dt_comm *c, uint64_t out[4])
{
    comm_gloo_traffic(c->gloo, out);
}
