/*
 * convert_gguf.c - llama-architecture GGUF file -> Hugging Face directory
 * (`energon convert gguf`). See convert.h.
 *
 * Tensors are dequantised to float32 (en_gguf_tensor_to_f32), renamed to
 * the Hugging Face llama names, and the q/k rows that llama.cpp's converter
 * reorders into interleaved RoPE pairs are put back into rotate-half order.
 * GGUF dims are fastest-varying first, so a [in, out] GGUF matrix is the
 * (out, in) row-major matrix Hugging Face stores: no transpose is needed.
 * Tokenizers, written as tokenizer.json the way transformers builds them
 * from a GGUF: byte-level BPE (`tokenizer.ggml.model = gpt2`, GPT-2's
 * pre-tokenizer regex) with the file's merges; SentencePiece-style
 * vocabularies (`tokenizer.ggml.model = llama`) as a byte-fallback BPE
 * whose merges are recovered from the token scores, with a Metaspace
 * pre-tokenizer (like transformers, and unlike SentencePiece, runs of
 * spaces are not collapsed). Control tokens become special added tokens.
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "../common/file.h"
#include "../common/gguf.h"
#include "../common/safetensors.h"
#include "convert.h"

/* Read an integer key; absent keys give `def` unless `required`. */
static en_status gg_int(const en_gguf *g, const char *key, int required, int64_t def,
                        int64_t *out, en_err *err) {
    if (en_gguf_find_kv(g, key) < 0) {
        if (required)
            return EN_ERR(err, EN_ERR_FORMAT, "%s: required key '%s' is missing",
                          en_gguf_name(g), key);
        *out = def;
        return EN_OK;
    }
    EN_TRY(en_gguf_get_i64(g, key, out, err));
    if (*out < 0 || *out > (int64_t)1 << 30)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: key '%s' has implausible value %lld",
                      en_gguf_name(g), key, (long long)*out);
    return EN_OK;
}

/* A token id key; absent, or outside the vocabulary (llama.cpp writes -1
 * as 4294967295 for "none"), gives -1. */
static en_status gg_token_id(const en_gguf *g, const char *key, int64_t *out, en_err *err) {
    en_gguf_value toks;
    *out = -1;
    if (en_gguf_find_kv(g, key) < 0) return EN_OK;
    int64_t v;
    EN_TRY(en_gguf_get_i64(g, key, &v, err));
    EN_TRY(en_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, err));
    if (v >= 0 && (uint64_t)v < toks.n) *out = v;
    return EN_OK;
}

/* Does the string key equal `want`? (absent: 0) */
static int gg_str_is(const en_gguf *g, const char *key, const char *want) {
    const char *s;
    size_t n;
    if (en_gguf_find_kv(g, key) < 0) return 0;
    if (en_gguf_get_str(g, key, &s, &n, NULL) != EN_OK) return 0;
    return n == strlen(want) && memcmp(s, want, n) == 0;
}

/* Architecture check, hyper-parameters, and refusal of what config.json
 * (as we write it) cannot express. */
