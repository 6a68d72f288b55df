/*
 * checkpointing.c — minigpt's checkpoints: resume at start, save every
 * --ckpt-every steps, and the seed curriculum's RESUME VERIFIED check.
 *
 * The state saved is the model's replica and the optimizer's (DDP: full
 * m, v; ZeRO-1: this rank's master/m/v shard), the step count, and the
 * data position: the next global row of the stateless batch sequence
 * (model/README.md), so a resumed run reads exactly the rows the
 * uninterrupted one would, even on another world size. The trainer has no
 * other RNG during training (sampling at the end reseeds), so rng_state
 * is the seed.
 *
 * Every decision that must be collective is: the ranks agree that each
 * has found the step directory before they load it, the load is the
 * checkpoint layer's collective one (each shard hashed by one rank, one
 * verdict for all), and so is the save. With the seed preset and no
 * --ckpt-dir, rank 0 makes a temporary root (its name broadcast to all),
 * removed at exit: the curriculum's check needs a checkpoint, not a place
 * to keep it. A device backend's state is saved and loaded through host
 * copies (ckpt_staging.c).
 */
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trainer.h"

static dt_status ck_fail(mg_run *r, dt_status st, const char *what)
{
    snprintf(r->err, sizeof r->err, "rank %d: checkpoint: %s: %s", r->rank, what,
             r->ck && *dt_ckpt_error(r->ck) ? dt_ckpt_error(r->ck) : dt_status_name(st));
    return st;
}

/* All ranks agree on a verdict: true only if ok on every rank. */
static dt_status agree(mg_run *r, bool *ok)
{
    int32_t v = *ok;
    if (r->comm) {
        dt_status st = dt_allreduce(r->comm, &v, 1, DT_I32, DT_MIN);
        if (st != DT_OK)
            return st;
    }
    *ok = v != 0;
    return DT_OK;
}

