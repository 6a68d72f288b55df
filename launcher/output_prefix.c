/*
 * output_prefix.c — relaying workers' output, one whole line at a time,
 * each line prefixed with its rank: "[3] loss 2.31".
 *
 * Workers write to pipes in whatever pieces their stdio flushes; a read may
 * end mid-line. Each stream keeps the bytes after its last newline and
 * prints a line only once its newline has arrived, so lines of different
 * ranks never interleave within a line. The launcher is single-threaded and
 * writes each batch of complete lines with one write() loop, so nothing can
 * cut in. A line longer than LINE_MAX_BYTES is cut there (memory stays
 * bounded even if a worker prints megabytes without a newline). At end of
 * stream a last line without newline is printed with one.
 *
 * stdout goes to stdout and stderr to stderr, so `2>/dev/null` still works.
 * The writes block: if the reader of our stdout is slow, we stop reading the
 * workers' pipes and they block in turn — backpressure instead of unbounded
 * buffering. If our reader goes away (EPIPE), output is dropped; the log
 * files and the failure report still get it.
 *
 * A '\r' starts a status line (a progress bar redrawn in place): the text
 * after it is shown at once, as "\r[0] [####....] 3/10\033[K", when our
 * stdout is a terminal (also when the next '\r' follows in the same read:
 * every bar is drawn, however the pipe splits the bytes), and never
 * otherwise; status lines reach neither the log file nor the tail ring,
 * which keep only real lines. On a terminal every real line starts with
 * "\r\033[K" to wipe a status line it follows.
 * A worker clears its bar with "\r\033[K" before a real line; that clear is
 * dropped from the line.
 *
 * Two more consumers see each line: the per-rank log file (the line without
 * prefix, both streams in order of arrival) and the rank's ring of its last
 * OUTPUT_TAIL_LINES lines, which the failure report prints. The ring costs
 * a fixed 8 KB per rank and nothing per line beyond a bounded copy; a line
 * longer than a slot keeps its start and its end and loses its middle.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch.h"

#define LINE_MAX_BYTES (64 * 1024)

static void write_all(int *fd, const char *p, size_t n)
{
    while (*fd >= 0 && n > 0) {
        ssize_t w = write(*fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            *fd = -1;
            return;
        } /* EPIPE and friends: stop writing there */
        p += w;
        n -= (size_t)w;
    }
}

/* Byte i of the line a ‖ b. */
static char joined_at(const char *a, size_t na, const char *b, size_t i)
{
    return i < na ? a[i] : b[i - na];
}

static void copy_joined(char *dst, const char *a, size_t na, const char *b, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        *dst++ = joined_at(a, na, b, i);
}

static bool utf8_continuation(char c)
{
    return ((unsigned char)c & 0xC0) == 0x80;
}

/* Keeps the line a ‖ b in the ring. A line too long for a slot loses its
 * middle, not its end: errors name the rank that reports at the start and
 * the peer it blames at the end, and both must reach the report. The cuts
 * fall on UTF-8 character boundaries. */
static void tail_push(output_tail *t, const char *a, size_t na, const char *b, size_t nb)
{
    char *dst = t->lines[t->next];
    size_t n = na + nb;
    if (n < OUTPUT_TAIL_WIDTH) {
        copy_joined(dst, a, na, b, 0, n);
        dst[n] = '\0';
    } else {
        char marker[48];
        size_t room = OUTPUT_TAIL_WIDTH - 1 - (sizeof marker - 1); /* worst-case marker */
        size_t head = room * 2 / 3, tail_from = n - (room - head);
        while (head > 0 && utf8_continuation(joined_at(a, na, b, head)))
            head--;
        while (tail_from < n && utf8_continuation(joined_at(a, na, b, tail_from)))
            tail_from++;
        int m = snprintf(marker, sizeof marker, " [... %zu bytes cut ...] ", tail_from - head);
        copy_joined(dst, a, na, b, 0, head);
        memcpy(dst + head, marker, (size_t)m);
        copy_joined(dst + head + (size_t)m, a, na, b, tail_from, n);
        dst[head + (size_t)m + (n - tail_from)] = '\0';
    }
    t->next = (t->next + 1) % OUTPUT_TAIL_LINES;
    if (t->count < OUTPUT_TAIL_LINES)
        t->count++;
}

