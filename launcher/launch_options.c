/*
 * launch_options.c — dtrain-launch's flags: one table parses them and prints
 * the usage, so the two cannot disagree.
 *
 * Grammar: flags come first, then PROGRAM and its ARGS, which are passed on
 * untouched (so `dtrain-launch -n 4 ./minigpt -n 8` gives -n 8 to minigpt).
 * A flag takes its value as the next argument or after '=' (`--nnodes=2`,
 * and `-n4` for the one-letter form); `--` ends the flags explicitly. A
 * next argument that looks like a flag is refused as a value (`--log-dir
 * -n 2 ./prog` is a missing value, not a directory named -n); after '='
 * anything is a value. An unknown flag is named with the closest known
 * spelling ("did you mean --max-restarts?"). Words
 * join with '-' or '_' (dt_flags.h: --nproc_per_node is --nproc-per-node).
 * torchrun's names are used where they exist (--nproc-per-node, --nnodes,
 * --node-rank, --max-restarts; --rdzv-id as an alias of --run-id) so
 * muscle memory works, and torchrun's other common flags are accepted:
 * `torchrun --standalone --nproc_per_node=4 --no_python ./prog` runs as
 * typed. What dtrain does not do is refused by name (an elastic --nnodes
 * 1:4, --rdzv-backend etcd), never ignored in silence.
 *
 * Invariant after a successful parse: every number is inside its table
 * range, node_rank is set and < nnodes, a multi-node job names its
 * rendezvous, and PROGRAM is present. Problems are reported as one sentence
 * naming the flag and the accepted values; main prints it and exits 2, the
 * usual code for a usage error.
 */
#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "dt_flags.h"
#include "launch.h"

/* FLAG_NPROC is an integer or "auto"; FLAG_NODES an integer or torchrun's
 * MIN:MAX with MIN = MAX; FLAG_STREAMS torchrun's 0..3 (1 stdout, 2 stderr). */
typedef enum flag_kind {
    FLAG_INT,
    FLAG_SECONDS,
    FLAG_STRING,
    FLAG_SWITCH,
    FLAG_NPROC,
    FLAG_NODES,
    FLAG_STREAMS
} flag_kind;

typedef struct flag_spec {
    char letter;       /* one-letter form, or 0 */
    const char *name;  /* --name */
    const char *alias; /* torchrun's spelling, or NULL */
    const char *metavar;
    flag_kind kind;
    size_t offset; /* of the field in launch_options */
    double lo, hi; /* accepted range of numbers */
    const char *help;
} flag_spec;

#define FIELD(f) offsetof(launch_options, f)

