/*
 * log.c — a line for the person running the job: through the
 * communicator's log callback (dt_comm_options.log), or to stderr.
 *
 * For what is worth knowing but is not a failure: rejected strangers
 * (reject_log.c), pinned memory refused (staging.c). Errors are never
 * printed from here: a failure goes into the communicator's error
 * (fail.c), which every later op returns. Cost: one formatted line.
 */
#include <stdio.h>

#include "comm_internal.h"

void comm_log(dt_comm *c, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (c->log)
        c->log(c->log_user, line);
    else
        fprintf(stderr, "%s\n", line);
}
