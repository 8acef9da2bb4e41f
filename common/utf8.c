/* utf8.c - see utf8.h. */
#include "utf8.h"

/* One character, RFC 3629: no overlong forms, no surrogates, nothing above
 * U+10FFFF. The maximal ill-formed subpart is the longest prefix that could
 * still have begun a character (Unicode's "U+FFFD substitution of maximal
 * subparts"). */
size_t en_utf8_char(const unsigned char *s, size_t n, size_t *bad) {
    unsigned c = s[0];
    size_t need;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    *bad = 0;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0; /* no overlong forms */
        if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F; /* nothing above U+10FFFF */
    } else {
        *bad = 1;
        return 0;
    }
    for (size_t k = 1; k <= need; k++) {
        unsigned b = k < n ? s[k] : 0x100;
        unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *bad = k;
            return 0;
        }
    }
    return need + 1;
}

/* Offset of the first byte that is not well-formed UTF-8, or len. */
size_t en_utf8_first_invalid(const unsigned char *s, size_t len) {
    size_t i = 0, bad;
    while (i < len) {
        size_t n = en_utf8_char(s + i, len - i, &bad);
        if (!n) return i;
        i += n;
    }
    return len;
}
