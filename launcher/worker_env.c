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
 *   DT_JOB_MARKER      several nodes and a run id derived from the secret:
 *                      hex naming the job whatever the secret, so a node with
 *                      another DT_SECRET is named at once (job_marker.c in
 *                      collectives/); else empty
 *   DT_INIT_TIMEOUT    --init-timeout, when given (else inherited, if set)
 *   DT_TIMEOUT         --timeout, when given (else inherited, if set)
 *   DT_PROGRESS_TIMEOUT  --progress-timeout, when given (else inherited)
 *   DT_KEEP_INIT_FILE  1 if the --rdzv file was there before the launch: the
 *                      ranks leave it in place (the launcher removes only what
 *                      the run created), else 0
 *   DT_WIRE            --wire, when given (else inherited, if set)
 *   DT_PROGRESS        1 if the launcher's stdout is a terminal, else 0:
 *                      whether rank 0 may draw a progress bar ('\r' lines,
 *                      which output_prefix.c draws in place)
 *   MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE
 *                      for programs that meet through torch's env://:
 *                      with a tcp:// rendezvous, the store's host and port
 *                      and "True" (the store is up; rank 0 must not host
 *                      one), as torchrun's agent store; with the file://
 *                      rendezvous of one node (the default, --standalone),
 *                      127.0.0.1, a port that was free when the launcher
 *                      started, and "False" (rank 0 hosts its store there),
 *                      as torchrun --standalone gives a free local port;
 *                      with a file:// rendezvous across nodes, not set
 *                      (no node knows node 0's address): inherited, if set
 *
 * collectives/comm_env.c (dt_comm_options_from_env) is the reading side.
 * Everything else in the launcher's environment passes through unchanged;
 * any inherited value of a contract name is replaced, never duplicated.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "launch.h"

extern char **environ;

enum { ENV_SET = 28 };

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
    ours[n++] = entry("DT_JOB_MARKER", "%s", job->job_marker);
    ours[n++] = entry("DT_PROGRESS", "%d", isatty(STDOUT_FILENO) == 1);
    ours[n++] = entry("DT_KEEP_INIT_FILE", "%d", !job->owns_rendezvous_file);
    if (o->init_timeout_s > 0)
        ours[n++] = entry("DT_INIT_TIMEOUT", "%g", o->init_timeout_s);
    if (o->timeout_s > 0)
        ours[n++] = entry("DT_TIMEOUT", "%g", o->timeout_s);
    if (o->progress_timeout_s > 0)
        ours[n++] = entry("DT_PROGRESS_TIMEOUT", "%g", o->progress_timeout_s);
    if (job->master_port > 0) {
        ours[n++] = entry("MASTER_ADDR", "%s", job->master_addr);
        ours[n++] = entry("MASTER_PORT", "%d", job->master_port);
        ours[n++] = entry("TORCHELASTIC_USE_AGENT_STORE", "%s",
                          job->agent_store ? "True" : "False");
    }
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

/* A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick
 * for port 0); a later bind by someone else can still take it, as with
 * torchrun --standalone. */
static int free_local_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

int launch_env_choose_master(launch_job *job, const launch_options *o, char *err, size_t errlen)
{
    job->master_addr[0] = '\0';
    job->master_port = 0;
    job->agent_store = false;
    if (strncmp(job->init_url, "tcp://", 6) == 0) {
        const char *host = job->init_url + 6, *colon = strrchr(host, ':');
        size_t n = colon ? (size_t)(colon - host) : 0;
        if (n >= 2 && host[0] == '[' && host[n - 1] == ']') /* [v6]:port */
            host++, n -= 2;
        if (!colon || n == 0 || n >= sizeof job->master_addr)
            return 0; /* the store reports a malformed address itself */
        memcpy(job->master_addr, host, n);
        job->master_addr[n] = '\0';
        job->master_port = atoi(colon + 1);
        job->agent_store = true;
        return 0;
    }
    if (o->nnodes > 1)
        return 0;
    int port = free_local_port();
    if (port <= 0) {
        snprintf(err, errlen, "no free TCP port on 127.0.0.1 for MASTER_PORT");
        return -1;
    }
    snprintf(job->master_addr, sizeof job->master_addr, "127.0.0.1");
    job->master_port = port;
    return 0;
}
