/*
 * comm_env.c — a rank's options: their defaults, and where a rank learns
 * who it is: the environment.
 *
 * dtrain-launch sets torchrun's names (RANK, WORLD_SIZE, ...) plus
 * DT_INIT_URL, DT_JOB_ID and DT_SECRET (hex). Programs started instead by
 * OpenMPI's mpirun (OMPI_COMM_WORLD_RANK/SIZE) or Slurm's srun
 * (SLURM_PROCID/SLURM_NTASKS) find their rank and size the same way; they
 * still need DT_INIT_URL (e.g. `mpirun -x DT_INIT_URL=file:///tmp/job`).
 * Optional: DT_HOST (address to listen on) or DT_IFNAME (an interface whose
 * IPv4 address to use, for multi-node jobs; without either, host_address.c
 * picks one), DT_TIMEOUT (the liveness limit: seconds a peer an op waits on
 * may stay silent, heartbeats included), DT_PROGRESS_TIMEOUT (the progress
 * limit: seconds an op waits for live peers to join it; dtrain-launch
 * --progress-timeout sets it),
 * DT_INIT_TIMEOUT (seconds for the whole start-up: rendezvous + connecting;
 * dtrain-launch --init-timeout sets it), DT_WIRE (dtrain, the default, or
 * gloo: torch 1.13's wire). Without DT_JOB_ID the job id comes
 * from the launcher's own (comm_env_default_job_id).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "comm_internal.h"
#include "dt_comm.h"
#include "dt_parse.h"

void dt_comm_options_default(dt_comm_options *o)
{
    memset(o, 0, sizeof *o);
    o->world_size = 1;
}

void comm_env_child_options(dt_comm_options *o, const dt_comm *parent, int rank, int size,
                            const char *job_id)
{
    dt_comm_options_default(o);
    o->rank = rank;
    o->world_size = size;
    o->init_url = parent->init_url;
    o->job_id = job_id;
    o->host = parent->host;
    o->timeout_s = parent->timeout_s;
    o->progress_timeout_s = parent->progress_timeout_s;
    o->init_timeout_s = parent->init_timeout_s;
    o->log = parent->log;
    o->log_user = parent->log_user;
}

static const char *first_env(const char *const *names, const char **which)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v) {
            *which = *names;
            return v;
        }
    }
    return NULL;
}

static dt_status env_int(const char *const *names, long lo, long hi, int *out, char *err,
                         size_t errlen)
{
    const char *which = NULL, *v = first_env(names, &which);
    if (!v) {
        snprintf(err, errlen,
                 "%s is not set: run under dtrain-launch, mpirun or srun, or set "
                 "it yourself",
                 names[0]);
        return DT_EINVAL;
    }
    if (!dt_parse_int(v, lo, hi, out)) {
        snprintf(err, errlen, "%s='%s' is not an integer in %ld..%ld", which, v, lo, hi);
        return DT_EINVAL;
    }
    return DT_OK;
}

/* A positive number of seconds from `name`, if it is set; *out unchanged if not. */
static dt_status env_seconds(const char *name, double *out, char *err, size_t errlen)
{
    const char *t = getenv(name);
    if (!t || !*t)
        return DT_OK;
    char *end;
    double v = strtod(t, &end);
    if (end == t || *end || !(v > 0) || !(v < 1e9)) {
        snprintf(err, errlen, "%s='%s' is not a positive number of seconds", name, t);
        return DT_EINVAL;
    }
    *out = v;
    return DT_OK;
}

/* The job id a launcher's environment implies, for ranks started without
 * DT_JOB_ID: Open MPI's job id, else the PMIx namespace (mpirun, prterun),
 * else Slurm's job and step ("slurm-4242.0"), else "dtrain". Without it two
 * jobs that share DT_INIT_URL would both be "dtrain" and meet each other's
 * ranks. Malloc'd. */
char *comm_env_default_job_id(void)
{
    char id[256];
    const char *ompi = getenv("OMPI_MCA_ess_base_jobid"), *pmix = getenv("PMIX_NAMESPACE"),
               *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    if (ompi && *ompi)
        snprintf(id, sizeof id, "ompi-%s", ompi);
    else if (pmix && *pmix)
        snprintf(id, sizeof id, "pmix-%s", pmix);
    else if (job && *job)
        snprintf(id, sizeof id, "slurm-%s.%s", job, step && *step ? step : "batch");
    else
        snprintf(id, sizeof id, "dtrain");
    return strdup(id);
}

static dt_status env_secret(dt_comm_options *o, uint8_t *scratch, size_t len, char *err,
                            size_t errlen)
{
    const char *hex = getenv("DT_SECRET");
    if (!hex || !*hex)
        return DT_OK;
    size_t bin_len = 0;
    if (sodium_init() < 0 ||
        sodium_hex2bin(scratch, len, hex, strlen(hex), NULL, &bin_len, NULL) != 0 || bin_len == 0 ||
        bin_len * 2 != strlen(hex)) {
        snprintf(err, errlen, "DT_SECRET is not a hex string of at most %zu bytes", len);
        return DT_EINVAL;
    }
    o->secret = scratch;
    o->secret_len = bin_len;
    return DT_OK;
}

dt_status dt_comm_options_from_env(dt_comm_options *o, uint8_t *scratch, size_t scratch_len,
                                   char *err, size_t errlen)
{
    static const char *const rank_names[] = {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", NULL};
    static const char *const size_names[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS",
                                             NULL};
    dt_comm_options_default(o); /* whatever o held before, nothing of it is left */
    dt_status st = env_int(size_names, 1, 1 << 20, &o->world_size, err, errlen);
    if (st == DT_OK)
        st = env_int(rank_names, 0, o->world_size - 1, &o->rank, err, errlen);
    if (st != DT_OK)
        return st;
    o->init_url = getenv("DT_INIT_URL");
    if (o->world_size > 1 && (!o->init_url || !*o->init_url)) {
        snprintf(err, errlen,
                 "DT_INIT_URL is not set: run under dtrain-launch, or set it to "
                 "file:///tmp/NAME on every rank");
        return DT_EINVAL;
    }
    const char *job = getenv("DT_JOB_ID");
    if (job && *job)
        o->job_id = job;
    const char *host = getenv("DT_HOST");
    if (host && *host)
        o->host = host;
    const char *marker = getenv("DT_JOB_MARKER");
    if (marker && *marker)
        o->job_marker = marker;
    const char *keep = getenv("DT_KEEP_INIT_FILE");
    o->keep_init_file = keep && strcmp(keep, "1") == 0;
    const char *ifname = getenv("DT_IFNAME");
    if (ifname && *ifname)
        o->ifname = ifname;
    const char *wire = getenv("DT_WIRE");
    if (wire && *wire && strcmp(wire, "dtrain") != 0 && strcmp(wire, "gloo") != 0) {
        snprintf(err, errlen, "DT_WIRE is '%s': it must be dtrain or gloo", wire);
        return DT_EINVAL;
    }
    o->wire = wire && strcmp(wire, "gloo") == 0 ? DT_WIRE_GLOO : DT_WIRE_DTRAIN;
    if ((st = env_seconds("DT_TIMEOUT", &o->timeout_s, err, errlen)) != DT_OK ||
        (st = env_seconds("DT_PROGRESS_TIMEOUT", &o->progress_timeout_s, err, errlen)) != DT_OK ||
        (st = env_seconds("DT_INIT_TIMEOUT", &o->init_timeout_s, err, errlen)) != DT_OK)
        return st;
    return env_secret(o, scratch, scratch_len, err, errlen);
}
