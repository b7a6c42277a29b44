/* analysis/states.py thread_state, for rows from the agent (no view from outside). The tables
 * (native names, library files and calls, wrappers) are generated from that module
 * (front_tables.h); the rules in code here are checked against it case by case by
 * tests/integration/test_front_rules.py. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "front.h"
#include "front_tables.h"

static int has(str_t text, const char *part)
{
    return memmem(text.p, text.n, part, strlen(part)) != NULL;
}

static int starts(str_t text, const char *part)
{
    size_t size = strlen(part);
    return text.n >= size && memcmp(text.p, part, size) == 0;
}

static int ends(str_t text, const char *part)
{
    size_t size = strlen(part);
    return text.n >= size && memcmp(text.p + text.n - size, part, size) == 0;
}

static int equals(str_t text, const char *word)
{
    return text.n == strlen(word) && memcmp(text.p, word, text.n) == 0;
}

static int one_of(str_t text, const char *const *words)
{
    for (; *words; words++)
        if (equals(text, *words))
            return 1;
    return 0;
}

static int is_native(const row_t *frame)
{
    return equals(frame->frame_type, "Native");
}

static const char *native_state(const row_t *const *frames, size_t count)
{
    static const char *const gil[] = {"take_gil", "PyEval_RestoreThread", "PyEval_AcquireThread", NULL};
    size_t native = 0;
    while (native < count && is_native(frames[native]))
        native++;
    for (size_t i = 0; i < native && i < 8; i++)
        if (one_of(frames[i]->func, gil))
            return "waiting for the GIL";
    for (size_t i = 0; i < native; i++) {
        str_t name = frames[i]->func;
        if (name.n == 0 || starts(name, "0x"))
            continue;
        for (size_t group = 0; NATIVE_NAMES[group]; group++)
            if (one_of(name, NATIVE_NAMES[group]))
                return NATIVE_MEANINGS[group];
        break;
    }
    return "in native code";
}

static int in_library(str_t path)
{
    for (const char *const *part = TORCH_LIBRARY; *part; part++)
        if (has(path, *part))
            return 1;
    if (!has(path, "/lib/python"))
        return 0;
    for (const char *const *part = STANDARD_LIBRARY; *part; part++)
        if (has(path, *part))
            return 1;
    return 0;
}

/* The state named after the outermost library call of the innermost chain; 0 when none. */
static int library_state(const row_t *const *python, size_t count, buf_t *state)
{
    int found = 0, previous_wait_in_threading = 0;
    for (size_t i = 0; i < count && i < 16; i++) {
        char *copy = malloc(python[i]->file.n + 1);
        if (copy == NULL)
            return -1;
        memcpy(copy, python[i]->file.p, python[i]->file.n);
        for (size_t at = 0; at < python[i]->file.n; at++)
            copy[at] = copy[at] == '\\' ? '/' : copy[at];
        str_t path = {copy, python[i]->file.n}, func = python[i]->func;
        if (!in_library(path)) {
            free(copy);
            break;
        }
        if (ends(path, "torch/distributed/distributed_c10d.py") && !one_of(func, WRAPPERS)) {
            state->len = 0;
            if (buf_str(state, "in torch.distributed.") < 0 || buf_add(state, func.p, func.n) < 0)
                return -1;
            found = 1;
        }
        for (const struct library_call *call = LIBRARY_CALLS; call->part; call++) {
            if (has(path, call->part) && (call->funcs[0] == NULL || one_of(func, call->funcs))) {
                state->len = 0;
                if (buf_str(state, call->meaning) < 0)
                    return -1;
                found = 1;
                break;
            }
        }
        int threading = ends(path, "/threading.py");
        if (previous_wait_in_threading && threading && equals(func, "wait")) {
            state->len = 0;
            if (buf_str(state, "waiting on an Event") < 0)
                return -1;
            found = 1;
        }
        previous_wait_in_threading = threading && equals(func, "wait");
        free(copy);
    }
    return found;
}

static int with_state(str_t line, buf_t *state)
{
    str_t header = {line.p + 5, line.n - 6};
    const char *as = memmem(header.p, header.n, " as ", 4);
    if (as != NULL)
        header.n = (size_t)(as - header.p);
    header = strip_spaces(header);
    const char *head = has(header, "open(") ? "opening a file (`"
                       : !has(header, "(")  ? "blocked entering `"
                                            : "in a call in `";
    if (buf_str(state, head) < 0 || buf_add(state, line.p, line.n) < 0)
        return -1;
    return buf_str(state, has(header, "open(") ? "`)" : "`");
}

static int line_state(str_t line, buf_t *state)
{
    static const char *const sockets[] = {".recv(", ".recv_into(", ".accept(", ".select(", ".poll(",
                                          "select.select(", NULL};
    static const char *const stdin_reads[] = {"in sys.stdin", "input(", "sys.stdin.read", NULL};
    static const char *const reads[] = {".read(", ".readline(", ".readinto(", NULL};
    const char *meaning = NULL;
    if (has(line, ".acquire("))
        meaning = "waiting in Lock.acquire";
    else if (starts(line, "with ") && ends(line, ":"))
        return with_state(line, state);
    else if (has(line, "sleep("))
        meaning = "sleeping";
    for (const char *const *call = sockets; !meaning && *call; call++)
        if (has(line, *call))
            meaning = "waiting on socket I/O";
    for (const char *const *call = stdin_reads; !meaning && *call; call++)
        if (has(line, *call))
            meaning = "reading standard input";
    for (const char *const *call = reads; !meaning && *call; call++)
        if (has(line, *call))
            meaning = "reading a file or pipe";
    if (!meaning && (has(line, " open(") || starts(line, "open(")))
        meaning = "opening a file";
    return meaning ? buf_str(state, meaning) : 0;
}

/* The state, or nothing (state->len 0) when none of the rules names one. */
static int named_state(const row_t *const *frames, size_t count, int pid, buf_t *state)
{
    state->len = 0;
    if (count && is_native(frames[0]))
        return buf_str(state, native_state(frames, count));
    const row_t **python = malloc((count + 1) * sizeof(row_t *));
    size_t n = 0;
    if (python == NULL)
        return -1;
    for (size_t i = 0; i < count; i++)
        if (!is_native(frames[i]))
            python[n++] = frames[i];
    int found = library_state(python, n, state);
    if (found == 0 && n) {
        str_t line;
        if (equals(python[0]->func, "acquire")) {
            found = buf_str(state, "waiting in Lock.acquire") < 0 ? -1 : 1;
        } else if (source_line(pid, python[0]->file, python[0]->has_lineno ? python[0]->lineno : 0,
                               &line) < 0) {
            found = -1;
        } else {
            line = strip_spaces(line);
            found = line_state(line, state) < 0 ? -1 : 1;
        }
    }
    free(python);
    return found < 0 ? -1 : 0;
}

/* thread_state(frames, code_line, outside): `holds_gil` of the innermost frame is py-spy's
 * view of the thread, when the stacks came from it. */
int thread_state(const row_t *const *frames, size_t count, int pid, buf_t *state)
{
    buf_t named = {0};
    if (named_state(frames, count, pid, &named) < 0)
        return -1;
    state->len = 0;
    int failed;
    if (count && frames[0]->holds_gil)
        failed = buf_str(state, "holds the GIL, ") < 0 ||
                 (named.len ? buf_add(state, named.data, named.len) : buf_str(state, "in native code")) < 0;
    else
        failed = (named.len ? buf_add(state, named.data, named.len) : buf_str(state, "running Python")) < 0;
    free(named.data);
    return failed ? -1 : 0;
}
