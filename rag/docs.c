/*
 * docs.c - document files into sections and paragraphs (see docs.h): the
 * txt, markdown, HTML and JSON-lines readers. The chunker is rag/chunk.c.
 */
#include "docs.h"

#include <ctype.h>
#include <jansson.h>
#include <string.h>
#include <strings.h>

#include "../common/utf8.h"

en_doc_kind en_doc_kind_of(const char *path) {
    const char *dot = strrchr(path, '.');
    const char *slash = strrchr(path, '/');
    if (!dot || (slash && dot < slash)) return EN_DOC_NONE;
    if (strcasecmp(dot, ".txt") == 0) return EN_DOC_TXT;
    if (strcasecmp(dot, ".md") == 0 || strcasecmp(dot, ".markdown") == 0) return EN_DOC_MD;
    if (strcasecmp(dot, ".html") == 0 || strcasecmp(dot, ".htm") == 0) return EN_DOC_HTML;
    if (strcasecmp(dot, ".jsonl") == 0) return EN_DOC_JSONL;
    return EN_DOC_NONE;
}

static int is_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Room for one more of n elements of `size` in *a: the array doubles when n
 * reaches a power of two. 0 on OOM. */
static int grow(void *a, int n, size_t size) {
    if (n > 0 && (n & (n - 1)) != 0) return 1;
    void *g = en_realloc(*(void **)a, (size_t)(n ? 2 * n : 4) * size);
    if (!g) return 0;
    *(void **)a = g;
    return 1;
}

static en_status oom(en_err *err, const char *name) {
    return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", name);
}

/* Add a section (title copied); returns its index or -1 on OOM. */
static int add_section(en_doc *d, const char *title, size_t tlen, const char *record_id) {
    if (!grow(&d->sections, d->n_sections, sizeof *d->sections)) return -1;
    en_doc_section *s = &d->sections[d->n_sections];
    s->title = en_strndup(title ? title : "", title ? tlen : 0);
    s->record_id = record_id ? en_strdup(record_id) : NULL;
    if (!s->title || (record_id && !s->record_id)) {
        en_free(s->title);
        en_free(s->record_id);
        return -1;
    }
    return d->n_sections++;
}

static int add_para(en_doc *d, const en_doc_para *p) {
    if (!grow(&d->paras, d->n_paras, sizeof *d->paras)) return 0;
    d->paras[d->n_paras++] = *p;
    return 1;
}

static int add_heap(en_doc *d, char *buf) {
    if (!grow(&d->heap, d->n_heap, sizeof *d->heap)) return 0;
    d->heap[d->n_heap++] = buf;
    return 1;
}

/* ---- plain text: paragraphs end at blank lines ---- */

/* Paragraphs of src[from..to) (blank-line separated, trimmed), as raw
 * slices of base (offsets relative to base). */
static int text_paras(en_doc *d, const char *base, size_t from, size_t to, int section,
                      int line) {
    size_t i = from;
    while (i < to) {
        /* skip blank lines */
        while (i < to && is_space((unsigned char)base[i])) i++;
        if (i >= to) break;
        size_t start = i, end = i;
        while (i < to) {
            size_t eol = i;
            while (eol < to && base[eol] != '\n') eol++;
            size_t k = i;
            while (k < eol && is_space((unsigned char)base[k])) k++;
            if (k == eol) break; /* a blank line */
            size_t e = eol;
            while (e > i && is_space((unsigned char)base[e - 1])) e--;
            end = e;
            i = eol < to ? eol + 1 : eol;
        }
        en_doc_para p = {base + start, end - start, start, NULL, section, line};
        if (!add_para(d, &p)) return 0;
    }
    return 1;
}

/* ---- plain text titles ---- */

/* A .txt paragraph that reads as a title: one line, 1..EN_DOC_TITLE_WORDS
 * words, starting with a letter, digit or non-ASCII byte (not a list marker
 * or a rule of dashes) and not ending in sentence or clause punctuation
 * (. ! ? : ; ,). */
#define EN_DOC_TITLE_WORDS 12
static int txt_title_like(const en_doc_para *p) {
    if (p->len == 0 || memchr(p->text, '\n', p->len)) return 0;
    unsigned char c0 = (unsigned char)p->text[0], cz = (unsigned char)p->text[p->len - 1];
    if (!(isalnum(c0) || c0 >= 0x80) || strchr(".!?:;,", cz)) return 0;
    int words = 0, in = 0;
    for (size_t i = 0; i < p->len; i++) {
        int sp = is_space((unsigned char)p->text[i]);
        words += !sp && !in;
        in = !sp;
    }
    return words <= EN_DOC_TITLE_WORDS;
}

