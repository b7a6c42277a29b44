/* cli/render/backtrace.py write_backtrace_text, for one process whose agent answered:
 * the header line, then each thread (in the order of its first row, frames by depth) headed by
 * its state, its frames outermost first, each Python frame with its source line. Every
 * string the job controls goes through inert(). */
#include <stdlib.h>
#include <string.h>

#include "front.h"

static int inert_int(buf_t *out, long long value)
{
    return buf_int(out, value);
}

static int inert_text(buf_t *out, const char *text)
{
    str_t whole = {text, strlen(text)};
    return inert(out, whole);
}

static int header(int pid, const jval *hello, buf_t *out)
{
    const jval *version = json_get(hello, "python_version"), *argv = json_get(hello, "argv");
    if (buf_str(out, "Process ") < 0 || inert_int(out, pid) < 0 || buf_str(out, " (Python ") < 0)
        return -1;
    if (version && version->type == J_STR ? inert(out, version->str) : inert_text(out, "None"))
        return -1;
    if (buf_str(out, "): ") < 0)
        return -1;
    buf_t joined = {0};
    for (size_t i = 0; argv && argv->type == J_ARR && i < argv->count; i++)
        if ((i && buf_str(&joined, " ") < 0) || buf_add(&joined, argv->items[i].str.p, argv->items[i].str.n) < 0)
            return -1;
    str_t line = {joined.data ? joined.data : "", joined.len};
    int failed = inert(out, line) < 0 || buf_str(out, "\n") < 0;
    free(joined.data);
    return failed ? -1 : 0;
}

/* Each thread's rows together, by depth, equal depths in the order sent (Python's sort is
 * stable): a thread's frames are then one run of the sorted rows. */
static int by_thread(const void *left, const void *right)
{
    const row_t *a = *(const row_t *const *)left, *b = *(const row_t *const *)right;
    if (a->pid != b->pid)
        return a->pid < b->pid ? -1 : 1;
    if (a->thread_id != b->thread_id)
        return a->thread_id < b->thread_id ? -1 : 1;
    if (a->depth != b->depth)
        return a->depth < b->depth ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* One thread: its run in the sorted rows, and where its first row was sent. */
typedef struct {
    size_t start, count;
    const row_t *first;
} thread_t;

/* Threads in the order of their first row, as a Python dict keeps its keys. */
static int by_first_row(const void *left, const void *right)
{
    const thread_t *a = left, *b = right;
    return a->first < b->first ? -1 : a->first > b->first;
}

static int frame_line(int pid, const row_t *frame, buf_t *out)
{
    if (frame->frame_type.n == 6 && memcmp(frame->frame_type.p, "Native", 6) == 0) {
        str_t base = frame->file;
        const char *slash = NULL;
        for (size_t i = 0; i < base.n; i++)
            if (base.p[i] == '/')
                slash = base.p + i;
        if (slash) {
            base.n -= (size_t)(slash + 1 - base.p);
            base.p = slash + 1;
        }
        if (buf_str(out, "  [native] ") < 0 || inert(out, frame->func) < 0 || buf_str(out, " in ") < 0 ||
            inert(out, base) < 0)
            return -1;
        return buf_str(out, "\n");
    }
    str_t code;
    if (buf_str(out, "  File \"") < 0 || inert(out, frame->file) < 0 || buf_str(out, "\", line ") < 0 ||
        (frame->has_lineno ? inert_int(out, frame->lineno) : buf_str(out, "?")) < 0 ||
        buf_str(out, ", in ") < 0 || inert(out, frame->func) < 0 || buf_str(out, "\n") < 0)
        return -1;
    if (source_line(pid, frame->file, frame->has_lineno ? frame->lineno : 0, &code) < 0)
        return -1;
    if (code.n == 0)
        return 0;
    if (buf_str(out, "    ") < 0 || inert(out, code) < 0)
        return -1;
    return buf_str(out, "\n");
}

int render_backtrace(int pid, const answer_t *answer, buf_t *out)
{
    const jval *hello_pid = json_get(&answer->hello, "pid");
    /* A process known by another PID in its own namespace: the Python CLI says so. */
    if (hello_pid == NULL || hello_pid->type != J_INT || hello_pid->num != pid)
        return -1;
    if (header(pid, &answer->hello, out) < 0)
        return -1;
    /* Sorted, not scanned once per thread: a job (or a hostile agent) may send a million. */
    size_t count = answer->count, threads = 0;
    const row_t **frames = malloc((count + 1) * sizeof(row_t *));
    thread_t *thread = malloc((count + 1) * sizeof(thread_t));
    buf_t state = {0};
    if (frames == NULL || thread == NULL)
        return -1;
    for (size_t i = 0; i < count; i++)
        frames[i] = &answer->rows[i];
    qsort(frames, count, sizeof(row_t *), by_thread);
    for (size_t i = 0; i < count; i++) {
        if (i == 0 || frames[i]->pid != frames[i - 1]->pid || frames[i]->thread_id != frames[i - 1]->thread_id)
            thread[threads++] = (thread_t){i, 0, frames[i]};
        thread_t *current = &thread[threads - 1];
        current->count++;
        if (frames[i] < current->first)
            current->first = frames[i];
    }
    qsort(thread, threads, sizeof(thread_t), by_first_row);
    for (size_t t = 0; t < threads; t++) {
        const row_t *const *own = frames + thread[t].start;
        size_t n = thread[t].count;
        const row_t *innermost = own[0];
        if (thread_state(own, n, pid, &state) < 0)
            return -1;
        str_t state_text = {state.data, state.len};
        if (buf_str(out, "\nThread ") < 0 ||
            inert_int(out, innermost->has_native_id ? innermost->native_id : innermost->thread_id) < 0 ||
            buf_str(out, " \"") < 0 || inert(out, innermost->thread_name) < 0 || buf_str(out, "\"") < 0 ||
            buf_str(out, innermost->is_main ? ", main thread: " : ": ") < 0 || inert(out, state_text) < 0 ||
            buf_str(out, " (most recent call last):\n") < 0)
            return -1;
        for (size_t i = n; i-- > 0;)
            if (frame_line(pid, own[i], out) < 0)
                return -1;
    }
    free(frames);
    free(thread);
    free(state.data);
    return threads ? 0 : buf_str(out, "\n(no Python threads)\n");
}
