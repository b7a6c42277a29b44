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

static int by_depth(const void *left, const void *right)
{
    const row_t *a = *(const row_t *const *)left, *b = *(const row_t *const *)right;
    if (a->depth != b->depth)
        return a->depth < b->depth ? -1 : 1;
    return a < b ? -1 : a > b; /* stable, as Python's sort */
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
    size_t count = answer->count, threads = 0;
    const row_t **frames = malloc((count + 1) * sizeof(row_t *));
    char *done = calloc(count + 1, 1);
    buf_t state = {0};
    if (frames == NULL || done == NULL)
        return -1;
    for (size_t first = 0; first < count; first++) {
        if (done[first])
            continue;
        const row_t *lead = &answer->rows[first];
        size_t n = 0;
        for (size_t i = first; i < count; i++) {
            if (!done[i] && answer->rows[i].pid == lead->pid && answer->rows[i].thread_id == lead->thread_id) {
                done[i] = 1;
                frames[n++] = &answer->rows[i];
            }
        }
        threads++;
        qsort(frames, n, sizeof(row_t *), by_depth);
        const row_t *innermost = frames[0];
        if (thread_state(frames, n, pid, &state) < 0)
            return -1;
        str_t state_text = {state.data, state.len};
        if (buf_str(out, "\nThread ") < 0 ||
            inert_int(out, innermost->has_native_id ? innermost->native_id : innermost->thread_id) < 0 ||
            buf_str(out, " \"") < 0 || inert(out, innermost->thread_name) < 0 || buf_str(out, "\"") < 0 ||
            buf_str(out, innermost->is_main ? ", main thread: " : ": ") < 0 || inert(out, state_text) < 0 ||
            buf_str(out, " (most recent call last):\n") < 0)
            return -1;
        for (size_t i = n; i-- > 0;)
            if (frame_line(pid, frames[i], out) < 0)
                return -1;
    }
    free(frames);
    free(done);
    free(state.data);
    return threads ? 0 : buf_str(out, "\n(no Python threads)\n");
}
