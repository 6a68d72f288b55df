/*
 * comm.c — a communicator's life: join the job, fail loudly, leave cleanly.
 *
 * dt_comm_init, in order:
 *   1. open the rendezvous store (file:///tmp/NAME, keys scoped by job id);
 *   2. agree on the handshake key: the job secret the launcher handed us,
 *      or one rank 0 makes and publishes in the store (a 0600 file);
 *   3. start the communicator thread, listen on host:0, publish "addr/<rank>";
 *   4. read every rank's address (with a job marker, naming at once a rank
 *      that joined with another secret: job_marker.c); dial the lower ranks,
 *      accept the higher ones (handshake.c); wait until all world_size-1 peers are
 *      authenticated, or the init deadline passes.
 * Cost: O(p) store reads and p-1 handshakes per rank, once.
 * dt_comm_split (group.c) makes a communicator the same way, with the
 * addresses from an all-gather on its parent instead of the store.
 *
 * Every step that fails records the failure once (comm_fail, fail.c): the
 * first error names the root cause, and every later op returns it.
 * dt_comm_abort is the same path with DT_EABORTED, from any thread.
 * dt_comm_destroy leaves the communicator's family first (family.c), so no
 * failure of a related group reaches it while it is being taken apart.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"
#include "staging.h"
#include "store_internal.h"

#define DEFAULT_TIMEOUT_S 30.0
#define DEFAULT_PROGRESS_TIMEOUT_S 1800.0 /* torch's gloo default */
#define DEFAULT_INIT_TIMEOUT_S 60.0

static char *dup_or(const char *s, const char *fallback)
{
    return strdup(s ? s : fallback);
}

/* What the rooms below report up through (report.h): the communicator's own
 * failure, log and family, handed down rather than called up. */
static const comm_report report = {
    .fail = comm_fail,
    .fail_deferred = comm_fail_deferred,
    .failure_locked = comm_fail_status_locked,
    .first_unfinished_locked = comm_fail_first_unfinished_locked,
    .in_op_locked = comm_fail_in_op_locked,
    .log = comm_log,
    .label_peer = comm_family_label_peer,
    .wake_thread = comm_wake_thread,
    .work_done_locked = comm_wake_work_done,
};

/* What the transport and the staging are handed, once the options are read
 * (the table, the owner and the lock come first, in comm_setup): copies of
 * what they read of the communicator, which never changes after this; then
 * the transport's per-peer arrays. */
static dt_status hand_down(dt_comm *c)
{
    dt_transport *t = &c->tp;
    t->rank = c->rank;
    t->size = c->size;
    t->timeout_s = c->timeout_s;
    t->progress_timeout_s = c->progress_timeout_s;
    t->init_timeout_s = c->init_timeout_s;
    t->socket_buffer = c->socket_buffer;
    t->host = c->host;
    dt_stager *s = &c->stager;
    s->rank = c->rank;
    s->size = c->size;
    s->timeout_s = c->timeout_s;
    return comm_transport_alloc(t);
}

