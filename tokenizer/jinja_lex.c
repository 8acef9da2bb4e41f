/*
 * jinja_lex.c - turns template source into tokens the way jinja2's lexer
 * does with transformers' settings: newlines normalised to "\n" and one
 * trailing newline dropped (keep_trailing_newline is off); "{%-"/"-%}"
 * strip whitespace on that side; trim_blocks drops the newline right after
 * a block or comment tag; lstrip_blocks drops spaces and tabs before a block
 * or comment tag that starts its line; {% raw %} text is copied verbatim.
 * Comments produce nothing. Inside tags: names, strings (Python escapes),
 * integers, floats and operators, with brackets balanced so "}}" inside a
 * dict literal does not end the tag.
 * Used by jinja.c (en_jinja_create) before jinja_parse.c.
 */
#include "jinja_impl.h"

#include <stdio.h>
#include <string.h>

typedef struct lexer {
    const char *s;
    size_t n, pos;
    const en_jinja_config *cfg;
    const char *name;
    en_jarena *arena;
    en_jtok *toks;
    size_t n_toks, cap_toks;
    size_t loc_pos, loc_line_start; /* incremental line/column tracking */
    int loc_line;
    char brackets[EN_JJ_MAX_NODE_DEPTH];
    int n_brackets;
    en_err *err;
} lexer;

/* Length of the Python whitespace character at s[i], 0 if none. */
static size_t ws_at(const char *s, size_t n, size_t i) {
    if (i >= n) return 0;
    size_t k = i;
    uint32_t cp = en_jj_utf8_next(s, n, &k);
    return en_jj_is_space(cp) ? k - i : 0;
}

/* Length of the whitespace character that ends at s[end - 1], 0 if none. */
static size_t ws_before(const char *s, size_t end) {
    for (size_t len = 1; len <= 3 && len <= end; len++) {
        size_t st = end - len;
        if (len > 1 && ((unsigned char)s[st] & 0xC0) == 0x80) continue;
        size_t k = st;
        uint32_t cp = en_jj_utf8_next(s, end, &k);
        return (k == end && en_jj_is_space(cp)) ? len : 0;
    }
    return 0;
}

static void locate(lexer *L, size_t pos, int *line, int *col) {
    if (pos < L->loc_pos) { /* never happens in order; restart to be safe */
        L->loc_pos = L->loc_line_start = 0;
        L->loc_line = 1;
    }
    for (; L->loc_pos < pos && L->loc_pos < L->n; L->loc_pos++)
        if (L->s[L->loc_pos] == '\n') {
            L->loc_line++;
            L->loc_line_start = L->loc_pos + 1;
        }
    *line = L->loc_line;
    *col = (int)(pos - L->loc_line_start) + 1;
}

static en_status lex_error(lexer *L, size_t pos, const char *msg) {
    int line, col;
    locate(L, pos, &line, &col);
    return EN_ERR(L->err, EN_ERR_ARG, "%s:%d:%d: %s", L->name, line, col, msg);
}

static en_jtok *push(lexer *L, int type, size_t pos) {
    if (L->n_toks == L->cap_toks) {
        size_t cap = L->cap_toks ? L->cap_toks * 2 : 256;
        en_jtok *t = en_realloc(L->toks, cap * sizeof *t);
        if (!t) return NULL;
        L->toks = t;
        L->cap_toks = cap;
    }
    en_jtok *t = &L->toks[L->n_toks++];
    memset(t, 0, sizeof *t);
    t->type = type;
    locate(L, pos, &t->line, &t->col);
    return t;
}

/* Emit text s[a, b) after applying the strip rule of the tag that follows
 * (sign '-', '+' or 0; tag '{', '%' or '#'). */
