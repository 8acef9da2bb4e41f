/*
 * chat.c - the chat templates of chat.h. Used by finetune/data.c (loss masks
 * for prompt/completion and chat records) and by the server (prompts).
 *
 * The templates, written with {content} placeholders. "[bos]" and "[eos]"
 * mark token ids (segment flags), not text; "|" marks where a trained
 * segment starts or ends: text between |...| is what the model learns to
 * produce (the assistant content plus the end-of-turn text after it).
 *
 * plain (energon's own, for models trained without special tokens):
 *     {system}\n\n                      (only if there is a system message)
 *     ### Question:\n{user}\n\n         (each user turn)
 *     ### Answer:\n|{assistant}\n\n|    (each assistant turn)
 *   generation prompt: "### Answer:\n". The "\n\n" after an answer is
 *   trained: the model learns to close its answer, and a record then ends
 *   with eos (added by the caller), so at inference it stops at eos; the stop
 *   string "\n\n### Question:" catches a model that goes on to invent the
 *   next question.
 *
 * llama2 (Meta's Llama 2 chat format, as in llama/generation.py):
 *     [bos][INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST]| {assistant} [eos]|
 *     [bos][INST] {user} [/INST]| {assistant} [eos]| ...
 *   The system block goes inside the first user turn, so a system message
 *   must be followed by a user message. "[/INST]" is the assistant header,
 *   so the generation prompt adds nothing. Stop string "[INST]".
 *
 * chatml:
 *     <|im_start|>{role}\n{content}<|im_end|>\n      (system and user)
 *     <|im_start|>assistant\n|{assistant}<|im_end|>\n|
 *   generation prompt "<|im_start|>assistant\n". Stop strings "<|im_end|>"
 *   and "<|im_start|>" (for tokenizers where they are plain text).
 *
 * Content is used verbatim: unlike Meta's code and some Hugging Face
 * templates we do not strip whitespace, so what the caller sends is what the
 * model sees.
 */
#include "chat.h"
#include "chat_impl.h"

#include <string.h>

static const char *const template_names[] = {"plain", "llama2", "chatml"};
#define N_TEMPLATES ((int)(sizeof template_names / sizeof template_names[0]))

en_status en_chat_template_from_name(const char *name, en_chat_template_id *out, en_err *err) {
    for (int i = 0; name && i < N_TEMPLATES; i++)
        if (strcmp(name, template_names[i]) == 0) {
            if (out) *out = (en_chat_template_id)i;
            return EN_OK;
        }
    return EN_ERR(err, EN_ERR_ARG, "unknown chat template \"%s\" (valid: plain, llama2, chatml)",
                  name ? name : "(null)");
}

const char *en_chat_template_name(en_chat_template_id t) {
    return (int)t >= 0 && (int)t < N_TEMPLATES ? template_names[t] : "unknown";
}

int en_chat_template_guess(const char *hf_chat_template, en_chat_template_id *out) {
    if (!hf_chat_template) return 0;
    en_chat_template_id t;
    if (strstr(hf_chat_template, "<|im_start|>"))
        t = EN_CHAT_CHATML;
    else if (strstr(hf_chat_template, "[INST]"))
        t = EN_CHAT_LLAMA2;
    else
        return 0;
    if (out) *out = t;
    return 1;
}

const char *const *en_chat_template_stop_strings(en_chat_template_id t, int *n) {
    static const char *const plain[] = {"\n\n### Question:"};
    static const char *const llama2[] = {"[INST]"};
    static const char *const chatml[] = {"<|im_end|>", "<|im_start|>"};
    int count = 0;
    const char *const *s = NULL;
    switch (t) {
    case EN_CHAT_PLAIN: s = plain, count = 1; break;
    case EN_CHAT_LLAMA2: s = llama2, count = 1; break;
    case EN_CHAT_CHATML: s = chatml, count = 2; break;
    }
    if (n) *n = count;
    return s;
}

const char *en_chat_template_end_of_turn(en_chat_template_id t) {
    return t == EN_CHAT_PLAIN ? "\n\n" : "";
}

