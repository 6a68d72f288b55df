/*
 * dt_model.h — the public interface of dtrain's model layer: MiniGPT.
 *
 * MiniGPT is a small GPT written the way llm.c writes GPT-2: token + learned
 * position embedding, L pre-LayerNorm blocks (causal self-attention whose
 * qkv and output projections have no bias; an MLP C -> 4C -> C with bias and
 * erf-GELU), a final LayerNorm and an untied head C -> V without bias.
 *
 * Memory layout is the contract with the layers above, which use the model
 * (optim, checkpoint, train): all parameters live in ONE flat float
 * buffer, all gradients in another of the same size and layout. A tensor is
 * an offset range in that buffer, so a DDP gradient bucket or a ZeRO-1
 * shard is a plain [lo, hi) range. Tensors are laid out in forward order,
 * block by block:
 *
 *   wte, wpe, blocks.0.{ln1.w, ln1.b, attn.qkv.w, attn.proj.w, ln2.w, ln2.b,
 *   mlp.fc.w, mlp.fc.b, mlp.proj.w, mlp.proj.b}, blocks.1..., ln_f.w,
 *   ln_f.b, lm_head.w
 *
 * so backward (which runs in reverse) finishes the tail of the gradient
 * buffer first — the order DDP buckets want — and a pipeline stage owns a
 * contiguous range. dt_model.tensors names each range (PyTorch's
 * state_dict names) for checkpoints.
 *
 * Backends. Everything that touches parameter, gradient, activation or
 * optimizer memory goes through a dt_backend: a table of allocation and
 * copy functions plus one entry per layer kernel (forward/backward pairs).
 * The CPU backend (blocked GEMM + plain loops) is the only one today; a
 * CUDA backend adds a table and files, not a new training loop. The
 * "cpu-reference" backend swaps in the plain-loop matmul and attention
 * kernels: the obviously-correct model that tests compare against.
 *
 * Conventions (llm.c's): outputs first, then inputs, then dimensions;
 * shapes in comments; backward ADDS into parameter gradients (so gradient
 * accumulation is calling backward several times). Backward kernels WRITE
 * activation gradients (dinp), except layernorm and encoder, which add:
 * they feed the residual stream, where two paths meet. Nothing here knows of
 * ranks, and there is no global mutable state: everything hangs off a
 * dt_model or dt_dataset handle.
 */
#ifndef DT_MODEL_H
#define DT_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dt_dataset.h" /* the token streams a model trains on */
#include "dt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- configuration -------------------------------------------------------- */

typedef struct dt_config {
    int V; /* vocabulary size */
    int T; /* context length (max sequence length) */
    int L; /* number of blocks */
    int H; /* attention heads; C % H == 0 */
    int C; /* embedding width */
} dt_config;

/* The seed's MiniGPT: V=64 C=32 H=4 L=2 T=16, 29,824 parameters. */
dt_config dt_config_seed(void);
/* Writes a message and returns DT_EINVAL if cfg is unusable. */
dt_status dt_config_check(const dt_config *cfg, char *err, size_t errlen);
/* Parameter count of the flat buffer (exact, no padding). */
size_t dt_config_num_params(const dt_config *cfg);
/* The range [*lo, *hi) of the flat buffer that a pipeline stage owning
 * blocks [l0, l1) holds (dt_stage_spec): the embeddings too if l0 = 0,
 * ln_f and the head if l1 = L. */
void dt_config_stage_range(const dt_config *cfg, int l0, int l1, size_t *lo, size_t *hi);
/* Matmul + attention FLOPs of one training step (forward + backward) on
 * B x T tokens: 6 per weight per token, plus attention's q.k and att.v
 * (computed over the full T x T square, as the kernels do). */
double dt_config_flops_per_step(const dt_config *cfg, int B, int T);

/* ---- backend table -------------------------------------------------------- */

typedef struct dt_adamw_hparams {
    float lr;           /* learning rate */
    float beta1, beta2; /* moment decay rates, PyTorch defaults 0.9, 0.999 */
    float eps;          /* added to sqrt(v_hat), PyTorch default 1e-8 */
    float weight_decay; /* decoupled: p -= lr * wd * p, PyTorch default 0.01 */
} dt_adamw_hparams;

