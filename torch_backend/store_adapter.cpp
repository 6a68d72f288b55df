// store_adapter.cpp — a rank's rendezvous through the store torch hands a
// torch.distributed backend.
//
// torch gives the backend's creator a c10d::Store (a PrefixStore over the
// TCPStore, FileStore or HashStore that init_process_group made, or the one
// the user passed in). dtrain's communicator rendezvouses through a
// dt_store; dt_store_open_ops puts any store behind that handle given a
// table of functions, and this file is that table for a c10d::Store: each
// function is one call of the store, so torchrun, TCPStore and FileStore
// work as they do with gloo, and no second rendezvous is needed.
//
// Two differences of meaning are bridged here. c10d's wait with timeout 0
// waits forever (kNoTimeout), where dtrain's 0 means "look once": a zero
// timeout becomes check(). And c10d reports failures as exceptions, dtrain
// as a status and a message: a message that says the wait timed out
// becomes DT_ETIMEDOUT, anything else DT_ESTORE. Cost: one store call per
// operation (a TCP round trip on a TCPStore, a locked file read on a
// FileStore).
#include "store_adapter.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace dtrain_torch
{
namespace
{

c10d::Store &store_of(void *user)
{
    return *static_cast<c10d::Store *>(user);
}

// The first line of the exception's message (c10::Error appends a
// backtrace), as the failure of `op`.
dt_status failed(const std::exception &e, const char *op, char *err, size_t errlen)
{
    std::string what = e.what();
    size_t nl = what.find('\n');
    if (nl != std::string::npos)
        what.resize(nl);
    snprintf(err, errlen, "torch store %s: %s", op, what.c_str());
    bool timeout = what.find("imeout") != std::string::npos ||
                   what.find("timed out") != std::string::npos;
    return timeout ? DT_ETIMEDOUT : DT_ESTORE;
}

dt_status copy_out(const std::vector<uint8_t> &v, void **val, size_t *len, char *err, size_t errlen)
{
    auto *p = static_cast<uint8_t *>(malloc(v.size() + 1));
    if (!p) {
        snprintf(err, errlen, "torch store: out of memory for a %zu-byte value", v.size());
        return DT_ENOMEM;
    }
    if (!v.empty())
        memcpy(p, v.data(), v.size());
    p[v.size()] = 0;
    *val = p;
    *len = v.size();
    return DT_OK;
}

std::vector<uint8_t> bytes(const void *p, size_t n)
{
    const auto *b = static_cast<const uint8_t *>(p);
    return n ? std::vector<uint8_t>(b, b + n) : std::vector<uint8_t>();
}

std::vector<std::string> key_list(const char *const *keys, int n)
{
    return std::vector<std::string>(keys, keys + n);
}

// Waits until every key exists, timeout_s > 0; else looks once.
dt_status wait_keys(c10d::Store &s, const std::vector<std::string> &keys, double timeout_s,
                    char *err, size_t errlen)
{
    if (timeout_s > 0) {
        auto ms = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(timeout_s * 1000)));
        s.wait(keys, ms);
        return DT_OK;
    }
    if (s.check(keys))
        return DT_OK;
    snprintf(err, errlen, "torch store: key '%.200s'%s not there yet", keys[0].c_str(),
             keys.size() > 1 ? " (or another)" : "");
    return DT_ETIMEDOUT;
}

dt_status op_set(void *user, const char *key, const void *val, size_t len, char *err, size_t errlen)
try {
    store_of(user).set(key, bytes(val, len));
    return DT_OK;
} catch (const std::exception &e) {
    return failed(e, "set", err, errlen);
}

dt_status op_get(void *user, const char *key, double timeout_s, void **val, size_t *len, char *err,
                 size_t errlen)
try {
    dt_status st = wait_keys(store_of(user), {key}, timeout_s, err, errlen);
    return st == DT_OK ? copy_out(store_of(user).get(key), val, len, err, errlen) : st;
} catch (const std::exception &e) {
    return failed(e, "get", err, errlen);
}

dt_status op_wait(void *user, const char *const *keys, int n, double timeout_s, char *err,
                  size_t errlen)
try {
    return n == 0 ? DT_OK : wait_keys(store_of(user), key_list(keys, n), timeout_s, err, errlen);
} catch (const std::exception &e) {
    return failed(e, "wait", err, errlen);
}

dt_status op_check(void *user, const char *const *keys, int n, bool *all, char *err, size_t errlen)
try {
    *all = store_of(user).check(key_list(keys, n));
    return DT_OK;
} catch (const std::exception &e) {
    return failed(e, "check", err, errlen);
}

dt_status op_add(void *user, const char *key, int64_t delta, int64_t *result, char *err,
                 size_t errlen)
try {
    *result = store_of(user).add(key, delta);
    return DT_OK;
} catch (const std::exception &e) {
    return failed(e, "add", err, errlen);
}

dt_status op_compare_set(void *user, const char *key, const void *expected, size_t elen,
                         const void *desired, size_t dlen, void **now, size_t *nlen, char *err,
                         size_t errlen)
try {
    auto v = store_of(user).compareSet(key, bytes(expected, elen), bytes(desired, dlen));
    return copy_out(v, now, nlen, err, errlen);
} catch (const std::exception &e) {
    return failed(e, "compare_set", err, errlen);
}

dt_status op_delete(void *user, const char *key, bool *deleted, char *err, size_t errlen)
try {
    *deleted = store_of(user).deleteKey(key);
    return DT_OK;
} catch (const std::exception &e) {
    return failed(e, "delete", err, errlen);
}

dt_status op_num_keys(void *user, int64_t *n, char *err, size_t errlen)
try {
    *n = store_of(user).getNumKeys();
    return DT_OK;
} catch (const std::exception &e) {
    return failed(e, "num_keys", err, errlen);
}

const dt_store_ops table = {op_set, op_get,         op_wait,   op_check,
                            op_add, op_compare_set, op_delete, op_num_keys};

} // namespace

const dt_store_ops *store_ops()
{
    return &table;
}

} // namespace dtrain_torch
