/*
 * hf_json.c - reads tokenizer.json (jansson, through common/json.h so that
 * syntax errors name file:line:col) into the structures of hf_impl.h: the
 * BPE model with its vocabulary and merge tables, the normalizer,
 * pre-tokenizer, decoder and post-processor trees, and the added tokens.
 * Anything this implementation does not support (another model type, an
 * unknown component type, dropout, an option value it does not know) is an
 * EN_ERR_FORMAT error naming the file and the JSON field, e.g.
 *   tokenizer.json: pre_tokenizer.pretokenizers[1].type: unknown pre-tokenizer "Foo"
 * never a silent approximation. Used by hf_tokenizer.c.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../common/json.h"
#include "hf_impl.h"

#define HF_MAX_ID (1 << 24) /* ids above this are refused (largest real: ~262k) */

typedef struct ld {
    const char *path;
    en_err *err;
} ld;

__attribute__((format(printf, 3, 4))) static en_status bad(ld *c, const char *field,
                                                           const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return EN_ERR(c->err, EN_ERR_FORMAT, "%s: %s: %s", c->path, field, msg);
}

/* "where.key" (or "key" at the top) into buf. */
static const char *fld(char *buf, size_t n, const char *where, const char *key) {
    snprintf(buf, n, "%s%s%s", where, *where ? "." : "", key);
    return buf;
}

static en_status get_bool(ld *c, const json_t *o, const char *where, const char *key, int dflt,
                          int *out) {
    char f[256];
    const json_t *v = json_object_get(o, key);
    *out = dflt;
    if (!v || json_is_null(v)) return EN_OK;
    if (!json_is_boolean(v)) return bad(c, fld(f, sizeof f, where, key), "expected true or false");
    *out = json_is_true(v);
    return EN_OK;
}

/* A string field; required=0 lets it be absent or null (*s = NULL). */
static en_status get_str(ld *c, const json_t *o, const char *where, const char *key, int required,
                         const char **s, size_t *n) {
    char f[256];
    const json_t *v = json_object_get(o, key);
    *s = NULL;
    if (n) *n = 0;
    if (!v || json_is_null(v)) {
        if (required) return bad(c, fld(f, sizeof f, where, key), "missing string field");
        return EN_OK;
    }
    if (!json_is_string(v)) return bad(c, fld(f, sizeof f, where, key), "expected a string");
    *s = json_string_value(v);
    if (n) *n = json_string_length(v);
    return EN_OK;
}

static en_status get_int(ld *c, const json_t *o, const char *where, const char *key, int64_t dflt,
                         int64_t lo, int64_t hi, int64_t *out) {
    char f[256];
    const json_t *v = json_object_get(o, key);
    *out = dflt;
    if (!v || json_is_null(v)) return EN_OK;
    if (!en_json_int(v, out) || *out < lo || *out > hi)
        return bad(c, fld(f, sizeof f, where, key), "expected an integer in [%lld, %lld]",
                   (long long)lo, (long long)hi);
    return EN_OK;
}

static en_status get_type(ld *c, const json_t *o, const char *where, const char **type) {
    if (!json_is_object(o)) return bad(c, where, "expected an object");
    return get_str(c, o, where, "type", 1, type, NULL);
}

/* {"String": s} or {"Regex": r} -> compiled regex */
static en_status get_pattern(ld *c, const json_t *o, const char *where, regex_t **re,
                             const char **lit, size_t *lit_n) {
    char f[256], f2[300];
    const json_t *p = json_object_get(o, "pattern");
    fld(f, sizeof f, where, "pattern");
    if (lit) *lit = NULL;
    if (!json_is_object(p)) return bad(c, f, "expected {\"String\": ...} or {\"Regex\": ...}");
    const json_t *s = json_object_get(p, "String"), *r = json_object_get(p, "Regex");
    const json_t *v = s ? s : r;
    snprintf(f2, sizeof f2, "%s.%s", f, s ? "String" : "Regex");
    if (!v) return bad(c, f, "expected {\"String\": ...} or {\"Regex\": ...}");
    if (!json_is_string(v)) return bad(c, f2, "expected a string");
    if (s && lit) {
        *lit = json_string_value(s);
        *lit_n = json_string_length(s);
    }
    return hf_regex_compile(json_string_value(v), json_string_length(v), s != NULL, re, c->path,
                            f2, c->err);
}

