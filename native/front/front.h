/* The native front end of `probing PID backtrace` (docs/decisions.md, "The native front end"):
 * what its parts share. Every function that can meet something unexpected returns -1, and
 * main() then hands the whole command line to the Python CLI, having printed nothing. */
#ifndef PROBING_FRONT_H
#define PROBING_FRONT_H

#include <stddef.h>
#include <stdint.h>

/* A string that may hold NUL bytes: the job chooses its names. */
typedef struct {
    const char *p;
    size_t n;
} str_t;

/* A growable byte buffer; the answer is built here and written only once whole. */
typedef struct {
    char *data;
    size_t len, cap;
} buf_t;

int buf_add(buf_t *buf, const void *data, size_t size);
int buf_str(buf_t *buf, const char *text);
int buf_int(buf_t *buf, long long value);

/* CLOCK_MONOTONIC in microseconds: every deadline of this program. */
long long now_us(void);

/* json.c: a strict reader of the small JSON headers an agent sends. Strings are UTF-8; a lone
 * surrogate from a \u escape is kept as its three-byte form (ED A0..BF xx), which inert()
 * knows. */
enum { J_NULL, J_BOOL, J_INT, J_FLOAT, J_STR, J_ARR, J_OBJ };
typedef struct jval {
    int type;
    long long num; /* J_INT; J_BOOL: 0 or 1 */
    str_t str;     /* J_STR */
    size_t count;  /* J_ARR, J_OBJ */
    struct jval *items;
    str_t *keys; /* J_OBJ */
} jval;

int json_parse(const char *text, size_t size, jval *out);
/* The value of `key` (the last one, as Python's json keeps), or NULL. */
const jval *json_get(const jval *object, const char *key);

/* utf8.c: code points, as Python's str sees them. */
int utf8_next(const char *p, size_t n, size_t *at, unsigned *code, int surrogates);
int utf8_valid(const char *p, size_t n);
int inert(buf_t *out, str_t text);
str_t strip_spaces(str_t text);
int is_line_break(unsigned code);

/* One python.backtrace row, as the renderer needs it. */
typedef struct {
    long long pid, thread_id, native_id, depth, lineno;
    int has_native_id, has_lineno, is_main;
    int holds_gil; /* read from outside: py-spy saw this thread hold the GIL */
    str_t thread_name, func, file, frame_type;
} row_t;

/* agent.c: the stacks from the target's agent. */
/* ASK_NONE: no socket where the agent would listen (no agent yet). */
enum { ASK_OK = 0, ASK_FALLBACK = -1, ASK_STILL = 2, ASK_NONE = 3 };
typedef struct {
    jval hello;
    row_t *rows;
    size_t count;
} answer_t;
int ask_agent(int pid, answer_t *answer);
/* agent.c: where the agent of `pid` may listen (the `index`-th place; -1 past the last). */
int socket_candidate(int pid, int index, char *path, size_t size);

/* attach.c: the agent put into a process that has none, as attach/__init__.py does in its
 * common case. ATTACH_UP: `answer` is the agent's; ATTACH_HANDED: injected, the rest is the
 * Python CLI's (INJECTED_ENV set); ATTACH_NOT_HERE: nothing done. `before` gets the job's
 * thread ids before the injection; `look` is called once when no thread of the job runs
 * (it answers from outside and exits when one holds the GIL). */
enum { ATTACH_UP = 0, ATTACH_HANDED = 1, ATTACH_NOT_HERE = -1 };
typedef struct {
    long long *ids;
    size_t count;
} tids_t;
typedef void (*outside_look)(void *context);
int attach_agent(const char *self_dir, int pid, tids_t *before, answer_t *answer, outside_look look,
                 void *context);

/* sources.c: /proc, and files the job names (regular files only, never a device opened). */
int process_alive(int pid);
int running_threads(int pid);
int read_whole(const char *path, char **data, size_t *size, size_t cap);

/* sources.c: lines of the job's source files, read as engine/sources.py SourceLines does. */
int source_line(int pid, str_t file, long long lineno, str_t *line);

/* states.c: analysis/states.py thread_state for rows from the agent. */
int thread_state(const row_t *const *frames, size_t count, int pid, buf_t *state);

/* outside.c: the stacks from a py-spy dump (outside/pyspy.py rows_from_dump, gil_holder),
 * for a job stuck on its GIL; `note` gets what the Python CLI says on stderr. */
/* outside.c: whether a thread of py-spy's dump is one of the agent's (pyspy.is_agent_thread). */
int agent_thread(const jval *thread);
/* gil.c: py-spy's owns_gil kept only on the thread that keeps the GIL (pyspy.checked_gil). */
void checked_gil(int pid, const jval *threads);
/* `among`: only these threads (NULL: all), as pyspy.threads_among; `why_more` goes after the
 * holder in the note (attach.AttachTimeout's words), or NULL. */
int outside_answer(int pid, const char *dump, size_t size, const tids_t *among, const char *why_more,
                   answer_t *answer, buf_t *note);

/* render.c: cli/render/backtrace.py write_backtrace_text. */
int render_backtrace(int pid, const answer_t *answer, buf_t *out);
/* render.c: whether a thread runs an asyncio loop (its tasks are the Python CLI's to show). */
int runs_asyncio_loop(const answer_t *answer);

#endif
