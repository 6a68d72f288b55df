/*
 * reject_log.c — rejected connections, logged without flooding the job.
 *
 * Every connection that fails its handshake is closed and logged (who, and
 * why), because a stranger on a rank's port is worth knowing about. But a
 * port scanner or a misconfigured job can connect a thousand times a
 * second, and a line per connection buries the job's own output. So:
 *
 *   - the first REJECT_LOG_FULL rejections are logged in full;
 *   - after that each one is only counted, with the first few distinct
 *     hosts it came from, and one summary line per REJECT_LOG_INTERVAL_S
 *     gives the count, the hosts and the last reason (the ticker emits it);
 *   - after a whole interval without a rejection, the next ones are logged
 *     in full again;
 *   - at destroy, a count not yet reported gets its summary line.
 *
 * dt_comm_rejected_connections still counts every one. State lives in the
 * transport (dt_transport's reject_log) and is touched only by the loop
 * thread (then by destroy, after the thread is joined); lines go up through
 * report.h's log. Cost: a compare per rejection, a few string
 * copies for a new host, one line per interval.
 */
#include <stdio.h>
#include <string.h>

#include "conn.h"

#define REJECT_LOG_FULL 5
#define REJECT_LOG_INTERVAL_S 5.0

/* Keeps the host of "host:port" among the distinct ones, while room. */
static void remember_host(reject_log *l, const char *addr)
{
    char host[64];
    snprintf(host, sizeof host, "%s", addr);
    char *colon = strrchr(host, ':');
    if (colon)
        *colon = '\0';
    for (int i = 0; i < l->n_addrs; i++)
        if (!strcmp(l->addrs[i], host))
            return;
    if (l->n_addrs < REJECT_LOG_ADDRS)
        memcpy(l->addrs[l->n_addrs++], host, sizeof host);
}

static void summarize(dt_transport *t, double now, const char *why)
{
    reject_log *l = &t->reject_log;
    char hosts[REJECT_LOG_ADDRS * 66] = "";
    for (int i = 0; i < l->n_addrs; i++)
        snprintf(hosts + strlen(hosts), sizeof hosts - strlen(hosts), "%s%s", i ? ", " : "",
                 l->addrs[i]);
    t->report->log(t->owner,
                   "dtrain rank %d: rejected %llu more connection%s in the last %.1f s, from "
                   "%s%s%s%s",
                   t->rank, (unsigned long long)l->suppressed, l->suppressed == 1 ? "" : "s",
                   now - l->since, hosts,
                   l->n_addrs == REJECT_LOG_ADDRS ? " (and maybe others)" : "",
                   why ? "; the last: " : "", why ? why : "");
    l->suppressed = 0;
    l->n_addrs = 0;
    l->since = now;
}

void comm_reject_log_note(dt_transport *t, const char *addr, const char *why)
{
    reject_log *l = &t->reject_log;
    double now = dt_now();
    l->last = now;
    if (l->full < REJECT_LOG_FULL) {
        l->full++;
        t->report->log(t->owner, "dtrain rank %d: rejected connection from %s: %s%s", t->rank, addr,
                       why,
                       l->full == REJECT_LOG_FULL ? " (further rejections are summarized)" : "");
        l->since = now;
        return;
    }
    l->suppressed++;
    remember_host(l, addr);
    if (now - l->since >= REJECT_LOG_INTERVAL_S)
        summarize(t, now, why);
}

void comm_reject_log_tick(dt_transport *t)
{
    reject_log *l = &t->reject_log;
    if (l->full == 0)
        return;
    double now = dt_now();
    if (l->suppressed > 0 && now - l->since >= REJECT_LOG_INTERVAL_S)
        summarize(t, now, NULL);
    else if (l->suppressed == 0 && now - l->last >= REJECT_LOG_INTERVAL_S)
        l->full = 0; /* a quiet interval: the next burst is logged in full */
}

void comm_reject_log_flush(dt_transport *t)
{
    if (t->reject_log.suppressed > 0)
        summarize(t, dt_now(), NULL);
}
