/*
 * group_gloo.c — dt_comm_split on the gloo wire: torch 1.13's new_group,
 * once per colour.
 *
 * torch makes a group with new_group(ranks), a call every process of the
 * job makes, members or not, in the same order; the k-th call makes group
 * "k" (keys under default_pg/k/0/...) and ends in the store barrier
 * default_pg/store_based_barrier_key:<k+1>, which every rank of the world
 * joins (gloo/rendezvous.c). Its group ranks are the world ranks in
 * ascending order.
 *
 * dt_comm_split(world, colour, key) is then, on every rank:
 *
 *   1. an all-gather on the world of (colour, key), two int32 per rank:
 *      one world collective, which a torch rank mirrors with
 *      dist.all_gather of a two-element int32 tensor
 *   2. for each colour in the job, ascending (DT_UNDEFINED makes no
 *      group): new_group of the world ranks of that colour; a member joins
 *      it and keeps it as its child, any other rank joins its barrier only
 *
 * Restrictions that torch's groups impose, refused on every rank alike
 * (DT_EINVAL in dt_comm_error, the world still usable):
 *   - a split of the world only: torch groups are made of world ranks by
 *     every process of the world, so a group's own split has no torch form;
 *   - the keys must order each colour's ranks as the world does (equal
 *     keys included): a torch group's ranks are its sorted world ranks.
 *
 * Cost: the 8-byte all-gather, then per colour the group's own rendezvous
 * (g-1 connections per member) and a store barrier every rank polls every
 * 10 ms: splits are for start-up, not for a step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "family.h"
#include "gloo/gloo.h"

/* Says why on the parent, which stays usable (not a failure). */
static void refused(dt_comm *parent, const char *what, int group, const char *why)
{
    pthread_mutex_lock(&parent->mu);
    snprintf(parent->arg_error, sizeof parent->arg_error, "rank %d: %s%.0d: %.900s", parent->rank,
             what, group, why);
    pthread_mutex_unlock(&parent->mu);
}

/* Why the split cannot be torch's, or NULL; the same on every rank. */
static const char *not_torch(const dt_comm *parent, const int32_t *all)
{
    if (parent->gloo_group != 0)
        return "on the gloo wire only the world splits (torch's groups are of world ranks)";
    for (int r = 0; r < parent->size; r++)
        for (int q = r + 1; q < parent->size; q++)
            if (all[2 * r] >= 0 && all[2 * q] == all[2 * r] && all[2 * q + 1] < all[2 * r + 1])
                return "the keys order a colour's ranks other than by world rank (torch's "
                       "new_group sorts them)";
    return NULL;
}

/* The next colour above `after` anyone passed, or DT_UNDEFINED. */
static int next_color(const int32_t *all, int p, int after)
{
    int next = DT_UNDEFINED;
    for (int r = 0; r < p; r++)
        if (all[2 * r] > after && (next == DT_UNDEFINED || all[2 * r] < next))
            next = all[2 * r];
    return next;
}

/* This rank's side of new_group number `group`: a member's child, or
 * (child NULL) only the barrier. */
static dt_status join(dt_comm *parent, int group, int color, const int *members, int n, int my,
                      dt_comm **child)
{
    gloo_config cfg = {.rank = my,
                       .size = n,
                       .group = group,
                       .barrier_size = parent->size,
                       .host = parent->host,
                       .timeout_s = parent->timeout_s,
                       .init_timeout_s = parent->init_timeout_s,
                       .note = comm_gloo_note_stranger,
                       .note_arg = parent};
    if (my < 0) {
        char err[GLOO_ERR_LEN];
        gloo_ctx *g = NULL;
        dt_status st = comm_gloo_connect(&g, parent->store, &cfg, err, sizeof err);
        comm_gloo_destroy(g);
        if (st != DT_OK)
            refused(parent, "new_group ", group, err);
        return st;
    }
    dt_comm *c = calloc(1, sizeof *c);
    if (!(*child = c))
        return DT_ENOMEM;
    char job_id[256];
    snprintf(job_id, sizeof job_id, "%s/group%d", parent->job_id, group);
    dt_comm_options o;
    comm_env_child_options(&o, parent, my, n, job_id);
    o.wire = DT_WIRE_GLOO;
    c->gloo_group = group;
    dt_status st = comm_setup(c, &o);
    if (st == DT_OK &&
        (st = comm_family_add_child(c, parent, (unsigned)group, color, members)) != DT_OK)
        comm_fail(c, st, "rank %d: out of memory", c->rank);
    if (st == DT_OK)
        st = comm_thread_start(c);
    cfg.note_arg = c; /* the child's log and count: c->log is the parent's */
    if (st == DT_OK)
        st = comm_gloo_wire_join(c, parent->store, &cfg);
    if (st != DT_OK)
        refused(parent, "new_group ", group, dt_comm_error(c));
    return st;
}

/* One new_group per colour, ascending; this rank's becomes *child. */
static dt_status groups(dt_comm *parent, const int32_t *all, int *members, dt_comm **child)
{
    const int p = parent->size, mine = all[2 * parent->rank];
    for (int color = next_color(all, p, DT_UNDEFINED); color != DT_UNDEFINED;
         color = next_color(all, p, color)) {
        int n = 0, my = -1;
        for (int r = 0; r < p; r++)
            if (all[2 * r] == color) {
                my = r == parent->rank ? n : my;
                members[n++] = r;
            }
        dt_comm *c = NULL;
        dt_status st = join(parent, ++parent->gloo_groups_made, color, members, n, my, &c);
        if (st != DT_OK) {
            dt_comm_destroy(c);
            dt_comm_destroy(*child); /* a later group failed: no half-made split */
            *child = NULL;
            return st;
        }
        if (color == mine)
            *child = c;
    }
    return DT_OK;
}

dt_status comm_group_gloo_split(dt_comm *parent, int color, int key, dt_comm **child)
{
    const int p = parent->size;
    int32_t me[2] = {color < 0 ? DT_UNDEFINED : color, key};
    int32_t *all = malloc((size_t)p * sizeof me);
    int *members = malloc((size_t)p * sizeof *members);
    dt_status st = DT_ENOMEM;
    if (!all || !members)
        /* The others wait in the all-gather: fail the world so they hear of it. */
        comm_fail(parent, DT_ENOMEM, "rank %d: dt_comm_split: out of memory", parent->rank);
    else if ((st = dt_allgather(parent, me, all, 2, DT_I32)) == DT_OK) {
        const char *why = not_torch(parent, all);
        if (why) {
            refused(parent, "dt_comm_split", 0, why);
            st = DT_EINVAL;
        } else {
            st = groups(parent, all, members, child);
        }
    }
    free(all);
    free(members);
    return st;
}
