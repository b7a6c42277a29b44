/* analysis/states.py thread_state. Every rule is that module's data (front_tables.h, generated
 * from it: native names, library files and calls, the collective's file, the line rules and
 * `with` headers, the default states); this file only walks the tables as the Python functions
 * do, which tests/integration/test_front_rules.py checks case by case. */
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
    size_t native = 0;
    while (native < count && is_native(frames[native]))
        native++;
    for (size_t i = 0; i < native && i < GIL_WAIT_DEPTH; i++)
        if (one_of(frames[i]->func, GIL_WAITS))
            return WAITING_FOR_THE_GIL;
    for (size_t i = 0; i < native; i++) {
        str_t name = frames[i]->func;
        if (name.n == 0 || starts(name, UNNAMED_ADDRESS))
            continue;
        for (size_t group = 0; NATIVE_NAMES[group]; group++)
            if (one_of(name, NATIVE_NAMES[group]))
                return NATIVE_MEANINGS[group];
        break;
    }
    return IN_NATIVE_CODE;
}

static int in_library(str_t path)
{
    for (const char *const *part = TORCH_LIBRARY; *part; part++)
        if (has(path, *part))
            return 1;
    if (!has(path, STANDARD_LIBRARY_ROOT))
        return 0;
    for (const char *const *part = STANDARD_LIBRARY; *part; part++)
        if (has(path, *part))
            return 1;
    return 0;
}

static int set_state(buf_t *state, const char *text)
{
    state->len = 0;
    return buf_str(state, text) < 0 ? -1 : 1;
}

/* The state named after the outermost library call of the innermost chain; 0 when none. */
static int library_state(const row_t *const *python, size_t count, buf_t *state)
{
    int found = 0, previous_waited = 0;
    for (size_t i = 0; i < count && i < LIBRARY_DEPTH && found >= 0; i++) {
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
        if (ends(path, COLLECTIVES_FILE) && !one_of(func, WRAPPERS)) {
            found = set_state(state, COLLECTIVE_STATE);
            if (found > 0 && buf_add(state, func.p, func.n) < 0)
                found = -1;
        }
        for (const struct call *call = LIBRARY_CALLS; call->part && found >= 0; call++) {
            if (has(path, call->part) && (call->funcs[0] == NULL || one_of(func, call->funcs))) {
                found = set_state(state, call->meaning);
                break;
            }
        }
        int waits = ends(path, NESTED_WAIT_FILE) && equals(func, NESTED_WAIT_FUNC);
        if (previous_waited && waits && found >= 0)
            found = set_state(state, NESTED_WAIT_STATE);
        previous_waited = waits;
        free(copy);
    }
    return found;
}

/* The first `with` header rule whose part the header (before any ` as `) holds. */
static int with_state(str_t line, buf_t *state)
{
    str_t header = {line.p + 5, line.n - 6};
    const char *as = memmem(header.p, header.n, " as ", 4);
    if (as != NULL)
        header.n = (size_t)(as - header.p);
    header = strip_spaces(header);
    const struct with_header *rule = WITH_HEADERS;
    while (rule[1].part && !has(header, rule->part))
        rule++;
    if (set_state(state, rule->before) < 0 || buf_add(state, line.p, line.n) < 0)
        return -1;
    return buf_str(state, rule->after) < 0 ? -1 : 1;
}

/* LINE_CALLS, the first rule that matches: 1 named, 0 none. */
static int line_state(str_t line, buf_t *state)
{
    for (const struct call *rule = LINE_CALLS; rule->part; rule++) {
        if (strcmp(rule->part, "with") == 0) {
            if (starts(line, "with ") && ends(line, ":"))
                return with_state(line, state);
            continue;
        }
        int in = strcmp(rule->part, "in") == 0;
        for (const char *const *part = rule->funcs; *part; part++)
            if (in ? has(line, *part) : starts(line, *part))
                return set_state(state, rule->meaning);
    }
    return 0;
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
        if (one_of(python[0]->func, INNERMOST_FUNCS)) {
            found = set_state(state, INNERMOST_STATE);
        } else if (source_line(pid, python[0]->file, python[0]->has_lineno ? python[0]->lineno : 0,
                               &line) < 0) {
            found = -1;
        } else {
            line = strip_spaces(line);
            found = line_state(line, state);
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
        failed = buf_str(state, HOLDS_THE_GIL) < 0 ||
                 (named.len ? buf_add(state, named.data, named.len) : buf_str(state, IN_NATIVE_CODE)) < 0;
    else
        failed = (named.len ? buf_add(state, named.data, named.len) : buf_str(state, RUNNING_PYTHON)) < 0;
    free(named.data);
    return failed ? -1 : 0;
}
