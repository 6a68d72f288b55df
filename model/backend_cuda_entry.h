/*
 * backend_cuda_entry.h — internal: what the CUDA module exports for the
 * model. backend_cuda.cu, built only into the module (dt_cuda_module.h),
 * defines the table under the name DT_CUDA_MODULE_BACKEND;
 * backend_cuda_module.c, in libdtrain, finds it with dlsym the first time a
 * run asks for the CUDA backend, and forwards dt_backend_cuda_open and
 * dt_backend_cuda_check to it. `abi` comes first, as dt_cuda_module_open
 * expects.
 */
#ifndef DT_BACKEND_CUDA_ENTRY_H
#define DT_BACKEND_CUDA_ENTRY_H

#include "dt_model.h"

typedef struct dt_backend_cuda_entry {
    unsigned abi; /* DT_CUDA_MODULE_ABI */
    /* dt_backend_cuda_open's and dt_backend_cuda_check's contracts */
    dt_status (*open)(const dt_backend **out, int device, char *err, size_t errlen);
    dt_status (*check)(char *err, size_t errlen);
} dt_backend_cuda_entry;

#define DT_CUDA_MODULE_BACKEND "dt_cuda_module_backend"

#endif /* DT_BACKEND_CUDA_ENTRY_H */
