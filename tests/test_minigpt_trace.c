/*
 * test_minigpt_trace.c — minigpt --trace FILE end to end: the built
 * dtrain-launch runs minigpt ranks as processes, and the file they leave
 * must be Chrome trace-event JSON with exactly the slices the run did.
 *
 * - 2 x 2 ranks, --pp 2, ZB-H1, m = 3, 2 steps, DDP with small buckets:
 *   every rank's track has 6 F, 6 B, 6 W, 2 STEP, 2 optimizer steps,
 *   6 sends and 6 receives of the right kind for its stage, and its DDP
 *   buckets; and the timestamps are real: on every rank each micro-batch's
 *   F ends before its B starts, and on stage 1 each activation arrives
 *   before the F that reads it.
 * - the same under --parallel zero1: every gradient piece's reduce to
 *   its owner starts inside the stage's last backward (its last W), as
 *   DDP's buckets leave (dt_zero1_arm), not after it in the step.
 * - 2 ranks of plain DDP with --grad-accum 2, 2 steps: 4 forwards, 4
 *   backwards, 2 optimizer steps and 2 x buckets all-reduces per rank.
 * - 2 ranks of --tp 2, --grad-accum 2, L = 3, 2 steps: every f and g is
 *   its own slice (per layer, 4 micro-steps of each of the four block
 *   sites; 4 each of the embedding, the head and the two cross-entropy
 *   statistics), each with its buffer's bytes and the bytes the rank sent
 *   for it (over 2 ranks an all-reduce sends its buffer once), each g
 *   inside a forward and each f inside a backward of its step; then 2
 *   all-gathers of the shares.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_fixture.h"
#include "run_program.h"

#ifndef LAUNCH_BIN
#error "LAUNCH_BIN must name the built dtrain-launch"
#endif
#ifndef MINIGPT_BIN
#error "MINIGPT_BIN must name the built minigpt"
#endif

/* Runs minigpt on n ranks with --trace root/trace.json and extra flags;
 * returns the parsed file. */
static json_t *traced_run(const char *root, const char *n, const char *const *extra)
{
    char path[256], log[256];
    snprintf(path, sizeof path, "%s/trace.json", root);
    snprintf(log, sizeof log, "%s/run.log", root);
    const char *argv[40] = {LAUNCH_BIN,     "-n", n,          MINIGPT_BIN, "--steps",     "2",
                            "--batch",      "2",  "--layers", "3",         "--data",      "random",
                            "--eval-every", "0",  "--sample", "0",         "--bucket-mb", "0.01",
                            "--trace",      path};
    int k = 20;
    for (; *extra; extra++)
        argv[k++] = *extra;
    argv[k] = NULL;
    char *out = NULL;
    int rc = run_program(argv, log, &out);
    cr_assert_eq(rc, 0, "minigpt exited %d:\n%s", rc, out);
    free(out);
    json_error_t e;
    json_t *doc = json_load_file(path, 0, &e);
    cr_assert(doc, "%s is not JSON: %s (line %d)", path, e.text, e.line);
    cr_assert(json_is_array(json_object_get(doc, "traceEvents")), "no traceEvents array");
    return doc;
}

/* Complete ("X") slices named `name` on track tid. */
static int count(json_t *doc, int tid, const char *name)
{
    json_t *ev;
    size_t i;
    int n = 0;
    json_array_foreach(json_object_get(doc, "traceEvents"), i, ev)
    {
        if (strcmp(json_string_value(json_object_get(ev, "ph")), "X") == 0 &&
            json_integer_value(json_object_get(ev, "tid")) == tid &&
            strcmp(json_string_value(json_object_get(ev, "name")), name) == 0)
            n++;
    }
    return n;
}

/* Start and end (µs) of slice `name` for (tid, step, mb); false if none. */
static bool slice(json_t *doc, int tid, const char *name, int step, int mb, double *t0, double *t1)
{
    json_t *ev;
    size_t i;
    json_array_foreach(json_object_get(doc, "traceEvents"), i, ev)
    {
        json_t *args = json_object_get(ev, "args");
        if (json_integer_value(json_object_get(ev, "tid")) != tid ||
            strcmp(json_string_value(json_object_get(ev, "name")), name) ||
            json_integer_value(json_object_get(args, "step")) != step ||
            json_integer_value(json_object_get(args, "mb")) != mb)
            continue;
        *t0 = json_number_value(json_object_get(ev, "ts"));
        *t1 = *t0 + json_number_value(json_object_get(ev, "dur"));
        return true;
    }
    return false;
}

static void expect_count(json_t *doc, int tid, const char *name, int want)
{
    int got = count(doc, tid, name);
    cr_expect_eq(got, want, "rank %d: %d '%s' slices, expected %d", tid, got, name, want);
}

