/* Reading an agent's replies (table.c), for agent.c. */
#ifndef PROBING_FRONT_TABLE_H
#define PROBING_FRONT_TABLE_H

#include "front.h"

typedef struct {
    int fd;
    long long deadline; /* CLOCK_MONOTONIC microseconds */
    buf_t pending;
    size_t taken;
} reader_t;

/* The hello and backtrace replies, checked as client/replies.py checks them, the table
 * decoded as protocol/tables.py decodes it: 0, or -1 for anything else. */
int read_answer(reader_t *reader, answer_t *answer);

#endif
