/*
 * store.c — the rendezvous store: a key-value log in one shared file.
 *
 * Before ranks can talk over TCP they must learn each other's addresses.
 * They do it through one file named by the URL "file:///abs/path", like
 * PyTorch's `init_method="file://..."`: each rank appends what it publishes
 * and replays what the others appended, polling until what it waits for
 * shows up. No server, no ports; the cost is a shared filesystem with
 * working flock and OFD locks (a local disk or tmpfs; not every NFS).
 *
 * File format: PyTorch c10d FileStore's, byte for byte (store_log.c reads
 * and appends the records). Our keys are "<job_id>/<key>" (job NULL =
 * "dtrain"); the empty job id is PyTorch's own key space ("/<key>"), so a
 * dtrain program and a PyTorch one can share keys. PyTorch counts its
 * handles in the file, dtrain holds an OFD lock (below); each dtrain handle
 * also counts itself in PyTorch's counters, and neither side empties or
 * removes a file the other uses (store_torch.c).
 *
 * Locks. Two independent kinds guard two different things:
 *   - flock() guards the records. Writers append whole records under
 *     LOCK_EX (O_APPEND); readers replay from the offset they last consumed
 *     under LOCK_SH. So a reader never sees half a record: a partial record
 *     is corruption, and is reported (DT_ESTORE), never skipped.
 *   - An OFD byte-range lock on one byte at offset 2^40 (far past any real
 *     record) tracks liveness. Every open handle holds it shared until
 *     close. OFD locks belong to the open file description, not to the
 *     process, so ranks running as threads in one process each hold their
 *     own; classic fcntl locks would merge them and vanish on any close().
 *     The kernel drops the lock when a process dies, so "nobody holds it"
 *     means "nobody is using this file".
 *
 * The path is untrusted: what may sit at it, and what is refused, is
 * store_path.c's concern.
 *
 * Lifecycle:
 *   open:  take the liveness lock exclusively without waiting. If that
 *          works, no live process uses the file: if it is all store
 *          records it is a dead job's leftover and is truncated; if not it
 *          is somebody else's file and is refused untouched (DT_ESTORE).
 *          Then downgrade to shared. If the exclusive try fails, wait for
 *          the shared lock (exclusive holders hold it only briefly).
 *   close: try to upgrade to exclusive without waiting; if that works this
 *          is the last holder, and it unlinks the file.
 *
 * The open/close race. A newcomer may open the name just as the last holder
 * unlinks it, and end up alone on an orphaned inode while its peers create
 * a fresh file. That is closed here: after taking its liveness lock, open
 * checks that the path still names the inode it locked, and retries if not.
 * (The unlinker unlinks while holding the lock exclusively, so a newcomer
 * that got its lock afterwards always sees the unlink.) What remains: a new
 * job that opens the name while an old job's last rank is still inside (or
 * not yet at) close joins the old, live file and is not reset, so it sees
 * the old job's records. Keys are scoped by job id, so this only bites a
 * new job that reuses the old job's id: give each launch its own job id
 * (the launcher's run id) and the leftovers are invisible.
 *
 * Costs: set and add are one flock + replay of new bytes + one write; a
 * waiting get polls every 10 ms (flock + fstat, plus a read when the file
 * grew). Memory: one copy of this job's latest values in a small
 * open-addressing hash table. Invariants: `consumed` always sits on a record
 * boundary; the table holds exactly the job's records in [0, consumed).
 *
 * Threads: one thread at a time per handle; give each thread its own handle
 * (that is what the tests do). The fd is O_CLOEXEC, so programs a rank execs
 * never hold the liveness lock; a forked child shares its parent's handle's
 * lock and must not use or close that handle. dt_store_error returns the latest failure's
 * message. After DT_ESTORE (corruption) every call fails and close leaves
 * the file in place as evidence.
 */
#include "store_internal.h"

#include "dt_clock.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- locks ------------------------------------------------------------------- */

