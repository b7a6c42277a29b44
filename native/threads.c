/* probing-inject: the threads of the target, ordered by how safe they look to borrow. */
#include "inject.h"

#if defined(__x86_64__)

/* --- threads and their system calls ------------------------------------------------------ */

int safe_syscall_rank(long number) {
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

const char *syscall_name(long number) {
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



pid_t tracer_of(pid_t pid, pid_t tid) {
    char path[96], line[256];
    snprintf(path, sizeof path, "/proc/%d/task/%d/status", pid, tid);
    FILE *status = fopen(path, "re");
    if (!status) return 0;
    pid_t tracer = 0;
    while (fgets(line, sizeof line, status))
        if (sscanf(line, "TracerPid: %d", &tracer) == 1) break;
    fclose(status);
    return tracer;
}

/* gdb stops every thread it attaches to, and a thread in that stop is in no system call we
 * would borrow: without this look, the injector would wait out its whole timeout and then
 * blame the job for never being at a safe moment. */
pid_t tracer_of_every_thread(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *tasks = opendir(path);
    if (!tasks) return 0;
    pid_t first = 0;
    int free_threads = 0;
    struct dirent *entry;
    while ((entry = readdir(tasks))) {
        if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
        pid_t tracer = tracer_of(pid, atoi(entry->d_name));
        if (!tracer) free_threads++;
        else if (!first) first = tracer;
    }
    closedir(tasks);
    return free_threads ? 0 : first;
}

static int by_rank(const void *a, const void *b) {
    return ((const struct candidate *)a)->rank - ((const struct candidate *)b)->rank;
}

/* Threads ordered by how safe they look from /proc (re-checked on the stopped thread). */
int list_candidates(pid_t pid, struct candidate *out, int capacity) {
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

#endif /* __x86_64__ */
