/*
 * store_map.h — internal: the rendezvous store's in-memory table of
 * key -> latest value.
 *
 * The store's file is an append-only log; replaying it into this table gives
 * each key its last written value. Open addressing with linear probing,
 * FNV-1a hashing, at most half full; keys and values are private copies.
 * A job's store holds a few dozen keys, so simplicity beats everything.
 */
#ifndef DT_STORE_MAP_H
#define DT_STORE_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct store_entry {
    char *key; /* [key_len], unscoped ("addr/0"); NULL = empty slot */
    size_t key_len;
    uint8_t *val; /* [len + 1], NUL after the value */
    size_t len;
} store_entry;

typedef struct store_map {
    store_entry *slots; /* [cap], cap a power of two, at most half full */
    size_t cap;
    size_t n;
} store_map;

/* The entry for key, or NULL. */
const store_entry *comm_store_map_find(const store_map *m, const char *key, size_t n);
/* Sets key to a copy of val[0..len). False on ENOMEM (table unchanged). */
bool comm_store_map_put(store_map *m, const char *key, size_t key_len, const uint8_t *val,
                        size_t len);
/* Removes key; false if it was not there. */
bool comm_store_map_erase(store_map *m, const char *key, size_t n);
void comm_store_map_free(store_map *m);

#endif /* DT_STORE_MAP_H */
