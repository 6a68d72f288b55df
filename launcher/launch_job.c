/*
 * launch_job.c — the job's identity: run id, rendezvous URL and secret.
 *
 * Three values tie a job's ranks together and keep strangers out:
 *   - the run id names the job (torchrun's TORCHELASTIC_RUN_ID). Ranks scope
 *     their rendezvous keys by it, so a leftover file from another job is
 *     invisible to this one. Each restart appends "-r<k>" to make the job id
 *     ranks use (worker_env.c), so a restarted group never reads the keys of
 *     the group it replaces.
 *   - the rendezvous URL is where ranks meet: by default a fresh
 *     file:///tmp/dtrain-<run id>, so two jobs on one machine never share it.
 *     The launcher removes the file when it exits if the run created it: the
 *     default name always, a --rdzv file only if nothing was at that path
 *     when the launcher started (a file that was there is the user's). A
 *     launcher killed outright cannot: its watcher does (rdzv_watch.c), and
 *     the next launch sweeps the default names as well.
 *   - the secret (32 random bytes, hex in DT_SECRET) keys the challenge-
 *     response every connection runs, so only this job's ranks can join.
 *
 * One node: all three are made here, with libsodium's CSPRNG. Several nodes:
 * every node's launcher must hand out the same values, but launchers do not
 * talk to each other. So --rdzv is required, the secret comes from the
 * launcher's own DT_SECRET (the user generates it once and exports it on
 * every node), and the run id is derived from the secret (a BLAKE2b hash)
 * unless --run-id names it. The derived id is the same on every node and
 * reveals nothing about the secret. But a node given another DT_SECRET
 * derives another id, and would wait out the start-up deadline for peers
 * it can never see; so such a job also gets a job marker that does not
 * depend on the secret (a hash of the rendezvous URL and the node count),
 * under which the ranks compare fingerprints of their secrets and name a
 * mismatch at once: "DT_SECRET differs" (collectives/job_marker.c).
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "dt_comm.h"
#include "launch.h"

#define RUN_ID_BYTES 8

static int secret_from_env(uint8_t *secret, char *err, size_t errlen)
{
    const char *hex = getenv("DT_SECRET");
    size_t len = 0;
    if (!hex || !*hex) {
        snprintf(err, errlen,
                 "a multi-node job needs one secret shared by every node: run "
                 "`export DT_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')` "
                 "once, and start dtrain-launch on each node with that same DT_SECRET");
        return -1;
    }
    if (strlen(hex) != 2 * LAUNCH_SECRET_BYTES ||
        sodium_hex2bin(secret, LAUNCH_SECRET_BYTES, hex, strlen(hex), NULL, &len, NULL) != 0 ||
        len != LAUNCH_SECRET_BYTES) {
        snprintf(err, errlen, "DT_SECRET must be %d hex digits (%d bytes)", 2 * LAUNCH_SECRET_BYTES,
                 LAUNCH_SECRET_BYTES);
        return -1;
    }
    return 0;
}

static int run_id_from_user(launch_job *job, const char *id, char *err, size_t errlen)
{
    size_t n = strlen(id);
    if (n >= sizeof job->run_id - 16 || strspn(id, "abcdefghijklmnopqrstuvwxyz"
                                                   "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.") != n) {
        snprintf(err, errlen, "--run-id '%s': use up to %zu letters, digits, '_' or '.'", id,
                 sizeof job->run_id - 17);
        return -1;
    }
    memcpy(job->run_id, id, n + 1);
    return 0;
}

/* The job's name whatever its secret: BLAKE2b of the rendezvous URL and
 * the node count, as every node's launcher is given them. */
static void job_marker(launch_job *job, const launch_options *o)
{
    static const uint8_t context[] = "dtrain-launch job marker";
    char shape[32];
    uint8_t h[16];
    crypto_generichash_state st;
    snprintf(shape, sizeof shape, " %d nodes", o->nnodes);
    crypto_generichash_init(&st, NULL, 0, sizeof h);
    crypto_generichash_update(&st, context, sizeof context - 1);
    crypto_generichash_update(&st, (const uint8_t *)o->rdzv, strlen(o->rdzv));
    crypto_generichash_update(&st, (const uint8_t *)shape, strlen(shape));
    crypto_generichash_final(&st, h, sizeof h);
    sodium_bin2hex(job->job_marker, sizeof job->job_marker, h, sizeof h);
}

