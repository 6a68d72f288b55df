/*
 * cli_act_comm.c — what `minigpt --act-comm bf16` accepts.
 *
 * The flag rounds what pipeline stages exchange, the activations and
 * their gradients, to bf16 (pipeline/act_comm.c): half the bytes per
 * transfer, at the price of the residual stream rounded at each stage
 * boundary (a run no longer has one process's bits). So it needs --pp
 * (a plain pipeline's stages or a 3-D grid's: each tp rank of a stage
 * sends its copy of the (B, T, C) activations to its peer of the next);
 * and torch 1.13's gloo wire has no bfloat16. Each refusal is one line naming the flag to change. With
 * fp32 compute it is allowed too, as --grad-comm bf16 is.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dt_flags.h"

static int refuse(const char *prog, const char *what, const char *arg)
{
    return dt_flag_error(prog, "%s '%s'", what, arg);
}

static bool gloo_wire(const mg_options *o)
{
    const char *env = getenv("DT_WIRE");
    return o->wire ? strcmp(o->wire, "gloo") == 0 : env && strcmp(env, "gloo") == 0;
}

int mg_check_act_comm(const mg_options *o, const char *prog)
{
    if (strcmp(o->act_comm, "fp32") && strcmp(o->act_comm, "bf16"))
        return refuse(prog, "--act-comm is fp32 or bf16, not", o->act_comm);
    if (strcmp(o->act_comm, "bf16"))
        return 0;
    if (o->pp == 0)
        return refuse(prog, "--act-comm bf16 rounds what pipeline stages send; it needs", "--pp");
    if (gloo_wire(o))
        return refuse(prog, "--act-comm bf16: torch 1.13's gloo has no bfloat16; use",
                      "--wire dtrain");
    return 0;
}
