/* A test driver, not part of the command: tests/integration/test_front_rules.py compiles it
 * with json.c, utf8.c, states.c and sources.c and compares what it prints with what the
 * Python functions return, case by case. One JSON object a line on stdin, one answer a line
 * on stdout (the answer's bytes, then a newline):
 *   {"inert": TEXT}                          -> inert(TEXT)
 *   {"frames": [{"frame_type", "func", "file", "lineno"}, ...], "owns_gil": B}
 *                                            -> thread_state (frames innermost first)
 *   {"file": PATH, "lineno": N}              -> the source line as SourceLines gives it
 * An answer this code cannot give (the command would go to the Python CLI) is "\x01FALLBACK". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "front.h"

static str_t text_of(const jval *value)
{
    str_t none = {"", 0};
    return value && value->type == J_STR ? value->str : none;
}

static int answer(const jval *request, buf_t *out)
{
    const jval *frames = json_get(request, "frames"), *file = json_get(request, "file");
    if (json_get(request, "inert"))
        return inert(out, text_of(json_get(request, "inert")));
    if (file) {
        const jval *lineno = json_get(request, "lineno");
        str_t line;
        if (source_line(0, file->str, lineno && lineno->type == J_INT ? lineno->num : 0, &line) < 0)
            return -1;
        return buf_add(out, line.p, line.n);
    }
    if (frames == NULL || frames->type != J_ARR)
        return -1;
    row_t *rows = calloc(frames->count + 1, sizeof(row_t));
    const row_t **order = calloc(frames->count + 1, sizeof(row_t *));
    if (rows == NULL || order == NULL)
        return -1;
    for (size_t i = 0; i < frames->count; i++) {
        const jval *frame = &frames->items[i], *lineno = json_get(frame, "lineno");
        rows[i].frame_type = text_of(json_get(frame, "frame_type"));
        rows[i].func = text_of(json_get(frame, "func"));
        rows[i].file = text_of(json_get(frame, "file"));
        rows[i].has_lineno = lineno && lineno->type == J_INT;
        rows[i].lineno = rows[i].has_lineno ? lineno->num : 0;
        order[i] = &rows[i];
    }
    const jval *gil = json_get(request, "owns_gil");
    if (frames->count && gil && gil->type == J_BOOL)
        rows[0].holds_gil = (int)gil->num;
    return thread_state(order, frames->count, 0, out);
}

int main(void)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t size;
    while ((size = getline(&line, &cap, stdin)) > 0) {
        jval request;
        buf_t out = {0};
        if (json_parse(line, (size_t)size - (line[size - 1] == '\n'), &request) < 0 || answer(&request, &out) < 0) {
            out.len = 0;
            buf_str(&out, "\001FALLBACK");
        }
        fwrite(out.data, 1, out.len, stdout);
        fputc('\n', stdout);
        free(out.data);
    }
    return 0;
}
