/* cli/render/backtrace.py write_backtrace_text, for one process whose agent answered:
 * the header line, then each thread (in the order of its first row, frames by depth) headed by
 * its state, its frames outermost first, each Python frame with its source line. The layout is
 * that module's templates (front_tables.h, generated from it); fill() writes every field
 * through inert(), as the Python CLI does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "front.h"
#include "front_tables.h"

static str_t text_of(const char *text)
{
    return (str_t){text, strlen(text)};
}

/* `template` with each field's value (fields[FIELD_...]) made inert. */
static int fill(buf_t *out, const piece_t *template, const str_t *fields)
{
    for (; template->text; template++)
        if (buf_str(out, template->text) < 0 ||
            (template->field >= 0 && inert(out, fields[template->field]) < 0))
            return -1;
    return 0;
}

static int header(int pid, const jval *hello, buf_t *out)
{
    const jval *version = json_get(hello, "python_version"), *argv = json_get(hello, "argv");
    char pid_text[24];
    snprintf(pid_text, sizeof(pid_text), "%d", pid);
    buf_t joined = {0};
    for (size_t i = 0; argv && argv->type == J_ARR && i < argv->count; i++)
        if ((i && buf_str(&joined, " ") < 0) || buf_add(&joined, argv->items[i].str.p, argv->items[i].str.n) < 0)
            return -1;
    str_t fields[FIELD_COUNT] = {{0}};
    fields[FIELD_PID] = text_of(pid_text);
    fields[FIELD_PYTHON] = version && version->type == J_STR ? version->str : text_of("None");
    fields[FIELD_ARGV] = (str_t){joined.data ? joined.data : "", joined.len};
    int failed = fill(out, PROCESS_LINE, fields);
    free(joined.data);
    return failed;
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
    str_t fields[FIELD_COUNT] = {{0}};
    fields[FIELD_FUNC] = frame->func;
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
        fields[FIELD_FILE] = base;
        return fill(out, NATIVE_FRAME, fields);
    }
    char lineno[24];
    snprintf(lineno, sizeof(lineno), "%lld", frame->lineno);
    fields[FIELD_FILE] = frame->file;
    fields[FIELD_LINENO] = text_of(frame->has_lineno ? lineno : UNKNOWN_LINENO);
    if (fill(out, PYTHON_FRAME, fields) < 0 ||
        source_line(pid, frame->file, frame->has_lineno ? frame->lineno : 0, &fields[FIELD_CODE]) < 0)
        return -1;
    return fields[FIELD_CODE].n ? fill(out, CODE_LINE, fields) : 0;
}

/* A thread's heading: its number, name, whether it is the main thread, and its state. */
static int thread_line(const row_t *innermost, str_t state, buf_t *out)
{
    char id[24];
    snprintf(id, sizeof(id), "%lld", innermost->has_native_id ? innermost->native_id : innermost->thread_id);
    str_t fields[FIELD_COUNT] = {{0}};
    buf_t number = {0};
    fields[FIELD_ID] = text_of(id);
    if (fill(&number, NUMBERED, fields) < 0)
        return -1;
    fields[FIELD_NUMBER] = (str_t){number.data, number.len};
    fields[FIELD_NAME] = innermost->thread_name;
    fields[FIELD_MAIN] = text_of(innermost->is_main ? MAIN_THREAD : "");
    fields[FIELD_STATE] = state;
    int failed = fill(out, THREAD_GAP, fields) < 0 || fill(out, THREAD_LINE, fields) < 0;
    free(number.data);
    return failed ? -1 : 0;
}

static int ends_with(str_t text, const char *tail)
{
    size_t length = strlen(tail);
    return text.n >= length && memcmp(text.p + text.n - length, tail, length) == 0;
}

static int is_text(str_t text, const char *word)
{
    return text.n == strlen(word) && memcmp(text.p, word, text.n) == 0;
}

/* analysis/asyncio_tasks.py runs_loop: whether a thread runs an asyncio event loop, whose tasks
 * only the Python CLI reads and shows. */
int runs_asyncio_loop(const answer_t *answer)
{
    for (size_t i = 0; i < answer->count; i++) {
        const row_t *row = &answer->rows[i];
        if (!ends_with(row->file, ASYNCIO_LOOP_FILE))
            continue;
        for (const char *const *name = ASYNCIO_LOOP_FUNCTIONS; *name; name++)
            if (is_text(row->func, *name))
                return 1;
    }
    return 0;
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
        if (thread_line(innermost, (str_t){state.data, state.len}, out) < 0)
            return -1;
        for (size_t i = n; i-- > 0;)
            if (frame_line(pid, own[i], out) < 0)
                return -1;
    }
    free(frames);
    free(thread);
    free(state.data);
    return threads ? 0 : fill(out, NO_THREADS, NULL);
}
