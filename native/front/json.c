/* A strict JSON reader for the headers of an agent's replies.
 *
 * The agent may be a hostile job: depth, sizes and number ranges are bounded, and anything
 * Python's json would read differently (NaN, Infinity, integers beyond 64 bits, text around
 * the value) is refused, which sends the command to the Python CLI. */
#include <stdlib.h>
#include <string.h>

#include "front.h"

#define MAX_DEPTH 64

typedef struct {
    const char *p;
    size_t n, at;
    int depth;
} reader_t;

static void skip_space(reader_t *r)
{
    while (r->at < r->n && (r->p[r->at] == ' ' || r->p[r->at] == '\t' || r->p[r->at] == '\n' ||
                            r->p[r->at] == '\r'))
        r->at++;
}

static int literal(reader_t *r, const char *word)
{
    size_t size = strlen(word);
    if (r->n - r->at < size || memcmp(r->p + r->at, word, size) != 0)
        return -1;
    r->at += size;
    return 0;
}

static int hex4(reader_t *r, unsigned *value)
{
    *value = 0;
    if (r->n - r->at < 4)
        return -1;
    for (int i = 0; i < 4; i++) {
        char c = r->p[r->at++];
        unsigned digit;
        if (c >= '0' && c <= '9')
            digit = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            digit = (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            digit = (unsigned)(c - 'A' + 10);
        else
            return -1;
        *value = *value * 16 + digit;
    }
    return 0;
}

static int put_code(buf_t *buf, unsigned code)
{
    unsigned char bytes[4];
    size_t size;
    if (code < 0x80) {
        bytes[0] = (unsigned char)code;
        size = 1;
    } else if (code < 0x800) {
        bytes[0] = (unsigned char)(0xC0 | (code >> 6));
        bytes[1] = (unsigned char)(0x80 | (code & 0x3F));
        size = 2;
    } else if (code < 0x10000) { /* lone surrogates too: their three-byte form */
        bytes[0] = (unsigned char)(0xE0 | (code >> 12));
        bytes[1] = (unsigned char)(0x80 | ((code >> 6) & 0x3F));
        bytes[2] = (unsigned char)(0x80 | (code & 0x3F));
        size = 3;
    } else {
        bytes[0] = (unsigned char)(0xF0 | (code >> 18));
        bytes[1] = (unsigned char)(0x80 | ((code >> 12) & 0x3F));
        bytes[2] = (unsigned char)(0x80 | ((code >> 6) & 0x3F));
        bytes[3] = (unsigned char)(0x80 | (code & 0x3F));
        size = 4;
    }
    return buf_add(buf, bytes, size);
}

static int string(reader_t *r, str_t *out)
{
    buf_t buf = {0};
    r->at++; /* the opening quote */
    for (;;) {
        if (r->at >= r->n)
            return -1;
        unsigned char c = (unsigned char)r->p[r->at];
        if (c == '"') {
            r->at++;
            break;
        }
        if (c < 0x20) /* strict: control characters must be escaped */
            return -1;
        if (c != '\\') {
            size_t start = r->at;
            while (r->at < r->n && r->p[r->at] != '"' && r->p[r->at] != '\\' &&
                   (unsigned char)r->p[r->at] >= 0x20)
                r->at++;
            if (buf_add(&buf, r->p + start, r->at - start) < 0)
                return -1;
            continue;
        }
        if (++r->at >= r->n)
            return -1;
        char escape = r->p[r->at++];
        const char *simple = strchr("\"\\/bfnrt", escape);
        if (escape != 'u') {
            static const char plain[] = "\"\\/\b\f\n\r\t";
            if (escape == '\0' || simple == NULL || buf_add(&buf, &plain[simple - "\"\\/bfnrt"], 1) < 0)
                return -1;
            continue;
        }
        unsigned code, low;
        if (hex4(r, &code) < 0)
            return -1;
        /* A high surrogate followed by an escaped low one is one character (as Python's json). */
        if (code >= 0xD800 && code <= 0xDBFF && r->n - r->at >= 6 && r->p[r->at] == '\\' &&
            r->p[r->at + 1] == 'u') {
            size_t back = r->at;
            r->at += 2;
            if (hex4(r, &low) < 0)
                return -1;
            if (low >= 0xDC00 && low <= 0xDFFF)
                code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
            else
                r->at = back;
        }
        if (put_code(&buf, code) < 0)
            return -1;
    }
    out->p = buf.data ? buf.data : "";
    out->n = buf.len;
    return 0;
}

static int number(reader_t *r, jval *out)
{
    size_t start = r->at;
    int negative = 0;
    if (r->p[r->at] == '-') {
        negative = 1;
        r->at++;
    }
    if (r->at >= r->n || r->p[r->at] < '0' || r->p[r->at] > '9')
        return -1;
    unsigned long long value = 0;
    if (r->p[r->at] == '0') {
        r->at++;
    } else {
        while (r->at < r->n && r->p[r->at] >= '0' && r->p[r->at] <= '9') {
            if (value > (unsigned long long)INT64_MAX / 10)
                return -1;
            value = value * 10 + (unsigned)(r->p[r->at++] - '0');
        }
    }
    if (value > (unsigned long long)INT64_MAX)
        return -1;
    int fraction = 0;
    if (r->at < r->n && r->p[r->at] == '.') {
        fraction = 1;
        r->at++;
        if (r->at >= r->n || r->p[r->at] < '0' || r->p[r->at] > '9')
            return -1;
        while (r->at < r->n && r->p[r->at] >= '0' && r->p[r->at] <= '9')
            r->at++;
    }
    if (r->at < r->n && (r->p[r->at] == 'e' || r->p[r->at] == 'E')) {
        fraction = 1;
        r->at++;
        if (r->at < r->n && (r->p[r->at] == '+' || r->p[r->at] == '-'))
            r->at++;
        if (r->at >= r->n || r->p[r->at] < '0' || r->p[r->at] > '9')
            return -1;
        while (r->at < r->n && r->p[r->at] >= '0' && r->p[r->at] <= '9')
            r->at++;
    }
    (void)start;
    out->type = fraction ? J_FLOAT : J_INT;
    out->num = negative ? -(long long)value : (long long)value;
    return 0;
}

static int value(reader_t *r, jval *out);

static int grow(jval **items, str_t **keys, size_t count, size_t *cap)
{
    if (count < *cap)
        return 0;
    size_t wanted = *cap ? *cap * 2 : 8;
    jval *more = realloc(*items, wanted * sizeof(jval));
    if (more == NULL)
        return -1;
    *items = more;
    if (keys != NULL) {
        str_t *names = realloc(*keys, wanted * sizeof(str_t));
        if (names == NULL)
            return -1;
        *keys = names;
    }
    *cap = wanted;
    return 0;
}

static int container(reader_t *r, jval *out, int object)
{
    char close = object ? '}' : ']';
    size_t cap = 0;
    if (++r->depth > MAX_DEPTH)
        return -1;
    out->type = object ? J_OBJ : J_ARR;
    r->at++;
    skip_space(r);
    if (r->at < r->n && r->p[r->at] == close) {
        r->at++;
        r->depth--;
        return 0;
    }
    for (;;) {
        if (grow(&out->items, object ? &out->keys : NULL, out->count, &cap) < 0)
            return -1;
        skip_space(r);
        if (object) {
            if (r->at >= r->n || r->p[r->at] != '"' || string(r, &out->keys[out->count]) < 0)
                return -1;
            skip_space(r);
            if (r->at >= r->n || r->p[r->at++] != ':')
                return -1;
            skip_space(r);
        }
        memset(&out->items[out->count], 0, sizeof(jval));
        if (value(r, &out->items[out->count]) < 0)
            return -1;
        out->count++;
        skip_space(r);
        if (r->at >= r->n)
            return -1;
        char c = r->p[r->at++];
        if (c == close)
            break;
        if (c != ',')
            return -1;
    }
    r->depth--;
    return 0;
}

static int value(reader_t *r, jval *out)
{
    if (r->at >= r->n)
        return -1;
    switch (r->p[r->at]) {
    case '{':
        return container(r, out, 1);
    case '[':
        return container(r, out, 0);
    case '"':
        out->type = J_STR;
        return string(r, &out->str);
    case 't':
        out->type = J_BOOL;
        out->num = 1;
        return literal(r, "true");
    case 'f':
        out->type = J_BOOL;
        return literal(r, "false");
    case 'n':
        out->type = J_NULL;
        return literal(r, "null");
    default:
        return number(r, out);
    }
}

int json_parse(const char *text, size_t size, jval *out)
{
    reader_t r = {text, size, 0, 0};
    memset(out, 0, sizeof(*out));
    if (!utf8_valid(text, size))
        return -1;
    skip_space(&r);
    if (value(&r, out) < 0)
        return -1;
    skip_space(&r);
    return r.at == r.n ? 0 : -1;
}

const jval *json_get(const jval *object, const char *key)
{
    size_t size = strlen(key);
    if (object == NULL || object->type != J_OBJ)
        return NULL;
    for (size_t i = object->count; i-- > 0;)
        if (object->keys[i].n == size && memcmp(object->keys[i].p, key, size) == 0)
            return &object->items[i];
    return NULL;
}
