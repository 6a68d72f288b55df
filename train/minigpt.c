/*
 * minigpt.c — the minigpt program: trains MiniGPT as one rank of a
 * data-parallel job.
 *
 *   dtrain-launch -n 4 ./minigpt                  the embedded task, DDP
 *   dtrain-launch -n 4 ./minigpt --preset seed    the seed curriculum's run
 *   mpirun -n 4 -x DT_INIT_URL=file:///tmp/j ./minigpt
 *   ./minigpt                                     one process, no network
 *
 * A rank learns who it is from the environment (RANK, WORLD_SIZE,
 * DT_INIT_URL, DT_SECRET, DT_JOB_ID as dtrain-launch sets them, or
 * OpenMPI's and Slurm's names); with no world size set at all it trains
 * alone, with the same arithmetic and no communicator.
 *
 * The story of main: options -> communicator -> data, model, optimizer
 * (trainer.c; the optimizer broadcasts rank 0's weights) -> --resume
 * (checkpointing.c) -> steps, each followed by the --ckpt-every save, rank 0
 * printing a line every --log-every steps and the task's accuracy every
 * --eval-every -> summary, loss table, memory tables, a sample. Only rank
 * 0 prints, except errors, which every rank reports with its rank; the
 * exit status is non-zero on any failure, so a launcher can tell.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dt_clock.h"
#include "trainer.h"

/* Joins the job the environment describes, or none when no world size is
 * set (then r->comm stays NULL and the run is one process). */
static int join_job(mg_run *r)
{
    if (!getenv("WORLD_SIZE") && !getenv("OMPI_COMM_WORLD_SIZE") && !getenv("SLURM_NTASKS")) {
        r->rank = 0;
        r->world = 1;
        return 0;
    }
    dt_comm_options co;
    dt_comm_options_default(&co);
    uint8_t secret[64];
    char err[256];
    if (dt_comm_options_from_env(&co, secret, sizeof secret, err, sizeof err) != DT_OK) {
        fprintf(stderr, "minigpt: %s\n", err);
        return 1;
    }
    if (r->o.wire)
        co.wire = strcmp(r->o.wire, "gloo") == 0 ? DT_WIRE_GLOO : DT_WIRE_DTRAIN;
    r->rank = co.rank;
    r->world = co.world_size;
    r->gloo_wire = co.wire == DT_WIRE_GLOO;
    if (r->world == 1)
        return 0;
    if (strcmp(r->o.device, "cuda") == 0) { /* stage device buffers */
        char name[32];
        snprintf(name, sizeof name, "cuda:%d", mg_local_rank());
        if (dt_device_open(&r->dev, name, err, sizeof err) != DT_OK) {
            fprintf(stderr, "minigpt: rank %d: %s\n", r->rank,
                    r->dev ? dt_device_error(r->dev) : err);
            dt_device_close(r->dev);
            r->dev = NULL;
            return 1;
        }
        co.device = r->dev;
    }
    dt_status st = dt_comm_init(&r->comm, &co);
    if (st != DT_OK) {
        fprintf(stderr, "minigpt: rank %d: joining the job: %s\n", r->rank,
                r->comm ? dt_comm_error(r->comm) : "out of memory");
        dt_comm_destroy(r->comm);
        r->comm = NULL;
        return 1;
    }
    return 0;
}

/* Validation loss and (for the task) exact-match accuracy: every rank
 * evaluates its share (evaluation.c), rank 0 prints. *acc is set to the
 * accuracy (-1 if none). */
static dt_status evaluate(mg_run *r, mg_metrics *mx, int step, double *acc)
{
    mg_eval e;
    dt_status st = mg_evaluate(r, &e);
    if (st != DT_OK || r->rank != 0)
        return st;
    *acc = e.accuracy;
    printf("eval @ step %d: val loss %.4f", step, (double)e.val_loss);
    if (e.accuracy >= 0)
        printf(", exact-match accuracy %.1f%% (%zu held-out prompts)", 100 * e.accuracy, e.prompts);
    printf("\n");
    mg_metrics_eval(mx, step, e.val_loss, e.accuracy);
    return DT_OK;
}

/* Hashes every rank's parameters and compares. ZeRO-3 (a pipeline
 * stage's too) streams the hash through its units: no rank holds the
 * whole model, nor a whole stage. */
