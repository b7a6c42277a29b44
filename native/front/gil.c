/* outside/gil.py in C: whether the thread py-spy flags as holding the GIL keeps it, from looks
 * at /proc after the dump (its state, how many threads of the process run, the CPU time it
 * used), and py-spy's owns_gil kept only on that thread (pyspy.checked_gil). */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "front.h"

/* outside/gil.py HOLD_LOOK_S, HOLD_LOOKS, STILL_LOOKS (tests/unit/test_gil_holder_checks.py
 * holds them equal): the looks at /proc after a dump that flags a thread of the process. */
#define HOLD_LOOK_US 1000
#define HOLD_LOOKS 20
#define STILL_LOOKS 2

/* What /proc/PID/task/TASK/FILE holds (up to 4 KiB, as gil.py _read), NUL-ended; -1 when unread. */
static ssize_t task_file(int pid, const char *task, const char *name, char *text, size_t size)
{
    char path[128];
    snprintf(path, sizeof(path), "/proc/%d/task/%.20s/%s", pid, task, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t got = read(fd, text, size - 1);
    close(fd);
    if (got < 0)
        return -1;
    text[got] = '\0';
    return got;
}

/* gil.py _state: the state letter of a thread's stat, after the last ')' (the thread's name
 * before it may hold any byte); 0 when unread. */
static char task_state(int pid, const char *task, char *text)
{
    const char *close;
    if (task_file(pid, task, "stat", text, 4097) < 0 || (close = strrchr(text, ')')) == NULL ||
        strlen(close) < 3)
        return 0;
    return close[2];
}

/* gil.py _cpu_time: the nanoseconds a thread has run (schedstat); -1 when unread. */
static long long cpu_time(int pid, const char *task)
{
    static const char spaces[] = " \t\n\v\f\r";
    char text[4097];
    if (task_file(pid, task, "schedstat", text, sizeof(text)) <= 0)
        return -1;
    const char *start = text + strspn(text, spaces);
    size_t digits = strspn(start, "0123456789");
    /* the terminating NUL is in `spaces` too, as Python's split() ends a word at the end */
    return digits && strchr(spaces, start[digits]) ? strtoll(start, NULL, 10) : -1;
}

/* gil.py _look: the holder's state (0: no thread of the process) and into `running` how many
 * threads run (R or D; -1 when /proc cannot tell). */
static char look_at(int pid, const char *holder, int *running)
{
    char path[64], text[4097], found = 0;
    snprintf(path, sizeof(path), "/proc/%d/task", pid);
    DIR *tasks = opendir(path);
    *running = -1;
    if (tasks == NULL)
        return 0;
    *running = 0;
    struct dirent *task;
    while ((task = readdir(tasks)) != NULL) {
        if (strcmp(task->d_name, ".") == 0 || strcmp(task->d_name, "..") == 0)
            continue;
        char state = task_state(pid, task->d_name, text);
        *running += state == 'R' || state == 'D';
        if (strcmp(task->d_name, holder) == 0)
            found = state;
    }
    closedir(tasks);
    return found;
}

/* gil.py keeps_the_gil: blocked holding the GIL (STILL_LOOKS looks in a row find no thread
 * running) or busy holding it (running at every look while its CPU time moves), within
 * HOLD_LOOKS looks. The front end reads only processes of its own PID namespace (ask_agent). */
static int keeps_the_gil(int pid, long long tid)
{
    char task[24], path[64];
    snprintf(task, sizeof(task), "%lld", tid);
    snprintf(path, sizeof(path), "/proc/%d/task/%s", pid, task);
    if (tid <= 0 || access(path, F_OK) != 0)
        return 0;
    int still = 0, busy = 1;
    long long first_cpu = -1;
    for (int look = 0; look < HOLD_LOOKS; look++) {
        if (look) {
            struct timespec pause = {0, HOLD_LOOK_US * 1000L};
            nanosleep(&pause, NULL);
        }
        int running;
        char state = look_at(pid, task, &running);
        if (state == 0 || running < 0)
            return 0;
        still = running == 0 ? still + 1 : 0;
        if (still >= STILL_LOOKS)
            return 1;
        long long cpu = busy && state == 'R' ? cpu_time(pid, task) : -1;
        busy = cpu >= 0;
        if (busy && first_cpu < 0)
            first_cpu = cpu;
        else if (busy && cpu > first_cpu)
            return 1;
    }
    return 0;
}

/* pyspy.checked_gil: owns_gil kept only on the thread that keeps the GIL. Every thread py-spy
 * flags has the GIL's thread id; the first that is a thread of the process is looked at, and
 * probing's own threads lose the flag unlooked at. */
void checked_gil(int pid, const jval *threads)
{
    long long looked = 0; /* the OS id looked at: a thread of the process has one above 0 */
    int kept = 0;
    for (size_t i = 0; i < threads->count; i++) {
        jval *gil = (jval *)json_get(&threads->items[i], "owns_gil"); /* the parsed dump is ours */
        long long tid = json_get(&threads->items[i], "os_thread_id")->num;
        char path[64];
        if (!gil || !gil->num)
            continue;
        if (agent_thread(&threads->items[i])) {
            gil->num = 0;
            continue;
        }
        snprintf(path, sizeof(path), "/proc/%d/task/%lld", pid, tid);
        if (looked == 0 && tid > 0 && access(path, F_OK) == 0) {
            looked = tid;
            kept = keeps_the_gil(pid, tid);
        }
        gil->num = looked != 0 && looked == tid && kept;
    }
}