static en_status read_hparams(const en_gguf *g, en_model_hparams *hp, en_err *err) {
    const char *name = en_gguf_name(g), *s;
    size_t n;
    EN_TRY(en_gguf_get_str(g, "general.architecture", &s, &n, err));
    if (n != 5 || memcmp(s, "llama", 5) != 0)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "%s: general.architecture '%.*s' is not supported by convert gguf yet",
                      name, (int)(n > 64 ? 64 : n), s);
    static const char *const refused[] = {
        "llama.rope.scaling.type",     "llama.rope.scaling.factor",
        "llama.rope.scaling.original_context_length", "llama.rope.scale_linear",
        "llama.expert_count",          "llama.attention.sliding_window",
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        if (en_gguf_find_kv(g, refused[i]) >= 0)
            return EN_ERR(err, EN_ERR_UNSUPPORTED,
                          "%s: key '%s' is not supported by convert gguf yet", name,
                          refused[i]);
    int64_t C, F, L, H, KV, D, ctx, bos, eos, rope_dim;
    EN_TRY(gg_int(g, "llama.embedding_length", 1, 0, &C, err));
    EN_TRY(gg_int(g, "llama.feed_forward_length", 1, 0, &F, err));
    EN_TRY(gg_int(g, "llama.block_count", 1, 0, &L, err));
    EN_TRY(gg_int(g, "llama.attention.head_count", 1, 0, &H, err));
    EN_TRY(gg_int(g, "llama.attention.head_count_kv", 0, H, &KV, err));
    if (C <= 0 || F <= 0 || L <= 0 || H <= 0 || KV <= 0 || H % KV)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: implausible llama sizes (embedding %lld, ff %lld, blocks %lld, "
                      "heads %lld, kv heads %lld)",
                      name, (long long)C, (long long)F, (long long)L, (long long)H,
                      (long long)KV);
    EN_TRY(gg_int(g, "llama.attention.key_length", 0, C / H, &D, err));
    if (en_gguf_find_kv(g, "llama.attention.value_length") >= 0) {
        int64_t vd;
        EN_TRY(gg_int(g, "llama.attention.value_length", 1, 0, &vd, err));
        if (vd != D)
            return EN_ERR(err, EN_ERR_UNSUPPORTED,
                          "%s: key 'llama.attention.value_length' (%lld) differs from the key "
                          "length (%lld); not supported",
                          name, (long long)vd, (long long)D);
    }
    EN_TRY(gg_int(g, "llama.rope.dimension_count", 0, D, &rope_dim, err));
    if (rope_dim != D || D <= 0 || D % 2)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "%s: key 'llama.rope.dimension_count' (%lld) must equal the head "
                      "dimension (%lld)",
                      name, (long long)rope_dim, (long long)D);
    EN_TRY(gg_int(g, "llama.context_length", 0, 2048, &ctx, err));
    EN_TRY(gg_token_id(g, "tokenizer.ggml.bos_token_id", &bos, err));
    EN_TRY(gg_token_id(g, "tokenizer.ggml.eos_token_id", &eos, err));
    double eps = 1e-5, theta = 10000.0;
    if (en_gguf_find_kv(g, "llama.attention.layer_norm_rms_epsilon") >= 0)
        EN_TRY(en_gguf_get_f64(g, "llama.attention.layer_norm_rms_epsilon", &eps, err));
    if (en_gguf_find_kv(g, "llama.rope.freq_base") >= 0)
        EN_TRY(en_gguf_get_f64(g, "llama.rope.freq_base", &theta, err));
    en_gguf_value toks;
    EN_TRY(en_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, err));
    if (toks.elem_type != EN_GGUF_TYPE_STRING || toks.n == 0 || toks.n > (1u << 24))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: key 'tokenizer.ggml.tokens' is not a list of "
                      "strings of plausible length", name);
    memset(hp, 0, sizeof *hp);
    snprintf(hp->model_type, sizeof hp->model_type, "llama");
    hp->n_vocab = (int)toks.n;
    hp->n_embd = (int)C;
    hp->n_ff = (int)F;
    hp->n_layer = (int)L;
    hp->n_head = (int)H;
    hp->n_kv_head = (int)KV;
    hp->head_dim = (int)D;
    hp->max_pos = (int)ctx;
    hp->rope_theta = (float)theta;
    hp->norm_eps = (float)eps;
    hp->tie_embeddings = en_gguf_find_tensor(g, "output.weight") == NULL;
    hp->bos_id = (int)bos;
    hp->eos_id = (int)eos;
    return EN_OK;
}

/* Undo llama.cpp's permute: within each head of D rows, GGUF row 2i+c is
 * Hugging Face row c*D/2 + i (c = 0, 1). */
static void unpermute_rows(float *dst, const float *src, int64_t n_heads, int64_t D,
                           int64_t C) {
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t i = 0; i < D / 2; i++)
            for (int64_t c = 0; c < 2; c++)
                memcpy(dst + (h * D + c * (D / 2) + i) * C, src + (h * D + 2 * i + c) * C,
                       (size_t)C * sizeof(float));
}

typedef struct tensor_job {
    char gguf[64], hf[96];
    int64_t rows, cols; /* HF shape; cols 0 for vectors */
    int64_t perm_heads; /* >0: undo the q/k permutation with this many heads */
} tensor_job;

