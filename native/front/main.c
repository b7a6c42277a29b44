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
#include <langinfo.h>
#include <limits.h>
#include <locale.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "front.h"

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

/* The PID of `probing PID backtrace`, `probing -t PID backtrace`, `probing --target PID
 * backtrace` or `probing --target=PID backtrace`; 0 for any other command line. */
static int plain_backtrace(int argc, char **argv)
{
    const char *text = NULL;
    if (argc == 3 && strcmp(argv[2], "backtrace") == 0)
        text = argv[1];
    else if (argc == 4 && strcmp(argv[3], "backtrace") == 0 &&
             (strcmp(argv[1], "-t") == 0 || strcmp(argv[1], "--target") == 0))
        text = argv[2];
    if (argc == 3 && strncmp(argv[1], "--target=", 9) == 0 && strcmp(argv[2], "backtrace") == 0)
        text = argv[1] + 9;
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

/* The target is stuck on its GIL: py-spy started here, with the same arguments as
 * outside/pyspy.py `dump` uses, its stdout and stderr pipes handed to the Python CLI. */
static void hand_py_spy_over(const place_t *place, int pid)
{
    char py_spy[PATH_MAX + 16], pid_text[16], handed[96];
    int out[2], err[2];
    pid_t child;
    if (find_py_spy(place, py_spy, sizeof(py_spy)) < 0 || pipe(out) < 0)
        return;
    if (pipe(err) < 0) {
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
    posix_spawn_file_actions_addclose(&actions, out[0]);
    posix_spawn_file_actions_addclose(&actions, err[0]);
    int failed = posix_spawn(&child, py_spy, &actions, NULL, command, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]), close(err[1]);
    if (failed) {
        close(out[0]), close(err[0]);
        return;
    }
    /* target pid : py-spy's pid : its stdout : its stderr (outside/spawn.py `handed_over`) */
    snprintf(handed, sizeof(handed), "%d:%d:%d:%d", pid, (int)child, out[0], err[0]);
    setenv("PROBING_PYSPY", handed, 1);
}

int main(int argc, char **argv)
{
    place_t place;
    if (find_place(&place) < 0) {
        fprintf(stderr, "probing: error: cannot tell where this program lies (/proc/self/exe)\n");
        return 1;
    }
    const char *enabled = getenv("PROBING_NATIVE_FRONT");
    unsetenv("PROBING_PYSPY"); /* only ever this program's own hand-over */
    int pid = plain_backtrace(argc, argv);
    if (pid == 0 || (enabled && strcmp(enabled, "0") == 0) || !python_writes_utf8())
        run_python(&place, argv);
    answer_t answer = {0};
    int asked = ask_agent(pid, &answer);
    if (asked == ASK_STILL)
        hand_py_spy_over(&place, pid);
    if (asked != ASK_OK)
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
