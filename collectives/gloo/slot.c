/*
 * slot.c — slots and tags: how torch 1.13's gloo keeps messages apart.
 *
 * Every message carries a 64-bit slot. A collective's slot is
 * prefix << 56 | tag << 24: the top byte names the algorithm (gloo.h), the
 * 32-bit tag is the group's collective counter, which every collective
 * call advances by one (send and recv do not), and the low 24 bits are
 * always 0. Point-to-point messages use the user's tag itself as the slot,
 * so they never meet a collective's slot (whose top byte is non-zero).
 *
 * Since nothing else identifies a collective on the wire, two ranks that
 * call different collectives at the same position simply never match:
 * the messages wait in different slots until a timeout names them. dtrain's
 * own wire, by contrast, puts the op's kind and size in every frame header
 * and fails at the first disagreeing frame.
 *
 * Cost: none; arithmetic.
 */
#include <inttypes.h>
#include <stdio.h>

#include "gloo.h"

uint64_t comm_gloo_slot(enum gloo_prefix prefix, uint32_t tag)
{
    return (uint64_t)prefix << 56 | (uint64_t)tag << 24;
}

static const char *prefix_name(unsigned prefix)
{
    switch (prefix) {
    case GLOO_GATHER: return "gather";
    case GLOO_ALLGATHER: return "allgather";
    case GLOO_REDUCE: return "reduce";
    case GLOO_ALLREDUCE: return "allreduce";
    case GLOO_SCATTER: return "scatter";
    case GLOO_BROADCAST: return "broadcast";
    case GLOO_BARRIER: return "barrier";
    case GLOO_ALLTOALL: return "alltoall";
    default: return NULL;
    }
}

const char *comm_gloo_slot_describe(uint64_t slot, char *out, size_t cap)
{
    const char *name = prefix_name((unsigned)(slot >> 56));
    if (name && (slot & 0xffffff) == 0)
        snprintf(out, cap, "slot 0x%016" PRIx64 " (%s, tag %" PRIu64 ")", slot, name,
                 (slot >> 24) & 0xffffffffu);
    else if (slot >> 32 == 0)
        snprintf(out, cap, "slot 0x%016" PRIx64 " (send/recv, tag %" PRIu64 ")", slot, slot);
    else
        snprintf(out, cap, "slot 0x%016" PRIx64 " (no collective of torch 1.13 uses it)", slot);
    return out;
}

uint32_t comm_gloo_begin(gloo_ctx *c, const char *op, enum gloo_prefix prefix)
{
    c->op = op;
    c->op_tag = c->next_tag++; /* wraps at 2^32, as torch's */
    c->op_slot = comm_gloo_slot(prefix, c->op_tag);
    return c->op_tag;
}