/* .txt: paragraphs end at blank lines; a title-like paragraph followed by
 * one that is not title-like starts a section and is not itself a
 * paragraph (like a markdown heading). A run of title-like paragraphs
 * (a list of short lines) stays text, and so does a title-like last
 * paragraph. */
static int read_txt(en_doc *d, const char *src, size_t len) {
    int sec = add_section(d, "", 0, NULL);
    if (sec < 0 || !text_paras(d, src, 0, len, sec, 0)) return 0;
    int n = d->n_paras, k = 0, like_next = n > 0 && txt_title_like(&d->paras[0]);
    for (int i = 0; i < n; i++) {
        en_doc_para p = d->paras[i];
        int like = like_next;
        like_next = i + 1 < n && txt_title_like(&d->paras[i + 1]);
        if (like && i + 1 < n && !like_next) {
            sec = add_section(d, p.text, p.len, NULL);
            if (sec < 0) return 0;
            continue;
        }
        p.section = sec;
        d->paras[k++] = p;
    }
    d->n_paras = k;
    return 1;
}

/* ---- markdown: ATX headings, fenced code ---- */

/* A fenced code block src[from..to) as one paragraph (blank lines inside it
 * kept), trimmed of surrounding blank space. */
static int text_paras_fenced(en_doc *d, const char *src, size_t from, size_t to, int section) {
    while (from < to && is_space((unsigned char)src[from])) from++;
    while (to > from && is_space((unsigned char)src[to - 1])) to--;
    if (from == to) return 1;
    en_doc_para p = {src + from, to - from, from, NULL, section, 0};
    return add_para(d, &p);
}


/* The heading level (1..6) of the line [s, e) and its text, or 0. */
static int md_heading(const char *s, const char *e, const char **ts, const char **te) {
    int ind = 0;
    while (s < e && *s == ' ' && ind < 4) s++, ind++;
    if (ind > 3) return 0;
    int lv = 0;
    while (s < e && *s == '#') s++, lv++;
    if (lv < 1 || lv > 6 || (s < e && *s != ' ' && *s != '\t')) return 0;
    while (s < e && is_space((unsigned char)*s)) s++;
    while (e > s && is_space((unsigned char)e[-1])) e--;
    /* an optional closing run of '#' preceded by a space */
    const char *c = e;
    while (c > s && c[-1] == '#') c--;
    if (c == s) e = s;
    else if (c < e && (c[-1] == ' ' || c[-1] == '\t')) {
        e = c;
        while (e > s && is_space((unsigned char)e[-1])) e--;
    }
    *ts = s, *te = e;
    return lv;
}

/* A fence opener/closer: 3+ backticks or tildes after up to 3 spaces. */
static int md_fence(const char *s, const char *e, char *ch) {
    int ind = 0;
    while (s < e && *s == ' ' && ind < 4) s++, ind++;
    if (ind > 3 || s >= e || (*s != '`' && *s != '~')) return 0;
    char c = *s;
    int n = 0;
    while (s < e && *s == c) s++, n++;
    if (n < 3) return 0;
    *ch = c;
    return 1;
}

static int read_md(en_doc *d, const char *src, size_t len) {
    int sec = add_section(d, "", 0, NULL);
    if (sec < 0) return 0;
    size_t i = 0, para_from = 0;
    int in_fence = 0;
    char fence_ch = 0;
    while (i < len) {
        size_t eol = i;
        while (eol < len && src[eol] != '\n') eol++;
        size_t next = eol < len ? eol + 1 : eol;
        const char *ts, *te;
        char ch;
        if (in_fence) {
            if (md_fence(src + i, src + eol, &ch) && ch == fence_ch) {
                in_fence = 0;
                if (!text_paras_fenced(d, src, para_from, next, sec)) return 0;
                para_from = next;
            }
        } else if (md_fence(src + i, src + eol, &ch)) {
            if (!text_paras(d, src, para_from, i, sec, 0)) return 0;
            in_fence = 1, fence_ch = ch, para_from = i;
        } else if (md_heading(src + i, src + eol, &ts, &te)) {
            if (!text_paras(d, src, para_from, i, sec, 0)) return 0;
            sec = add_section(d, ts, (size_t)(te - ts), NULL);
            if (sec < 0) return 0;
            para_from = next;
        }
        i = next;
    }
    if (in_fence) return text_paras_fenced(d, src, para_from, len, sec);
    return text_paras(d, src, para_from, len, sec, 0);
}

