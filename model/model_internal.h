/*
 * model_internal.h — functions shared between the model layer's files and
 * not part of its public interface (tests may use them: they are the
 * plain reference kernels and the layout builder).
 *
 * Kernel naming: dt_ref_* are plain loops, written to be obviously right;
 * dt_cpu_* are the fast CPU versions (blocked GEMM, loops shaped for
 * the vectoriser). Both follow the dt_backend signatures in dt_model.h.
 */
#ifndef DT_MODEL_INTERNAL_H
#define DT_MODEL_INTERNAL_H

#include <stdio.h>

#include "dt_model.h"

/*
 * DT_VECTORIZE: compile a loop-heavy function three times — AVX-512, AVX2,
 * and the x86-64 baseline (SSE2) — and pick one at load time for the CPU
 * at hand (GCC/clang target_clones, an ifunc). The kernels are written so
 * every version gives the same bits: element-wise loops only vectorise
 * across elements, and ISO C mode (-std=c11) forbids FMA contraction. The
 * element-wise layers run 4-6x faster in AVX2/AVX-512 than in SSE2.
 *
 * Builds without clones (the baseline version only):
 *  - ThreadSanitizer: the ifunc resolvers run while the dynamic linker
 *    relocates, before the TSan runtime is set up, and crash at load.
 *  - clang before 18: it names the dispatcher of an exported clone set
 *    "f.ifunc", so callers in other files, which know only "f", fail to
 *    link; repeating the attribute on the declaration makes them call the
 *    resolver itself instead (a silent wrong answer). GCC and clang 18+
 *    give the dispatcher the plain name.
 */
#if defined(__SANITIZE_THREAD__) /* GCC's name; clang's is a feature */
#define DT_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DT_UNDER_TSAN 1
#endif
#endif
#ifndef DT_UNDER_TSAN
#define DT_UNDER_TSAN 0
#endif
#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__) && !DT_UNDER_TSAN && \
    !(defined(__clang__) && __clang_major__ < 18)
#define DT_HAVE_CLONES 1
#define DT_VECTORIZE __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DT_HAVE_CLONES 0
#define DT_VECTORIZE
#endif

/* One activation slot's state (stage.c): the shape and loss of the
 * micro-batch in it, and its token buffers (device, (max_B, T) each). */
struct dt_act_slot {
    int B, T; /* 0 until a forward ran in the slot */
    int have_targets;
    float mean_loss;
    int *inputs, *targets;
};
/* minigpt.c: points m->acts, m->grad_acts, m->inputs, m->targets at the
 * selected slots, laid out for (B, T). */
void dt_model_carve(dt_model *m, int B, int T);
/* minigpt.c: block l's forward, residual (B, T, C) in, its residual3 out;
 * backward.c runs it again under recomputation. */
void dt_model_block_forward(dt_model *m, int l, const float *residual, int B, int T);
/* minigpt.c: sizes and (re)allocates the activation sets, the
 * workspaces and bf16's store for m's layout, and carves them. */
dt_status dt_model_alloc_acts(dt_model *m);
/* bf16_kernels.c: x (n) rounded to bf16 in place if m computes in bf16;
 * the matmul weight w (n) to multiply by (w itself, or its bf16 rounding
 * in m->weight_ws); block l's fields moved to (pack) and from (unpack)
 * its bf16 store; the store's elements; dst = src rounded to bf16. */
void dt_model_round_acts(const dt_model *m, float *x, size_t n);
const float *dt_model_matmul_weight(const dt_model *m, const float *w, size_t n);
/* bf16_kernels.c: a LayerNorm gain or shift, a bias or wpe (p, n <=
 * dt_model_param_ws_half elements; NULL stays NULL) as a layer reads it:
 * p itself, or its bf16 rounding in half 0 or 1 of m->param_ws. */
const float *dt_model_bf16_param(const dt_model *m, const float *p, size_t n, int half);
size_t dt_model_param_ws_half(const dt_config *c);
void dt_model_bf16_pack(dt_model *m, int l, int B, int T);
void dt_model_bf16_unpack(dt_model *m, int l);
size_t dt_bf16_store_size(const dt_model *m);
void dt_bf16_round(float *dst, const float *src, size_t n);
/* Offsets in m's flat layout, read from its tensor table (so that they
 * hold whatever buffers the pointers are windows of): tensor k of block
 * l in dt_layout_build's order (0 ln1.weight, 2 attn.qkv.weight,
 * 3 attn.proj.weight, 4 ln2.weight, 6 mlp.fc.weight, 8 mlp.proj.weight),
 * and tensor k of the head (0 ln_f.weight, 2 lm_head.weight; the last
 * stage only). */
static inline size_t dt_block_offset(const dt_model *m, int l, int k)
{
    return m->tensors[(m->l0 == 0 ? 2 : 0) + 10 * (l - m->l0) + k].offset;
}
static inline size_t dt_head_offset(const dt_model *m, int k)
{
    return m->tensors[m->num_tensors - 3 + k].offset;
}

/* layout.c */
int dt_layout_num_tensors(const dt_config *c);
void dt_layout_build(dt_tensor_info *tab, dt_params *p, float *base, const dt_config *c);
void dt_layout_init(float *host, const dt_tensor_info *tab, int n, uint64_t seed);
/* a pipeline stage's slice (blocks [l0, l1)); -1 on ENOMEM */
int dt_layout_build_stage(dt_tensor_info *tab, dt_params *p, float *base, const dt_config *c,
                          int l0, int l1, size_t *lo, size_t *hi);
