/*
 * test_cuda_module.c — the CUDA module (collectives/base/dt_cuda_module.h):
 * a process that does not ask for CUDA maps no CUDA library; one that does
 * loads libdtrain-cuda.so — the build tree's, for a program run from the
 * build tree, or the one DT_CUDA_MODULE names — and every way that can fail
 * comes back as one line naming which: not built, not found (with the path
 * looked for), not loadable, not a dtrain module. Both users of the module
 * are checked: the collectives' device and the model's backend.
 *
 * Without a driver (CI) opening stops before the module is loaded and says
 * so; with one, the module loads and opening works, or names the device. Each test runs in its own process (Criterion's
 * default), so DT_CUDA_MODULE set by one is not seen by the next.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_cuda_module.h"
#include "dt_device.h"
#include "dt_model.h"

#ifndef LIBDTRAIN_SO
#error "LIBDTRAIN_SO must name the built libdtrain.so"
#endif

/* True if this process maps a file whose name contains `part`. */
static bool maps(const char *part)
{
    FILE *f = fopen("/proc/self/maps", "r");
    cr_assert_not_null(f);
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, part) != NULL;
    fclose(f);
    return found;
}

/* Opens "cuda" (the device), expecting a failure; returns its message. */
static void open_cuda_device_expecting_failure(char *err, size_t errlen)
{
    dt_device *d;
    dt_status st = dt_device_open(&d, "cuda", err, errlen);
    cr_assert_neq(st, DT_OK, "opened: %s", d ? dt_device_name(d) : "");
    cr_assert_null(d, "a device record for a module that did not load");
}

Test(cuda_module, a_process_that_does_not_ask_for_cuda_maps_no_cuda_library, .timeout = 30)
{
    dt_device *d;
    dt_fake_device_options o = {0};
    cr_assert_eq(dt_device_open_fake(&d, &o), DT_OK);
    dt_device_close(d);
    cr_assert_not_null(dt_backend_cpu());
    cr_expect_not(maps("libcudart"), "libcudart is mapped");
    cr_expect_not(maps("libcublas"), "libcublas is mapped");
    cr_expect_not(maps("libdtrain-cuda"), "the CUDA module is mapped");
}

/* What opening CUDA from the build tree must say, DT_CUDA_MODULE unset: a
 * build without CUDA says so; one with it chose the build tree's module,
 * and either loaded it (a driver is here: the module's own message, if
 * any, names the driver or the device) or names the missing driver. */
static void expect_the_build_trees_module(dt_status st, const char *err, bool built)
{
    if (!built) {
        cr_assert_neq(st, DT_OK);
        cr_expect(strstr(err, "-Dcuda=enabled"), "%s", err);
        cr_expect_not(maps("libdtrain-cuda"));
        return;
    }
    if (strstr(err, "no NVIDIA driver:")) {
        cr_expect(strstr(err, "install/libdtrain-cuda.so"), "not the build tree's module: %s", err);
        cr_expect_not(maps("libdtrain-cuda"), "loaded without a driver");
        return;
    }
    cr_expect(maps("install/libdtrain-cuda.so"), "the build tree's module is not mapped: %s", err);
    cr_expect_null(strstr(err, "CUDA module"), "the module did not load: %s", err);
    if (st != DT_OK)
        cr_expect(strstr(err, "driver") || strstr(err, "device"), "%s", err);
}

Test(cuda_module, the_device_uses_the_build_trees_module, .timeout = 30)
{
    unsetenv("DT_CUDA_MODULE");
    dt_device *d;
    char err[512] = "";
    dt_status st = dt_device_open(&d, "cuda", err, sizeof err);
    expect_the_build_trees_module(st, err, dt_device_cuda_built());
    dt_device_close(d);
}

Test(cuda_module, the_backend_uses_the_build_trees_module, .timeout = 30)
{
    unsetenv("DT_CUDA_MODULE");
    const dt_backend *be;
    char err[512] = "";
    dt_status st = dt_backend_cuda_open(&be, 0, err, sizeof err);
    expect_the_build_trees_module(st, err, dt_backend_cuda_built());
}

Test(cuda_module, a_missing_module_is_named_with_the_path_looked_for, .timeout = 30)
{
    const char *path = "/tmp/dt_test_no_such_dir/libdtrain-cuda.so";
    setenv("DT_CUDA_MODULE", path, 1);
    char err[512] = "";
    open_cuda_device_expecting_failure(err, sizeof err);
    cr_expect(strstr(err, "was not found") && strstr(err, path), "%s", err);
    cr_expect(strstr(err, "DT_CUDA_MODULE"), "%s", err);

    const dt_backend *be;
    cr_assert_neq(dt_backend_cuda_open(&be, 0, err, sizeof err), DT_OK);
    cr_assert_null(be);
    cr_expect(strstr(err, "was not found") && strstr(err, path), "%s", err);
    cr_expect_neq(dt_backend_cuda_check(err, sizeof err), DT_OK);
    cr_expect(strstr(err, path), "%s", err);
}

/* The loading itself, below the driver check (which, on a machine without
 * a driver, stops every open before it). */
Test(cuda_module, a_file_that_is_not_a_shared_object_is_refused_with_the_loaders_reason,
     .timeout = 30)
{
    const char *path = "/tmp/dt_test_cuda_module_not_elf.so";
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("not a shared object\n", f);
    fclose(f);
    void *h;
    const void *table;
    char err[512] = "";
    dt_status st = dt_cuda_module_load(&h, &table, path, "dt_cuda_module_device", err, sizeof err);
    remove(path);
    cr_assert_neq(st, DT_OK);
    cr_assert_null(h);
    cr_expect(strstr(err, "did not load") && strstr(err, path), "%s", err);
}

Test(cuda_module, a_shared_object_without_the_entry_is_not_a_dtrain_module, .timeout = 30)
{
    void *h;
    const void *table;
    char err[512] = "";
    dt_status st = dt_cuda_module_load(&h, &table, LIBDTRAIN_SO, "dt_cuda_module_backend", err,
                                       sizeof err);
    cr_assert_neq(st, DT_OK);
    cr_assert_null(table);
    cr_expect(strstr(err, "is not a dtrain CUDA module") && strstr(err, "dt_cuda_module_backend"),
              "%s", err);
}
