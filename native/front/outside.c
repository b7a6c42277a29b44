/* The stacks of a job stuck on its GIL, from the py-spy dump the front end started: what
 * engine/backtrace.py `from_outside` makes of it (outside/pyspy.py rows_from_dump and
 * gil_holder, the process's Python version and argv from /proc) and the note the Python CLI
 * prints. A dump of another shape than py-spy's usual one is the Python CLI's to read. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "front.h"
#include "front_tables.h"

static int is_text(const jval *value)
{
    return value && value->type == J_STR;
}

static int starts_probing(const char *p, size_t n)
{
    return n >= 8 && memcmp(p, "probing-", 8) == 0;
}

/* pyspy._is_dummy: "Dummy-N", threading's name for a thread it did not start. */
static int is_dummy(str_t name)
{
    if (name.n <= 6 || memcmp(name.p, "Dummy-", 6) != 0)
        return 0;
    for (size_t at = 6; at < name.n; at++)
        if (name.p[at] < '0' || name.p[at] > '9')
            return 0;
    return 1;
}

static int ends_with(const jval *text, const char *suffix)
{
    size_t length = strlen(suffix);
    return is_text(text) && text->str.n >= length && memcmp(text->str.p + text->str.n - length, suffix, length) == 0;
}

/* pyspy.is_agent_thread, without --native: its outermost frame is the attach helper's script or
 * agent/threads.py, or its threading name (but Dummy-N), else its OS name, is probing-*. */
int agent_thread(const jval *thread)
{
    const jval *frames = json_get(thread, "frames");
    if (frames && frames->type == J_ARR && frames->count > 0) {
        const jval *file = json_get(&frames->items[frames->count - 1], "filename");
        if (ends_with(file, HELPER_SCRIPT) || ends_with(file, AGENT_THREAD_SCRIPT))
            return 1;
    }
    const jval *name = json_get(thread, "thread_name"), *tid = json_get(thread, "os_thread_id");
    if (is_text(name) && name->str.n > 0 && !is_dummy(name->str))
        return starts_probing(name->str.p, name->str.n);
    char path[64], comm[64];
    snprintf(path, sizeof(path), "/proc/%lld/comm", tid->num);
    FILE *file = tid->num > 0 ? fopen(path, "re") : NULL;
    if (file == NULL)
        return 0;
    size_t size = fread(comm, 1, sizeof(comm), file);
    fclose(file);
    size_t start = 0;
    while (start < size && (comm[start] == ' ' || (comm[start] >= '\t' && comm[start] <= '\r') ||
                            (comm[start] >= 0x1c && comm[start] <= 0x1f)))
        start++;
    return starts_probing(comm + start, size - start);
}

/* The thread dictionaries py-spy writes, checked: -1 for any other shape. */
static int check_thread(const jval *thread)
{
    const jval *tid = json_get(thread, "os_thread_id"), *ident = json_get(thread, "thread_id");
    const jval *name = json_get(thread, "thread_name"), *gil = json_get(thread, "owns_gil");
    const jval *frames = json_get(thread, "frames");
    if (thread->type != J_OBJ || !tid || tid->type != J_INT || !ident || ident->type != J_INT ||
        (name && name->type != J_NULL && name->type != J_STR) || (gil && gil->type != J_BOOL) ||
        !frames || frames->type != J_ARR)
        return -1;
    for (size_t i = 0; i < frames->count; i++) {
        const jval *frame = &frames->items[i], *module = json_get(frame, "module");
        const jval *line = json_get(frame, "line"), *short_name = json_get(frame, "short_filename");
        if (frame->type != J_OBJ || !is_text(json_get(frame, "name")) || !is_text(json_get(frame, "filename")) ||
            (module && module->type != J_NULL) || !line || line->type != J_INT ||
            (short_name && short_name->type != J_NULL && short_name->type != J_STR))
            return -1;
    }
    return 0;
}

/* pyspy.gil_holder: "thread 'NAME' holds the GIL in FUNC (FILE:LINE)"; 0 when no thread does. */
static int gil_holder(const jval *threads, buf_t *why)
{
    for (size_t i = 0; i < threads->count; i++) {
        const jval *thread = &threads->items[i], *gil = json_get(thread, "owns_gil");
        const jval *name = json_get(thread, "thread_name"), *frames = json_get(thread, "frames");
        if (!gil || !gil->num || agent_thread(thread))
            continue;
        if (buf_str(why, "thread '") < 0 ||
            (is_text(name) && name->str.n ? buf_add(why, name->str.p, name->str.n)
                                          : buf_int(why, json_get(thread, "os_thread_id")->num)) < 0 ||
            buf_str(why, "' holds the GIL") < 0)
            return -1;
        if (frames->count) {
            const jval *frame = &frames->items[0], *short_name = json_get(frame, "short_filename");
            str_t func = json_get(frame, "name")->str;
            str_t file = is_text(short_name) && short_name->str.n ? short_name->str : json_get(frame, "filename")->str;
            if (buf_str(why, " in ") < 0 || buf_add(why, func.p, func.n) < 0 || buf_str(why, " (") < 0 ||
                buf_add(why, file.p, file.n) < 0 || buf_str(why, ":") < 0 ||
                buf_int(why, json_get(frame, "line")->num) < 0 || buf_str(why, ")") < 0)
                return -1;
        }
        return 1;
    }
    return 0;
}