static int add_job(tensor_job *j, int k, const char *gguf, const char *hf, int64_t rows,
                   int64_t cols, int64_t perm_heads) {
    snprintf(j[k].gguf, sizeof j[k].gguf, "%s", gguf);
    snprintf(j[k].hf, sizeof j[k].hf, "%s", hf);
    j[k].rows = rows;
    j[k].cols = cols;
    j[k].perm_heads = perm_heads;
    return k + 1;
}

/* The list of tensors to convert, in Hugging Face order. Returns the count. */
static int plan_tensors(const en_model_hparams *hp, tensor_job *j) {
    int64_t V = hp->n_vocab, C = hp->n_embd, F = hp->n_ff, D = hp->head_dim;
    int64_t QD = D * hp->n_head, KVD = D * hp->n_kv_head;
    char a[64], b[96];
    int k = add_job(j, 0, "token_embd.weight", "model.embed_tokens.weight", V, C, 0);
    for (int l = 0; l < hp->n_layer; l++) {
#define J(gg, hf, r, c, p)                                                     \
    do {                                                                       \
        snprintf(a, sizeof a, "blk.%d.%s.weight", l, gg);                      \
        snprintf(b, sizeof b, "model.layers.%d.%s.weight", l, hf);             \
        k = add_job(j, k, a, b, r, c, p);                                      \
    } while (0)
        J("attn_norm", "input_layernorm", C, 0, 0);
        J("attn_q", "self_attn.q_proj", QD, C, hp->n_head);
        J("attn_k", "self_attn.k_proj", KVD, C, hp->n_kv_head);
        J("attn_v", "self_attn.v_proj", KVD, C, 0);
        J("attn_output", "self_attn.o_proj", C, QD, 0);
        J("ffn_norm", "post_attention_layernorm", C, 0, 0);
        J("ffn_gate", "mlp.gate_proj", F, C, 0);
        J("ffn_up", "mlp.up_proj", F, C, 0);
        J("ffn_down", "mlp.down_proj", C, F, 0);
#undef J
    }
    k = add_job(j, k, "output_norm.weight", "model.norm.weight", C, 0, 0);
    if (!hp->tie_embeddings) k = add_job(j, k, "output.weight", "lm_head.weight", V, C, 0);
    return k;
}

/* Dequantise one tensor into a fresh buffer (*out, caller frees). */
static en_status load_tensor(const en_gguf *g, const tensor_job *jb, float **out, en_err *err) {
    const char *name = en_gguf_name(g);
    const en_gguf_tensor *t = en_gguf_find_tensor(g, jb->gguf);
    if (!t) return EN_ERR(err, EN_ERR_FORMAT, "%s: tensor '%s' is missing", name, jb->gguf);
    int64_t d0 = jb->cols ? jb->cols : jb->rows, d1 = jb->cols ? jb->rows : 1;
    if (t->n_dims > 2 || t->dims[0] != d0 || t->dims[1] != d1)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: tensor '%s' has dims [%lld, %lld], expected [%lld, %lld]", name,
                      jb->gguf, (long long)t->dims[0], (long long)t->dims[1], (long long)d0,
                      (long long)d1);
    float *buf = en_malloc((size_t)t->n_elem * sizeof(float));
    float *tmp = jb->perm_heads ? en_malloc((size_t)t->n_elem * sizeof(float)) : NULL;
    en_status s = buf && (tmp || !jb->perm_heads) ? EN_OK
                                                    : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK) s = en_gguf_tensor_to_f32(g, t, jb->perm_heads ? tmp : buf, err);
    if (s == EN_OK && jb->perm_heads)
        unpermute_rows(buf, tmp, jb->perm_heads, jb->rows / jb->perm_heads, jb->cols);
    en_free(tmp);
    if (s != EN_OK) {
        en_free(buf);
        buf = NULL;
    }
    *out = buf;
    return s;
}