dt_adamw_hparams dt_adamw_defaults(float lr); /* PyTorch's defaults */

/*
 * One compute backend. "Device" pointers are what alloc returns; for the
 * CPU they are host memory. Every kernel works on device pointers; only
 * to_host/from_host cross. N = number of rows (B*T tokens).
 */
typedef struct dt_backend {
    const char *name;
    /* memory: zeroed, aligned for vector loads; NULL on failure */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    void (*zero)(void *p, size_t bytes);
    void (*to_host)(void *host, const void *dev, size_t bytes);
    void (*from_host)(void *dev, const void *host, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes); /* dev -> dev */

    /* out (N, C) = wte[inp] + wpe[t]; inp (B, T) token ids */
    void (*encoder_forward)(float *out, const int *inp, const float *wte, const float *wpe, int B,
                            int T, int C);
    void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                             int T, int C);
    /* out (N, C) = (inp - mean) * rstd * w + b; mean, rstd (N) kept.
     * Backward adds into dinp (if dinp) and into dw, db (if dw). */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C);
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C);
    /* out (N, OC) = inp (N, C) . w^T (w is (OC, C)) + bias (OC) or NULL */
    void (*matmul_forward)(float *out, const float *inp, const float *w, const float *bias, int N,
                           int C, int OC);
    /* dinp = dout . w (if dinp); dw += dout^T . inp and dbias += colsum
     * (if dw; dbias may be NULL): the two halves are independent */
    void (*matmul_backward)(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC);
    /* qkv (B, T, 3C) -> out (B, T, C); att (B, NH, T, T) softmax kept */
    void (*attention_forward)(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH);
    /* dqkv = ...; scratch (B, NH, T, T) */
    void (*attention_backward)(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH);
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    void (*gelu_backward)(float *dinp, const float *dout, const float *inp,
                          size_t n); /* dinp = dout * gelu'(inp) */
    void (*residual_forward)(float *out, const float *a, const float *b, size_t n);
    /* probs (N, V) = softmax(logits); losses (N) = -log probs[target] */
    void (*crossentropy_forward)(float *probs, float *losses, const float *logits,
                                 const int *targets, int N, int V);
    /* dlogits = (probs - onehot(target)) * dloss / N */
    void (*crossentropy_backward)(float *dlogits, const float *probs, const int *targets,
                                  float dloss, int N, int V);
    /* AdamW on any range of the flat buffers; step counts from 1 */
    void (*adamw)(float *params, const float *grads, float *m, float *v, size_t n, long step,
                  const dt_adamw_hparams *h);
} dt_backend;

const dt_backend *dt_backend_cpu(void);           /* OpenBLAS + loops, threaded */
const dt_backend *dt_backend_cpu_reference(void); /* plain loops only, serial */

/*
 * A rank's compute threads (threads.c): the cpu backend runs every layer
 * across a team of the calling thread's size, which dt_threads_use sets
 * for the calling thread only; a thread that never calls it computes
 * alone. (OpenBLAS's own pool is kept at one thread: the team cuts the
 * products instead.) The bits of a
 * step do not depend on the team's size. dt_threads_default is torchrun's
 * advice: the cores this process may run on, divided by the ranks on the
 * node.
 */
void dt_threads_use(int n);
/* c (M,N) = [c +] a (M,K) . b (K,N), a and b read through (row, column)
 * strides, one of each 1: the cpu backend's products, cut into pieces the
 * shape alone decides and shared out across the calling thread's team
 * (gemm_cpu.c). Host memory. */
void dt_cpu_gemm_par(float *c, int ldc, const float *a, int a_rs, int a_cs, const float *b,
                     int b_rs, int b_cs, int M, int N, int K, int accumulate);
/* The machine's sgemm rate on the calling thread's team, GFLOP/s: the
 * best of reps products of n x n squares through dt_cpu_gemm_par (after
 * one to warm up); 0 if it cannot allocate. MFU's denominator. */
double dt_cpu_gemm_peak(int n, int reps);
int dt_threads_current(void);
int dt_threads_default(int local_ranks);