/* os.fsdecode: bytes that are not UTF-8 become U+DC80..U+DCFF (surrogateescape), kept in
 * their three-byte form for inert() to show as \udcXX. */
static int fsdecode(buf_t *out, const char *p, size_t n)
{
    for (size_t at = 0; at < n;) {
        size_t start = at;
        unsigned code;
        if (utf8_next(p, n, &at, &code, 0) == 0) {
            if (buf_add(out, p + start, at - start) < 0)
                return -1;
            continue;
        }
        unsigned char byte = (unsigned char)p[at++];
        unsigned escaped = 0xDC00 + byte;
        char bytes[3] = {(char)(0xE0 | (escaped >> 12)), (char)(0x80 | ((escaped >> 6) & 0x3F)),
                         (char)(0x80 | (escaped & 0x3F))};
        if (buf_add(out, bytes, 3) < 0)
            return -1;
    }
    return 0;
}

/* What the agent's hello would say, from /proc: pid, python_version (procfs.python_version:
 * from the executable's name only; a name that does not say is the Python CLI's), argv. */
static int process_info(int pid, jval *hello)
{
    char path[64], exe[4096];
    snprintf(path, sizeof(path), "/proc/%d/exe", pid);
    ssize_t size = readlink(path, exe, sizeof(exe) - 1);
    if (size <= 0)
        return -1;
    exe[size] = '\0';
    char *deleted = strstr(exe, " (deleted)");
    if (deleted && strlen(deleted) == strlen(" (deleted)"))
        *deleted = '\0';
    const char *name = strrchr(exe, '/') ? strrchr(exe, '/') + 1 : exe;
    if (strncmp(name, "python", 6) != 0 || strstr(exe, " (deleted)"))
        return -1;
    size_t end = strlen(name);
    while (end > 6 && name[end - 1] >= 'a' && name[end - 1] <= 'z')
        end--;
    const char *rest = name + 6, *dot = memchr(rest, '.', end - 6);
    size_t major = dot ? (size_t)(dot - rest) : 0, minor = dot ? end - 6 - major - 1 : 0;
    if (!dot || !major || !minor || strspn(rest, "0123456789") != major ||
        strspn(dot + 1, "0123456789") != minor)
        return -1;
    char *cmdline;
    size_t length;
    snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
    if (read_whole(path, &cmdline, &length, 1 << 20) < 0)
        return -1;
    jval *items = calloc(4 + length, sizeof(jval)), *argv = &items[2];
    str_t *keys = calloc(3, sizeof(str_t));
    if (items == NULL || keys == NULL)
        return -1;
    argv->type = J_ARR;
    argv->items = &items[3];
    int seen = 0; /* procfs.command_line drops empty parts; then argv[0] is left out */
    for (size_t at = 0; at < length; at += strlen(cmdline + at) + 1) {
        size_t part = strlen(cmdline + at);
        if (part == 0 || seen++ == 0)
            continue;
        buf_t decoded = {0};
        if (fsdecode(&decoded, cmdline + at, part) < 0)
            return -1;
        jval *arg = &argv->items[argv->count++];
        arg->type = J_STR;
        arg->str.p = decoded.data ? decoded.data : "";
        arg->str.n = decoded.len;
    }
    keys[0].p = "pid", keys[0].n = 3;
    keys[1].p = "python_version", keys[1].n = 14;
    keys[2].p = "argv", keys[2].n = 4;
    items[0].type = J_INT, items[0].num = pid;
    items[1].type = J_STR, items[1].str.p = strndup(rest, end - 6), items[1].str.n = end - 6;
    hello->type = J_OBJ;
    hello->count = 3;
    hello->items = items;
    hello->keys = keys;
    return 0;
}

/* qsort has no argument for it: the target's PID while its threads are sorted. */
static long long sort_pid;

static int thread_order(const void *left, const void *right)
{
    long long pid = sort_pid;
    const jval *a = *(const jval *const *)left, *b = *(const jval *const *)right;
    long long ta = json_get(a, "os_thread_id")->num, tb = json_get(b, "os_thread_id")->num;
    if ((ta != pid) != (tb != pid))
        return ta != pid ? 1 : -1;
    if (ta != tb)
        return ta < tb ? -1 : 1;
    return a < b ? -1 : a > b; /* stable, as Python's sort */
}

static int by_number(const void *left, const void *right)
{
    long long a = *(const long long *)left, b = *(const long long *)right;
    return a < b ? -1 : a > b;
}