static en_status write_tensors(const en_gguf *g, const en_model_hparams *hp, const char *dir,
                               en_err *err) {
    int n_max = 3 + 9 * hp->n_layer;
    tensor_job *jobs = en_calloc((size_t)n_max, sizeof *jobs);
    en_st_writer_item *items = en_calloc((size_t)n_max, sizeof *items);
    float **bufs = en_calloc((size_t)n_max, sizeof *bufs);
    char *path = en_path_join(dir, "model.safetensors");
    en_status s = jobs && items && bufs && path ? EN_OK
                                                : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    int n = s == EN_OK ? plan_tensors(hp, jobs) : 0;
    for (int i = 0; i < n && s == EN_OK; i++) {
        s = load_tensor(g, &jobs[i], &bufs[i], err);
        items[i].name = jobs[i].hf;
        items[i].dtype = EN_DTYPE_F32;
        items[i].n_dims = jobs[i].cols ? 2 : 1;
        items[i].shape[0] = jobs[i].rows;
        items[i].shape[1] = jobs[i].cols;
        items[i].data = bufs[i];
    }
    if (s == EN_OK) s = en_st_write(path, items, n, EN_DTYPE_F32, err);
    for (int i = 0; i < n; i++) en_free(bufs[i]);
    en_free(bufs);
    en_free(items);
    en_free(jobs);
    en_free(path);
    return s;
}

/* Token i of the vocabulary as a new JSON string (NULL when not a string). */
static json_t *token_json(const en_gguf_value *toks, uint64_t i) {
    en_gguf_value e;
    const char *s;
    size_t n;
    if (!en_gguf_arr_get(toks, i, &e) || !en_gguf_value_str(&e, &s, &n)) return NULL;
    return json_stringn(s, n);
}

/* The pre-tokenizer names whose regex is GPT-2's (the ByteLevel default). */
static int pre_is_gpt2(const en_gguf *g) {
    return en_gguf_find_kv(g, "tokenizer.ggml.pre") < 0 ||
           gg_str_is(g, "tokenizer.ggml.pre", "gpt2") ||
           gg_str_is(g, "tokenizer.ggml.pre", "smollm") ||
           gg_str_is(g, "tokenizer.ggml.pre", "default");
}

/* One merge recovered from a SentencePiece-style vocabulary. */
typedef struct spm_merge {
    int64_t l, r;         /* token ids of the two halves */
    double score;         /* score of the merged token */
    int32_t len_l, len_r; /* lengths in characters */
    int64_t seq;          /* order of discovery (keeps the sort stable) */
} spm_merge;

static int cmp_local(const void *a, const void *b) {
    const spm_merge *x = a, *y = b;
    if (x->l != y->l) return x->l < y->l ? -1 : 1;
    return (x->r > y->r) - (x->r < y->r);
}

/* Higher score first, then longer left, longer right, then discovery order. */
static int cmp_global(const void *a, const void *b) {
    const spm_merge *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->len_l != y->len_l) return x->len_l > y->len_l ? -1 : 1;
    if (x->len_r != y->len_r) return x->len_r > y->len_r ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

