/* utf8.c - see utf8.h. */
#include "utf8.h"

/* Offset of the first byte that is not well-formed UTF-8 (RFC 3629: no
 * overlong forms, no surrogates, nothing above U+10FFFF), or len. */
size_t en_utf8_first_invalid(const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t n;
        unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            n = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return i;
        }
        if (len - i < n || s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k < n; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += n;
    }
    return len;
}
