/* Whole files read within bounds, and lines of the job's source files read as engine/sources.py SourceLines
 * reads them: the file's own path, else the same path under /proc/PID/root (a job in a
 * container); the whole file decoded, split as str.splitlines() does, the line stripped. Run
 * as root for a job of another user, only files that user could read (sources.py readable_as). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "front.h"
#include "front_tables.h"

/* read_whole, of the file `expect` describes (device and inode) when it is not NULL. */
static int read_whole_of(const char *path, char **data, size_t *size, size_t cap, const struct stat *expect)
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
    if (fstat(where, &info) < 0 || !S_ISREG(info.st_mode) || (size_t)info.st_size > cap ||
        (expect && (info.st_dev != expect->st_dev || info.st_ino != expect->st_ino))) {
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

int read_whole(const char *path, char **data, size_t *size, size_t cap)
{
    return read_whole_of(path, data, size, cap, NULL);
}

/* Whose permissions the job's files are read with (sources.py Reader, reader_for_process):
 * `check` 0 when the kernel's own check is enough (we are not root, or the job is root's);
 * else the job's filesystem uid and groups, or nobody's (uid -1) when they cannot be read. */
static struct {
    int pid, check;
    long long uid;
    size_t count;
    long long gids[1024];
} reader = {.pid = -1};

static long long status_field(const char *line, int index)
{
    const char *at = line;
    for (int i = 0; i <= index; i++) {
        while (*at && *at != ' ' && *at != '\t')
            at++;
        while (*at == ' ' || *at == '\t')
            at++;
    }
    char *end;
    long long value = strtoll(at, &end, 10);
    return end == at ? -1 : value;
}

static void read_as_user_of(int pid)
{
    if (reader.pid == pid)
        return;
    reader.pid = pid, reader.check = geteuid() == 0, reader.uid = -1, reader.count = 0;
    char path[64], *data;
    size_t size;
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    if (!reader.check || pid <= 0 || read_whole(path, &data, &size, 1 << 20) < 0)
        return;
    long long uid = -1, gid = -1;
    for (char *line = data; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, "Uid:", 4) == 0)
            uid = status_field(line, 3);
        else if (strncmp(line, "Gid:", 4) == 0)
            gid = status_field(line, 3);
        else if (strncmp(line, "Groups:", 7) == 0) {
            char *at = line + 7, *end;
            for (;;) {
                long long group = strtoll(at, &end, 10);
                if (end == at || reader.count + 1 >= sizeof(reader.gids) / sizeof(reader.gids[0]))
                    break;
                reader.gids[reader.count++] = group, at = end;
            }
        }
    }
    free(data);
    if (uid < 0 || gid < 0) {
        reader.count = 0; /* nobody's */
        return;
    }
    if (uid == 0) {
        reader.check = 0;
        return;
    }
    reader.uid = uid;
    reader.gids[reader.count++] = gid;
}

static int permits(const struct stat *info, int bit)
{
    if ((long long)info->st_uid == reader.uid)
        return (info->st_mode >> 6) & bit;
    for (size_t i = 0; i < reader.count; i++)
        if ((long long)info->st_gid == reader.gids[i])
            return (info->st_mode >> 3) & bit;
    return info->st_mode & bit;
}

/* sources.py readable_as: the path under `root`, symlinks resolved, at which the reader could
 * open `filename` for reading, in `resolved`, and what that file is in `found`; -1 when it
 * could not (a directory it may not search, a file it may not read, not a regular file, a
 * relative name, more than 40 symlinks, anything missing or too long). */
static int readable_as(const char *filename, const char *root, char *resolved, size_t cap, struct stat *found)
{
    char pending[8192], rest[8192], name[4096], target[4096];
    size_t root_length = strlen(root), at = 0;
    int links = 0;
    if (filename[0] != '/' || snprintf(pending, sizeof(pending), "%s", filename) >= (int)sizeof(pending) ||
        snprintf(resolved, cap, "%s", root) >= (int)cap)
        return -1;
    for (;;) {
        while (pending[at] == '/')
            at++;
        if (pending[at] == '\0')
            break;
        size_t end = at;
        while (pending[end] && pending[end] != '/')
            end++;
        if (end - at >= sizeof(name))
            return -1;
        memcpy(name, pending + at, end - at);
        name[end - at] = '\0';
        at = end;
        if (strcmp(name, ".") == 0)
            continue;
        if (strcmp(name, "..") == 0) {
            char *slash = strrchr(resolved + root_length, '/');
            if (slash)
                *slash = '\0';
            continue;
        }
        if (stat(resolved[0] ? resolved : "/", found) < 0 || !permits(found, 1))
            return -1;
        size_t length = strlen(resolved);
        if (snprintf(resolved + length, cap - length, "/%s", name) >= (int)(cap - length) ||
            lstat(resolved, found) < 0)
            return -1;
        if (S_ISLNK(found->st_mode)) {
            ssize_t got = readlink(resolved, target, sizeof(target) - 1);
            if (++links > 40 || got < 0)
                return -1;
            target[got] = '\0';
            resolved[target[0] == '/' ? root_length : length] = '\0';
            snprintf(rest, sizeof(rest), "%s", pending + at);
            if (snprintf(pending, sizeof(pending), "%s/%s", target, rest) >= (int)sizeof(pending))
                return -1;
            at = 0;
        }
    }
    if (resolved[0] == '\0')
        snprintf(resolved, cap, "/");
    if (lstat(resolved, found) < 0 || !S_ISREG(found->st_mode) || !permits(found, 4))
        return -1;
    return 0;
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
    read_as_user_of(pid);
    for (int i = 0; i < 2 && paths[i]; i++) {
        char resolved[8192];
        struct stat found;
        const char *path = paths[i];
        if (reader.check) {
            char prefix[64] = "";
            if (i)
                snprintf(prefix, sizeof(prefix), "/proc/%d/root", pid);
            if (readable_as(source->name, prefix, resolved, sizeof(resolved), &found) < 0)
                continue;
            path = resolved;
        }
        int read = read_whole_of(path, &source->data, &source->size, MAX_SOURCE_BYTES, reader.check ? &found : NULL);
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
