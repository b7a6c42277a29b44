/*
 * libprobing-helper.so: loaded into a running Python process by probing-inject (or by gdb),
 * which then calls probing_helper_start() in one borrowed thread.
 *
 * probing_helper_start() only starts a new thread and returns: nothing here ever runs Python
 * in the borrowed (ptrace-stopped) thread. The new thread waits for the interpreter's GIL
 * with PyGILState_Ensure -- for as long as that takes, while the borrowed thread has long
 * been given back -- and runs probing/bootstrap/attach.py, found next to this library.
 *
 * Not linked against libpython: Python's functions are looked up with dlsym(RTLD_DEFAULT),
 * so one build serves every CPython version (and a process that turns out not to be
 * Python gets a thread that finds nothing and ends).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*is_initialized_fn)(void);
typedef int (*gil_ensure_fn)(void); /* PyGILState_STATE is an enum */
typedef void (*gil_release_fn)(int);
typedef int (*run_string_fn)(const char *);
typedef const char *(*get_version_fn)(void);

/* How long the bootstrap thread waits for a process that has not finished Py_Initialize. */
#define INITIALIZE_WAIT_SECONDS 60

static char bootstrap_script[PATH_MAX];

static void hex_encode(const char *text, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (; *text; text++) {
        unsigned char byte = (unsigned char)*text;
        *out++ = digits[byte >> 4];
        *out++ = digits[byte & 15];
    }
    *out = '\0';
}

static int supported_version(get_version_fn version) {
    int major = 0, minor = 0;
    if (sscanf(version(), "%d.%d", &major, &minor) != 2) return 0;
    return major > 3 || (major == 3 && minor >= 8);
}

/* <package>/_native/libprobing-helper.so -> <package>/bootstrap/attach.py */
static int find_bootstrap_script(void) {
    Dl_info self;
    if (!dladdr((void *)find_bootstrap_script, &self) || !self.dli_fname) return 0;
    char directory[PATH_MAX];
    snprintf(directory, sizeof directory, "%s", self.dli_fname);
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(directory, '/');
        if (!slash) return 0;
        *slash = '\0';
    }
    int length = snprintf(bootstrap_script, sizeof bootstrap_script, "%s/bootstrap/attach.py", directory);
    return length > 0 && (size_t)length < sizeof bootstrap_script;
}

static void *bootstrap(void *unused) {
    (void)unused;
    /* Signals belong to the job's own threads (Python handles them in its main thread). */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    pthread_setname_np(pthread_self(), "probing-attach");

    is_initialized_fn is_initialized = (is_initialized_fn)dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    gil_ensure_fn ensure = (gil_ensure_fn)dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
    gil_release_fn release = (gil_release_fn)dlsym(RTLD_DEFAULT, "PyGILState_Release");
    run_string_fn run = (run_string_fn)dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
    get_version_fn version = (get_version_fn)dlsym(RTLD_DEFAULT, "Py_GetVersion");
    if (!is_initialized || !ensure || !release || !run || !version) return NULL;
    if (!supported_version(version) || !find_bootstrap_script()) return NULL;

    struct timespec pause = {0, 10 * 1000 * 1000};
    for (int waited = 0; !is_initialized(); waited++) {
        if (waited > INITIALIZE_WAIT_SECONDS * 100) return NULL;
        nanosleep(&pause, NULL);
    }

    /* The path travels as hex so that no character of it can break the Python literal.
     * Everything happens inside exec() with its own globals: nothing is added to __main__,
     * and nothing is printed, whatever goes wrong. */
    static char hex[2 * PATH_MAX + 1];
    static char code[2 * PATH_MAX + 1024];
    hex_encode(bootstrap_script, hex);
    snprintf(code, sizeof code,
             "try:\n"
             "    (lambda path: __import__('builtins').exec(__import__('builtins').compile("
             "__import__('io').open_code(path).read(), path, 'exec'), "
             "{'__name__': '__probing_attach__', '__file__': path, '__builtins__': __import__('builtins')}))"
             "(bytes.fromhex('%s').decode('utf-8', 'surrogateescape'))\n"
             "except BaseException:\n"
             "    pass\n",
             hex);

    if (!is_initialized()) return NULL;
    int state = ensure();
    /* "probing-attach" means "waiting for the GIL": the CLI looks for it to avoid injecting a
     * second helper behind one still waiting. Threads inherit their creator's name, so the
     * agent's threads, started from here, would carry it for good and every later attach
     * (after the job closed the agent's socket) would wait for a helper that is long done. */
    pthread_setname_np(pthread_self(), "probing-agent");
    run(code);
    release(state);
    return NULL;
}

/* Called by the injector in the borrowed thread: start the bootstrap thread and return at
 * once. Only pthread_create runs here; finding the script (dladdr takes the loader's lock)
 * waits for the new thread. Returns 0, or an errno value. */
__attribute__((visibility("default"))) int probing_helper_start(void) {
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    int error = pthread_create(&thread, &attributes, bootstrap, NULL);
    pthread_attr_destroy(&attributes);
    return error;
}
