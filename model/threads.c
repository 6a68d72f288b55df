/*
 * threads.c — a rank's compute threads: one OpenMP team per rank, sized by
 * --threads, that every CPU kernel of a step shares.
 *
 * The idea is llm.c's: each kernel is a loop over independent pieces
 * (rows, heads, columns, chunks of a flat buffer), and `#pragma omp
 * parallel num_threads(dt_threads_current())` hands each thread of the
 * team one contiguous share of them. The team's size belongs to the
 * calling thread, as OpenMP's own settings do: ranks run as processes
 * (minigpt) or as threads of one test each set their own, and a thread
 * that never set one computes alone (not OpenMP's default of every core,
 * which would put 4 ranks-as-threads x 2 teams on 2 cores: measured 25x
 * slower on a busy machine, each barrier waiting on a preempted thread).
 * OpenBLAS is told to use one thread of its own (dt_blas_start: a
 * process-wide setting, the same value for every rank), and the GEMMs are
 * cut into pieces by gemm_cpu.c instead: one pool, not two competing for
 * the same cores.
 *
 * Shares are cut so that no sum changes order with the team's size: a
 * thread owns whole rows, heads or output columns, and a reduction over
 * rows (a bias or LayerNorm gradient) is split by column, each column
 * summed over every row in order by one thread. So a step gives the same
 * bits on 1 thread and on 8 (docs/05-minigpt.md, "Threads").
 *
 * Cost: a parallel region costs a few microseconds to open and close;
 * the kernels run pieces smaller than a few thousand flops on the
 * calling thread alone (each kernel's `if` clause).
 */
#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include "dt_model.h"
#include "model_internal.h"

int dt_threads_default(int local_ranks)
{
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                            : (int)sysconf(_SC_NPROCESSORS_ONLN);
    int per_rank = cores / (local_ranks > 0 ? local_ranks : 1);
    return per_rank > 0 ? per_rank : 1;
}

/* The calling thread's team size: the one piece of per-thread state,
 * like OpenMP's own per-thread settings. */
static _Thread_local int team_size = 1;

/* OpenBLAS's own pool would start every core's worth of threads under
 * each caller: the team does the cutting, so it is set to one thread
 * (a process-wide setting; every rank wants the same). And OpenBLAS maps
 * its work buffer (~128 MB of address space, little of it touched) at its
 * first product, where a failed mmap makes it retry forever instead of
 * failing: one product of 128^3, which takes the buffered path, maps it
 * here, before the model allocates, so that a process short of memory
 * (RLIMIT_DATA, RLIMIT_AS) fails in dtrain's own allocation, by name. */
static void blas_start_once(void)
{
    enum { S = 128 };
    float a[S * S] = {0}, c[S * S];
    openblas_set_num_threads(1);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, S, S, 1.0f, a, S, a, S, 0.0f, c, S);
}

void dt_blas_start(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, blas_start_once);
}

void dt_threads_use(int n)
{
    dt_blas_start();
    team_size = n > 0 ? n : 1;
}

int dt_threads_current(void)
{
    return team_size;
}

void dt_team_share(size_t n, size_t align, size_t *lo, size_t *hi)
{
    size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
    size_t units = (n + align - 1) / align; /* whole aligned pieces */
    size_t a = units * t / nt * align, b = units * (t + 1) / nt * align;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}
