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
 */
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

static int verbose = 0;

static void say(const char *format, ...) {
    if (!verbose) return;
    va_list arguments;
    va_start(arguments, format);
    fputs("probing-inject: ", stderr);
    vfprintf(stderr, format, arguments);
    fputc('\n', stderr);
    va_end(arguments);
}

static void json_string(const char *text) {
    putchar('"');
    for (; *text; text++) {
        unsigned char c = (unsigned char)*text;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static int fail(const char *kind, const char *format, ...) {
    char message[1024];
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(message, sizeof message, format, arguments);
    va_end(arguments);
    printf("{\"ok\": false, \"error\": ");
    json_string(kind);
    printf(", \"message\": ");
    json_string(message);
    printf("}\n");
    return 1;
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* --- ELF: a symbol of a shared library file ------------------------------------------- */

/* A defined dynamic symbol's value (st_value), and the file's lowest load address. */
static int elf_symbol(const char *path, const char *name, uint64_t *value, uint64_t *lowest_out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat info;
    if (fstat(fd, &info) != 0 || info.st_size < (off_t)sizeof(Elf64_Ehdr)) {
        close(fd);
        return 0;
    }
    size_t size = (size_t)info.st_size;
    unsigned char *file = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (file == MAP_FAILED) return 0;
    int found = 0;
    Elf64_Ehdr *header = (Elf64_Ehdr *)file;
    if (memcmp(header->e_ident, ELFMAG, SELFMAG) != 0 || header->e_ident[EI_CLASS] != ELFCLASS64 ||
        header->e_shoff + (uint64_t)header->e_shnum * sizeof(Elf64_Shdr) > size)
        goto done;
    Elf64_Shdr *sections = (Elf64_Shdr *)(file + header->e_shoff);
    /* Load bias of the file: the lowest PT_LOAD address (0 for every shared library we meet). */
    uint64_t lowest = UINT64_MAX;
    if (header->e_phoff + (uint64_t)header->e_phnum * sizeof(Elf64_Phdr) <= size) {
        Elf64_Phdr *segments = (Elf64_Phdr *)(file + header->e_phoff);
        for (int i = 0; i < header->e_phnum; i++)
            if (segments[i].p_type == PT_LOAD && segments[i].p_vaddr < lowest)
                lowest = segments[i].p_vaddr & ~(uint64_t)0xfff;
    }
    if (lowest == UINT64_MAX) lowest = 0;
    for (int i = 0; i < header->e_shnum && !found; i++) {
        if (sections[i].sh_type != SHT_DYNSYM || sections[i].sh_link >= header->e_shnum) continue;
        Elf64_Shdr *strings = &sections[sections[i].sh_link];
        if (sections[i].sh_offset + sections[i].sh_size > size || strings->sh_offset + strings->sh_size > size)
            continue;
        Elf64_Sym *symbols = (Elf64_Sym *)(file + sections[i].sh_offset);
        size_t count = sections[i].sh_size / sizeof(Elf64_Sym);
        for (size_t j = 0; j < count; j++) {
            if (symbols[j].st_name >= strings->sh_size || symbols[j].st_shndx == SHN_UNDEF) continue;
            if (strcmp((char *)file + strings->sh_offset + symbols[j].st_name, name) == 0) {
                *value = symbols[j].st_value;
                if (lowest_out) *lowest_out = lowest;
                found = 1;
                break;
            }
        }
    }
done:
    munmap(file, size);
    return found;
}

/* --- /proc/PID/maps ---------------------------------------------------------------------- */

#define MAX_RANGES 64

struct target {
    pid_t pid;
    char libc[PATH_MAX]; /* as the target sees it */
    uint64_t libc_base;
    uint64_t dlopen;
    int dlopen_is_private; /* __libc_dlopen_mode (glibc < 2.34) wants __RTLD_DLOPEN */
    uint64_t start_offset; /* st_value of probing_helper_start in the helper */
    uint64_t python_text[MAX_RANGES][2];
    int python_ranges;
    uint64_t loader_text[MAX_RANGES][2]; /* ld.so: a thread stopped in here may hold its lock */
    int loader_ranges;
};

static int is_libc(const char *path) {
    const char *name = strrchr(path, '/');
    name = name ? name + 1 : path;
    return strncmp(name, "libc.so", 7) == 0 || strncmp(name, "libc-", 5) == 0 ||
           strncmp(name, "ld-musl-", 8) == 0;
}

static int read_maps(struct target *target) {
    char path[64], exe[PATH_MAX];
    snprintf(path, sizeof path, "/proc/%d/exe", target->pid);
    ssize_t length = readlink(path, exe, sizeof exe - 1);
    exe[length > 0 ? length : 0] = '\0';
    snprintf(path, sizeof path, "/proc/%d/maps", target->pid);
    FILE *maps = fopen(path, "re");
    if (!maps) return 0;
    char line[PATH_MAX + 256];
    while (fgets(line, sizeof line, maps)) {
        uint64_t start, end, offset;
        char permissions[8], file[PATH_MAX] = "";
        if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %4095[^\n]", &start, &end, permissions, &offset, file) < 4)
            continue;
        if (file[0] == '\0') continue;
        if (!target->libc_base && offset == 0 && is_libc(file)) {
            snprintf(target->libc, sizeof target->libc, "%s", file);
            target->libc_base = start;
        }
        const char *base = strrchr(file, '/');
        base = base ? base + 1 : file;
        if (permissions[2] == 'x' && target->loader_ranges < MAX_RANGES && strncmp(base, "ld-", 3) == 0) {
            target->loader_text[target->loader_ranges][0] = start;
            target->loader_text[target->loader_ranges][1] = end;
            target->loader_ranges++;
        }
        if (permissions[2] == 'x' && target->python_ranges < MAX_RANGES &&
            (strcmp(file, exe) == 0 || strstr(file, "/libpython") != NULL)) {
            target->python_text[target->python_ranges][0] = start;
            target->python_text[target->python_ranges][1] = end;
            target->python_ranges++;
        }
    }
    fclose(maps);
    return 1;
}

static int resolve(struct target *target, const char *helper) {
    if (!read_maps(target)) {
        int error = errno;
        return fail(error == EACCES || error == EPERM ? "permission" : "exited", "cannot read /proc/%d/maps: %s",
                    target->pid, strerror(error));
    }
    if (!target->libc_base) return fail("no_libc", "no C library is mapped in PID %d", target->pid);
    char file[PATH_MAX + 64];
    snprintf(file, sizeof file, "/proc/%d/root%s", target->pid, target->libc);
    uint64_t value, lowest;
    if (elf_symbol(file, "dlopen", &value, &lowest)) {
        target->dlopen_is_private = 0;
    } else if (elf_symbol(file, "__libc_dlopen_mode", &value, &lowest)) {
        target->dlopen_is_private = 1;
    } else {
        return fail("no_dlopen", "no dlopen in %s", target->libc);
    }
    /* The mapping at file offset 0 is where the lowest PT_LOAD segment landed. */
    target->dlopen = target->libc_base + value - lowest;
    /* Added to the link_map's l_addr (the load bias), not to a mapping's start. */
    if (!elf_symbol(helper, "probing_helper_start", &target->start_offset, NULL))
        return fail("bad_helper", "%s has no probing_helper_start", helper);
    say("libc %s at 0x%lx, dlopen at 0x%lx%s", target->libc, target->libc_base, target->dlopen,
        target->dlopen_is_private ? " (__libc_dlopen_mode)" : "");
    return 0;
}

#if defined(__x86_64__)

/* --- threads and their system calls ------------------------------------------------------ */

static int safe_syscall_rank(long number) {
    switch (number) {
        case SYS_nanosleep:
        case SYS_clock_nanosleep: return 1;
        case SYS_poll:
        case SYS_ppoll:
        case SYS_select:
        case SYS_pselect6:
        case SYS_epoll_wait:
        case SYS_epoll_pwait:
#ifdef SYS_epoll_pwait2
        case SYS_epoll_pwait2:
#endif
            return 2;
        case SYS_read:
        /* A process waiting for its child (a launcher such as `probing run`, a shell-like
         * supervisor) blocks in wait4 or waitid with the GIL released, as in read. */
        case SYS_wait4:
        case SYS_waitid: return 3;
        case SYS_futex: return 4;
        default: return 0;
    }
}

static const char *syscall_name(long number) {
    switch (number) {
        case SYS_nanosleep: return "nanosleep";
        case SYS_clock_nanosleep: return "clock_nanosleep";
        case SYS_poll: return "poll";
        case SYS_ppoll: return "ppoll";
        case SYS_select: return "select";
        case SYS_pselect6: return "pselect6";
        case SYS_epoll_wait: return "epoll_wait";
        case SYS_epoll_pwait: return "epoll_pwait";
        case SYS_read: return "read";
        case SYS_wait4: return "wait4";
        case SYS_waitid: return "waitid";
        case SYS_futex: return "futex";
        default: return "another system call";
    }
}

struct candidate {
    pid_t tid;
    int rank; /* 1-4: in a safe system call (lower is better); 5: running; 0: elsewhere */
};

static int by_rank(const void *a, const void *b) {
    return ((const struct candidate *)a)->rank - ((const struct candidate *)b)->rank;
}

/* Threads ordered by how safe they look from /proc (re-checked on the stopped thread). */
static int list_candidates(pid_t pid, struct candidate *out, int capacity) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *tasks = opendir(path);
    if (!tasks) return -1;
    int count = 0;
    struct dirent *entry;
    while ((entry = readdir(tasks)) && count < capacity) {
        if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
        pid_t tid = atoi(entry->d_name);
        char file[96], text[256] = "";
        snprintf(file, sizeof file, "/proc/%d/task/%d/syscall", pid, tid);
        int fd = open(file, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t length = read(fd, text, sizeof text - 1);
        close(fd);
        text[length > 0 ? length : 0] = '\0';
        int rank = 0;
        if (strncmp(text, "running", 7) == 0) rank = 5;
        else if (text[0] >= '0' && text[0] <= '9') rank = safe_syscall_rank(atol(text));
        if (rank) {
            out[count].tid = tid;
            out[count].rank = rank;
            count++;
        }
    }
    closedir(tasks);
    qsort(out, count, sizeof *out, by_rank);
    return count;
}

/* --- ptrace ---------------------------------------------------------------------------- */

enum { STOPPED = 0, TIMED_OUT = -1, GONE = -2 };

/* Wait until the thread stops; signals that arrive first are noted to be delivered later. */
static int wait_stop(pid_t tid, uint64_t deadline, int want_event, int *pending_signal, int *status_out) {
    for (;;) {
        int status;
        pid_t got = waitpid(tid, &status, __WALL | WNOHANG);
        if (got < 0) {
            if (errno == EINTR) continue;
            return GONE;
        }
        if (got == 0) {
            if (now_ns() > deadline) return TIMED_OUT;
            struct timespec pause = {0, 50 * 1000};
            nanosleep(&pause, NULL);
            continue;
        }
        if (WIFEXITED(status) || WIFSIGNALED(status)) return GONE;
        if (!WIFSTOPPED(status)) continue;
        int signal_number = WSTOPSIG(status);
        int event = status >> 16;
        if (want_event && event == PTRACE_EVENT_STOP) {
            *status_out = status;
            return STOPPED;
        }
        if (!want_event && signal_number == SIGSEGV) {
            *status_out = status;
            return STOPPED;
        }
        if (event == 0 && signal_number != SIGTRAP) {
            /* A signal for the job arrived while we hold the thread: keep it for later. */
            say("thread %d: signal %d arrived, delivered when the thread is let go", tid, signal_number);
            *pending_signal = signal_number;
        }
        ptrace(PTRACE_CONT, tid, 0, 0);
    }
}

static int peek(pid_t tid, uint64_t address, uint64_t *word) {
    errno = 0;
    long value = ptrace(PTRACE_PEEKDATA, tid, (void *)address, 0);
    if (errno) return 0;
    *word = (uint64_t)value;
    return 1;
}

static int poke(pid_t tid, uint64_t address, uint64_t word) {
    return ptrace(PTRACE_POKEDATA, tid, (void *)address, (void *)word) == 0;
}

struct borrowed {
    pid_t tid;
    struct user_regs_struct saved;
    /* The floating-point and vector registers (x87, SSE, AVX...). A thread stopped in a system
     * call has none live (the call is a function call), but one stopped while running in the
     * interpreter may: dlopen's string functions use them, so they are restored too. */
    unsigned char xstate[16384] __attribute__((aligned(64)));
    struct iovec xstate_iov;
    struct user_fpregs_struct fpregs;
    int vector_state; /* 2: xstate saved, 1: fpregs saved, 0: none */
    uint64_t scratch; /* first byte we overwrite on its stack */
    uint64_t original[(PATH_MAX + 128) / 8];
    int words;
    int pending_signal;
};

static int in_ranges(const uint64_t (*ranges)[2], int count, uint64_t address) {
    for (int i = 0; i < count; i++)
        if (address >= ranges[i][0] && address < ranges[i][1]) return 1;
    return 0;
}

static int in_python_text(const struct target *target, uint64_t address) {
    return in_ranges(target->python_text, target->python_ranges, address);
}

static int in_loader_text(const struct target *target, uint64_t address) {
    return in_ranges(target->loader_text, target->loader_ranges, address);
}

/* Call function(first, second) in the stopped thread; returns its result in *result. */
static int call_in_thread(struct borrowed *thread, uint64_t function, uint64_t first, uint64_t second,
                          uint64_t return_slot, uint64_t *result) {
    struct user_regs_struct registers = thread->saved;
    registers.rip = function;
    registers.rdi = first;
    registers.rsi = second;
    registers.rax = 0;
    registers.orig_rax = (uint64_t)-1; /* no system call to restart while we borrow it */
    registers.rsp = return_slot;
    if (!poke(thread->tid, return_slot, 0)) return 0;
    if (ptrace(PTRACE_SETREGS, thread->tid, 0, &registers) != 0) return 0;
    if (ptrace(PTRACE_CONT, thread->tid, 0, 0) != 0) return 0;
    int status;
    /* dlopen may wait for the loader's lock held by another thread: wait as long as it takes
     * (a minute) rather than leave the thread to fault at address 0 without us. */
    int outcome = wait_stop(thread->tid, now_ns() + 60ull * 1000000000u, 0, &thread->pending_signal, &status);
    if (outcome != STOPPED) return 0;
    if (ptrace(PTRACE_GETREGS, thread->tid, 0, &registers) != 0) return 0;
    if (registers.rip != 0) {
        say("thread %d faulted at 0x%llx inside the call", thread->tid, registers.rip);
        return 0;
    }
    *result = registers.rax;
    return 1;
}

static void save_vector_state(struct borrowed *thread) {
    thread->xstate_iov.iov_base = thread->xstate;
    thread->xstate_iov.iov_len = sizeof thread->xstate;
    if (ptrace(PTRACE_GETREGSET, thread->tid, (void *)NT_X86_XSTATE, &thread->xstate_iov) == 0)
        thread->vector_state = 2;
    else if (ptrace(PTRACE_GETFPREGS, thread->tid, 0, &thread->fpregs) == 0)
        thread->vector_state = 1;
}

static void restore(struct borrowed *thread) {
    for (int i = 0; i < thread->words; i++) poke(thread->tid, thread->scratch + 8u * i, thread->original[i]);
    if (thread->vector_state == 2)
        ptrace(PTRACE_SETREGSET, thread->tid, (void *)NT_X86_XSTATE, &thread->xstate_iov);
    else if (thread->vector_state == 1)
        ptrace(PTRACE_SETFPREGS, thread->tid, 0, &thread->fpregs);
    struct user_regs_struct registers = thread->saved;
    long error = -(long)registers.rax;
    if ((long)registers.orig_rax >= 0) {
        /* The stop interrupted a system call: restart it as the kernel would have. */
        if (error == 512 || error == 513 || error == 514) { /* ERESTARTSYS, NOINTR, NOHAND */
            registers.rax = registers.orig_rax;
            registers.rip -= 2; /* back onto the 2-byte syscall instruction */
        } else if (error == 516) { /* ERESTART_RESTARTBLOCK */
            registers.rax = SYS_restart_syscall;
            registers.rip -= 2;
        }
        registers.orig_rax = (uint64_t)-1;
    }
    ptrace(PTRACE_SETREGS, thread->tid, 0, &registers);
}

enum { BORROWED = 0, NOT_SAFE = 1, FAILED = 2 };

static int try_thread(const struct target *target, pid_t tid, const char *dlopen_path, uint64_t *stopped_ns,
                      char *where, size_t where_size) {
    if (ptrace(PTRACE_SEIZE, tid, 0, 0) != 0) {
        if (errno == ESRCH) return NOT_SAFE; /* the thread ended */
        fail(errno == EPERM ? "permission" : "ptrace", "ptrace(PTRACE_SEIZE, %d): %s", tid, strerror(errno));
        return FAILED;
    }
    struct borrowed thread = {.tid = tid};
    int status;
    ptrace(PTRACE_INTERRUPT, tid, 0, 0);
    int outcome = wait_stop(tid, now_ns() + 1000000000u, 1, &thread.pending_signal, &status);
    if (outcome == GONE) return NOT_SAFE;
    if (outcome == TIMED_OUT) {
        /* Never stopped (uninterruptible sleep): detach by letting go of it. */
        ptrace(PTRACE_DETACH, tid, 0, 0);
        return NOT_SAFE;
    }
    uint64_t stopped_at = now_ns();
    if (ptrace(PTRACE_GETREGS, tid, 0, &thread.saved) != 0) {
        ptrace(PTRACE_DETACH, tid, 0, (void *)(long)thread.pending_signal);
        return NOT_SAFE;
    }
    long in_syscall = (long)thread.saved.orig_rax;
    /* A system call made from inside the dynamic loader (reading a library it is loading)
     * means the loader's lock may be held by this very thread: never borrow it there. */
    if (in_syscall >= 0 && safe_syscall_rank(in_syscall) && !in_loader_text(target, thread.saved.rip)) {
        snprintf(where, where_size, "waiting in %s", syscall_name(in_syscall));
    } else if (in_syscall < 0 && in_python_text(target, thread.saved.rip)) {
        snprintf(where, where_size, "running in the interpreter");
    } else {
        say("thread %d: not at a safe place (%s 0x%llx); letting it go", tid,
            in_syscall >= 0 ? "in system call" : "at", in_syscall >= 0 ? thread.saved.orig_rax : thread.saved.rip);
        ptrace(PTRACE_DETACH, tid, 0, (void *)(long)thread.pending_signal);
        *stopped_ns += now_ns() - stopped_at;
        return NOT_SAFE;
    }
    say("thread %d: %s; borrowing it", tid, where);
    save_vector_state(&thread);

    /* Stack layout below the red zone: [return slot][padding][helper path]. */
    size_t path_length = strlen(dlopen_path) + 1;
    uint64_t path_address = (thread.saved.rsp - 128 - 64 - path_length) & ~(uint64_t)15;
    uint64_t return_slot = ((path_address - 64) & ~(uint64_t)15) - 8; /* rsp % 16 == 8 at entry */
    thread.scratch = return_slot;
    thread.words = (int)((thread.saved.rsp - return_slot + 7) / 8);
    int ok = 1;
    for (int i = 0; i < thread.words && ok; i++) ok = peek(tid, thread.scratch + 8u * i, &thread.original[i]);
    for (size_t i = 0; i < path_length && ok; i += 8) {
        uint64_t word = 0;
        memcpy(&word, dlopen_path + i, path_length - i < 8 ? path_length - i : 8);
        ok = poke(tid, path_address + i, word);
    }
    uint64_t handle = 0, link_base = 0, started = 1;
    if (ok) {
        uint64_t mode = RTLD_NOW | (target->dlopen_is_private ? 0x80000000u : 0);
        ok = call_in_thread(&thread, target->dlopen, path_address, mode, return_slot, &handle) && handle;
        if (!ok) say("dlopen of %s failed in the target", dlopen_path);
    }
    if (ok) ok = peek(tid, handle, &link_base); /* link_map.l_addr */
    if (ok) ok = call_in_thread(&thread, link_base + target->start_offset, 0, 0, return_slot, &started);
    restore(&thread);
    ptrace(PTRACE_DETACH, tid, 0, (void *)(long)thread.pending_signal);
    *stopped_ns += now_ns() - stopped_at;
    if (!ok || (int)started != 0) {
        fail("call_failed", "the helper could not be loaded and started in thread %d (dlopen handle 0x%lx, start %d)",
             tid, handle, (int)started);
        return FAILED;
    }
    return BORROWED;
}

static int inject(pid_t pid, const char *helper, const char *dlopen_path, int timeout_ms) {
    struct target target = {.pid = pid};
    if (resolve(&target, helper)) return 1;
    uint64_t began = now_ns(), deadline = began + (uint64_t)timeout_ms * 1000000u, stopped_ns = 0;
    struct candidate candidates[1024];
    int attempts = 0;
    while (now_ns() < deadline) {
        int count = list_candidates(pid, candidates, 1024);
        if (count < 0) return fail("exited", "PID %d is gone", pid);
        for (int i = 0; i < count; i++) {
            char where[64];
            uint64_t stopped = 0;
            attempts++;
            int outcome = try_thread(&target, candidates[i].tid, dlopen_path, &stopped, where, sizeof where);
            stopped_ns += stopped;
            if (outcome == FAILED) return 1;
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