/* Rank 0's temporary root, its name broadcast (fixed 128 bytes). */
static dt_status temp_root(mg_run *r)
{
    char name[sizeof r->ckpt_tmp] = {0};
    if (r->rank == 0) {
        const char *t = getenv("TMPDIR");
        snprintf(name, sizeof name, "%s/minigpt-ckpt-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(name))
            name[0] = '\0';
    }
    if (r->comm) {
        dt_status st = dt_broadcast(r->comm, name, sizeof name, DT_U8, 0);
        if (st != DT_OK)
            return ck_fail(r, st, "sharing the temporary directory's name");
    }
    if (!name[0])
        return ck_fail(r, DT_ESYS, "rank 0 could not make a temporary directory");
    memcpy(r->ckpt_tmp, name, sizeof name);
    return DT_OK;
}

/* Makes the root if it is missing and writes and removes a file in it, so
 * that a path the run cannot write fails before step 1, not at the first
 * save. Every rank checks (each writes its own shard); all agree. */
static dt_status check_writable(mg_run *r, const char *root)
{
    char probe[PATH_MAX], why[512] = "";
    snprintf(probe, sizeof probe, "%s/.minigpt-write-check-XXXXXX", root);
    int fd = -1;
    if (mkdir(root, 0755) != 0 && errno != EEXIST)
        snprintf(why, sizeof why, "cannot create it: %s", strerror(errno));
    else if ((fd = mkstemp(probe)) < 0)
        snprintf(why, sizeof why, "cannot write in it: %s", strerror(errno));
    if (fd >= 0) {
        close(fd);
        unlink(probe);
    }
    bool ok = !why[0];
    dt_status st = agree(r, &ok);
    if (st != DT_OK)
        return ck_fail(r, st, "agreeing that --ckpt-dir is writable");
    if (ok)
        return DT_OK;
    snprintf(r->err, sizeof r->err,
             "rank %d: checkpoint: --ckpt-dir %.300s: %s "
             "(checked at start, before step 1)",
             r->rank, root, why[0] ? why : "another rank cannot write it");
    return DT_ESYS;
}

dt_status mg_ckpt_open(mg_run *r)
{
    const mg_options *o = &r->o;
    const char *root = o->ckpt_dir;
    if (!root && o->verify_resume && o->ckpt_every > 0) {
        dt_status st = temp_root(r);
        if (st != DT_OK)
            return st;
        root = r->ckpt_tmp;
    }
    if (!root)
        return DT_OK;
    if (o->ckpt_dir && o->ckpt_every <= 0 && r->rank == 0)
        fprintf(stderr,
                "minigpt: note: --ckpt-dir %s is given but no save is "
                "scheduled (--ckpt-every is 0): this run writes no checkpoint\n",
                o->ckpt_dir);
    dt_ckpt_options co = {.keep = o->keep, .allow_reshard = true};
    dt_status st = dt_ckpt_open(&r->ck, root, &co);
    if (st != DT_OK)
        return ck_fail(r, st, "open");
    return o->ckpt_dir && o->ckpt_every > 0 ? check_writable(r, o->ckpt_dir) : DT_OK;
}

static int rm_one(const char *p, const struct stat *sb, int f, struct FTW *w)
{
    (void)sb;
    (void)f;
    (void)w;
    return remove(p);
}

/* The handle first: closing it waits for its background removal of
 * rotated-out steps, which must not race the removal of the root. */
void mg_ckpt_close(mg_run *r)
{
    dt_ckpt_close(r->ck);
    r->ck = NULL;
    if (r->ckpt_tmp[0] && r->rank == 0)
        nftw(r->ckpt_tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Rows per step: D replicas x M micro-batches in a pipelined run, D
 * replicas x grad_accum micro-batches under --tp. */
static uint64_t global_batch(const mg_run *r)
{
    if (r->three_d)
        return (uint64_t)r->dp * (uint64_t)mg_microbatches(&r->o) * (uint64_t)r->o.batch;
    if (r->tp)
        return (uint64_t)r->dp * (uint64_t)r->o.grad_accum * (uint64_t)r->o.batch;
    if (r->pipe)
        return (uint64_t)r->dp * (uint64_t)mg_microbatches(&r->o) * (uint64_t)r->o.batch;
    return (uint64_t)r->world * (uint64_t)r->o.grad_accum * (uint64_t)r->o.batch;
}

/* The model and optimizer of this rank as a checkpoint state; a stage
 * saves the slice the pipeline layout gives it, a tp rank its share's
 * (tp_checkpoint.c), a rank of a 3-D grid its range's
 * (three_d_checkpoint.c). */
static dt_status state_of(mg_run *r, dt_ckpt_state *s)
{
    if (r->three_d)
        return mg_3d_ckpt_state(r, mg_3d_stage(r), s);
    if (r->tp)
        return mg_tp_ckpt_state(r, s);
    dt_status st = dt_ckpt_state_of(s, r->m, r->zero1, r->rank, r->world);
    s->slices = r->ckpt_slices;
    return st;
}

/* The step directory --resume names: "auto" = latest under --ckpt-dir (or
 * none yet), a directory with a manifest, or a root with a latest. */
static dt_status resume_dir(mg_run *r, dt_ckpt *h, char *dir, size_t len, bool *none)
{
    const char *what = r->o.resume;
    char man[4200];
    snprintf(man, sizeof man, "%s/manifest.json", what);
    if (strcmp(what, "auto") != 0 && access(man, F_OK) == 0) {
        snprintf(dir, len, "%s", what);
        return DT_OK;
    }
    dt_status st = dt_ckpt_latest(h, dir, len);
    *none = st != DT_OK && strcmp(what, "auto") == 0 &&
            dt_ckpt_last_fault(h) == DT_CKPT_FAULT_NO_CHECKPOINT;
    return st;
}

/* What a rank found before the collective load, ordered so that the
 * all-reduce below can tell agreement from disagreement. */
enum { RESUME_FAILED = 0, RESUME_NONE = 1, RESUME_READY = 2 };

/* The lowest and the highest code over all ranks. */
static dt_status agree_range(mg_run *r, int32_t code, int32_t *lo, int32_t *hi)
{
    int32_t v[2] = {code, -code};
    if (r->comm) {
        dt_status st = dt_allreduce(r->comm, v, 2, DT_I32, DT_MIN);
        if (st != DT_OK)
            return st;
    }
    *lo = v[0];
    *hi = -v[1];
    return DT_OK;
}

/*
 * Every rank finds the step directory on its own, then the ranks agree
 * that all of them have one (or that none has: a fresh start) before the
 * collective load, which every rank must enter or none. The load itself
 * returns the same verdict on every rank.
 */
static dt_status resume_held(mg_run *r);

/* A pipeline stage's ZeRO-3 holds its stage whole for a save or a load;
 * ZeRO-3 of the whole model saves and loads its shard (dt_ckpt_state_of:
 * the master is its parameters), and a 3-D run its ranges: nothing to
 * hold. A shard that is empty (Ψ < ranks) is held as before. */
static dt_status hold(mg_run *r, bool on)
{
    size_t lo = 0, n = 0;
    if (mg_eval_collective(r))
        dt_zero1_shard(r->zero1, &lo, &n);
    return r->three_d || n > 0 ? DT_OK : mg_params_hold(r, on);
}

/* ZeRO-3 of the whole model loads into its shard; a stage's, into its
 * stage held whole (the master shard, loaded too, is what it keeps). */
dt_status mg_ckpt_resume(mg_run *r)
{
    if (!r->o.resume)
        return DT_OK;
    dt_status st = hold(r, true);
    if (st == DT_OK)
        st = resume_held(r);
    dt_status released = st == DT_OK ? hold(r, false) : DT_OK;
    if (st == DT_OK && r->tp && r->start_step > 0) /* the copy evaluation reads */
        st = mg_tp_assemble(r);
    if (st == DT_OK && r->three_d && r->start_step > 0)
        st = mg_3d_assemble(r);
    return st != DT_OK ? st : released;
}

static dt_status resume_held(mg_run *r)
{
    dt_ckpt *h = r->ck;
    bool own = strcmp(r->o.resume, "auto") != 0;
    dt_ckpt_options co = {.allow_reshard = true};
    char dir[4200], msg[1024] = "";
    bool none = false;
    dt_ckpt_state s = {0}, dev; /* s: host (a mirror of dev on a device) */
    int32_t code = RESUME_READY, lo = RESUME_FAILED, hi = RESUME_FAILED;
    if (own && dt_ckpt_open(&h, r->o.resume, &co) != DT_OK)
        code = RESUME_FAILED;
    else if (resume_dir(r, h, dir, sizeof dir, &none) != DT_OK)
        code = none ? RESUME_NONE : RESUME_FAILED;
    else if (state_of(r, &dev) != DT_OK || mg_state_mirror(r, &dev, &s, false) != DT_OK)
        code = RESUME_FAILED;
    if (code == RESUME_FAILED)
        snprintf(msg, sizeof msg, "resume: %s",
                 h && *dt_ckpt_error(h) ? dt_ckpt_error(h) : "out of memory");
    dt_status st = agree_range(r, code, &lo, &hi);
    if (st == DT_OK && lo == RESUME_READY &&
        dt_ckpt_load_collective(h, r->comm, dir, &s) != DT_OK) {
        snprintf(msg, sizeof msg, "resume: %s", dt_ckpt_error(h));
        lo = RESUME_FAILED;
    }
    if (st == DT_OK && lo == RESUME_READY)
        mg_state_copy_in(r, &dev, &s);
    mg_state_mirror_free(r, &s);
    if (own)
        dt_ckpt_close(h);
    if (st != DT_OK || lo != hi || lo == RESUME_FAILED) {
        snprintf(r->err, sizeof r->err, "rank %d: checkpoint: %s", r->rank,
                 msg[0]     ? msg
                 : lo != hi ? "ranks disagree on whether there "
                              "is a checkpoint to resume from"
                            : "another rank could not "
                              "find the checkpoint");
        return st != DT_OK ? st : DT_EPROTO;
    }
    if (lo == RESUME_NONE) {
        if (r->rank == 0)
            printf("resume: no checkpoint under %s yet, starting at step 0\n", r->o.ckpt_dir);
        return DT_OK;
    }
    if (s.step > INT_MAX) { /* every rank loaded the same step: all fail */
        snprintf(r->err, sizeof r->err,
                 "rank %d: checkpoint: resume: %.400s: "
                 "step %ld is past the last step the trainer counts (%d)",
                 r->rank, dir, s.step, INT_MAX);
        return DT_EINVAL;
    }
    r->start_step = (int)s.step;
    r->row0 = s.data_row;
    if (r->rank == 0)
        printf("resume: %s: step %ld, next row %llu\n", dir, s.step,
               (unsigned long long)s.data_row);
    return DT_OK;
}

/* Reloads what was just saved (collectively: every rank calls this) and
 * compares it with memory, every array. */
static bool snapshot_equal(mg_run *r, const dt_ckpt_state *live, char *why, size_t len)
{
    char dir[4200];
    dt_ckpt_state s = *live;
    size_t n = live->held_n ? live->held_n : live->num_params;
    size_t k = live->opt_n ? live->opt_n : 1;
    s.params = calloc(n, sizeof(float));
    s.adam_m = calloc(k, sizeof(float));
    s.adam_v = calloc(k, sizeof(float));
    s.master = live->master ? calloc(k, sizeof(float)) : NULL;
    s.step = -1;
    bool ok = s.params && s.adam_m && s.adam_v && (s.master || !live->master);
    snprintf(why, len, "reload: out of memory");
    if (ok && dt_ckpt_latest(r->ck, dir, sizeof dir) != DT_OK) {
        snprintf(why, len, "reload: %s", dt_ckpt_error(r->ck));
        ok = false;
    }
    /* the collective load needs every rank or none */
    bool all = ok;
    if (agree(r, &all) != DT_OK || !all) {
        if (ok)
            snprintf(why, len, "reload: another rank could not start it");
        ok = false;
    } else if (dt_ckpt_load_collective(r->ck, r->comm, dir, &s) != DT_OK) {
        snprintf(why, len, "reload: %s", dt_ckpt_error(r->ck));
        ok = false;
    }
    const char *diff = !ok                                                 ? NULL
                       : memcmp(s.params, live->params, n * sizeof(float)) ? "parameters"
                       : live->master && memcmp(s.master, live->master, live->opt_n * 4) ? "master"
                       : memcmp(s.adam_m, live->adam_m, live->opt_n * sizeof(float))     ? "m"
                       : memcmp(s.adam_v, live->adam_v, live->opt_n * sizeof(float))     ? "v"
                       : s.step != live->step || s.data_row != live->data_row            ? "step"
                                                                                         : NULL;
    if (diff) {
        snprintf(why, len, "the reloaded %s differ from memory", diff);
        ok = false;
    }
    free(s.params);
    free(s.adam_m);
    free(s.adam_v);
    free(s.master);
    return ok;
}

static dt_status save_and_verify(mg_run *r, const dt_ckpt_state *s, int done);

dt_status mg_ckpt_after_step(mg_run *r, int done)
{
    const mg_options *o = &r->o;
    if (!r->ck || o->ckpt_every <= 0 || done % o->ckpt_every != 0)
        return DT_OK;
    dt_ckpt_state dev, s;
    dt_status st = hold(r, true); /* a stage's ZeRO-3: saves its stage's slice */
    if (st != DT_OK)
        return st;
    if (r->zero1 && (st = dt_zero1_masters_to_params(r->zero1)) != DT_OK) /* bf16: not rounded */
        return ck_fail(r, st, dt_zero1_error(r->zero1));
    if ((st = state_of(r, &dev)) != DT_OK)
        return ck_fail(r, st, "describing the state");
    dev.step = done;
    dev.seed = o->seed;
    dev.rng_state = o->seed;
    dev.data_row = r->row0 + (uint64_t)(done - r->start_step) * global_batch(r);
    if ((st = mg_state_mirror(r, &dev, &s, true)) != DT_OK)
        return ck_fail(r, st, "copying the device state to the host");
    st = save_and_verify(r, &s, done);
    mg_state_mirror_free(r, &s);
    dt_status released = st == DT_OK ? hold(r, false) : DT_OK;
    return st != DT_OK ? st : released;
}

/* Saves s (host memory) and, the first time with --verify-resume, reloads
 * it and compares. */
static dt_status save_and_verify(mg_run *r, const dt_ckpt_state *sp, int done)
{
    const mg_options *o = &r->o;
    dt_ckpt_state s = *sp;
    dt_status st;
    if ((st = dt_ckpt_save(r->ck, r->comm, &s)) != DT_OK)
        return ck_fail(r, st, "save");
    if (r->rank == 0)
        printf("checkpoint: step %d saved under %s\n", done,
               o->ckpt_dir ? o->ckpt_dir : "a temporary directory");
    if (!o->verify_resume || r->verified)
        return DT_OK;
    char why[1100] = "another rank's state differs";
    bool ok = snapshot_equal(r, &s, why, sizeof why);
    bool all = ok;
    if ((st = agree(r, &all)) != DT_OK)
        return ck_fail(r, st, "agreeing on the verification");
    if (!all) {
        snprintf(r->err, sizeof r->err,
                 "rank %d: RESUME NOT VERIFIED at step "
                 "%d: %s",
                 r->rank, done, why);
        return DT_EPROTO;
    }
    r->verified = true;
    if (r->rank == 0)
        printf("RESUME VERIFIED: step %d reloaded on %d ranks, parameters, "
               "%smoments m and v, and step byte-equal to memory\n",
               done, r->world, r->zero1 || r->tpz ? "master shard, " : "");
    return DT_OK;
}
