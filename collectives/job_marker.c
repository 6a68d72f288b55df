/*
 * job_marker.c — telling "another secret" from "not started yet".
 *
 * Ranks find each other under their job id; dtrain-launch on several nodes
 * derives the run id, hence the job id, from DT_SECRET (launch_job.c). So
 * two nodes given different secrets get different job ids and never see
 * each other's keys: each waits for the other's address until the start-up
 * deadline, and the timeout says nothing of the secret. The marker closes
 * that gap. It is a name every rank of the job shares whatever its secret
 * (the launcher derives it from the rendezvous URL and the node count:
 * DT_JOB_MARKER, o->job_marker). Each rank publishes, in the marker's own
 * key space (a second store handle whose job id is "marker-<marker>"), a
 * fingerprint of its handshake key: "secret/<rank>" = BLAKE2b of the key
 * under a context of its own, which tells nothing about the key.
 * While a rank waits for a peer's address, it looks at that peer's
 * fingerprint first, then every COMM_MARKER_POLL_S: one that is there and
 * differs means the peer joined the same rendezvous with another secret,
 * and the rank fails, naming it: "DT_SECRET differs". It lingers two looks
 * first, so the peer sees the mismatch too before this rank's end can take
 * the store away (a tcp:// store its launcher hosts, a file it holds last). (Two jobs of the same
 * shape sharing one rendezvous with different secrets look the same; the
 * message names that case too.)
 *
 * Cost: one more store handle, one set per rank, one check per peer per
 * COMM_MARKER_POLL_S of waiting, 0.5 s more on a mismatch; nothing without
 * a marker, nothing after start-up.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"

#define FINGERPRINT_BYTES 16
#define MARKER_GET_S 2.0 /* a key known to be there */

/* The hex fingerprint of this rank's handshake key (2·16 + 1 bytes). */
static void fingerprint(const dt_comm *c, char *hex)
{
    static const uint8_t context[] = "dtrain job marker fingerprint";
    uint8_t h[FINGERPRINT_BYTES];
    crypto_generichash(h, sizeof h, c->tp.key, sizeof c->tp.key, context, sizeof context - 1);
    sodium_bin2hex(hex, 2 * FINGERPRINT_BYTES + 1, h, sizeof h);
}

dt_status comm_marker_publish(dt_comm *c, const char *marker)
{
    if (!marker || !*marker || c->size == 1)
        return DT_OK;
    if (strlen(marker) > 64 || strspn(marker, "0123456789abcdefABCDEF") != strlen(marker)) {
        comm_fail(c, DT_EINVAL,
                  "rank %d: job marker '%.80s' (DT_JOB_MARKER): use up to 64 hex "
                  "digits",
                  c->rank, marker);
        return DT_EINVAL;
    }
    char job[80], key[32], hex[2 * FINGERPRINT_BYTES + 1];
    snprintf(job, sizeof job, "marker-%s", marker);
    dt_status st = dt_store_open_within(&c->marker_store, c->init_url, job, c->init_timeout_s);
    snprintf(key, sizeof key, "secret/%d", c->rank);
    fingerprint(c, hex);
    if (st == DT_OK)
        st = dt_store_set(c->marker_store, key, hex, strlen(hex));
    if (st != DT_OK)
        comm_fail(c, st == DT_ETIMEDOUT ? DT_ETIMEDOUT : DT_ESTORE,
                  "rank %d: publishing the job marker: %s", c->rank,
                  c->marker_store ? dt_store_error(c->marker_store) : "out of memory");
    return st;
}

dt_status comm_marker_check(dt_comm *c, int peer)
{
    if (!c->marker_store)
        return DT_OK;
    char key[32], mine[2 * FINGERPRINT_BYTES + 1];
    snprintf(key, sizeof key, "secret/%d", peer);
    const char *keys[1] = {key};
    bool there = false;
    void *got = NULL;
    size_t len = 0;
    /* it is there, so the get returns at once; a tcp:// get needs the
     * server's answer, which a timeout of 0 would not wait for */
    if (dt_store_check(c->marker_store, keys, 1, &there) != DT_OK || !there ||
        dt_store_get(c->marker_store, key, &got, &len, MARKER_GET_S) != DT_OK)
        return DT_OK; /* not there yet: keep waiting */
    fingerprint(c, mine);
    bool same = len == strlen(mine) && memcmp(got, mine, len) == 0;
    free(got);
    if (same)
        return DT_OK;
    /* The peer looks at ours every COMM_MARKER_POLL_S; give it two looks
     * before this rank fails and its launcher perhaps takes a tcp:// store
     * (or the file's last holder) away with it. */
    nanosleep(&(struct timespec){0, (long)(2 * COMM_MARKER_POLL_S * 1e9)}, NULL);
    comm_fail(c, DT_EINVAL,
              "rank %d: rank %d joined this rendezvous (%s) with another job secret, so it "
              "derived another run id and the two never meet: DT_SECRET differs between the "
              "nodes; export the same DT_SECRET on every node (or, if two jobs share this "
              "rendezvous, give each its own --rdzv or --run-id)",
              c->rank, peer, c->init_url);
    return DT_EINVAL;
}

void comm_marker_close(dt_comm *c)
{
    dt_store_close(c->marker_store);
    c->marker_store = NULL;
}
