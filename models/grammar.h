/*
 * grammar.h - context-free grammars for constrained sampling (issue 16):
 * a grammar text (docs/grammar.md, a GBNF-like format) parsed into rules of
 * elements, and a matcher that follows every way the bytes fed so far can
 * continue (a set of pushdown stacks, one per way, without backtracking).
 * The sampler will ask it which tokens a state accepts; JSON Schema and
 * regular expressions will compile to it.
 *
 * Matching is over Unicode code points decoded from UTF-8; a feed may stop
 * inside a code point (a token's bytes often do), and the matcher then keeps
 * only the ways on which some completion of that code point can go on.
 * Invalid UTF-8 is never accepted.
 */
#ifndef EN_GRAMMAR_H
#define EN_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"

/* One element of a rule. A rule is alternatives of sequences: each
 * sequence ends at EN_GE_ALT (another alternative follows) or EN_GE_END
 * (the rule's last). A character class is a run: EN_GE_CHAR or
 * EN_GE_NCHAR (negated) with its first code point, then any number of
 * EN_GE_HI (the previous code point is the low end of a range up to this
 * one) and EN_GE_ALT_CHAR (another code point of the class). */
typedef enum en_gelem_type {
    EN_GE_END = 0,
    EN_GE_ALT,
    EN_GE_REF,      /* v: a rule id */
    EN_GE_CHAR,     /* v: a code point, starts a class */
    EN_GE_NCHAR,    /* v: a code point, starts a negated class */
    EN_GE_HI,       /* v: the high end of a range */
    EN_GE_ALT_CHAR, /* v: another code point of the class */
    EN_GE_ANY       /* '.': any code point */
} en_gelem_type;

typedef struct en_gelem {
    uint32_t type; /* en_gelem_type */
    uint32_t v;
} en_gelem;

typedef struct en_grammar en_grammar;

/* Limits that keep hostile grammars bounded. */
#define EN_GRAMMAR_MAX_REPEAT 1000      /* m and n of {m,n} */
#define EN_GRAMMAR_MAX_ELEMS (1 << 20)  /* elements over all rules */
#define EN_GRAMMAR_MAX_STACKS 1024      /* ways a matcher follows at once */
#define EN_GRAMMAR_MAX_DEPTH 2048       /* positions on one stack */

/* Parse a grammar text of len bytes; root names the start rule (NULL:
 * "root"). EN_ERR_ARG with "line L: ..." for a syntax error, an undefined
 * or twice-defined rule, a left-recursive rule, a missing root, or a
 * grammar past the limits above. */
en_status en_grammar_parse(const char *text, size_t len, const char *root, en_grammar **out,
                           en_err *err);
void en_grammar_destroy(en_grammar *g);

int en_grammar_n_rules(const en_grammar *g);
int en_grammar_root(const en_grammar *g);
/* Rule id's elements (alternatives, EN_GE_END last) and its name
 * (synthetic rules made for groups and repetitions are named
 * "PARENT.N", a name no rule of the text can have). */
const en_gelem *en_grammar_rule(const en_grammar *g, int id);
const char *en_grammar_rule_name(const en_grammar *g, int id);

/* ---- matching (models/grammar_match.c) ---- */

typedef struct en_gmatch en_gmatch;

/* A matcher at the start of the grammar's root rule. The grammar must
 * outlive it. */
en_status en_gmatch_create(const en_grammar *g, en_gmatch **out, en_err *err);
void en_gmatch_destroy(en_gmatch *m);
/* dst becomes a copy of src (both of one grammar). */
en_status en_gmatch_copy(en_gmatch *dst, const en_gmatch *src);

/* Feed n bytes. 1: the bytes are a possible continuation, and m has
 * advanced over them. 0: they are not (a byte no way accepts, invalid
 * UTF-8, or more ways or deeper stacks than the limits), and m is left as
 * it was. */
int en_gmatch_feed(en_gmatch *m, const uint8_t *bytes, size_t n);
/* 1 when what was fed is a whole sentence of the grammar (no code point
 * left half-fed). */
int en_gmatch_accepting(const en_gmatch *m);
/* 1 when nothing more can be fed: accepting and no way goes on. */
int en_gmatch_done(const en_gmatch *m);
int en_gmatch_n_stacks(const en_gmatch *m);
/* dst := src fed the one byte b (1), or 0 when b is refused (dst is then
 * unspecified). Cheaper than copy + feed: the mask's walk over the
 * vocabulary calls it once per trie edge. dst must be a matcher of the
 * same grammar (its buffers are reused). */
int en_gmatch_step(const en_gmatch *src, uint8_t b, en_gmatch *dst);
/* UTF-8 as the matcher decodes it: a half-fed code point (val: its bits
 * so far, need: bytes still to come, 0 for none, len: its length) fed byte
 * b. 1: b completes code point *lo (= *hi; need is then 0). 2: more bytes
 * are to come (val, need, len updated), and the code point can still be
 * any of [*lo, *hi]. 0: invalid (an overlong form, a surrogate, past
 * U+10FFFF, a byte out of place); nothing is changed. */
int en_gmatch_utf8(uint32_t *val, int *need, int *len, uint8_t b, uint32_t *lo,
                   uint32_t *hi);
