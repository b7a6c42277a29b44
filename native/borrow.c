/* probing-inject: borrow one stopped thread for a call, and give it back as it was. */
#include "inject.h"

#if defined(__x86_64__)

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


int try_thread(const struct target *target, pid_t tid, const char *dlopen_path, uint64_t *stopped_ns,
               char *where, size_t where_size, pid_t *tracer) {
    if (ptrace(PTRACE_SEIZE, tid, 0, 0) != 0) {
        int error = errno;
        if (error == ESRCH) return NOT_SAFE; /* the thread ended */
        /* A thread has one tracer at most: one that gdb or strace holds refuses us with EPERM
         * even as root, which is no lack of permission. Another thread may be free. */
        if (error == EPERM && (*tracer = tracer_of(target->pid, tid)) != 0) {
            say("thread %d is traced by PID %d; letting it be", tid, *tracer);
            return TRACED;
        }
        fail(error == EPERM ? "permission" : "ptrace", "ptrace(PTRACE_SEIZE, %d): %s", tid, strerror(error));
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

#endif /* __x86_64__ */