/* ---- the render object (struct in chat_impl.h) ---- */

void en_chat_render_destroy(en_chat_render *r) {
    if (!r) return;
    en_free(r->text);
    en_free(r->segs);
    en_free(r);
}

int en_chat_render_n_segments(const en_chat_render *r) { return r ? r->n_segs : 0; }

const en_chat_segment *en_chat_render_segments(const en_chat_render *r) {
    return r ? r->segs : NULL;
}

const char *en_chat_render_text(const en_chat_render *r, size_t *len) {
    if (len) *len = r ? r->len : 0;
    return r ? r->text : NULL;
}

void en_chat_emit(en_chat_render *r, const char *s, size_t n, int train, int bos_before,
                 int eos_after) {
    if (r->failed || (n == 0 && !bos_before && !eos_after)) return;
    if (r->len + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 256;
        while (cap < r->len + n + 1)
            cap *= 2;
        /* bound: cap >= len + n + 1 (the loop above), lengths of text in memory */
        char *p = en_realloc(r->text, cap);
        if (!p) {
            r->failed = 1;
            return;
        }
        r->text = p;
        r->cap = cap;
    }
    memcpy(r->text + r->len, s, n);
    en_chat_segment *last = r->n_segs ? &r->segs[r->n_segs - 1] : NULL;
    if (last && last->train == train && !last->eos_after && !bos_before) {
        last->len += n;
        last->eos_after = eos_after;
    } else {
        if (r->n_segs == r->cap_segs) {
            int cap = r->cap_segs ? 2 * r->cap_segs : 8;
            en_chat_segment *p = en_realloc(r->segs, (size_t)cap * sizeof *p);
            if (!p) {
                r->failed = 1;
                return;
            }
            r->segs = p;
            r->cap_segs = cap;
        }
        en_chat_segment *g = &r->segs[r->n_segs++];
        g->text = (const char *)(uintptr_t)r->len; /* offset until finished */
        g->len = n;
        g->train = train;
        g->bos_before = bos_before;
        g->eos_after = eos_after;
    }
    r->len += n;
    r->text[r->len] = 0;
}

static void emit_str(en_chat_render *r, const char *s, int train) {
    en_chat_emit(r, s, strlen(s), train, 0, 0);
}

static int role_is(const en_chat_msg *m, const char *role) { return strcmp(m->role, role) == 0; }

static en_status validate(en_chat_template_id t, const en_chat_msg *msgs, int n, en_err *err) {
    if ((int)t < 0 || (int)t >= N_TEMPLATES)
        return EN_ERR(err, EN_ERR_ARG, "chat template id %d is not valid", (int)t);
    if (n <= 0 || !msgs) return EN_ERR(err, EN_ERR_ARG, "chat: no messages to render");
    for (int i = 0; i < n; i++) {
        const en_chat_msg *m = &msgs[i];
        if (!m->role) return EN_ERR(err, EN_ERR_ARG, "message %d: role is missing", i);
        if (!role_is(m, "system") && !role_is(m, "user") && !role_is(m, "assistant"))
            return EN_ERR(err, EN_ERR_ARG,
                          "message %d: role \"%.64s\" is not one of system, user, assistant", i,
                          m->role);
        if (!m->content) return EN_ERR(err, EN_ERR_ARG, "message %d: content must be a string", i);
        if (i > 0 && role_is(m, "system"))
            return EN_ERR(err, EN_ERR_ARG, "message %d: a system message may only come first", i);
    }
    if (t == EN_CHAT_LLAMA2 && role_is(&msgs[0], "system") && (n < 2 || !role_is(&msgs[1], "user")))
        return EN_ERR(err, EN_ERR_ARG,
                      "message 0: the llama2 template needs a user message right after the "
                      "system message");
    return EN_OK;
}

