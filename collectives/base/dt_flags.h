/*
 * dt_flags.h — how every dtrain program reads a flag's name and reports a
 * bad command line, so that all of them behave alike.
 *
 * Spelling: a long flag's words may be joined by '-' or '_' (torchrun and
 * nccl-tests users type --nproc_per_node and --warmup_iters; dtrain's tables
 * write --nproc-per-node), and its value may follow as the next argument or
 * after '=' (--steps=5). Each program keeps one table of flags, written
 * with dashes; dt_flag_is() is the one comparison every table's parser
 * uses, so both spellings work everywhere without a second column of names.
 *
 * Errors: one line that names the flag and what was wrong, then one line
 * pointing at --help (as git and the GNU tools do), never the whole usage,
 * which would bury the line that matters; exit code 2, the usual code of a
 * usage error. Header-only (base/); cost: a string comparison per table row.
 * Small programs also take their whole parser and usage from here
 * (dt_flags_parse, dt_flags_usage, at the end).
 */
#ifndef DT_FLAGS_H
#define DT_FLAGS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "dt_parse.h"

/* The exit code of a bad command line. */
#define DT_FLAGS_USAGE_ERROR 2

/* Do the first `len` bytes of `given` spell `name` ("nproc-per-node"),
 * with '_' read as '-'? */
static inline bool dt_flag_name_eq(const char *given, size_t len, const char *name)
{
    if (strlen(name) != len)
        return false;
    for (size_t i = 0; i < len; i++) {
        char g = given[i] == '_' ? '-' : given[i], n = name[i] == '_' ? '-' : name[i];
        if (g != n)
            return false;
    }
    return true;
}

/* Does the argument `arg` name the flag `name` ("--grad-accum", or a
 * one-letter "-n")? A long flag matches in either spelling and also as
 * "--name=VALUE", with *value (when value is not NULL) then pointing at
 * VALUE; otherwise *value is NULL. */
static inline bool dt_flag_is(const char *arg, const char *name, const char **value)
{
    if (value)
        *value = NULL;
    if (strncmp(name, "--", 2) != 0)
        return strcmp(arg, name) == 0;
    if (strncmp(arg, "--", 2) != 0)
        return false;
    size_t len = strcspn(arg + 2, "=");
    if (!dt_flag_name_eq(arg + 2, len, name + 2))
        return false;
    if (arg[2 + len] == '=' && value)
        *value = arg + 2 + len + 1;
    return arg[2 + len] == '\0' || value != NULL;
}

/* The edit distance (insertions, deletions, substitutions, and swaps of
 * two neighbours) between the first `len` bytes of `given` and `name`, '_'
 * read as '-'; names longer than 63 bytes count as far from everything. */