static dt_status check_replicas(mg_run *r, int step, bool quiet)
{
    bool units = mg_eval_units(r);
    dt_status st = units ? DT_OK : mg_params_hold(r, true); /* 3-D */
    if (st == DT_OK && r->pipe) {
        st = mg_pipe_check_replicas(r, step, quiet, units);
        dt_status released = units ? DT_OK : mg_params_hold(r, false);
        return st != DT_OK ? st : released;
    }
    if (st == DT_OK && !units)
        st = mg_settle_params(r);
    if (st != DT_OK)
        return st;
    bool same = false;
    uint64_t hash0[1];
    uint64_t *hashes = calloc((size_t)r->world, sizeof *hashes);
    st = r->zero1 ? dt_zero1_check_replicas(r->zero1, &same, hashes ? hashes : hash0) /* masters */
                  : dt_check_replicas(r->comm, r->m, &same, hashes ? hashes : hash0);
    if (st != DT_OK && r->zero1)
        snprintf(r->err, sizeof r->err, "rank %d: replica check after step %d: %s", r->rank, step,
                 dt_zero1_error(r->zero1));
    if (st == DT_OK && !same) {
        fprintf(stderr,
                "minigpt: rank %d: after step %d the ranks' "
                "parameters differ:",
                r->rank, step);
        for (int q = 0; hashes && q < r->world; q++)
            fprintf(stderr, " %d:%016llx", q, (unsigned long long)hashes[q]);
        fprintf(stderr, "\n");
        snprintf(r->err, sizeof r->err,
                 "rank %d: replica check after step %d: the ranks' parameters differ", r->rank,
                 step);
        st = DT_EPROTO;
    } else if (st == DT_OK && !quiet && r->rank == 0 && r->world == 1) {
        printf("replicas: 1 rank holds the parameters (hash %016llx)\n",
               (unsigned long long)(hashes ? hashes[0] : hash0[0]));
    } else if (st == DT_OK && !quiet && r->rank == 0) {
        printf("replicas: all %d ranks hold bitwise identical parameters "
               "(hash %016llx)\n",
               r->world, (unsigned long long)(hashes ? hashes[0] : hash0[0]));
    }
    free(hashes);
    dt_status released = units ? DT_OK : mg_params_hold(r, false);
    return st != DT_OK ? st : released;
}

/* --die-at-step: the fault the restart test injects. Only on the first
 * attempt, so that the restarted group runs to the end. */
static void maybe_die(const mg_run *r, int done)
{
    const char *rc = getenv("DT_RESTART_COUNT");
    if (r->o.die_at_step > 0 && done == r->o.die_at_step && r->rank == r->world - 1 &&
        (!rc || strcmp(rc, "0") == 0)) {
        fprintf(stderr, "minigpt: rank %d: --die-at-step %d: SIGKILL\n", r->rank, done);
        raise(SIGKILL);
    }
}

/* MINIGPT_TEST_PAUSE=RANK:STEP:SECONDS, a test hook: rank RANK sleeps SECONDS
 * after step STEP, as a rank busy alone would (its communicator still
 * answers: tests/test_minigpt_clocks.c). */
static void maybe_pause(const mg_run *r, int done)
{
    const char *hook = getenv("MINIGPT_TEST_PAUSE");
    int rank, step;
    unsigned seconds;
    if (hook && sscanf(hook, "%d:%d:%u", &rank, &step, &seconds) == 3 && rank == r->rank &&
        step == done)
        sleep(seconds);
}

/* The step loop; returns the mean hidden share over steps that
 * communicated (-1 if none) through *mean_hidden. */
