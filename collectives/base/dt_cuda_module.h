/*
 * dt_cuda_module.h — the CUDA module: the one file of dtrain that links
 * CUDA, and how a run that asks for a CUDA device finds and loads it.
 *
 * The CUDA code — the collectives' CUDA device (device_cuda.c) and the
 * model's CUDA backend (backend_cuda.cu) — is built, when meson finds the
 * toolkit (-Dcuda=auto|enabled), into one shared object,
 * libdtrain-cuda.so, linked against the CUDA runtime (cudart) and cuBLAS.
 * Nothing else of dtrain links CUDA: a CPU run maps no CUDA library, and a
 * program built on a machine with the toolkit starts on one without it.
 * libdtrain opens the module with dlopen the first time a run asks for a
 * CUDA device (dt_device_open(.., "cuda:N", ..), dt_backend_cuda_open).
 *
 * Where it is looked for — one place, the first that applies:
 *   1. $DT_CUDA_MODULE, when set: the path of a module file;
 *   2. a program that runs from the build tree (its /proc/self/exe lies
 *      under the build root): the build's own, BUILD/install/libdtrain-cuda.so;
 *   3. any other program: the installed one, LIBDIR/dtrain/libdtrain-cuda.so.
 * Both paths are compiled in (meson.build: DT_CUDA_MODULE_BUILD_PATH,
 * DT_CUDA_MODULE_INSTALL_PATH). So a test or an uninstalled run never picks
 * up an older installed module, and an installed program never a build
 * tree's.
 *
 * Each layer asks the module for its own table, a data symbol whose first
 * member is the interface number DT_CUDA_MODULE_ABI: the collectives for
 * "dt_cuda_module_device", the model for "dt_cuda_module_backend". A module
 * from another build whose number differs is refused by name.
 *
 * Handles. Every load is a dlopen of its own, and its handle goes to the
 * object that uses the module: a dt_device keeps it and drops it when
 * closed; the model's backend, which has no close, keeps its reference for
 * the life of the process. dlopen counts references, so loading twice maps
 * the file once. RTLD_NODELETE: the last dlclose leaves the file mapped,
 * because CUDA's runtime keeps per-process state (the context, registered
 * kernels, exit handlers) that must outlive any one device.
 *
 * Failures are one line naming which: the module was not built, is not
 * where it was looked for (the path is named), there is no NVIDIA driver
 * (libcuda.so.1: checked before the module is loaded, so a machine without
 * one is told at once), the module does not load (dlerror: a CUDA library
 * it needs is missing), or is from another build; a module that loads but
 * finds no usable driver or no GPU says so itself.
 *
 * Header-only (base/), like dt_clock.h: the collectives and the model both
 * load the module, and neither links the other.
 * Cost: the first load maps cuBLAS (~0.3 s on a quiet machine, hundreds of
 * MB of mappings); a later one is a path lookup in the loaded objects
 * (~µs); a machine without a driver is told after one library search.
 */
#ifndef DT_CUDA_MODULE_H
#define DT_CUDA_MODULE_H

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dt_status.h"

/* Bump when a table the module exports changes shape: dt_device_ops,
 * struct dt_device, dt_backend, or the entry tables themselves. */
#define DT_CUDA_MODULE_ABI 1u
#define DT_CUDA_MODULE_FILE "libdtrain-cuda.so"

/* 1 when this build made the module (meson.build passes the paths). */
#ifndef DT_CUDA_MODULE_BUILT
#define DT_CUDA_MODULE_BUILT 0
#define DT_CUDA_MODULE_BUILD_PATH ""
#define DT_CUDA_MODULE_INSTALL_PATH ""
#define DT_BUILD_ROOT ""
#endif

/* True when the running program lies under the build root. */
static inline int dt_cuda_module_in_build_tree(void)
{
    char exe[PATH_MAX], root[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0 || !*DT_BUILD_ROOT || !realpath(DT_BUILD_ROOT, root))
        return 0;
    exe[n] = '\0';
    size_t len = strlen(root);
    return strncmp(exe, root, len) == 0 && exe[len] == '/';
}

