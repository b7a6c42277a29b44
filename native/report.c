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

int fail(const char *kind, const char *format, ...) {
    char message[1024];
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(message, sizeof message, format, arguments);
    va_end(arguments);
    printf("{\"ok\": false, \"error\": ");
    json_string(kind);
    printf(", \"message\": ");
    json_string(message);
    printf("}\n");
    return 1;
}

uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}