static dt_status train(mg_run *r, mg_metrics *mx, double *mean_hidden, double *acc)
{
    const mg_options *o = &r->o;
    bool tty = mg_progress_wanted(r->rank);
    double hidden_sum = 0;
    int hidden_n = 0;
    for (int s = r->start_step; s < o->steps; s++) {
        mg_step st_info = {0};
        dt_status st = mg_train_step(r, s, &st_info);
        if (st != DT_OK)
            return st;
        if (st_info.comm.hidden >= 0 && s > r->start_step) { /* warm-up */
            hidden_sum += st_info.comm.hidden;
            hidden_n++;
        }
        if (o->check_replicas && (st = check_replicas(r, s + 1, true)) != DT_OK)
            return st;
        maybe_die(r, s + 1);
        maybe_pause(r, s + 1);
        if ((st = mg_ckpt_after_step(r, s + 1)) != DT_OK)
            return st;
        bool eval = o->eval_every > 0 && (s + 1) % o->eval_every == 0 && s + 1 < o->steps;
        if (eval && (st = mg_eval_params(r, true)) != DT_OK) /* every rank: ZeRO-3 */
            return st;
        if (r->rank == 0) {
            mg_metrics_step(mx, s, &st_info);
            if (tty)
                mg_progress_clear(stdout);
            if ((s + 1) % o->log_every == 0 || s == r->start_step || s + 1 == o->steps)
                mg_report_step(stdout, s, &st_info, r);
        }
        if (eval && (st = evaluate(r, mx, s + 1, acc)) != DT_OK)
            return st;
        if (r->rank == 0 && tty)
            mg_progress(stdout, s + 1, o->steps, st_info.loss);
        if (eval && (st = mg_eval_params(r, false)) != DT_OK)
            return st;
    }
    if (tty)
        mg_progress_clear(stdout);
    *mean_hidden = hidden_n ? hidden_sum / hidden_n : -1;
    return DT_OK;
}

/* The steps this run made (not the checkpoint's), their time and loss. A
 * run resumed at its last step makes none and has no loss of its own. */
static void print_summary(const mg_run *r, double secs, double mean_hidden)
{
    const mg_options *o = &r->o;
    if (r->start_step >= o->steps) {
        printf("summary: no steps to make (resumed at step %d, the last of --steps %d); "
               "the checkpoint's model is evaluated as it is\n",
               r->start_step, o->steps);
        return;
    }
    printf("summary: %d steps", o->steps - r->start_step);
    if (r->start_step > 0)
        printf(" (resumed at step %d, ended at step %d)", r->start_step, o->steps);
    printf(" in %.2f s, loss %.4f -> %.4f", secs, (double)r->losses[r->start_step],
           (double)r->losses[o->steps - 1]);
    if (mean_hidden >= 0)
        printf(", communication hidden behind compute %.0f%% (mean)", 100 * mean_hidden);
    printf("\n");
}

/* Everything after the last step: summary, tables, sample. */
static dt_status finish(mg_run *r, mg_metrics *mx, double secs, double mean_hidden, double acc)
{
    const mg_options *o = &r->o;
    r->phase = "end of run: traffic";
    dt_status st = r->start_step < o->steps ? mg_close_traffic(r) : DT_OK;
    r->phase = "end of run: replica check";
    if (st == DT_OK)
        st = check_replicas(r, o->steps, false);
    if (st == DT_OK) {
        r->phase = "end of run: traffic totals";
        st = mg_gather_traffic(r);
    }
    if (st == DT_OK) {
        r->phase = "final evaluation";
        st = mg_eval_params(r, true); /* ZeRO-3: the units, on every rank */
    }
    if (st == DT_OK)
        st = evaluate(r, mx, o->steps, &acc);
    if (st != DT_OK)
        return st;
    if (r->rank == 0) {
        print_summary(r, secs, mean_hidden);
        mg_metrics_summary(mx, r, secs, mean_hidden, acc);
        if (o->loss_table)
            mg_report_loss_table(stdout, r);
        if (r->zero1)
            printf("optimizer shard bytes per rank: %zu\n", dt_zero1_optimizer_bytes(r->zero1));
        if (!r->pipe && !r->tp && !r->three_d)
            mg_report_memory_model(stdout, r);
        mg_report_traffic(stdout, r);
    }
    fflush(stdout);
    r->phase = "end of run: reports";
    if (r->pipe && (st = mg_report_pipeline(stdout, r)) != DT_OK)
        return st;
    fflush(stdout);
    if (r->pipe && o->gantt && (st = mg_lesson_gantt(stdout, r)) != DT_OK)
        return st;
    fflush(stdout);
    if (r->pipe && o->bubble_table && (st = mg_lesson_bubbles(stdout, r)) != DT_OK)
        return st;
    if ((st = mg_eval_params(r, false)) != DT_OK) /* what a rank holds while training */
        return st;
    r->phase = "end of run: memory report";
    /* r->m is not what a tp (or 3-D) rank holds */
    st = r->tp || r->three_d ? DT_OK : mg_report_memory(stdout, r);
    if (st == DT_OK && r->trace)
        r->phase = "end of run: trace";
    if (st == DT_OK && r->trace)
        st = mg_trace_write(r->trace, r, o->trace);
    bool sample = o->sample > 0 && !r->pipe;
    if (st == DT_OK && sample)
        r->phase = "sampling";
    if (st == DT_OK && sample)
        st = mg_eval_params(r, true);
    if (st == DT_OK && sample && (r->rank == 0 || mg_eval_collective(r)))
        mg_sample(r, r->rank == 0 ? stdout : NULL, o->sample);
    if (st == DT_OK && sample)
        st = mg_eval_params(r, false);
    return st;
}