static void render_plain(en_chat_render *r, const en_chat_msg *msgs, int n, int gen) {
    for (int i = 0; i < n; i++) {
        const en_chat_msg *m = &msgs[i];
        if (role_is(m, "system")) {
            emit_str(r, m->content, 0);
            emit_str(r, "\n\n", 0);
        } else if (role_is(m, "user")) {
            emit_str(r, "### Question:\n", 0);
            emit_str(r, m->content, 0);
            emit_str(r, "\n\n", 0);
        } else {
            emit_str(r, "### Answer:\n", 0);
            emit_str(r, m->content, 1);
            emit_str(r, "\n\n", 1);
        }
    }
    if (gen) emit_str(r, "### Answer:\n", 0);
}

static void render_llama2(en_chat_render *r, const en_chat_msg *msgs, int n) {
    const char *system = NULL;
    for (int i = 0; i < n; i++) {
        const en_chat_msg *m = &msgs[i];
        if (role_is(m, "system")) {
            system = m->content; /* validate() made sure a user turn follows */
        } else if (role_is(m, "user")) {
            en_chat_emit(r, "[INST] ", 7, 0, 1, 0);
            if (system) {
                emit_str(r, "<<SYS>>\n", 0);
                emit_str(r, system, 0);
                emit_str(r, "\n<</SYS>>\n\n", 0);
                system = NULL;
            }
            emit_str(r, m->content, 0);
            emit_str(r, " [/INST]", 0);
        } else {
            emit_str(r, " ", 1);
            emit_str(r, m->content, 1);
            en_chat_emit(r, " ", 1, 1, 0, 1);
        }
    }
}

static void render_chatml(en_chat_render *r, const en_chat_msg *msgs, int n, int gen) {
    for (int i = 0; i < n; i++) {
        const en_chat_msg *m = &msgs[i];
        emit_str(r, "<|im_start|>", 0);
        emit_str(r, m->role, 0);
        emit_str(r, "\n", 0);
        int train = role_is(m, "assistant");
        emit_str(r, m->content, train);
        emit_str(r, "<|im_end|>\n", train);
    }
    if (gen) emit_str(r, "<|im_start|>assistant\n", 0);
}

en_status en_chat_render_create(en_chat_template_id t, const en_chat_msg *msgs, int n_msgs,
                                int add_generation_prompt, en_chat_render **out, en_err *err) {
    if (!out) return EN_ERR(err, EN_ERR_ARG, "en_chat_render_create: out is NULL");
    *out = NULL;
    EN_TRY(validate(t, msgs, n_msgs, err));
    en_chat_render *r = en_chat_render_new();
    if (!r) return EN_ERR(err, EN_ERR_NOMEM, "chat: out of memory");
    switch (t) {
    case EN_CHAT_PLAIN: render_plain(r, msgs, n_msgs, add_generation_prompt); break;
    case EN_CHAT_LLAMA2: render_llama2(r, msgs, n_msgs); break;
    case EN_CHAT_CHATML: render_chatml(r, msgs, n_msgs, add_generation_prompt); break;
    }
    return en_chat_render_finish(r, out, err);
}

en_chat_render *en_chat_render_new(void) {
    en_chat_render *r = en_calloc(1, sizeof *r);
    if (!r) return NULL;
    r->cap = 256; /* allocated even when the output is empty */
    r->text = en_malloc(r->cap);
    if (r->text)
        r->text[0] = 0;
    else
        r->failed = 1;
    return r;
}

en_status en_chat_render_finish(en_chat_render *r, en_chat_render **out, en_err *err) {
    if (r->failed) {
        size_t len = r->len;
        en_chat_render_destroy(r);
        return EN_ERR(err, EN_ERR_NOMEM, "chat: out of memory rendering %zu bytes", len);
    }
    for (int i = 0; i < r->n_segs; i++)
        r->segs[i].text = r->text + (uintptr_t)r->segs[i].text;
    *out = r;
    return EN_OK;
}

en_status en_chat_render_prompt_completion(en_chat_template_id t, const char *prompt,
                                           const char *completion, en_chat_render **out,
                                           en_err *err) {
    en_chat_msg msgs[2] = {{"user", prompt}, {"assistant", completion}};
    return en_chat_render_create(t, msgs, 2, 0, out, err);
}

/* ---- tokenization ---- */