static const flag_spec flags[] = {
    {'n', "nproc-per-node", NULL, "N", FLAG_NPROC, FIELD(nproc_per_node), 1, 4096,
     "workers to start on this node (default 1); auto: one per CPU\n"
     "core this launcher may use (torchrun's choice without GPUs)"},
    {0, "nnodes", NULL, "M", FLAG_NODES, FIELD(nnodes), 1, 4096,
     "nodes in the job; WORLD_SIZE = N x M (default 1); torchrun's\n"
     "M:M is M, an elastic MIN:MAX range is not supported"},
    {0, "node-rank", NULL, "K", FLAG_INT, FIELD(node_rank), 0, 4095,
     "this node's index, 0..M-1 (required when M > 1)"},
    {0, "rdzv", NULL, "URL", FLAG_STRING, FIELD(rdzv), 0, 0,
     "rendezvous, file:///PATH on a filesystem every node sees\n"
     "(default: a fresh file:///tmp/dtrain-RUNID); when M > 1 give\n"
     "it, --rdzv-endpoint, or --master-addr with --master-port"},
    {0, "master-addr", NULL, "A", FLAG_STRING, FIELD(master_addr), 0, 0,
     "with --master-port: rendezvous at a TCP store at A:P, which\n"
     "node 0 hosts (torchrun's names; A an IP address of node 0)"},
    {0, "master-port", NULL, "P", FLAG_INT, FIELD(master_port), 1, 65535,
     "the TCP store's port on node 0"},
    {0, "rdzv-endpoint", NULL, "HOST:PORT", FLAG_STRING, FIELD(rdzv_endpoint), 0, 0,
     "the same as --master-addr HOST --master-port PORT"},
    {0, "run-id", "rdzv-id", "ID", FLAG_STRING, FIELD(run_id), 0, 0,
     "job name shared by every node (default: random on one node,\n"
     "derived from DT_SECRET on several)"},
    {0, "max-restarts", NULL, "R", FLAG_INT, FIELD(max_restarts), 0, 1000,
     "after a failure, restart the whole group up to R times (default 0)"},
    {0, "log-dir", NULL, "D", FLAG_STRING, FIELD(log_dir), 0, 0,
     "also write each rank's output to D/rank_NNNNN.log"},
    {0, "grace", NULL, "SECONDS", FLAG_SECONDS, FIELD(grace_s), 0, 3600,
     "wait between SIGTERM and SIGKILL when stopping workers (default 5)"},
    {0, "init-timeout", NULL, "SECONDS", FLAG_SECONDS, FIELD(init_timeout_s), 1, 86400,
     "start-up deadline of each worker (rendezvous + connecting), passed\n"
     "as DT_INIT_TIMEOUT (default: the workers' own, 60 s for dtrain's)"},
    {0, "timeout", NULL, "SECONDS", FLAG_SECONDS, FIELD(timeout_s), 0.001, 86400,
     "liveness limit: a peer an op waits on that sends nothing (not even\n"
     "a heartbeat) this long is named as stopped, dead or cut off; passed\n"
     "as DT_TIMEOUT (default: the workers' own, 30 s for dtrain's)"},
    {0, "progress-timeout", NULL, "SECONDS", FLAG_SECONDS, FIELD(progress_timeout_s), 0.001, 1e8,
     "progress limit: how long an op waits for live ranks that have not\n"
     "joined it (a rank busy alone: evaluation, a slow save); passed as\n"
     "DT_PROGRESS_TIMEOUT (default: the workers' own, 1800 s for dtrain's)"},
    {0, "standalone", NULL, NULL, FLAG_SWITCH, FIELD(standalone), 0, 0,
     "one node with a fresh rendezvous of its own (torchrun's;\n"
     "the default here): no --rdzv, --master-addr or --nnodes > 1"},
    {0, "rdzv-backend", NULL, "NAME", FLAG_STRING, FIELD(rdzv_backend), 0, 0,
     "c10d or static: the TCP store --rdzv-endpoint or --master-addr\n"
     "names (etcd is not supported)"},
    {0, "no-python", NULL, NULL, FLAG_SWITCH, FIELD(no_python), 0, 0,
     "accepted for torchrun's sake: PROGRAM is always executed\n"
     "itself, never through python"},
    {0, "tee", NULL, "S", FLAG_STREAMS, FIELD(tee), 0, 3,
     "with --log-dir: the streams copied to the log files, 1 stdout,\n"
     "2 stderr, 3 both, 0 none (default 3)"},
    {0, "redirects", NULL, "S", FLAG_STREAMS, FIELD(redirects), 0, 3,
     "with --log-dir: the streams written to the log files only,\n"
     "not shown here (1, 2, 3 as for --tee; default 0)"},
    {0, "monitor-interval", NULL, "SECONDS", FLAG_SECONDS, FIELD(monitor_interval_s), 0, 3600,
     "accepted for torchrun's sake: workers are watched by events,\n"
     "not polled, so no interval applies"},
    {0, "wire", NULL, "dtrain|gloo", FLAG_STRING, FIELD(wire), 0, 0,
     "the workers' wire, passed as DT_WIRE: dtrain's own (the default,\n"
     "authenticated) or torch 1.13 gloo's (no authentication)"},
    {'h', "help", NULL, NULL, FLAG_SWITCH, FIELD(help), 0, 0, "print this help and exit"},
};
#define NUM_FLAGS (sizeof flags / sizeof flags[0])