/* ---- HTML: text outside tags, whitespace collapsed ---- */

typedef struct html_text {
    char *b;
    size_t *off;
    size_t n, cap;
    int space; /* a whitespace run is pending */
} html_text;

static int ht_put(html_text *t, const char *s, size_t n, size_t off) {
    if (t->n + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        while (cap < t->n + n + 1) cap *= 2;
        /* bound: cap >= n + len + 1 (the loop above): the bytes put and a NUL */
        char *b = en_realloc(t->b, cap);
        if (!b) return 0;
        t->b = b;
        size_t *o = en_realloc(t->off, cap * sizeof *o);
        if (!o) return 0;
        t->off = o;
        t->cap = cap;
    }
    if (t->space && t->n > 0) {
        t->b[t->n] = ' ';
        t->off[t->n++] = off;
    }
    t->space = 0;
    for (size_t i = 0; i < n; i++) {
        t->b[t->n] = s[i];
        t->off[t->n++] = off;
    }
    return 1;
}

typedef struct html_state {
    en_doc *d;
    html_text para, title;
    int in_heading, section;
} html_state;

/* Move the collected paragraph into the doc (empty ones are dropped). */
static int html_end_para(html_state *h) {
    html_text *t = &h->para;
    t->space = 0;
    if (t->n == 0) return 1;
    /* bound: the paragraph's t->n bytes and a NUL; off[] gets one offset a byte */
    char *text = en_malloc(t->n + 1);
    size_t *off = en_malloc(t->n * sizeof *off);
    if (!text || !off || !add_heap(h->d, text)) {
        en_free(off);
        en_free(text);
        return 0;
    }
    memcpy(text, t->b, t->n);
    text[t->n] = 0;
    memcpy(off, t->off, t->n * sizeof *off);
    en_doc_para p = {text, t->n, off[0], off, h->section, 0};
    if (!add_para(h->d, &p)) {
        en_free(off);
        return 0;
    }
    t->n = 0;
    return 1;
}

/* Decode an entity at s[0..n) (s[0] == '&'): writes UTF-8 to out, returns
 * the bytes consumed, or 0 when it is not one we decode. */
static size_t html_entity(const char *s, size_t n, char *out, size_t *out_len) {
    static const struct { const char *name; char c; } named[] = {
        {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}};
    for (size_t k = 0; k < sizeof named / sizeof named[0]; k++) {
        size_t l = strlen(named[k].name);
        if (n >= l && memcmp(s, named[k].name, l) == 0) {
            out[0] = named[k].c, *out_len = 1;
            return l;
        }
    }
    if (n < 4 || s[1] != '#') return 0;
    size_t i = 2;
    int hex = (s[2] == 'x' || s[2] == 'X');
    if (hex) i++;
    unsigned long cp = 0;
    size_t digits = 0;
    while (i < n && digits < 8) {
        unsigned char c = (unsigned char)s[i];
        if (!(hex ? isxdigit(c) : isdigit(c))) break;
        int v = isdigit(c) ? c - '0' : tolower(c) - 'a' + 10;
        cp = cp * (hex ? 16 : 10) + (unsigned long)v;
        i++, digits++;
    }
    if (digits == 0 || i >= n || s[i] != ';') return 0;
    if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
    if (cp < 0x80) out[0] = (char)cp, *out_len = 1;
    else if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F));
        *out_len = 2;
    } else if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)), out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        *out_len = 3;
    } else {
        out[0] = (char)(0xF0 | (cp >> 18)), out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), out[3] = (char)(0x80 | (cp & 0x3F));
        *out_len = 4;
    }
    return i + 1;
}

