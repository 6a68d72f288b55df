/*
 * family.c — the communicators of one process that came from one world by
 * splits (dt_comm_split: group.c, on the gloo wire group_gloo.c): a tree (a "family") under one mutex,
 * and how each of them names its rank.
 *
 * Each communicator has a group record, made at a world's first split or
 * with a child: its place in the tree, and, for a child, the world rank of
 * each of its ranks and a label ("split 1 colour 0" = world ranks 1,3) that
 * its messages use. fail.c spreads one communicator's failure along the
 * tree, under the family mutex; comm_family_add_child (here, called by both
 * kinds of split) links each child under its parent, under the same mutex.
 *
 * Destroying: a child leaves the tree first (nothing spreads to it after)
 * and then closes only its own connections, so the parent stays usable. A
 * parent may be destroyed while children live: they drop their link to it
 * (failures no longer cross) and keep working on their own meshes.
 *
 * The invariants are family.h's. Cost: a mutex per split, per destroy and
 * per failure; nothing per op.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "family.h"

dt_group *comm_family_new(group_family *family)
{
    dt_group *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    if (!family) {
        family = calloc(1, sizeof *family);
        if (!family) {
            free(g);
            return NULL;
        }
        pthread_mutex_init(&family->mu, NULL);
    }
    pthread_mutex_lock(&family->mu);
    family->refs++;
    pthread_mutex_unlock(&family->mu);
    g->family = family;
    return g;
}

dt_group *comm_family_get(const dt_comm *c)
{
    dt_comm *m = (dt_comm *)c;
    pthread_mutex_lock(&m->mu);
    dt_group *g = m->group;
    pthread_mutex_unlock(&m->mu);
    return g;
}

void comm_family_set(dt_comm *c, dt_group *g)
{
    pthread_mutex_lock(&c->mu);
    c->group = g;
    pthread_mutex_unlock(&c->mu);
}

bool comm_family_who(const dt_comm *c, char *out, size_t n)
{
    const dt_group *g = c->group;
    if (!g || !g->world_ranks) {
        snprintf(out, n, "rank %d", c->rank);
        return false;
    }
    snprintf(out, n, "rank %d (world rank %d) of group '%s' = %s", c->rank, g->world_ranks[c->rank],
             g->label, g->members);
    return true;
}

void comm_family_label_peer(dt_comm *c, int peer, char *addr, size_t n)
{
    const dt_group *g = comm_family_get(c);
    if (!g || !g->world_ranks)
        return;
    size_t len = strlen(addr);
    snprintf(addr + len, n - len, ", world rank %d", g->world_ranks[peer]);
}

void comm_family_detach(dt_comm *c)
{
    dt_group *g = comm_family_get(c);
    if (!g)
        return;
    pthread_mutex_lock(&g->family->mu);
    if (g->parent) {
        dt_comm **pp = &g->parent->group->first_child;
        while (*pp != c)
            pp = &(*pp)->group->next_sibling;
        *pp = g->next_sibling;
    }
    for (dt_comm *k = g->first_child, *next; k; k = next) {
        next = k->group->next_sibling;
        k->group->parent = NULL;
        k->group->next_sibling = NULL;
    }
    g->parent = g->first_child = g->next_sibling = NULL;
    g->detached = true;
    pthread_mutex_unlock(&g->family->mu);
}

void comm_family_free(dt_comm *c)
{
    dt_group *g = c->group;
    if (!g)
        return;
    group_family *f = g->family;
    pthread_mutex_lock(&f->mu);
    bool last = --f->refs == 0;
    pthread_mutex_unlock(&f->mu);
    if (last) {
        pthread_mutex_destroy(&f->mu);
        free(f);
    }
    free(g->world_ranks);
    free(g);
    c->group = NULL;
}

int dt_comm_world_rank(const dt_comm *c, int rank)
{
    if (!c || rank < 0 || rank >= c->size)
        return -1;
    const dt_group *g = comm_family_get(c);
    return g && g->world_ranks ? g->world_ranks[rank] : rank;
}

/* c's group record, made at a world's first split. */
dt_group *comm_family_of(dt_comm *c)
{
    dt_group *g = comm_family_get(c);
    if (!g && (g = comm_family_new(NULL)) != NULL)
        comm_family_set(c, g);
    return g;
}

/* The child's record: world ranks, labels, its place under the parent
 * (group.c's and group_gloo.c's). */
dt_status comm_family_add_child(dt_comm *c, dt_comm *parent, unsigned split, int color,
                                const int *members)
{
    dt_group *pg = comm_family_of(parent);
    dt_group *g = pg ? comm_family_new(pg->family) : NULL;
    int *world = malloc((size_t)c->size * sizeof *world);
    if (!g || !world) {
        free(world);
        if (g) {
            comm_family_set(c, g);
            comm_family_free(c);
        }
        return DT_ENOMEM;
    }
    for (int i = 0; i < c->size; i++)
        world[i] = dt_comm_world_rank(parent, members[i]);
    g->world_ranks = world;
    snprintf(g->label, sizeof g->label, "%.60s%ssplit %u colour %d",
             pg->world_ranks ? pg->label : "", pg->world_ranks ? " > " : "", split, color);
    int used = snprintf(g->members, sizeof g->members, "world rank%s", c->size > 1 ? "s " : " ");
    for (int i = 0; i < c->size && used < (int)sizeof g->members; i++)
        used += snprintf(g->members + used, sizeof g->members - (size_t)used, "%s%d", i ? "," : "",
                         world[i]);
    if (used >= (int)sizeof g->members)
        strcpy(g->members + sizeof g->members - 4, "...");
    comm_family_set(c, g);
    pthread_mutex_lock(&pg->family->mu);
    g->parent = parent;
    g->next_sibling = pg->first_child;
    pg->first_child = c;
    pthread_mutex_unlock(&pg->family->mu);
    return DT_OK;
}
