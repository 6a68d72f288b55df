/*
 * launch.h — internal: the pieces of dtrain-launch and how they fit.
 *
 * dtrain-launch is a process-group supervisor in the spirit of torchrun
 * (torch.distributed.run / TorchElastic's local agent): it starts N copies of
 * a program on this node, tells each who it is through the environment,
 * relays their output with a rank prefix, and treats the group as one unit —
 * if one worker fails, the whole group is stopped, because a collective job
 * with a missing rank can only hang or fail. It can then start the group
 * again (elastic restarts without membership changes).
 *
 * One concept per file:
 *   launch_options.c  the flags: one table that parses and prints the usage
 *   launch_job.c      the job's identity: run id, rendezvous URL, secret
 *   worker_env.c      the environment contract a worker reads
 *   worker_exec.c     between fork and exec: a worker dies with the launcher
 *   output_prefix.c   rank-prefixed, line-atomic relaying of output, log tee,
 *                     and the ring of last lines kept for the failure report
 *   worker_exit.c     how a worker ended, in words
 *   worker_group.c    spawning, watching and stopping one group (libuv)
 *   blame_line.c      the world rank a line of output says failed first
 *   root_cause.c      the verdict on a failed group: whose failure it was
 *   launch_main.c     signals, the restart loop and the exit code
 *
 * Everything hangs off structs owned by main; nothing here is global.
 */
#ifndef DT_LAUNCH_H
#define DT_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include <uv.h>

/* ---- launch_options.c ------------------------------------------------------ */

typedef struct launch_options {
    int nproc_per_node;        /* -n: workers on this node, >= 1 */
    int nnodes;                /* nodes in the job, >= 1 */
    int node_rank;             /* this node, 0 .. nnodes-1; -1 until given */
    const char *rdzv;          /* rendezvous URL; NULL = a fresh file per job */
    const char *master_addr;   /* --master-addr: with master_port, rdzv = tcp://A:P */
    int master_port;           /* 0 = not given */
    const char *rdzv_endpoint; /* --rdzv-endpoint HOST:PORT: rdzv = tcp://HOST:PORT */
    char rdzv_tcp[320];        /* the tcp:// URL the three above make */
    const char *run_id;        /* NULL = random (one node) or derived from the secret */
    int max_restarts;          /* group restarts after a failure */
    const char *log_dir;       /* NULL = no per-rank log files */
    double grace_s;            /* SIGTERM -> SIGKILL delay */
    double init_timeout_s;     /* DT_INIT_TIMEOUT for the workers; 0 = not set */
    double timeout_s;          /* DT_TIMEOUT (liveness) for the workers; 0 = not set */
    double progress_timeout_s; /* DT_PROGRESS_TIMEOUT for the workers; 0 = not set */
    const char *wire;          /* DT_WIRE for the workers ("dtrain", "gloo"); NULL = not set */
    bool help;
    /* torchrun's flags with nothing or little to do here (launch_options.c) */
    bool standalone;           /* one node, a fresh rendezvous: no --rdzv/--nnodes > 1 */
    bool no_python;            /* accepted: PROGRAM is always executed directly */
    const char *rdzv_backend;  /* c10d or static (a TCP store), or NULL */
    int tee;                   /* streams (1 stdout, 2 stderr) copied to --log-dir; -1 = unset */
    int redirects;             /* streams sent to --log-dir only, not to our own output */
    double monitor_interval_s; /* accepted: workers are watched by events, not polled */
    char **program;            /* PROGRAM ARGS..., NULL-terminated, points into argv */
} launch_options;

typedef enum launch_parse {
    LAUNCH_PARSE_OK,
    LAUNCH_PARSE_HELP,  /* --help: print the usage, exit 0 */
    LAUNCH_PARSE_ERROR, /* message in err: print it, exit 2 */
} launch_parse;

launch_parse launch_options_parse(launch_options *out, int argc, char **argv, char *err,
                                  size_t errlen);
void launch_options_usage(FILE *f);

/* Whether stream `fd` (1 stdout, 2 stderr) of a worker goes to its log
 * file, and to the launcher's own stdout/stderr (--tee, --redirects). */
