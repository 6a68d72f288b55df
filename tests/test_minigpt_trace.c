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
 * - 2 ranks of plain DDP with --grad-accum 2, 2 steps: 4 forwards, 4
 *   backwards, 2 optimizer steps and 2 x buckets all-reduces per rank.
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
