/*
 * stage_model.c — a plain pipeline stage (model/'s dt_model_create_stage)
 * behind the executor's stage interface (dt_pipe_stage): each entry is
 * the dt_model call of the same name, so a pipelined run of a plain model
 * costs one indirect call per action more than calling the model directly.
 * The interface exists so the same executor can drive other stages too,
 * such as a tensor-parallel share of one (a 3-D run).
 */
#include "dt_pipe.h"

static void model_select(void *self, int slot, int grad_slot)
{
    dt_model_select(self, slot, grad_slot);
}

static float *model_input(void *self, int B, int T)
{
    return dt_model_input(self, B, T);
}

static const float *model_output(const void *self)
{
    return dt_model_output(self);
}

static float *model_output_grad(void *self)
{
    return dt_model_output_grad(self);
}

static const float *model_input_grad(const void *self)
{
    return dt_model_input_grad(self);
}

static dt_status model_forward(void *self, const int *inputs, const int *targets, int B, int T,
                               float *loss)
{
    dt_model *m = self;
    dt_status st = dt_model_forward(m, inputs, targets, B, T);
    if (st == DT_OK && targets && loss)
        *loss = m->mean_loss;
    return st;
}

static dt_status model_backward(void *self, float dloss, dt_backward_part part)
{
    return dt_model_backward_part(self, dloss, part);
}

static void model_set_grad_hook(void *self, dt_grad_ready_fn fn, void *user)
{
    dt_model_set_grad_hook(self, fn, user);
}

static const char *model_error(const void *self)
{
    return dt_model_error(self);
}

static const dt_pipe_stage_ops model_ops = {
    .select = model_select,
    .input = model_input,
    .output = model_output,
    .output_grad = model_output_grad,
    .input_grad = model_input_grad,
    .forward = model_forward,
    .backward = model_backward,
    .set_grad_hook = model_set_grad_hook,
    .error = model_error,
};

dt_pipe_stage dt_pipe_stage_of_model(dt_model *m)
{
    return (dt_pipe_stage){.ops = &model_ops,
                           .self = m,
                           .l0 = m->l0,
                           .l1 = m->l1,
                           .L = m->cfg.L,
                           .C = m->cfg.C,
                           .act_slots = m->act_slots,
                           .grad_slots = m->grad_slots};
}
