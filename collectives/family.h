/*
 * family.h — internal: the tree of communicators a process made from one
 * world by splits (family.c keeps it, fail.c spreads a failure along it,
 * group.c and group_gloo.c add children to it).
 *
 * Invariants: the tree links (parent, first_child, next_sibling, detached)
 * change only under the family mutex, and the family mutex is never taken
 * with a communicator's `mu` held; a communicator's `group` pointer is set
 * once, under its `mu`; world_ranks and the labels never change.
 */
#ifndef DT_FAMILY_H
#define DT_FAMILY_H

#include "comm_internal.h"

/* The communicators of one process that came from one world by splits. */
typedef struct group_family {
    pthread_mutex_t mu; /* the tree's links; one failure at a time */
    int refs;           /* under mu: group records pointing here */
} group_family;

typedef struct dt_group {
    group_family *family;
    /* under family->mu */
    dt_comm *parent; /* NULL: a world, or the parent was destroyed */
    dt_comm *first_child;
    dt_comm *next_sibling;
    bool detached; /* being destroyed: out of the tree */
    /* API thread only */
    unsigned splits; /* dt_comm_split calls on this communicator */
    /* fixed once made */
    int *world_ranks; /* [size] world rank of each group rank; NULL: a world */
    char label[96];   /* "split 1 colour 0" (nested: "… > split 2 colour 1") */
    char members[96]; /* "world ranks 1,3" */
} dt_group;

/* family.c: a group record in `family` (NULL: in a new family of its own);
 * c's record (under c->mu), NULL before c took part in a split; setting it,
 * once. */
dt_group *comm_family_new(group_family *family);
dt_group *comm_family_get(const dt_comm *c);
void comm_family_set(dt_comm *c, dt_group *g);
/* c's record, made (a world's) at its first split; NULL: out of memory. */
dt_group *comm_family_of(dt_comm *c);
/* Records c as parent's child made by split `split` for colour `color`
 * from the parent ranks members[0..c->size): world ranks, labels, its place
 * in the tree (under the family mutex). */
dt_status comm_family_add_child(dt_comm *c, dt_comm *parent, unsigned split, int color,
                                const int *members);

#endif /* DT_FAMILY_H */
