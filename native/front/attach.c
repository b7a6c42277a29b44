/* The first `probing PID backtrace` of a process with no agent: attach/__init__.py's attach in
 * its common case, so that the whole command stays native (issue 30: a fresh PID answered in
 * well under 100 ms, a job stuck on its GIL at py-spy's speed). Only that case: a CPython 3.8+
 * process in our mount namespace and root, on x86-64, with no attach of anyone's under way and
 * no attach error left, and the probing package of this front end's own version installed
 * beside it (PREFIX/lib.../site-packages/probing). Anything else, before the injection or
 * after it, goes to the Python CLI, which takes the attach from where it stands: told by
 * INJECTED_ENV that the helper is in, it never injects a second one. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <poll.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "front.h"
#include "front_tables.h"

extern char **environ;

/* Where pip puts the package for a front end in PREFIX/bin: a venv, --user, or the system. */
static const char *const PACKAGE_PATTERNS[] = {
    "%s/../lib/python3*/site-packages/probing",
    "%s/../lib64/python3*/site-packages/probing",
    "%s/../lib/python3/dist-packages/probing",
    "%s/../local/lib/python3*/dist-packages/probing",
    NULL,
};

/* Whether the package at `dir` is this front end's own version (its __init__.py says so). */
static int own_version(const char *dir)
{
    char path[PATH_MAX], *text, wanted[64];
    size_t size;
    snprintf(path, sizeof(path), "%s/__init__.py", dir);
    if (read_whole(path, &text, &size, 1 << 16) < 0)
        return 0;
    snprintf(wanted, sizeof(wanted), "\n__version__ = \"%s\"\n", PROBING_VERSION);
    int same = strstr(text, wanted) != NULL;
    free(text);
    return same;
}

/* The injector and the helper of this front end's package; -1 when none is found. */
static int find_package(const char *self_dir, char *injector, char *helper, size_t size)
{
    for (const char *const *pattern = PACKAGE_PATTERNS; *pattern; pattern++) {
        char wanted[PATH_MAX];
        glob_t found;
        snprintf(wanted, sizeof(wanted), *pattern, self_dir);
        if (glob(wanted, GLOB_ONLYDIR, NULL, &found) != 0)
            continue;
        for (size_t i = 0; i < found.gl_pathc; i++) {
            const char *dir = found.gl_pathv[i];
            snprintf(injector, size, "%s/_native/probing-inject", dir);
            snprintf(helper, size, "%s/_native/libprobing-helper.so", dir);
            if (own_version(dir) && access(injector, X_OK) == 0 && access(helper, R_OK) == 0) {
                globfree(&found);
                return 0;
            }
        }
        globfree(&found);
    }
    return -1;
}

/* The ids of the process's threads now, and whether one of them is an attach's (the helper's
 * thread, waiting for the GIL or loading the agent: WAITING_NAME, LOADING_NAME). */
