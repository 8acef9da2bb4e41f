/*
 * tokenizer.c - the public tokenizer API (tokenizer.h) over its two kinds of
 * file: a Hugging Face tokenizer.json (hf_tokenizer.h) and a SentencePiece
 * tokenizer.model (tokenizer_impl.h, tokenizer_spm.cpp). It picks the file,
 * reads tokenizer_config.json for what the model's own tokenizer adds and how
 * its special tokens are spelled, checks arguments once for both kinds, and
 * dispatches. The streaming decoder (detok.c), chat templates (chat.c) and
 * the trainer (tokenizer_spm.cpp) sit on top of this API.
 */
#include "tokenizer.h"

#include <inttypes.h>
#include <string.h>

#include <stdio.h>

#include "../common/file.h"
#include "../common/gguf.h"
#include "../common/json.h"
#include "../common/utf8.h"
#include "hf_tokenizer.h"
#include "tokenizer_gguf.h"
#include "tokenizer_impl.h"

struct en_tokenizer {
    en_spm *spm;         /* exactly one of spm and hf is set */
    en_hf_tokenizer *hf;
    char *path;          /* the file loaded */
    int32_t n_vocab, bos, eos, unk, pad;
    char *bos_text, *eos_text; /* as templates print them; never NULL */
    /* What add_special adds: ids before and after the text. */
    int32_t prefix[4], suffix[4];
    int n_prefix, n_suffix;
    /* Ids that end generation: eos and the model's eos_token_id lists. */
    int32_t stop_ids[EN_TOKENIZER_MAX_STOP_IDS];
    int n_stop_ids;
    int strips_space; /* en_tokenizer_decode_strips_space */
};

/* ---- tokenizer_config.json ---- */

/* What tokenizer_config.json says; every field optional. */
typedef struct tok_config {
    char *bos, *eos, *pad, *unk; /* token text, NULL when absent or null */
    int add_bos, add_eos;        /* -1 when the key is absent */
} tok_config;

static void tok_config_free(tok_config *c) {
    en_free(c->bos);
    en_free(c->eos);
    en_free(c->pad);
    en_free(c->unk);
}

/* A special token is written as a string or as transformers' AddedToken
 * dict {"content": "...", ...}; anything else (null) means none. */
static char *token_text(const json_t *v) {
    if (json_is_object(v)) v = json_object_get(v, "content");
    const char *s = json_string_value(v);
    return s ? en_strdup(s) : NULL;
}

static int flag(const json_t *root, const char *key) {
    const json_t *v = json_object_get(root, key);
    return v ? json_is_true(v) : -1;
}

static void config_init(tok_config *c) {
    memset(c, 0, sizeof *c);
    c->add_bos = c->add_eos = -1;
}

/* Fill c from a tokenizer_config.json document; `where` names it. */
static en_status parse_config(const json_t *root, const char *where, tok_config *c,
                              en_err *err) {
    if (!json_is_object(root))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: the top level is not a JSON object", where);
    c->bos = token_text(json_object_get(root, "bos_token"));
    c->eos = token_text(json_object_get(root, "eos_token"));
    c->pad = token_text(json_object_get(root, "pad_token"));
    c->unk = token_text(json_object_get(root, "unk_token"));
    c->add_bos = flag(root, "add_bos_token");
    c->add_eos = flag(root, "add_eos_token");
    return EN_OK;
}

static en_status read_config(const char *path, tok_config *c, en_err *err) {
    if (!en_path_exists(path)) return EN_OK;
    json_t *root = NULL;
    en_status s = en_json_load_file(path, &root, err);
    if (s == EN_OK) s = parse_config(root, path, c, err);
    json_decref(root);
    return s;
}

/* ---- loading ---- */

static int32_t piece_id(const en_tokenizer *t, const char *text) {
    if (!text) return -1;
    return t->hf ? en_hf_tokenizer_piece_id(t->hf, text, strlen(text))
                 : en_spm_piece_id(t->spm, text);
}

