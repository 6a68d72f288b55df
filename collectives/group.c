/*
 * group.c — sub-communicators (dt_comm_split): making a rank's child of a
 * communicator, with its own mesh.
 *
 * 2-D parallelism (dp × pp) puts every rank in three communicators at once:
 * the world, the data-parallel group of its pipeline stage and the pipeline
 * group of its replica. dt_comm_split makes such groups with
 * MPI_Comm_split's meaning: ranks that pass the same colour form a group,
 * ordered by key, ties broken by parent rank.
 *
 * The choice: a child opens its own mesh. It is a complete dt_comm — its own
 * listener, connections, libuv loop and thread — whose peers' addresses come
 * from an all-gather on the parent instead of the rendezvous store. The
 * alternative, multiplexing every group over the parent's connections with
 * a group id in each frame, saves sockets, but
 *   - the transport would have to match frames per (peer, group) and the
 *     loop run ops of several groups at once: every algorithm and failure
 *     path would learn about groups, where now none does;
 *   - a pipeline's small activation frame would queue behind a data-parallel
 *     group's 25 MB bucket on the same TCP stream (head-of-line blocking);
 *     separate sockets and threads let the two flow side by side, which is
 *     what overlapping DDP's all-reduce with pipeline p2p needs.
 * The cost, per rank of a g-rank child: g-1 more TCP connections (each with
 * its 16 KiB read-ahead), one more thread and loop; at split time two small
 * all-gathers on the parent (8 B, then 64 B per rank) and g-1 handshakes,
 * once. For dp × pp = 2 × 4 that is 1 + 3 connections per rank beside the
 * world's 7.
 *
 * Handshakes are scoped per group: a child's job id is its parent's plus
 * "/split<k>.<colour>" (k counts the parent's splits, the same on every rank
 * since a split is a collective), and its key is the parent's key hashed
 * with that id (keyed BLAKE2b). A connection reaches only the same group of
 * the same split of the same job.
 *
 * One root cause per rank: the communicators of a process that came from
 * one world by splits form a tree (a "family", family.c), and a failure of
 * one spreads along it to those it shares a fate with (fail.c says which).
 * A child's messages name ranks by group and world rank.
 *
 * Destroying a child closes only its own connections, so the parent stays
 * usable; a parent may be destroyed while children live (family.c).
 *
 * The tree's invariants are family.h's: family.c links a child under its
 * parent under the family mutex, and sets its `group` pointer once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "family.h"

/* What each rank tells the others in the split's two all-gathers. */
typedef struct split_entry {
    int32_t color, key;
} split_entry;

typedef struct listen_entry {
    int32_t ready; /* 1: this rank's child is listening */
    int32_t port;
    char host[56];
} listen_entry;

/* ---- making a child ------------------------------------------------------------ */

/* The parent ranks of colour `color`, ordered by (key, parent rank), into
 * members; returns how many. Insertion keeps equal keys in rank order. */
static int group_members(const split_entry *all, int p, int32_t color, int *members)
{
    int n = 0;
    for (int r = 0; r < p; r++) {
        if (all[r].color != color)
            continue;
        int i = n++;
        while (i > 0 && all[members[i - 1]].key > all[r].key) {
            members[i] = members[i - 1];
            i--;
        }
        members[i] = r;
    }
    return n;
}

/* This rank's side of the child: set up, key, place in the tree, listener. */
static dt_status child_create(dt_comm *parent, unsigned split, int color, const int *members, int n,
                              int my, dt_comm **out)
{
    dt_comm *c = calloc(1, sizeof *c);
    *out = c;
    if (!c)
        return DT_ENOMEM;
    char job_id[256];
    snprintf(job_id, sizeof job_id, "%s/split%u.%d", parent->job_id, split, color);
    dt_comm_options o;
    comm_env_child_options(&o, parent, my, n, job_id);
    o.socket_buffer = parent->socket_buffer;
    dt_status st = comm_setup(c, &o);
    if (st == DT_OK && (st = comm_family_add_child(c, parent, split, color, members)) != DT_OK)
        comm_fail(c, st, "rank %d: out of memory", c->rank);
    if (st != DT_OK)
        return st;
    crypto_generichash(c->tp.key, sizeof c->tp.key, (const uint8_t *)job_id, strlen(job_id),
                       parent->tp.key, sizeof parent->tp.key);
    return comm_thread_start(c);
}