static en_status get_array(ld *c, const json_t *o, const char *where, const char *key,
                           const json_t **arr) {
    char f[256];
    *arr = json_object_get(o, key);
    if (!json_is_array(*arr)) return bad(c, fld(f, sizeof f, where, key), "expected an array");
    return EN_OK;
}

/* One char string (Metaspace replacement, Strip content). */
static en_status get_char(ld *c, const json_t *o, const char *where, const char *key,
                          int32_t *cp) {
    char f[256];
    const char *s;
    size_t n;
    EN_TRY(get_str(c, o, where, key, 1, &s, &n));
    int l = n ? hf_utf8_len((unsigned char)s[0]) : 0;
    if (n == 0 || (size_t)l != n) return bad(c, fld(f, sizeof f, where, key), "expected one character");
    *cp = hf_utf8_decode(s, &l);
    return EN_OK;
}

static en_status get_prepend_scheme(ld *c, const json_t *o, const char *where, int *scheme) {
    char f[256];
    const char *s;
    EN_TRY(get_str(c, o, where, "prepend_scheme", 0, &s, NULL));
    if (!s) { /* older files: add_prefix_space */
        int aps;
        EN_TRY(get_bool(c, o, where, "add_prefix_space", 1, &aps));
        *scheme = aps ? HF_PREPEND_ALWAYS : HF_PREPEND_NEVER;
        return EN_OK;
    }
    if (!strcmp(s, "always")) *scheme = HF_PREPEND_ALWAYS;
    else if (!strcmp(s, "first")) *scheme = HF_PREPEND_FIRST;
    else if (!strcmp(s, "never")) *scheme = HF_PREPEND_NEVER;
    else return bad(c, fld(f, sizeof f, where, "prepend_scheme"), "unknown value \"%s\"", s);
    return EN_OK;
}

/* ---- normalizers ---- */

static en_status load_norm(ld *c, const json_t *j, const char *where, hf_norm *nm) {
    static const char *simple[] = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase"};
    const char *type, *s;
    size_t n;
    char f[256];
    EN_TRY(get_type(c, j, where, &type));
    for (int i = 0; i < 5; i++)
        if (!strcmp(type, simple[i])) {
            nm->type = (hf_norm_type)(HF_NORM_NFC + i);
            return EN_OK;
        }
    if (!strcmp(type, "Prepend") || !strcmp(type, "Replace")) {
        int rep = type[0] == 'R';
        nm->type = rep ? HF_NORM_REPLACE : HF_NORM_PREPEND;
        EN_TRY(get_str(c, j, where, rep ? "content" : "prepend", 1, &s, &n));
        nm->str = en_strndup(s, n);
        nm->str_len = n;
        if (!nm->str) return EN_ERR(c->err, EN_ERR_NOMEM, "%s: out of memory", c->path);
        return rep ? get_pattern(c, j, where, &nm->re, NULL, NULL) : EN_OK;
    }
    if (!strcmp(type, "Strip")) {
        nm->type = HF_NORM_STRIP;
        EN_TRY(get_bool(c, j, where, "strip_left", 1, &nm->left));
        return get_bool(c, j, where, "strip_right", 1, &nm->right);
    }
    if (!strcmp(type, "Sequence")) {
        const json_t *arr;
        nm->type = HF_NORM_SEQUENCE;
        EN_TRY(get_array(c, j, where, "normalizers", &arr));
        nm->kids = en_calloc(json_array_size(arr) + 1, sizeof *nm->kids);
        if (!nm->kids) return EN_ERR(c->err, EN_ERR_NOMEM, "%s: out of memory", c->path);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            snprintf(f, sizeof f, "%s.normalizers[%zu]", where, i);
            nm->n_kids = (int)i + 1;
            EN_TRY(load_norm(c, json_array_get(arr, i), f, &nm->kids[i]));
        }
        return EN_OK;
    }
    return bad(c, fld(f, sizeof f, where, "type"), "unknown normalizer \"%s\"", type);
}