/* When no code point is half-fed and each way's next class holds all of
 * U+0080..U+10FFFF or none of it (inside a JSON string: all), every code
 * point of two or more bytes takes m to one same state: 1 when some way
 * takes them, 0 when none does. -1 otherwise. */
int en_gmatch_wide(const en_gmatch *m);
/* The state as words (for a cache key): writes up to cap, returns the
 * count it needs. Equal keys mean equal states. The words are the
 * half-fed code point's value, bytes to come and length, the number of
 * ways, then each way's length and its positions (const en_gelem *, into
 * the grammar's rules), bottom first. */
size_t en_gmatch_key(const en_gmatch *m, uintptr_t *key, size_t cap);
/* m := the state whose key (en_gmatch_key of a matcher of m's grammar) is
 * key[0..n): the mask's walk keeps the states it has met as keys. EN_ERR_ARG
 * for a key of the wrong shape (m is then unspecified), EN_ERR_NOMEM. */
en_status en_gmatch_set_key(en_gmatch *m, const uintptr_t *key, size_t n);

/* ---- token masks (models/grammar_mask.c) ---- */

/* A vocabulary as the masks see it: token i is bytes[i][0..lens[i])
 * (lens[i] = 0: never allowed, e.g. special tokens), copied and sorted
 * once. It depends on the tokenizer only, so one serves every grammar's
 * masks (en_gmask_create_vocab): a server builds it once, not per request.
 * Immutable once made, so any thread may use it. Reference-counted as
 * en_gmask. EN_ERR_ARG for n < 0 or a token over 4096 bytes. */
typedef struct en_gvocab en_gvocab;
en_status en_gvocab_create(const char *const *bytes, const size_t *lens, int32_t n,
                           en_gvocab **out, en_err *err);
en_gvocab *en_gvocab_retain(en_gvocab *v);
void en_gvocab_destroy(en_gvocab *v);
int32_t en_gvocab_n(const en_gvocab *v);

typedef struct en_gmask en_gmask;

/* A mask builder for grammar g over a vocabulary of n tokens, token i
 * being bytes[i][0..lens[i]) (lens[i] = 0: never allowed, e.g. special
 * tokens); stop[0..n_stop) are the ids allowed exactly when the matcher is
 * accepting (end of sequence). cache: how many states' masks to keep
 * (least recently used dropped; 0: none). The byte strings are copied. */
en_status en_gmask_create(const en_grammar *g, const char *const *bytes, const size_t *lens,
                          int32_t n, const int32_t *stop, int n_stop, int cache,
                          en_gmask **out, en_err *err);
/* en_gmask_create over a shared vocabulary: the mask takes a reference of
 * v (en_gvocab_retain), so the caller may drop its own at once. The masks
 * are those en_gmask_create gives for the same tokens. */
en_status en_gmask_create_vocab(const en_grammar *g, en_gvocab *v, const int32_t *stop,
                                int n_stop, int cache, en_gmask **out, en_err *err);
/* Reference-counted: create gives one reference, retain another, destroy
 * drops one and frees on the last. */
en_gmask *en_gmask_retain(en_gmask *k);
void en_gmask_destroy(en_gmask *k);
/* The last reference's release destroys the grammar too. */
void en_gmask_own_grammar(en_gmask *k);
const en_grammar *en_gmask_grammar(const en_gmask *k);
/* allowed[0..n) := 1 for each token m can take next, else 0; returns how
 * many are allowed (0: a dead end, which a grammar without dead ends
 * never reaches), or -1 when out of memory. Thread-safe: concurrent calls
 * share the cache and each take a walker of their own from a pool. */
int en_gmask_compute(en_gmask *k, const en_gmatch *m, uint8_t *allowed);
/* Let one mask's walks run on up to n threads (OpenMP; default 1): the
 * vocabulary's length classes that are not cached are walked in parallel,
 * giving the masks one thread gives. For a caller whose other threads idle
 * while it masks (energon generate: the backend's); inside a parallel
 * region of the caller's (the server's per-sequence sampling) it stays
 * one thread. Call before sharing k. */
void en_gmask_set_threads(en_gmask *k, int n);
/* Cache figures since creation: masks wholly from the cache (hits), and
 * masks for which some length class of the vocabulary was walked. */
void en_gmask_stats(const en_gmask *k, long *hits, long *misses);

struct en_tokenizer;
/* en_gmask_create over a tokenizer's vocabulary: each id's bytes
 * (en_tokenizer_token_bytes), none for special tokens, which only the stop
 * ids among them escape. */
en_status en_gmask_for_tokenizer(const en_grammar *g, const struct en_tokenizer *tok,
                                 const int32_t *stop, int n_stop, int cache, en_gmask **out,
                                 en_err *err);
/* The shared vocabulary of a tokenizer, as en_gmask_for_tokenizer sees it
 * (build it once and pass it to en_gmask_create_vocab per grammar). */
en_status en_gvocab_for_tokenizer(const struct en_tokenizer *tok, en_gvocab **out,
                                  en_err *err);
/* Token id's bytes as the mask sees them (NULL and 0 outside the
 * vocabulary). */
const char *en_gmask_token(const en_gmask *k, int32_t id, size_t *len);
/* en_gmask_compute, then every refused token's logit := -inf; allowed is
 * scratch of the vocabulary's size. Returns the allowed count (or -1). */
int en_gmask_apply(en_gmask *k, const en_gmatch *m, float *logits, uint8_t *allowed);

#endif
