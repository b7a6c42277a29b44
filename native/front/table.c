/* An agent's replies read as client/replies.py reads them (bounded, within a deadline, checked
 * against the shape the CLI uses), and the backtrace table decoded as protocol/tables.py
 * decodes it, every offset checked against the payload. What the Python CLI would read in
 * another way than this code (a big-endian table, locals, NULLs where names belong) is left
 * to it: -1. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "front_tables.h"
#include "table.h"

/* Replies bigger than this (a backtrace is a few KiB) are the Python CLI's to read. */
#define MAX_REPLY (64u << 20)

long long now_us(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000 + now.tv_nsec / 1000;
}

/* Until `size` unread bytes are buffered; they start at reader->pending.data + reader->taken. */
static int fill(reader_t *reader, size_t size)
{
    char chunk[65536];
    while (reader->pending.len - reader->taken < size) {
        long long left = reader->deadline - now_us();
        struct pollfd readable = {reader->fd, POLLIN, 0};
        if (left <= 0 || poll(&readable, 1, (int)(left / 1000) + 1) < 0)
            return -1;
        ssize_t got = recv(reader->fd, chunk, sizeof(chunk), MSG_DONTWAIT);
        if (got < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (got <= 0 || buf_add(&reader->pending, chunk, (size_t)got) < 0)
            return -1;
    }
    return 0;
}

static uint32_t big_endian(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* One frame: its header parsed, its payload (pointing into the reader's buffer). */
static int read_frame(reader_t *reader, jval *header, const unsigned char **payload, size_t *size)
{
    if (fill(reader, 12) < 0)
        return -1;
    const unsigned char *prefix = (const unsigned char *)reader->pending.data + reader->taken;
    uint32_t header_size = big_endian(prefix + 4), payload_size = big_endian(prefix + 8);
    if (memcmp(prefix, "PRB1", 4) != 0 || header_size > MAX_HEADER_BYTES ||
        (uint64_t)header_size + payload_size > MAX_REPLY)
        return -1;
    if (fill(reader, 12 + (size_t)header_size + payload_size) < 0)
        return -1;
    const char *start = reader->pending.data + reader->taken + 12;
    reader->taken += 12 + (size_t)header_size + payload_size;
    *payload = (const unsigned char *)start + header_size;
    *size = payload_size;
    return json_parse(start, header_size, header);
}

/* messages.parse_reply and check_result: `ok` true, the id ours, the result an object. */
static const jval *result_of(const jval *header, long long id)
{
    const jval *ok = json_get(header, "ok"), *reply_id = json_get(header, "id");
    const jval *result = json_get(header, "result");
    if (header->type != J_OBJ || !ok || ok->type != J_BOOL || !ok->num || !reply_id ||
        reply_id->type != J_INT || reply_id->num != id || !result || result->type != J_OBJ)
        return NULL;
    return result;
}

static int int_field(const jval *entry, const char *key, long long *value)
{
    const jval *field = json_get(entry, key);
    if (field == NULL || field->type != J_INT || field->num < 0)
        return -1;
    *value = field->num;
    return 0;
}

/* tables._region: an (offset, length) pair of the descriptor, inside the payload. */
static int region(const jval *entry, const char *offset_key, const char *length_key, size_t size,
                  long long *offset, long long *length)
{
    if (int_field(entry, offset_key, offset) < 0 || int_field(entry, length_key, length) < 0)
        return -1;
    return (unsigned long long)*offset + (unsigned long long)*length > size ? -1 : 0;
}

typedef struct {
    int kind; /* 'q' i64, 'b' bool, 'i' dict */
    const unsigned char *data, *valid;
    str_t *words;
    long long count;
} column_t;

static int decode_column(const jval *entry, const unsigned char *payload, size_t size, long long rows,
                         column_t *column)
{
    const jval *type = json_get(entry, "type"), *encoding = json_get(entry, "encoding");
    long long offset, length, width;
    int known = 0;
    /* protocol/tables.py ENCODING_OF_TYPE (front_tables.h COLUMN_TYPES): any other pair is
     * a table the Python CLI reads or refuses. */
    for (const struct column_type *known_type = COLUMN_TYPES;
         known_type->type && type && encoding && type->type == J_STR && encoding->type == J_STR; known_type++)
        known |= type->str.n == strlen(known_type->type) && !memcmp(type->str.p, known_type->type, type->str.n) &&
                 encoding->str.n == strlen(known_type->encoding) &&
                 !memcmp(encoding->str.p, known_type->encoding, encoding->str.n);
    if (!known)
        return -1;
    column->kind = encoding->str.p[0] == 'i' ? 'q' : encoding->str.p[0] == 'f' ? 'd'
                   : encoding->str.p[0] == 'b'                              ? 'b'
                                                                            : 'i';
    width = column->kind == 'b' ? 1 : column->kind == 'i' ? 4 : 8;
    if (region(entry, "offset", "length", size, &offset, &length) < 0 || length != rows * width)
        return -1;
    column->data = payload + offset;
    column->valid = NULL;
    if (json_get(entry, "valid_offset") != NULL) {
        if (region(entry, "valid_offset", "valid_length", size, &offset, &length) < 0 || length != rows)
            return -1;
        column->valid = payload + offset;
    }
    if (column->kind != 'i')
        return 0;
    long long count, words_offset, words_length, total = 0;
    if (int_field(entry, "dict_count", &count) < 0 || count > (long long)(size / 4) ||
        int_field(entry, "dict_offset", &offset) < 0 ||
        (unsigned long long)offset + 4ull * (unsigned long long)count > size ||
        region(entry, "dict_bytes_offset", "dict_bytes_length", size, &words_offset, &words_length) < 0)
        return -1;
    column->words = calloc((size_t)count + 1, sizeof(str_t));
    column->count = count;
    if (column->words == NULL)
        return -1;
    for (long long i = 0; i < count; i++) {
        uint32_t word;
        memcpy(&word, payload + offset + 4 * i, 4);
        if (total + word > words_length)
            return -1;
        column->words[i].p = (const char *)payload + words_offset + total;
        column->words[i].n = word;
        total += word;
        /* Python decodes a word with "replace": what is not UTF-8 is left to it. */
        if (!utf8_valid(column->words[i].p, column->words[i].n))
            return -1;
    }
    if (total != words_length)
        return -1;
    for (long long row = 0; row < rows; row++) { /* every code inside the dictionary */
        int32_t code;
        memcpy(&code, column->data + 4 * row, 4);
        if (code < -1 || code >= count)
            return -1;
    }
    return 0;
}

static int named(const jval *columns, const char *name, const unsigned char *payload, size_t size,
                 long long rows, int kind, column_t *column, int optional)
{
    int found = 0;
    for (size_t i = 0; i < columns->count; i++) {
        const jval *entry = &columns->items[i], *entry_name = json_get(entry, "name");
        if (entry->type != J_OBJ || entry_name == NULL || entry_name->type != J_STR)
            return -1;
        if (entry_name->str.n != strlen(name) || memcmp(entry_name->str.p, name, entry_name->str.n))
            continue;
        if (found++ || decode_column(entry, payload, size, rows, column) < 0 || column->kind != kind)
            return -1;
    }
    return found || optional ? found : -1;
}

/* Row `row` of an i64 column: 1 and *value, 0 for NULL. */
static int int_at(const column_t *column, long long row, long long *value)
{
    memcpy(value, column->data + 8 * row, 8);
    return column->valid == NULL || column->valid[row] != 0;
}

/* Row `row` of a dict column: 1 and the word, 0 for NULL, -1 for a code outside it. */
static int word_at(const column_t *column, long long row, str_t *word)
{
    int32_t code;
    memcpy(&code, column->data + 4 * row, 4);
    if (code < -1 || code >= column->count)
        return -1;
    if (code == -1)
        return 0;
    *word = column->words[code];
    return 1;
}

static int decode_rows(const jval *table, const unsigned char *payload, size_t size, answer_t *answer)
{
    const jval *byteorder = json_get(table, "byteorder"), *rows_field = json_get(table, "rows");
    const jval *name = json_get(table, "name"), *notes = json_get(table, "notes");
    const jval *columns = json_get(table, "columns");
    uint16_t probe = 1;
    int little = *(unsigned char *)&probe == 1;
    if (table->type != J_OBJ || !little || !rows_field || rows_field->type != J_INT || rows_field->num < 0 ||
        !name || name->type != J_STR || (notes && notes->type != J_NULL && notes->type != J_ARR) ||
        !columns || columns->type != J_ARR)
        return -1;
    if (byteorder && (byteorder->type != J_STR || byteorder->str.n != 6 || memcmp(byteorder->str.p, "little", 6)))
        return -1;
    long long rows = rows_field->num;
    if (rows > (long long)MAX_REPLY)
        return -1;
    column_t any;
    for (size_t i = 0; i < columns->count; i++) /* every column checked, as decode_table does */
        if (columns->items[i].type != J_OBJ || decode_column(&columns->items[i], payload, size, rows, &any) < 0)
            return -1;
    static const char *const ints[] = {"pid", "thread_id", "native_id", "depth", "lineno"};
    static const char *const texts[] = {"thread_name", "func", "file", "frame_type"};
    column_t int_columns[5], text_columns[4], is_main, locals;
    for (int i = 0; i < 5; i++)
        if (named(columns, ints[i], payload, size, rows, 'q', &int_columns[i], 0) < 0)
            return -1;
    for (int i = 0; i < 4; i++)
        if (named(columns, texts[i], payload, size, rows, 'i', &text_columns[i], 0) < 0)
            return -1;
    int has_locals = named(columns, "locals", payload, size, rows, 'i', &locals, 1);
    if (named(columns, "is_main", payload, size, rows, 'b', &is_main, 0) < 0 || has_locals < 0)
        return -1;
    answer->rows = calloc((size_t)rows + 1, sizeof(row_t));
    answer->count = (size_t)rows;
    if (answer->rows == NULL)
        return -1;
    for (long long i = 0; i < rows; i++) {
        row_t *row = &answer->rows[i];
        str_t ignored;
        /* NULLs where the renderer and thread_state expect values read differently in Python
         * ("None", or an error): the Python CLI shows those. */
        if (!int_at(&int_columns[0], i, &row->pid) || !int_at(&int_columns[1], i, &row->thread_id) ||
            !int_at(&int_columns[3], i, &row->depth))
            return -1;
        row->has_native_id = int_at(&int_columns[2], i, &row->native_id);
        row->has_lineno = int_at(&int_columns[4], i, &row->lineno);
        str_t *words[] = {&row->thread_name, &row->func, &row->file, &row->frame_type};
        for (int c = 0; c < 4; c++)
            if (word_at(&text_columns[c], i, words[c]) != 1)
                return -1;
        if (has_locals && word_at(&locals, i, &ignored) != 0)
            return -1;
        row->is_main = (signed char)is_main.data[i] > 0; /* -1 is NULL */
    }
    return 0;
}

int read_answer(reader_t *reader, answer_t *answer)
{
    jval hello_header, header;
    const unsigned char *payload;
    size_t size;
    if (read_frame(reader, &hello_header, &payload, &size) < 0)
        return -1;
    const jval *hello = result_of(&hello_header, 1);
    if (hello == NULL || read_frame(reader, &header, &payload, &size) < 0)
        return -1;
    const jval *result = result_of(&header, 2), *table = result ? json_get(result, "table") : NULL;
    const jval *pid = json_get(hello, "pid"), *version = json_get(hello, "python_version");
    const jval *argv = json_get(hello, "argv");
    if (table == NULL || (pid && pid->type != J_NULL && pid->type != J_INT) ||
        (version && version->type != J_NULL && version->type != J_STR) ||
        (argv && argv->type != J_NULL && argv->type != J_ARR))
        return -1;
    for (size_t i = 0; argv && argv->type == J_ARR && i < argv->count; i++)
        if (argv->items[i].type != J_STR)
            return -1;
    answer->hello = *hello;
    return decode_rows(table, payload, size, answer);
}