void launch_options_usage(FILE *f)
{
    fprintf(f, "usage: dtrain-launch [FLAGS] PROGRAM [ARGS...]\n\n"
               "Starts N copies of PROGRAM with torchrun's environment (RANK, LOCAL_RANK,\n"
               "WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) plus DT_INIT_URL, DT_JOB_ID and\n"
               "DT_SECRET, prefixes their output with the rank, and stops them all when one\n"
               "fails.\n\nflags:\n");
    for (size_t i = 0; i < NUM_FLAGS; i++) {
        const flag_spec *s = &flags[i];
        char head[96];
        const char *sep = s->metavar ? " " : "", *meta = s->metavar ? s->metavar : "";
        int len = s->letter ? snprintf(head, sizeof head, "  -%c, --%s%s%s", s->letter, s->name,
                                       sep, meta)
                            : snprintf(head, sizeof head, "      --%s%s%s", s->name, sep, meta);
        fprintf(f, "%-28s", head);
        if (len >= 28)
            fprintf(f, "\n%-28s", "");
        for (const char *p = s->help; *p; p++) {
            fputc(*p, f);
            if (*p == '\n')
                fprintf(f, "%-28s", "");
        }
        if (s->alias)
            fprintf(f, "\n%-28s(torchrun's --%s)", "", s->alias);
        fputc('\n', f);
    }
    fprintf(f, "\nWords in a flag join with '-' or '_', as torchrun's do (--nproc_per_node is\n"
               "--nproc-per-node); a value follows a blank or '=' (--nproc_per_node=4).\n");
    fprintf(f, "\nexit status: 0 when every worker exits 0; the first failing worker's code\n"
               "(128+signal if it was killed); 130/143 when interrupted; 2 for bad flags.\n");
}

/* The row of a long name, in either spelling (dt_flags.h). */
static const flag_spec *find_long(const char *name, size_t len)
{
    for (size_t i = 0; i < NUM_FLAGS; i++) {
        const flag_spec *s = &flags[i];
        if (dt_flag_name_eq(name, len, s->name) ||
            (s->alias && dt_flag_name_eq(name, len, s->alias)))
            return s;
    }
    return NULL;
}

static const flag_spec *find_letter(char c)
{
    for (size_t i = 0; i < NUM_FLAGS; i++)
        if (flags[i].letter && flags[i].letter == c)
            return &flags[i];
    return NULL;
}

/* The CPU cores this process may run on (its affinity), at least 1. */
static int usable_cpus(void)
{
    cpu_set_t set;
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    return n > 0 ? n : 1;
}

/* torchrun's spellings of a number: "auto" workers, "M:M" nodes. Returns
 * the value to parse as a plain integer, or NULL with err set. */
static const char *torchrun_number(const flag_spec *s, const char *value, char *buf, size_t buflen,
                                   char *err, size_t errlen)
{
    if (s->kind == FLAG_NPROC && strcmp(value, "auto") == 0) {
        snprintf(buf, buflen, "%d", usable_cpus());
        return buf;
    }
    const char *colon = s->kind == FLAG_NODES ? strchr(value, ':') : NULL;
    if (!colon)
        return value;
    size_t n = (size_t)(colon - value);
    if (n >= buflen || strlen(colon + 1) != n || strncmp(value, colon + 1, n) != 0) {
        snprintf(err, errlen,
                 "--%s '%s': elastic ranges (MIN:MAX) are not supported; give one number of "
                 "nodes",
                 s->name, value);
        return NULL;
    }
    memcpy(buf, value, n);
    buf[n] = '\0';
    return buf;
}

/* Stores `value` into the field the spec names, checking its range. */
static bool set_value(launch_options *o, const flag_spec *s, const char *value, char *err,
                      size_t errlen)
{
    char *field = (char *)o + s->offset;
    char *end, number[32];
    errno = 0;
    if (s->kind == FLAG_STRING) {
        if (!*value) {
            snprintf(err, errlen, "--%s: the value is empty", s->name);
            return false;
        }
        memcpy(field, &value, sizeof value);
        return true;
    }
    const char *text = torchrun_number(s, value, number, sizeof number, err, errlen);
    if (!text)
        return false;
    bool integer = s->kind != FLAG_SECONDS;
    double v = integer ? (double)strtol(text, &end, 10) : strtod(text, &end);
    if (errno || end == text || *end || !(v >= s->lo && v <= s->hi)) {
        snprintf(err, errlen, "--%s: '%s' is not %s in %g..%g%s", s->name, value,
                 integer ? "an integer" : "a number of seconds", s->lo, s->hi,
                 s->kind == FLAG_NPROC ? ", nor auto" : "");
        return false;
    }
    if (integer) {
        int iv = (int)v;
        memcpy(field, &iv, sizeof iv);
    } else {
        memcpy(field, &v, sizeof v);
    }
    return true;
}

/* A flag's value given as the next argument must not look like a flag:
 * `--log-dir -n 2 ./prog` would take -n as the directory and run 2. A
 * negative number ("-1") is a value, and so is "-" alone. */
