/*
 * store_scope.c — a store's key space: the job id, and the keys of a
 * store shared with others stored as "<job id>/<key>".
 *
 * A tcp:// store, or a store of the caller's functions (store_ops.c), may
 * serve several jobs at once (PyTorch's TCPStore serves whoever connects),
 * so every key a rank names goes to it scoped by the job id: two jobs
 * on one server never read each other's addresses. (A file:// store holds
 * one job: its records are unscoped, and the file's header names the job.)
 * store.c (opening, waiting), store_keys.c and store_ops.c all scope keys
 * the same way, through these; they sit below all three, so that no two of
 * them call each other.
 *
 * Cost: one malloc and a copy per key per operation.
 */
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

bool comm_store_scope_set(dt_store *s, const char *job_id)
{
    const char *job = job_id ? job_id : "dtrain";
    size_t n = strlen(job);
    s->job_id = strdup(job);
    s->prefix = malloc(n + 2);
    if (!s->job_id || !s->prefix)
        return false;
    memcpy(s->prefix, job, n);
    memcpy(s->prefix + n, "/", 2);
    s->prefix_len = n + 1;
    return true;
}

char *comm_store_scoped(const dt_store *s, const char *key)
{
    size_t n = strlen(key);
    char *k = malloc(s->prefix_len + n + 1);
    if (k) {
        memcpy(k, s->prefix, s->prefix_len);
        memcpy(k + s->prefix_len, key, n + 1);
    }
    return k;
}

char **comm_store_scoped_keys(const dt_store *s, const char *const *keys, int n)
{
    char **k = calloc((size_t)n + 1, sizeof *k);
    for (int i = 0; k && i < n; i++)
        if (!(k[i] = comm_store_scoped(s, keys[i]))) {
            comm_store_scoped_free(k, i);
            return NULL;
        }
    return k;
}

void comm_store_scoped_free(char **k, int n)
{
    for (int i = 0; k && i < n; i++)
        free(k[i]);
    free(k);
}