/* 1 when the tokenizer puts a "▁" (U+2581) in front of every encoded string
 * (SentencePiece's add_dummy_prefix): the first piece of "a" starts with it. */
static int adds_dummy_prefix(const en_tokenizer *tok) {
    int32_t *ids = NULL;
    size_t n = 0;
    int yes = 0;
    if (en_tokenizer_encode(tok, "a", 1, 0, &ids, &n, NULL) == EN_OK && n > 0) {
        const char *p = en_tokenizer_piece(tok, ids[0]);
        yes = p && strncmp(p, "\xe2\x96\x81", 3) == 0;
    }
    en_free(ids);
    return yes;
}

typedef struct id_buf {
    int32_t *ids;
    uint8_t *train;
    size_t n, cap;
} id_buf;

static int push_ids(id_buf *b, const int32_t *ids, size_t n, int train) {
    if (n == 0) return 1;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n)
            cap *= 2;
        /* bound: cap >= n + b->n ids (the loop above); cap * 4 fits: the ids come from text in
         * memory */
        int32_t *pi = en_realloc(b->ids, cap * sizeof *pi);
        if (!pi) return 0;
        b->ids = pi;
        uint8_t *pt = en_realloc(b->train, cap);
        if (!pt) return 0;
        b->train = pt;
        b->cap = cap;
    }
    memcpy(b->ids + b->n, ids, n * sizeof *ids);
    memset(b->train + b->n, train ? 1 : 0, n);
    b->n += n;
    return 1;
}

/* 1 when byte offset `at` of the render's text lies in a train segment. */
static int trained_at(const en_chat_render *r, size_t at) {
    for (int i = 0; i < r->n_segs; i++) {
        size_t a = (size_t)(r->segs[i].text - r->text);
        if (at >= a && at < a + r->segs[i].len) return r->segs[i].train;
    }
    return 0;
}

/* The next bos or eos text at or after `from` in text (SentencePiece models
 * encode special tokens as text, so a Jinja render's "<s>" is found here).
 * Returns its offset (len when none) and sets *id and *n. */
static size_t next_special(const en_tokenizer *tok, const char *text, size_t len, size_t from,
                           int32_t *id, size_t *n) {
    size_t best = len;
    const char *names[2] = {en_tokenizer_bos_text(tok), en_tokenizer_eos_text(tok)};
    const int32_t ids[2] = {en_tokenizer_bos(tok), en_tokenizer_eos(tok)};
    for (int k = 0; k < 2; k++) {
        size_t m = strlen(names[k]);
        if (!m || ids[k] < 0) continue;
        const char *p = memmem(text + from, len - from, names[k], m);
        if (p && (size_t)(p - text) < best) {
            best = (size_t)(p - text);
            *id = ids[k];
            *n = m;
        }
    }
    return best;
}

/* A SentencePiece encode of text with its bos/eos text as ids, with the
 * offset of each id (see en_tokenizer_encode_offsets). */
static en_status encode_spm_specials(const en_tokenizer *tok, const char *text, size_t len,
                                     id_buf *b, size_t **offsets, en_err *err) {
    size_t *off = NULL, off_cap = 0, at = 0;
    en_status st = EN_OK;
    for (;;) {
        int32_t sid = -1;
        size_t sn = 0, n = 0, first = b->n;
        size_t next = next_special(tok, text, len, at, &sid, &sn); /* len: none left */
        int32_t *seg = NULL;
        size_t *so = NULL;
        if (next > at)
            st = en_tokenizer_encode_offsets(tok, text + at, next - at, 0, &seg, &so, &n, err);
        if (st == EN_OK && (!push_ids(b, seg, n, 0) || (sid >= 0 && !push_ids(b, &sid, 1, 0))))
            st = EN_ERR(err, EN_ERR_NOMEM, "chat: out of memory");
        if (st == EN_OK && off_cap < b->cap) { /* one offset per id, as b grows */
            size_t *p = en_realloc(off, b->cap * sizeof *off);
            if (p) off = p, off_cap = b->cap;
            else st = EN_ERR(err, EN_ERR_NOMEM, "chat: out of memory");
        }
        for (size_t i = 0; st == EN_OK && i < n; i++)
            off[first + i] = at + so[i];
        if (st == EN_OK && sid >= 0) off[first + n] = next;
        en_free(seg);
        en_free(so);
        if (st != EN_OK || sid < 0) break;
        at = next + sn;
    }
    if (st != EN_OK) en_free(off);
    *offsets = off;
    return st;
}

