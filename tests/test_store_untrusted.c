/*
 * test_store_untrusted.c — the rendezvous path is untrusted: what the store
 * refuses to open, and that it leaves every refused thing as it found it.
 *
 * Anyone can put something at a name under /tmp before a job starts: a
 * symlink to one of the user's files, a FIFO, a file of another user, a
 * file of zeros. Each test puts one such thing at a fresh path, opens the
 * store there, and checks three promises: the open fails with DT_ESTORE,
 * the message names the path and what is wrong, and nothing at the path
 * (or behind it) changed.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dt_comm.h"

/* ---- helpers --------------------------------------------------------------- */

typedef struct test_file {
    char path[200];
    char url[220];
} test_file;

static test_file unique_file(const char *tag)
{
    static atomic_uint counter; /* test-local: only names files */
    test_file f;
    snprintf(f.path, sizeof f.path, "/tmp/dt-store-untrusted-%d-%u-%s", (int)getpid(),
             atomic_fetch_add(&counter, 1), tag);
    snprintf(f.url, sizeof f.url, "file://%s", f.path);
    unlink(f.path);
    return f;
}

static void write_file(const char *path, const void *buf, size_t n, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert(fd >= 0, "open %s: %s", path, strerror(errno));
    cr_assert_eq(write(fd, buf, n), (ssize_t)n);
    cr_assert_eq(fchmod(fd, mode), 0);
    close(fd);
}

/* Whether path holds exactly want[0..n). */
static bool holds(const char *path, const void *want, size_t n)
{
    struct stat st;
    if (stat(path, &st) != 0 || (size_t)st.st_size != n)
        return false;
    uint8_t *buf = malloc(n + 1);
    int fd = open(path, O_RDONLY);
    bool same = fd >= 0 && read(fd, buf, n + 1) == (ssize_t)n && memcmp(buf, want, n) == 0;
    if (fd >= 0)
        close(fd);
    free(buf);
    return same;
}

/* Opening f must fail with DT_ESTORE with a message naming the path and
 * containing why; the handle stays unusable. */
static void expect_refused(const test_file *f, const char *why)
{
    dt_store *s = NULL;
    dt_status st = dt_store_open(&s, f->url, "job");
    cr_assert_not_null(s);
    const char *msg = dt_store_error(s);
    cr_assert_eq(st, DT_ESTORE, "status %s: %s", dt_status_name(st), msg);
    cr_assert(strstr(msg, f->path), "message: %s", msg);
    cr_assert(strstr(msg, why), "message: %s", msg);
    cr_assert_eq(dt_store_set(s, "k", "v", 1), DT_ESTORE);
    dt_store_close(s);
}

/* ---- what is at the path ------------------------------------------------------ */

Test(store_untrusted, symlink_to_a_users_file_is_refused_and_the_file_untouched, .timeout = 10)
{
    test_file victim = unique_file("victim"), link = unique_file("link");
    const char text[] = "the user's own notes\n";
    write_file(victim.path, text, strlen(text), 0600);
    cr_assert_eq(symlink(victim.path, link.path), 0);
    expect_refused(&link, "is a symbolic link, not a rendezvous file");
    cr_assert(holds(victim.path, text, strlen(text)), "the target changed");
    struct stat st;
    cr_assert_eq(lstat(link.path, &st), 0, "the symlink was removed");
    cr_assert(S_ISLNK(st.st_mode));
    unlink(link.path);
    unlink(victim.path);
}

Test(store_untrusted, dangling_symlink_is_refused_and_its_target_not_created, .timeout = 10)
{
    test_file target = unique_file("absent"), link = unique_file("dangling");
    cr_assert_eq(symlink(target.path, link.path), 0);
    expect_refused(&link, "is a symbolic link, not a rendezvous file");
    cr_assert_eq(access(target.path, F_OK), -1, "the target was created");
    unlink(link.path);
}

Test(store_untrusted, fifo_is_refused_as_a_fifo_and_left_in_place, .timeout = 10)
{
    test_file f = unique_file("fifo");
    cr_assert_eq(mkfifo(f.path, 0600), 0);
    expect_refused(&f, "is a FIFO, not a rendezvous file");
    struct stat st;
    cr_assert_eq(lstat(f.path, &st), 0, "the FIFO was removed");
    cr_assert(S_ISFIFO(st.st_mode));
    unlink(f.path);
}

Test(store_untrusted, directory_is_refused_as_a_directory, .timeout = 10)
{
    test_file f = unique_file("dir");
    cr_assert_eq(mkdir(f.path, 0700), 0);
    expect_refused(&f, "is a directory, not a rendezvous file");
    cr_assert_eq(rmdir(f.path), 0, "the directory is gone or not empty");
}

Test(store_untrusted, unix_socket_is_refused_as_a_socket, .timeout = 10)
{
    test_file f = unique_file("sock");
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    cr_assert_lt(strlen(f.path), sizeof a.sun_path);
    memcpy(a.sun_path, f.path, strlen(f.path) + 1);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0, "%s", strerror(errno));
    expect_refused(&f, "is a socket, not a rendezvous file");
    close(fd);
    unlink(f.path);
}