int launch_job_init(launch_job *job, const launch_options *o, char *err, size_t errlen)
{
    uint8_t secret[LAUNCH_SECRET_BYTES], id[RUN_ID_BYTES];
    *job = (launch_job){0};
    if (sodium_init() < 0) {
        snprintf(err, errlen, "libsodium failed to initialise");
        return -1;
    }
    if (o->nnodes > 1) {
        if (secret_from_env(secret, err, errlen) != 0)
            return -1;
        crypto_generichash(id, sizeof id, secret, sizeof secret, NULL, 0);
    } else {
        randombytes_buf(secret, sizeof secret);
        randombytes_buf(id, sizeof id);
    }
    sodium_bin2hex(job->secret_hex, sizeof job->secret_hex, secret, sizeof secret);
    sodium_memzero(secret, sizeof secret);
    if (o->run_id) {
        if (run_id_from_user(job, o->run_id, err, errlen) != 0)
            return -1;
    } else {
        sodium_bin2hex(job->run_id, sizeof job->run_id, id, sizeof id);
    }
    int n;
    if (o->nnodes > 1 && !o->run_id && o->rdzv)
        job_marker(job, o);
    if (o->rdzv) {
        n = snprintf(job->init_url, sizeof job->init_url, "%s", o->rdzv);
        struct stat st;
        job->owns_rendezvous_file = !strncmp(o->rdzv, "file://", 7) &&
                                    lstat(o->rdzv + 7, &st) != 0 && errno == ENOENT;
    } else {
        n = snprintf(job->init_url, sizeof job->init_url, "file:///tmp/dtrain-%s", job->run_id);
        job->owns_rendezvous_file = true;
    }
    if (n < 0 || (size_t)n >= sizeof job->init_url) {
        snprintf(err, errlen, "--rdzv: the URL is longer than %zu bytes", sizeof job->init_url - 1);
        return -1;
    }
    return 0;
}

/* True for "dtrain-" and RUN_ID_BYTES in hex: a name this launcher gives. */
static bool is_default_name(const char *name)
{
    const size_t hex = 2 * RUN_ID_BYTES;
    return strncmp(name, "dtrain-", 7) == 0 && strlen(name + 7) == hex &&
           strspn(name + 7, "0123456789abcdef") == hex;
}

/* A launcher killed outright (SIGKILL, the OOM killer) removes nothing: its
 * workers die with it (worker_exec.c) and its file:///tmp/dtrain-<run id>
 * stays. So each launch sweeps what dead launches left: every file under
 * /tmp with a name of ours is opened as a store and closed again. The
 * store does the judging (store.c): a file no live process holds that is
 * all store records is a dead job's and is emptied, then removed by the
 * close as its last holder; a live job's file is joined and left as it
 * is; anything else (another user's, not a store) is refused untouched. */
void launch_job_sweep(const launch_job *job)
{
    DIR *dir = opendir("/tmp");
    int removed = 0;
    struct dirent *e;
    while (dir && (e = readdir(dir))) {
        char url[300];
        struct stat st;
        snprintf(url, sizeof url, "file:///tmp/%s", e->d_name);
        if (!is_default_name(e->d_name) || strcmp(url, job->init_url) == 0)
            continue;
        dt_store *s = NULL;
        if (dt_store_open_within(&s, url, "dtrain-launch-sweep", 1.0) == DT_OK) {
            dt_store_close(s);
            removed += lstat(url + 7, &st) != 0 && errno == ENOENT;
        } else {
            dt_store_close(s);
        }
    }
    if (dir)
        closedir(dir);
    if (removed)
        fprintf(stderr,
                "dtrain-launch: removed %d rendezvous file%s that killed launches left in /tmp\n",
                removed, removed == 1 ? "" : "s");
}

/* Ranks remove the file when the last of them leaves cleanly; a group that
 * crashed or was interrupted leaves it behind. By the time this runs every
 * worker has exited. Only a regular file of ours is removed: whatever else
 * turned up at the path is not the store our ranks made. */
void launch_job_cleanup(const launch_job *job)
{
    if (!job->owns_rendezvous_file)
        return;
    const char *path = job->init_url + strlen("file://");
    struct stat st;
    if (lstat(path, &st) != 0)
        return; /* the ranks removed it */
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
        fprintf(stderr, "dtrain-launch: left %s alone: not a regular file of this user\n", path);
        return;
    }
    if (unlink(path) != 0 && errno != ENOENT)
        fprintf(stderr, "dtrain-launch: could not remove the rendezvous file %s: %s\n", path,
                strerror(errno));
}