/* ---- pre-tokenizers ---- */

static const char *GPT2_RE =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static en_status get_behavior(ld *c, const json_t *o, const char *where, hf_behavior dflt,
                              hf_behavior *b) {
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                  "Contiguous"};
    const char *s;
    char f[256];
    EN_TRY(get_str(c, o, where, "behavior", 0, &s, NULL));
    *b = dflt;
    if (!s) return EN_OK;
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, names[i])) {
            *b = (hf_behavior)i;
            return EN_OK;
        }
    return bad(c, fld(f, sizeof f, where, "behavior"), "unknown split behavior \"%s\"", s);
}

static en_status load_bytelevel_pt(ld *c, const json_t *j, const char *where, hf_pretok *pt) {
    char f[256];
    int32_t tab[256];
    pt->type = HF_PT_BYTELEVEL;
    EN_TRY(get_bool(c, j, where, "add_prefix_space", 1, &pt->add_prefix_space));
    EN_TRY(get_bool(c, j, where, "use_regex", 1, &pt->use_regex));
    hf_bytelevel_table(tab);
    for (int b = 0; b < 256; b++) pt->bl_n[b] = (uint8_t)hf_utf8_encode(tab[b], pt->bl_enc[b]);
    if (!pt->use_regex) return EN_OK;
    return hf_regex_compile(GPT2_RE, strlen(GPT2_RE), 0, &pt->re, c->path,
                            fld(f, sizeof f, where, "use_regex"), c->err);
}

static en_status load_pretok(ld *c, const json_t *j, const char *where, hf_pretok *pt) {
    const char *type;
    char f[256];
    EN_TRY(get_type(c, j, where, &type));
    if (!strcmp(type, "ByteLevel")) return load_bytelevel_pt(c, j, where, pt);
    if (!strcmp(type, "Split")) {
        pt->type = HF_PT_SPLIT;
        EN_TRY(get_behavior(c, j, where, HF_SPLIT_ISOLATED, &pt->behavior));
        if (!json_object_get(j, "behavior"))
            return bad(c, fld(f, sizeof f, where, "behavior"), "missing field");
        EN_TRY(get_bool(c, j, where, "invert", 0, &pt->invert));
        return get_pattern(c, j, where, &pt->re, NULL, NULL);
    }
    if (!strcmp(type, "Digits")) {
        pt->type = HF_PT_DIGITS;
        return get_bool(c, j, where, "individual_digits", 0, &pt->individual_digits);
    }
    if (!strcmp(type, "Metaspace")) {
        pt->type = HF_PT_METASPACE;
        EN_TRY(get_char(c, j, where, "replacement", &pt->repl_cp));
        pt->repl_len = hf_utf8_encode(pt->repl_cp, pt->repl);
        EN_TRY(get_prepend_scheme(c, j, where, &pt->prepend_scheme));
        return get_bool(c, j, where, "split", 1, &pt->split);
    }
    if (!strcmp(type, "Whitespace")) {
        pt->type = HF_PT_WHITESPACE;
        /* Rust regex's \\w also holds Join_Control (ZWNJ, ZWJ); Oniguruma's does not */
        static const char ws_re[] = "[\\w\\x{200C}\\x{200D}]+|[^\\w\\s\\x{200C}\\x{200D}]+";
        return hf_regex_compile(ws_re, strlen(ws_re), 0, &pt->re, c->path, where, c->err);
    }
    if (!strcmp(type, "WhitespaceSplit")) {
        pt->type = HF_PT_WHITESPACE_SPLIT;
        return EN_OK;
    }
    if (!strcmp(type, "Punctuation")) {
        pt->type = HF_PT_PUNCTUATION;
        return get_behavior(c, j, where, HF_SPLIT_ISOLATED, &pt->behavior);
    }
    if (!strcmp(type, "Sequence")) {
        const json_t *arr;
        pt->type = HF_PT_SEQUENCE;
        EN_TRY(get_array(c, j, where, "pretokenizers", &arr));
        pt->kids = en_calloc(json_array_size(arr) + 1, sizeof *pt->kids);
        if (!pt->kids) return EN_ERR(c->err, EN_ERR_NOMEM, "%s: out of memory", c->path);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            snprintf(f, sizeof f, "%s.pretokenizers[%zu]", where, i);
            pt->n_kids = (int)i + 1;
            EN_TRY(load_pretok(c, json_array_get(arr, i), f, &pt->kids[i]));
        }
        return EN_OK;
    }
    return bad(c, fld(f, sizeof f, where, "type"), "unknown pre-tokenizer \"%s\"", type);
}

