/*
 * store_log.c — the rendezvous store's file: an append-only log of records.
 *
 * File format (PyTorch c10d FileStore's, byte for byte):
 *
 *   record := u32 keylen | key[keylen] | u32 vallen | value[vallen]
 *
 * lengths in host byte order (little-endian on every machine we run on),
 * records appended back to back, no header, no padding, no checksum; the
 * last record of a key wins. add() writes its result as decimal ASCII, as
 * PyTorch does. Our keys are "<job_id>/<key>" (job NULL = "dtrain");
 * PyTorch's are "/<key>", plus its own "cleanup/", "refcount/" and "-"
 * (delete) records. Either side parses the other's records and ignores the
 * keys it does not own, so a script can read our files and we can read
 * theirs. (Liveness is not in the file: store.c.)
 *
 * Replaying reads only the bytes appended since the last replay and
 * applies this job's records to the in-memory table (store_map.h);
 * appending writes one whole record with one write(2) under LOCK_EX and
 * cuts it off again if the write failed, so no reader ever meets half a
 * record (a cut record seen under a lock is corruption, DT_ESTORE). Cost:
 * a replay is one fstat, plus one pread of the new bytes when the file
 * grew; an append is one write.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store_internal.h"

/* ---- messages -------------------------------------------------------------- */

dt_status comm_store_log_fail(dt_store *s, dt_status st, const char *fmt, ...)
{
    char what[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(s->err, sizeof s->err, "%.200s (job %.200s): %s", s->url, s->job_id, what);
    return st;
}

/* The file is not (or no longer) a store: say where, and stop using it. */
dt_status comm_store_log_corrupt(dt_store *s, const char *fmt, ...)
{
    char why[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    s->healthy = false;
    return comm_store_log_fail(s, DT_ESTORE,
                               "not a rendezvous store: %s; remove the "
                               "file or choose another name",
                               why);
}

/* ---- records ----------------------------------------------------------------- */

/* out (cap >= 4) = up to 40 bytes of b[0..n), printable ASCII kept and every
 * other byte as \xNN, so a hostile key cannot reach a terminal raw. */
static void show_bytes(char *out, size_t cap, const uint8_t *b, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n && i < 40 && o + 5 < cap; i++)
        o += (size_t)snprintf(out + o, cap - o,
                              b[i] >= 0x20 && b[i] < 0x7f && b[i] != '\\' ? "%c" : "\\x%02x", b[i]);
    snprintf(out + o, cap - o, "%s", n > 40 ? "..." : "");
}

/*
 * Whether a key is one that some writer of this format makes; NULL if so,
 * else why not. dtrain writes "<job_id>/<key>" (a job id is 1..256 bytes
 * without '/', a key a C string); PyTorch's FileStore writes "/<key>",
 * "-/<key>" (a delete), "cleanup/" and "refcount/". So every real key has
 * no NUL byte and a '/' within its first 257 bytes. A file of zeros (key
 * length 0) or of text fails this at its first record, which is what keeps
 * open from taking somebody's file for a dead job's store and emptying it.
 */
static const char *key_problem(const uint8_t *key, uint32_t len)
{
    if (len == 0)
        return "an empty key";
    if (memchr(key, '\0', len))
        return "a NUL byte in its key";
    if (!memchr(key, '/', len < STORE_MAX_JOB_ID + 1 ? len : STORE_MAX_JOB_ID + 1))
        return "no '/' after a job id of at most 256 bytes";
    return NULL;
}

static uint32_t load_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v); /* host order, as PyTorch writes it */
    return v;
}

/*
 * Walks the records in buf[0..n), which are file bytes [base, base + n) and
 * end at the end of the file. Applies this job's records to the table when
 * `apply`. Every record must be whole: writers append under LOCK_EX, so a
 * cut record seen under a lock means the file is not (only) ours.
 */
/* A counter record's decimal value (PyTorch's add), 0 if it is not one. */
static int64_t counter_value(const uint8_t *val, uint32_t len)
{
    char text[24];
    if (len == 0 || len >= sizeof text)
        return 0;
    memcpy(text, val, len);
    text[len] = '\0';
    return strtoll(text, NULL, 10);
}