bool launch_output_tail_mentions(const output_tail *t, const char *needle)
{
    for (int i = 0; i < t->count; i++)
        if (strstr(t->lines[i], needle))
            return true;
    return false;
}

void launch_output_tail_print(const output_tail *t, int rank, FILE *f)
{
    int first = (t->next - t->count + OUTPUT_TAIL_LINES) % OUTPUT_TAIL_LINES;
    for (int i = 0; i < t->count; i++)
        fprintf(f, "    [%d] %s\n", rank, t->lines[(first + i) % OUTPUT_TAIL_LINES]);
}

void launch_output_init(output_stream *s, int rank, int out_fd, int log_fd, output_tail *tail)
{
    *s = (output_stream){.rank = rank,
                         .out_fd = out_fd,
                         .log_fd = log_fd,
                         .tail = tail,
                         .tty = isatty(out_fd) == 1};
}

/* Appends "[rank] line\n" to the batch `out` (grown as needed). */
static bool batch_line(const output_stream *s, char **out, size_t *len, size_t *cap, const char *a,
                       size_t na, const char *b, size_t nb)
{
    size_t need = *len + 24 + na + nb;
    if (need > *cap) {
        size_t c = *cap ? *cap : 4096;
        while (c < need)
            c *= 2;
        char *p = realloc(*out, c);
        if (!p)
            return false;
        *out = p;
        *cap = c;
    }
    *len += (size_t)snprintf(*out + *len, 24, "%s[%d] ", s->tty ? "\r\033[K" : "", s->rank);
    if (na)
        memcpy(*out + *len, a, na); /* a is NULL when nothing was held */
    if (nb)
        memcpy(*out + *len + na, b, nb);
    *len += na + nb;
    (*out)[(*len)++] = '\n';
    return true;
}

/* One complete line: held partial bytes `a`, then `b` from this read. */
static void emit_line(output_stream *s, char **out, size_t *len, size_t *cap, const char *a,
                      size_t na, const char *b, size_t nb)
{
    if (!batch_line(s, out, len, cap, a, na, b, nb)) {
        /* out of memory for the batch: flush what we have, write this line alone */
        write_all(&s->out_fd, *out, *len);
        *len = 0;
        char prefix[16];
        int np = snprintf(prefix, sizeof prefix, "[%d] ", s->rank);
        write_all(&s->out_fd, prefix, (size_t)np);
        write_all(&s->out_fd, a, na);
        write_all(&s->out_fd, b, nb);
        write_all(&s->out_fd, "\n", 1);
    }
    if (s->log_fd >= 0) {
        write_all(&s->log_fd, a, na);
        write_all(&s->log_fd, b, nb);
        write_all(&s->log_fd, "\n", 1);
    }
    tail_push(s->tail, a, na, b, nb);
}

static bool hold_partial(output_stream *s, const char *data, size_t n)
{
    if (s->len + n > s->cap) {
        size_t c = s->cap ? s->cap : 256;
        while (c < s->len + n)
            c *= 2;
        char *p = realloc(s->partial, c);
        if (!p)
            return false;
        s->partial = p;
        s->cap = c;
    }
    memcpy(s->partial + s->len, data, n);
    s->len += n;
    return true;
}

/* The first '\n' or '\r' in data[0..n), or NULL. */
static const char *line_break(const char *data, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (data[i] == '\n' || data[i] == '\r')
            return data + i;
    return NULL;
}

/* A status line's text a ‖ b, on a terminal only: redrawn in place. A
 * worker's bare clear ("\033[K") draws nothing. */
