/*
 * failure.c — how a checkpoint call fails: the status, the fault and the
 * message it leaves on the handle (ckpt_fail), their reset at the start of
 * each public call (ckpt_reset), and the faults' names.
 *
 * Every other file of the layer reports through here, and this file calls
 * nothing of the layer, so the helpers (fsutil.c, manifest.c, ...) stand
 * on it instead of calling back into ckpt.c, which calls them.
 *
 * Cost: one vsnprintf into the handle's 1 KiB message. No state but the
 * handle's.
 */
#include "ckpt_internal.h"

dt_status ckpt_fail(dt_ckpt *ck, dt_status st, dt_ckpt_fault fault,
                    const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ck->err, sizeof ck->err, fmt, ap);
    va_end(ap);
    ck->fault = fault;
    ck->status = st;
    return st;
}

const char *dt_ckpt_fault_name(dt_ckpt_fault f)
{
    static const char *const names[] = {
        "DT_CKPT_FAULT_NONE", "DT_CKPT_FAULT_IO", "DT_CKPT_FAULT_NO_CHECKPOINT",
        "DT_CKPT_FAULT_BAD_JSON", "DT_CKPT_FAULT_SCHEMA", "DT_CKPT_FAULT_FIELD",
        "DT_CKPT_FAULT_WORLD", "DT_CKPT_FAULT_CONFIG",
        "DT_CKPT_FAULT_RANK_RANGE", "DT_CKPT_FAULT_RANK_DUP",
        "DT_CKPT_FAULT_RANK_MISSING", "DT_CKPT_FAULT_UNSAFE_NAME",
        "DT_CKPT_FAULT_MISSING_FILE", "DT_CKPT_FAULT_SIZE",
        "DT_CKPT_FAULT_HASH", "DT_CKPT_FAULT_ABSURD", "DT_CKPT_FAULT_HEADER",
        "DT_CKPT_FAULT_COVERAGE"};
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "?";
}

void ckpt_reset(dt_ckpt *ck)
{
    ck->fault = DT_CKPT_FAULT_NONE;
    ck->status = DT_OK;
    ck->err[0] = '\0';
}