/* ---- decoders ---- */

static en_status load_dec(en_hf_tokenizer *t, ld *c, const json_t *j, const char *where,
                          hf_dec *d) {
    const char *type, *s;
    size_t n;
    char f[256];
    int64_t v;
    EN_TRY(get_type(c, j, where, &type));
    if (!strcmp(type, "ByteLevel")) {
        d->type = HF_DEC_BYTELEVEL;
        t->tb_bytelevel = 1;
    } else if (!strcmp(type, "ByteFallback")) {
        d->type = HF_DEC_BYTEFALLBACK;
        t->tb_bytefallback = 1;
    } else if (!strcmp(type, "Fuse")) {
        d->type = HF_DEC_FUSE;
    } else if (!strcmp(type, "Metaspace")) {
        d->type = HF_DEC_METASPACE;
        EN_TRY(get_char(c, j, where, "replacement", &d->cp));
        EN_TRY(get_prepend_scheme(c, j, where, &d->prepend_scheme));
        t->tb_space_cp = d->cp;
    } else if (!strcmp(type, "Strip")) {
        d->type = HF_DEC_STRIP;
        EN_TRY(get_char(c, j, where, "content", &d->cp));
        EN_TRY(get_int(c, j, where, "start", 0, 0, 1 << 20, &v));
        d->start = (int)v;
        EN_TRY(get_int(c, j, where, "stop", 0, 0, 1 << 20, &v));
        d->stop = (int)v;
    } else if (!strcmp(type, "Replace")) {
        const char *lit;
        size_t lit_n;
        d->type = HF_DEC_REPLACE;
        EN_TRY(get_str(c, j, where, "content", 1, &s, &n));
        d->content = en_strndup(s, n);
        d->content_len = n;
        if (!d->content) return EN_ERR(c->err, EN_ERR_NOMEM, "%s: out of memory", c->path);
        EN_TRY(get_pattern(c, j, where, &d->re, &lit, &lit_n));
        int l = lit_n ? hf_utf8_len((unsigned char)lit[0]) : 0;
        if (lit && (size_t)l == lit_n && n == 1 && s[0] == ' ')
            t->tb_space_cp = hf_utf8_decode(lit, &l); /* "▁" -> " " */
    } else if (!strcmp(type, "Sequence")) {
        const json_t *arr;
        d->type = HF_DEC_SEQUENCE;
        EN_TRY(get_array(c, j, where, "decoders", &arr));
        d->kids = en_calloc(json_array_size(arr) + 1, sizeof *d->kids);
        if (!d->kids) return EN_ERR(c->err, EN_ERR_NOMEM, "%s: out of memory", c->path);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            snprintf(f, sizeof f, "%s.decoders[%zu]", where, i);
            d->n_kids = (int)i + 1;
            EN_TRY(load_dec(t, c, json_array_get(arr, i), f, &d->kids[i]));
        }
    } else {
        return bad(c, fld(f, sizeof f, where, "type"), "unknown decoder \"%s\"", type);
    }
    return EN_OK;
}

/* ---- post-processor ---- */