/* Everything that cannot fail for reasons outside this process. */
dt_status comm_setup(dt_comm *c, const dt_comm_options *o)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv_api, &attr);
    pthread_cond_init(&c->cv_thread, &attr);
    pthread_condattr_destroy(&attr);
    comm_transport_init(&c->tp, c, &report, &c->mu, &c->cv_api);
    c->stager = (dt_stager){.report = &report, .owner = c, .mu = &c->mu};
    atomic_init(&c->gloo_turn, false);
    c->rank = o->rank;
    c->size = o->world_size;
    if (o->world_size < 1 || o->rank < 0 || o->rank >= o->world_size) {
        comm_fail(c, DT_EINVAL,
                  "rank %d of world size %d: the rank must be in 0..size-1 "
                  "and the size at least 1",
                  o->rank, o->world_size);
        return DT_EINVAL;
    }
    if (o->world_size > 1 && !o->init_url && !o->store) {
        comm_fail(c, DT_EINVAL,
                  "rank %d: no init_url: set it to file:///tmp/NAME (or run "
                  "under dtrain-launch, which sets DT_INIT_URL)",
                  o->rank);
        return DT_EINVAL;
    }
    c->timeout_s = o->timeout_s > 0 ? o->timeout_s : DEFAULT_TIMEOUT_S;
    c->progress_timeout_s = o->progress_timeout_s > 0 ? o->progress_timeout_s
                                                      : DEFAULT_PROGRESS_TIMEOUT_S;
    c->init_timeout_s = o->init_timeout_s > 0 ? o->init_timeout_s : DEFAULT_INIT_TIMEOUT_S;
    c->socket_buffer = o->socket_buffer;
    c->gloo_wire = o->wire == DT_WIRE_GLOO;
    c->log = o->log;
    c->log_user = o->log_user;
    c->stager.device = o->device;
    c->job_id = o->job_id ? strdup(o->job_id) : comm_env_default_job_id();
    if (o->ifname) {
        c->host = comm_host_address_of_interface(o->ifname);
        if (!c->host) {
            comm_fail(c, DT_EINVAL,
                      "rank %d: network interface '%s' has no IPv4 address, "
                      "or is not up and running (see `ip addr`)",
                      o->rank, o->ifname);
            return DT_EINVAL;
        }
    } else if (o->host) {
        c->host = strdup(o->host);
    } else {
        c->host = comm_host_address_toward_store(o->init_url);
        if (!c->host)
            c->host = strdup("127.0.0.1");
    }
    c->init_url = dup_or(o->init_url, "");
    if (!c->job_id || !c->host || !c->init_url || hand_down(c) != DT_OK) {
        comm_fail(c, DT_ENOMEM, "rank %d: out of memory", c->rank);
        return DT_ENOMEM;
    }
    if (sodium_init() < 0) {
        comm_fail(c, DT_ESYS, "rank %d: libsodium failed to initialise", c->rank);
        return DT_ESYS;
    }
    crypto_generichash(c->tp.job_hash, sizeof c->tp.job_hash, (const uint8_t *)c->job_id,
                       strlen(c->job_id), NULL, 0);
    return DT_OK;
}

static dt_status store_failed(dt_comm *c, dt_status st, const char *doing)
{
    comm_fail(c, st == DT_ETIMEDOUT ? DT_ETIMEDOUT : DT_ESTORE, "rank %d: %s: %s", c->rank, doing,
              c->store ? dt_store_error(c->store) : "out of memory");
    return st;
}

/* The handshake key: a hash of the job secret, from the options or the store. */
static dt_status agree_on_key(dt_comm *c, const dt_comm_options *o)
{
    uint8_t made[32];
    const uint8_t *secret = o->secret;
    size_t len = o->secret_len;
    void *got = NULL;
    if (!secret || len == 0) {
        dt_status st;
        /* a server anyone may read; the caller's store is the caller's call */
        if (!c->store_borrowed && strncmp(c->init_url, "file://", 7) != 0) {
            comm_fail(c, DT_EINVAL,
                      "rank %d: the %s store has no authentication, so the "
                      "job secret is not shared through it: give every rank the same "
                      "secret (o.secret, or DT_SECRET as hex)",
                      c->rank, c->init_url);
            return DT_EINVAL;
        }
        if (c->rank == 0) {
            randombytes_buf(made, sizeof made);
            st = dt_store_set(c->store, "secret", made, sizeof made);
            secret = made;
            len = sizeof made;
        } else {
            st = dt_store_get(c->store, "secret", &got, &len, c->init_timeout_s);
            secret = got;
        }
        if (st != DT_OK)
            return store_failed(c, st, "sharing the job secret");
    }
    crypto_generichash(c->tp.key, sizeof c->tp.key, secret, len, NULL, 0);
    sodium_memzero(made, sizeof made);
    free(got);
    return DT_OK;
}

static dt_status parse_address(dt_comm *c, int r, const char *val)
{
    int port = 0;
    char host[64] = "";
    if (sscanf(val, "%d %63s", &port, host) != 2 || port <= 0 || port > 65535) {
        comm_fail(c, DT_ESTORE, "rank %d: rank %d published a malformed address '%s'", c->rank, r,
                  val);
        return DT_ESTORE;
    }
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&c->tp.dial[r]) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&c->tp.dial[r]) != 0) {
        comm_fail(c, DT_ESTORE, "rank %d: rank %d published an unusable address '%s'", c->rank, r,
                  val);
        return DT_ESTORE;
    }
    snprintf(c->tp.peer_addr[r], sizeof c->tp.peer_addr[r], "%s:%d", host, port);
    return DT_OK;
}

/* Publish our address and learn everyone else's. */
/* Waits for rank r's address under key until the deadline; with a job
 * marker, in slices of COMM_MARKER_POLL_S, looking between them whether r joined
 * with another secret (job_marker.c: DT_EINVAL, c failed). */