/*
 * The CUDA backend (backend_cuda.cu; model/README.md, "The CUDA backend"),
 * in the CUDA module libdtrain-cuda.so that the first call loads.
 * dt_backend_cuda_open selects GPU `device` (a rank's LOCAL_RANK) for this
 * process — one per process — and returns its table, or a status with a
 * message in err naming what is missing (no driver, no device, the module
 * or a CUDA library it needs, a build without CUDA). Kernels report
 * failures late: dt_backend_cuda_check waits for the device and returns
 * the first failure since it last reported.
 * "cuda-host" runs the same kernel bodies as host loops on host memory:
 * what tests compare against the CPU reference without a GPU.
 */
dt_status dt_backend_cuda_open(const dt_backend **out, int device, char *err, size_t errlen);
dt_status dt_backend_cuda_check(char *err, size_t errlen);
int dt_backend_cuda_built(void); /* 1 if this build has the CUDA backend */
const dt_backend *dt_backend_cuda_host(void);

/*
 * AdamW, PyTorch's formula, on n elements of any range of the flat
 * buffers (a ZeRO-1 shard is a sub-range). Host memory. step >= 1.
 *   p -= lr*wd*p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   p -= lr/(1-b1^step) * m / (sqrt(v)/sqrt(1-b2^step) + eps)
 */
void dt_adamw_step(float *params, const float *grads, float *m, float *v, size_t n, long step,
                   const dt_adamw_hparams *h);

/* ---- parameters ----------------------------------------------------------- */

typedef struct dt_block_params {
    float *ln1w;     /* (C) */
    float *ln1b;     /* (C) */
    float *qkvw;     /* (3C, C) */
    float *attprojw; /* (C, C) */
    float *ln2w;     /* (C) */
    float *ln2b;     /* (C) */
    float *fcw;      /* (4C, C) */
    float *fcb;      /* (4C) */
    float *fcprojw;  /* (C, 4C) */
    float *fcprojb;  /* (C) */
} dt_block_params;

typedef struct dt_params {
    float *wte;              /* (V, C) */
    float *wpe;              /* (T, C) */
    dt_block_params *blocks; /* [L] */
    float *lnfw;             /* (C) */
    float *lnfb;             /* (C) */
    float *lm_head;          /* (V, C) */
} dt_params;

/* One named range of the flat buffer. */
typedef struct dt_tensor_info {
    char name[48]; /* PyTorch state_dict name: "blocks.0.attn.qkv.weight" */
    size_t offset; /* in elements, from the start of the flat buffer */
    size_t numel;
    int ndim; /* 1 or 2 */
    int shape[2];
} dt_tensor_info;

/* The whole model's tensor table for cfg (names, offsets, shapes, in
 * offset order), malloc'ed into *tab (the caller frees it), its length in
 * *n; no model is allocated (a checkpoint tool's header needs no more).
 * DT_EINVAL if cfg is unusable, DT_ENOMEM. */
dt_status dt_config_tensors(const dt_config *cfg, dt_tensor_info **tab, int *n);

/* ---- activations ---------------------------------------------------------- */

typedef struct dt_block_acts {
    float *ln1;       /* (B, T, C) */
    float *ln1_mean;  /* (B, T) */
    float *ln1_rstd;  /* (B, T) */
    float *qkv;       /* (B, T, 3C) */
    float *atty;      /* (B, T, C) */
    float *att;       /* (B, NH, T, T) */
    float *attproj;   /* (B, T, C) */
    float *residual2; /* (B, T, C) */
    float *ln2;       /* (B, T, C) */
    float *ln2_mean;  /* (B, T) */
    float *ln2_rstd;  /* (B, T) */
    float *fch;       /* (B, T, 4C) */
    float *fch_gelu;  /* (B, T, 4C) */
    float *fcproj;    /* (B, T, C) */
    float *residual3; /* (B, T, C) */
} dt_block_acts;

typedef struct dt_acts {
    float *encoded;        /* (B, T, C) */
    dt_block_acts *blocks; /* [L] */
    float *lnf;            /* (B, T, C) */
    float *lnf_mean;       /* (B, T) */
    float *lnf_rstd;       /* (B, T) */
    float *logits;         /* (B, T, V) */
    float *probs;          /* (B, T, V) */
    float *losses;         /* (B, T) */
    float *scratch;        /* (B, NH, T, T) attention backward */
} dt_acts;

