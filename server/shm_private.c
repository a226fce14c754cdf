/* Loaded into tritonserver (LD_PRELOAD, see server/shm_private.py): a region in /dev/shm is never
 * given group or other permissions. Triton 2.51's Python backend creates its IPC regions through
 * Boost.Interprocess, which fchmods every new region to 0644 after shm_open so the umask cannot
 * narrow it; with this, the region keeps the umask's 0600 from its first moment (fault matrix row 42).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char SHM_DIR[] = "/dev/shm/";

static int names_shm(const char *path) {
    return path != NULL && strncmp(path, SHM_DIR, sizeof SHM_DIR - 1) == 0;
}

static int fd_in_shm(int fd) {
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t length = readlink(link, target, sizeof target - 1);
    if (length < 0) return 0;
    target[length] = '\0';
    return names_shm(target);
}

int fchmod(int fd, mode_t mode) {
    static int (*real_fchmod)(int, mode_t);
    if (real_fchmod == NULL) real_fchmod = (int (*)(int, mode_t))dlsym(RTLD_NEXT, "fchmod");
    if (fd_in_shm(fd)) mode &= ~(mode_t)077;
    return real_fchmod(fd, mode);
}

int chmod(const char *path, mode_t mode) {
    static int (*real_chmod)(const char *, mode_t);
    if (real_chmod == NULL) real_chmod = (int (*)(const char *, mode_t))dlsym(RTLD_NEXT, "chmod");
    if (names_shm(path)) mode &= ~(mode_t)077;
    return real_chmod(path, mode);
}
