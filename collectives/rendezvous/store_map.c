/*
 * store_map.c — the rendezvous store's key -> latest value table (see
 * store_map.h). Cost: O(1) expected per lookup and insert.
 */
#include <stdlib.h>
#include <string.h>

#include "store_map.h"

static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

static store_entry *map_slot(const store_map *m, const char *key, size_t n)
{
    size_t i = (size_t)hash_bytes(key, n) & (m->cap - 1);
    while (m->slots[i].key && (m->slots[i].key_len != n || memcmp(m->slots[i].key, key, n) != 0))
        i = (i + 1) & (m->cap - 1);
    return &m->slots[i];
}

const store_entry *comm_store_map_find(const store_map *m, const char *key, size_t n)
{
    if (m->cap == 0)
        return NULL;
    const store_entry *e = map_slot(m, key, n);
    return e->key ? e : NULL;
}

static bool map_grow(store_map *m)
{
    size_t cap = m->cap ? 2 * m->cap : 64;
    store_entry *old = m->slots;
    size_t old_cap = m->cap;
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots) {
        m->slots = old;
        return false;
    }
    m->cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].key)
            *map_slot(m, old[i].key, old[i].key_len) = old[i];
    free(old);
    return true;
}

bool comm_store_map_put(store_map *m, const char *key, size_t key_len, const uint8_t *val,
                        size_t len)
{
    if (2 * (m->n + 1) > m->cap && !map_grow(m))
        return false;
    uint8_t *copy = malloc(len + 1);
    if (!copy)
        return false;
    memcpy(copy, val, len);
    copy[len] = 0;
    store_entry *e = map_slot(m, key, key_len);
    if (!e->key) {
        if (!(e->key = malloc(key_len ? key_len : 1))) {
            free(copy);
            return false;
        }
        memcpy(e->key, key, key_len);
        e->key_len = key_len;
        m->n++;
    }
    free(e->val);
    e->val = copy;
    e->len = len;
    return true;
}

bool comm_store_map_erase(store_map *m, const char *key, size_t n)
{
    if (m->cap == 0)
        return false;
    store_entry *e = map_slot(m, key, n);
    if (!e->key)
        return false;
    free(e->key);
    free(e->val);
    *e = (store_entry){0};
    m->n--;
    /* re-seat the rest of the probe run, so no key sits behind the hole */
    for (size_t i = ((size_t)(e - m->slots) + 1) & (m->cap - 1); m->slots[i].key;
         i = (i + 1) & (m->cap - 1)) {
        store_entry moved = m->slots[i];
        m->slots[i] = (store_entry){0};
        *map_slot(m, moved.key, moved.key_len) = moved;
    }
    return true;
}

void comm_store_map_free(store_map *m)
{
    for (size_t i = 0; i < m->cap; i++) {
        free(m->slots[i].key);
        free(m->slots[i].val);
    }
    free(m->slots);
}