static void draw_status_text(output_stream *s, const char *a, size_t na, const char *b, size_t nb)
{
    if (!s->tty || na + nb == 0)
        return;
    if ((na == 3 && nb == 0 && !memcmp(a, "\033[K", 3)) ||
        (na == 0 && nb == 3 && !memcmp(b, "\033[K", 3)))
        return;
    char prefix[24];
    int np = snprintf(prefix, sizeof prefix, "\r[%d] ", s->rank);
    write_all(&s->out_fd, prefix, (size_t)np);
    write_all(&s->out_fd, a, na);
    write_all(&s->out_fd, b, nb);
    write_all(&s->out_fd, "\033[K", 3);
}

static void draw_status(output_stream *s)
{
    draw_status_text(s, s->partial, s->len, "", 0);
}

/* A real line that followed a '\r': without the worker's clear sequence. */
static void emit_after_status(output_stream *s, char **out, size_t *len, size_t *cap, const char *b,
                              size_t nb)
{
    const char *a = s->partial;
    size_t na = s->len;
    if (na >= 3 && !memcmp(a, "\033[K", 3))
        a += 3, na -= 3;
    else if (na == 0 && nb >= 3 && !memcmp(b, "\033[K", 3))
        b += 3, nb -= 3;
    emit_line(s, out, len, cap, a, na, b, nb);
}

void launch_output_feed(output_stream *s, const char *data, size_t n)
{
    char *out = NULL;
    size_t len = 0, cap = 0;
    while (n > 0) {
        const char *br = line_break(data, n);
        size_t room = LINE_MAX_BYTES - s->len; /* s->len < LINE_MAX_BYTES always */
        size_t take = br ? (size_t)(br - data) : n;
        if (take >= room) { /* over-long line: cut it here */
            emit_line(s, &out, &len, &cap, s->partial, s->len, data, room);
            s->len = 0;
            s->transient = false;
            data += room;
            n -= room;
            continue;
        }
        if (!br) {
            if (!hold_partial(s, data, n)) { /* no memory: print the piece as a line */
                emit_line(s, &out, &len, &cap, s->partial, s->len, data, n);
                s->len = 0;
            }
            break;
        }
        if (*br == '\n' && s->transient) {
            if (s->len + take > 0) /* "\r\n" alone ends a line already printed */
                emit_after_status(s, &out, &len, &cap, data, take);
        } else if (*br == '\n' || (!s->transient && s->len + take > 0))
            emit_line(s, &out, &len, &cap, s->partial, s->len, data, take);
        else if (s->tty && take > 0) {
            /* a status line superseded by the next '\r' in this same read:
             * drawn all the same, so every step's bar shows however the
             * worker's writes happen to be split into reads. Bytes held
             * from an earlier read (s->len) were drawn when that read
             * ended: with nothing new (take == 0) drawing them again would
             * show every bar twice. */
            write_all(&s->out_fd, out, len);
            len = 0;
            draw_status_text(s, s->partial, s->len, data, take);
        }
        s->len = 0;
        s->transient = *br == '\r';
        data += take + 1;
        n -= take + 1;
    }
    write_all(&s->out_fd, out, len);
    free(out);
    if (s->transient)
        draw_status(s);
}

void launch_output_finish(output_stream *s)
{
    if (s->transient && s->tty)
        write_all(&s->out_fd, "\r\033[K", 4);
    if (s->len == 0 || s->transient) { /* a last status line is not kept */
        s->len = 0;
        return;
    }
    char *out = NULL;
    size_t len = 0, cap = 0;
    emit_line(s, &out, &len, &cap, s->partial, s->len, "", 0);
    s->len = 0;
    write_all(&s->out_fd, out, len);
    free(out);
}

void launch_output_free(output_stream *s)
{
    free(s->partial);
    s->partial = NULL;
    s->len = s->cap = 0;
}