/* ---- the model ------------------------------------------------------------ */

/*
 * Backward's progress hook. Backward runs in reverse layer order, so the
 * gradients it finishes form a growing tail of the flat gradient buffer:
 * after each layer that writes parameter gradients (head, final LayerNorm,
 * each block's matmuls and LayerNorms, embeddings), backward calls
 * hook(user, lo) meaning "every gradient in
 * [lo, num_params) is final for this backward" (lo only decreases, and the
 * last call has lo == 0). DDP launches a bucket's all-reduce from here, so
 * communication overlaps the rest of backward. The hook runs on the
 * caller's thread and must not touch gradients below lo.
 */
typedef void (*dt_grad_ready_fn)(void *user, size_t lo);
/*
 * Forward's parameter hook, backward's mirror: parameters are laid out in
 * forward order, so before each stage that reads them (embeddings, each
 * block, final LayerNorm and head) forward calls hook(user, hi) meaning
 * "parameters [0, hi) are about to be read" (hi only grows; the last call
 * has hi == num_params). ZeRO-1 waits there for the all-gather pieces that
 * cover them, so the gather of later blocks overlaps earlier compute.
 */
typedef void (*dt_params_needed_fn)(void *user, size_t hi);
/*
 * Backward's parameter hook: before backward reads a unit of parameters
 * (the head: ln_f and lm_head; each block, before its recomputation too;
 * whichever half runs) it calls hook(user, lo) with lo the unit's first
 * offset. The encoder's backward reads none. ZeRO-3 maps the unit there.
 */
typedef void (*dt_params_back_fn)(void *user, size_t lo);

/*
 * A pipeline stage: blocks [l0, l1) of cfg.L, plus the embeddings when
 * l0 == 0 (the first stage) and ln_f + head when l1 == L (the last). Its
 * parameters are the [param_lo, param_hi) slice of the full model's flat
 * layout; it allocates only those, their gradients and optimizer state,
 * and activations for its own blocks. act_slots activation sets hold the
 * micro-batches in flight (from forward until their weight gradient is
 * done); grad_slots sets of activation gradients hold those between the
 * input-gradient and the weight-gradient half of backward (1 when the two
 * run together). The whole model is the stage {0, L, 1, 1}. recompute:
 * see dt_model_create_recompute.
 */
typedef struct dt_stage_spec {
    int l0, l1;     /* blocks owned: [l0, l1), at least one */
    int act_slots;  /* >= 1 */
    int grad_slots; /* >= 1 */
    bool recompute; /* blocks keep only their output; backward recomputes */
} dt_stage_spec;

/* What a backward call computes. Both halves together are the ordinary
 * backward; split, INPUT must come before WEIGHT for the same slots. */
typedef enum dt_backward_part {
    DT_BACKWARD_ALL = 0, /* input and weight gradients */
    DT_BACKWARD_INPUT,   /* activation gradients down to the stage's input */
    DT_BACKWARD_WEIGHT,  /* the parameter gradients, from what INPUT kept */
} dt_backward_part;

/* Per-slot state (shape, loss) — internal to the model. */
typedef struct dt_act_slot dt_act_slot;