static int job_threads(int pid, tids_t *tids, int *attaching)
{
    char path[96], name[64];
    snprintf(path, sizeof(path), "/proc/%d/task", pid);
    DIR *tasks = opendir(path);
    if (tasks == NULL)
        return -1;
    struct dirent *task;
    *attaching = 0;
    tids->count = 0;
    while ((task = readdir(tasks)) != NULL) {
        if (task->d_name[0] == '.')
            continue;
        long long *more = realloc(tids->ids, (tids->count + 1) * sizeof(long long));
        if (more == NULL) {
            closedir(tasks);
            return -1;
        }
        tids->ids = more;
        tids->ids[tids->count++] = atoll(task->d_name);
        snprintf(path, sizeof(path), "/proc/%d/task/%.20s/comm", pid, task->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t got = fd < 0 ? -1 : read(fd, name, sizeof(name) - 1);
        if (fd >= 0)
            close(fd);
        if (got > 0) {
            name[got] = '\0';
            name[strcspn(name, "\n")] = '\0';
            *attaching |= strcmp(name, WAITING_NAME) == 0 || strcmp(name, LOADING_NAME) == 0;
        }
    }
    closedir(tasks);
    return 0;
}

/* What attach.check_target and helper_paths would let through at once: a CPython 3.8+ by its
 * executable's name, seeing our files at our paths. */
static int plain_cpython(int pid)
{
    char path[64], exe[PATH_MAX];
    struct stat theirs, ours;
    int major = 0, minor = 0;
    snprintf(path, sizeof(path), "/proc/%d/root/", pid);
    if (stat(path, &theirs) < 0 || stat("/", &ours) < 0 || theirs.st_dev != ours.st_dev ||
        theirs.st_ino != ours.st_ino)
        return 0;
    snprintf(path, sizeof(path), "/proc/%d/exe", pid);
    ssize_t size = readlink(path, exe, sizeof(exe) - 1);
    if (size <= 0)
        return 0;
    exe[size] = '\0';
    const char *name = strrchr(exe, '/') ? strrchr(exe, '/') + 1 : exe;
    return sscanf(name, "python%d.%d", &major, &minor) == 2 && major == 3 && minor >= 8;
}

/* Where the agent will listen (agent.c socket_candidate), read once: the job's start-up
 * environment names one, and a big one is not read again every few milliseconds. */
typedef struct {
    char paths[3][PATH_MAX];
    int count;
} places_t;

static void socket_places(int pid, places_t *places)
{
    for (places->count = 0; places->count < 3; places->count++)
        if (socket_candidate(pid, places->count, places->paths[places->count], PATH_MAX) < 0)
            break;
}

/* A socket in one of the places (ask_agent then checks whose it is). */
static int socket_there(const places_t *places)
{
    struct stat info;
    for (int i = 0; i < places->count; i++)
        if (lstat(places->paths[i], &info) == 0)
            return 1;
    return 0;
}

/* An attach error a helper left beside a place (attach.py removes them before it injects). */
static int attach_error_left(const places_t *places)
{
    for (int i = 0; i < places->count; i++) {
        char path[PATH_MAX + 16];
        size_t length = strlen(places->paths[i]);
        snprintf(path, sizeof(path), "%.*s.attach-error", (int)(length > 5 ? length - 5 : 0), places->paths[i]);
        if (access(path, F_OK) == 0)
            return 1;
    }
    return 0;
}

/* probing-inject PID HELPER, as attach/methods.py PtraceMethod runs it: 0 once it said ok. */
static int inject(const char *injector, const char *helper, int pid)
{
    char pid_text[16], timeout[32], reply[4096];
    int out[2];
    pid_t child = -1;
    snprintf(pid_text, sizeof(pid_text), "%d", pid);
    snprintf(timeout, sizeof(timeout), "%lld", (long long)BACKTRACE_TIMEOUT_US / 1000);
    char *command[] = {(char *)injector, "--timeout-ms", timeout, pid_text, (char *)helper, NULL};
    if (pipe2(out, O_CLOEXEC) < 0)
        return -1;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    int spawned = posix_spawn(&child, injector, &actions, NULL, command, environ) == 0 && child > 0;
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    size_t got = 0;
    for (ssize_t part; spawned && got < sizeof(reply) - 1; got += (size_t)part)
        if ((part = read(out[0], reply + got, sizeof(reply) - 1 - got)) <= 0)
            break;
    close(out[0]);
    reply[got] = '\0';
    int status = 0;
    if (!spawned || waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return -1;
    return strncmp(reply, "{\"ok\": true", 11) == 0 ? 0 : -1;
}

/* How long this program waits for the agent before the Python CLI takes the wait over: a load
 * on a loaded machine (CI, three test workers on two cores) took over 300 ms. */
#define HAND_OVER_US (2 * 1000 * 1000LL)

/* Ask the agent once its socket is there, within HAND_OVER_US of the injection (a loader that
 * takes longer is attach.py's to wait for). As attach.py's _EarlyLook: `look` once when no
 * thread of the job runs, and once EARLY_LOOK_US after the injection (a holder that runs). */
static int wait_for_agent(int pid, const places_t *places, answer_t *answer, long long injected,
                          outside_look look, void *context)
{
    int still = 0, looked_still = 0, looked_late = 0;
    for (long long looked_at = 0; now_us() - injected < HAND_OVER_US;) {
        if (!process_alive(pid) || attach_error_left(places))
            return -1;
        if (socket_there(places)) {
            int asked = ask_agent(pid, answer);
            if (asked == ASK_OK)
                return 0;
            if (asked == ASK_STILL && !looked_still++)
                look(context);
        } else if (!looked_still && now_us() - looked_at >= STILL_CHECK_US) {
            looked_at = now_us();
            still = running_threads(pid) == 0 ? still + 1 : 0;
            if (still >= STILL_CHECKS && !looked_still++)
                look(context); /* returns only when no thread of the job holds the GIL */
        }
        if (!looked_late && now_us() - injected >= EARLY_LOOK_US) {
            looked_late = 1;
            look(context);
        }
        struct timespec pause = {0, 2 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    return -1;
}

int attach_agent(const char *self_dir, int pid, tids_t *before, answer_t *answer, outside_look look,
                 void *context)
{
    char injector[PATH_MAX], helper[PATH_MAX];
    struct utsname machine;
    places_t places;
    int attaching = 0;
    if (uname(&machine) < 0 || strcmp(machine.machine, "x86_64") != 0 || !plain_cpython(pid))
        return ATTACH_NOT_HERE;
    socket_places(pid, &places);
    if (places.count == 0 || attach_error_left(&places) ||
        find_package(self_dir, injector, helper, sizeof(injector)) < 0 ||
        job_threads(pid, before, &attaching) < 0 || attaching)
        return ATTACH_NOT_HERE;
    if (inject(injector, helper, pid) < 0)
        return ATTACH_NOT_HERE; /* the Python CLI tries again, and says why it fails */
    char text[16];
    snprintf(text, sizeof(text), "%d", pid);
    setenv(INJECTED_ENV, text, 1);
    return wait_for_agent(pid, &places, answer, now_us(), look, context) == 0 ? ATTACH_UP : ATTACH_HANDED;
}