static int html_is_block(const char *name) {
    static const char *const block[] = {
        "p", "div", "li", "br", "ul", "ol", "dl", "dt", "dd", "table", "tr", "td", "th",
        "thead", "tbody", "section", "article", "header", "footer", "nav", "main", "aside",
        "blockquote", "pre", "hr", "title", "html", "head", "body", "form", "figure",
        "figcaption", "caption", "address"};
    for (size_t k = 0; k < sizeof block / sizeof block[0]; k++)
        if (strcmp(name, block[k]) == 0) return 1;
    return 0;
}

/* Find the case-insensitive needle in s[from..n); n when absent. */
static size_t find_ci(const char *s, size_t from, size_t n, const char *needle) {
    size_t l = strlen(needle);
    for (size_t i = from; i + l <= n; i++)
        if (strncasecmp(s + i, needle, l) == 0) return i;
    return n;
}

/* Handle the tag at s[i] == '<'; returns the index after it. */
static size_t html_tag(html_state *h, const char *s, size_t n, size_t i, int *ok) {
    if (n - i >= 4 && memcmp(s + i, "<!--", 4) == 0) {
        size_t e = find_ci(s, i + 4, n, "-->");
        return e < n ? e + 3 : n;
    }
    if (s[i + 1] == '!' || s[i + 1] == '?') {
        const char *e = memchr(s + i, '>', n - i);
        return e ? (size_t)(e - s) + 1 : n;
    }
    size_t j = i + 1;
    int closing = (s[j] == '/');
    if (closing) j++;
    char name[16];
    size_t k = 0;
    while (j < n && isalnum((unsigned char)s[j])) {
        if (k < sizeof name - 1) name[k++] = (char)tolower((unsigned char)s[j]);
        j++;
    }
    name[k] = 0;
    char q = 0; /* skip attributes, quotes respected */
    while (j < n && (q || s[j] != '>')) {
        if (q && s[j] == q) q = 0;
        else if (!q && (s[j] == '"' || s[j] == '\'')) q = s[j];
        j++;
    }
    j = j < n ? j + 1 : n;
    int hlevel = (k == 2 && name[0] == 'h' && name[1] >= '1' && name[1] <= '6');
    if (!closing && (strcmp(name, "script") == 0 || strcmp(name, "style") == 0)) {
        char end[sizeof name + 2]; /* "</" + the name: never truncated */
        snprintf(end, sizeof end, "</%s", name);
        size_t e = find_ci(s, j, n, end);
        if (e >= n) return n;
        const char *gt = memchr(s + e, '>', n - e);
        return gt ? (size_t)(gt - s) + 1 : n;
    }
    if (hlevel) {
        if (!html_end_para(h)) *ok = 0;
        if (!closing) {
            h->in_heading = 1;
            h->title.n = 0, h->title.space = 0;
        } else if (h->in_heading) {
            h->in_heading = 0;
            h->section = add_section(h->d, h->title.b, h->title.n, NULL);
            if (h->section < 0) *ok = 0;
        }
    } else if (html_is_block(name)) {
        if (h->in_heading) h->title.space = 1;
        else if (!html_end_para(h)) *ok = 0;
    }
    return j;
}

static int read_html(en_doc *d, const char *s, size_t n) {
    html_state h = {0};
    h.d = d;
    h.section = add_section(d, "", 0, NULL);
    int ok = h.section >= 0;
    size_t i = 0;
    while (ok && i < n) {
        html_text *t = h.in_heading ? &h.title : &h.para;
        unsigned char c = (unsigned char)s[i];
        if (c == '<' && i + 1 < n &&
            (isalpha((unsigned char)s[i + 1]) || s[i + 1] == '!' || s[i + 1] == '?' ||
             (s[i + 1] == '/' && i + 2 < n && isalpha((unsigned char)s[i + 2])))) {
            i = html_tag(&h, s, n, i, &ok);
        } else if (is_space(c)) {
            t->space = 1;
            i++;
        } else if (c == '&') {
            char out[4];
            size_t ol = 0, used = html_entity(s + i, n - i, out, &ol);
            if (used) ok = ht_put(t, out, ol, i), i += used;
            else ok = ht_put(t, s + i, 1, i), i++;
        } else {
            ok = ht_put(t, s + i, 1, i);
            i++;
        }
    }
    if (ok && h.in_heading) { /* an unclosed heading: its text is the title */
        h.section = add_section(d, h.title.b, h.title.n, NULL);
        ok = h.section >= 0;
    }
    if (ok) ok = html_end_para(&h);
    en_free(h.para.b);
    en_free(h.para.off);
    en_free(h.title.b);
    en_free(h.title.off);
    return ok;
}

