/*
 * probing-inject: make one thread of a running process load libprobing-helper.so and call
 * probing_helper_start(), stopping that one thread for about as long as dlopen takes.
 *
 *     probing-inject [-v] [--timeout-ms N] PID HELPER.so    inject; prints one JSON line
 *     probing-inject --symbols PID HELPER.so                addresses for the gdb method
 *
 * No debug symbols and no gdb: dlopen's address comes from /proc/PID/maps and the dynamic
 * symbol table of the target's libc. Only the borrowed thread is ever stopped (ptrace
 * attaches to threads, not processes); the others run on throughout.
 *
 * Which thread is safe to borrow. A thread is borrowed only when, at the moment it is
 * stopped, it is either
 *   - blocked in one of the system calls where programs wait: nanosleep, clock_nanosleep,
 *     poll, ppoll, select, pselect6, epoll_wait, epoll_pwait(2), read, wait4, waitid, or futex (tried
 *     last: a futex wait may sit inside a lock of libc), made from anywhere but the
 *     dynamic loader (which may be holding its own lock while it reads a library); or
 *   - running user code inside the Python interpreter itself (the executable or
 *     libpython): then it is not inside malloc or the dynamic loader, whose locks dlopen
 *     needs, because those live in libc and ld.so.
 * A thread stopped anywhere else (in libc, in ld.so, in another library) is let go at once
 * and looked at again a millisecond later, until the deadline: a single thread spinning in
 * pure Python is borrowed the first time it is seen in the interpreter's own code; one that
 * never is makes the injector give up with "no_safe_moment", never gamble.
 *
 * The call. The path of the helper is written below the thread's stack pointer (past the
 * red zone), then a return address of 0: when dlopen returns, the thread faults at address
 * 0 and the fault stops it for us (it is never delivered). dlopen's handle is a link_map
 * whose first word is the load bias, which gives probing_helper_start's address; it is
 * called the same way. Then every byte written and every register is restored; a system
 * call that the stop interrupted is restarted the way the kernel restarts it (the program
 * counter moved back onto the syscall instruction, or restart_syscall for nanosleep-like
 * calls), and any signal that arrived meanwhile is delivered when the thread is let go.
 * Every wait has a deadline; on any failure before the call starts, the thread is restored
 * and detached. A call that has started is always waited for to the end: abandoning a
 * thread mid-dlopen would leave the loader's lock held.
 *
 * Another tracer. A thread that gdb or strace holds refuses PTRACE_SEIZE with EPERM, even to
 * root. Its TracerPid says so: it is passed over and another thread is borrowed (`strace -p`
 * holds the main thread alone). When every thread is held, the injector says "traced" at
 * once, naming the tracer, rather than wait out its deadline or blame permissions.
 *
 * Chroots. The target's libc is read where /proc/PID/maps says it is, and that path is from
 * our root, not the target's: maps.c finds the file that is the mapping (find_libc_file).
 */

#include "inject.h"

#if defined(__x86_64__)

static int traced(pid_t pid, pid_t tracer) {
    return fail_traced(tracer, "PID %d is traced by PID %d; a thread has one tracer at a time; nothing was changed",
                       pid, tracer);
}

static int inject(pid_t pid, const char *helper, const char *dlopen_path, int timeout_ms) {
    struct target target = {.pid = pid};
    if (resolve(&target, helper)) return 1;
    pid_t tracer = tracer_of_every_thread(pid);
    if (tracer) return traced(pid, tracer);
    uint64_t began = now_ns(), deadline = began + (uint64_t)timeout_ms * 1000000u, stopped_ns = 0;
    struct candidate candidates[1024];
    int attempts = 0;
    while (now_ns() < deadline) {
        int count = list_candidates(pid, candidates, 1024);
        if (count < 0) return fail("exited", "PID %d is gone", pid);
        for (int i = 0; i < count; i++) {
            char where[64];
            uint64_t stopped = 0;
            pid_t traced_by = 0;
            attempts++;
            int outcome =
                try_thread(&target, candidates[i].tid, dlopen_path, &stopped, where, sizeof where, &traced_by);
            stopped_ns += stopped;
            if (outcome == FAILED) return 1;
            if (outcome == TRACED) tracer = traced_by;
            if (outcome == BORROWED) {
                printf("{\"ok\": true, \"method\": \"ptrace\", \"tid\": %d, \"where\": ", candidates[i].tid);
                json_string(where);
                printf(", \"stopped_ms\": %.3f, \"stopped_total_ms\": %.3f, \"attempts\": %d, \"elapsed_ms\": %.3f}\n",
                       stopped / 1e6, stopped_ns / 1e6, attempts, (now_ns() - began) / 1e6);
                return 0;
            }
        }
        struct timespec pause = {0, 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    if (kill(pid, 0) != 0) return fail("exited", "PID %d exited during the attach", pid);
    /* The threads another tracer holds were passed over: that, not the job, is the reason. */
    if (tracer) return traced(pid, tracer);
    return fail("no_safe_moment",
                "no thread of PID %d was waiting in a system call or running in the interpreter within %d ms "
                "(%d looks); nothing was changed",
                pid, timeout_ms, attempts);
}

#endif /* __x86_64__ */

int main(int argc, char **argv) {
    int symbols_only = 0, timeout_ms = 5000, i = 1;
    const char *dlopen_path = NULL;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "-v") == 0) verbose = 1;
        else if (strcmp(argv[i], "--symbols") == 0) symbols_only = 1;
        else if (strcmp(argv[i], "--timeout-ms") == 0 && i + 1 < argc) timeout_ms = atoi(argv[++i]);
        else if (strcmp(argv[i], "--dlopen-path") == 0 && i + 1 < argc) dlopen_path = argv[++i];
        else break;
    }
    if (argc - i != 2) {
        fprintf(stderr, "usage: probing-inject [-v] [--timeout-ms N] [--dlopen-path P] [--symbols] PID HELPER.so\n");
        return 2;
    }
    pid_t pid = (pid_t)atoi(argv[i]);
    char helper[PATH_MAX];
    /* Not realpath() for an absolute path: /proc/PID/root/... must stay as given, or it would
     * resolve to our own root instead of the container's. */
    if (argv[i + 1][0] == '/') snprintf(helper, sizeof helper, "%s", argv[i + 1]);
    else if (!realpath(argv[i + 1], helper)) return fail("bad_helper", "%s: %s", argv[i + 1], strerror(errno));
    /* The file we read symbols from, and the path the process opens (they differ when the
     * process is in a container and sees the helper under its own root). */
    if (!dlopen_path) dlopen_path = helper;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (symbols_only) {
        struct target target = {.pid = pid};
        if (resolve(&target, helper)) return 1;
        printf("{\"ok\": true, \"dlopen\": %lu, \"dlopen_is_private\": %s, \"start_offset\": %lu}\n",
               (unsigned long)target.dlopen, target.dlopen_is_private ? "true" : "false",
               (unsigned long)target.start_offset);
        return 0;
    }
#if defined(__x86_64__)
    return inject(pid, helper, dlopen_path, timeout_ms);
#else
    return fail("unsupported_platform", "the ptrace injector supports x86-64 only; use --method gdb");
#endif
}