/* Tells the peers why this rank is leaving: the ABORT frame carries the
 * text, so their errors name the real reason ("cannot open ...") and a
 * launcher can see whose failure it was. abort adds "rank N: aborted: ",
 * so the rank prefix of our own message is dropped. */
static void abort_job(mg_run *r, dt_status st)
{
    char prefix[32], line[sizeof r->err + 128];
    int n = snprintf(prefix, sizeof prefix, "rank %d: ", r->rank);
    mg_failure_line(r, st, line, sizeof line);
    const char *why = line;
    if (!strncmp(why, prefix, (size_t)n))
        why += n;
    dt_comm_abort(r->comm, why);
}

int main(int argc, char **argv)
{
    /* Under a launcher stdout is a pipe, which stdio buffers fully: step
     * lines would arrive at the end of the run, and all of them would be
     * lost if the rank were killed. A line at a time costs a write per
     * line, and there are only a few lines per log interval. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    mg_run r = {0};
    mg_options_default(&r.o);
    int rc = mg_options_parse(&r.o, argc, argv);
    if (rc)
        return rc == 1 ? 0 : rc;
    /* the rank's compute threads: --threads, else OMP_NUM_THREADS, else
     * the node's cores shared out among its ranks (torchrun's advice) */
    const char *omp = getenv("OMP_NUM_THREADS");
    if (r.o.threads == 0 && omp && atoi(omp) > 0)
        r.o.threads = atoi(omp) < 256 ? atoi(omp) : 256;
    if (r.o.threads == 0)
        r.o.threads = dt_threads_default(mg_local_world_size());
    dt_threads_use(r.o.threads);
    if (join_job(&r)) {
        dt_device_close(r.dev);
        return 1;
    }
    if (r.rank == 0 && r.o.expect_ranks && r.o.expect_ranks != r.world)
        printf("note: preset %s expects %d ranks, running on %d\n", r.o.preset, r.o.expect_ranks,
               r.world);
    mg_metrics *mx = NULL;
    r.phase = "start-up";
    dt_status st = mg_check_modes(&r);
    if (st == DT_OK && r.o.trace && !(r.trace = mg_trace_open())) /* before --tp's hook */
        st = DT_ENOMEM;
    if (st == DT_OK)
        st = mg_run_open(&r);
    if (st == DT_OK)
        st = mg_ckpt_open(&r);
    if (st == DT_OK)
        st = mg_ckpt_resume(&r);
    if (st == DT_OK && r.rank == 0) {
        /* MFU's denominator: sgemm on this rank's threads, ~0.1 s */
        if (strcmp(r.o.device, "cpu") == 0)
            r.peak_gflops = dt_cpu_gemm_peak(512, 5);
        mg_report_header(stdout, &r);
        if (r.o.metrics && !(mx = mg_metrics_open(r.o.metrics, &r)))
            fprintf(stderr, "minigpt: cannot write metrics to %s\n", r.o.metrics);
    }
    double t0 = dt_now(), hidden = -1, acc = -1;
    r.phase = "training";
    if (st == DT_OK)
        st = train(&r, mx, &hidden, &acc);
    if (st == DT_OK)
        st = finish(&r, mx, dt_now() - t0, hidden, acc);
    if (st != DT_OK) {
        char line[sizeof r.err + 128];
        mg_failure_line(&r, st, line, sizeof line);
        fprintf(stderr, "minigpt: %s\n", line);
        if (r.comm)
            abort_job(&r, st);
    }
    mg_metrics_close(mx);
    mg_trace_close(r.trace);
    mg_ckpt_close(&r);
    mg_run_close(&r);
    fflush(stdout);
    dt_comm_destroy(r.comm);
    dt_device_close(r.dev);
    return st == DT_OK ? 0 : 1;
}