static int32_t utf8_chars(const char *s, size_t n) {
    int32_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Vocabulary id of the NUL-terminated piece, or -1. */
static int64_t vocab_id(json_t *vocab, const char *piece) {
    json_t *v = json_object_get(vocab, piece);
    return v ? (int64_t)json_integer_value(v) : -1;
}

/* Merges a BPE needs to rebuild every token of a scored vocabulary: every
 * split of a token into two tokens, the token's pairs ordered by the halves'
 * ids, all of them by the merged token's score (highest first), then by the
 * halves' lengths (longest first) -- the order transformers derives. */
static en_status spm_merges(const en_gguf *g, const en_gguf_value *toks, json_t *vocab,
                            json_t **out, en_err *err) {
    en_gguf_value scores;
    EN_TRY(en_gguf_get_arr(g, "tokenizer.ggml.scores", &scores, err));
    if (scores.n != toks->n)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: key 'tokenizer.ggml.scores' has %llu entries "
                      "for %llu tokens", en_gguf_name(g), (unsigned long long)scores.n,
                      (unsigned long long)toks->n);
    size_t cap = 1024, n = 0;
    spm_merge *mg = en_malloc(cap * sizeof *mg);
    json_t *ml = json_array();
    en_status s = mg && ml ? EN_OK : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    char left[1024], right[1024];
    for (uint64_t i = 0; i < toks->n && s == EN_OK; i++) {
        en_gguf_value e, sc;
        const char *str;
        size_t len;
        double score;
        if (!en_gguf_arr_get(toks, i, &e) || !en_gguf_value_str(&e, &str, &len) ||
            len >= sizeof left || !en_gguf_arr_get(&scores, i, &sc) ||
            !en_gguf_value_f64(&sc, &score)) {
            s = EN_ERR(err, EN_ERR_FORMAT, "%s: token %llu or its score is unusable",
                       en_gguf_name(g), (unsigned long long)i);
            break;
        }
        memcpy(left, str, len);
        left[len] = 0;
        if (vocab_id(vocab, left) != (int64_t)i) continue; /* a later duplicate wins */
        size_t first = n;
        for (size_t k = 1; k < len && s == EN_OK; k++) {
            if (((unsigned char)str[k] & 0xC0) == 0x80) continue; /* inside a character */
            memcpy(left, str, k);
            left[k] = 0;
            memcpy(right, str + k, len - k);
            right[len - k] = 0;
            int64_t l = vocab_id(vocab, left), r = l >= 0 ? vocab_id(vocab, right) : -1;
            if (r < 0) continue;
            if (n == cap) {
                spm_merge *grown = en_realloc(mg, 2 * cap * sizeof *mg);
                if (!grown) {
                    s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
                    break;
                }
                mg = grown;
                cap *= 2;
            }
            mg[n++] = (spm_merge){l, r, score, utf8_chars(str, k), utf8_chars(str + k, len - k), 0};
        }
        qsort(mg + first, n - first, sizeof *mg, cmp_local);
    }
    for (size_t i = 0; i < n; i++) mg[i].seq = (int64_t)i;
    if (s == EN_OK) qsort(mg, n, sizeof *mg, cmp_global);
    for (size_t i = 0; i < n && s == EN_OK; i++) {
        json_t *pair = json_array();
        json_array_append_new(pair, token_json(toks, (uint64_t)mg[i].l));
        json_array_append_new(pair, token_json(toks, (uint64_t)mg[i].r));
        if (json_array_append_new(ml, pair)) s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    en_free(mg);
    if (s != EN_OK) json_decref(ml);
    else *out = ml;
    return s;
}

/* tokenizer.json's "model": BPE with the vocabulary and merges (from the
 * file for gpt2; for a SentencePiece-style vocabulary (spm) derived from the
 * scores, with byte fallback). */
static en_status bpe_model_json(const en_gguf *g, int spm, json_t **out, en_err *err) {
    en_gguf_value toks, merges = {0};
    EN_TRY(en_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, err));
    if (!spm) EN_TRY(en_gguf_get_arr(g, "tokenizer.ggml.merges", &merges, err));
    if (!spm && merges.elem_type != EN_GGUF_TYPE_STRING)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: key 'tokenizer.ggml.merges' is not a list of "
                      "strings", en_gguf_name(g));
    json_t *m = json_object(), *vocab = json_object(), *ml = spm ? NULL : json_array();
    en_status s = m && vocab && (ml || spm) ? EN_OK : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < toks.n && s == EN_OK; i++) {
        en_gguf_value e;
        const char *str;
        size_t n;
        char key[1024];
        if (!en_gguf_arr_get(&toks, i, &e) || !en_gguf_value_str(&e, &str, &n) ||
            n >= sizeof key || memchr(str, 0, n)) {
            s = EN_ERR(err, EN_ERR_FORMAT, "%s: token %llu of 'tokenizer.ggml.tokens' is not "
                       "a usable string", en_gguf_name(g), (unsigned long long)i);
            break;
        }
        memcpy(key, str, n);
        key[n] = 0;
        json_object_set_new(vocab, key, json_integer((json_int_t)i));
    }
    for (uint64_t i = 0; i < merges.n && s == EN_OK; i++) {
        json_t *str = token_json(&merges, i);
        if (!str) s = EN_ERR(err, EN_ERR_FORMAT, "%s: bad merge %llu", en_gguf_name(g),
                             (unsigned long long)i);
        else json_array_append_new(ml, str);
    }
    if (s == EN_OK && spm) s = spm_merges(g, &toks, vocab, &ml, err);
    if (s != EN_OK) {
        json_decref(m);
        json_decref(vocab);
        json_decref(ml);
        return s;
    }
    json_object_set_new(m, "type", json_string("BPE"));
    json_object_set_new(m, "dropout", json_null());
    int64_t unk = -1;
    if (spm && gg_token_id(g, "tokenizer.ggml.unknown_token_id", &unk, NULL) != EN_OK) unk = -1;
    json_t *unk_text = unk >= 0 ? token_json(&toks, (uint64_t)unk) : NULL;
    json_object_set_new(m, "unk_token", unk_text ? unk_text : json_null());
    json_object_set_new(m, "continuing_subword_prefix", spm ? json_null() : json_string(""));
    json_object_set_new(m, "end_of_word_suffix", spm ? json_null() : json_string(""));
    json_object_set_new(m, "fuse_unk", json_boolean(spm));
    json_object_set_new(m, "byte_fallback", json_boolean(spm));
    json_object_set_new(m, "ignore_merges", json_false());
    json_object_set_new(m, "vocab", vocab);
    json_object_set_new(m, "merges", ml);
    *out = m;
    return EN_OK;
}