static en_status push_ids(ld *c, int32_t **arr, int *n, const int32_t *ids, int k) {
    int32_t *p = en_realloc(*arr, (size_t)(*n + k + 1) * sizeof *p);
    if (!p) return EN_ERR(c->err, EN_ERR_NOMEM, "%s: out of memory", c->path);
    memcpy(p + *n, ids, (size_t)k * sizeof *p);
    *arr = p;
    *n += k;
    return EN_OK;
}

/* ["<s>", 1] of Roberta/Bert processing */
static en_status get_pair_id(ld *c, const json_t *j, const char *where, const char *key,
                             int32_t *id) {
    char f[256];
    const json_t *a = json_object_get(j, key);
    int64_t v;
    fld(f, sizeof f, where, key);
    if (!json_is_array(a) || json_array_size(a) != 2 || !json_is_string(json_array_get(a, 0)) ||
        !en_json_int(json_array_get(a, 1), &v) || v < 0 || v >= HF_MAX_ID)
        return bad(c, f, "expected [\"token\", id]");
    *id = (int32_t)v;
    return EN_OK;
}

static en_status load_template(en_hf_tokenizer *t, ld *c, const json_t *j, const char *where) {
    const json_t *single, *specials = json_object_get(j, "special_tokens");
    char f[256];
    int seen_a = 0;
    EN_TRY(get_array(c, j, where, "single", &single));
    if (!json_is_object(specials))
        return bad(c, fld(f, sizeof f, where, "special_tokens"), "expected an object");
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *it = json_array_get(single, i), *sp = json_object_get(it, "SpecialToken"),
                     *sq = json_object_get(it, "Sequence");
        snprintf(f, sizeof f, "%s.single[%zu]", where, i);
        const json_t *idv = json_object_get(sp ? sp : sq, "id");
        if ((!sp && !sq) || !json_is_string(idv))
            return bad(c, f, "expected {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}");
        if (sq) {
            if (strcmp(json_string_value(idv), "A") != 0 || seen_a)
                return bad(c, f, "the single template must hold $A exactly once");
            seen_a = 1;
            continue;
        }
        const json_t *tok = json_object_get(specials, json_string_value(idv));
        const json_t *ids = json_object_get(tok, "ids");
        if (!json_is_array(ids))
            return bad(c, f, "special token \"%s\" not in special_tokens", json_string_value(idv));
        for (size_t k = 0; k < json_array_size(ids); k++) {
            int64_t v;
            if (!en_json_int(json_array_get(ids, k), &v) || v < 0 || v >= HF_MAX_ID)
                return bad(c, f, "special token \"%s\": bad ids", json_string_value(idv));
            int32_t id = (int32_t)v;
            if (seen_a) EN_TRY(push_ids(c, &t->suffix, &t->n_suffix, &id, 1));
            else EN_TRY(push_ids(c, &t->prefix, &t->n_prefix, &id, 1));
        }
    }
    if (!seen_a) return bad(c, fld(f, sizeof f, where, "single"), "no $A in the template");
    return EN_OK;
}

static en_status load_post(en_hf_tokenizer *t, ld *c, const json_t *j, const char *where) {
    const char *type;
    char f[256];
    EN_TRY(get_type(c, j, where, &type));
    if (!strcmp(type, "TemplateProcessing")) return load_template(t, c, j, where);
    if (!strcmp(type, "ByteLevel")) {
        EN_TRY(get_bool(c, j, where, "trim_offsets", 1, &t->trim_offsets));
        return get_bool(c, j, where, "add_prefix_space", 1, &t->trim_add_prefix_space);
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        int32_t cls, sep;
        EN_TRY(get_pair_id(c, j, where, "cls", &cls));
        EN_TRY(get_pair_id(c, j, where, "sep", &sep));
        EN_TRY(push_ids(c, &t->prefix, &t->n_prefix, &cls, 1));
        EN_TRY(push_ids(c, &t->suffix, &t->n_suffix, &sep, 1));
        if (type[0] == 'B') return EN_OK;
        EN_TRY(get_bool(c, j, where, "trim_offsets", 1, &t->trim_offsets));
        return get_bool(c, j, where, "add_prefix_space", 1, &t->trim_add_prefix_space);
    }
    if (!strcmp(type, "Sequence")) {
        const json_t *arr;
        EN_TRY(get_array(c, j, where, "processors", &arr));
        for (size_t i = 0; i < json_array_size(arr); i++) {
            snprintf(f, sizeof f, "%s.processors[%zu]", where, i);
            EN_TRY(load_post(t, c, json_array_get(arr, i), f));
        }
        return EN_OK;
    }
    return bad(c, fld(f, sizeof f, where, "type"), "unknown post-processor \"%s\"", type);
}