static bool key_is(const char *key, uint32_t len, const char *name)
{
    return len == strlen(name) && memcmp(key, name, len) == 0;
}

static dt_status parse_records(dt_store *s, const uint8_t *buf, size_t n, uint64_t base, bool apply,
                               store_holders *holders)
{
    unsigned long long size = base + n;
    for (size_t pos = 0; pos < n;) {
        unsigned long long at = base + pos;
        uint32_t len[2] = {0, 0};
        size_t field = pos;
        for (int i = 0; i < 2; i++) {
            const char *what = i == 0 ? "key" : "value";
            uint32_t limit = i == 0 ? STORE_MAX_KEY : STORE_MAX_VALUE;
            if (n - field < 4)
                return comm_store_log_corrupt(s,
                                              "record at byte %llu is cut short: its "
                                              "%s length runs past the end of the file "
                                              "(%llu bytes)",
                                              at, what, size);
            len[i] = load_u32(buf + field);
            if (len[i] > n - field - 4)
                return comm_store_log_corrupt(s,
                                              "record at byte %llu declares a %" PRIu32
                                              "-byte %s but the file has %llu bytes",
                                              at, len[i], what, size);
            if (len[i] > limit)
                return comm_store_log_corrupt(s,
                                              "record at byte %llu declares a %" PRIu32
                                              "-byte %s, over the %" PRIu32 "-byte limit",
                                              at, len[i], what, limit);
            field += 4 + len[i];
        }
        const char *key = (const char *)buf + pos + 4;
        const char *bad = key_problem(buf + pos + 4, len[0]);
        if (bad) {
            char shown[200];
            show_bytes(shown, sizeof shown, buf + pos + 4, len[0]);
            return comm_store_log_corrupt(s,
                                          "record at byte %llu has %s (key '%s'), "
                                          "a key that no dtrain or PyTorch writer makes",
                                          at, bad, shown);
        }
        const uint8_t *val = buf + pos + 8 + len[0];
        if (holders && key_is(key, len[0], STORE_TORCH_REFCOUNT))
            holders->refcount = counter_value(val, len[1]);
        else if (holders && key_is(key, len[0], STORE_TORCH_CLEANUP))
            holders->cleanup = counter_value(val, len[1]);
        else if (holders && key_is(key, len[0], STORE_DTRAIN_REFCOUNT))
            holders->dtrain = counter_value(val, len[1]);
        else if (holders && (key[0] == '/' || key[0] == '-'))
            holders->torch_keys = true; /* PyTorch's key space, or its deletes */
        if (apply && key[0] == '-' && len[0] >= s->prefix_len + 1 &&
            memcmp(key + 1, s->prefix, s->prefix_len) == 0)
            (void)comm_store_map_erase(&s->map, key + 1 + s->prefix_len,
                                       len[0] - 1 - s->prefix_len); /* a delete */
        else if (apply && len[0] >= s->prefix_len && memcmp(key, s->prefix, s->prefix_len) == 0 &&
                 !comm_store_map_put(&s->map, key + s->prefix_len, len[0] - s->prefix_len,
                                     buf + pos + 8 + len[0], len[1]))
            return comm_store_log_fail(s, DT_ENOMEM, "out of memory replaying records");
        pos = field;
    }
    return DT_OK;
}