/* added_tokens: control (3) tokens as special, user-defined (4) as not. */
static json_t *added_tokens_json(const en_gguf *g) {
    json_t *a = json_array();
    en_gguf_value toks, types;
    if (en_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, NULL) != EN_OK ||
        en_gguf_get_arr(g, "tokenizer.ggml.token_type", &types, NULL) != EN_OK)
        return a;
    for (uint64_t i = 0; i < types.n && i < toks.n; i++) {
        en_gguf_value e;
        int64_t ty;
        if (!en_gguf_arr_get(&types, i, &e) || !en_gguf_value_i64(&e, &ty)) break;
        if (ty != 3 && ty != 4) continue;
        json_t *t = json_object();
        json_object_set_new(t, "id", json_integer((json_int_t)i));
        json_object_set_new(t, "content", token_json(&toks, i));
        json_object_set_new(t, "single_word", json_false());
        json_object_set_new(t, "lstrip", json_false());
        json_object_set_new(t, "rstrip", json_false());
        json_object_set_new(t, "normalized", json_boolean(ty == 4));
        json_object_set_new(t, "special", json_boolean(ty == 3));
        json_array_append_new(a, t);
    }
    return a;
}

static json_t *metaspace_json(void) {
    json_t *p = json_object();
    json_object_set_new(p, "type", json_string("Metaspace"));
    json_object_set_new(p, "replacement", json_string("\xe2\x96\x81"));
    json_object_set_new(p, "prepend_scheme", json_string("first"));
    json_object_set_new(p, "split", json_false());
    return p;
}

/* Replace("▁", " "), ByteFallback, Fuse, Strip one leading space. */
static json_t *spm_decoder_json(void) {
    json_t *seq = json_array(), *d = json_object(), *pat = json_object();
    json_object_set_new(pat, "String", json_string("\xe2\x96\x81"));
    json_object_set_new(d, "type", json_string("Replace"));
    json_object_set_new(d, "pattern", pat);
    json_object_set_new(d, "content", json_string(" "));
    json_array_append_new(seq, d);
    json_array_append_new(seq, json_pack("{s:s}", "type", "ByteFallback"));
    json_array_append_new(seq, json_pack("{s:s}", "type", "Fuse"));
    json_array_append_new(seq, json_pack("{s:s, s:s, s:i, s:i}", "type", "Strip", "content", " ",
                                         "start", 1, "stop", 0));
    return json_pack("{s:s, s:o}", "type", "Sequence", "decoders", seq);
}

static json_t *byte_level_json(void) {
    json_t *p = json_object();
    json_object_set_new(p, "type", json_string("ByteLevel"));
    json_object_set_new(p, "add_prefix_space", json_false());
    json_object_set_new(p, "trim_offsets", json_true());
    json_object_set_new(p, "use_regex", json_true());
    return p;
}

/* Text of token `id` as a new JSON string, or NULL when id < 0. */
static json_t *token_text(const en_gguf *g, int64_t id) {
    en_gguf_value toks;
    if (id < 0 || en_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, NULL) != EN_OK)
        return NULL;
    return token_json(&toks, (uint64_t)id);
}

