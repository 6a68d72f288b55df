/*
 * test_checkpoint_rotate.c — `--keep K` rotation: which step directories
 * stay (the K newest committed ones, and whatever `latest` names), that
 * uncommitted ones go, that rotated-out steps are removed in the background
 * and are gone once the handle closes, and that the leftovers of a removal
 * cut short by a crash go at the next save.
 *
 * States are synthetic (ckpt_fixture.h), written by one process as shards
 * (dt_ckpt_save_all), so the tests need no network.
 */
#include <dirent.h>
#include <sys/stat.h>

#include "ckpt_fixture.h"

static int count_step_dirs(const char *root)
{
    int n = 0;
    for (long s = 0; s < 40; s++) {
        char p[256];
        struct stat st;
        snprintf(p, sizeof p, "%s/step_%08ld", root, s);
        n += stat(p, &st) == 0;
    }
    return n;
}

Test(checkpoint_rotate, keep_rotates_by_step_and_removes_uncommitted_dirs, .timeout = 30)
{
    char root[128];
    fixture_mkroot(root, sizeof root);
    dt_ckpt_options o = {.keep = 2};
    dt_ckpt *ck;
    cr_assert_eq(dt_ckpt_open(&ck, root, &o), DT_OK);
    char crashed[256];
    snprintf(crashed, sizeof crashed, "%s/step_00000003", root);
    cr_assert_eq(mkdir(crashed, 0755), 0);
    for (long s = 1; s <= 5; s++) {
        if (s == 3)
            continue;
        full_state f;
        full_state_init(&f, DT_CKPT_DDP, s);
        cr_assert_eq(dt_ckpt_save_all(ck, &f.s, 2), DT_OK, "%s", dt_ckpt_error(ck));
        full_state_free(&f);
    }
    cr_assert_eq(count_step_dirs(root), 2);
    struct stat st;
    snprintf(crashed, sizeof crashed, "%s/step_00000005/manifest.json", root);
    cr_assert_eq(stat(crashed, &st), 0);
    snprintf(crashed, sizeof crashed, "%s/step_00000004/manifest.json", root);
    cr_assert_eq(stat(crashed, &st), 0);
    dt_ckpt_close(ck);
    fixture_rmtree(root);
}

/* The names in root other than "." and "..", sorted, joined by ' '. */
static void list_root(const char *root, char *buf, size_t len)
{
    struct dirent **names;
    int n = scandir(root, &names, NULL, alphasort);
    cr_assert_geq(n, 0, "scandir %s", root);
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        const char *nm = names[i]->d_name;
        if (strcmp(nm, ".") && strcmp(nm, ".."))
            snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", buf[0] ? " " : "", nm);
        free(names[i]);
    }
    free(names);
}

static void save_steps(dt_ckpt *ck, long first, long last)
{
    for (long s = first; s <= last; s++) {
        full_state f;
        full_state_init(&f, DT_CKPT_DDP, s);
        cr_assert_eq(dt_ckpt_save_all(ck, &f.s, 2), DT_OK, "%s", dt_ckpt_error(ck));
        full_state_free(&f);
    }
}

/* Rotated-out steps are removed in the background; once the handle is
 * closed nothing of them is left, not even under another name. */
Test(checkpoint_rotate, rotated_out_steps_are_gone_once_the_handle_is_closed, .timeout = 30)
{
    char root[128], names[1024];
    fixture_mkroot(root, sizeof root);
    dt_ckpt_options o = {.keep = 1};
    dt_ckpt *ck;
    cr_assert_eq(dt_ckpt_open(&ck, root, &o), DT_OK);
    save_steps(ck, 1, 4);
    dt_ckpt_close(ck);
    list_root(root, names, sizeof names);
    cr_assert_str_eq(names, "latest step_00000004");
    fixture_rmtree(root);
}

/* What a saver killed while removing a rotated-out step leaves behind. */
static void plant_interrupted_removal(const char *root)
{
    char left[256];
    snprintf(left, sizeof left, "%s/.removing-step_00000000", root);
    cr_assert_eq(mkdir(left, 0755), 0);
    snprintf(left, sizeof left, "%s/.removing-step_00000000/rank00000.bin", root);
    FILE *f = fopen(left, "w");
    cr_assert_not_null(f);
    fputs("half removed", f);
    fclose(f);
}

/* Saves step 1, plants a leftover, saves step 2 with `keep`, closes, and
 * expects exactly `names` in the root. */
static void leftover_goes(int keep, const char *names_after)
{
    char root[128], names[1024];
    fixture_mkroot(root, sizeof root);
    dt_ckpt_options o = {.keep = keep};
    dt_ckpt *ck;
    cr_assert_eq(dt_ckpt_open(&ck, root, &o), DT_OK);
    save_steps(ck, 1, 1);
    plant_interrupted_removal(root);
    save_steps(ck, 2, 2);
    dt_ckpt_close(ck);
    list_root(root, names, sizeof names);
    cr_assert_str_eq(names, names_after);
    fixture_rmtree(root);
}

Test(checkpoint_rotate, leftover_of_an_interrupted_removal_goes_at_the_next_rotation, .timeout = 30)
{
    leftover_goes(1, "latest step_00000002");
}

/* Keeping every step, no rotation removes anything of its own: the
 * leftover still goes. */
Test(checkpoint_rotate, leftover_of_an_interrupted_removal_goes_even_when_all_steps_are_kept,
     .timeout = 30)
{
    leftover_goes(0, "latest step_00000001 step_00000002");
}

/* A step saved again at a smaller world (a run resumed on fewer ranks
 * that reaches the same step) holds exactly its new shards: the larger
 * world's rank files would sit beside a manifest that does not list them. */
Test(checkpoint_rotate, saving_a_step_again_on_fewer_ranks_leaves_no_stray_shards, .timeout = 30)
{
    char root[128], step[256], names[1024];
    fixture_mkroot(root, sizeof root);
    dt_ckpt *ck;
    cr_assert_eq(dt_ckpt_open(&ck, root, NULL), DT_OK);
    full_state f;
    full_state_init(&f, DT_CKPT_DDP, 3);
    cr_assert_eq(dt_ckpt_save_all(ck, &f.s, 4), DT_OK, "%s", dt_ckpt_error(ck));
    cr_assert_eq(dt_ckpt_save_all(ck, &f.s, 2), DT_OK, "%s", dt_ckpt_error(ck));
    full_state_free(&f);
    dt_ckpt_close(ck);
    snprintf(step, sizeof step, "%s/step_00000003", root);
    list_root(step, names, sizeof names);
    cr_assert_str_eq(names, "manifest.json rank00000.bin rank00001.bin");
    fixture_rmtree(root);
}