typedef struct dt_model {
    dt_config cfg;
    const dt_backend *be;
    int max_B; /* activations sized for (max_B, cfg.T) */

    size_t num_params;
    float *params_memory;    /* device (num_params), the flat buffer */
    float *grads_memory;     /* device (num_params), same layout */
    dt_params params;        /* pointers into params_memory */
    dt_params grads;         /* pointers into grads_memory */
    dt_tensor_info *tensors; /* [num_tensors], in offset order */
    int num_tensors;

    size_t num_acts;         /* elements of one activation set */
    size_t num_grad_acts;    /* of one activation-gradient set (num_acts but recomputing) */
    bool recompute;          /* blocks keep only their output; see below */
    float *acts_memory;      /* device (act_slots * num_acts) */
    float *grad_acts_memory; /* device (grad_slots * num_grad_acts), same order */
    size_t num_ws;           /* recompute: one block's activations but its output */
    size_t num_grad_ws;      /* recompute: of their gradients, those backward writes */
    float *ws_memory;        /* device (num_ws), shared by every set, or NULL */
    float *grad_ws_memory;   /* device (num_grad_ws), or NULL */
    int ws_slot, ws_block;   /* whose activations ws_memory holds (-1: none) */
    dt_acts acts, grad_acts;
    int *inputs;  /* device (max_B, T) */
    int *targets; /* device (max_B, T) */

    float *adam_m, *adam_v; /* device (num_params); NULL until update */
    bool bf16;              /* dt_model_set_precision(BF16): precision.c */
    uint16_t *bf16_memory;  /* device (act_slots * num_bf16): the blocks' stored activations */
    size_t num_bf16;        /* of one slot: its blocks' stored fields at (max_B, T) */
    float *weight_ws;       /* device (max(4C, V) * C): one matmul's rounded weight */
    float *param_ws;        /* device (2 * max(4, T) * C): rounded gains, biases, wpe */

    int last_B, last_T;          /* shape of the last forward */
    int have_targets;            /* last forward computed the loss */
    float mean_loss;             /* of the last forward with targets */
    int l0, l1;                  /* blocks owned: [l0, l1) (all: [0, L)) */
    bool pipeline_stage;         /* made by dt_model_create_stage, even of [0, L) */
    size_t param_lo, param_hi;   /* this slice of the full flat layout */
    int act_slots, grad_slots;   /* activation sets, activation-grad sets */
    int slot, grad_slot;         /* the sets the next call uses */
    dt_act_slot *slots;          /* [act_slots] shape and loss of each */
    dt_grad_ready_fn grad_ready; /* backward's progress hook, or NULL */
    void *grad_ready_user;
    dt_params_needed_fn params_needed; /* forward's hook, or NULL */
    void *params_needed_user;
    dt_params_back_fn params_back; /* backward's parameter hook, or NULL */
    void *params_back_user;
    bool grads_windowed;   /* grads_memory freed: gradients live in windows */
    size_t grads_window_n; /* elements the current window maps (0: none) */
    bool params_windowed;  /* ZeRO-3: parameters live in windows; params_memory
                              is NULL unless dt_model_hold_params holds it */
    char err[256];
} dt_model;

/*
 * Allocates parameters, gradients and activations for batches of up to
 * max_B sequences. Parameters start at zero: call dt_model_init or load
 * them. Always sets *out (NULL only on DT_ENOMEM); on failure read
 * dt_model_error(*out), then dt_model_destroy.
 */
dt_status dt_model_create(dt_model **out, const dt_config *cfg, const dt_backend *be, int max_B);
/*
 * Activation recomputation (Chen et al. 2016, "gradient checkpointing"):
 * each block keeps only its output (the next block's input, residual3);
 * its other activations, and its activation gradients, live in one
 * workspace shared by all blocks. Backward runs each block's forward
 * again, from its input, just before that block's backward: the same
 * kernels on the same operands, so the same bits, for one more forward's
 * compute. Activation memory per set: the embeddings' and head's and L
 * residuals, instead of L blocks'; plus one block's in the workspace (of
 * the gradients, the 15C per token backward writes). A set holds only
 * what its kind touches (the attention scratch only the gradient set).
 * A pipeline stage (dt_stage_spec.recompute) has one workspace for all
 * its sets; a block is rebuilt unless the workspace holds it. The split
 * halves recompute too; the weight half reruns each block's inner
 * gradients as well.
 */
dt_status dt_model_create_recompute(dt_model **out, const dt_config *cfg, const dt_backend *be,
                                    int max_B);
/*
 * The whole model with no parameter and no gradient buffer: both start
 * windowed (dt_model_window_params, dt_model_window_grads), as ZeRO-3
 * (optim/param_units.c) keeps them, so no rank ever holds the whole
 * model, not even at start-up. Its owner initialises its shard
 * (dt_model_init_range); dt_model_init refuses (message on m).
 */
dt_status dt_model_create_sharded(dt_model **out, const dt_config *cfg, const dt_backend *be,
                                  int max_B, bool recompute);
