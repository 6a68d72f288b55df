/*
 * sha256.c — the one place that decides how the checkpoint layer computes
 * SHA-256: OpenSSL's libcrypto, through EVP_Digest* with EVP_sha256().
 *
 * Why OpenSSL. Every byte of a checkpoint is hashed on save and on load,
 * so the hash sets the speed limit of both. libcrypto picks at run time
 * the fastest code the CPU has (the SHA extensions on x86-64 and ARMv8:
 * ~1.4 GB/s a core here), about 4.5x libsodium's portable C, which made
 * saving CPU-bound. The format does not change: it is the same SHA-256
 * (tests/test_checkpoint.c pins it against libsodium and FIPS 180 vectors).
 * libsodium stays where it is for the handshake's HMAC and the secrets.
 *
 * Interface. ckpt_sha256_new / _update / _final / _free for streams (a
 * shard written or read chunk by chunk) and dt_ckpt_sha256 for one buffer.
 * An EVP context is heap-allocated and opaque, hence new/free instead of a
 * struct on the stack. A failure inside OpenSSL (out of memory, a provider
 * refusing the algorithm) is remembered by the stream and reported by
 * _final, so call sites check once.
 *
 * Cost: one small allocation per stream; EVP_DigestUpdate adds a few
 * nanoseconds per call, nothing against the MiB-sized chunks used here.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>

#include "ckpt_internal.h"

struct ckpt_sha256 {
    EVP_MD_CTX *ctx;
    bool failed; /* an OpenSSL call failed; _final reports it */
};

ckpt_sha256 *ckpt_sha256_new(void)
{
    ckpt_sha256 *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->ctx = EVP_MD_CTX_new();
    if (!h->ctx || EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) != 1) {
        ckpt_sha256_free(h);
        return NULL;
    }
    return h;
}

void ckpt_sha256_update(ckpt_sha256 *h, const void *data, size_t n)
{
    if (!h->failed && n > 0 && EVP_DigestUpdate(h->ctx, data, n) != 1)
        h->failed = true;
}

bool ckpt_sha256_final(ckpt_sha256 *h, unsigned char out[32])
{
    unsigned int len = 0;
    if (h->failed || EVP_DigestFinal_ex(h->ctx, out, &len) != 1 || len != 32)
        h->failed = true;
    return !h->failed;
}

void ckpt_sha256_free(ckpt_sha256 *h)
{
    if (!h)
        return;
    EVP_MD_CTX_free(h->ctx);
    free(h);
}

dt_status dt_ckpt_sha256(unsigned char out[32], const void *data, size_t n)
{
    unsigned int len = 0;
    if (EVP_Digest(data, n, out, &len, EVP_sha256(), NULL) != 1 || len != 32)
        return DT_ENOMEM;
    return DT_OK;
}

/* Whether the CPU has SHA-256 instructions, which libcrypto then uses
 * (CPUID leaf 7, EBX bit 29 on x86-64; unknown elsewhere). */
static const char *cpu_sha_extensions(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return (b & (1u << 29)) ? "yes" : "no";
    return "no";
#else
    return "unknown";
#endif
}

const char *dt_ckpt_sha256_impl(char *out, size_t cap)
{
    snprintf(out, cap, "SHA-256 by %s, EVP_sha256(); CPU SHA extensions: %s",
             OpenSSL_version(OPENSSL_VERSION), cpu_sha_extensions());
    return out;
}