/* Reads file bytes [from, to) into a fresh buffer *out. */
static dt_status read_range(dt_store *s, uint64_t from, uint64_t to, uint8_t **out)
{
    *out = NULL;
    if (to - from > STORE_MAX_READ)
        return comm_store_log_corrupt(s,
                                      "%llu new bytes at byte %llu, more than a store "
                                      "ever holds",
                                      (unsigned long long)(to - from), (unsigned long long)from);
    uint8_t *buf = malloc(to - from + 1);
    if (!buf)
        return comm_store_log_fail(s, DT_ENOMEM, "out of memory reading %llu bytes",
                                   (unsigned long long)(to - from));
    for (uint64_t done = 0; done < to - from;) {
        ssize_t r = pread(s->fd, buf + done, to - from - done, (off_t)(from + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            free(buf);
            return comm_store_log_fail(s, DT_ESYS, "read at byte %llu: %s",
                                       (unsigned long long)(from + done),
                                       r < 0 ? strerror(errno) : "file shrank under a lock");
        }
        done += (uint64_t)r;
    }
    *out = buf;
    return DT_OK;
}

static dt_status file_size(dt_store *s, uint64_t *size)
{
    struct stat st;
    if (fstat(s->fd, &st) != 0)
        return comm_store_log_fail(s, DT_ESYS, "fstat: %s", strerror(errno));
    *size = (uint64_t)st.st_size;
    return DT_OK;
}

/* Applies the records appended since the last replay. Caller holds flock. */
dt_status comm_store_log_replay(dt_store *s)
{
    uint64_t size = 0;
    dt_status st = file_size(s, &size);
    if (st != DT_OK || size == s->consumed)
        return st;
    if (size < s->consumed)
        return comm_store_log_corrupt(s,
                                      "the file shrank from %llu to %llu bytes while "
                                      "in use",
                                      (unsigned long long)s->consumed, (unsigned long long)size);
    uint8_t *buf;
    if ((st = read_range(s, s->consumed, size, &buf)) != DT_OK)
        return st;
    st = parse_records(s, buf, size - s->consumed, s->consumed, true, NULL);
    free(buf);
    if (st == DT_OK)
        s->consumed = size;
    return st;
}

dt_status comm_store_log_check(dt_store *s, store_holders *holders)
{
    uint64_t size = 0;
    uint8_t *buf = NULL;
    if (holders)
        *holders = (store_holders){0, 0, 0, false};
    dt_status st = file_size(s, &size);
    if (st == DT_OK && size > 0 && (st = read_range(s, 0, size, &buf)) == DT_OK)
        st = parse_records(s, buf, size, 0, false, holders);
    free(buf);
    return st;
}

/* Writes one record, key = prefix ‖ key, at the end of the file (caller
 * holds LOCK_EX and has replayed to the end). A failed write is cut off
 * again, so readers never see half a record. */
static dt_status write_record(dt_store *s, const char *prefix, size_t plen, const char *key,
                              const uint8_t *val, size_t len)
{
    size_t klen = strlen(key);
    uint32_t scoped = (uint32_t)(plen + klen), vlen = (uint32_t)len;
    size_t total = 8 + scoped + len;
    uint8_t *rec = malloc(total);
    if (!rec)
        return comm_store_log_fail(s, DT_ENOMEM, "set '%s': out of memory", key);
    memcpy(rec, &scoped, 4);
    memcpy(rec + 4, prefix, plen);
    memcpy(rec + 4 + plen, key, klen);
    memcpy(rec + 4 + scoped, &vlen, 4);
    if (len)
        memcpy(rec + 8 + scoped, val, len);
    dt_status st = DT_OK;
    for (size_t done = 0; done < total && st == DT_OK;) {
        ssize_t w = write(s->fd, rec + done, total - done);
        if (w > 0)
            done += (size_t)w;
        else if (w == 0 || errno != EINTR)
            st = comm_store_log_fail(s, DT_ESYS, "writing key '%s': %s", key,
                                     w == 0 ? "wrote nothing" : strerror(errno));
    }
    free(rec);
    if (st != DT_OK) {
        if (ftruncate(s->fd, (off_t)s->consumed) != 0)
            s->healthy = false; /* a cut record stays: stop here */
        return st;
    }
    s->consumed += total;
    return DT_OK;
}

/* Appends one record of this job ("<job>/<key>") and applies it. */
dt_status comm_store_log_append(dt_store *s, const char *key, const uint8_t *val, size_t len)
{
    dt_status st = write_record(s, s->prefix, s->prefix_len, key, val, len);
    if (st != DT_OK)
        return st;
    if (!comm_store_map_put(&s->map, key, strlen(key), val, len)) /* the next replay applies it */
        return comm_store_log_fail(s, DT_ENOMEM, "set '%s': out of memory", key);
    return DT_OK;
}

/* Appends a record under a key of its own, no job prefix (PyTorch's
 * "refcount/"), applying nothing. */
dt_status comm_store_log_append_raw(dt_store *s, const char *key, const uint8_t *val, size_t len)
{
    return write_record(s, "", 0, key, val, len);
}
