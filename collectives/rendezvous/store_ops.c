/*
 * store_ops.c — a store whose operations are the caller's functions.
 *
 * dtrain's communicator rendezvouses through a dt_store: it publishes its
 * address, reads the others', shares the job secret and start-up failures.
 * A program that already has a key-value store every rank reaches — a
 * PyTorch job's c10d::Store, which torch hands a torch.distributed backend
 * — can put it behind the same handle: dt_store_open_ops takes a table of
 * functions (dt_store_ops, dt_comm.h), and each dt_store_* call on the
 * handle becomes one call of the table, with the key scoped by the job id
 * as a tcp:// store's are (store_scope.c). Nothing is cached or retried here: timeouts,
 * waiting and atomicity are the caller's store's. The cost is one call per
 * operation; the invariant is that the table is only called with checked
 * arguments (store.c and store_keys.c check them before dispatching here).
 */
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

dt_status dt_store_open_ops(dt_store **out, const dt_store_ops *ops, void *user, const char *name,
                            const char *job_id)
{
    if (!out)
        return DT_EINVAL;
    dt_store *s = calloc(1, sizeof *s);
    *out = s;
    if (!s)
        return DT_ENOMEM;
    s->fd = -1;
    s->url = strdup(name ? name : "caller's store");
    s->ops = malloc(sizeof *s->ops);
    if (!comm_store_scope_set(s, job_id) || !s->url || !s->ops) {
        free(s->url), free(s->job_id), free(s->prefix), free(s->ops), free(s);
        *out = NULL;
        return DT_ENOMEM;
    }
    s->ops_user = user;
    if (!ops || !ops->set || !ops->get || !ops->wait || !ops->check || !ops->add ||
        !ops->compare_set)
        return comm_store_log_fail(s, DT_EINVAL,
                                   "open: the table lacks set, get, wait, check, add or "
                                   "compare_set");
    *s->ops = *ops;
    s->healthy = true;
    return DT_OK;
}

/* The caller's failure, in the handle's message. */
static dt_status done(dt_store *s, dt_status st, const char *err)
{
    return st == DT_OK ? DT_OK : comm_store_log_fail(s, st, "%s", err);
}

dt_status comm_store_ops_set(dt_store *s, const char *key, const void *val, size_t len)
{
    char *k = comm_store_scoped(s, key), err[STORE_ERR_LEN] = "set: out of memory";
    dt_status st = k ? s->ops->set(s->ops_user, k, val, len, err, sizeof err) : DT_ENOMEM;
    free(k);
    return done(s, st, err);
}

dt_status comm_store_ops_get(dt_store *s, const char *key, void **val, size_t *len,
                             double timeout_s)
{
    char *k = comm_store_scoped(s, key), err[STORE_ERR_LEN] = "get: out of memory";
    dt_status st = k ? s->ops->get(s->ops_user, k, timeout_s, val, len, err, sizeof err)
                     : DT_ENOMEM;
    free(k);
    return done(s, st, err);
}

dt_status comm_store_ops_wait(dt_store *s, const char *const *keys, int n, double timeout_s)
{
    char **k = comm_store_scoped_keys(s, keys, n), err[STORE_ERR_LEN] = "wait: out of memory";
    dt_status st = k ? s->ops->wait(s->ops_user, (const char *const *)k, n, timeout_s, err,
                                    sizeof err)
                     : DT_ENOMEM;
    comm_store_scoped_free(k, n);
    return done(s, st, err);
}

dt_status comm_store_ops_check(dt_store *s, const char *const *keys, int n, bool *all)
{
    char **k = comm_store_scoped_keys(s, keys, n), err[STORE_ERR_LEN] = "check: out of memory";
    dt_status st = k ? s->ops->check(s->ops_user, (const char *const *)k, n, all, err, sizeof err)
                     : DT_ENOMEM;
    comm_store_scoped_free(k, n);
    return done(s, st, err);
}

dt_status comm_store_ops_add(dt_store *s, const char *key, int64_t delta, int64_t *result)
{
    char *k = comm_store_scoped(s, key), err[STORE_ERR_LEN] = "add: out of memory";
    int64_t r = 0;
    dt_status st = k ? s->ops->add(s->ops_user, k, delta, &r, err, sizeof err) : DT_ENOMEM;
    free(k);
    if (st == DT_OK && result)
        *result = r;
    return done(s, st, err);
}

dt_status comm_store_ops_compare_set(dt_store *s, const char *key, const void *expected,
                                     size_t elen, const void *desired, size_t dlen, void **now,
                                     size_t *nlen)
{
    char *k = comm_store_scoped(s, key), err[STORE_ERR_LEN] = "compare_set: out of memory";
    void *v = NULL;
    size_t vn = 0;
    dt_status st = k ? s->ops->compare_set(s->ops_user, k, expected, elen, desired, dlen, &v, &vn,
                                           err, sizeof err)
                     : DT_ENOMEM;
    free(k);
    if (st == DT_OK && now) {
        *now = v;
        *nlen = vn;
    } else {
        free(v);
    }
    return done(s, st, err);
}

dt_status comm_store_ops_delete(dt_store *s, const char *key, bool *deleted)
{
    if (!s->ops->delete_key)
        return comm_store_log_fail(s, DT_EINVAL, "delete '%s': this store cannot delete", key);
    char *k = comm_store_scoped(s, key), err[STORE_ERR_LEN] = "delete: out of memory";
    bool was = false;
    dt_status st = k ? s->ops->delete_key(s->ops_user, k, &was, err, sizeof err) : DT_ENOMEM;
    free(k);
    if (st == DT_OK && deleted)
        *deleted = was;
    return done(s, st, err);
}

dt_status comm_store_ops_num_keys(dt_store *s, int64_t *n)
{
    if (!s->ops->num_keys)
        return comm_store_log_fail(s, DT_EINVAL, "num_keys: this store cannot count its keys");
    char err[STORE_ERR_LEN] = "";
    return done(s, s->ops->num_keys(s->ops_user, n, err, sizeof err), err);
}
