/*
 * backend_cuda_module.c — the CUDA backend's entry points in libdtrain:
 * each loads the CUDA module (dt_cuda_module.h) and calls its table
 * (backend_cuda_entry.h), where the backend itself lives
 * (backend_cuda.cu). A program that never asks for "cuda" never maps a
 * CUDA library; one that does and cannot have it gets one line naming why:
 * a build without CUDA, a module not where it was looked for, a CUDA
 * library missing, or (from the module) no driver or no GPU.
 *
 * The backend has no close: dt_backend_cuda_open's reference to the
 * module is kept for the life of the process, as the table it returns
 * must stay valid. dt_backend_cuda_check takes and drops a reference of its
 * own around its call (dlopen counts them; the module stays mapped): a few
 * system calls and lookups among the loaded objects, some tens of µs, once
 * per training step, beside a GPU step's milliseconds.
 * The "cuda-host" backend (backend_cuda_host.c) needs no module.
 */
#include "backend_cuda_entry.h"
#include "dt_cuda_module.h"

/* The module's table for the model in *entry, or a status with
 * "cuda: <why>" in err. */
static dt_status load(void **module, const dt_backend_cuda_entry **entry, char *err, size_t errlen)
{
    const void *table;
    char why[400];
    dt_status st = dt_cuda_module_open(module, &table, DT_CUDA_MODULE_BACKEND, why, sizeof why);
    if (st != DT_OK)
        snprintf(err, errlen, "cuda: %s", why);
    *entry = table;
    return st;
}

dt_status dt_backend_cuda_open(const dt_backend **out, int device, char *err, size_t errlen)
{
    *out = NULL;
    void *module;
    const dt_backend_cuda_entry *entry;
    dt_status st = load(&module, &entry, err, errlen);
    if (st != DT_OK)
        return st;
    st = entry->open(out, device, err, errlen);
    if (st != DT_OK)
        dlclose(module); /* kept on success: *out lives in the module */
    return st;
}

dt_status dt_backend_cuda_check(char *err, size_t errlen)
{
    void *module;
    const dt_backend_cuda_entry *entry;
    dt_status st = load(&module, &entry, err, errlen);
    if (st != DT_OK)
        return st;
    st = entry->check(err, errlen);
    dlclose(module);
    return st;
}

int dt_backend_cuda_built(void)
{
    return DT_CUDA_MODULE_BUILT;
}
