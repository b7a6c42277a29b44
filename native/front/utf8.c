/* Text as Python's str sees it: code points decoded from UTF-8, `inert` (cli/render's escaping
 * of what the job controls), str.strip's whitespace and str.splitlines' line breaks. The
 * tables come from the Python modules (front_tables.h, generated at build time). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "front.h"
#include "front_tables.h"

int buf_add(buf_t *buf, const void *data, size_t size)
{
    if (buf->len + size + 1 > buf->cap) {
        size_t wanted = buf->cap ? buf->cap : 256;
        while (wanted < buf->len + size + 1)
            wanted *= 2;
        char *more = realloc(buf->data, wanted);
        if (more == NULL)
            return -1;
        buf->data = more;
        buf->cap = wanted;
    }
    if (size)
        memcpy(buf->data + buf->len, data, size);
    buf->len += size;
    buf->data[buf->len] = '\0';
    return 0;
}

int buf_str(buf_t *buf, const char *text)
{
    return buf_add(buf, text, strlen(text));
}

int buf_int(buf_t *buf, long long value)
{
    char text[32];
    int size = snprintf(text, sizeof(text), "%lld", value);
    return buf_add(buf, text, (size_t)size);
}

/* The code point at p[*at]; 0 and *at moved past it, or -1 for bytes that are not UTF-8.
 * `surrogates`: accept the three-byte form of a lone surrogate (json.c keeps them so). */
int utf8_next(const char *text, size_t n, size_t *at, unsigned *code, int surrogates)
{
    const unsigned char *p = (const unsigned char *)text + *at;
    size_t left = n - *at;
    unsigned c = p[0];
    size_t size;
    unsigned value, least;
    if (c < 0x80) {
        *code = c;
        *at += 1;
        return 0;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        size = 2, value = c & 0x1F, least = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        size = 3, value = c & 0x0F, least = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        size = 4, value = c & 0x07, least = 0x10000;
    } else {
        return -1;
    }
    if (left < size)
        return -1;
    for (size_t i = 1; i < size; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return -1;
        value = (value << 6) | (p[i] & 0x3F);
    }
    if (value < least || value > 0x10FFFF)
        return -1;
    if (value >= 0xD800 && value <= 0xDFFF && !surrogates)
        return -1;
    *code = value;
    *at += size;
    return 0;
}

int utf8_valid(const char *p, size_t n)
{
    unsigned code;
    for (size_t at = 0; at < n;)
        if (utf8_next(p, n, &at, &code, 0) < 0)
            return 0;
    return 1;
}

static const char *escape_of(unsigned code)
{
    size_t low = 0, high = ESCAPE_COUNT;
    while (low < high) {
        size_t middle = (low + high) / 2;
        if (ESCAPES[middle].code == code)
            return ESCAPES[middle].text;
        if (ESCAPES[middle].code < code)
            low = middle + 1;
        else
            high = middle;
    }
    return NULL;
}

static int in_sorted(const unsigned *codes, size_t count, unsigned code)
{
    size_t low = 0, high = count;
    while (low < high) {
        size_t middle = (low + high) / 2;
        if (codes[middle] == code)
            return 1;
        if (codes[middle] < code)
            low = middle + 1;
        else
            high = middle;
    }
    return 0;
}

/* cli/render inert(): every character of the escape table made visible. A surrogate that the
 * table does not escape could not be written by Python's stdout either: -1. */
int inert(buf_t *out, str_t text)
{
    size_t at = 0, plain = 0;
    unsigned code;
    while (at < text.n) {
        size_t start = at;
        if (utf8_next(text.p, text.n, &at, &code, 1) < 0)
            return -1;
        const char *escape = escape_of(code);
        if (escape == NULL && code >= 0xD800 && code <= 0xDFFF)
            return -1;
        if (escape == NULL)
            continue;
        if (buf_add(out, text.p + plain, start - plain) < 0 || buf_str(out, escape) < 0)
            return -1;
        plain = at;
    }
    return buf_add(out, text.p + plain, text.n - plain);
}

int is_line_break(unsigned code)
{
    return in_sorted(LINE_BREAKS, LINE_BREAK_COUNT, code);
}

/* str.strip(): whitespace off both ends. `text` is valid UTF-8 (the caller checked). */
str_t strip_spaces(str_t text)
{
    size_t at = 0, start = 0, end = 0;
    unsigned code;
    int seen = 0;
    while (at < text.n) {
        size_t before = at;
        if (utf8_next(text.p, text.n, &at, &code, 0) < 0)
            break;
        if (!in_sorted(SPACES, SPACE_COUNT, code)) {
            if (!seen)
                start = before;
            seen = 1;
            end = at;
        }
    }
    str_t stripped = {text.p + start, seen ? end - start : 0};
    return stripped;
}