Test(store_untrusted, file_writable_by_others_is_refused_untouched, .timeout = 10)
{
    test_file f = unique_file("0666");
    write_file(f.path, "", 0, 0666);
    expect_refused(&f, "is writable by others (mode 0666)");
    struct stat st;
    cr_assert_eq(stat(f.path, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0666, "the mode changed");
    unlink(f.path);
}

Test(store_untrusted, file_of_another_user_is_refused_untouched, .timeout = 10)
{
    /* root can make a file of another user; anyone else finds one of root's */
    test_file f = unique_file("foreign");
    if (geteuid() == 0) {
        write_file(f.path, "", 0, 0600);
        cr_assert_eq(chown(f.path, 65534, 65534), 0, "%s", strerror(errno));
    } else {
        snprintf(f.path, sizeof f.path, "/etc/passwd");
        snprintf(f.url, sizeof f.url, "file:///etc/passwd");
    }
    struct stat before, after;
    cr_assert_eq(stat(f.path, &before), 0);
    expect_refused(&f, "not to this user");
    cr_assert_eq(stat(f.path, &after), 0, "the file was removed");
    cr_assert_eq(after.st_size, before.st_size, "the file's size changed");
    if (geteuid() == 0)
        unlink(f.path);
}

/* ---- files that parse but are not stores --------------------------------------- */

Test(store_untrusted, four_kib_of_zeros_is_refused_for_its_empty_key_and_untouched, .timeout = 10)
{
    test_file f = unique_file("zeros");
    static const uint8_t zeros[4096];
    write_file(f.path, zeros, sizeof zeros, 0600);
    expect_refused(&f, "record at byte 0 has an empty key");
    cr_assert(holds(f.path, zeros, sizeof zeros), "the zeros were changed");
    unlink(f.path);
}

/* One record, u32 lengths in host order, with the given key bytes. */
static size_t record(uint8_t *out, const void *key, uint32_t kl, const char *val)
{
    uint32_t vl = (uint32_t)strlen(val);
    memcpy(out, &kl, 4);
    memcpy(out + 4, key, kl);
    memcpy(out + 4 + kl, &vl, 4);
    memcpy(out + 8 + kl, val, vl);
    return 8 + kl + vl;
}

Test(store_untrusted, records_with_a_key_no_writer_makes_are_refused_untouched, .timeout = 10)
{
    test_file f = unique_file("nokey");
    uint8_t buf[256];
    size_t n = record(buf, "job/addr/0", 10, "127.0.0.1:1");
    n += record(buf + n, "no slash\x1b[2J", 12, "x"); /* a ESC for the terminal */
    write_file(f.path, buf, n, 0600);
    expect_refused(&f, "record at byte 29 has no '/' after a job id");
    expect_refused(&f, "no slash\\x1b[2J");
    cr_assert(holds(f.path, buf, n), "the file was changed");
    unlink(f.path);
}

Test(store_untrusted, a_key_with_a_nul_byte_is_refused, .timeout = 10)
{
    test_file f = unique_file("nul");
    uint8_t buf[64];
    size_t n = record(buf, "job/a\0b", 7, "v");
    write_file(f.path, buf, n, 0600);
    expect_refused(&f, "a NUL byte in its key");
    cr_assert(holds(f.path, buf, n), "the file was changed");
    unlink(f.path);
}

/* The first n bytes of path are want[0..n) (more may follow). */
static bool starts_with(const char *path, const void *want, size_t n)
{
    uint8_t *buf = malloc(n);
    int fd = open(path, O_RDONLY);
    bool same = fd >= 0 && read(fd, buf, n) == (ssize_t)n && memcmp(buf, want, n) == 0;
    if (fd >= 0)
        close(fd);
    free(buf);
    return same;
}

static bool file_contains(const char *path, const char *needle)
{
    uint8_t buf[4096];
    int fd = open(path, O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf) : -1;
    if (fd >= 0)
        close(fd);
    return n > 0 && memmem(buf, (size_t)n, needle, strlen(needle)) != NULL;
}

/* What torch.distributed's FileStore (1.13) leaves after its handles
 * closed: a key, a delete record, cleanup. It records nothing when a handle
 * opens, so dtrain cannot tell whether another handle is still live: it
 * joins the file and neither empties nor removes it. */
Test(store_untrusted, a_file_pytorch_used_is_never_emptied_or_removed, .timeout = 10)
{
    test_file f = unique_file("torch");
    uint8_t buf[256];
    size_t n = record(buf, "/rank0/addr", 11, "10.0.0.1");
    n += record(buf + n, "-/rank0/addr", 12, "");
    n += record(buf + n, "cleanup/", 8, "1");
    write_file(f.path, buf, n, 0600);
    dt_store *s = NULL;
    cr_assert_eq(dt_store_open(&s, f.url, "job"), DT_OK, "%s", dt_store_error(s));
    cr_assert(starts_with(f.path, buf, n), "PyTorch's records were reset");
    dt_store_close(s);
    cr_assert_eq(access(f.path, F_OK), 0, "a file PyTorch used was removed");
    cr_assert(starts_with(f.path, buf, n), "PyTorch's records were changed");
    cr_assert(file_contains(f.path, "refcount/dtrain"), "the handle never counted itself");
    unlink(f.path);
}

/* PyTorch 2 counts its open handles in "refcount/": one counted may be
 * live (PyTorch keeps no lock), so dtrain neither empties nor removes the
 * file. */
Test(store_untrusted, a_pytorch_filestore_with_a_counted_handle_is_joined_never_reset,
     .timeout = 10)
{
    test_file f = unique_file("torchlive");
    uint8_t buf[256];
    size_t n = record(buf, "refcount/", 9, "1");
    n += record(buf + n, "/rank0/addr", 11, "10.0.0.1");
    write_file(f.path, buf, n, 0600);
    dt_store *s = NULL;
    cr_assert_eq(dt_store_open(&s, f.url, "job"), DT_OK, "%s", dt_store_error(s));
    cr_assert(starts_with(f.path, buf, n), "PyTorch's records were reset");
    cr_assert_eq(dt_store_set(s, "k", "v", 1), DT_OK, "%s", dt_store_error(s));
    dt_store_close(s);
    cr_assert_eq(access(f.path, F_OK), 0, "a file PyTorch may use was removed");
    cr_assert(starts_with(f.path, buf, n), "PyTorch's records were changed");
    unlink(f.path);
}

/* ---- removing a dead job's file (dt_store_remove_if_dead) -------------------- */

/* The whole content of path, and its size, for "left exactly as it was". */
static size_t snapshot(const char *path, uint8_t *buf, size_t cap)
{
    int fd = open(path, O_RDONLY);
    cr_assert(fd >= 0, "open %s: %s", path, strerror(errno));
    ssize_t n = read(fd, buf, cap);
    close(fd);
    cr_assert(n >= 0 && (size_t)n < cap);
    return (size_t)n;
}

Test(store_untrusted, remove_if_dead_leaves_a_live_jobs_file_and_writes_nothing, .timeout = 10)
{
    test_file f = unique_file("live");
    dt_store *s = NULL;
    cr_assert_eq(dt_store_open(&s, f.url, "job"), DT_OK, "%s", dt_store_error(s));
    cr_assert_eq(dt_store_set(s, "addr", "10.0.0.1", 8), DT_OK, "%s", dt_store_error(s));
    uint8_t before[4096];
    size_t n = snapshot(f.path, before, sizeof before);
    bool removed = true;
    cr_assert_eq(dt_store_remove_if_dead(f.url, &removed), DT_OK);
    cr_assert_not(removed, "a live job's file was removed");
    cr_assert(holds(f.path, before, n), "a live job's file was changed");
    dt_store_close(s); /* the last holder removes it, as always */
    cr_assert_neq(access(f.path, F_OK), 0);
}

Test(store_untrusted, remove_if_dead_removes_the_file_of_a_killed_job, .timeout = 10)
{
    test_file f = unique_file("killed");
    int ready[2];
    cr_assert_eq(pipe(ready), 0);
    pid_t pid = fork();
    if (pid == 0) { /* a rank killed while it holds the store */
        dt_store *s = NULL;
        if (dt_store_open(&s, f.url, "job") != DT_OK || dt_store_set(s, "a", "1", 1) != DT_OK)
            _exit(1);
        (void)!write(ready[1], "r", 1);
        pause();
    }
    char c;
    cr_assert_eq(read(ready[0], &c, 1), 1, "the rank never opened the store");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    cr_assert_eq(access(f.path, F_OK), 0, "the killed rank's file is not there to remove");
    bool removed = false;
    cr_assert_eq(dt_store_remove_if_dead(f.url, &removed), DT_OK);
    cr_assert(removed && access(f.path, F_OK) != 0, "a dead job's file stayed");
}

Test(store_untrusted, remove_if_dead_leaves_what_is_not_a_store_untouched, .timeout = 10)
{
    test_file zeros = unique_file("zeros"), victim = unique_file("victim"),
              link = unique_file("link");
    uint8_t z[4096] = {0};
    write_file(zeros.path, z, sizeof z, 0600);
    write_file(victim.path, "notes\n", 6, 0600);
    cr_assert_eq(symlink(victim.path, link.path), 0);
    bool removed = true;
    cr_assert_eq(dt_store_remove_if_dead(zeros.url, &removed), DT_OK);
    cr_assert(!removed && holds(zeros.path, z, sizeof z), "a file of zeros was touched");
    cr_assert_eq(dt_store_remove_if_dead(link.url, &removed), DT_ESTORE);
    cr_assert(!removed && holds(victim.path, "notes\n", 6), "the link's target was touched");
    struct stat st;
    cr_assert_eq(lstat(link.path, &st), 0, "the symlink was removed");
    unlink(zeros.path);
    unlink(link.path);
    unlink(victim.path);
}
