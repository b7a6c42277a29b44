/* The states of a process and its threads, from /proc (procfs.py process_alive and
 * running_threads): whether the target lives, and whether any of its threads runs. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "front.h"

/* The state letter of a stat(5) file (after the last ')': the name may hold any), or 0. */
static char stat_state(const char *path)
{
    char text[1024];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t got = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (got <= 0)
        return 0;
    text[got] = '\0';
    char *close_paren = strrchr(text, ')');
    return close_paren && close_paren[1] == ' ' ? close_paren[2] : 0;
}

int process_alive(int pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    char state = stat_state(path);
    return state != 0 && state != 'Z' && state != 'X';
}

/* procfs.running_threads: threads in state R or D; -1 when /proc does not show them. */
int running_threads(int pid)
{
    char path[96];
    snprintf(path, sizeof(path), "/proc/%d/task", pid);
    DIR *tasks = opendir(path);
    if (tasks == NULL)
        return -1;
    int running = 0;
    struct dirent *task;
    while ((task = readdir(tasks)) != NULL) {
        if (task->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%.20s/stat", pid, task->d_name);
        char state = stat_state(path);
        running += state == 'R' || state == 'D';
    }
    closedir(tasks);
    return running;
}
