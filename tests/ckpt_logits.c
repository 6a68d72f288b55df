/*
 * ckpt_logits.c — dtrain's own logits for a checkpoint, the other side of
 * tests/torch_seed_export.py (./dev.sh test-torch), which loads the same
 * checkpoint's `dtrain-ckpt export --names seed` into the seed curriculum's
 * PyTorch module and compares.
 *
 *   ckpt_logits ROOT < prompts
 *
 * Loads the latest step under ROOT as one rank of one (the whole state, as
 * dtrain-ckpt export does), then for each line of stdin — a prompt of T
 * token ids — runs the CPU backend's forward and prints T lines of V
 * logits. Exit 1 with a message on any failure.
 */
#include <stdio.h>
#include <stdlib.h>

#include "dt_ckpt.h"
#include "dt_model.h"

/* The whole state of the latest step under root into *s (params malloc'ed). */
static int load_latest(const char *root, dt_ckpt_state *s)
{
    dt_ckpt_options o = {.allow_reshard = true};
    dt_ckpt *ck = NULL;
    char dir[4200];
    dt_ckpt_info info;
    int rc = dt_ckpt_open(&ck, root, &o) != DT_OK || dt_ckpt_latest(ck, dir, sizeof dir) != DT_OK ||
             dt_ckpt_inspect(ck, dir, &info) != DT_OK;
    if (!rc) {
        size_t n = info.num_params;
        *s = (dt_ckpt_state){.cfg = info.cfg,
                             .mode = info.mode,
                             .world = 1,
                             .num_params = n,
                             .opt_n = n};
        s->params = malloc(n * sizeof(float));
        s->adam_m = malloc(n * sizeof(float));
        s->adam_v = malloc(n * sizeof(float));
        s->master = info.mode == DT_CKPT_ZERO1 ? malloc(n * sizeof(float)) : NULL;
        rc = !s->params || !s->adam_m || !s->adam_v || (info.mode == DT_CKPT_ZERO1 && !s->master) ||
             dt_ckpt_load(ck, dir, s) != DT_OK;
    }
    if (rc)
        fprintf(stderr, "ckpt_logits: %s: %s\n", root, ck ? dt_ckpt_error(ck) : "out of memory");
    dt_ckpt_close(ck);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return fprintf(stderr, "usage: ckpt_logits ROOT < prompts\n"), 2;
    dt_ckpt_state s = {0};
    if (load_latest(argv[1], &s))
        return 1;
    const dt_config *c = &s.cfg;
    dt_model *m = NULL;
    if (dt_model_create(&m, c, dt_backend_cpu(), 1) != DT_OK)
        return fprintf(stderr, "ckpt_logits: %s\n", m ? dt_model_error(m) : "out of memory"), 1;
    dt_model_set_params(m, s.params);
    int *tokens = malloc((size_t)c->T * sizeof(int));
    float *row = malloc((size_t)c->V * sizeof(float));
    int rc = !tokens || !row;
    for (int t = 0; !rc && scanf("%d", &tokens[0]) == 1; t = 0) {
        for (t = 1; t < c->T && scanf("%d", &tokens[t]) == 1; t++)
            ;
        rc = t < c->T || dt_model_forward(m, tokens, NULL, 1, c->T) != DT_OK;
        for (int p = 0; !rc && p < c->T; p++) {
            dt_model_get_logits(m, row, 0, p);
            for (int v = 0; v < c->V; v++)
                printf("%.9e%c", (double)row[v], v + 1 < c->V ? ' ' : '\n');
        }
    }
    if (rc)
        fprintf(stderr, "ckpt_logits: a prompt of fewer than T = %d tokens, or: %s\n", c->T,
                dt_model_error(m));
    free(tokens);
    free(row);
    dt_model_destroy(m);
    free(s.params);
    free(s.adam_m);
    free(s.adam_v);
    free(s.master);
    return rc;
}