static en_status emit_text(lexer *L, size_t a, size_t b, char sign, char tag, int line_starting) {
    if (sign == '-') {
        size_t w;
        while (b > a && (w = ws_before(L->s, b)) > 0) b -= w;
    } else if (sign != '+' && L->cfg->lstrip_blocks && tag != '{') {
        size_t l = b;
        while (l > a && L->s[l - 1] != '\n') l--;
        if (l > a || line_starting) {
            size_t k = l, w;
            while (k < b && (w = ws_at(L->s, b, k)) > 0) k += w;
            if (k == b && b > l) b = l;
        }
    }
    if (b <= a) return EN_OK;
    en_jtok *t = push(L, EN_JT_TEXT, a);
    if (!t) return EN_ERR(L->err, EN_ERR_NOMEM, "%s: out of memory", L->name);
    t->p = L->s + a;
    t->n = b - a;
    return EN_OK;
}

static size_t skip_ws(const lexer *L, size_t i) {
    size_t w;
    while ((w = ws_at(L->s, L->n, i)) > 0) i += w;
    return i;
}

/* After a block or comment end at i (just past "%}"/"#}"), with the sign
 * before it: returns where text resumes. */
static size_t after_block_end(const lexer *L, size_t i, char sign) {
    if (sign == '-') return skip_ws(L, i);
    if (sign != '+' && L->cfg->trim_blocks && i < L->n && L->s[i] == '\n') return i + 1;
    return i;
}

/* "{% raw %}": returns 1 and sets *body when s[i] starts one. */
static int match_word_tag(const lexer *L, size_t i, const char *word, size_t *end, char *sign_in,
                          char *sign_out) {
    if (i + 2 > L->n || L->s[i] != '{' || L->s[i + 1] != '%') return 0;
    size_t k = i + 2;
    *sign_in = 0;
    if (k < L->n && (L->s[k] == '-' || L->s[k] == '+')) *sign_in = L->s[k++];
    k = skip_ws(L, k);
    size_t wl = strlen(word);
    if (k + wl > L->n || memcmp(L->s + k, word, wl) != 0) return 0;
    k = skip_ws(L, k + wl);
    *sign_out = 0;
    if (k < L->n && (L->s[k] == '-' || L->s[k] == '+')) *sign_out = L->s[k++];
    if (k + 2 > L->n || L->s[k] != '%' || L->s[k + 1] != '}') return 0;
    *end = k + 2;
    return 1;
}

static en_status lex_raw(lexer *L, size_t i, size_t *resume) {
    size_t end;
    char si, so;
    match_word_tag(L, i, "raw", &end, &si, &so);
    /* raw's own end never takes trim_blocks' newline, only "-%}" stripping */
    size_t body = so == '-' ? skip_ws(L, end) : end;
    for (size_t k = body; k + 1 < L->n; k++) {
        size_t e;
        if (L->s[k] == '{' && match_word_tag(L, k, "endraw", &e, &si, &so)) {
            EN_TRY(emit_text(L, body, k, si, '%', 0));
            *resume = after_block_end(L, e, so);
            return EN_OK;
        }
    }
    return lex_error(L, i, "missing end of raw directive");
}

static en_status lex_comment(lexer *L, size_t i, size_t *resume) {
    for (size_t k = i + 2; k + 1 < L->n; k++)
        if (L->s[k] == '#' && L->s[k + 1] == '}') {
            char sign = (k > i + 2 && (L->s[k - 1] == '-' || L->s[k - 1] == '+')) ? L->s[k - 1] : 0;
            *resume = after_block_end(L, k + 2, sign);
            return EN_OK;
        }
    return lex_error(L, i, "missing end of comment tag");
}

static en_status lex_tag(lexer *L, size_t i, char kind, size_t *resume);

/* Normalise newlines ("\r\n" and "\r" become "\n") and drop one trailing
 * newline, as jinja2 does before lexing. */
