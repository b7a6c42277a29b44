/* `probing`: the native front end of the command (docs/decisions.md, "The native front end").
 *
 * `probing PID backtrace` is timed against py-spy, and starting CPython alone takes about as
 * long as a whole py-spy dump. So this program answers that one command line itself when the
 * target's agent answers, and hands everything else to the Python CLI (`probing-python`
 * beside it) by exec with the same arguments, having written nothing: other command lines,
 * and any surprise on its own path. What it prints is byte for byte what the Python CLI
 * prints for the same process state (tests/integration/test_front.py).
 *
 * When the agent is silent and no thread of the target runs (its GIL held by a blocked
 * thread: target.Stillness), the Python CLI reads the stacks with py-spy; this program starts
 * py-spy at once and hands its pipes over (PROBING_PYSPY), so py-spy works while the
 * interpreter starts. PROBING_NATIVE_FRONT=0 sends every command to the Python CLI. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <langinfo.h>
#include <limits.h>
#include <locale.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "front.h"
#include "front_tables.h"

extern char **environ;

typedef struct {
    char self_dir[PATH_MAX];
    char python_cli[PATH_MAX + 32];
} place_t;

static int find_place(place_t *place)
{
    ssize_t size = readlink("/proc/self/exe", place->self_dir, sizeof(place->self_dir) - 1);
    if (size <= 0)
        return -1;
    place->self_dir[size] = '\0';
    char *slash = strrchr(place->self_dir, '/');
    if (slash == NULL)
        return -1;
    *slash = '\0';
    snprintf(place->python_cli, sizeof(place->python_cli), "%s/probing-python", place->self_dir);
    return 0;
}

static void run_python(const place_t *place, char **argv)
{
    signal(SIGPIPE, SIG_DFL);
    argv[0] = (char *)place->python_cli;
    execv(place->python_cli, argv);
    fprintf(stderr, "probing: error: cannot run the Python CLI %s: %s\n", place->python_cli, strerror(errno));
    exit(1);
}

/* The PID of `probing PID backtrace`, or of `probing OPTION PID backtrace` and `probing
 * --target=PID backtrace` for each spelling of the target option in TARGET_OPTIONS (cli/spec.py
 * TARGET); 0 for any other command line: every other option is the Python CLI's to read. */
static int plain_backtrace(int argc, char **argv)
{
    const char *text = NULL;
    if (argc == 3 && strcmp(argv[2], "backtrace") == 0) {
        text = argv[1];
        for (const char *const *name = TARGET_OPTIONS; *name; name++) {
            size_t length = strlen(*name);
            if ((*name)[1] == '-' && strncmp(text, *name, length) == 0 && text[length] == '=') {
                text += length + 1;
                break;
            }
        }
    } else if (argc == 4 && strcmp(argv[3], "backtrace") == 0) {
        for (const char *const *name = TARGET_OPTIONS; *name; name++)
            if (strcmp(argv[1], *name) == 0)
                text = argv[2];
    }
    if (text == NULL || text[0] < '1' || text[0] > '9' || strlen(text) > 9)
        return 0;
    for (const char *c = text; *c; c++)
        if (*c < '0' || *c > '9')
            return 0;
    return atoi(text);
}

/* Whether Python's stdout would write UTF-8 as this program does: a UTF-8 locale, or the C
 * locale (which Python coerces to UTF-8), and no PYTHONIOENCODING. */
static int python_writes_utf8(void)
{
    const char *utf8_mode = getenv("PYTHONUTF8");
    if (getenv("PYTHONIOENCODING") != NULL || (utf8_mode && strcmp(utf8_mode, "1") != 0))
        return 0;
    if (utf8_mode != NULL)
        return 1;
    const char *locale = setlocale(LC_CTYPE, "");
    if (locale == NULL)
        return 0;
    if (strcmp(locale, "C") == 0 || strcmp(locale, "POSIX") == 0)
        return 1;
    const char *codeset = nl_langinfo(CODESET);
    return strcmp(codeset, "UTF-8") == 0 || strcmp(codeset, "utf8") == 0;
}

static int write_all(int fd, const char *data, size_t size)
{
    while (size) {
        ssize_t written = write(fd, data, size);
        if (written < 0 && errno == EINTR)
            continue;
        if (written < 0)
            return -1;
        data += written, size -= (size_t)written;
    }
    return 0;
}

/* py-spy where the Python CLI would look (outside/pyspy.py: beside its interpreter, which is
 * beside this program in an installed environment), then on PATH. */