static void expect_causal(json_t *doc, int tid, const char *before, const char *after)
{
    for (int step = 0; step < 2; step++)
        for (int mb = 0; mb < 3; mb++) {
            double a0, a1, b0, b1;
            cr_assert(slice(doc, tid, before, step, mb, &a0, &a1) &&
                          slice(doc, tid, after, step, mb, &b0, &b1),
                      "rank %d step %d mb %d: no %s or %s", tid, step, mb, before, after);
            cr_expect(a0 >= 0 && a1 >= a0 && a1 <= b0 + 1.0,
                      "rank %d step %d mb %d: %s [%.1f, %.1f] does not end "
                      "before %s starts at %.1f",
                      tid, step, mb, before, a0, a1, after, b0);
        }
}

Test(minigpt_trace, a_2x2_pipelined_run_traces_every_action_of_every_rank, .timeout = 120)
{
    char root[128];
    fixture_mkroot(root, sizeof root);
    const char *flags[] = {"--pp", "2", "--microbatches", "3", "--schedule", "zb", NULL};
    json_t *doc = traced_run(root, "4", flags);
    for (int g = 0; g < 4; g++) {
        int stage = g / 2;
        expect_count(doc, g, "F", 6);
        expect_count(doc, g, "B", 6);
        expect_count(doc, g, "W", 6);
        expect_count(doc, g, "STEP", 2);
        expect_count(doc, g, "optimizer step", 2);
        expect_count(doc, g, stage == 0 ? "send_act" : "recv_act", 6);
        expect_count(doc, g, stage == 0 ? "recv_grad" : "send_grad", 6);
        expect_count(doc, g, stage == 0 ? "recv_act" : "send_act", 0);
        int buckets = count(doc, g, "allreduce bucket");
        cr_expect(buckets >= 4 && buckets % 2 == 0,
                  "rank %d: %d bucket "
                  "all-reduces in 2 steps",
                  g, buckets);
        expect_causal(doc, g, "F", "B");
    }
    expect_causal(doc, 2, "recv_act", "F");
    json_decref(doc);
    fixture_rmtree(root);
}

Test(minigpt_trace, a_ddp_run_traces_micro_steps_buckets_and_optimizer_steps, .timeout = 120)
{
    char root[128];
    fixture_mkroot(root, sizeof root);
    const char *flags[] = {"--grad-accum", "2", NULL};
    json_t *doc = traced_run(root, "2", flags);
    for (int g = 0; g < 2; g++) {
        expect_count(doc, g, "forward", 4);
        expect_count(doc, g, "backward", 4);
        expect_count(doc, g, "optimizer step", 2);
        int buckets = count(doc, g, "allreduce bucket");
        cr_expect(buckets >= 4 && buckets % 2 == 0,
                  "rank %d: %d bucket "
                  "all-reduces in 2 steps",
                  g, buckets);
        expect_count(doc, g, "F", 0);
    }
    json_decref(doc);
    fixture_rmtree(root);
}

/* Every X slice on track tid whose name starts with prefix, in turn. */
static json_t *next_slice(json_t *doc, int tid, const char *prefix, size_t *i)
{
    json_t *evs = json_object_get(doc, "traceEvents");
    for (; *i < json_array_size(evs); (*i)++) {
        json_t *ev = json_array_get(evs, *i);
        const char *name = json_string_value(json_object_get(ev, "name"));
        if (strcmp(json_string_value(json_object_get(ev, "ph")), "X") == 0 &&
            json_integer_value(json_object_get(ev, "tid")) == tid &&
            strncmp(name, prefix, strlen(prefix)) == 0)
            return json_array_get(evs, (*i)++);
    }
    return NULL;
}

/* Is ev inside a slice named `outer` of the same track and step? */
static bool inside(json_t *doc, json_t *ev, const char *outer)
{
    int tid = (int)json_integer_value(json_object_get(ev, "tid"));
    json_int_t step = json_integer_value(json_object_get(json_object_get(ev, "args"), "step"));
    double t0 = json_number_value(json_object_get(ev, "ts"));
    double t1 = t0 + json_number_value(json_object_get(ev, "dur"));
    size_t i = 0;
    for (json_t *o; (o = next_slice(doc, tid, outer, &i));) {
        double a = json_number_value(json_object_get(o, "ts"));
        double b = a + json_number_value(json_object_get(o, "dur"));
        if (json_integer_value(json_object_get(json_object_get(o, "args"), "step")) == step &&
            a <= t0 + 1.0 && t1 <= b + 1.0)
            return true;
    }
    return false;
}

static json_int_t arg_of(json_t *ev, const char *key)
{
    json_t *v = json_object_get(json_object_get(ev, "args"), key);
    return v ? json_integer_value(v) : -1;
}