static bool looks_like_flag(const char *value)
{
    return value[0] == '-' && value[1] && !(value[1] >= '0' && value[1] <= '9') && value[1] != '.';
}

/* "unknown flag '--max-restart' (did you mean --max-restarts?)": the
 * closest spelling in the table (dt_flag_closeness), names and aliases. */
static bool unknown_flag(const char *arg, char *err, size_t errlen)
{
    const char *best = NULL;
    int best_score = 0;
    if (arg[1] == '-') {
        const char *name = arg + 2;
        size_t len = strcspn(name, "=");
        for (size_t i = 0; i < NUM_FLAGS; i++) {
            const char *names[2] = {flags[i].name, flags[i].alias};
            for (int k = 0; k < 2; k++) {
                int score = names[k] ? dt_flag_closeness(name, len, names[k]) : 0;
                if (score > best_score)
                    best_score = score, best = names[k];
            }
        }
    }
    if (best)
        snprintf(err, errlen, "unknown flag '%s' (did you mean --%s?)", arg, best);
    else
        snprintf(err, errlen, "unknown flag '%s'", arg);
    return false;
}

/* Parses argv[*i] (and maybe argv[*i+1]); advances *i past what it used. */
static bool parse_one(launch_options *o, int argc, char **argv, int *i, char *err, size_t errlen)
{
    const char *arg = argv[*i], *value = NULL;
    const flag_spec *s;
    if (arg[1] == '-') {
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        s = find_long(name, len);
        if (eq)
            value = eq + 1;
    } else {
        s = find_letter(arg[1]);
        if (s && arg[2])
            value = arg + 2;
    }
    if (!s)
        return unknown_flag(arg, err, errlen);
    if (s->kind == FLAG_SWITCH) {
        if (value) {
            snprintf(err, errlen, "--%s takes no value", s->name);
            return false;
        }
        bool on = true;
        memcpy((char *)o + s->offset, &on, sizeof on);
        return true;
    }
    if (!value) {
        if (*i + 1 >= argc) {
            snprintf(err, errlen, "--%s needs a value (%s)", s->name, s->metavar);
            return false;
        }
        value = argv[++*i];
        if (looks_like_flag(value)) {
            snprintf(err, errlen,
                     "--%s needs a value (%s), and the next argument '%s' is a flag; if it is "
                     "the value, write --%s=%s",
                     s->name, s->metavar, value, s->name, value);
            return false;
        }
    }
    return set_value(o, s, value, err, errlen);
}

/* The rules that involve more than one flag. */
/* torchrun's --master-addr/--master-port and --rdzv-endpoint name a TCP
 * store: they become o->rdzv = "tcp://HOST:PORT". */
static bool tcp_rendezvous(launch_options *o, char *err, size_t errlen)
{
    bool master = o->master_addr || o->master_port;
    if (!master && !o->rdzv_endpoint)
        return true;
    if (o->rdzv || (master && o->rdzv_endpoint)) {
        snprintf(err, errlen,
                 "give one of --rdzv, --rdzv-endpoint, or --master-addr with "
                 "--master-port");
        return false;
    }
    if (master && (!o->master_addr || !o->master_port)) {
        snprintf(err, errlen, "--master-addr and --master-port go together");
        return false;
    }
    int n = o->rdzv_endpoint
                ? snprintf(o->rdzv_tcp, sizeof o->rdzv_tcp, "tcp://%s", o->rdzv_endpoint)
                : snprintf(o->rdzv_tcp, sizeof o->rdzv_tcp, "tcp://%s:%d", o->master_addr,
                           o->master_port);
    if (n < 0 || (size_t)n >= sizeof o->rdzv_tcp) {
        snprintf(err, errlen, "the rendezvous address is too long");
        return false;
    }
    o->rdzv = o->rdzv_tcp;
    return true;
}