static int find_py_spy(const place_t *place, char *path, size_t size)
{
    snprintf(path, size, "%s/py-spy", place->self_dir);
    struct stat info;
    if (access(path, X_OK) == 0 && stat(path, &info) == 0 && !S_ISDIR(info.st_mode))
        return 0;
    const char *search = getenv("PATH");
    while (search && *search) {
        const char *end = strchr(search, ':');
        size_t length = end ? (size_t)(end - search) : strlen(search);
        if (length && (size_t)snprintf(path, size, "%.*s/py-spy", (int)length, search) < size &&
            access(path, X_OK) == 0 && stat(path, &info) == 0 && !S_ISDIR(info.st_mode))
            return 0;
        search += length + (end != NULL);
    }
    return -1;
}

/* A pipe holding `size` bytes whose writing end is closed: what a py-spy printed, for the
 * Python CLI to read as if from py-spy itself. -1 when it does not fit in a pipe. */
static int pipe_of(const buf_t *bytes)
{
    int ends[2];
    if (pipe2(ends, O_NONBLOCK) < 0)
        return -1;
    if (bytes->len > 65536)
        fcntl(ends[1], F_SETPIPE_SZ, (int)bytes->len);
    int capacity = fcntl(ends[1], F_GETPIPE_SZ);
    /* Non-blocking, and only what fits: nobody reads this pipe until the Python CLI runs. */
    if (capacity < 0 || (size_t)capacity < bytes->len ||
        write_all(ends[1], bytes->data ? bytes->data : "", bytes->len) < 0) {
        close(ends[0]), close(ends[1]);
        return -1;
    }
    close(ends[1]);
    fcntl(ends[0], F_SETFL, 0); /* the reading end as a pipe of py-spy's would be: blocking */
    return ends[0];
}

/* py-spy's stdout and stderr to their ends, until `deadline` (now_us): 0, TIMED_OUT when it
 * took longer, -1 when they could not be read. */
#define TIMED_OUT 1
static int read_both(int out, int err, buf_t *out_bytes, buf_t *err_bytes, long long deadline)
{
    struct pollfd ends[2] = {{out, POLLIN, 0}, {err, POLLIN, 0}};
    buf_t *into[2] = {out_bytes, err_bytes};
    char chunk[65536];
    while (ends[0].fd >= 0 || ends[1].fd >= 0) {
        long long left = (deadline - now_us() + 999) / 1000;
        if (left <= 0)
            return TIMED_OUT;
        if (poll(ends, 2, left > INT_MAX ? INT_MAX : (int)left) < 0)
            return -1;
        for (int i = 0; i < 2; i++) {
            if (ends[i].fd < 0 || !ends[i].revents)
                continue;
            ssize_t got = read(ends[i].fd, chunk, sizeof(chunk));
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0)
                ends[i].fd = -1;
            else if (buf_add(into[i], chunk, (size_t)got) < 0)
                return -1;
        }
    }
    return 0;
}

/* The target is stuck on its GIL: what the Python CLI does then (engine/backtrace.py), done
 * here. py-spy is started with the same arguments as outside/pyspy.py `dump` from
 * Target.gil_holder, and given the same time: what is left of --timeout's default since the
 * agent was asked (`asked_at`), at least the floor of a read from outside. When its answer is
 * one this program renders, it is the answer. Otherwise (no thread holds the GIL, a failure,
 * an unusual dump, or no answer yet) py-spy goes to the Python CLI, which reads it as a py-spy
 * of its own (PROBING_PYSPY, outside/spawn.py) within its own deadline: its work is not done
 * twice, and a py-spy slowed by a loaded machine is not started again. While this program
 * attaches (`hand_over` 0: attach.c's look), such a py-spy is stopped instead, and the wait for
 * the agent goes on. `among` and `why_more` as outside_answer's. */