Test(minigpt_trace, a_tp_run_traces_every_f_and_g_all_reduce_with_its_bytes, .timeout = 120)
{
    char root[128];
    fixture_mkroot(root, sizeof root);
    const char *flags[] = {"--tp", "2", "--grad-accum", "2", NULL};
    json_t *doc = traced_run(root, "2", flags);
    const json_int_t act = 2 * 16 * 32 * 4; /* B·T·C floats: --batch 2, T 16, C 32 */
    const char *block_sites[] = {"g: the attention output", "g: the MLP output",
                                 "f: the MLP's input grad", "f: the attention's input grad"};
    for (int g = 0; g < 2; g++) {
        expect_count(doc, g, "forward", 4);
        expect_count(doc, g, "backward", 4);
        expect_count(doc, g, "optimizer step", 2);
        expect_count(doc, g, "all-gather of the shares", 2);
        for (int k = 0; k < 4; k++) {
            expect_count(doc, g, block_sites[k], 3 * 4);
            int per_layer[3] = {0};
            size_t i = 0;
            for (json_t *ev; (ev = next_slice(doc, g, block_sites[k], &i));) {
                json_int_t l = arg_of(ev, "layer");
                cr_expect(l >= 0 && l < 3, "rank %d: %s at layer %d", g, block_sites[k], (int)l);
                if (l >= 0 && l < 3)
                    per_layer[l]++;
                cr_expect(arg_of(ev, "bytes") == act && arg_of(ev, "sent") == act,
                          "rank %d: %s: bytes %d, sent %d; expected %d each", g, block_sites[k],
                          (int)arg_of(ev, "bytes"), (int)arg_of(ev, "sent"), (int)act);
                const char *outer = block_sites[k][0] == 'g' ? "forward" : "backward";
                cr_expect(inside(doc, ev, outer), "rank %d: a '%s' slice outside every %s", g,
                          block_sites[k], outer);
            }
            for (int l = 0; l < 3; l++)
                cr_expect_eq(per_layer[l], 4, "rank %d: %d '%s' slices at layer %d, expected 4", g,
                             per_layer[l], block_sites[k], l);
        }
        expect_count(doc, g, "the token embedding", 4);
        expect_count(doc, g, "f: the head's input grad", 4);
        expect_count(doc, g, "the logits' row maxima", 4);
        expect_count(doc, g, "the softmax sums and target logits", 4);
        size_t i = 0;
        json_t *ev = next_slice(doc, g, "the logits' row maxima", &i);
        cr_assert(ev, "rank %d: no row maxima", g);
        cr_expect_eq(arg_of(ev, "bytes"), 2 * 16 * 4, "rank %d: row maxima of %d bytes", g,
                     (int)arg_of(ev, "bytes"));
    }
    json_decref(doc);
    fixture_rmtree(root);
}

/* The latest-ending slice named `name` on track tid in step; false if none. */
static bool last_slice(json_t *doc, int tid, const char *name, int step, double *t0, double *t1)
{
    bool found = false;
    size_t i = 0;
    for (json_t *ev; (ev = next_slice(doc, tid, name, &i));) {
        double a = json_number_value(json_object_get(ev, "ts"));
        double b = a + json_number_value(json_object_get(ev, "dur"));
        if (strcmp(json_string_value(json_object_get(ev, "name")), name) == 0 &&
            arg_of(ev, "step") == step && (!found || b > *t1)) {
            *t0 = a, *t1 = b;
            found = true;
        }
    }
    return found;
}

Test(minigpt_trace, a_2x2_pipelined_zero1_run_reduces_every_piece_during_the_stages_last_backward,
     .timeout = 120)
{
    char root[128];
    fixture_mkroot(root, sizeof root);
    const char *flags[] = {"--pp", "2",          "--microbatches", "3", "--schedule",
                           "zb",   "--parallel", "zero1",          NULL};
    json_t *doc = traced_run(root, "4", flags);
    for (int g = 0; g < 4; g++) {
        int pieces = 0;
        size_t i = 0;
        for (json_t *ev; (ev = next_slice(doc, g, "reduce piece", &i)); pieces++) {
            int step = (int)arg_of(ev, "step");
            double w0, w1, t0 = json_number_value(json_object_get(ev, "ts"));
            cr_assert(last_slice(doc, g, "W", step, &w0, &w1), "rank %d step %d: no W", g, step);
            cr_expect(w0 <= t0 + 1.0 && t0 <= w1 + 1.0,
                      "rank %d step %d: piece %d's reduce starts at %.1f us, outside the stage's "
                      "last backward (its last W, [%.1f, %.1f])",
                      g, step, (int)arg_of(ev, "piece"), t0, w0, w1);
        }
        cr_expect(pieces >= 4 && pieces % 2 == 0, "rank %d: %d piece reduces in 2 steps", g,
                  pieces);
    }
    json_decref(doc);
    fixture_rmtree(root);
}
