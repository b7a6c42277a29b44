/* /proc reads, and lines of the job's source files read as engine/sources.py SourceLines
 * reads them: the file's own path, else the same path under /proc/PID/root (a job in a
 * container); the whole file decoded, split as str.splitlines() does, the line stripped. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "front.h"
#include "front_tables.h"

int read_whole(const char *path, char **data, size_t *size, size_t cap)
{
    struct stat info;
    char reopen[64];
    /* The job names the path, and this program may run as root: O_PATH looks at what the path
     * is without opening it (a device's open may act: /dev/watchdog arms, a tape rewinds; a
     * FIFO's would wait for a writer). Only a regular file is then opened, through the same
     * inode (engine/sources.py _read_regular_file does the same). /proc files are regular. */
    int where = open(path, O_PATH | O_CLOEXEC);
    if (where < 0)
        return -1;
    if (fstat(where, &info) < 0 || !S_ISREG(info.st_mode) || (size_t)info.st_size > cap) {
        close(where);
        return -1;
    }
    snprintf(reopen, sizeof(reopen), "/proc/self/fd/%d", where);
    int fd = open(reopen, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    close(where);
    if (fd < 0)
        return -1;
    buf_t buf = {0};
    char chunk[65536];
    for (;;) {
        ssize_t got = read(fd, chunk, sizeof(chunk));
        if (got < 0 && errno == EINTR)
            continue;
        int too_big = got > 0 && buf.len + (size_t)got > cap;
        if (got < 0 || too_big || buf_add(&buf, chunk, (size_t)got) < 0) {
            close(fd);
            free(buf.data);
            return got < 0 || too_big ? -1 : -2;
        }
        if (got == 0)
            break;
    }
    close(fd);
    *data = buf.data ? buf.data : calloc(1, 1);
    *size = buf.len;
    return *data ? 0 : -2;
}

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

typedef struct {
    char *name;
    size_t name_size;
    char *data;
    size_t size;
    size_t *starts, *ends; /* each line's bytes, without its line break */
    size_t lines;
} source_t;

/* The files read so far, found by name through `slots` (each a source's index + 1, 0 when
 * free): a job may name a different file in each of a million frames. */
static source_t *sources;
static size_t source_count, source_cap, *slots, slot_count;

static size_t hash_of(str_t name)
{
    uint64_t hash = 14695981039346656037ull; /* FNV-1a */
    for (size_t i = 0; i < name.n; i++)
        hash = (hash ^ (unsigned char)name.p[i]) * 1099511628211ull;
    return (size_t)hash;
}

/* The slot of `name`: where it is, or the free one where it goes. */
static size_t *slot_of(str_t name)
{
    size_t at = hash_of(name) & (slot_count - 1);
    while (slots[at]) {
        const source_t *source = &sources[slots[at] - 1];
        if (source->name_size == name.n && memcmp(source->name, name.p, name.n) == 0)
            break;
        at = (at + 1) & (slot_count - 1);
    }
    return &slots[at];
}

/* Room for one more source, the slots at most half full. */
static int make_room(void)
{
    if (source_count == source_cap) {
        size_t cap = source_cap ? 2 * source_cap : 16;
        source_t *more = realloc(sources, cap * sizeof(source_t));
        if (more == NULL)
            return -1;
        sources = more, source_cap = cap;
    }
    if (2 * (source_count + 1) <= slot_count)
        return 0;
    size_t *old = slots, old_count = slot_count, *fresh = calloc(old_count ? 2 * old_count : 64, sizeof(size_t));
    if (fresh == NULL)
        return -1;
    slots = fresh, slot_count = old_count ? 2 * old_count : 64;
    for (size_t i = 0; i < old_count; i++)
        if (old[i]) {
            str_t name = {sources[old[i] - 1].name, sources[old[i] - 1].name_size};
            *slot_of(name) = old[i];
        }
    free(old);
    return 0;
}

static int split_lines(source_t *source)
{
    size_t cap = 64, at = 0, start = 0;
    source->starts = malloc(cap * sizeof(size_t));
    source->ends = malloc(cap * sizeof(size_t));
    if (!source->starts || !source->ends)
        return -1;
    while (at <= source->size) {
        size_t before = at;
        unsigned code = 0;
        int end_of_text = at == source->size;
        if (!end_of_text && utf8_next(source->data, source->size, &at, &code, 0) < 0) {
            at++; /* not UTF-8: decoded as U+FFFD, never a line break */
            continue;
        }
        if (!end_of_text && !is_line_break(code))
            continue;
        if (end_of_text && before == start)
            break; /* nothing after the last line break: no further line */
        if (source->lines == cap) {
            cap *= 2;
            size_t *starts = realloc(source->starts, cap * sizeof(size_t));
            size_t *ends = starts ? realloc(source->ends, cap * sizeof(size_t)) : NULL;
            if (!starts || !ends)
                return -1;
            source->starts = starts, source->ends = ends;
        }
        source->starts[source->lines] = start;
        source->ends[source->lines++] = before;
        if (end_of_text)
            break;
        if (code == '\r' && at < source->size && source->data[at] == '\n')
            at++;
        start = at;
    }
    return 0;
}

static source_t *load(int pid, str_t file)
{
    if (make_room() < 0)
        return NULL;
    size_t *slot = slot_of(file);
    if (*slot)
        return &sources[*slot - 1];
    source_t *source = &sources[source_count];
    memset(source, 0, sizeof(*source));
    if ((source->name = malloc(file.n + 1)) == NULL)
        return NULL;
    memcpy(source->name, file.p, file.n);
    source->name[file.n] = '\0';
    source->name_size = file.n;
    char *root = malloc(file.n + 64);
    if (root == NULL)
        return NULL;
    snprintf(root, file.n + 64, "/proc/%d/root%s", pid, source->name);
    const char *paths[] = {source->name, pid > 0 ? root : NULL};
    for (int i = 0; i < 2 && paths[i]; i++) {
        int read = read_whole(paths[i], &source->data, &source->size, MAX_SOURCE_BYTES);
        if (read == -2) { /* too big, or no memory: the Python CLI reads it */
            free(root);
            return NULL;
        }
        if (read == 0)
            break;
    }
    free(root);
    if (source->data != NULL && split_lines(source) < 0)
        return NULL;
    *slot = ++source_count;
    return source;
}

int source_line(int pid, str_t file, long long lineno, str_t *line)
{
    line->p = "";
    line->n = 0;
    if (lineno == 0 || (file.n && file.p[0] == '<'))
        return 0;
    if (memchr(file.p, '\0', file.n) != NULL)
        return -1; /* Python's open() raises ValueError: let it */
    source_t *source = load(pid, file);
    if (source == NULL)
        return -1;
    if (lineno < 0 || (unsigned long long)lineno > source->lines)
        return 0;
    size_t start = source->starts[lineno - 1], end = source->ends[lineno - 1];
    /* Bytes that are not UTF-8 are decoded to U+FFFD by Python: the Python CLI shows them. */
    if (!utf8_valid(source->data + start, end - start))
        return -1;
    str_t whole = {source->data + start, end - start};
    *line = strip_spaces(whole);
    return 0;
}