static str_t function_name(str_t name)
{
    /* pyspy._function_name: py-spy's qualified Thread.run is co_name run, as the agent has it */
    if (memchr(name.p, '(', name.n) != NULL)
        return name;
    for (size_t i = name.n; i-- > 0;)
        if (name.p[i] == '.') {
            str_t last = {name.p + i + 1, name.n - i - 1};
            return last;
        }
    return name;
}

/* pyspy.threads_among: a thread whose OS id is not among `among` is left out (one without an
 * id stays). */
static void keep_among(jval *threads, const tids_t *among)
{
    size_t kept = 0;
    for (size_t i = 0; i < threads->count; i++) {
        long long tid = json_get(&threads->items[i], "os_thread_id")->num;
        int found = tid == 0;
        for (size_t j = 0; j < among->count && !found; j++)
            found = among->ids[j] == tid;
        if (found)
            threads->items[kept++] = threads->items[i];
    }
    threads->count = kept;
}

int outside_answer(int pid, const char *dump, size_t size, const tids_t *among, const char *why_more,
                   answer_t *answer, buf_t *note)
{
    jval threads;
    buf_t why = {0};
    if (json_parse(dump, size, &threads) < 0 || threads.type != J_ARR)
        return -1;
    for (size_t i = 0; i < threads.count; i++)
        if (check_thread(&threads.items[i]) < 0)
            return -1;
    if (among != NULL)
        keep_among(&threads, among);
    checked_gil(pid, &threads);
    /* No thread holds the GIL: the Python CLI waits on for the agent, as it would. */
    if (gil_holder(&threads, &why) != 1 || process_info(pid, &answer->hello) < 0)
        return -1;
    const jval **order = calloc(threads.count + 1, sizeof(jval *));
    long long *idents = calloc(threads.count + 1, sizeof(long long));
    size_t count = 0, rows = 0;
    if (order == NULL || idents == NULL)
        return -1;
    for (size_t i = 0; i < threads.count; i++) {
        if (agent_thread(&threads.items[i]))
            continue;
        idents[count] = json_get(&threads.items[i], "thread_id")->num;
        order[count++] = &threads.items[i];
        rows += json_get(&threads.items[i], "frames")->count;
    }
    sort_pid = pid;
    qsort(order, count, sizeof(jval *), thread_order);
    qsort(idents, count, sizeof(long long), by_number);
    /* One thread per id, as the renderer groups by them: equal ids lie side by side once
     * sorted. Not a comparison of every pair: a job may have a hundred thousand threads, and
     * that took minutes. */
    for (size_t i = 1; i < count; i++)
        if (idents[i] == idents[i - 1] ||
            json_get(order[i], "os_thread_id")->num == json_get(order[i - 1], "os_thread_id")->num)
            return -1;
    free(idents);
    answer->rows = calloc(rows + 1, sizeof(row_t));
    if (answer->rows == NULL)
        return -1;
    for (size_t i = 0; i < count; i++) {
        const jval *thread = order[i], *name = json_get(thread, "thread_name"), *gil = json_get(thread, "owns_gil");
        const jval *frames = json_get(thread, "frames");
        long long tid = json_get(thread, "os_thread_id")->num;
        buf_t shown = {0};
        if (is_text(name) && name->str.n)
            buf_add(&shown, name->str.p, name->str.n);
        else if (tid == pid)
            buf_str(&shown, "MainThread");
        else if (buf_str(&shown, "Thread-") < 0 || buf_int(&shown, tid) < 0)
            return -1;
        for (size_t depth = 0; depth < frames->count; depth++) {
            const jval *frame = &frames->items[depth];
            row_t *row = &answer->rows[answer->count++];
            row->pid = pid;
            row->thread_id = json_get(thread, "thread_id")->num;
            row->native_id = tid, row->has_native_id = 1;
            row->thread_name.p = shown.data ? shown.data : "", row->thread_name.n = shown.len;
            row->is_main = tid == pid;
            row->holds_gil = gil && gil->num;
            row->depth = (long long)depth;
            row->func = function_name(json_get(frame, "name")->str);
            row->file = json_get(frame, "filename")->str;
            row->lineno = json_get(frame, "line")->num;
            row->has_lineno = row->lineno != 0; /* `line or None` */
            row->frame_type.p = "Python", row->frame_type.n = 6;
        }
    }
    free(order);
    str_t whole = {why.data, why.len};
    buf_t message = {0};
    if (buf_str(&message, "PID ") < 0 || buf_int(&message, pid) < 0 || buf_str(&message, ": ") < 0 ||
        buf_add(&message, whole.p, whole.n) < 0 || (why_more && buf_str(&message, why_more) < 0) ||
        buf_str(&message, "; answered from outside the process (py-spy)") < 0)
        return -1;
    str_t text = {message.data, message.len};
    if (buf_str(note, "probing: ") < 0 || inert(note, text) < 0 || buf_str(note, "\n") < 0)
        return -1;
    return 0;
}
