/*
 * failure.c — how a checkpoint call fails: the status, the fault and the
 * message it leaves on the handle (ckpt_fail, with control characters
 * escaped: dt_ckpt_printable), their reset at the start of each public call
 * (ckpt_reset), and the faults' names.
 *
 * Every other file of the layer reports through here, and this file calls
 * nothing of the layer, so the helpers (fsutil.c, manifest.c, ...) stand
 * on it instead of calling back into ckpt.c, which calls them.
 *
 * Cost: one vsnprintf and one escaping pass over the handle's 1 KiB message. No state but the
 * handle's.
 */
#include <string.h>

#include "ckpt_internal.h"

/* Control characters (a hostile file name's) as \xNN, so that no message
 * can drive a terminal. */
const char *dt_ckpt_printable(char *out, size_t cap, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (; s && *s && o + 1 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != 0x7f) {
            out[o++] = (char)c;
        } else if (o + 5 < cap) {
            memcpy(out + o, "\\x", 2);
            out[o + 2] = hex[c >> 4];
            out[o + 3] = hex[c & 15];
            o += 4;
        } else {
            break;
        }
    }
    if (cap)
        out[o] = '\0';
    return out;
}

dt_status ckpt_fail(dt_ckpt *ck, dt_status st, dt_ckpt_fault fault, const char *fmt, ...)
{
    char raw[sizeof ck->err];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    dt_ckpt_printable(ck->err, sizeof ck->err, raw); /* hostile names */
    ck->fault = fault;
    ck->status = st;
    return st;
}

const char *dt_ckpt_fault_name(dt_ckpt_fault f)
{
    static const char *const names[] = {"DT_CKPT_FAULT_NONE",          "DT_CKPT_FAULT_IO",
                                        "DT_CKPT_FAULT_NO_CHECKPOINT", "DT_CKPT_FAULT_BAD_JSON",
                                        "DT_CKPT_FAULT_SCHEMA",        "DT_CKPT_FAULT_FIELD",
                                        "DT_CKPT_FAULT_WORLD",         "DT_CKPT_FAULT_CONFIG",
                                        "DT_CKPT_FAULT_RANK_RANGE",    "DT_CKPT_FAULT_RANK_DUP",
                                        "DT_CKPT_FAULT_RANK_MISSING",  "DT_CKPT_FAULT_UNSAFE_NAME",
                                        "DT_CKPT_FAULT_MISSING_FILE",  "DT_CKPT_FAULT_SIZE",
                                        "DT_CKPT_FAULT_HASH",          "DT_CKPT_FAULT_ABSURD",
                                        "DT_CKPT_FAULT_HEADER",        "DT_CKPT_FAULT_COVERAGE"};
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "?";
}

void ckpt_reset(dt_ckpt *ck)
{
    ck->fault = DT_CKPT_FAULT_NONE;
    ck->status = DT_OK;
    ck->err[0] = '\0';
}
