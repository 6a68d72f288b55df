/*
 * backend_cuda_none.c — the CUDA backend's entry points in a build without
 * the CUDA toolkit (meson -Dcuda=disabled, or auto with no nvcc): opening
 * it fails with a message that says how to get it. The "cuda-host" backend
 * (backend_cuda_host.c) is built either way.
 */
#include <stdio.h>

#include "dt_model.h"

dt_status dt_backend_cuda_open(const dt_backend **out, int device, char *err, size_t errlen)
{
    (void)device;
    *out = NULL;
    snprintf(err, errlen,
             "cuda: this build has no CUDA backend; install the CUDA toolkit "
             "(nvcc, cudart, cuBLAS) and reconfigure with meson setup "
             "-Dcuda=enabled");
    return DT_EINVAL;
}

dt_status dt_backend_cuda_check(char *err, size_t errlen)
{
    snprintf(err, errlen, "cuda: this build has no CUDA backend");
    return DT_EINVAL;
}

int dt_backend_cuda_built(void)
{
    return 0;
}