static char *normalise(en_jarena *a, const char *src, size_t len, size_t *out_len) {
    /* bound: normalising only removes bytes ("\r\n" -> "\n"): <= len, + 1 for the NUL */
    char *s = en_jarena_alloc(a, len + 1);
    if (!s) return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            if (i + 1 < len && src[i + 1] == '\n') i++;
            s[n++] = '\n';
        } else {
            s[n++] = src[i];
        }
    }
    if (n > 0 && s[n - 1] == '\n') n--;
    s[n] = 0;
    *out_len = n;
    return s;
}

static en_status lex_root(lexer *L) {
    size_t text = 0;
    int line_starting = 1;
    size_t i = 0;
    while (i + 1 < L->n) {
        char c2 = L->s[i + 1];
        if (L->s[i] != '{' || (c2 != '{' && c2 != '%' && c2 != '#')) {
            i++;
            continue;
        }
        char sign = (i + 2 < L->n && (L->s[i + 2] == '-' || L->s[i + 2] == '+')) ? L->s[i + 2] : 0;
        size_t end, resume = i + 2;
        char si, so;
        int raw = c2 == '%' && match_word_tag(L, i, "raw", &end, &si, &so);
        EN_TRY(emit_text(L, text, i, sign, c2, line_starting));
        if (raw)
            EN_TRY(lex_raw(L, i, &resume));
        else if (c2 == '#')
            EN_TRY(lex_comment(L, i, &resume));
        else
            EN_TRY(lex_tag(L, i, c2, &resume));
        line_starting = resume > 0 && L->s[resume - 1] == '\n';
        i = text = resume;
    }
    return emit_text(L, text, L->n, '+', '{', 0);
}

en_status en_jj_lex(const char *src, size_t len, const en_jinja_config *cfg, const char *name,
                    en_jarena *arena, en_jlex_out *out, en_err *err) {
    lexer L = {0};
    L.cfg = cfg;
    L.name = name;
    L.arena = arena;
    L.err = err;
    L.loc_line = 1;
    L.s = normalise(arena, src ? src : "", src ? len : 0, &L.n);
    if (!L.s) return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", name);
    en_status st = lex_root(&L);
    if (st == EN_OK && !push(&L, EN_JT_EOF, L.n))
        st = EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", name);
    if (st != EN_OK) {
        en_free(L.toks);
        return st;
    }
    out->toks = L.toks;
    out->n = L.n_toks;
    return EN_OK;
}

/* ---- inside {{ }} and {% %} ---- */

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_name0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One backslash escape at s[*k] (just past the backslash), Python's
 * unicode-escape rules. Returns 0, or -1 with *msg set. */
static int unescape_one(const char *s, size_t end, size_t *k, en_jbuf *b, const char **msg) {
    char c = s[*k];
    (*k)++;
    static const char simple_from[] = "\\'\"abfnrtv";
    static const char simple_to[] = "\\'\"\a\b\f\n\r\t\v";
    const char *f = strchr(simple_from, c);
    if (c && f) return en_jbuf_put(b, &simple_to[f - simple_from], 1);
    if (c == '\n') return 0; /* line continuation */
    if (c >= '0' && c <= '7') {
        uint32_t v = (uint32_t)(c - '0');
        for (int d = 0; d < 2 && *k < end && s[*k] >= '0' && s[*k] <= '7'; d++) v = v * 8 + (uint32_t)(s[(*k)++] - '0');
        return en_jj_utf8_put(b, v);
    }
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (!digits) {
        char two[2] = {'\\', c};
        return en_jbuf_put(b, two, 2);
    }
    uint32_t v = 0;
    for (int d = 0; d < digits; d++) {
        int h = *k < end ? hexval(s[*k]) : -1;
        if (h < 0) {
            *msg = "truncated escape in string";
            return -1;
        }
        v = v * 16 + (uint32_t)h;
        (*k)++;
    }
    if (v > 0x10FFFF) {
        *msg = "illegal Unicode character in string";
        return -1;
    }
    return en_jj_utf8_put(b, v);
}

