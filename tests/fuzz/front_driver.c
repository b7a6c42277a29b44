/* The fuzz layer's driver of the native front end's decoders (tests/fuzz/test_fuzz_front.py
 * compiles it with native/front/*.c but main.c, under AddressSanitizer and UBSan where the
 * compiler has them): what `probing PID backtrace` does with an agent's replies (table.c
 * read_answer, then render.c) and with a py-spy dump (outside.c outside_answer, then render.c),
 * many inputs in one process.
 *
 *     front_driver PID      PID: a Python process, whose /proc the py-spy path reads
 *
 * On stdin, inputs one after the other: a kind byte ('r' an agent's replies, 'o' py-spy's dump),
 * the input's length (u32, big-endian), its bytes. On stdout, one line for each: "ok N" (the
 * front end renders it: N bytes) or "fallback" (it hands the command to the Python CLI). The
 * replies are read from a buffer, not a socket: the reader's deadline has passed, so it reads
 * what is buffered and takes the end of it as the agent's hanging up. */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "front.h"
#include "table.h"

static int read_exactly(void *into, size_t size)
{
    return fread(into, 1, size, stdin) == size ? 0 : -1;
}

/* The front end renders only for the PID it asked (render.c): the one the reply's hello gives. */
static int hello_pid(const answer_t *answer)
{
    const jval *pid = json_get(&answer->hello, "pid");
    return pid && pid->type == J_INT && pid->num > 0 && pid->num < INT_MAX ? (int)pid->num : (int)getpid();
}

int main(int argc, char **argv)
{
    int python_pid = argc > 1 ? atoi(argv[1]) : (int)getppid();
    for (;;) {
        unsigned char head[5];
        if (read_exactly(head, sizeof(head)) < 0)
            return 0;
        size_t size = (size_t)head[1] << 24 | (size_t)head[2] << 16 | (size_t)head[3] << 8 | head[4];
        char *data = malloc(size ? size : 1);
        if (data == NULL || read_exactly(data, size) < 0)
            return 2;
        answer_t answer = {0};
        buf_t out = {0}, note = {0};
        int result;
        if (head[0] == 'r') {
            reader_t reader = {-1, 0, {0}, 0};
            result = buf_add(&reader.pending, data, size);
            if (result == 0)
                result = read_answer(&reader, &answer);
            if (result == 0)
                result = render_backtrace(hello_pid(&answer), &answer, &out);
            free(reader.pending.data);
        } else {
            result = outside_answer(python_pid, data, size, NULL, NULL, &answer, &note);
            if (result == 0)
                result = render_backtrace(python_pid, &answer, &out);
        }
        if (result == 0)
            printf("ok %zu\n", out.len);
        else
            printf("fallback\n");
        fflush(stdout);
        free(out.data);
        free(note.data);
        free(data);
    }
}
