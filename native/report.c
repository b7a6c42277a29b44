/* probing-inject: what it says. Errors are one JSON line on stdout, -v narrates on stderr. */
#include "inject.h"

int verbose = 0;

void say(const char *format, ...) {
    if (!verbose) return;
    va_list arguments;
    va_start(arguments, format);
    fputs("probing-inject: ", stderr);
    vfprintf(stderr, format, arguments);
    fputc('\n', stderr);
    va_end(arguments);
}

void json_string(const char *text) {
    putchar('"');
    for (; *text; text++) {
        unsigned char c = (unsigned char)*text;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

/* {"ok": false, "error": KIND[, "tracer": PID], "message": ...}: what probing/attach/methods.py
 * turns into the user's error. */
static void report_failure(const char *kind, pid_t tracer, const char *format, va_list arguments) {
    char message[1024];
    vsnprintf(message, sizeof message, format, arguments);
    printf("{\"ok\": false, \"error\": ");
    json_string(kind);
    if (tracer) printf(", \"tracer\": %d", (int)tracer);
    printf(", \"message\": ");
    json_string(message);
    printf("}\n");
}

int fail(const char *kind, const char *format, ...) {
    va_list arguments;
    va_start(arguments, format);
    report_failure(kind, 0, format, arguments);
    va_end(arguments);
    return 1;
}

int fail_traced(pid_t tracer, const char *format, ...) {
    va_list arguments;
    va_start(arguments, format);
    report_failure("traced", tracer, format, arguments);
    va_end(arguments);
    return 1;
}

uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