/* ---- JSON lines: {"id","title","text"} records ---- */

static en_status read_jsonl(en_doc *d, const char *name, const char *s, size_t n, en_err *err) {
    size_t i = 0;
    int line = 0, records = 0;
    while (i < n) {
        size_t eol = i;
        while (eol < n && s[eol] != '\n') eol++;
        line++;
        size_t a = i, b = eol;
        i = eol < n ? eol + 1 : eol;
        while (a < b && is_space((unsigned char)s[a])) a++;
        if (a == b) continue;
        json_error_t je;
        json_t *r = json_loadb(s + a, b - a, 0, &je);
        if (!r || !json_is_object(r)) {
            json_decref(r);
            return EN_ERR(err, EN_ERR_FORMAT, "%s:%d: %s", name, line,
                          r ? "not a JSON object" : je.text);
        }
        json_t *text = json_object_get(r, "text"), *id = json_object_get(r, "id");
        json_t *title = json_object_get(r, "title");
        if (!text && records == 0) { /* a data file (prompts, chats), not documents */
            json_decref(r);
            d->not_documents = 1;
            return EN_OK;
        }
        const char *bad = !json_is_string(text)                     ? "\"text\" is not a string"
                          : title && !json_is_string(title) && !json_is_null(title)
                              ? "\"title\" is not a string"
                          : id && !json_is_string(id) && !json_is_integer(id) && !json_is_null(id)
                              ? "\"id\" is not a string or integer"
                              : NULL;
        if (bad) {
            json_decref(r);
            return EN_ERR(err, EN_ERR_FORMAT, "%s:%d: %s", name, line, text ? bad : "no \"text\"");
        }
        char idbuf[32];
        const char *ids = NULL;
        if (json_is_string(id)) ids = json_string_value(id);
        else if (json_is_integer(id)) {
            snprintf(idbuf, sizeof idbuf, "%lld", (long long)json_integer_value(id));
            ids = idbuf;
        }
        const char *ts = json_is_string(title) ? json_string_value(title) : "";
        char *copy = en_strndup(json_string_value(text), json_string_length(text));
        int sec = add_section(d, ts, strlen(ts), ids ? ids : "");
        int ok = copy && sec >= 0 && add_heap(d, copy);
        if (!ok) en_free(copy);
        ok = ok && text_paras(d, copy, 0, strlen(copy), sec, line);
        json_decref(r);
        if (!ok) return oom(err, name);
        records++;
    }
    return EN_OK;
}

void en_doc_deinit(en_doc *doc) {
    if (!doc) return;
    for (int i = 0; i < doc->n_sections; i++) {
        en_free(doc->sections[i].title);
        en_free(doc->sections[i].record_id);
    }
    for (int i = 0; i < doc->n_paras; i++) en_free(doc->paras[i].off);
    for (int i = 0; i < doc->n_heap; i++) en_free(doc->heap[i]);
    en_free(doc->sections);
    en_free(doc->paras);
    en_free(doc->heap);
    memset(doc, 0, sizeof *doc);
}

en_status en_doc_read(const char *name, en_doc_kind kind, const unsigned char *src,
                      size_t len, en_doc *doc, en_err *err) {
    memset(doc, 0, sizeof *doc);
    doc->kind = kind, doc->src = src, doc->src_len = len;
    if (len && memchr(src, 0, len)) {
        doc->binary = 1;
        return EN_OK;
    }
    size_t bad = en_utf8_first_invalid(src, len);
    if (bad < len)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: not valid UTF-8 (byte %zu)", name, bad);
    const char *s = (const char *)src;
    int ok = 1;
    switch (kind) {
    case EN_DOC_TXT: ok = read_txt(doc, s, len); break;
    case EN_DOC_MD: ok = read_md(doc, s, len); break;
    case EN_DOC_HTML: ok = read_html(doc, s, len); break;
    case EN_DOC_JSONL: {
        en_status st = read_jsonl(doc, name, s, len, err);
        if (st != EN_OK) {
            en_doc_deinit(doc);
            return st;
        }
        break;
    }
    default: return EN_ERR(err, EN_ERR_ARG, "%s: not a document file", name);
    }
    if (!ok) {
        en_doc_deinit(doc);
        return oom(err, name);
    }
    return EN_OK;
}