static bool check_combination(const launch_options *o, char *err, size_t errlen)
{
    if (o->nnodes > 1 && o->node_rank < 0) {
        snprintf(err, errlen,
                 "--nnodes %d needs --node-rank K (0..%d) on every node, each "
                 "node its own K",
                 o->nnodes, o->nnodes - 1);
        return false;
    }
    if (o->node_rank >= o->nnodes) {
        snprintf(err, errlen, "--node-rank %d is out of range: --nnodes %d allows 0..%d",
                 o->node_rank, o->nnodes, o->nnodes - 1);
        return false;
    }
    if (o->nnodes > 1 && !o->rdzv) {
        snprintf(err, errlen,
                 "--nnodes %d needs a rendezvous every node reaches, the same on every node: "
                 "--rdzv file:///PATH, --rdzv-endpoint HOST:PORT, or --master-addr with "
                 "--master-port",
                 o->nnodes);
        return false;
    }
    if (o->wire && strcmp(o->wire, "dtrain") != 0 && strcmp(o->wire, "gloo") != 0) {
        snprintf(err, errlen, "--wire '%s': use dtrain or gloo", o->wire);
        return false;
    }
    if (o->rdzv && strncmp(o->rdzv, "tcp://", 6) != 0 &&
        (strncmp(o->rdzv, "file:///", 8) != 0 || !o->rdzv[8])) {
        snprintf(err, errlen, "--rdzv '%s': use file:///ABSOLUTE/PATH or tcp://HOST:PORT", o->rdzv);
        return false;
    }
    return true;
}

/* torchrun's flags that constrain others: --standalone, --rdzv-backend,
 * --tee and --redirects. */
static bool check_torchrun_flags(const launch_options *o, char *err, size_t errlen)
{
    if (o->standalone && (o->nnodes > 1 || o->rdzv)) {
        snprintf(err, errlen, "--standalone is one node with a rendezvous of its own: drop %s",
                 o->nnodes > 1 ? "--nnodes" : "the rendezvous flags (--rdzv, --master-addr, ...)");
        return false;
    }
    if (o->rdzv_backend && strcmp(o->rdzv_backend, "c10d") && strcmp(o->rdzv_backend, "static")) {
        snprintf(err, errlen,
                 "--rdzv-backend '%s' is not supported: use c10d or static (a TCP store, with "
                 "--rdzv-endpoint), or --rdzv file:///PATH",
                 o->rdzv_backend);
        return false;
    }
    if (o->rdzv_backend && (!o->rdzv || strncmp(o->rdzv, "tcp://", 6) != 0)) {
        snprintf(err, errlen,
                 "--rdzv-backend %s needs the store's address: --rdzv-endpoint HOST:PORT",
                 o->rdzv_backend);
        return false;
    }
    if ((o->tee > 0 || o->redirects > 0) && !o->log_dir) {
        snprintf(err, errlen, "--%s %d sends output to log files: give --log-dir D",
                 o->redirects > 0 ? "redirects" : "tee", o->redirects > 0 ? o->redirects : o->tee);
        return false;
    }
    return true;
}

bool launch_options_logs_stream(const launch_options *o, int fd)
{
    int streams = o->tee < 0 ? 3 : o->tee | o->redirects;
    return o->log_dir && (streams & fd);
}

bool launch_options_shows_stream(const launch_options *o, int fd)
{
    return !(o->redirects & fd);
}

launch_parse launch_options_parse(launch_options *o, int argc, char **argv, char *err,
                                  size_t errlen)
{
    *o = (launch_options){.nproc_per_node = 1,
                          .nnodes = 1,
                          .node_rank = -1,
                          .grace_s = 5.0,
                          .tee = -1};
    int i = 1;
    for (; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--")) {
            i++;
            break;
        }
        if (arg[0] != '-' || !arg[1])
            break; /* PROGRAM */
        if (!parse_one(o, argc, argv, &i, err, errlen))
            return LAUNCH_PARSE_ERROR;
    }
    if (o->help)
        return LAUNCH_PARSE_HELP;
    if (i >= argc) {
        snprintf(err, errlen, "no PROGRAM given: dtrain-launch [FLAGS] PROGRAM [ARGS...]");
        return LAUNCH_PARSE_ERROR;
    }
    if (!argv[i][0]) {
        snprintf(err, errlen, "the PROGRAM to run is an empty name ('')");
        return LAUNCH_PARSE_ERROR;
    }
    o->program = argv + i;
    if (o->node_rank < 0 && o->nnodes == 1)
        o->node_rank = 0;
    if (!tcp_rendezvous(o, err, errlen) || !check_torchrun_flags(o, err, errlen))
        return LAUNCH_PARSE_ERROR;
    return check_combination(o, err, errlen) ? LAUNCH_PARSE_OK : LAUNCH_PARSE_ERROR;
}