dt_status comm_store_flock(dt_store *s, int op)
{
    while (flock(s->fd, op) != 0)
        if (errno != EINTR)
            return comm_store_log_fail(s, DT_ESYS, "flock: %s", strerror(errno));
    return DT_OK;
}

void comm_store_funlock(dt_store *s)
{
    (void)flock(s->fd, LOCK_UN);
}

/* Sets the liveness lock to `type` (F_RDLCK, F_WRLCK). Returns 0 or errno. */
int comm_store_liveness_lock(int fd, short type, bool wait)
{
    struct flock fl = {.l_type = type,
                       .l_whence = SEEK_SET,
                       .l_start = STORE_LIVENESS_OFFSET,
                       .l_len = 1,
                       .l_pid = 0};
    while (fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) != 0)
        if (errno != EINTR)
            return errno;
    return 0;
}

/* True if `path` still names the inode open as fd (nobody unlinked it). */
bool comm_store_still_named(int fd, const char *path)
{
    struct stat a, b;
    return fstat(fd, &a) == 0 && lstat(path, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

/* ---- open and close ------------------------------------------------------- */

/* With the liveness lock held exclusively (no dtrain handle uses the
 * file): a file of whole records is a dead job's leftover and is emptied,
 * unless PyTorch's FileStore has used it (store_torch.c); anything else is
 * not ours and is left exactly as it is. */
static dt_status reset_if_stale(dt_store *s)
{
    dt_status st = comm_store_flock(s, LOCK_EX);
    if (st != DT_OK)
        return st;
    store_holders h;
    if ((st = comm_store_log_check(s, &h)) == DT_OK && !comm_store_torch_involved(&h) &&
        ftruncate(s->fd, 0) != 0)
        st = comm_store_log_fail(s, DT_ESYS, "truncating a dead job's file: %s", strerror(errno));
    comm_store_funlock(s);
    return st;
}

/*
 * One try at opening the file and joining its live holders. Sets *again
 * when the name was unlinked or replaced under us (see the head comment).
 *
 * The exclusive → shared conversion below need not be atomic; it is safe
 * either way. A reset happens only while its opener holds the lock
 * exclusively, i.e. while nobody holds it shared, and records are only
 * written by handles that hold it shared. If another opener slips into a
 * gap of the conversion and takes the lock exclusively, nobody holds it
 * shared at that moment, so nobody has written a record since our reset;
 * its reset truncates nothing live, and we wait for it to downgrade.
 */
static dt_status open_attempt(dt_store *s, bool *again)
{
    *again = false;
    dt_status st = comm_store_path_check_before_open(s);
    if (st != DT_OK)
        return st;
    /* O_NOFOLLOW: a symlink (dangling or not) is refused, its target
     * neither created nor written; O_NONBLOCK: a FIFO slipped in after the
     * check above opens at once, and check_opened refuses it. */
    s->fd = open(s->path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
    if (s->fd < 0)
        return comm_store_path_open_failed(s, errno);
    if ((st = comm_store_path_check_opened(s)) != DT_OK)
        return st;
    int rc = comm_store_liveness_lock(s->fd, F_WRLCK, false);
    bool exclusive = rc == 0;
    if (rc == EAGAIN || rc == EACCES)
        rc = comm_store_liveness_lock(s->fd, F_RDLCK, true);
    if (rc != 0)
        return comm_store_log_fail(s, DT_ESYS,
                                   "OFD lock on %s: %s (the filesystem must "
                                   "support flock and OFD locks)",
                                   s->path, strerror(rc));
    if (!comm_store_still_named(s->fd, s->path)) {
        close(s->fd);
        s->fd = -1;
        *again = true;
        return DT_OK;
    }
    if (exclusive && (st = reset_if_stale(s)) != DT_OK)
        return st;
    if (exclusive && (rc = comm_store_liveness_lock(s->fd, F_RDLCK, true)) != 0)
        return comm_store_log_fail(s, DT_ESYS, "OFD lock on %s: %s", s->path, strerror(rc));
    s->alive_locked = true;
    return DT_OK;
}

static bool is_tcp_url(const char *url)
{
    return url && (strncmp(url, "tcp://", 6) == 0 || strcmp(url, "env://") == 0);
}

static dt_status check_url_and_job(dt_store *s, const char *url, const char *job)
{
    if (!is_tcp_url(url) && (!url || strncmp(url, "file://", 7) != 0 || url[7] != '/'))
        return comm_store_log_fail(s, DT_EINVAL,
                                   "unsupported store URL '%s': use "
                                   "file:///absolute/path, tcp://HOST:PORT or env://",
                                   url ? url : "(null)");
    size_t n = strlen(job);
    if (n > STORE_MAX_JOB_ID || strchr(job, '/'))
        return comm_store_log_fail(s, DT_EINVAL,
                                   "bad job id '%s': it must be 0..%d "
                                   "bytes without '/'",
                                   job, STORE_MAX_JOB_ID);
    if (job[0] == '-' || strcmp(job, "refcount") == 0 || strcmp(job, "cleanup") == 0)
        return comm_store_log_fail(s, DT_EINVAL, "bad job id '%s': %s", job,
                                   job[0] == '-'
                                       ? "a job id starting with '-' reads as a deletion record to "
                                         "PyTorch's FileStore"
                                       : "PyTorch's FileStore uses that name");
    if (!(s->path = strdup(is_tcp_url(url) ? url : url + 7)))
        return comm_store_log_fail(s, DT_ENOMEM, "out of memory");
    return DT_OK;
}

/* Connects to the server a tcp:// URL names, or env://'s MASTER_ADDR and
 * MASTER_PORT (torch's env:// names). */
const char *comm_store_tcp_server(const char *url, char *host, size_t hcap, char *port, size_t pcap)
{
    char target[300];
    if (!is_tcp_url(url))
        return "not a tcp:// or env:// URL";
    if (strcmp(url, "env://") == 0) {
        const char *addr = getenv("MASTER_ADDR"), *p = getenv("MASTER_PORT");
        if (!addr || !*addr)
            return "MASTER_ADDR is not set";
        if (!p || !*p)
            return "MASTER_PORT is not set";
        snprintf(target, sizeof target, "%s:%s", addr, p);
    } else {
        snprintf(target, sizeof target, "%s", url + 6);
    }
    char *colon = strrchr(target, ':');
    if (!colon || colon == target || (size_t)(colon - target) >= hcap || strlen(colon) > pcap)
        return "not HOST:PORT";
    *colon = '\0';
    snprintf(host, hcap, "%s", target);
    snprintf(port, pcap, "%s", colon + 1);
    return NULL;
}

static dt_status store_open_tcp(dt_store *s, const char *url, double connect_s)
{
    char host[256], port[64], target[330], err[STORE_ERR_LEN];
    const char *why = comm_store_tcp_server(url, host, sizeof host, port, sizeof port);
    if (why && strcmp(url, "env://") == 0)
        return comm_store_log_fail(s, DT_EINVAL, "env:// needs MASTER_ADDR and MASTER_PORT (%s)",
                                   why);
    if (why)
        return comm_store_log_fail(s, DT_EINVAL, "'%s' is %s", url + 6, why);
    snprintf(target, sizeof target, "%s:%s", host, port);
    dt_status st = comm_tcp_client_open(&s->tcp, target, connect_s, err, sizeof err);
    return st == DT_OK ? DT_OK : comm_store_log_fail(s, st, "%s", err);
}

/* Joins the live holders of the file, then reads what they wrote so far. */
static dt_status store_open_file(dt_store *s)
{
    dt_status st = DT_OK;
    bool again = true;
    for (int i = 0; again && i < STORE_OPEN_ATTEMPTS && st == DT_OK; i++)
        st = open_attempt(s, &again);
    if (st == DT_OK && again)
        st = comm_store_log_fail(s, DT_ESTORE,
                                 "%s kept being removed or replaced "
                                 "while opening it",
                                 s->path);
    if (st == DT_OK && (st = comm_store_flock(s, LOCK_EX)) == DT_OK) {
        st = comm_store_log_replay(s);
        if (st == DT_OK)
            st = comm_store_torch_join(s);
        comm_store_funlock(s);
    }
    return st;
}

dt_status dt_store_open(dt_store **out, const char *url, const char *job_id)
{
    return dt_store_open_within(out, url, job_id, STORE_TCP_CONNECT_S);
}

dt_status dt_store_open_within(dt_store **out, const char *url, const char *job_id,
                               double connect_s)
{
    if (!out)
        return DT_EINVAL;
    dt_store *s = calloc(1, sizeof *s);
    *out = NULL;
    if (!s)
        return DT_ENOMEM;
    s->fd = -1;
    s->url = strdup(url ? url : "(null)");
    if (!comm_store_scope_set(s, job_id) || !s->url) {
        dt_store_close(s);
        return DT_ENOMEM;
    }
    *out = s;
    dt_status st = check_url_and_job(s, url, s->job_id);
    if (st == DT_OK)
        st = is_tcp_url(url) ? store_open_tcp(s, url, connect_s) : store_open_file(s);
    s->healthy = st == DT_OK;
    if (st != DT_OK && s->fd >= 0) { /* drop our locks; touch nothing */
        close(s->fd);
        s->fd = -1;
        s->alive_locked = false;
    }
    return st;
}

void dt_store_keep_file(dt_store *s)
{
    s->keep_file = true;
}

void dt_store_close(dt_store *s)
{
    if (!s)
        return;
    /* Let go of our shared lock first, then try for the exclusive one: of
     * several holders closing at once, the last to let go gets it (trying
     * to upgrade in place, each would see the others' shared locks and
     * none would remove the file). Holding it, nobody else can be using
     * the file, so it can go. A new job that opened the file meanwhile
     * holds a shared lock, and the file stays. So does a file PyTorch has
     * used (store_torch.c): PyTorch's to remove. */
    if (s->fd >= 0 && s->healthy && s->alive_locked) {
        bool torch = true;
        if (comm_store_flock(s, LOCK_EX) == DT_OK) {
            if (comm_store_log_replay(s) == DT_OK)
                (void)comm_store_torch_leave(s, &torch);
            comm_store_funlock(s);
        }
        (void)comm_store_liveness_lock(s->fd, F_UNLCK, false);
        if (!torch && !s->keep_file && comm_store_liveness_lock(s->fd, F_WRLCK, false) == 0 &&
            comm_store_still_named(s->fd, s->path))
            (void)unlink(s->path);
    }
    if (s->fd >= 0)
        close(s->fd);
    comm_tcp_client_close(s->tcp);
    comm_store_map_free(&s->map);
    free(s->ops);
    free(s->url);
    free(s->path);
    free(s->job_id);
    free(s->prefix);
    free(s);
}

const char *dt_store_error(const dt_store *s)
{
    return s ? s->err : "dt_store: out of memory";
}

/* ---- operations -------------------------------------------------------------- */

dt_status comm_store_check_usable(dt_store *s, const char *op, const char *key)
{
    if (!s->healthy)
        return DT_ESTORE; /* the message of what broke it stays */
    if (!key)
        return comm_store_log_fail(s, DT_EINVAL, "%s: key is NULL", op);
    if (strlen(key) + s->prefix_len > STORE_MAX_KEY)
        return comm_store_log_fail(s, DT_EINVAL, "%s: key '%.40s...' is over %u bytes", op, key,
                                   STORE_MAX_KEY);
    return DT_OK;
}

dt_status dt_store_set(dt_store *s, const char *key, const void *val, size_t len)
{
    dt_status st = comm_store_check_usable(s, "set", key);
    if (st != DT_OK)
        return st;
    if (len > STORE_MAX_VALUE || (!val && len))
        return comm_store_log_fail(s, DT_EINVAL, "set '%s': a %zu-byte value%s", key, len,
                                   val ? " is over the 64 MiB limit" : " from NULL");
    if (s->ops)
        return comm_store_ops_set(s, key, val, len);
    if (s->tcp) {
        char *k = comm_store_scoped(s, key), err[STORE_ERR_LEN] = "out of memory";
        st = k ? comm_tcp_client_set(s->tcp, k, val, len, err, sizeof err) : DT_ENOMEM;
        free(k);
        return st == DT_OK ? DT_OK : comm_store_log_fail(s, st, "%s", err);
    }
    if ((st = comm_store_flock(s, LOCK_EX)) != DT_OK)
        return st;
    if ((st = comm_store_log_replay(s)) == DT_OK)
        st = comm_store_log_append(s, key, val, len);
    comm_store_funlock(s);
    return st;
}

/* Names the keys still missing, for a timeout message. */
static void list_missing(const dt_store *s, const char *const *keys, int n, char *out, size_t cap)
{
    size_t o = 0;
    int listed = 0, missing = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        if (comm_store_map_find(&s->map, keys[i], strlen(keys[i])))
            continue;
        missing++;
        if (o + 80 < cap && listed < 8) {
            o += (size_t)snprintf(out + o, cap - o, "%s'%.60s'", listed ? ", " : "", keys[i]);
            listed++;
        }
    }
    if (missing > listed)
        snprintf(out + o, cap - o, " and %d more", missing - listed);
}

/* A TCP store's wait: the server answers once every key exists. */
static dt_status wait_tcp(dt_store *s, const char *op, const char *const *keys, int n,
                          double timeout_s)
{
    char **k = comm_store_scoped_keys(s, keys, n), err[STORE_ERR_LEN];
    dt_status st = k ? comm_tcp_client_wait(s->tcp, (const char *const *)k, n, s->prefix_len,
                                            timeout_s, op, err, sizeof err)
                     : DT_ENOMEM;
    comm_store_scoped_free(k, n);
    if (st == DT_ENOMEM)
        snprintf(err, sizeof err, "%s: out of memory", op);
    return st == DT_OK ? DT_OK : comm_store_log_fail(s, st, "%s", err);
}

/* Polls every 10 ms until every key exists or the deadline passes. */
static dt_status wait_for_keys(dt_store *s, const char *op, const char *const *keys, int n,
                               double timeout_s)
{
    if (isnan(timeout_s) || timeout_s < 0)
        return comm_store_log_fail(s, DT_EINVAL, "%s: bad timeout %g s", op, timeout_s);
    if (s->tcp)
        return wait_tcp(s, op, keys, n, timeout_s);
    double deadline = dt_now() + timeout_s;
    for (;;) {
        dt_status st = comm_store_flock(s, LOCK_SH);
        if (st != DT_OK)
            return st;
        st = comm_store_log_replay(s);
        comm_store_funlock(s);
        if (st != DT_OK)
            return st;
        int found = 0;
        for (int i = 0; i < n; i++)
            found += comm_store_map_find(&s->map, keys[i], strlen(keys[i])) != NULL;
        if (found == n)
            return DT_OK;
        double left = deadline - dt_now();
        if (left <= 0) {
            char missing[600];
            list_missing(s, keys, n, missing, sizeof missing);
            return comm_store_log_fail(s, DT_ETIMEDOUT,
                                       "%s timed out after %g s waiting "
                                       "for key%s %s",
                                       op, timeout_s, n - found > 1 ? "s" : "", missing);
        }
        long ns = left < 0.01 ? (long)(left * 1e9) + 1 : STORE_POLL_NS;
        struct timespec nap = {0, ns};
        nanosleep(&nap, NULL);
    }
}

dt_status dt_store_get(dt_store *s, const char *key, void **val, size_t *len, double timeout_s)
{
    if (val)
        *val = NULL;
    if (len)
        *len = 0;
    dt_status st = comm_store_check_usable(s, "get", key);
    if (st != DT_OK)
        return st;
    if (!val || !len)
        return comm_store_log_fail(s, DT_EINVAL, "get '%s': val and len must not be NULL", key);
    if (s->ops)
        return comm_store_ops_get(s, key, val, len, timeout_s);
    if ((st = wait_for_keys(s, "get", &key, 1, timeout_s)) != DT_OK)
        return st;
    if (s->tcp) {
        char *k = comm_store_scoped(s, key), err[STORE_ERR_LEN] = "out of memory";
        st = k ? comm_tcp_client_get(s->tcp, k, val, len, err, sizeof err) : DT_ENOMEM;
        free(k);
        return st == DT_OK ? DT_OK : comm_store_log_fail(s, st, "%s", err);
    }
    const store_entry *e = comm_store_map_find(&s->map, key, strlen(key));
    uint8_t *copy = malloc(e->len + 1);
    if (!copy)
        return comm_store_log_fail(s, DT_ENOMEM, "get '%s': out of memory", key);
    memcpy(copy, e->val, e->len + 1);
    *val = copy;
    *len = e->len;
    return DT_OK;
}

dt_status dt_store_wait(dt_store *s, const char *const *keys, int n, double timeout_s)
{
    if (n < 0 || (n > 0 && !keys))
        return comm_store_log_fail(s, DT_EINVAL, "wait: %d keys at %p", n, (const void *)keys);
    for (int i = 0; i < n; i++) {
        dt_status st = comm_store_check_usable(s, "wait", keys[i]);
        if (st != DT_OK)
            return st;
    }
    if (s->healthy && s->ops)
        return comm_store_ops_wait(s, keys, n, timeout_s);
    return s->healthy ? wait_for_keys(s, "wait", keys, n, timeout_s) : DT_ESTORE;
}

/* Reads a decimal int64 ("-12"); false for anything else. */
static bool parse_int64(const uint8_t *p, size_t n, int64_t *out)
{
    size_t i = (n > 0 && (p[0] == '-' || p[0] == '+')) ? 1 : 0;
    if (i == n || n > 20)
        return false;
    for (size_t j = i; j < n; j++)
        if (p[j] < '0' || p[j] > '9')
            return false;
    errno = 0;
    long long v = strtoll((const char *)p, NULL, 10); /* p is NUL-terminated */
    if (errno == ERANGE)
        return false;
    *out = v;
    return true;
}

dt_status dt_store_add(dt_store *s, const char *key, int64_t delta, int64_t *result)
{
    dt_status st = comm_store_check_usable(s, "add", key);
    if (st != DT_OK)
        return st;
    if (s->ops)
        return comm_store_ops_add(s, key, delta, result);
    if (s->tcp) {
        char *k = comm_store_scoped(s, key), err[STORE_ERR_LEN] = "out of memory";
        st = k ? comm_tcp_client_add(s->tcp, k, delta, result, err, sizeof err) : DT_ENOMEM;
        free(k);
        return st == DT_OK ? DT_OK : comm_store_log_fail(s, st, "%s", err);
    }
    if ((st = comm_store_flock(s, LOCK_EX)) != DT_OK)
        return st;
    if ((st = comm_store_log_replay(s)) != DT_OK)
        goto out;
    int64_t now = 0, sum;
    const store_entry *e = comm_store_map_find(&s->map, key, strlen(key));
    if (e && !parse_int64(e->val, e->len, &now)) {
        st = comm_store_log_fail(s, DT_EINVAL,
                                 "add to key '%s': its %zu-byte value "
                                 "'%.40s' is not a decimal int64",
                                 key, e->len, (const char *)e->val);
        goto out;
    }
    if (__builtin_add_overflow(now, delta, &sum)) {
        st = comm_store_log_fail(s, DT_EINVAL,
                                 "add %" PRId64 " to key '%s' (%" PRId64 "): overflows int64",
                                 delta, key, now);
        goto out;
    }
    char text[24];
    int n = snprintf(text, sizeof text, "%" PRId64, sum);
    if ((st = comm_store_log_append(s, key, (const uint8_t *)text, (size_t)n)) == DT_OK && result)
        *result = sum;
out:
    comm_store_funlock(s);
    return st;
}
