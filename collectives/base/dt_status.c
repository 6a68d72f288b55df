/*
 * dt_status.c — the names of dt_status's codes, beside the type they name
 * (base/dt_status.h).
 *
 * One table indexed by the enum, sized by it, so a new code without a
 * name fails to compile; a value out of range (a status read off the wire
 * or cast from an int) prints as "?" rather than reading past the table.
 *
 * Cost: one comparison and one load. No state.
 */
#include "dt_status.h"

static const char *const status_names[] = {
    [DT_OK] = "DT_OK",         [DT_EINVAL] = "DT_EINVAL", [DT_ETIMEDOUT] = "DT_ETIMEDOUT",
    [DT_EPEER] = "DT_EPEER",   [DT_EPROTO] = "DT_EPROTO", [DT_EABORTED] = "DT_EABORTED",
    [DT_ESTORE] = "DT_ESTORE", [DT_ESYS] = "DT_ESYS",     [DT_ENOMEM] = "DT_ENOMEM",
};
_Static_assert(sizeof status_names / sizeof status_names[0] == DT_ENOMEM + 1,
               "a status lacks a name");

/* Compared as unsigned: the enum may be signed, and a negative value from a
 * cast is out of range too. */
const char *dt_status_name(dt_status s)
{
    unsigned i = (unsigned)s;
    return i < sizeof status_names / sizeof status_names[0] ? status_names[i] : "?";
}