/* The id of a configured token, which must exist in the vocabulary; `where`
 * names the config. */
static en_status config_id(en_tokenizer *t, const char *key, const char *text, int32_t *id,
                           const char *where, en_err *err) {
    if (!text) return EN_OK;
    int32_t v = piece_id(t, text);
    if (v < 0)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: %s \"%s\" is not a token of %s", where, key,
                      text, t->path);
    *id = v;
    return EN_OK;
}

static en_status add_special_ids(en_tokenizer *t, const tok_config *c) {
    if (t->hf && c->add_bos < 0 && c->add_eos < 0) {
        /* No explicit flag: the tokenizer.json post-processor decides. */
        const int32_t *pre, *suf;
        int np, ns;
        en_hf_tokenizer_post_ids(t->hf, &pre, &np, &suf, &ns);
        t->n_prefix = np < 4 ? np : 4;
        t->n_suffix = ns < 4 ? ns : 4;
        if (t->n_prefix) memcpy(t->prefix, pre, (size_t)t->n_prefix * sizeof *pre);
        if (t->n_suffix) memcpy(t->suffix, suf, (size_t)t->n_suffix * sizeof *suf);
        return EN_OK;
    }
    /* transformers rebuilds the post-processor from add_bos_token /
     * add_eos_token when either is given (both default false for a
     * tokenizer.json); SentencePiece's LlamaTokenizer adds bos by default. */
    int add_bos = c->add_bos >= 0 ? c->add_bos : (t->spm != NULL);
    int add_eos = c->add_eos >= 0 ? c->add_eos : 0;
    if (add_bos && t->bos >= 0) t->prefix[t->n_prefix++] = t->bos;
    if (add_eos && t->eos >= 0) t->suffix[t->n_suffix++] = t->eos;
    return EN_OK;
}

static char *dup_text(const char *s) { return en_strdup(s ? s : ""); }

static void add_stop_id(en_tokenizer *t, int64_t id) {
    if (id < 0 || id >= t->n_vocab) return;
    for (int i = 0; i < t->n_stop_ids; i++)
        if (t->stop_ids[i] == id) return;
    if (t->n_stop_ids < EN_TOKENIZER_MAX_STOP_IDS) t->stop_ids[t->n_stop_ids++] = (int32_t)id;
}

/* The eos_token_id of a generation_config.json / config.json document (an
 * integer or a list of them): where transformers' generate() reads the ids
 * that end an answer (Llama 3: [128001, 128008, 128009]). */
static void add_stop_ids(en_tokenizer *t, const json_t *root) {
    const json_t *v = json_object_get(root, "eos_token_id");
    int64_t id;
    if (json_is_array(v)) {
        size_t i;
        const json_t *it;
        json_array_foreach(v, i, it) {
            if (en_json_int(it, &id)) add_stop_id(t, id);
        }
    } else if (en_json_int(v, &id)) {
        add_stop_id(t, id);
    }
}

/* add_stop_ids of DIR/NAME when the file exists. */
static en_status read_stop_ids(en_tokenizer *t, const char *dir, const char *name, en_err *err) {
    char *path = en_path_join(dir, name);
    if (!path) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    json_t *root = NULL;
    en_status s = en_path_exists(path) ? en_json_load_file(path, &root, err) : EN_OK;
    if (s == EN_OK) add_stop_ids(t, root);
    json_decref(root);
    en_free(path);
    return s;
}

/* Does decode drop the space the first piece carries? Encode "a": when its
 * last piece stands for " a" but decodes alone to "a", it does. */
static int probe_strips_space(const en_tokenizer *t) {
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL, bytes[16];
    int yes = 0;
    if (en_tokenizer_encode(t, "a", 1, 0, &ids, &n, NULL) == EN_OK && n > 0) {
        long nb = en_tokenizer_token_bytes(t, ids[n - 1], bytes, sizeof bytes);
        if (nb == 2 && bytes[0] == ' ' && bytes[1] == 'a' &&
            en_tokenizer_decode(t, ids + n - 1, 1, &text, NULL, NULL) == EN_OK)
            yes = strcmp(text, "a") == 0;
    }
    en_free(ids);
    en_free(text);
    return yes;
}