/* ---- BPE model ---- */

static en_status load_vocab(en_hf_tokenizer *t, ld *c, const json_t *vocab) {
    const char *key;
    const json_t *v;
    size_t total = 0, n = json_object_size(vocab);
    int64_t id, max_id = -1;
    json_object_foreach((json_t *)vocab, key, v) {
        if (!en_json_int(v, &id) || id < 0 || id >= HF_MAX_ID)
            return bad(c, "model.vocab", "\"%s\": expected an id in [0, %d)", key, HF_MAX_ID);
        total += strlen(key) + 1;
        if (id > max_id) max_id = id;
    }
    t->vocab_arena = en_malloc(total + 1);
    t->n_vocab = (int32_t)(max_id + 1);
    t->pieces = en_calloc((size_t)t->n_vocab + 1, sizeof *t->pieces);
    t->piece_len = en_calloc((size_t)t->n_vocab + 1, sizeof *t->piece_len);
    if (!t->vocab_arena || !t->pieces || !t->piece_len || hf_strmap_init(&t->bpe.vocab, n))
        return EN_ERR(c->err, EN_ERR_NOMEM, "%s: out of memory for the vocabulary", c->path);
    char *p = t->vocab_arena;
    json_object_foreach((json_t *)vocab, key, v) {
        size_t l = strlen(key);
        en_json_int(v, &id);
        memcpy(p, key, l + 1);
        hf_strmap_put(&t->bpe.vocab, p, l, (int32_t)id);
        t->pieces[id] = p;
        t->piece_len[id] = (uint32_t)l;
        p += l + 1;
    }
    return EN_OK;
}

/* One merge: "a b" or ["a", "b"] -> the two halves. */
static en_status merge_parts(ld *c, const json_t *m, size_t i, const char **a, size_t *an,
                             const char **b, size_t *bn) {
    char f[64];
    snprintf(f, sizeof f, "model.merges[%zu]", i);
    if (json_is_string(m)) {
        const char *s = json_string_value(m), *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ')) return bad(c, f, "expected \"a b\" (one space)");
        *a = s;
        *an = (size_t)(sp - s);
        *b = sp + 1;
        *bn = strlen(sp + 1);
        return EN_OK;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *an = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *bn = json_string_length(json_array_get(m, 1));
        return EN_OK;
    }
    return bad(c, f, "expected \"a b\" or [\"a\", \"b\"]");
}