static void set_token(json_t *o, const char *key, const en_gguf *g, int64_t id) {
    json_t *t = token_text(g, id);
    if (t) json_object_set_new(o, key, t);
}

/* tokenizer_config.json, generation_config.json and chat_template.jinja. */
static en_status write_tok_config(const en_gguf *g, const en_model_hparams *hp, int spm,
                                  const char *dir, en_err *err) {
    int64_t unk, pad;
    EN_TRY(gg_token_id(g, "tokenizer.ggml.unknown_token_id", &unk, err));
    EN_TRY(gg_token_id(g, "tokenizer.ggml.padding_token_id", &pad, err));
    int add_bos = spm, add_eos = 0; /* llama.cpp's defaults */
    if (en_gguf_find_kv(g, "tokenizer.ggml.add_bos_token") >= 0)
        EN_TRY(en_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos, err));
    if (en_gguf_find_kv(g, "tokenizer.ggml.add_eos_token") >= 0)
        EN_TRY(en_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &add_eos, err));
    json_t *c = json_object();
    json_object_set_new(c, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
    json_object_set_new(c, "add_bos_token", json_boolean(add_bos));
    json_object_set_new(c, "add_eos_token", json_boolean(add_eos));
    set_token(c, "bos_token", g, hp->bos_id);
    set_token(c, "eos_token", g, hp->eos_id);
    set_token(c, "unk_token", g, unk);
    set_token(c, "pad_token", g, pad);
    json_object_set_new(c, "clean_up_tokenization_spaces", json_false());
    en_status s = en_hf_write_json(c, dir, "tokenizer_config.json", err);
    json_decref(c);
    if (s != EN_OK) return s;
    json_t *gc = json_object();
    if (hp->bos_id >= 0) json_object_set_new(gc, "bos_token_id", json_integer(hp->bos_id));
    if (hp->eos_id >= 0) json_object_set_new(gc, "eos_token_id", json_integer(hp->eos_id));
    if (pad >= 0 && pad < hp->n_vocab)
        json_object_set_new(gc, "pad_token_id", json_integer((json_int_t)pad));
    s = en_hf_write_json(gc, dir, "generation_config.json", err);
    json_decref(gc);
    if (s != EN_OK || en_gguf_find_kv(g, "tokenizer.chat_template") < 0) return s;
    const char *tpl;
    size_t n;
    EN_TRY(en_gguf_get_str(g, "tokenizer.chat_template", &tpl, &n, err));
    char *path = en_path_join(dir, "chat_template.jinja");
    s = path ? en_file_write_atomic(path, tpl, n, err)
             : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    en_free(path);
    return s;
}

/* Check the tokenizer kind before anything is written; *spm: 1 for a
 * SentencePiece-style vocabulary, 0 for byte-level BPE. */
static en_status check_tokenizer(const en_gguf *g, int *spm, en_err *err) {
    const char *name = en_gguf_name(g), *s;
    size_t n;
    EN_TRY(en_gguf_get_str(g, "tokenizer.ggml.model", &s, &n, err));
    *spm = n == 5 && memcmp(s, "llama", 5) == 0;
    if (*spm) return EN_OK;
    if (n == 4 && memcmp(s, "gpt2", 4) == 0) {
        if (pre_is_gpt2(g)) return EN_OK;
        const char *pre;
        size_t pn;
        EN_TRY(en_gguf_get_str(g, "tokenizer.ggml.pre", &pre, &pn, err));
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "%s: tokenizer.ggml.pre '%.*s' is not supported by convert gguf yet "
                      "(only GPT-2's pre-tokenizer regex: gpt2, smollm, default)",
                      name, (int)(pn > 64 ? 64 : pn), pre);
    }
    return EN_ERR(err, EN_ERR_UNSUPPORTED,
                  "%s: tokenizer.ggml.model '%.*s' is not supported by convert gguf yet "
                  "(only 'gpt2', byte-level BPE, and 'llama', SentencePiece-style)",
                  name, (int)(n > 64 ? 64 : n), s);
}