static en_status lex_string(lexer *L, size_t i, size_t *next) {
    char q = L->s[i];
    size_t k = i + 1;
    while (k < L->n && L->s[k] != q) k += (L->s[k] == '\\' && k + 1 < L->n) ? 2 : 1;
    if (k >= L->n) return lex_error(L, i, "unexpected end of string");
    size_t end = k;
    en_jbuf b = {0};
    const char *msg = "out of memory";
    for (k = i + 1; k < end;) {
        size_t run = k;
        while (run < end && L->s[run] != '\\') run++;
        int rc = en_jbuf_put(&b, L->s + k, run - k);
        k = run;
        if (rc == 0 && k < end) {
            k++;
            rc = unescape_one(L->s, end, &k, &b, &msg);
        }
        if (rc != 0) {
            en_jbuf_free(&b);
            return lex_error(L, i, msg);
        }
    }
    en_jtok *t = push(L, EN_JT_STRING, i);
    char *copy = t ? en_jj_strdup(L->arena, b.p ? b.p : "", b.n) : NULL;
    size_t n = b.n;
    en_jbuf_free(&b);
    if (!copy) return EN_ERR(L->err, EN_ERR_NOMEM, "%s: out of memory", L->name);
    t->p = copy;
    t->n = n;
    *next = end + 1;
    return EN_OK;
}

/* Digits with '_' separators in base `base`, into *v; returns the end. */
static size_t scan_digits(const char *s, size_t n, size_t k, int base, int64_t *v, int *ovf) {
    for (; k < n; k++) {
        if (s[k] == '_' && k + 1 < n && hexval(s[k + 1]) >= 0 && hexval(s[k + 1]) < base) continue;
        int d = hexval(s[k]);
        if (d < 0 || d >= base) break;
        if (*v > (INT64_MAX - d) / base) *ovf = 1;
        else *v = *v * base + d;
    }
    return k;
}

static en_status lex_number(lexer *L, size_t i, size_t *next) {
    const char *s = L->s;
    int64_t v = 0;
    int ovf = 0, base = 10;
    size_t k = i;
    if (s[i] == '0' && i + 2 < L->n && strchr("xXoObB", s[i + 1]) && hexval(s[i + 2]) >= 0) {
        base = (s[i + 1] | 32) == 'x' ? 16 : (s[i + 1] | 32) == 'o' ? 8 : 2;
        k = i + 2;
    }
    k = scan_digits(s, L->n, k, base, &v, &ovf);
    int is_float = 0;
    if (base == 10 && k + 1 < L->n && s[k] == '.' && is_digit(s[k + 1])) {
        int64_t dummy = 0;
        k = scan_digits(s, L->n, k + 1, 10, &dummy, &ovf);
        is_float = 1;
    }
    if (base == 10 && k < L->n && (s[k] | 32) == 'e') {
        size_t e = k + 1;
        if (e < L->n && (s[e] == '+' || s[e] == '-')) e++;
        if (e < L->n && is_digit(s[e])) {
            int64_t dummy = 0;
            int o2 = 0;
            k = scan_digits(s, L->n, e, 10, &dummy, &o2);
            is_float = 1;
        }
    }
    en_jtok *t = push(L, is_float ? EN_JT_FLOAT : EN_JT_INT, i);
    if (!t) return EN_ERR(L->err, EN_ERR_NOMEM, "%s: out of memory", L->name);
    if (is_float) {
        char buf[128];
        size_t m = 0;
        for (size_t j = i; j < k && m + 1 < sizeof buf; j++)
            if (s[j] != '_') buf[m++] = s[j];
        buf[m] = 0;
        t->f = strtod(buf, NULL);
    } else if (ovf) {
        return lex_error(L, i, "integer literal too large");
    }
    t->i = v;
    *next = k;
    return EN_OK;
}

static const char *const operators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*",
                                        "%",  "~",  "[",  "]",  "(",  ")",  "{", "}", ">", "<",
                                        "=",  ".",  ":",  "|",  ",",  ";"};

