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
/* The state as words (for a cache key): writes up to cap, returns the
 * count it needs. Equal keys mean equal states. */
size_t en_gmatch_key(const en_gmatch *m, uintptr_t *key, size_t cap);

/* ---- token masks (models/grammar_mask.c) ---- */

typedef struct en_gmask en_gmask;

/* A mask builder for grammar g over a vocabulary of n tokens, token i
 * being bytes[i][0..lens[i]) (lens[i] = 0: never allowed, e.g. special
 * tokens); stop[0..n_stop) are the ids allowed exactly when the matcher is
 * accepting (end of sequence). cache: how many states' masks to keep
 * (least recently used dropped; 0: none). The byte strings are copied. */
en_status en_gmask_create(const en_grammar *g, const char *const *bytes, const size_t *lens,
                          int32_t n, const int32_t *stop, int n_stop, int cache,
                          en_gmask **out, en_err *err);
/* Reference-counted: create gives one reference, retain another, destroy
 * drops one and frees on the last. */
en_gmask *en_gmask_retain(en_gmask *k);
void en_gmask_destroy(en_gmask *k);
/* The last reference's release destroys the grammar too. */
void en_gmask_own_grammar(en_gmask *k);
const en_grammar *en_gmask_grammar(const en_gmask *k);
/* allowed[0..n) := 1 for each token m can take next, else 0; returns how
 * many are allowed (0: a dead end, which a grammar without dead ends
 * never reaches), or -1 when out of memory. Thread-safe. */
int en_gmask_compute(en_gmask *k, const en_gmatch *m, uint8_t *allowed);
/* Cache figures since creation. */
void en_gmask_stats(const en_gmask *k, long *hits, long *misses);

struct en_tokenizer;
/* en_gmask_create over a tokenizer's vocabulary: each id's bytes
 * (en_tokenizer_token_bytes), none for special tokens, which only the stop
 * ids among them escape. */
en_status en_gmask_for_tokenizer(const en_grammar *g, const struct en_tokenizer *tok,
                                 const int32_t *stop, int n_stop, int cache, en_gmask **out,
                                 en_err *err);
/* Token id's bytes as the mask sees them (NULL and 0 outside the
 * vocabulary). */
const char *en_gmask_token(const en_gmask *k, int32_t id, size_t *len);
/* en_gmask_compute, then every refused token's logit := -inf; allowed is
 * scratch of the vocabulary's size. Returns the allowed count (or -1). */
int en_gmask_apply(en_gmask *k, const en_gmatch *m, float *logits, uint8_t *allowed);

#endif
