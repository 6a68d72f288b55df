/*
 * blame_line.c — the rank one line of a worker's output says failed first.
 *
 * Three wordings name it (from collectives/transport/transport_read.c and
 * heartbeat.c): the ABORT frame a rank got, "rank K (ADDR) failed and
 * reported: <K's error>"; a connection the other side dropped, "connection
 * to rank K (ADDR) lost: ...; rank K died or its process was killed"; and
 * an op's progress limit, "rank K (ADDR) is alive (heard ...) but has not
 * joined #N": K is alive but elsewhere, and the others timed out waiting
 * for it, so K is the cause, not the rank that timed out. Reports nest
 * outward-in (K's error is quoted whole), so the last such phrase in a line
 * is the innermost: the rank that failed first.
 *
 * K is a rank of the communicator that saw the failure. In a world that is
 * the launcher's rank; in a group (dt_comm_split: --tp, --pp with --dp, a
 * ZeRO dp group) it is the rank inside the group, and the parenthesis names
 * the world rank too: "rank 1 (127.0.0.1:45962, world rank 3)". The
 * launcher knows only world ranks, so the world rank is the answer when the
 * line gives one: "rank K died" follows the parenthesis of the nearest
 * "rank K (" before it. World ranks compose through nested splits, so a
 * chain of reports across groups still ends at a world rank.
 *
 * Cost: one pass over the line per "rank " in it; lines are short.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

#define REPORTED " failed and reported:"
#define ABSENT " is alive ("
#define DIED " died or its process was killed"
#define WORLD "world rank "

/* A rank number at p (a digit first), its end in *end; -1 if none. */
static int rank_at(const char *p, const char **end)
{
    if (!isdigit((unsigned char)*p))
        return -1;
    char *e;
    long k = strtol(p, &e, 10);
    *end = e;
    return k > 1 << 30 ? -1 : (int)k;
}

/* The world rank the parenthesis [open, close) names, "(…, world rank W)"
 * or "(world rank W)", or `rank` when it names none (a world's message). */
static int world_rank_in(const char *open, const char *close, int rank)
{
    size_t n = strlen(WORLD);
    for (const char *p = close - 1; p > open; p--) {
        if ((p[-1] != '(' && p[-1] != ' ') || strncmp(p, WORLD, n) != 0)
            continue;
        const char *end;
        int w = rank_at(p + n, &end);
        return w >= 0 && end == close ? w : rank;
    }
    return rank;
}

int launch_blamed_rank(const char *line)
{
    int blamed = -1;
    int named = -1, named_world = -1; /* the last "rank K (...)" seen */
    for (const char *p = line; (p = strstr(p, "rank ")); p += 5) {
        const char *end;
        int k = rank_at(p + 5, &end);
        if (k < 0)
            continue;
        const char *close = strncmp(end, " (", 2) ? NULL : strchr(end + 2, ')');
        if (close) {
            named = k;
            named_world = world_rank_in(end + 2, close, k);
            if (!strncmp(close + 1, REPORTED, strlen(REPORTED)) ||
                !strncmp(close + 1, ABSENT, strlen(ABSENT)))
                blamed = named_world;
        } else if (!strncmp(end, DIED, strlen(DIED))) {
            blamed = k == named ? named_world : k;
        }
    }
    return blamed;
}
