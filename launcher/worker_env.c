/*
 * worker_env.c — the environment contract: how a worker learns who it is.
 *
 * A worker is an ordinary program; everything it needs to join the job
 * arrives in its environment, under torchrun's names so code written for
 * PyTorch reads the same variables:
 *
 *   RANK               global rank, node_rank * N + local_rank
 *   LOCAL_RANK         0 .. N-1 on this node (e.g. which GPU to use)
 *   WORLD_SIZE         N * nnodes
 *   LOCAL_WORLD_SIZE   N
 *   GROUP_RANK         this node's index (torchrun: the agent's rank)
 *   GROUP_WORLD_SIZE   nnodes
 *   ROLE_RANK, ROLE_WORLD_SIZE       = RANK, WORLD_SIZE (one role: "default")
 *   TORCHELASTIC_RESTART_COUNT, DT_RESTART_COUNT   0 on the first attempt
 *   TORCHELASTIC_MAX_RESTARTS       --max-restarts
 *   TORCHELASTIC_RUN_ID             the run id
 *   DT_JOB_ID          <run id>-r<restart>: scopes rendezvous keys per attempt
 *   DT_INIT_URL        the rendezvous URL
 *   DT_SECRET          the job secret, 64 hex digits
 *   DT_INIT_TIMEOUT    --init-timeout, when given (else inherited, if set)
 *   DT_WIRE            --wire, when given (else inherited, if set)
 *   DT_PROGRESS        1 if the launcher's stdout is a terminal, else 0:
 *                      whether rank 0 may draw a progress bar ('\r' lines,
 *                      which output_prefix.c draws in place)
 *
 * collectives/comm_env.c (dt_comm_options_from_env) is the reading side.
 * Everything else in the launcher's environment passes through unchanged;
 * any inherited value of a contract name is replaced, never duplicated.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch.h"

extern char **environ;

enum { ENV_SET = 20 };

static bool is_contract_name(const char *entry, char *const *ours, int n)
{
    for (int i = 0; i < n; i++) {
        size_t len = strcspn(ours[i], "=");
        if (!strncmp(entry, ours[i], len) && entry[len] == '=')
            return true;
    }
    return false;
}

static char *entry(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static char *entry(const char *name, const char *fmt, ...)
{
    char value[LAUNCH_URL_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof value, fmt, ap);
    va_end(ap);
    size_t n = strlen(name) + strlen(value) + 2;
    char *e = malloc(n);
    if (e)
        snprintf(e, n, "%s=%s", name, value);
    return e;
}

char **launch_env_build(const launch_options *o, const launch_job *job, int local_rank, int restart)
{
    int world = o->nproc_per_node * o->nnodes;
    int rank = o->node_rank * o->nproc_per_node + local_rank;
    char *ours[ENV_SET];
    int n = 0;
    ours[n++] = entry("RANK", "%d", rank);
    ours[n++] = entry("LOCAL_RANK", "%d", local_rank);
    ours[n++] = entry("WORLD_SIZE", "%d", world);
    ours[n++] = entry("LOCAL_WORLD_SIZE", "%d", o->nproc_per_node);
    ours[n++] = entry("GROUP_RANK", "%d", o->node_rank);
    ours[n++] = entry("GROUP_WORLD_SIZE", "%d", o->nnodes);
    ours[n++] = entry("ROLE_RANK", "%d", rank);
    ours[n++] = entry("ROLE_WORLD_SIZE", "%d", world);
    ours[n++] = entry("TORCHELASTIC_RESTART_COUNT", "%d", restart);
    ours[n++] = entry("DT_RESTART_COUNT", "%d", restart);
    ours[n++] = entry("TORCHELASTIC_MAX_RESTARTS", "%d", o->max_restarts);
    ours[n++] = entry("TORCHELASTIC_RUN_ID", "%s", job->run_id);
    ours[n++] = entry("DT_JOB_ID", "%s-r%d", job->run_id, restart);
    ours[n++] = entry("DT_INIT_URL", "%s", job->init_url);
    ours[n++] = entry("DT_SECRET", "%s", job->secret_hex);
    ours[n++] = entry("DT_PROGRESS", "%d", isatty(STDOUT_FILENO) == 1);
    if (o->init_timeout_s > 0)
        ours[n++] = entry("DT_INIT_TIMEOUT", "%g", o->init_timeout_s);
    if (o->wire)
        ours[n++] = entry("DT_WIRE", "%s", o->wire);

    size_t inherited = 0;
    while (environ[inherited])
        inherited++;
    char **env = calloc(inherited + (size_t)n + 1, sizeof *env);
    bool ok = env != NULL;
    for (int i = 0; i < n; i++)
        ok = ok && ours[i];
    if (!ok) {
        for (int i = 0; i < n; i++)
            free(ours[i]);
        free(env);
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < inherited; i++)
        if (!is_contract_name(environ[i], ours, n))
            env[k++] = strdup(environ[i]);
    for (int i = 0; i < n; i++)
        env[k++] = ours[i];
    env[k] = NULL;
    for (size_t i = 0; i < k; i++) {
        if (env[i])
            continue;
        for (size_t j = 0; j < k; j++)
            free(env[j]);
        free(env);
        return NULL;
    }
    return env;
}

void launch_env_free(char **env)
{
    if (!env)
        return;
    for (char **p = env; *p; p++)
        free(*p);
    free(env);
}