/* Special ids and their text once the file is in (`where` names the
 * config c came from); the caller adds the stop ids of its
 * generation_config and then add_special_ids. */
static en_status finish_load(en_tokenizer *t, const char *where, const tok_config *c,
                             en_err *err) {
    if (t->hf) {
        t->n_vocab = en_hf_tokenizer_n_vocab(t->hf);
        t->unk = en_hf_tokenizer_unk(t->hf);
        t->bos = t->eos = t->pad = -1;
        if (!c->bos) {
            /* No config: the post-processor's first added id is the bos. */
            const int32_t *pre, *suf;
            int np, ns;
            en_hf_tokenizer_post_ids(t->hf, &pre, &np, &suf, &ns);
            if (np > 0) t->bos = pre[0];
        }
    } else {
        t->n_vocab = en_spm_n_vocab(t->spm);
        t->bos = en_spm_bos(t->spm);
        t->eos = en_spm_eos(t->spm);
        t->unk = en_spm_unk(t->spm);
        t->pad = en_spm_pad(t->spm);
    }
    EN_TRY(config_id(t, "bos_token", c->bos, &t->bos, where, err));
    EN_TRY(config_id(t, "eos_token", c->eos, &t->eos, where, err));
    EN_TRY(config_id(t, "pad_token", c->pad, &t->pad, where, err));
    EN_TRY(config_id(t, "unk_token", c->unk, &t->unk, where, err));
    t->bos_text = dup_text(c->bos ? c->bos : en_tokenizer_piece(t, t->bos));
    t->eos_text = dup_text(c->eos ? c->eos : en_tokenizer_piece(t, t->eos));
    if (!t->bos_text || !t->eos_text) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    add_stop_id(t, t->eos);
    t->strips_space = probe_strips_space(t);
    return EN_OK;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The directory part of a file path ("." when there is none). */
static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return en_strdup(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    /* bound: n <= strlen(path) bytes of the path, + 1 for the NUL */
    char *d = en_malloc(n + 1);
    if (d) {
        memcpy(d, path, n);
        d[n] = '\0';
    }
    return d;
}

static en_status load_file(en_tokenizer *t, const char *path, en_err *err) {
    if (!ends_with(path, ".json")) return en_spm_create(path, &t->spm, err);
    char *text = NULL;
    size_t len = 0;
    en_status s = en_file_read_all(path, &text, &len, err);
    if (s == EN_OK) s = en_hf_tokenizer_create(text, len, path, &t->hf, err);
    en_free(text);
    return s;
}

/* A tokenizer file with its directory's tokenizer_config.json,
 * generation_config.json and config.json. */
static en_status load_from_dir(en_tokenizer *t, const char *model_path, tok_config *c,
                               en_err *err) {
    char *dir = dir_of(model_path);
    char *cfg = dir ? en_path_join(dir, "tokenizer_config.json") : NULL;
    en_status s = cfg ? EN_OK : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK) s = load_file(t, model_path, err);
    if (s == EN_OK) s = read_config(cfg, c, err);
    if (s == EN_OK) s = finish_load(t, cfg, c, err);
    if (s == EN_OK) s = read_stop_ids(t, dir, "generation_config.json", err);
    if (s == EN_OK) s = read_stop_ids(t, dir, "config.json", err);
    en_free(cfg);
    en_free(dir);
    return s;
}

/* A .gguf file: everything from its tokenizer.ggml.* metadata, built in
 * memory (tokenizer_gguf.h); files beside it are not read. */