/* A pipeline stage of cfg (see dt_stage_spec); the same contract. */
dt_status dt_model_create_stage(dt_model **out, const dt_config *cfg, const dt_backend *be,
                                int max_B, const dt_stage_spec *spec);
void dt_model_destroy(dt_model *m);
const char *dt_model_error(const dt_model *m);

/* Deterministic initialisation from a seed, with PyTorch's default
 * distributions: embeddings N(0,1); Linear weights and biases
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)); LayerNorm weight 1, bias 0. */
void dt_model_init(dt_model *m, uint64_t seed);
/* (A stage gets its slice of what the full model gets from this seed,
 * bitwise.) */
/*
 * Elements [lo, lo + n) of the full model's flat buffer as dt_model_init
 * gives them from seed, bitwise, into host (n floats), without the rest:
 * the random stream jumps to each tensor's draws in O(1). How a ZeRO-3
 * rank initialises its shard with no whole model. DT_EINVAL if the range
 * is not inside dt_config_num_params(cfg); DT_ENOMEM.
 */
dt_status dt_model_init_range(float *host, const dt_config *cfg, size_t lo, size_t n,
                              uint64_t seed);
/* Host copies of the whole flat buffer (num_params floats). */
void dt_model_get_params(const dt_model *m, float *host);
void dt_model_set_params(dt_model *m, const float *host);
void dt_model_get_grads(const dt_model *m, float *host);
const dt_tensor_info *dt_model_find_tensor(const dt_model *m, const char *name);

/*
 * Forward on host token ids inputs (B, T), 1 <= T <= cfg.T, B >= 1 and
 * B·T <= max_B·cfg.T (more rows than max_B when they are shorter).
 * targets (B, T) or NULL; with targets, sets m->mean_loss. Ids must be in
 * [0, V): an id out of range is DT_EINVAL, naming its position.
 */
dt_status dt_model_forward(dt_model *m, const int *inputs, const int *targets, int B, int T);
/* Backward of the last forward (which had targets). dloss is the gradient
 * of the objective w.r.t. this batch's mean loss: 1 for one batch, 1/k
 * when accumulating k micro-batches. Adds into m->grads. */
dt_status dt_model_backward(dt_model *m, float dloss);
void dt_model_zero_grad(dt_model *m);

/*
 * Pipeline stages. Forward on a stage that is not the first takes no
 * tokens (inputs NULL): it reads the (B, T, C) activations placed in
 * dt_model_input first. A stage that is not the last computes no loss
 * (targets ignored); its output is dt_model_output, and its backward
 * starts from the gradient placed in dt_model_output_grad. Backward on a
 * stage that is not the first leaves the gradient w.r.t. its input in
 * dt_model_input_grad. All four are device pointers into the selected
 * slots, valid until the slot is reused.
 */
/* Selects the activation set and activation-gradient set that the next
 * forward / backward (and the four pointers) use. */
dt_status dt_model_select(dt_model *m, int slot, int grad_slot);
float *dt_model_input(dt_model *m, int B, int T);    /* (B, T, C) */
const float *dt_model_output(const dt_model *m);     /* (B, T, C) */
float *dt_model_output_grad(dt_model *m);            /* (B, T, C) */
const float *dt_model_input_grad(const dt_model *m); /* (B, T, C) */
/* Backward of the selected slot, whole or one half (dloss used by the
 * last stage's ALL and INPUT only). Adds into m->grads. */
dt_status dt_model_backward_part(dt_model *m, float dloss, dt_backward_part part);
/* Sets (or, with fn NULL, clears) backward's progress hook. */
void dt_model_set_grad_hook(dt_model *m, dt_grad_ready_fn fn, void *user);
/* Sets (or, with fn NULL, clears) forward's parameter hook. */
void dt_model_set_params_hook(dt_model *m, dt_params_needed_fn fn, void *user);
/* Sets (or, with fn NULL, clears) backward's parameter hook. */
void dt_model_set_params_back_hook(dt_model *m, dt_params_back_fn fn, void *user);
/*
 * Gradient windows, for ZeRO-2 (optim/grad_shards.c), where no rank ever
 * holds the whole gradient. The first call frees the model's gradient
 * buffer for good (grads_memory becomes NULL); each call points the
 * gradients of the tensors lying wholly in [lo, lo + n) of this model's
 * flat layout at base[0 .. n) and gives every other tensor none. Backward
 * adds into what is mapped, so the caller zeroes (or seeds) a window
 * before mapping it, and maps the next one from backward's progress hook
 * before backward reaches it; windows must be unions of the hook's units
 * (dt_model_grad_units), since one layer writes a whole unit. Backward on
 * a windowed model with nothing mapped is refused (DT_EINVAL); so are
 * dt_model_update, and dt_model_zero_grad does nothing (the windows'
 * owner zeroes them).
 */
