/*
 * utf8.h - UTF-8 validation shared by the tokenizer (prompts) and the data
 * pipeline (training files), so both accept and reject the same bytes.
 */
#ifndef EN_UTF8_H
#define EN_UTF8_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Offset of the first byte that is not part of well-formed UTF-8 (RFC 3629:
 * no overlong forms, no surrogates, nothing above U+10FFFF), or len when the
 * whole buffer is valid. */
size_t en_utf8_first_invalid(const unsigned char *s, size_t len);

/* The length (1..4) of the well-formed character at s[0..n) (n >= 1), or 0
 * when it is not one; then *bad is the length of the maximal ill-formed
 * subpart there (what a lossy decoder replaces with one U+FFFD, as Rust's
 * String::from_utf8_lossy and Python do). */
size_t en_utf8_char(const unsigned char *s, size_t n, size_t *bad);

#ifdef __cplusplus
}
#endif

#endif