static en_status load_gguf(en_tokenizer *t, const char *path, tok_config *c, en_err *err) {
    en_gguf *g = NULL;
    en_tokenizer_gguf tg = {0};
    char where[1024];
    snprintf(where, sizeof where, "%s (tokenizer.ggml.* metadata)", path);
    en_status s = en_gguf_open(path, &g, err);
    if (s == EN_OK) s = en_tokenizer_gguf_init(&tg, g, err);
    en_gguf_close(g); /* tg keeps nothing of it */
    if (s == EN_OK) s = en_hf_tokenizer_create_json(tg.tokenizer, path, &t->hf, err);
    if (s == EN_OK) s = parse_config(tg.tokenizer_config, where, c, err);
    if (s == EN_OK) s = finish_load(t, where, c, err);
    if (s == EN_OK) add_stop_ids(t, tg.generation_config);
    en_tokenizer_gguf_deinit(&tg);
    return s;
}

en_status en_tokenizer_create(const char *model_path, en_tokenizer **out, en_err *err) {
    if (!out) return EN_ERR(err, EN_ERR_ARG, "en_tokenizer_create: out is NULL");
    *out = NULL;
    if (!model_path || !*model_path)
        return EN_ERR(err, EN_ERR_ARG, "en_tokenizer_create: empty model path");
    if (en_path_is_dir(model_path)) return en_tokenizer_load(model_path, out, err);
    en_tokenizer *t = en_calloc(1, sizeof *t);
    tok_config c;
    config_init(&c);
    en_status s = t ? EN_OK : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK) s = (t->path = en_strdup(model_path)) ? EN_OK : EN_ERR_NOMEM;
    if (s == EN_OK)
        s = en_gguf_is_gguf_path(model_path) ? load_gguf(t, model_path, &c, err)
                                             : load_from_dir(t, model_path, &c, err);
    if (s == EN_OK) s = add_special_ids(t, &c);
    tok_config_free(&c);
    if (s != EN_OK) {
        if (s == EN_ERR_NOMEM && err && !err->msg[0]) EN_ERR(err, s, "out of memory");
        en_tokenizer_destroy(t);
        return s;
    }
    *out = t;
    return EN_OK;
}

en_status en_tokenizer_load(const char *dir, en_tokenizer **out, en_err *err) {
    if (!out) return EN_ERR(err, EN_ERR_ARG, "en_tokenizer_load: out is NULL");
    *out = NULL;
    if (!dir || !*dir) return EN_ERR(err, EN_ERR_ARG, "en_tokenizer_load: empty directory");
    if (en_gguf_is_gguf_path(dir)) return en_tokenizer_create(dir, out, err);
    const char *names[] = {"tokenizer.json", "tokenizer.model"};
    for (int i = 0; i < 2; i++) {
        char *p = en_path_join(dir, names[i]);
        if (!p) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        if (en_path_exists(p)) {
            en_status s = en_tokenizer_create(p, out, err);
            en_free(p);
            return s;
        }
        en_free(p);
    }
    return EN_ERR(err, EN_ERR_IO, "%s: no tokenizer.json or tokenizer.model in the directory",
                  dir);
}

void en_tokenizer_destroy(en_tokenizer *tok) {
    if (!tok) return;
    en_spm_destroy(tok->spm);
    en_hf_tokenizer_destroy(tok->hf);
    en_free(tok->path);
    en_free(tok->bos_text);
    en_free(tok->eos_text);
    en_free(tok);
}

/* ---- getters ---- */

int32_t en_tokenizer_n_vocab(const en_tokenizer *tok) { return tok->n_vocab; }
int32_t en_tokenizer_bos(const en_tokenizer *tok) { return tok->bos; }
int32_t en_tokenizer_eos(const en_tokenizer *tok) { return tok->eos; }
int32_t en_tokenizer_unk(const en_tokenizer *tok) { return tok->unk; }
int32_t en_tokenizer_pad(const en_tokenizer *tok) { return tok->pad; }
const char *en_tokenizer_file(const en_tokenizer *tok) { return tok->path; }
int en_tokenizer_is_hf(const en_tokenizer *tok) { return tok->hf != NULL; }
const char *en_tokenizer_bos_text(const en_tokenizer *tok) { return tok->bos_text; }
const char *en_tokenizer_eos_text(const en_tokenizer *tok) { return tok->eos_text; }