bool launch_options_logs_stream(const launch_options *o, int fd);
bool launch_options_shows_stream(const launch_options *o, int fd);

/* ---- launch_job.c ---------------------------------------------------------- */

#define LAUNCH_SECRET_BYTES 32
#define LAUNCH_URL_MAX 4200

typedef struct launch_job {
    char run_id[72];                              /* hex, or the user's --run-id */
    char init_url[LAUNCH_URL_MAX];                /* file:///... */
    char secret_hex[2 * LAUNCH_SECRET_BYTES + 1]; /* handed to workers as DT_SECRET */
    char job_marker[33];                          /* DT_JOB_MARKER: hex, or "" (launch_job.c) */
    bool owns_rendezvous_file;                    /* this run made the file: remove it */
    char master_addr[256];                        /* MASTER_ADDR for the workers, or "" */
    int master_port;                              /* MASTER_PORT, or 0 */
    bool agent_store;                             /* the store at MASTER_ADDR:PORT exists */
} launch_job;

/* Returns 0, or -1 with a message in err (a usage problem: exit 2). */
int launch_job_init(launch_job *out, const launch_options *o, char *err, size_t errlen);
/* Removes the rendezvous file this run created, if a failed or interrupted
 * group left it. */
void launch_job_cleanup(const launch_job *job);
/* Removes the rendezvous files of /tmp/dtrain-<run id> that launches killed
 * outright left, once no live process holds them. */
void launch_job_sweep(const launch_job *job);

/* ---- rdzv_watch.c ---------------------------------------------------------- */

/* Starts the watcher that removes the rendezvous file this run made once
 * the launcher is gone by any means (SIGKILL included) and no live process
 * holds the file. Call before any worker starts. */
void launch_rdzv_watch(const launch_job *job);

/* ---- worker_env.c ---------------------------------------------------------- */

/* The environment of local worker `local_rank` in group attempt `restart`:
 * the launcher's own environment with the contract's names replaced. NULL on
 * out-of-memory; free with launch_env_free. */
char **launch_env_build(const launch_options *o, const launch_job *job, int local_rank,
                        int restart);
void launch_env_free(char **env);
/* Chooses the MASTER_ADDR/MASTER_PORT the workers get (worker_env.c says
 * which); 0, or -1 with err when no free port can be found. */
int launch_env_choose_master(launch_job *job, const launch_options *o, char *err, size_t errlen);

/* ---- worker_exec.c --------------------------------------------------------- */

/* argv[1] of the launcher re-executed between fork and exec of a worker. */
#define LAUNCH_EXEC_MODE "--exec-worker-with-parent-death-signal"

/* PATH lookup as execvp does it: 0 and the path, or UV_ENOENT / UV_EACCES. */
int launch_exec_find(const char *name, char *path, size_t len);
/* The argv that runs o->program at `path` through launch_exec_worker (the
 * file to exec is /proc/self/exe). NULL on out-of-memory. */
char **launch_exec_args(const launch_options *o, const char *path);
void launch_exec_args_free(char **args);
/* main() of the hidden mode: set the parent-death signal, exec the worker. */
int launch_exec_worker(int argc, char **argv);

/* ---- output_prefix.c ------------------------------------------------------- */

#define OUTPUT_TAIL_LINES 8
#define OUTPUT_TAIL_WIDTH 1024 /* longer lines keep their start and end */

/* The last lines a rank printed (both streams), for the failure report. */
typedef struct output_tail {
    char lines[OUTPUT_TAIL_LINES][OUTPUT_TAIL_WIDTH];
    int next;  /* slot the next line goes to */
    int count; /* lines held, <= OUTPUT_TAIL_LINES */
} output_tail;

/* One stream (stdout or stderr) of one rank. */
typedef struct output_stream {
    int rank;
    int out_fd;        /* 1 or 2; -1 once writing failed (reader went away) */
    int log_fd;        /* per-rank log file, or -1 */
    output_tail *tail; /* shared by the rank's two streams */
    char *partial;     /* bytes after the last newline seen */
    size_t len, cap;
    bool tty;       /* out_fd is a terminal: '\r' status lines are drawn */
    bool transient; /* partial began after a '\r': a status line */
} output_stream;

