/*
 * store_keys.c — the store's operations on its set of keys: check that keys
 * exist (without waiting), delete one, count them, and compare-and-set —
 * PyTorch c10d Store's check, delete_key, num_keys and compare_set, on
 * both kinds of store (a store of the caller's functions: store_ops.c).
 *
 * On a file:// store each is one flock, a replay of the bytes appended
 * since the last call, and at most one appended record: a delete is a
 * record whose key is "-" before the deleted one's, with an empty value,
 * as PyTorch's FileStore writes it, so either side sees the other's
 * deletes. compare_set holds LOCK_EX from reading the value to appending
 * the new one, so two ranks racing on a key cannot both win. On a tcp://
 * store each is one round trip to the server (store_tcp_client.c).
 * num_keys counts this job's keys on a file:// store, but every job's on a
 * tcp:// one: the server counts all it holds, as PyTorch's does.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>

#include "store_internal.h"

/* A TCP store operation's failure, in the handle's message. */
static dt_status tcp_done(dt_store *s, dt_status st, const char *err)
{
    return st == DT_OK ? DT_OK : comm_store_log_fail(s, st, "%s", err);
}

/* Takes flock `op` and replays to the end; on failure holds nothing. */
static dt_status lock_and_replay(dt_store *s, int op)
{
    dt_status st = comm_store_flock(s, op);
    if (st != DT_OK)
        return st;
    if ((st = comm_store_log_replay(s)) != DT_OK)
        comm_store_funlock(s);
    return st;
}

dt_status dt_store_check(dt_store *s, const char *const *keys, int n, bool *all)
{
    dt_status st = DT_OK;
    for (int i = 0; i < n && st == DT_OK; i++)
        st = comm_store_check_usable(s, "check", keys[i]);
    if (st != DT_OK)
        return st;
    if (s->ops)
        return comm_store_ops_check(s, keys, n, all);
    if (s->tcp) {
        char **k = comm_store_scoped_keys(s, keys, n), err[STORE_ERR_LEN] = "out of memory";
        st = k ? comm_tcp_client_check(s->tcp, (const char *const *)k, n, all, err, sizeof err)
               : DT_ENOMEM;
        comm_store_scoped_free(k, n);
        return tcp_done(s, st, err);
    }
    if ((st = lock_and_replay(s, LOCK_SH)) != DT_OK)
        return st;
    *all = true;
    for (int i = 0; i < n && *all; i++)
        *all = comm_store_map_find(&s->map, keys[i], strlen(keys[i])) != NULL;
    comm_store_funlock(s);
    return DT_OK;
}

dt_status dt_store_delete(dt_store *s, const char *key, bool *deleted)
{
    bool was = false;
    dt_status st = comm_store_check_usable(s, "delete", key);
    if (st != DT_OK)
        return st;
    if (s->ops)
        return comm_store_ops_delete(s, key, deleted);
    if (s->tcp) {
        char *k = comm_store_scoped(s, key), err[STORE_ERR_LEN] = "out of memory";
        st = k ? comm_tcp_client_delete(s->tcp, k, &was, err, sizeof err) : DT_ENOMEM;
        free(k);
        if (st == DT_OK && deleted)
            *deleted = was;
        return tcp_done(s, st, err);
    }
    if ((st = lock_and_replay(s, LOCK_EX)) != DT_OK)
        return st;
    was = comm_store_map_find(&s->map, key, strlen(key)) != NULL;
    if (was) {
        size_t n = 1 + s->prefix_len + strlen(key);
        char *del = malloc(n + 1);
        if (!del) {
            st = comm_store_log_fail(s, DT_ENOMEM, "delete '%s': out of memory", key);
        } else {
            del[0] = '-';
            memcpy(del + 1, s->prefix, s->prefix_len);
            strcpy(del + 1 + s->prefix_len, key);
            if ((st = comm_store_log_append_raw(s, del, (const uint8_t *)"", 0)) == DT_OK)
                (void)comm_store_map_erase(&s->map, key, strlen(key));
            free(del);
        }
    }
    comm_store_funlock(s);
    if (st == DT_OK && deleted)
        *deleted = was;
    return st;
}

dt_status dt_store_num_keys(dt_store *s, int64_t *n)
{
    if (!s->healthy)
        return DT_ESTORE;
    if (s->ops)
        return comm_store_ops_num_keys(s, n);
    if (s->tcp) {
        char err[STORE_ERR_LEN];
        return tcp_done(s, comm_tcp_client_num_keys(s->tcp, n, err, sizeof err), err);
    }
    dt_status st = lock_and_replay(s, LOCK_SH);
    if (st != DT_OK)
        return st;
    *n = (int64_t)s->map.n;
    comm_store_funlock(s);
    return DT_OK;
}

/* *now = a NUL-terminated copy of p[0..n). */
static dt_status copy_out(dt_store *s, const void *p, size_t n, void **now, size_t *nlen)
{
    uint8_t *c = malloc(n + 1);
    if (!c)
        return comm_store_log_fail(s, DT_ENOMEM, "compare_set: out of memory");
    if (n)
        memcpy(c, p, n);
    c[n] = 0;
    *now = c;
    *nlen = n;
    return DT_OK;
}

dt_status dt_store_compare_set(dt_store *s, const char *key, const void *expected, size_t elen,
                               const void *desired, size_t dlen, void **now, size_t *nlen)
{
    dt_status st = comm_store_check_usable(s, "compare_set", key);
    if (st != DT_OK)
        return st;
    if (elen > STORE_MAX_VALUE || dlen > STORE_MAX_VALUE || (!expected && elen) ||
        (!desired && dlen))
        return comm_store_log_fail(s, DT_EINVAL,
                                   "compare_set '%s': a value over 64 MiB or "
                                   "from NULL",
                                   key);
    if (s->ops)
        return comm_store_ops_compare_set(s, key, expected, elen, desired, dlen, now, nlen);
    if (s->tcp) {
        char *k = comm_store_scoped(s, key), err[STORE_ERR_LEN] = "out of memory";
        void *v = NULL;
        size_t vn = 0;
        st = k ? comm_tcp_client_compare_set(s->tcp, k, expected, elen, desired, dlen, &v, &vn, err,
                                             sizeof err)
               : DT_ENOMEM;
        free(k);
        if (st == DT_OK && now) {
            *now = v;
            *nlen = vn;
        } else {
            free(v);
        }
        return tcp_done(s, st, err);
    }
    if ((st = lock_and_replay(s, LOCK_EX)) != DT_OK)
        return st;
    const store_entry *e = comm_store_map_find(&s->map, key, strlen(key));
    bool match = e ? e->len == elen && (elen == 0 || memcmp(e->val, expected, elen) == 0)
                   : elen == 0;
    if (match)
        st = comm_store_log_append(s, key, desired, dlen);
    if (st == DT_OK && now) {
        /* after it: the new value, the value it kept, or (absent, and
         * something else expected) the expected one, as PyTorch answers */
        e = comm_store_map_find(&s->map, key, strlen(key));
        st = e ? copy_out(s, e->val, e->len, now, nlen) : copy_out(s, expected, elen, now, nlen);
    }
    comm_store_funlock(s);
    return st;
}