int en_tokenizer_adds_bos(const en_tokenizer *tok) {
    return tok->n_prefix > 0 && tok->prefix[0] == tok->bos;
}

int en_tokenizer_decode_strips_space(const en_tokenizer *tok) { return tok->strips_space; }

int en_tokenizer_stop_ids(const en_tokenizer *tok, const int32_t **ids) {
    if (ids) *ids = tok->stop_ids;
    return tok->n_stop_ids;
}

const char *en_tokenizer_piece(const en_tokenizer *tok, int32_t id) {
    if (id < 0 || id >= tok->n_vocab) return NULL;
    return tok->hf ? en_hf_tokenizer_piece(tok->hf, id) : en_spm_piece(tok->spm, id);
}

int32_t en_tokenizer_piece_id(const en_tokenizer *tok, const char *piece) {
    return piece_id(tok, piece);
}

int en_tokenizer_is_special(const en_tokenizer *tok, int32_t id) {
    if (id < 0 || id >= tok->n_vocab) return 0;
    if (tok->hf) return en_hf_tokenizer_is_special(tok->hf, id);
    return id == tok->bos || id == tok->eos || id == tok->pad;
}

/* A SentencePiece piece's bytes: "<0xHH>" is one byte, "▁" a space. */
static long spm_token_bytes(const en_tokenizer *tok, int32_t id, char *buf, size_t cap) {
    const char *p = en_spm_piece(tok->spm, id);
    if (!p) return -1;
    unsigned v;
    char close;
    if (strlen(p) == 6 && sscanf(p, "<0x%2X%c", &v, &close) == 2 && close == '>') {
        if (cap) buf[0] = (char)v;
        return 1;
    }
    size_t n = 0;
    for (const char *s = p; *s;) {
        if (strncmp(s, "\xe2\x96\x81", 3) == 0) { /* U+2581; strncmp stops at the NUL */
            if (n < cap) buf[n] = ' ';
            n++;
            s += 3;
        } else {
            if (n < cap) buf[n] = *s;
            n++;
            s++;
        }
    }
    return (long)n;
}

long en_tokenizer_token_bytes(const en_tokenizer *tok, int32_t id, char *buf, size_t cap) {
    if (!tok || id < 0 || id >= tok->n_vocab || (!buf && cap)) return -1;
    if (tok->hf) return en_hf_tokenizer_token_bytes(tok->hf, id, buf, cap);
    return spm_token_bytes(tok, id, buf, cap);
}

/* ---- encode / decode ---- */

/* Surround n ids (and offsets) with the prefix and suffix ids, in place in
 * a new buffer. */
static en_status wrap_special(const en_tokenizer *t, size_t len, int32_t **ids, size_t **offsets,
                              size_t *n, en_err *err) {
    if (!t->n_prefix && !t->n_suffix) return EN_OK;
    size_t m = *n + (size_t)t->n_prefix + (size_t)t->n_suffix;
    int32_t *ni = en_malloc(m * sizeof *ni);
    size_t *no = offsets ? en_malloc(m * sizeof *no) : NULL;
    if (!ni || (offsets && !no)) {
        en_free(ni);
        en_free(no);
        return EN_ERR(err, EN_ERR_NOMEM, "encode: out of memory for %zu ids", m);
    }
    size_t k = 0;
    for (int i = 0; i < t->n_prefix; i++, k++) {
        ni[k] = t->prefix[i];
        if (no) no[k] = 0;
    }
    if (*n) memcpy(ni + k, *ids, *n * sizeof *ni);
    if (no && *n) memcpy(no + k, *offsets, *n * sizeof *no);
    k += *n;
    for (int i = 0; i < t->n_suffix; i++, k++) {
        ni[k] = t->suffix[i];
        if (no) no[k] = len;
    }
    en_free(*ids);
    *ids = ni;
    if (offsets) {
        en_free(*offsets);
        *offsets = no;
    }
    *n = m;
    return EN_OK;
}