/* Every member is listening: dial the lower group ranks, accept the higher. */
static dt_status child_connect(dt_comm *c, const listen_entry *where, const int *members)
{
    const dt_group *g = c->group;
    for (int i = 0; i < c->size; i++) {
        const listen_entry *e = &where[members[i]];
        if (!e->ready) {
            comm_fail_member(c, DT_EPEER,
                             "rank %d: rank %d (world rank %d) could not set up "
                             "its side of the group (its own error says why)",
                             c->rank, i, g->world_ranks[i]);
            return DT_EPEER;
        }
        char host[sizeof e->host];
        snprintf(host, sizeof host, "%s", e->host);
        snprintf(c->tp.peer_addr[i], sizeof c->tp.peer_addr[i], "%.24s:%d, world rank %d", host,
                 (int)e->port, g->world_ranks[i]);
        if (uv_ip4_addr(host, e->port, (struct sockaddr_in *)&c->tp.dial[i]) != 0 &&
            uv_ip6_addr(host, e->port, (struct sockaddr_in6 *)&c->tp.dial[i]) != 0) {
            comm_fail_member(c, DT_EPROTO,
                             "rank %d: rank %d (world rank %d) listens on an "
                             "unusable address '%s'",
                             c->rank, i, g->world_ranks[i], host);
            return DT_EPROTO;
        }
    }
    return comm_connect_mesh(c, dt_now() + c->init_timeout_s);
}

/* The split could not make this rank's child: say why on the parent (which
 * may itself be healthy) and let the child go. */
static dt_status split_failed(dt_comm *parent, unsigned split, int color, dt_comm *c, dt_status st)
{
    char why[DT_ERROR_MAX];
    snprintf(why, sizeof why, "%s", c ? dt_comm_error(c) : "out of memory");
    pthread_mutex_lock(&parent->mu);
    snprintf(parent->arg_error, sizeof parent->arg_error,
             "rank %d: dt_comm_split #%u "
             "(colour %d): %.900s",
             parent->rank, split, color, why);
    pthread_mutex_unlock(&parent->mu);
    dt_comm_destroy(c);
    return st;
}

/* Both all-gathers, and this rank's child in between (NULL if undefined). */
static dt_status split_run(dt_comm *parent, unsigned split, split_entry me, split_entry *all,
                           listen_entry *where, int *members, dt_comm **child)
{
    dt_status st = dt_allgather(parent, &me, all, sizeof me, DT_U8);
    if (st != DT_OK)
        return st;
    dt_comm *c = NULL;
    dt_status made = DT_OK;
    listen_entry mine = {0};
    if (me.color >= 0) {
        int n = group_members(all, parent->size, me.color, members), my = 0;
        while (members[my] != parent->rank)
            my++;
        made = child_create(parent, split, me.color, members, n, my, &c);
        if (made == DT_OK) {
            mine.ready = 1;
            mine.port = c->tp.port;
            snprintf(mine.host, sizeof mine.host, "%s", c->host);
        }
    }
    st = dt_allgather(parent, &mine, where, sizeof mine, DT_U8);
    if (st != DT_OK) {
        dt_comm_destroy(c);
        return st;
    }
    if (made == DT_OK && c)
        made = child_connect(c, where, members);
    if (made != DT_OK)
        return split_failed(parent, split, me.color, c, made);
    *child = c;
    return DT_OK;
}

dt_status dt_comm_split(dt_comm *parent, int color, int key, dt_comm **child)
{
    if (!parent || !child) {
        if (parent)
            comm_fail(parent, DT_EINVAL,
                      "rank %d: dt_comm_split needs somewhere to put the "
                      "child (child is NULL)",
                      parent->rank);
        return DT_EINVAL;
    }
    *child = NULL;
    if (parent->gloo)
        return comm_group_gloo_split(parent, color, key, child);
    dt_group *g = comm_family_of(parent);
    int p = parent->size;
    split_entry *all = malloc((size_t)p * sizeof *all);
    listen_entry *where = calloc((size_t)p, sizeof *where);
    int *members = malloc((size_t)p * sizeof *members);
    dt_status st = DT_ENOMEM;
    if (!g || !all || !where || !members)
        /* The others wait in the all-gather: fail the parent so they hear of it. */
        comm_fail(parent, DT_ENOMEM, "rank %d: dt_comm_split: out of memory", parent->rank);
    else
        st = split_run(parent, ++g->splits, (split_entry){color < 0 ? DT_UNDEFINED : color, key},
                       all, where, members, child);
    free(all);
    free(where);
    free(members);
    return st;
}
