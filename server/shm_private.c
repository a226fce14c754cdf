/* Loaded into tritonserver (LD_PRELOAD, see server/shm_private.py). Two things about /dev/shm:
 *
 * 1. A region in /dev/shm is never given group or other permissions. Triton 2.51's Python backend
 *    creates its IPC regions through Boost.Interprocess, which fchmods every new region to 0644 after
 *    shm_open so the umask cannot narrow it; with this, the region keeps the umask's 0600 from its
 *    first moment (fault matrix row 42).
 * 2. A client that truncates its own registered region while Triton copies from or to it no longer
 *    kills the server: the copy's SIGBUS on a page of a shared /dev/shm mapping is answered by
 *    putting a private zero page there, and the copy goes on (fault matrix row 45). The client that
 *    cut its region short reads zeros or loses that output; its registration keeps the private page
 *    until it unregisters. Any other SIGBUS kills the server as before.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
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

static long page_size = 4096;
static struct sigaction default_bus;

static uintptr_t parse_hex(const char **text) {
    uintptr_t value = 0;
    for (;; (*text)++) {
        char c = **text;
        if (c >= '0' && c <= '9') value = value * 16 + (uintptr_t)(c - '0');
        else if (c >= 'a' && c <= 'f') value = value * 16 + (uintptr_t)(c - 'a' + 10);
        else return value;
    }
}

/* Does one /proc/self/maps line map `address` shared from a /dev/shm file? */
static int line_maps_shm(const char *line, uintptr_t address) {
    uintptr_t start = parse_hex(&line);
    if (*line++ != '-') return 0;
    uintptr_t end = parse_hex(&line);
    if (address < start || address >= end || *line++ != ' ') return 0;
    if (strlen(line) < 4 || line[3] != 's') return 0; /* perms: rw-s */
    const char *path = strchr(line, '/');
    return names_shm(path);
}

/* Only read(2), open(2), close(2) and plain C here: this runs in a signal handler. */
static int address_in_shm_mapping(uintptr_t address) {
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char chunk[4096], line[512];
    size_t used = 0;
    int found = 0, overflow = 0;
    ssize_t got;
    while (!found && (got = read(fd, chunk, sizeof chunk)) > 0) {
        for (ssize_t i = 0; i < got && !found; i++) {
            if (chunk[i] == '\n') {
                line[used] = '\0';
                found = line_maps_shm(line, address);
                used = 0;
                overflow = 0;
            } else if (!overflow && used < sizeof line - 1) {
                line[used++] = chunk[i];
            } else {
                overflow = 1; /* the rest of a long path: the start is what we check */
            }
        }
    }
    close(fd);
    return found;
}

static void on_sigbus(int signal_number, siginfo_t *info, void *context) {
    (void)signal_number;
    (void)context;
    uintptr_t address = (uintptr_t)info->si_addr;
    if (info->si_code == BUS_ADRERR && address_in_shm_mapping(address)) {
        void *page = (void *)(address & ~(uintptr_t)(page_size - 1));
        void *mapped = mmap(page, (size_t)page_size, PROT_READ | PROT_WRITE,
                            MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mapped != MAP_FAILED) return; /* the faulting copy resumes on the private page */
    }
    sigaction(SIGBUS, &default_bus, NULL); /* anything else: die of it, as without this library */
}

__attribute__((constructor)) static void install_sigbus_handler(void) {
    page_size = sysconf(_SC_PAGESIZE);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &default_bus);
}