static dt_status wait_for_address(dt_comm *c, int r, const char *key, void **got, size_t *len,
                                  double deadline, bool *named)
{
    *named = true; /* a first look before any wait: the peer may be long there */
    if (comm_marker_check(c, r) != DT_OK)
        return DT_EINVAL;
    *named = false;
    for (;;) {
        double left = deadline - dt_now();
        double slice = c->marker_store && left > COMM_MARKER_POLL_S ? COMM_MARKER_POLL_S : left;
        dt_status st = dt_store_get(c->store, key, got, len, slice > 0 ? slice : 0);
        if (st != DT_ETIMEDOUT || slice >= left)
            return st;
        if (comm_marker_check(c, r) != DT_OK)
            return *named = true, DT_EINVAL;
    }
}

static dt_status exchange_addresses(dt_comm *c, double deadline)
{
    char key[32], val[96];
    snprintf(key, sizeof key, "addr/%d", c->rank);
    snprintf(val, sizeof val, "%d %s", c->tp.port, c->host);
    snprintf(c->tp.peer_addr[c->rank], sizeof c->tp.peer_addr[c->rank], "%s:%d", c->host,
             c->tp.port);
    dt_status st = dt_store_set(c->store, key, val, strlen(val));
    if (st != DT_OK)
        return store_failed(c, st, "publishing this rank's address");
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank)
            continue;
        void *got = NULL;
        size_t len = 0;
        snprintf(key, sizeof key, "addr/%d", r);
        bool named;
        st = wait_for_address(c, r, key, &got, &len, deadline, &named);
        if (named) /* job_marker.c said why */
            return st;
        if (st == DT_ETIMEDOUT) {
            /* The store only knows the slice it was given; the person
             * needs the time since start-up began, and what sets it. */
            double waited = dt_now() - (deadline - c->init_timeout_s);
            comm_fail(c, DT_ETIMEDOUT,
                      "rank %d: waiting for rank %d to join: timed out after "
                      "%.1f s, the start-up deadline (DT_INIT_TIMEOUT, dtrain-launch "
                      "--init-timeout); is it running, with the same init URL and job id?",
                      c->rank, r, waited);
            return st;
        }
        if (st != DT_OK) {
            char doing[128];
            snprintf(doing, sizeof doing,
                     "waiting for rank %d to join (is it running, with "
                     "the same init URL and job id?)",
                     r);
            return store_failed(c, st, doing);
        }
        st = parse_address(c, r, got);
        free(got);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}