static inline int dt_flag_distance(const char *given, size_t len, const char *name)
{
    size_t m = strlen(name);
    if (len > 63 || m > 63)
        return 64;
    int d[64][64];
    for (size_t i = 0; i <= len; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= len; i++)
        for (size_t j = 1; j <= m; j++) {
            char g = given[i - 1] == '_' ? '-' : given[i - 1];
            char n = name[j - 1] == '_' ? '-' : name[j - 1];
            int best = d[i - 1][j - 1] + (g != n);
            best = d[i - 1][j] + 1 < best ? d[i - 1][j] + 1 : best;
            best = d[i][j - 1] + 1 < best ? d[i][j - 1] + 1 : best;
            if (i > 1 && j > 1 && given[i - 1] == name[j - 2] && given[i - 2] == name[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[len][m];
}

/* How close `given` (len bytes, no leading dashes) is to `name`: 0 = not
 * close, else higher is closer. Close means a typo away (an edit distance
 * of at most 2, and less than a third of the name) or the start of the
 * name (--nproc for --nproc-per-node, at least 3 bytes). */
static inline int dt_flag_closeness(const char *given, size_t len, const char *name)
{
    size_t m = strlen(name);
    int d = dt_flag_distance(given, len, name);
    if (d <= 2 && (size_t)d * 3 < m)
        return 100 - d;
    if (len < 3 || len >= m)
        return 0;
    for (size_t i = 0; i < len; i++)
        if ((given[i] == '_' ? '-' : given[i]) != (name[i] == '_' ? '-' : name[i]))
            return 0;
    return 50;
}

/* Is any argument before a "--" a request for help (-h, --help)? */
static inline bool dt_flag_help_asked(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return true;
    return false;
}

/* Prints "PROG: what was wrong" and "see 'PROG --help'" on stderr, in one
 * write (stderr is unbuffered: a rank stopped by its launcher mid-message
 * must not leave half a line), and returns DT_FLAGS_USAGE_ERROR, for
 * `return dt_flag_error(...)`. */
static inline int dt_flag_error(const char *prog, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static inline int dt_flag_error(const char *prog, const char *fmt, ...)
{
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s\nsee '%s --help'\n", prog, what, prog);
    return DT_FLAGS_USAGE_ERROR;
}

/* ---- a small program's whole command line ----------------------------------
 * The benchmarks and examples take a few flags, each an integer in a range
 * or a string. Their table is an array of dt_flag; dt_flags_parse reads
 * argv with it and dt_flags_usage prints it, ranges and defaults included,
 * so the usage and the parser cannot disagree (STYLE.md). */

typedef struct dt_flag {
    const char *letter;  /* "-n", or NULL */
    const char *name;    /* "--ranks", or NULL for a one-letter flag */
    const char *metavar; /* "N" */
    int *number;         /* an integer in lo..hi is stored here; or */
    const char **text;   /* the value is stored here as given */
    int lo, hi;
    const char *help;
} dt_flag;

/* What dt_flags_parse found: go on, print the usage (exit 0), or exit 2
 * (the error is printed). */
enum { DT_FLAGS_OK = 0, DT_FLAGS_HELP = 1, DT_FLAGS_ERROR = DT_FLAGS_USAGE_ERROR };

static inline void dt_flags_usage(FILE *f, const dt_flag *flags, int n)
{
    for (int i = 0; i < n; i++) {
        const dt_flag *fl = &flags[i];
        char left[64];
        snprintf(left, sizeof left, "%s%s%s %s", fl->letter ? fl->letter : "",
                 fl->letter && fl->name ? ", " : "", fl->name ? fl->name : "", fl->metavar);
        fprintf(f, "  %-22s %s", left, fl->help);
        if (fl->number)
            fprintf(f, ", %d..%d (default %d)\n", fl->lo, fl->hi, *fl->number);
        else
            fprintf(f, " (default %s)\n", *fl->text ? *fl->text : "none");
    }
    fprintf(f, "  %-22s print this help and exit\n", "-h, --help");
}

/* The row `arg` names; *value gets what follows '=' in "--name=VALUE". */
static inline const dt_flag *dt_flags_find(const dt_flag *flags, int n, const char *arg,
                                           const char **value)
{
    for (int i = 0; i < n; i++)
        if ((flags[i].letter && dt_flag_is(arg, flags[i].letter, value)) ||
            (flags[i].name && dt_flag_is(arg, flags[i].name, value)))
            return &flags[i];
    return NULL;
}

/* Reads argv[1..argc) with the table: DT_FLAGS_OK, DT_FLAGS_HELP (nothing
 * printed: the caller prints its usage), or DT_FLAGS_ERROR after one line
 * naming the flag and a pointer to --help. */
static inline int dt_flags_parse(const char *prog, const dt_flag *flags, int n, int argc,
                                 char **argv)
{
    if (dt_flag_help_asked(argc, argv))
        return DT_FLAGS_HELP;
    for (int i = 1; i < argc; i++) {
        const char *v;
        const dt_flag *fl = dt_flags_find(flags, n, argv[i], &v);
        if (!fl)
            return dt_flag_error(prog, "unknown flag '%s'", argv[i]);
        const char *shown = fl->name && (!fl->letter || argv[i][1] == '-') ? fl->name : fl->letter;
        if (!v && i + 1 >= argc)
            return dt_flag_error(prog, "%s needs a value (%s)", shown, fl->metavar);
        if (!v)
            v = argv[++i];
        if (fl->text)
            *fl->text = v;
        else if (!dt_parse_int(v, fl->lo, fl->hi, fl->number))
            return dt_flag_error(prog, "%s: must be an integer in %d..%d, got '%s'", shown, fl->lo,
                                 fl->hi, v);
    }
    return DT_FLAGS_OK;
}

#endif /* DT_FLAGS_H */