static void from_outside(const place_t *place, int pid, long long asked_at, const tids_t *among,
                         const char *why_more, int hand_over)
{
    char py_spy[PATH_MAX + 16], pid_text[16], handed[96];
    int out[2], err[2];
    pid_t child = -1; /* posix_spawn sets it only when it succeeds */
    if (find_py_spy(place, py_spy, sizeof(py_spy)) < 0 || pipe2(out, O_CLOEXEC) < 0)
        return;
    if (pipe2(err, O_CLOEXEC) < 0) {
        close(out[0]), close(out[1]);
        return;
    }
    snprintf(pid_text, sizeof(pid_text), "%d", pid);
    char *command[] = {py_spy, "dump", "--pid", pid_text, "--json", NULL};
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    int spawned = posix_spawn(&child, py_spy, &actions, NULL, command, environ) == 0 && child > 0;
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]), close(err[1]);
    buf_t out_bytes = {0}, err_bytes = {0}, note = {0}, text = {0};
    long long left = asked_at + BACKTRACE_TIMEOUT_US - now_us(), least = OUTSIDE_FLOOR_MS * 1000LL;
    long long deadline = now_us() + (left > least ? left : least);
    int got = spawned ? read_both(out[0], err[0], &out_bytes, &err_bytes, deadline) : -1;
    if (hand_over && got == TIMED_OUT && out_bytes.len == 0 && err_bytes.len == 0 &&
        fcntl(out[0], F_SETFD, 0) == 0 && fcntl(err[0], F_SETFD, 0) == 0) {
        /* Still reading, nothing read from its pipes yet: they go over as they are. */
        snprintf(handed, sizeof(handed), "%d:%d:%d:%d", pid, (int)child, out[0], err[0]);
        setenv("PROBING_PYSPY", handed, 1);
        return;
    }
    close(out[0]), close(err[0]);
    if (got != 0) { /* the Python CLI looks again (or attach.c waits on) */
        /* Only a child this program started: a PID it never got may be any process's. */
        if (spawned && kill(child, SIGKILL) == 0)
            waitpid(child, NULL, 0);
        return;
    }
    answer_t answer = {0};
    /* A loop's tasks cannot be read from outside: the Python CLI says so under its thread. */
    if (outside_answer(pid, out_bytes.data ? out_bytes.data : "", out_bytes.len, among, why_more, &answer,
                       &note) == 0 &&
        !runs_asyncio_loop(&answer) && render_backtrace(pid, &answer, &text) == 0) {
        waitpid(child, NULL, 0);
        signal(SIGPIPE, SIG_IGN);
        write_all(2, note.data, note.len);
        if (write_all(1, text.data, text.len) < 0 && errno != EPIPE)
            exit(1);
        exit(0);
    }
    if (!hand_over) {
        if (kill(child, SIGKILL) == 0)
            waitpid(child, NULL, 0);
        return;
    }
    /* py-spy is left unreaped: the Python CLI takes its exit status with its output. */
    int out_pipe = pipe_of(&out_bytes), err_pipe = pipe_of(&err_bytes);
    if (out_pipe < 0 || err_pipe < 0) { /* the Python CLI runs py-spy again */
        if (out_pipe >= 0)
            close(out_pipe);
        if (err_pipe >= 0)
            close(err_pipe);
        waitpid(child, NULL, 0);
        return;
    }
    /* target pid : py-spy's pid : its stdout : its stderr (outside/spawn.py `handed_over`) */
    snprintf(handed, sizeof(handed), "%d:%d:%d:%d", pid, (int)child, out_pipe, err_pipe);
    setenv("PROBING_PYSPY", handed, 1);
}

typedef struct {
    const place_t *place;
    int pid;
    long long asked_at;
    tids_t before;
} attaching_t;

/* attach.c's look when no thread of the job runs: the job's own threads (the injection's
 * left out), read from outside; an answer ends the command as attach.py's AttachTimeout does. */
static void look_while_attaching(void *context)
{
    const attaching_t *attaching = context;
    from_outside(attaching->place, attaching->pid, attaching->asked_at, &attaching->before, ATTACH_HELD, 0);
}

int main(int argc, char **argv)
{
    place_t place;
    if (find_place(&place) < 0) {
        fprintf(stderr, "probing: error: cannot tell where this program lies (/proc/self/exe)\n");
        return 1;
    }
    const char *enabled = getenv("PROBING_NATIVE_FRONT");
    unsetenv("PROBING_PYSPY"); /* only ever this program's own hand-overs */
    unsetenv(AGENT_SILENT);
    unsetenv(INJECTED_ENV);
    int pid = plain_backtrace(argc, argv);
    if (pid == 0 || (enabled && strcmp(enabled, "0") == 0) || !python_writes_utf8())
        run_python(&place, argv);
    answer_t answer = {0};
    long long asked_at = now_us();
    int asked = ask_agent(pid, &answer);
    if (asked == ASK_STILL)
        from_outside(&place, pid, asked_at, NULL, NULL, 1);
    if (asked == ASK_NONE) {
        attaching_t attaching = {&place, pid, asked_at, {NULL, 0}};
        int attached = attach_agent(place.self_dir, pid, &attaching.before, &answer, look_while_attaching, &attaching);
        asked = attached == ATTACH_UP ? ASK_OK : ASK_FALLBACK;
    }
    if (asked != ASK_OK || runs_asyncio_loop(&answer))
        run_python(&place, argv);
    buf_t out = {0};
    if (render_backtrace(pid, &answer, &out) < 0)
        run_python(&place, argv);
    /* As the Python CLI: a closed stdout (`probing PID backtrace | head`) ends quietly. */
    signal(SIGPIPE, SIG_IGN);
    if (write_all(1, out.data, out.len) < 0 && errno != EPIPE) {
        fprintf(stderr, "probing: error: cannot write the stacks: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}