static dt_status comm_status(dt_comm *c)
{
    pthread_mutex_lock(&c->mu);
    dt_status st = c->failed ? c->fail_status : DT_OK;
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* ---- start-up failures, shared through the store ---------------------------
 *
 * Once the addresses are exchanged, a failure while the mesh forms (a peer
 * that fails authentication, a dial refused) is known only to the rank that
 * saw it; the others would wait out the start-up deadline for a connection
 * that never comes. So that rank publishes its error under STARTUP_FAILED
 * (the first to publish wins: compare_set on an absent key), and every rank
 * waiting for its mesh looks for it every STARTUP_POLL_S and fails with it,
 * in the words launcher/root_cause.c follows to the rank that failed. Every
 * rank that failed then counts itself in STARTUP_FAILED_SEEN, so rank 0,
 * when it hosts a tcp:// store, keeps it serving until every rank has read
 * the failure (at most STARTUP_LINGER_S). Timeouts are not published: every
 * rank reaches its own deadline anyway. A peer that left while the mesh
 * formed is a symptom: it may have failed first and closed its connections
 * before it published why, so such a rank waits up to STARTUP_SYMPTOM_WAIT_S
 * for the published cause before it reports the loss. Cost: one store check per rank per
 * 0.1 s while the mesh forms, which is usually no check at all. */
#define STARTUP_FAILED "startup-failed"
#define STARTUP_FAILED_SEEN "startup-failed-seen"
#define STARTUP_POLL_S 0.1
#define STARTUP_LINGER_S 2.0
#define STARTUP_SYMPTOM_WAIT_S 1.0
#define STARTUP_REPORTED "rank %d: rank %d (start-up) failed and reported: %s"

static void publish_startup_failure(dt_comm *c)
{
    char val[DT_ERROR_MAX + 16];
    pthread_mutex_lock(&c->mu);
    snprintf(val, sizeof val, "%d %s", c->rank, c->error);
    pthread_mutex_unlock(&c->mu);
    (void)dt_store_compare_set(c->store, STARTUP_FAILED, NULL, 0, val, strlen(val), NULL, NULL);
}

/* True if another rank published its start-up failure: it is now ours.
 * `instead`: this rank has failed already, only because a peer left while
 * the mesh formed; the published cause replaces that symptom (nothing has
 * read this rank's error yet: dt_comm_init has not returned), and it may
 * still be on its way, so wait for it a little. */
static bool peer_startup_failed(dt_comm *c, bool instead)
{
    const char *key = STARTUP_FAILED;
    bool there = false;
    void *got = NULL;
    size_t len = 0;
    if (!instead && (dt_store_check(c->store, &key, 1, &there) != DT_OK || !there))
        return false;
    if (dt_store_get(c->store, key, &got, &len,
                     instead ? STARTUP_SYMPTOM_WAIT_S : STARTUP_POLL_S) != DT_OK)
        return false;
    int rank = -1, used = 0;
    if (sscanf(got, "%d %n", &rank, &used) != 1) {
        rank = -1;
    } else if (instead) {
        pthread_mutex_lock(&c->mu);
        c->fail_status = DT_EPEER;
        snprintf(c->error, sizeof c->error, STARTUP_REPORTED, c->rank, rank, (char *)got + used);
        pthread_mutex_unlock(&c->mu);
    } else {
        comm_fail(c, DT_EPEER, STARTUP_REPORTED, c->rank, rank, (char *)got + used);
    }
    free(got);
    return rank >= 0;
}

/* rank 0, hosting the store, failed at start-up: serve until the others
 * have read why (or STARTUP_LINGER_S passes). */
static void linger_for_startup_readers(dt_comm *c)
{
    double until = dt_now() + STARTUP_LINGER_S;
    int64_t seen = 0;
    while (dt_store_add(c->store, STARTUP_FAILED_SEEN, 0, &seen) == DT_OK && seen < c->size &&
           dt_now() < until)
        nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
}

static dt_status wait_for_mesh(dt_comm *c, double deadline)
{
    bool reported = false; /* the failure is another rank's, read from the store */
    pthread_mutex_lock(&c->mu);
    while (!c->tp.mesh_ready && !c->failed && !reported && dt_now() < deadline) {
        double poll_at = dt_now() + STARTUP_POLL_S;
        comm_wake_wait_until(&c->cv_api, &c->mu, poll_at < deadline ? poll_at : deadline);
        if (c->tp.mesh_ready || c->failed)
            break;
        pthread_mutex_unlock(&c->mu);
        reported = c->store && peer_startup_failed(c, false); /* a split's group has no store */
        pthread_mutex_lock(&c->mu);
    }
    bool ready = c->tp.mesh_ready, failed = c->failed;
    int connected = c->tp.connected;
    dt_status why = c->fail_status;
    bool symptom = c->tp.lost_at_startup;
    pthread_mutex_unlock(&c->mu);
    if (c->store && failed && !reported && symptom) /* the peer that left may have said why */
        reported = peer_startup_failed(c, true);
    if (!ready && !failed)
        comm_fail(c, DT_ETIMEDOUT, "rank %d: only %d of %d peers connected within %.1f s", c->rank,
                  connected, c->size - 1, c->init_timeout_s);
    if (c->store && failed && !reported && why != DT_ETIMEDOUT)
        publish_startup_failure(c);
    if (c->store && (failed || !ready))
        (void)dt_store_add(c->store, STARTUP_FAILED_SEEN, 1, NULL);
    return ready && !failed ? DT_OK : comm_status(c);
}

/* From now on a blocking collective may run on its caller's thread. */
static dt_status init_finished(dt_comm *c)
{
    pthread_mutex_lock(&c->mu);
    c->init_done = true;
    pthread_mutex_unlock(&c->mu);
    comm_wake_thread(c);
    return DT_OK;
}

dt_status comm_connect_mesh(dt_comm *c, double deadline)
{
    if (c->size == 1)
        return init_finished(c);
    comm_mesh_connect(&c->tp);
    dt_status st = wait_for_mesh(c, deadline);
    return st == DT_OK ? init_finished(c) : st;
}

/* Rank 0 of a tcp:// or env:// job hosts the store when nobody else does
 * (store_host.c), until every rank has dialled (or the start fails). */
static void host_store(dt_comm *c)
{
    char where[320];
    if (c->rank != 0 || c->size == 1)
        return;
    c->store_server = comm_store_host_start(c->init_url, where, sizeof where);
    if (c->store_server)
        comm_log(c, "rank 0 hosts the rendezvous store at %s", where);
}

static void unhost_store(dt_comm *c)
{
    dt_store_server_stop(c->store_server);
    c->store_server = NULL;
}

/* The rendezvous store: the caller's (options.store), or the one init_url
 * names, hosted by rank 0 when it is a tcp:// one nobody serves. */
static dt_status open_store(dt_comm *c, const dt_comm_options *o)
{
    if (o->store) {
        c->store = o->store;
        c->store_borrowed = true;
        return DT_OK;
    }
    host_store(c);
    dt_status st = dt_store_open_within(&c->store, c->init_url, c->job_id, c->init_timeout_s);
    if (st != DT_OK)
        return store_failed(c, st, "opening the rendezvous store");
    if (o->keep_init_file)
        dt_store_keep_file(c->store);
    return DT_OK;
}

dt_status dt_comm_init(dt_comm **out, const dt_comm_options *o)
{
    dt_comm *c = calloc(1, sizeof *c);
    *out = c;
    if (!c)
        return DT_ENOMEM;
    dt_status st = comm_setup(c, o);
    if (st != DT_OK)
        return st;
    if (o->wire == DT_WIRE_GLOO && o->store) {
        comm_fail(c, DT_EINVAL,
                  "rank %d: the gloo wire opens its own store: leave options.store NULL", c->rank);
        return DT_EINVAL;
    }
    if (o->wire == DT_WIRE_GLOO) {
        host_store(c); /* served for the job's life, as torch's rank 0 does */
        return comm_gloo_wire_init(c, o);
    }
    if (c->size == 1) {
        st = comm_thread_start(c);
        return st == DT_OK ? comm_connect_mesh(c, 0) : st;
    }
    double deadline = dt_now() + c->init_timeout_s;
    if ((st = open_store(c, o)) != DT_OK)
        return st;
    if ((st = agree_on_key(c, o)) != DT_OK || (st = comm_marker_publish(c, o->job_marker)) != DT_OK)
        return st;
    if ((st = comm_thread_start(c)) != DT_OK)
        return st;
    if ((st = exchange_addresses(c, deadline)) != DT_OK)
        return st;
    st = comm_connect_mesh(c, deadline);
    comm_marker_close(c); /* every address is in: nobody is missing any more */
    if (st == DT_OK)      /* every rank has dialled, so none needs the store */
        unhost_store(c);
    if (c->store_borrowed) /* the caller's again */
        c->store = NULL;
    return st;
}

void dt_comm_destroy(dt_comm *c)
{
    if (!c)
        return;
    comm_family_detach(c); /* no failure reaches c through its groups any more */
    comm_thread_stop(c);
    comm_mesh_stop(&c->tp);
    comm_gloo_wire_destroy(c);     /* the thread that ran its ops is gone */
    comm_reject_log_flush(&c->tp); /* the loop thread is gone: its state is ours */
    if (c->store && c->store_server && c->failed)
        linger_for_startup_readers(c);
    comm_marker_close(c);
    if (c->store && !c->store_borrowed)
        dt_store_close(c->store);
    unhost_store(c);
    comm_staging_destroy(&c->stager);
    comm_transport_free(&c->tp);
    free(c->job_id);
    free(c->host);
    free(c->init_url);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv_api);
    pthread_cond_destroy(&c->cv_thread);
    comm_family_free(c);
    free(c);
}

