/* What the parts of probing-inject share (native/inject.c says what the program does). */
#ifndef PROBING_INJECT_H
#define PROBING_INJECT_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <dirent.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#endif

/* report.c: what the injector says (one JSON line on stdout; -v narrates on stderr). */
extern int verbose;
void say(const char *format, ...);
void json_string(const char *text);
int fail(const char *kind, const char *format, ...);
int fail_traced(pid_t tracer, const char *format, ...); /* kind "traced", naming the tracer's PID */
uint64_t now_ns(void);

/* maps.c: where dlopen and the helper's entry point are in the target. */
#define MAX_RANGES 64

struct target {
    pid_t pid;
    char libc[PATH_MAX]; /* as /proc/PID/maps names it to us */
    char libc_file[PATH_MAX + 64]; /* where we read it: see find_libc_file in maps.c */
    uint64_t libc_base, libc_end; /* its mapping at file offset 0 */
    unsigned libc_major, libc_minor; /* its device and inode, from /proc/PID/maps */
    uint64_t libc_inode;
    uint64_t dlopen;
    int dlopen_is_private; /* __libc_dlopen_mode (glibc < 2.34) wants __RTLD_DLOPEN */
    uint64_t start_offset; /* st_value of probing_helper_start in the helper */
    uint64_t python_text[MAX_RANGES][2];
    int python_ranges;
    uint64_t loader_text[MAX_RANGES][2]; /* ld.so: a thread stopped in here may hold its lock */
    int loader_ranges;
};
int resolve(struct target *target, const char *helper);

#if defined(__x86_64__)
/* threads.c: which threads look safe to borrow, from /proc. */
struct candidate {
    pid_t tid;
    int rank; /* 1-4: in a safe system call (lower is better); 5: running; 0: elsewhere */
};
int list_candidates(pid_t pid, struct candidate *out, int capacity);
const char *syscall_name(long number);
int safe_syscall_rank(long number); /* 1-4: a safe system call to borrow a thread in; 0: not */
pid_t tracer_of(pid_t pid, pid_t tid); /* the PID tracing thread `tid` (TracerPid), or 0 */
pid_t tracer_of_every_thread(pid_t pid); /* the tracer of one thread, if another holds them all; else 0 */

/* borrow.c: stop one thread, make it call dlopen and the helper, put it back as it was.
 * TRACED: another tracer (gdb, strace) holds the thread; *tracer says which. */
enum { BORROWED = 0, NOT_SAFE = 1, FAILED = 2, TRACED = 3 };
int try_thread(const struct target *target, pid_t tid, const char *dlopen_path, uint64_t *stopped_ns,
               char *where, size_t where_size, pid_t *tracer);
#endif

#endif