static en_status load_merges(en_hf_tokenizer *t, ld *c, const json_t *merges) {
    hf_bpe *m = &t->bpe;
    size_t n = json_array_size(merges), cap = 16, buf_cap = 256;
    while (cap < 2 * n + 2) cap <<= 1;
    m->merges = en_malloc(cap * sizeof *m->merges);
    /* bound: a merged token (an + bn - prefix_len bytes) is copied only after buf_cap >= it
     * (below) */
    char *buf = en_malloc(buf_cap);
    if (!m->merges || !buf) {
        en_free(buf);
        return EN_ERR(c->err, EN_ERR_NOMEM, "%s: out of memory for the merges", c->path);
    }
    memset(m->merges, 0xFF, cap * sizeof *m->merges);
    m->merge_mask = cap - 1;
    en_status st = EN_OK;
    for (size_t i = 0; i < n && st == EN_OK; i++) {
        const char *a = NULL, *b = NULL;
        size_t an = 0, bn = 0;
        char f[64];
        snprintf(f, sizeof f, "model.merges[%zu]", i);
        if ((st = merge_parts(c, json_array_get(merges, i), i, &a, &an, &b, &bn)) != EN_OK) break;
        int32_t ia = hf_strmap_get(&m->vocab, a, an), ib = hf_strmap_get(&m->vocab, b, bn);
        if (ia < 0 || ib < 0) {
            st = bad(c, f, "token \"%.*s\" is not in the vocabulary", (int)(ia < 0 ? an : bn),
                     ia < 0 ? a : b);
            break;
        }
        if (bn < m->prefix_len) {
            st = bad(c, f, "\"%.*s\" is shorter than continuing_subword_prefix", (int)bn, b);
            break;
        }
        size_t k = an + bn - m->prefix_len;
        if (k > buf_cap) {
            char *nb = en_realloc(buf, k * 2);
            if (!nb) {
                st = EN_ERR(c->err, EN_ERR_NOMEM, "%s: out of memory", c->path);
                break;
            }
            buf = nb;
            buf_cap = k * 2;
        }
        memcpy(buf, a, an);
        memcpy(buf + an, b + m->prefix_len, bn - m->prefix_len);
        int32_t id = hf_strmap_get(&m->vocab, buf, k);
        if (id < 0) {
            st = bad(c, f, "merged token \"%.*s\" is not in the vocabulary", (int)k, buf);
            break;
        }
        hf_merge_put(m, ia, ib, (uint32_t)i, id);
    }
    en_free(buf);
    return st;
}

static en_status dup_opt(ld *c, const json_t *j, const char *key, char **out, size_t *n) {
    const char *s;
    EN_TRY(get_str(c, j, "model", key, 0, &s, n));
    if (!s || *n == 0) return EN_OK; /* "" adds nothing, like no prefix */
    *out = en_strndup(s, *n);
    return *out ? EN_OK : EN_ERR(c->err, EN_ERR_NOMEM, "%s: out of memory", c->path);
}

static en_status load_model(en_hf_tokenizer *t, ld *c, const json_t *j) {
    hf_bpe *m = &t->bpe;
    const char *type, *unk;
    const json_t *vocab = json_object_get(j, "vocab"), *merges = json_object_get(j, "merges");
    if (!json_is_object(j)) return bad(c, "model", "missing or not an object");
    EN_TRY(get_str(c, j, "model", "type", 0, &type, NULL));
    if (!type && !merges) return bad(c, "model.type", "missing field");
    if (type && strcmp(type, "BPE") != 0)
        return bad(c, "model.type", "unsupported model \"%s\" (only BPE)", type);
    const json_t *dropout = json_object_get(j, "dropout");
    if (dropout && !json_is_null(dropout))
        return bad(c, "model.dropout", "only null is supported");
    if (!json_is_object(vocab)) return bad(c, "model.vocab", "expected an object");
    if (!json_is_array(merges)) return bad(c, "model.merges", "expected an array");
    EN_TRY(get_bool(c, j, "model", "fuse_unk", 0, &m->fuse_unk));
    EN_TRY(get_bool(c, j, "model", "byte_fallback", 0, &m->byte_fallback));
    EN_TRY(get_bool(c, j, "model", "ignore_merges", 0, &m->ignore_merges));
    EN_TRY(dup_opt(c, j, "continuing_subword_prefix", &m->prefix, &m->prefix_len));
    EN_TRY(dup_opt(c, j, "end_of_word_suffix", &m->suffix, &m->suffix_len));
    EN_TRY(load_vocab(t, c, vocab));
    EN_TRY(get_str(c, j, "model", "unk_token", 0, &unk, NULL));
    m->unk_id = -1;
    if (unk && (m->unk_id = hf_strmap_get(&m->vocab, unk, strlen(unk))) < 0)
        return bad(c, "model.unk_token", "\"%s\" is not in the vocabulary", unk);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        m->byte_ids[b] = hf_strmap_get(&m->vocab, name, 6);
    }
    return load_merges(t, c, merges);
}