/* A render whose special tokens are text (a Jinja template), encoded as
 * transformers does: the whole text at once, no added special ids. */
static en_status encode_textual(const en_chat_render *r, const en_tokenizer *tok, id_buf *b,
                                en_err *err) {
    size_t *off = NULL;
    en_status st;
    if (en_tokenizer_is_hf(tok)) {
        int32_t *ids = NULL;
        size_t n = 0;
        st = en_tokenizer_encode_offsets(tok, r->text, r->len, 0, &ids, &off, &n, err);
        if (st == EN_OK && !push_ids(b, ids, n, 0))
            st = EN_ERR(err, EN_ERR_NOMEM, "chat: out of memory tokenizing %zu bytes", r->len);
        en_free(ids);
    } else {
        st = encode_spm_specials(tok, r->text, r->len, b, &off, err);
    }
    for (size_t i = 0; st == EN_OK && i < b->n; i++)
        b->train[i] = (uint8_t)trained_at(r, off[i]);
    en_free(off);
    return st;
}

en_status en_chat_render_encode(const en_chat_render *r, const en_tokenizer *tok, int add_bos,
                                int add_eos, int32_t **ids, uint8_t **train, size_t *n_ids,
                                en_err *err) {
    if (!r || !tok || !ids || !n_ids)
        return EN_ERR(err, EN_ERR_ARG, "en_chat_render_encode: NULL argument");
    *ids = NULL;
    if (train) *train = NULL;
    *n_ids = 0;
    if (r->textual) {
        id_buf tb = {0};
        en_status ts = encode_textual(r, tok, &tb, err);
        if (ts != EN_OK) {
            en_free(tb.ids);
            en_free(tb.train);
            return ts;
        }
        *ids = tb.ids;
        if (train)
            *train = tb.train;
        else
            en_free(tb.train);
        *n_ids = tb.n;
        return EN_OK;
    }
    const int32_t bos = en_tokenizer_bos(tok), eos = en_tokenizer_eos(tok);
    const int dummy = adds_dummy_prefix(tok);
    id_buf b = {0};
    en_status st = EN_OK;
    int ok = 1;
    if (add_bos && bos >= 0 && !(r->n_segs > 0 && r->segs[0].bos_before))
        ok = push_ids(&b, &bos, 1, 0);
    for (int i = 0; ok && i < r->n_segs; i++) {
        const en_chat_segment *g = &r->segs[i];
        if (g->bos_before && bos >= 0) ok = push_ids(&b, &bos, 1, 0);
        const char *text = g->text;
        size_t len = g->len;
        if (i > 0 && dummy && len > 0 && text[0] == ' ') text++, len--;
        int32_t *seg = NULL;
        size_t n = 0;
        if (ok && len > 0) {
            st = en_tokenizer_encode(tok, text, len, 0, &seg, &n, err);
            if (st != EN_OK) goto fail;
            ok = push_ids(&b, seg, n, g->train);
            en_free(seg);
        }
        if (ok && g->eos_after && eos >= 0) ok = push_ids(&b, &eos, 1, g->train);
    }
    if (ok && add_eos && eos >= 0 && !(r->n_segs > 0 && r->segs[r->n_segs - 1].eos_after))
        ok = push_ids(&b, &eos, 1, r->n_segs > 0 ? r->segs[r->n_segs - 1].train : 0);
    if (!ok) {
        st = EN_ERR(err, EN_ERR_NOMEM, "chat: out of memory tokenizing %zu bytes", r->len);
        goto fail;
    }
    *ids = b.ids;
    if (train)
        *train = b.train;
    else
        en_free(b.train);
    *n_ids = b.n;
    return EN_OK;
fail:
    en_free(b.ids);
    en_free(b.train);
    return st;
}