void dt_comm_abort(dt_comm *c, const char *why)
{
    comm_fail(c, DT_EABORTED, "rank %d: aborted: %s", c->rank, why ? why : "dt_comm_abort");
}

int dt_comm_rank(const dt_comm *c)
{
    return c->rank;
}
int dt_comm_size(const dt_comm *c)
{
    return c->size;
}
int dt_comm_port(const dt_comm *c)
{
    return c->tp.port;
}

uint64_t dt_comm_rejected_connections(const dt_comm *c)
{
    return atomic_load(&((dt_comm *)c)->tp.rejected);
}

void dt_comm_traffic(const dt_comm *c, dt_traffic *out)
{
    dt_comm *m = (dt_comm *)c;
    uint64_t v[4];
    if (m->gloo) {
        comm_gloo_wire_traffic(m, v);
    } else {
        for (int i = 0; i < 4; i++)
            v[i] = atomic_load_explicit(&m->tp.traffic[i], memory_order_relaxed);
    }
    *out = (dt_traffic){v[0], v[1], v[2], v[3]};
}

const char *dt_comm_error(const dt_comm *c)
{
    dt_comm *m = (dt_comm *)c;
    pthread_mutex_lock(&m->mu);
    const char *e = m->failed ? m->error : m->arg_error;
    pthread_mutex_unlock(&m->mu);
    return e;
}
