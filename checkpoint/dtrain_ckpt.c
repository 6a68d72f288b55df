/*
 * dtrain_ckpt.c — dtrain-ckpt, the checkpoint tool.
 *
 *   dtrain-ckpt ls ROOT                  every step directory: step, world,
 *                                        mode, bytes, and whether it verifies
 *   dtrain-ckpt verify DIR               a step directory (or a root: its
 *                                        latest); exit 0 if it verifies, 1 not
 *   dtrain-ckpt export DIR OUT.safetensors [--names dtrain|seed] [--dtype fp32|bf16]
 *                                        consolidated weights, under dtrain's
 *                                        state_dict names or the seed
 *                                        curriculum's MiniGPT module's, as
 *                                        fp32 or rounded to bf16
 *   dtrain-ckpt reshard DIR OUTROOT M [--pp P [--pp-partition HOW]] [--tp T]
 *                                        the same state as M shards; with
 *                                        --pp, laid out for P stages x M/P
 *                                        replicas (minigpt --pp P's layout),
 *                                        with --tp as T tp shares x M/T
 *                                        replicas (minigpt --tp T's), with
 *                                        both as minigpt --dp M/(P·T) --tp T
 *                                        --pp P's grid; a tp checkpoint
 *                                        without --tp: unsplit
 *
 * Everything goes through the library: verify is a load into nothing;
 * export and reshard load the full state as one rank of one (the
 * intersection with every shard is the whole of it), then write it out;
 * a tp checkpoint's shares are joined into the model's layout first
 * (tp_share.c), or cut for another T.
 * The tool never changes a checkpoint that exists: reshard refuses an
 * OUTROOT that already holds the step (the library's new_step_only, an
 * atomic mkdir) or whose `latest` names a newer step (moving it back would
 * rewind a run), and neither reshard nor export writes anything inside a
 * step directory (inside_step_dir); export replaces only a safetensors file.
 * Exit codes: 0 success, 1 a checkpoint failed its checks, a write failed
 * or was refused, 2 usage (one line saying what was wrong and a pointer to --help,
 * dt_flags.h; --pp_partition is --pp-partition).
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dt_ckpt.h"
#include "dt_flags.h"
#include "dt_parse.h"
#include "dt_pipe.h"

/* Each command and its arguments: the usage and the errors read them. */
static const char *const commands[][2] = {
    {"ls", "ROOT"},
    {"verify", "DIR|ROOT"},
    {"export", "DIR|ROOT OUT.safetensors [--names dtrain|seed] [--dtype fp32|bf16]"},
    {"reshard", "DIR|ROOT OUTROOT M [--pp P [--pp-partition params|uniform]] [--tp T]"},
};
#define NUM_COMMANDS (sizeof commands / sizeof commands[0])

static void usage_to(FILE *f)
{
    for (size_t i = 0; i < NUM_COMMANDS; i++)
        fprintf(f, "%s dtrain-ckpt %s %s\n", i ? "      " : "usage:", commands[i][0],
                commands[i][1]);
    fprintf(f, "       dtrain-ckpt --help\n");
}

/* "dtrain-ckpt: export takes DIR|ROOT OUT.safetensors", exit code 2. */
static int wrong_arguments(const char *cmd)
{
    for (size_t i = 0; i < NUM_COMMANDS; i++)
        if (strcmp(cmd, commands[i][0]) == 0)
            return dt_flag_error("dtrain-ckpt", "%s takes %s", cmd, commands[i][1]);
    return dt_flag_error("dtrain-ckpt", "unknown command '%s': ls, verify, export or reshard", cmd);
}

/* A step directory as given, or the one `latest` names under a root. */
static int resolve(dt_ckpt *ck, const char *path, char *dir, size_t len)
{
    char man[4200];
    snprintf(man, sizeof man, "%s/manifest.json", path);
    if (access(man, F_OK) == 0) {
        snprintf(dir, len, "%s", path);
        return 0;
    }
    if (dt_ckpt_latest(ck, dir, len) != DT_OK) {
        fprintf(stderr, "dtrain-ckpt: %s\n", dt_ckpt_error(ck));
        return 1;
    }
    return 0;
}

/* Whether dir is a step directory: it holds a manifest.json, or its name
 * is step_ and digits (one being written has no manifest yet). */