/* TemplateProcessing adding bos and/or eos around each sequence, so that
 * transformers adds them as llama.cpp does; NULL (json null) when neither. */
static json_t *post_processor_json(const en_gguf *g, const en_model_hparams *hp, int add_bos,
                                   int add_eos) {
    json_t *bos = add_bos ? token_text(g, hp->bos_id) : NULL;
    json_t *eos = add_eos ? token_text(g, hp->eos_id) : NULL;
    if (!bos && !eos) return json_null();
    json_t *single = json_array(), *pair = json_array(), *special = json_object();
    for (int seq = 0; seq < 2; seq++) {
        const char *id = seq ? "B" : "A";
        json_t *arrs[2] = {single, pair};
        for (int a = seq; a < 2; a++) {
            if (bos)
                json_array_append_new(arrs[a], json_pack("{s:{s:O, s:i}}", "SpecialToken", "id",
                                                         bos, "type_id", seq));
            json_array_append_new(arrs[a], json_pack("{s:{s:s, s:i}}", "Sequence", "id", id,
                                                     "type_id", seq));
            if (eos)
                json_array_append_new(arrs[a], json_pack("{s:{s:O, s:i}}", "SpecialToken", "id",
                                                         eos, "type_id", seq));
        }
    }
    if (bos)
        json_object_set_new(special, json_string_value(bos),
                            json_pack("{s:O, s:[i], s:[O]}", "id", bos, "ids", hp->bos_id,
                                      "tokens", bos));
    if (eos)
        json_object_set_new(special, json_string_value(eos),
                            json_pack("{s:O, s:[i], s:[O]}", "id", eos, "ids", hp->eos_id,
                                      "tokens", eos));
    json_decref(bos);
    json_decref(eos);
    return json_pack("{s:s, s:o, s:o, s:o}", "type", "TemplateProcessing", "single", single,
                     "pair", pair, "special_tokens", special);
}

static en_status write_tokenizer(const en_gguf *g, const en_model_hparams *hp, int spm,
                                 const char *dir, en_err *err) {
    json_t *model = NULL;
    EN_TRY(bpe_model_json(g, spm, &model, err));
    json_t *r = json_object();
    json_object_set_new(r, "version", json_string("1.0"));
    json_object_set_new(r, "truncation", json_null());
    json_object_set_new(r, "padding", json_null());
    json_object_set_new(r, "added_tokens", added_tokens_json(g));
    json_object_set_new(r, "normalizer", json_null());
    json_object_set_new(r, "pre_tokenizer", spm ? metaspace_json() : byte_level_json());
    int add_bos = spm, add_eos = 0; /* llama.cpp's defaults */
    if (en_gguf_find_kv(g, "tokenizer.ggml.add_bos_token") >= 0 &&
        en_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos, NULL) != EN_OK)
        add_bos = spm;
    if (en_gguf_find_kv(g, "tokenizer.ggml.add_eos_token") >= 0 &&
        en_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &add_eos, NULL) != EN_OK)
        add_eos = 0;
    json_object_set_new(r, "post_processor", post_processor_json(g, hp, add_bos, add_eos));
    json_object_set_new(r, "decoder", spm ? spm_decoder_json() : byte_level_json());
    json_object_set_new(r, "model", model);
    en_status s = en_hf_write_json(r, dir, "tokenizer.json", err);
    json_decref(r);
    if (s == EN_OK) s = write_tok_config(g, hp, spm, dir, err);
    return s;
}

en_status en_convert_gguf(const char *gguf_path, const char *out_dir, en_err *err) {
    en_gguf *g = NULL;
    EN_TRY(en_gguf_open(gguf_path, &g, err));
    en_model_hparams hp;
    int spm = 0;
    en_status s = read_hparams(g, &hp, err);
    if (s == EN_OK) s = check_tokenizer(g, &spm, err);
    if (s == EN_OK) s = en_mkdir_p(out_dir, err);
    if (s == EN_OK) s = write_tensors(g, &hp, out_dir, err);
    if (s == EN_OK) s = en_hf_write_config(&hp, out_dir, err);
    if (s == EN_OK) s = write_tokenizer(g, &hp, spm, out_dir, err);
    en_gguf_close(g);
    return s;
}