en_status en_tokenizer_encode_offsets(const en_tokenizer *tok, const char *text, size_t len,
                                      int add_special, int32_t **ids, size_t **offsets,
                                      size_t *n_ids, en_err *err) {
    if (!tok || !ids || !n_ids || (!text && len))
        return EN_ERR(err, EN_ERR_ARG, "en_tokenizer_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    if (offsets) *offsets = NULL;
    size_t bad = en_utf8_first_invalid((const unsigned char *)text, len);
    if (bad < len)
        return EN_ERR(err, EN_ERR_ARG,
                      "invalid UTF-8 in the text to encode at byte offset %zu (byte 0x%02x)", bad,
                      (unsigned)(unsigned char)text[bad]);
    if (!text) text = "";
    /* The special ids are added here for both kinds: for a tokenizer.json
     * they are its post-processor's single-sequence template (or the
     * config's flags), which only ever adds ids around the text. */
    en_status s = tok->hf ? en_hf_tokenizer_encode(tok->hf, text, len, 0, ids, offsets, n_ids, err)
                          : en_spm_encode(tok->spm, text, len, ids, offsets, n_ids, err);
    if (s == EN_OK && add_special) s = wrap_special(tok, len, ids, offsets, n_ids, err);
    if (s != EN_OK) {
        en_free(*ids);
        *ids = NULL;
        if (offsets) {
            en_free(*offsets);
            *offsets = NULL;
        }
        *n_ids = 0;
    }
    return s;
}

en_status en_tokenizer_encode(const en_tokenizer *tok, const char *text, size_t len,
                              int add_special, int32_t **ids, size_t *n_ids, en_err *err) {
    return en_tokenizer_encode_offsets(tok, text, len, add_special, ids, NULL, n_ids, err);
}

en_status en_tokenizer_decode(const en_tokenizer *tok, const int32_t *ids, size_t n_ids,
                              char **text, size_t *len, en_err *err) {
    if (!tok || !text || (!ids && n_ids))
        return EN_ERR(err, EN_ERR_ARG, "en_tokenizer_decode: NULL argument");
    *text = NULL;
    if (len) *len = 0;
    /* Check ranges here, the same way for both kinds, naming the position. */
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= tok->n_vocab)
            return EN_ERR(err, EN_ERR_ARG,
                          "token id %" PRId32 " at position %zu is out of range [0, %" PRId32
                          ") for decode",
                          ids[i], i, tok->n_vocab);
    if (tok->hf) return en_hf_tokenizer_decode(tok->hf, ids, n_ids, 1, text, len, err);
    return en_spm_decode(tok->spm, ids, n_ids, text, len, err);
}

/* ---- the files of a tokenizer ---- */

static const char *const tokenizer_files[] = {
    "tokenizer.json",          "tokenizer.model",     "tokenizer_config.json",
    "special_tokens_map.json", "chat_template.jinja", "generation_config.json",
    "added_tokens.json",       "vocab.json",          "merges.txt"};

en_status en_tokenizer_copy_files(const char *src_dir, const char *dst_dir, int *n_copied,
                                  en_err *err) {
    int n = 0;
    en_status s = EN_OK;
    for (size_t i = 0; s == EN_OK && i < sizeof tokenizer_files / sizeof *tokenizer_files; i++) {
        char *src = en_path_join(src_dir, tokenizer_files[i]);
        char *dst = en_path_join(dst_dir, tokenizer_files[i]);
        if (!src || !dst)
            s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        else if (en_path_exists(src) && (s = en_file_copy(src, dst, err)) == EN_OK)
            n++;
        en_free(src);
        en_free(dst);
    }
    if (n_copied) *n_copied = n;
    return s;
}