static bool is_step_dir(const char *dir)
{
    char man[PATH_MAX + 16];
    snprintf(man, sizeof man, "%s/manifest.json", dir);
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    bool named = strncmp(base, "step_", 5) == 0 && base[5] &&
                 strspn(base + 5, "0123456789") == strlen(base + 5);
    return named || access(man, F_OK) == 0;
}

/* Refuses (1, after saying so) when dir or a directory above it is a step
 * directory: a step holds its shards and manifest, nothing else. dir need
 * not exist: the nearest part of it that does is resolved (symlinks, "..")
 * and walked up to /. what: "export: OUT" or "reshard: OUTROOT". */
static int inside_step_dir(const char *what, const char *out, const char *dir)
{
    char probe[PATH_MAX], real[PATH_MAX], shown[PATH_MAX + 64], step[PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s", dir);
    while (!realpath(probe, real)) {
        char *slash = strrchr(probe, '/');
        if (slash == probe)
            snprintf(real, sizeof real, "/");
        else if (!slash && !getcwd(real, sizeof real))
            return 0;
        if (!slash || slash == probe)
            break;
        *slash = '\0';
    }
    for (char *up = real; up;) {
        if (is_step_dir(real)) {
            fprintf(stderr,
                    "dtrain-ckpt: %s %s lies in the step directory %s, and a step holds "
                    "only its own shards and manifest: write elsewhere\n",
                    what, dt_ckpt_printable(shown, sizeof shown, out),
                    dt_ckpt_printable(step, sizeof step, real));
            return 1;
        }
        up = strrchr(real, '/');
        if (up == real && real[1])
            real[1] = '\0';
        else if (up && up != real)
            *up = '\0';
        else
            up = NULL;
    }
    return 0;
}

static int cmd_ls(const char *root)
{
    dt_ckpt *ck;
    if (dt_ckpt_open(&ck, root, NULL) != DT_OK)
        return fprintf(stderr, "dtrain-ckpt: %s\n", dt_ckpt_error(ck)), dt_ckpt_close(ck), 1;
    struct dirent **names;
    char shown[4200];
    int n = scandir(root, &names, NULL, alphasort);
    if (n < 0) {
        fprintf(stderr, "dtrain-ckpt: %s: %s\n", dt_ckpt_printable(shown, sizeof shown, root),
                strerror(errno));
        dt_ckpt_close(ck);
        return 1;
    }
    char latest[4200] = "";
    dt_ckpt_latest(ck, latest, sizeof latest);
    printf("%-16s %8s %6s %9s %14s  %s\n", "directory", "step", "world", "mode", "bytes", "status");
    int bad = 0;
    for (int i = 0; i < n; i++) {
        const char *nm = names[i]->d_name;
        if (strncmp(nm, "step_", 5) == 0) {
            char name[1100]; /* a hostile name must not reach the terminal raw */
            dt_ckpt_printable(name, sizeof name, nm);
            char dir[4200];
            snprintf(dir, sizeof dir, "%s/%s", root, nm);
            dt_ckpt_info info;
            bool is_latest = strcmp(dir, latest) == 0;
            if (dt_ckpt_inspect(ck, dir, &info) != DT_OK) {
                printf("%-16s %8s %6s %9s %14s  not a checkpoint: %s\n", name, "-", "-", "-", "-",
                       dt_ckpt_error(ck));
            } else {
                bool ok = dt_ckpt_verify(ck, dir) == DT_OK;
                bad += !ok;
                char mode[32]; /* "ddp", "zero1+tp2" */
                snprintf(mode, sizeof mode, "%s", info.mode == DT_CKPT_ZERO1 ? "zero1" : "ddp");
                if (info.tp > 1)
                    snprintf(mode + strlen(mode), sizeof mode - strlen(mode), "+tp%d", info.tp);
                printf("%-16s %8ld %6d %9s %14llu  %s%s%s\n", name, info.step, info.world, mode,
                       (unsigned long long)info.total_bytes,
                       ok ? "ok" : "BAD: ", ok ? "" : dt_ckpt_error(ck),
                       is_latest ? " (latest)" : "");
            }
        }
        free(names[i]);
    }
    free(names);
    dt_ckpt_close(ck);
    return bad ? 1 : 0;
}

/* The full state of dir, loaded as rank 0 of 1. The shards are checked
 * against the manifest before anything is allocated from its sizes. */
static int load_full(dt_ckpt *ck, const char *dir, dt_ckpt_state *s)
{
    dt_ckpt_info info;
    if (dt_ckpt_inspect(ck, dir, &info) != DT_OK || dt_ckpt_check(ck, dir) != DT_OK)
        return fprintf(stderr, "dtrain-ckpt: %s\n", dt_ckpt_error(ck)), 1;
    size_t n = info.num_params;
    *s = (dt_ckpt_state){.cfg = info.cfg,
                         .mode = info.mode,
                         .rank = 0,
                         .world = 1,
                         .tp = info.tp,
                         .num_params = n,
                         .opt_lo = 0,
                         .opt_n = n};
    s->params = malloc(n * sizeof(float));
    s->adam_m = malloc(n * sizeof(float));
    s->adam_v = malloc(n * sizeof(float));
    s->master = info.mode == DT_CKPT_ZERO1 ? malloc(n * sizeof(float)) : NULL;
    if (!s->params || !s->adam_m || !s->adam_v || (info.mode == DT_CKPT_ZERO1 && !s->master))
        return fprintf(stderr, "dtrain-ckpt: out of memory\n"), 1;
    if (dt_ckpt_load(ck, dir, s) != DT_OK)
        return fprintf(stderr, "dtrain-ckpt: %s\n", dt_ckpt_error(ck)), 1;
    return 0;
}

/* s, a full state, in tp's layout (1: the model's). */
static int to_tp(dt_ckpt_state *s, int tp)
{
    char err[128];
    if ((s->tp > 1 ? s->tp : 1) == tp)
        return 0;
    if (dt_tp_config_check(&s->cfg, tp, err, sizeof err) != DT_OK)
        return fprintf(stderr, "dtrain-ckpt: reshard --tp %d: %s\n", tp, err), 1;
    dt_ckpt_state t;
    if (dt_ckpt_tp_convert(&t, s, tp) != DT_OK)
        return fprintf(stderr, "dtrain-ckpt: out of memory\n"), 1;
    dt_ckpt_tp_free(s);
    *s = t;
    return 0;
}

/* reshard's layout flags (argv[5..]): none, --pp P [--pp-partition
 * HOW], --tp T, or both. *pp = 0 without --pp, *tp = 1 without --tp. Returns 0,
 * or 2 after printing what was wrong. */
static int parse_layout(int argc, char **argv, int *pp, int *tp, dt_pipe_partition_kind *kind)
{
    *pp = 0;
    *tp = 1;
    *kind = DT_PARTITION_PARAMS;
    for (int i = 5; i < argc; i++) {
        const char *v;
        bool is_pp = dt_flag_is(argv[i], "--pp", &v),
             is_tp = !is_pp && dt_flag_is(argv[i], "--tp", &v);
        if (!is_pp && !is_tp && !dt_flag_is(argv[i], "--pp-partition", &v))
            return dt_flag_error("dtrain-ckpt",
                                 "reshard: unknown flag '%s' (--pp, --pp-partition, --tp)",
                                 argv[i]);
        if (!v && i + 1 >= argc)
            return dt_flag_error("dtrain-ckpt", "%s needs a value", argv[i]);
        if (!v)
            v = argv[++i];
        if ((is_pp || is_tp) && !dt_parse_int(v, 1, DT_CKPT_MAX_WORLD, is_pp ? pp : tp))
            return dt_flag_error("dtrain-ckpt", "%s: must be an integer in 1..%d, got '%s'",
                                 is_pp ? "--pp" : "--tp", DT_CKPT_MAX_WORLD, v);
        if (!is_pp && !is_tp && !dt_pipe_partition_parse(v, kind))
            return dt_flag_error("dtrain-ckpt",
                                 "--pp-partition: must be params or uniform, got '%s'", v);
    }
    return 0;
}

/* minigpt --pp P's checkpoint layout over M ranks, into slices (M + 1). */
static int pipeline_layout(const dt_config *cfg, int pp, int m, dt_pipe_partition_kind kind,
                           size_t *slices)
{
    char err[256];
    int *blocks = malloc(((size_t)pp + 1) * sizeof *blocks);
    size_t *stage = malloc(((size_t)pp + 1) * sizeof *stage);
    int rc = 1;
    if (!blocks || !stage)
        fprintf(stderr, "dtrain-ckpt: out of memory\n");
    else if (m % pp != 0)
        fprintf(stderr,
                "dtrain-ckpt: reshard: %d ranks are not a whole "
                "number of pipelines of %d stages\n",
                m, pp);
    else if (dt_pipe_partition(blocks, cfg, pp, kind, err, sizeof err))
        fprintf(stderr, "dtrain-ckpt: reshard: %s\n", err);
    else
        rc = 0;
    for (int s = 0; rc == 0 && s < pp; s++)
        dt_config_stage_range(cfg, blocks[s], blocks[s + 1], &stage[s], &stage[s + 1]);
    if (rc == 0)
        dt_ckpt_pipeline_slices(slices, stage, pp, m / pp);
    free(blocks);
    free(stage);
    return rc;
}

/* minigpt --tp T's checkpoint layout over m ranks (tp_share.c). */
static int tp_layout(dt_ckpt_state *s, int tp, int m, size_t *slices, int **order)
{
    if (m % tp != 0)
        return fprintf(stderr,
                       "dtrain-ckpt: reshard: %d ranks are not a whole number of tp groups of "
                       "%d\n",
                       m, tp),
               1;
    if (!(*order = malloc((size_t)m * sizeof **order)))
        return fprintf(stderr, "dtrain-ckpt: out of memory\n"), 1;
    dt_ckpt_tp_slices(slices, *order, &s->cfg, tp, m / tp);
    s->slice_order = *order;
    return 0;
}

/* minigpt --dp M/(P·T) --tp T --pp P's checkpoint layout over m ranks
 * (grid_slices.c). */
static int grid_layout(dt_ckpt_state *s, int pp, int tp, int m, dt_pipe_partition_kind kind,
                       size_t *slices, int **order)
{
    char err[256];
    int *blocks = malloc(((size_t)pp + 1) * sizeof *blocks), rc = 1;
    *order = malloc((size_t)m * sizeof **order);
    if (!blocks || !*order)
        fprintf(stderr, "dtrain-ckpt: out of memory\n");
    else if (m % (pp * tp) != 0)
        fprintf(stderr,
                "dtrain-ckpt: reshard: %d ranks are not a whole number of grids of %d stages x "
                "%d tp ranks\n",
                m, pp, tp);
    else if (dt_pipe_partition(blocks, &s->cfg, pp, kind, err, sizeof err))
        fprintf(stderr, "dtrain-ckpt: reshard: %s\n", err);
    else if (dt_ckpt_grid_slices(slices, *order, &s->cfg, tp, pp, m / (pp * tp), blocks) != DT_OK)
        fprintf(stderr, "dtrain-ckpt: out of memory\n");
    else
        rc = 0;
    free(blocks);
    s->slice_order = rc == 0 ? *order : NULL;
    return rc;
}

/* The layout of m shards into slices (m + 1): the 3-D grid's, the
 * pipeline's or the tp run's. */
static int layout(dt_ckpt_state *s, int pp, int tp, int m, dt_pipe_partition_kind kind,
                  size_t *slices, int **order)
{
    if (pp > 0 && tp > 1)
        return grid_layout(s, pp, tp, m, kind, slices, order);
    return pp > 0 ? pipeline_layout(&s->cfg, pp, m, kind, slices)
                  : tp_layout(s, tp, m, slices, order);
}

/* Refuses (1, after saying so) when out's `latest` names a step newer than
 * step: committing step there would move `latest` back, and the next
 * --resume auto would rewind the run. */
static int newer_latest(dt_ckpt *out, long step)
{
    char dir[4200], shown[4200];
    dt_ckpt_info info;
    if (dt_ckpt_latest(out, dir, sizeof dir) != DT_OK ||
        dt_ckpt_inspect(out, dir, &info) != DT_OK || info.step <= step)
        return 0;
    fprintf(stderr,
            "dtrain-ckpt: reshard: %s names step %ld, newer than step %ld: committing it there "
            "would move latest back; write to another root\n",
            dt_ckpt_printable(shown, sizeof shown, dir), info.step, step);
    return 1;
}

/* Writes the full state s as m shards under outroot (pp > 0: the
 * pipeline layout; tp > 1: the tp layout; both: the 3-D grid's). */
static int cmd_reshard(dt_ckpt *in, const char *dir, dt_ckpt_state *s, const char *outroot, int m,
                       int pp, int tp, dt_pipe_partition_kind kind)
{
    char shown[4200];
    size_t *slices = NULL;
    int *order = NULL;
    bool streamed = !s->params; /* no --tp on either side: slice by slice */
    if (!streamed && to_tp(s, tp))
        return 1;
    if (pp > 0 || tp > 1) {
        slices = malloc(((size_t)m + 1) * sizeof *slices);
        if (!slices || layout(s, pp, tp, m, kind, slices, &order)) {
            free(slices);
            free(order);
            s->slice_order = NULL;
            return 1;
        }
        s->slices = slices;
    }
    dt_ckpt *out;
    dt_ckpt_options o = {.new_step_only = true};
    int refused = 0, rc = dt_ckpt_open(&out, outroot, &o) != DT_OK;
    if (!rc)
        rc = (refused = newer_latest(out, s->step)) ||
             (streamed ? dt_ckpt_reshard_streamed(out, in, dir, m, s->slices, s->slice_order)
                       : dt_ckpt_save_all(out, s, m)) != DT_OK;
    if (rc) {
        if (!refused) /* newer_latest said why */
            fprintf(stderr, "dtrain-ckpt: reshard: %s\n", dt_ckpt_error(out));
    } else if (pp > 0 && tp > 1)
        printf("%s: step %ld as %d shards: %d stages x %d replicas x %d tp shares\n",
               dt_ckpt_printable(shown, sizeof shown, outroot), s->step, m, pp, m / (pp * tp), tp);
    else if (pp > 0)
        printf("%s: step %ld as %d shards: %d stages x %d replicas\n",
               dt_ckpt_printable(shown, sizeof shown, outroot), s->step, m, pp, m / pp);
    else if (tp > 1)
        printf("%s: step %ld as %d shards: %d tp shares x %d replicas\n",
               dt_ckpt_printable(shown, sizeof shown, outroot), s->step, m, tp, m / tp);
    else
        printf("%s: step %ld as %d shards\n", dt_ckpt_printable(shown, sizeof shown, outroot),
               s->step, m);
    dt_ckpt_close(out);
    s->slices = NULL;
    s->slice_order = NULL;
    free(slices);
    free(order);
    return rc;
}

/* export's options after OUT, in any order, each once, "--flag V" or
 * "--flag=V": --names dtrain|seed (dtrain's own state_dict names, or the
 * seed curriculum's) and --dtype fp32|bf16. A usage error names the
 * argument it could not take. */
static int parse_export_options(int argc, char **argv, dt_ckpt_export_options *o)
{
    bool named = false, typed = false;
    for (int i = 4; i < argc; i++) {
        const char *v = NULL;
        bool names = dt_flag_is(argv[i], "--names", &v);
        bool dtype = !names && dt_flag_is(argv[i], "--dtype", &v);
        if (!names && !dtype)
            return dt_flag_error("dtrain-ckpt", "export: unexpected argument '%s'", argv[i]);
        if ((names && named) || (dtype && typed))
            return dt_flag_error("dtrain-ckpt", "export: %s given twice",
                                 names ? "--names" : "--dtype");
        if (!v && i + 1 < argc)
            v = argv[++i];
        if (names && (!v || (strcmp(v, "dtrain") && strcmp(v, "seed"))))
            return dt_flag_error("dtrain-ckpt", "export: --names takes dtrain or seed");
        if (dtype && (!v || (strcmp(v, "fp32") && strcmp(v, "bf16"))))
            return dt_flag_error("dtrain-ckpt", "export: --dtype takes fp32 or bf16");
        if (names)
            o->names = strcmp(v, "seed") == 0 ? DT_CKPT_NAMES_SEED : DT_CKPT_NAMES_DTRAIN;
        else
            o->dtype = strcmp(v, "bf16") == 0 ? DT_BF16 : DT_F32;
        named |= names;
        typed |= dtype;
    }
    return 0;
}

/* export's OUT and reshard's OUTROOT must not lie inside a step directory. */
static int refuse_inside_step(bool export, const char *out)
{
    if (!export)
        return inside_step_dir("reshard: OUTROOT", out, out);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", out);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else
        slash[slash == dir] = '\0'; /* "/x" -> "/" */
    return inside_step_dir("export: OUT", out, dir);
}

int main(int argc, char **argv)
{
    if (dt_flag_help_asked(argc, argv))
        return usage_to(stdout), 0;
    if (argc < 2)
        return dt_flag_error("dtrain-ckpt", "no command given: ls, verify, export or reshard");
    const char *cmd = argv[1];
    if (strcmp(cmd, "ls") == 0)
        return argc == 3 ? cmd_ls(argv[2]) : wrong_arguments(cmd);
    bool verify = strcmp(cmd, "verify") == 0 && argc == 3;
    bool export = strcmp(cmd, "export") == 0 && argc >= 4;
    dt_ckpt_export_options eo = {.names = DT_CKPT_NAMES_DTRAIN, .dtype = DT_F32};
    if (export && parse_export_options(argc, argv, &eo))
        return DT_FLAGS_USAGE_ERROR;
    bool reshard = strcmp(cmd, "reshard") == 0 && argc >= 5;
    int pp = 0, tp = 1;
    dt_pipe_partition_kind kind;
    if (reshard && parse_layout(argc, argv, &pp, &tp, &kind))
        return DT_FLAGS_USAGE_ERROR;
    if (!verify && !export && !reshard)
        return wrong_arguments(cmd);
    if ((export || reshard) && refuse_inside_step(export, argv[3]))
        return 1;
    dt_ckpt_options o = {.allow_reshard = true};
    dt_ckpt *ck;
    char dir[4200], shown[4200];
    int rc = dt_ckpt_open(&ck, argv[2], &o) != DT_OK || resolve(ck, argv[2], dir, sizeof dir);
    if (!rc && verify) {
        rc = dt_ckpt_verify(ck, dir) != DT_OK;
        if (rc)
            fprintf(stderr, "dtrain-ckpt: %s: %s\n", dt_ckpt_fault_name(dt_ckpt_last_fault(ck)),
                    dt_ckpt_error(ck));
        else
            printf("%s: ok\n", dt_ckpt_printable(shown, sizeof shown, dir));
    }
    dt_ckpt_state s = {0};
    dt_ckpt_info info = {0};
    if (!rc && export && (rc = dt_ckpt_inspect(ck, dir, &info) != DT_OK))
        fprintf(stderr, "dtrain-ckpt: %s\n", dt_ckpt_error(ck));
    if (!rc && reshard && (rc = dt_ckpt_inspect(ck, dir, &info) != DT_OK))
        fprintf(stderr, "dtrain-ckpt: %s\n", dt_ckpt_error(ck));
    /* streamed unless a tp checkpoint's shares are joined or made: whole */
    bool streamed = info.tp <= 1 && (export || tp == 1);
    if (!rc && !streamed)
        rc = load_full(ck, dir, &s);
    if (!rc && reshard && streamed) /* what the layout and the messages read */
        s = (dt_ckpt_state){.cfg = info.cfg, .step = info.step, .num_params = info.num_params};
    if (!rc && export && !streamed)
        rc = to_tp(&s, 1);
    if (!rc && export) {
        rc = (streamed
                  ? dt_ckpt_export_dir(ck, dir, argv[3], &eo)
                  : dt_ckpt_export_safetensors_as(ck, argv[3], &s.cfg, s.params, &eo)) != DT_OK;
        if (rc)
            fprintf(stderr, "dtrain-ckpt: %s\n", dt_ckpt_error(ck));
        else
            printf("%s: %zu parameters of step %ld%s\n",
                   dt_ckpt_printable(shown, sizeof shown, argv[3]),
                   streamed ? info.num_params : s.num_params, info.step,
                   eo.dtype == DT_BF16 ? ", rounded to bf16" : "");
    }
    if (!rc && reshard) {
        int m;
        if (!dt_parse_int(argv[4], 1, DT_CKPT_MAX_WORLD, &m)) {
            dt_ckpt_tp_free(&s);
            dt_ckpt_close(ck);
            return dt_flag_error("dtrain-ckpt", "reshard: M must be an integer in 1..%d, got '%s'",
                                 DT_CKPT_MAX_WORLD, argv[4]);
        }
        rc = cmd_reshard(ck, dir, &s, argv[3], m, pp, tp, kind);
    }
    dt_ckpt_tp_free(&s);
    dt_ckpt_close(ck);
    return rc;
}