int dt_layout_init_stage(float *host, const dt_config *c, int l0, int l1, uint64_t seed);
/* a gradient (or parameter) window: fields of tensors inside [lo, lo + count) at base,
 * all others NULL (tab: the table of a stage starting at block l0) */
void dt_layout_map_window(dt_params *p, const dt_tensor_info *tab, int n, const dt_config *c,
                          int l0, float *base, size_t lo, size_t count);

/* kernels_ref.c — element-wise and row-wise layers (shared by both CPU
 * backends: they are already the fast form) */
void dt_ref_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                            int T, int C);
void dt_ref_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                             int T, int C);
void dt_ref_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C);
void dt_ref_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C);
void dt_ref_gelu_forward(float *out, const float *inp, size_t n);
void dt_ref_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n);
void dt_ref_residual_forward(float *out, const float *a, const float *b, size_t n);
void dt_ref_crossentropy_forward(float *probs, float *losses, const float *logits,
                                 const int *targets, int N, int V);
void dt_ref_crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                                  float dloss, int N, int V);
/* plain-loop matmul and attention: the reference the fast ones must match */
void dt_ref_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                           int C, int OC);
void dt_ref_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC);
void dt_ref_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH);
void dt_ref_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH);

/* gemm_cpu.c — c (M,N) = [c +] a (M,K) . b (K,N), operands given by
 * (row stride, column stride), one of each operand's strides 1: on the
 * calling thread (dt_cpu_gemm), or cut into pieces fixed by the shape and shared across the
 * calling rank's team (dt_cpu_gemm_par, declared in dt_model.h). */
void dt_cpu_gemm(float *c, int ldc, const float *a, int a_rs, int a_cs, const float *b, int b_rs,
                 int b_cs, int M, int N, int K, int accumulate);

/* threads.c — inside a `#pragma omp parallel` region, this thread's share
 * [lo, hi) of n units, cut at multiples of align (the last share takes the
 * rest); shares are contiguous and in thread order. */
void dt_team_share(size_t n, size_t align, size_t *lo, size_t *hi);
/* threads.c — once per process: OpenBLAS at one thread of its own, and its
 * work buffer mapped (dt_threads_use and every product call it). */
void dt_blas_start(void);
/* Element-wise work below this many elements runs on one thread. */
#define DT_PAR_ELEMS ((size_t)1 << 15)

/* kernels_cpu.c — the linear layer and attention on OpenBLAS, threaded */
void dt_cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                           int C, int OC);
void dt_cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC);
void dt_cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH);
void dt_cpu_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH);
/* the sgemm attention alone, whatever the head size and CPU (the fallback
 * the two above take where the register tiles cannot run) */
void dt_sgemm_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                int NH);
void dt_sgemm_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                 const float *att, int B, int T, int C, int NH);

/* attention_tiles.c — the same attention as register tiles, where the head
 * size is a multiple of 8 and the CPU has AVX2 and FMA (usable says so);
 * the two run return -1, having done nothing, when their scratch cannot be
 * had. kernels_cpu.c's attention calls them first. */
int dt_attention_tiles_usable(int T, int C, int NH);
int dt_tiles_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                               int NH);
int dt_tiles_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                const float *att, int B, int T, int C, int NH);

/* kernels_rows.c — the element-wise and row-wise layers, threaded */
void dt_cpu_gelu_forward(float *out, const float *inp, size_t n);
void dt_cpu_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n);
void dt_cpu_residual_forward(float *out, const float *a, const float *b, size_t n);
void dt_cpu_adamw(float *params, const float *grads, float *m, float *v, size_t n, long step,
                  const dt_adamw_hparams *h);
void dt_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C);
void dt_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C);
void dt_cpu_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                            int T, int C);
void dt_cpu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                             int T, int C);
void dt_cpu_crossentropy_forward(float *probs, float *losses, const float *logits,
                                 const int *targets, int N, int V);
void dt_cpu_crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                                  float dloss, int N, int V);

/* data.c / shard.c / task.c — the dataset handle */
struct dt_dataset {
    uint16_t *tokens; /* [n_train + n_val]: train split, then val */
    size_t n_train, n_val;
    int vocab; /* 1 + the largest id (256 for bytes) */
    /* task datasets only: example start offsets within each split */
    size_t *starts[2]; /* [DT_TRAIN], [DT_VAL] */
    size_t n_starts[2];
    int is_task;
    char err[256];
};
/* Allocates an empty dataset (err cleared); NULL on ENOMEM. */
dt_dataset *dt_dataset_alloc(void);
/* The largest text file read (bytes; each becomes a 2-byte token): 1 GiB. */
#define DT_TEXT_MAX_BYTES ((uint64_t)1 << 30)
/* Opens a data file that is a regular file of at most max_bytes (*size: its
 * size); NULL with d->err saying what is there instead (data.c). */
FILE *dt_dataset_fopen(dt_dataset *d, const char *path, uint64_t max_bytes, uint64_t *size);

#endif /* DT_MODEL_INTERNAL_H */