/* The path of the module this program loads (see the head comment), and
 * in *hint what to do when it is not there; NULL, with err written, when
 * this build has none and DT_CUDA_MODULE is not set. */
static inline const char *dt_cuda_module_path(const char **hint, char *err, size_t errlen)
{
    const char *env = getenv("DT_CUDA_MODULE");
    *hint = "which DT_CUDA_MODULE names";
    if (env && *env)
        return env;
    if (!DT_CUDA_MODULE_BUILT) {
        snprintf(err, errlen,
                 "this dtrain was built without CUDA (reconfigure with meson setup "
                 "-Dcuda=enabled on a machine with the CUDA toolkit, or set DT_CUDA_MODULE "
                 "to the path of a " DT_CUDA_MODULE_FILE ")");
        return NULL;
    }
    if (dt_cuda_module_in_build_tree()) {
        *hint = "the build tree's: build it with ninja, or set DT_CUDA_MODULE to its path";
        return DT_CUDA_MODULE_BUILD_PATH;
    }
    *hint = "where dtrain installs it: meson install, or set DT_CUDA_MODULE to its path";
    return DT_CUDA_MODULE_INSTALL_PATH;
}

/*
 * Loads the module file `path` and returns in *table its data symbol
 * `symbol`, the interface number checked; *handle is the caller's
 * reference, for dlclose. On failure both are NULL and err holds one line
 * naming what went wrong. (dt_cuda_module_open's last step; tests call it
 * directly.)
 */
static inline dt_status dt_cuda_module_load(void **handle, const void **table, const char *path,
                                            const char *symbol, char *err, size_t errlen)
{
    *handle = NULL;
    *table = NULL;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
        const char *why = dlerror();
        snprintf(err, errlen,
                 "the CUDA module %s did not load: %s (are the CUDA runtime libraries it "
                 "links, cuBLAS among them, installed and on the library path?)",
                 path, why ? why : "unknown error");
        return DT_ESYS;
    }
    const unsigned *abi = (const unsigned *)dlsym(h, symbol);
    if (!abi) {
        snprintf(err, errlen, "%s is not a dtrain CUDA module (it has no %s)", path, symbol);
        dlclose(h);
        return DT_EINVAL;
    }
    if (*abi != DT_CUDA_MODULE_ABI) {
        snprintf(err, errlen,
                 "the CUDA module %s is from another dtrain (interface %u, this one speaks "
                 "%u): rebuild it, or set DT_CUDA_MODULE to this build's",
                 path, *abi, DT_CUDA_MODULE_ABI);
        dlclose(h);
        return DT_EINVAL;
    }
    *handle = h;
    *table = abi;
    return DT_OK;
}

/*
 * Finds the module (see the head comment), checks that an NVIDIA driver is
 * installed, and loads it: dt_cuda_module_load's contract. The driver
 * first because without libcuda.so.1 nothing in the module can work, and
 * finding that out costs a library search, where loading the module costs
 * the loading of cuBLAS (0.3 s on a quiet machine, seconds on a busy one).
 * The probe's reference is kept (RTLD_NODELETE): cudart opens the same
 * library next.
 */
static inline dt_status dt_cuda_module_open(void **handle, const void **table, const char *symbol,
                                            char *err, size_t errlen)
{
    *handle = NULL;
    *table = NULL;
    const char *hint;
    const char *path = dt_cuda_module_path(&hint, err, errlen);
    if (!path)
        return DT_EINVAL;
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen,
                 "the CUDA module " DT_CUDA_MODULE_FILE " was not found (looked for %s, %s)", path,
                 hint);
        return DT_EINVAL;
    }
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE);
    if (!driver) {
        const char *why = dlerror();
        snprintf(err, errlen,
                 "no NVIDIA driver: %s; so the CUDA module %s was not loaded (install the "
                 "driver: nvidia-smi should list a GPU; or run on the CPU)",
                 why ? why : "libcuda.so.1 does not load", path);
        return DT_ESYS;
    }
    dlclose(driver);
    return dt_cuda_module_load(handle, table, path, symbol, err, errlen);
}

#endif /* DT_CUDA_MODULE_H */