/* ---- added tokens ---- */

static en_status load_added(en_hf_tokenizer *t, ld *c, const json_t *arr) {
    char f[64];
    if (!arr || json_is_null(arr)) return EN_OK;
    if (!json_is_array(arr)) return bad(c, "added_tokens", "expected an array");
    t->added = en_calloc(json_array_size(arr) + 1, sizeof *t->added);
    if (!t->added) return EN_ERR(c->err, EN_ERR_NOMEM, "%s: out of memory", c->path);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const json_t *j = json_array_get(arr, i);
        hf_added *a = &t->added[i];
        const char *s;
        int64_t id;
        snprintf(f, sizeof f, "added_tokens[%zu]", i);
        if (!json_is_object(j)) return bad(c, f, "expected an object");
        EN_TRY(get_str(c, j, f, "content", 1, &s, &a->len));
        if (a->len == 0) return bad(c, f, "empty content");
        EN_TRY(get_int(c, j, f, "id", -1, 0, HF_MAX_ID - 1, &id));
        if (id < 0) return bad(c, f, "missing id");
        a->id = (int32_t)id;
        a->content = en_strndup(s, a->len);
        t->n_added = (int)i + 1;
        if (!a->content) return EN_ERR(c->err, EN_ERR_NOMEM, "%s: out of memory", c->path);
        a->norm = a->content;
        a->norm_len = a->len;
        EN_TRY(get_bool(c, j, f, "special", 0, &a->special));
        EN_TRY(get_bool(c, j, f, "lstrip", 0, &a->lstrip));
        EN_TRY(get_bool(c, j, f, "rstrip", 0, &a->rstrip));
        EN_TRY(get_bool(c, j, f, "single_word", 0, &a->single_word));
        EN_TRY(get_bool(c, j, f, "normalized", !a->special, &a->normalized));
    }
    return EN_OK;
}

static en_status load_parts(en_hf_tokenizer *t, ld *c, const json_t *root) {
    const json_t *j;
    if (!json_is_object(root)) return bad(c, "(top level)", "expected an object");
    EN_TRY(load_model(t, c, json_object_get(root, "model")));
    EN_TRY(load_added(t, c, json_object_get(root, "added_tokens")));
    t->tb_space_cp = -1;
    if ((j = json_object_get(root, "normalizer")) && !json_is_null(j)) {
        t->norm = en_calloc(1, sizeof *t->norm);
        if (!t->norm) return EN_ERR(c->err, EN_ERR_NOMEM, "%s: out of memory", c->path);
        EN_TRY(load_norm(c, j, "normalizer", t->norm));
    }
    if ((j = json_object_get(root, "pre_tokenizer")) && !json_is_null(j)) {
        t->pretok = en_calloc(1, sizeof *t->pretok);
        if (!t->pretok) return EN_ERR(c->err, EN_ERR_NOMEM, "%s: out of memory", c->path);
        EN_TRY(load_pretok(c, j, "pre_tokenizer", t->pretok));
    }
    if ((j = json_object_get(root, "decoder")) && !json_is_null(j)) {
        t->dec = en_calloc(1, sizeof *t->dec);
        if (!t->dec) return EN_ERR(c->err, EN_ERR_NOMEM, "%s: out of memory", c->path);
        EN_TRY(load_dec(t, c, j, "decoder", t->dec));
    }
    if ((j = json_object_get(root, "post_processor")) && !json_is_null(j))
        EN_TRY(load_post(t, c, j, "post_processor"));
    return EN_OK;
}

en_status hf_load_json(en_hf_tokenizer *t, const json_t *root, en_err *err) {
    ld c = {t->path, err};
    return load_parts(t, &c, root);
}

en_status hf_load(en_hf_tokenizer *t, const char *json, size_t len, en_err *err) {
    json_t *root = NULL;
    EN_TRY(en_json_parse(json, len, t->path, &root, err));
    en_status st = hf_load_json(t, root, err);
    json_decref(root);
    return st;
}
