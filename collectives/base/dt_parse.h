/*
 * dt_parse.h — the one strict integer parser for flags and environment
 * variables: the whole string (after strtol's leading blanks) must be a
 * base-10 number within [lo, hi], a range inside int's. "12abc", "" and
 * out-of-range values are refused (false, *out untouched), never read as a
 * prefix or clamped, so a typo in WORLD_SIZE or --iters is an error the
 * caller names instead of a silent default. Header-only (base/); cost: one
 * strtol.
 */
#ifndef DT_PARSE_H
#define DT_PARSE_H

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

static inline bool dt_parse_int(const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

#endif /* DT_PARSE_H */