void launch_output_init(output_stream *s, int rank, int out_fd, int log_fd, output_tail *tail);
void launch_output_feed(output_stream *s, const char *data, size_t n);
/* End of stream: a last line without its newline is printed with one. */
void launch_output_finish(output_stream *s);
void launch_output_free(output_stream *s);
void launch_output_tail_print(const output_tail *t, int rank, FILE *f);
bool launch_output_tail_mentions(const output_tail *t, const char *needle);

/* ---- worker_group.c -------------------------------------------------------- */

typedef enum group_result {
    GROUP_SUCCEEDED,    /* every worker exited 0 */
    GROUP_FAILED,       /* a worker failed first: the root cause */
    GROUP_INTERRUPTED,  /* the launcher got SIGINT/SIGTERM/SIGHUP */
    GROUP_SPAWN_FAILED, /* the program could not be started: no point restarting */
} group_result;

typedef struct worker_group worker_group;

/* Spawns the group on `loop`; uv_run(loop) returns once every worker has
 * exited and its output is drained. Returns NULL (with err) if nothing could
 * be set up at all; a spawn failure of one worker is a GROUP_SPAWN_FAILED
 * outcome instead. */
worker_group *launch_group_start(uv_loop_t *loop, const launch_options *o, const launch_job *job,
                                 int restart, char *err, size_t errlen);
/* The launcher was asked to stop: TERM everyone; a second call sends KILL. */
void launch_group_interrupt(worker_group *g, int signum);
/* After uv_run: the result, the launcher's exit code for it, and the root
 * cause report on stderr. */
group_result launch_group_finish(worker_group *g, int *exit_code);
void launch_group_free(worker_group *g);

/* The state worker_group.c keeps and root_cause.c reads. */
typedef struct worker {
    worker_group *group;
    int local_rank, rank;
    uv_process_t proc;
    uv_pipe_t pipes[2]; /* the worker's stdout, stderr */
    output_stream streams[2];
    output_tail tail;
    int log_fd;
    char **env;
    char **args;  /* launch_exec_args */
    bool running; /* spawned and not yet reaped */
    bool pipe_open[2];
    int64_t exit_status;
    int term_signal;
    int spawn_error;         /* libuv error from uv_spawn, or 0 */
    uint64_t last_output_ms; /* uv_now of its last output, or of its start */
    bool stopped;            /* in state T (SIGSTOP) when the first failure came */
    bool ignored_term;       /* still running when the grace period ended */
    unsigned signalled;      /* 1u << SIG for each signal the launcher sent it alive */
} worker;

struct worker_group {
    uv_loop_t *loop;
    const launch_options *opts;
    int restart;
    int n;
    worker *workers;
    uv_timer_t grace_timer; /* SIGTERM -> SIGKILL */
    uv_timer_t drain_timer; /* all exited -> stop waiting for EOF */
    bool timers_closing;
    int running, open_pipes;
    bool stopping;             /* SIGTERM sent */
    bool killed;               /* SIGKILL sent */
    int interrupted_by;        /* the launcher's signal, or 0 */
    worker *first_failure;     /* the first worker to fail, or NULL */
    uint64_t first_failure_ms; /* uv_now when it was reaped */
};

/* ---- worker_exit.c --------------------------------------------------------- */

/* "exited with code 3", "was killed by signal 9 (SIGKILL)", ... */
void launch_worker_describe_exit(const worker *w, char *buf, size_t len);
const char *launch_signal_name(int sig);

/* ---- blame_line.c ---------------------------------------------------------- */

/* The world rank the innermost "rank K (...) failed and reported:" or
 * "rank K died or its process was killed" of a line names (a group's
 * message names K's world rank in the parenthesis), or -1. */
int launch_blamed_rank(const char *line);

/* ---- root_cause.c ---------------------------------------------------------- */

/* Prints the verdict on a group whose first_failure is set. */
void launch_root_cause_report(const worker_group *g);

#endif