void dt_model_window_grads(dt_model *m, float *base, size_t lo, size_t n);
/*
 * Parameter windows, for ZeRO-3 (optim/param_units.c), where no rank
 * holds the whole model between uses. The first call frees the model's
 * parameter buffer (params_memory becomes NULL); each call points the
 * parameters of the tensors lying wholly in [lo, lo + n) at base[0 .. n)
 * and gives every other tensor none (NULL: nothing may read them). The
 * caller maps each unit before forward or backward reads it: the
 * parameter hooks of forward and backward report offsets from the
 * tensor table, not from params_memory, so they work on a windowed
 * model. Forward reads the embeddings, each block, then ln_f and the
 * head; backward reads the head, then each block (and again under
 * recomputation) but never the embeddings. dt_model_update is refused.
 */
void dt_model_window_params(dt_model *m, float *base, size_t lo, size_t n);
/* On a windowed model, hold (true) allocates a full parameter buffer as
 * params_memory and maps every tensor to it (its contents are the
 * caller's to fill), for whatever reads the whole model (evaluation,
 * sampling, checkpoints, hashes); release (false) frees it again.
 * DT_ENOMEM if it cannot; nothing on an unwindowed model. */
dt_status dt_model_hold_params(dt_model *m, bool hold);
/*
 * Mixed precision (precision.c; docs/15-mixed-precision.md): bf16 rounds
 * every matmul's weight (from the fp32 master, on use) and every layer's
 * output to bf16, round to nearest even, and keeps the activations
 * backward reads as bf16; parameters, gradients, AdamW state, the
 * residual stream, LayerNorm's statistics, the logits and the loss stay
 * fp32. Call once after create,
 * before the first forward, on a whole model without recomputation nor
 * windows, on a cpu backend (others: DT_EINVAL, message on m); DT_ENOMEM.
 */
typedef enum dt_precision { DT_PRECISION_FP32 = 0, DT_PRECISION_BF16 } dt_precision;
dt_status dt_model_set_precision(dt_model *m, dt_precision p);
/* The path bf16 compute takes on this build and CPU, in words. */
const char *dt_bf16_path(void);
/* dst (n) = src rounded to bf16 and widened back to fp32, round to
 * nearest even, on the calling rank's team (dst may be src): the
 * rounding bf16 compute applies, for a layer that computes MiniGPT on its
 * own memory (tensor/). */
void dt_bf16_round_floats(float *dst, const float *src, size_t n);
/* Bytes of activations and their gradients this model holds: its sets
 * and, with recomputation or bf16, the workspace (and bf16's store). */
size_t dt_model_activation_bytes(const dt_model *m);
/* The offsets backward's progress hook reports, in the order it reports
 * them (the head's first, the embeddings' last): each is the start of one
 * unit of gradients finished by one layer. Returns the count (at most
 * 6L + 3); lo may be NULL to count. */
int dt_model_grad_units(const dt_model *m, size_t *lo);
/* AdamW over all parameters; allocates m, v on first call. step >= 1. */
dt_status dt_model_update(dt_model *m, const dt_adamw_hparams *h, long step);
/* Host copy of the logits row of sequence b at position t (V floats). */
void dt_model_get_logits(const dt_model *m, float *host, int b, int t);

/* ---- sampling and decoding: dt_generate.h; a tensor-parallel rank's ----- */
/* ---- share of the tensors: dt_tp_layout.h -------------------------------- */

#ifdef __cplusplus
}
#endif

#include "dt_generate.h"  /* sampling, generation and the KV cache */
#include "dt_tp_layout.h" /* a tensor-parallel rank's share of the tensors */

#endif /* DT_MODEL_H */