static en_status lex_operator(lexer *L, size_t i, size_t *next) {
    for (size_t o = 0; o < sizeof operators / sizeof operators[0]; o++) {
        size_t len = strlen(operators[o]);
        if (i + len > L->n || memcmp(L->s + i, operators[o], len) != 0) continue;
        char c = operators[o][0];
        if (len == 1 && strchr("([{", c)) {
            if (L->n_brackets >= EN_JJ_MAX_NODE_DEPTH)
                return lex_error(L, i, "brackets nested too deeply");
            L->brackets[L->n_brackets++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        } else if (len == 1 && strchr(")]}", c)) {
            if (L->n_brackets == 0 || L->brackets[L->n_brackets - 1] != c) {
                char msg[64];
                snprintf(msg, sizeof msg, "unexpected '%c'", c);
                return lex_error(L, i, msg);
            }
            L->n_brackets--;
        }
        en_jtok *t = push(L, EN_JT_OP, i);
        if (!t) return EN_ERR(L->err, EN_ERR_NOMEM, "%s: out of memory", L->name);
        t->p = operators[o];
        t->n = len;
        *next = i + len;
        return EN_OK;
    }
    char msg[64];
    unsigned char c = (unsigned char)L->s[i];
    if (c >= 0x20 && c < 0x7f) snprintf(msg, sizeof msg, "unexpected char '%c'", c);
    else snprintf(msg, sizeof msg, "unexpected byte 0x%02x", c);
    return lex_error(L, i, msg);
}

/* The end of the tag at i, or 0: sets *resume past it (and its stripping). */
static int tag_end(lexer *L, size_t i, char kind, size_t *resume) {
    const char *s = L->s;
    char close = kind == '%' ? '%' : '}';
    char sign = (s[i] == '-' || (s[i] == '+' && kind == '%')) ? s[i] : 0;
    size_t k = i + (sign ? 1 : 0);
    if (k + 1 >= L->n || s[k] != close || s[k + 1] != '}') return 0;
    if (kind == '%') *resume = after_block_end(L, k + 2, sign);
    else *resume = sign == '-' ? skip_ws(L, k + 2) : k + 2;
    return 1;
}

static en_status lex_tag(lexer *L, size_t i, char kind, size_t *resume) {
    en_jtok *t = push(L, kind == '%' ? EN_JT_BLOCK_BEGIN : EN_JT_VAR_BEGIN, i);
    if (!t) return EN_ERR(L->err, EN_ERR_NOMEM, "%s: out of memory", L->name);
    size_t k = i + 2;
    if (k < L->n && (L->s[k] == '-' || L->s[k] == '+')) k++;
    L->n_brackets = 0;
    for (;;) {
        k = skip_ws(L, k);
        if (k >= L->n) return lex_error(L, i, kind == '%' ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'");
        if (L->n_brackets == 0 && tag_end(L, k, kind, resume)) {
            if (!push(L, kind == '%' ? EN_JT_BLOCK_END : EN_JT_VAR_END, k))
                return EN_ERR(L->err, EN_ERR_NOMEM, "%s: out of memory", L->name);
            return EN_OK;
        }
        char c = L->s[k];
        if (c == '\'' || c == '"') {
            EN_TRY(lex_string(L, k, &k));
        } else if (is_digit(c)) {
            EN_TRY(lex_number(L, k, &k));
        } else if (is_name0(c)) {
            size_t e = k;
            while (e < L->n && (is_name0(L->s[e]) || is_digit(L->s[e]))) e++;
            en_jtok *nt = push(L, EN_JT_NAME, k);
            char *nm = nt ? en_jj_strdup(L->arena, L->s + k, e - k) : NULL;
            if (!nm) return EN_ERR(L->err, EN_ERR_NOMEM, "%s: out of memory", L->name);
            nt->p = nm;
            nt->n = e - k;
            k = e;
        } else {
            EN_TRY(lex_operator(L, k, &k));
        }
    }
}
