/*
 * chat_template.c - the template objects of chat.h: a model's own Jinja
 * chat template (run by jinja.h) or one of chat.c's built-ins, loaded from a
 * model directory the way transformers finds it, rendered into the same
 * en_chat_render the fine-tuner and the server already consume.
 *
 * Variables a Jinja template sees, as transformers' apply_chat_template
 * passes them: messages, tools and documents (null when not given),
 * add_generation_prompt, bos_token and eos_token, and every key of the
 * caller's `extra` object (enable_thinking, ...).
 *
 * Which text is the assistant's (the fine-tuner's loss mask) is found by
 * rendering, not by guessing at the template: for assistant message i,
 *   P = render(messages[:i], add_generation_prompt=true)
 *   Q = render(messages[:i+1], add_generation_prompt=false)
 * and when both are prefixes of the whole render, [|P|, |Q|) is the
 * assistant's turn: what the model writes after the assistant header, up to
 * and including the end-of-turn text. Templates that render earlier turns
 * differently once later ones exist (Qwen3 drops the thinking block of
 * answers before the last question) fail that check for those turns; there
 * the message's content is looked up in the render after the previous span
 * and the span runs to the end of the end-of-turn text that follows it. A
 * message found neither way is an error, never a silently wrong mask.
 *
 * The end-of-turn text comes from a probe: render [user] with the
 * generation prompt and [user, assistant] without; what follows the answer
 * is the turn's end ("<|im_end|>\n", "<|eot_id|>", "<end_of_turn>\n").
 */
#include "chat.h"

#include <string.h>

#include "../common/file.h"
#include "../common/gguf.h"
#include "../common/json.h"
#include "chat_impl.h"
#include "jinja.h"

struct en_chat_template {
    en_jinja *jinja; /* NULL for a built-in */
    en_chat_template_id builtin;
    char *name;   /* what en_chat_template_describe says */
    char *source; /* the Jinja text */
    char *bos_text, *eos_text;
    char *eot;  /* end-of-turn text found by the probe ("" when unknown) */
    char *stop; /* its first line, the stop string */
    const char *stops[1];
    int n_stops;
};

void en_chat_template_destroy(en_chat_template *t) {
    if (!t) return;
    en_jinja_destroy(t->jinja);
    en_free(t->name);
    en_free(t->source);
    en_free(t->bos_text);
    en_free(t->eos_text);
    en_free(t->eot);
    en_free(t->stop);
    en_free(t);
}

en_status en_chat_template_builtin(en_chat_template_id id, en_chat_template **out, en_err *err) {
    *out = NULL;
    if (strcmp(en_chat_template_name(id), "unknown") == 0)
        return EN_ERR(err, EN_ERR_ARG, "chat template id %d is not valid", (int)id);
    en_chat_template *t = en_calloc(1, sizeof *t);
    if (!t || !(t->name = en_strdup(en_chat_template_name(id)))) {
        en_chat_template_destroy(t);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    t->builtin = id;
    *out = t;
    return EN_OK;
}

const char *en_chat_template_describe(const en_chat_template *t) { return t->name; }

int en_chat_template_is_jinja(const en_chat_template *t, en_chat_template_id *id) {
    if (!t->jinja && id) *id = t->builtin;
    return t->jinja != NULL;
}

const char *en_chat_template_source(const en_chat_template *t) { return t->source; }

const char *const *en_chat_template_stops(const en_chat_template *t, int *n) {
    if (!t->jinja) return en_chat_template_stop_strings(t->builtin, n);
    if (n) *n = t->n_stops;
    return t->stops;
}

const char *en_chat_template_eot(const en_chat_template *t) {
    return t->jinja ? t->eot : en_chat_template_end_of_turn(t->builtin);
}

int32_t en_chat_template_eot_id(const en_chat_template *t, const en_tokenizer *tok) {
    if (!t->jinja || !t->stop || !t->stop[0]) return -1;
    int32_t *ids = NULL;
    size_t n = 0;
    int32_t id = -1;
    if (en_tokenizer_encode(tok, t->stop, strlen(t->stop), 0, &ids, &n, NULL) == EN_OK && n == 1 &&
        en_tokenizer_is_special(tok, ids[0]))
        id = ids[0];
    if (id < 0) { /* a SentencePiece model encodes specials as text */
        int32_t p = en_tokenizer_piece_id(tok, t->stop);
        if (p >= 0 && en_tokenizer_is_special(tok, p)) id = p;
    }
    en_free(ids);
    return id;
}

/* ---- rendering a Jinja template ---- */

/* Content given as a list of parts becomes one string (text parts joined),
 * as OpenAI-compatible servers do for text-only templates. Returns a new
 * reference, or NULL with err set. */
static json_t *flat_content(const json_t *content, int i, en_err *err) {
    if (!json_is_array(content)) return json_incref((json_t *)content);
    size_t cap = 64, len = 0, k;
    /* bound: grown below to len + n + 1 before each part's n bytes are copied */
    char *buf = en_malloc(cap);
    const json_t *part;
    json_array_foreach(content, k, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        const char *text = json_string_value(json_object_get(part, "text"));
        if (!type || strcmp(type, "text") != 0 || !text) {
            en_free(buf);
            EN_ERR(err, EN_ERR_ARG,
                   "message %d: content part %zu is not {\"type\": \"text\", \"text\": ...} "
                   "(only text content is supported)",
                   i, k);
            return NULL;
        }
        size_t n = strlen(text);
        if (buf && len + n + 1 > cap) {
            while (len + n + 1 > cap)
                cap *= 2;
            char *p = en_realloc(buf, cap);
            if (!p) en_free(buf);
            buf = p;
        }
        if (buf) memcpy(buf + len, text, n);
        len += n;
    }
    json_t *s = buf ? json_stringn(buf, len) : NULL;
    en_free(buf);
    if (!s) EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    return s;
}

/* A copy of messages[0, n) with each message checked and its content
 * flattened (the message objects are shallow copies). */
static json_t *prepare_messages(const json_t *messages, size_t n, en_err *err) {
    json_t *out = json_array();
    for (size_t i = 0; out && i < n; i++) {
        const json_t *m = json_array_get(messages, i);
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role"))) {
            EN_ERR(err, EN_ERR_ARG, "message %zu: not an object with a string \"role\"", i);
            json_decref(out);
            return NULL;
        }
        json_t *c = json_object_get(m, "content");
        json_t *copy = json_copy((json_t *)m);
        if (copy && c) {
            json_t *fc = flat_content(c, (int)i, err);
            if (!fc) {
                json_decref(copy);
                json_decref(out);
                return NULL;
            }
            json_object_set_new(copy, "content", fc);
        }
        if (!copy || json_array_append_new(out, copy) != 0) {
            json_decref(out);
            EN_ERR(err, EN_ERR_NOMEM, "out of memory");
            return NULL;
        }
    }
    if (!out) EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    return out;
}

/* Render the first n messages (already prepared) to a new string. */
static en_status render_text(const en_chat_template *t, const json_t *msgs, size_t n,
                             const json_t *extra, int gen, char **text, size_t *len,
                             en_err *err) {
    json_t *vars = json_object();
    json_t *part = json_array();
    for (size_t i = 0; part && i < n; i++)
        json_array_append(part, json_array_get(msgs, i));
    if (!vars || !part) {
        json_decref(vars);
        json_decref(part);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    json_object_set_new(vars, "tools", json_null());
    json_object_set_new(vars, "documents", json_null());
    if (t->bos_text[0]) json_object_set_new(vars, "bos_token", json_string(t->bos_text));
    if (t->eos_text[0]) json_object_set_new(vars, "eos_token", json_string(t->eos_text));
    if (json_is_object(extra)) json_object_update(vars, (json_t *)extra);
    json_object_set_new(vars, "messages", part);
    json_object_set_new(vars, "add_generation_prompt", json_boolean(gen));
    en_status s = en_jinja_render(t->jinja, vars, text, len, err);
    json_decref(vars);
    return s;
}

static int starts_with(const char *s, size_t n, const char *p, size_t m) {
    return m <= n && memcmp(s, p, m) == 0;
}

/* Find `needle` in text[from, len); returns its offset or (size_t)-1. */
static size_t find_from(const char *text, size_t len, size_t from, const char *needle,
                        size_t m) {
    if (m == 0 || from > len) return (size_t)-1;
    const char *p = memmem(text + from, len - from, needle, m);
    return p ? (size_t)(p - text) : (size_t)-1;
}

/* The span of assistant message i by looking up its content (see the top
 * of the file). 1 when found. */
static int span_by_content(const en_chat_template *t, const json_t *msg, const char *text,
                           size_t len, size_t from, size_t *a, size_t *b) {
    const char *c = json_string_value(json_object_get(msg, "content"));
    if (!c) return 0;
    size_t m = strlen(c);
    /* Templates often trim content: try the trimmed text too. */
    size_t lead = 0;
    while (lead < m && strchr(" \t\r\n", c[lead]))
        lead++;
    while (m > lead && strchr(" \t\r\n", c[m - 1]))
        m--;
    size_t at = find_from(text, len, from, c + lead, m - lead);
    if (at == (size_t)-1) return 0;
    size_t end = at + (m - lead);
    size_t eot = strlen(t->eot);
    if (eot && starts_with(text + end, len - end, t->eot, eot))
        end += eot;
    else if (t->stop && starts_with(text + end, len - end, t->stop, strlen(t->stop)))
        end += strlen(t->stop);
    *a = at;
    *b = end;
    return 1;
}

/* The span of assistant message i by prefix renders. 1 when it holds. */
static en_status span_by_prefix(const en_chat_template *t, const json_t *msgs, size_t i,
                                const json_t *extra, const char *text, size_t len, size_t from,
                                size_t *a, size_t *b, int *ok, en_err *err) {
    *ok = 0;
    if (i == 0) return EN_OK;
    char *p = NULL, *q = NULL;
    size_t np = 0, nq = 0;
    en_err ignore = {0};
    /* A template may refuse a partial conversation: then use the content. */
    if (render_text(t, msgs, i, extra, 1, &p, &np, &ignore) == EN_OK &&
        render_text(t, msgs, i + 1, extra, 0, &q, &nq, &ignore) == EN_OK) {
        if (np >= from && nq > np && starts_with(text, len, p, np) &&
            starts_with(text, len, q, nq)) {
            *a = np;
            *b = nq;
            *ok = 1;
        }
    } else if (ignore.status == EN_ERR_NOMEM) {
        en_free(p);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    en_free(p);
    en_free(q);
    return EN_OK;
}

/* Split text into context and train segments, one per assistant message. */
static en_status build_spans(const en_chat_template *t, const json_t *msgs, const json_t *extra,
                             const char *text, size_t len, en_chat_render *r, en_err *err) {
    size_t done = 0, i;
    const json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (strcmp(role, "assistant") != 0) continue;
        size_t a = 0, b = 0;
        int ok;
        EN_TRY(span_by_prefix(t, msgs, i, extra, text, len, done, &a, &b, &ok, err));
        if (!ok && !span_by_content(t, m, text, len, done, &a, &b))
            return EN_ERR(err, EN_ERR_ARG,
                          "message %zu: cannot find this assistant message in the text %s "
                          "renders (the template changes or drops it), so its tokens cannot "
                          "be marked for training",
                          i, t->name);
        en_chat_emit(r, text + done, a - done, 0, 0, 0);
        en_chat_emit(r, text + a, b - a, 1, 0, 0);
        done = b;
    }
    en_chat_emit(r, text + done, len - done, 0, 0, 0);
    return EN_OK;
}

/* Built-in templates take en_chat_msg: role and content strings. */
static en_status render_builtin(const en_chat_template *t, const json_t *msgs, int gen,
                                en_chat_render **out, en_err *err) {
    size_t n = json_array_size(msgs);
    en_chat_msg *m = en_calloc(n ? n : 1, sizeof *m);
    if (!m) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *o = json_array_get(msgs, i);
        m[i].role = json_string_value(json_object_get(o, "role"));
        m[i].content = json_string_value(json_object_get(o, "content"));
    }
    en_status s = en_chat_render_create(t->builtin, m, (int)n, gen, out, err);
    en_free(m);
    return s;
}

en_status en_chat_template_render(const en_chat_template *t, const json_t *messages,
                                  const json_t *extra, int add_generation_prompt,
                                  int train_spans, en_chat_render **out, en_err *err) {
    if (!out) return EN_ERR(err, EN_ERR_ARG, "en_chat_template_render: out is NULL");
    *out = NULL;
    if (!t || !json_is_array(messages))
        return EN_ERR(err, EN_ERR_ARG, "chat: \"messages\" must be an array");
    json_t *msgs = prepare_messages(messages, json_array_size(messages), err);
    if (!msgs) return err ? err->status : EN_ERR_ARG;
    en_status s;
    if (!t->jinja) {
        s = render_builtin(t, msgs, add_generation_prompt, out, err);
        json_decref(msgs);
        return s;
    }
    char *text = NULL;
    size_t len = 0;
    s = render_text(t, msgs, json_array_size(msgs), extra, add_generation_prompt, &text, &len,
                    err);
    en_chat_render *r = s == EN_OK ? en_chat_render_new() : NULL;
    if (s == EN_OK && !r) s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK) {
        r->textual = 1;
        if (train_spans)
            s = build_spans(t, msgs, extra, text, len, r, err);
        else
            en_chat_emit(r, text, len, 0, 0, 0);
    }
    if (s == EN_OK)
        s = en_chat_render_finish(r, out, err);
    else
        en_chat_render_destroy(r);
    en_free(text);
    json_decref(msgs);
    return s;
}

/* ---- loading ---- */

/* The end-of-turn text, from a probe conversation (see the top). Leaves
 * eot "" when the template refuses the probe. */
static en_status probe_eot(en_chat_template *t, en_err *err) {
    static const char answer[] = "energon-probe-answer";
    json_t *msgs = json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "user", "content",
                             "energon-probe-question", "role", "assistant", "content", answer);
    if (!msgs) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    char *p = NULL, *q = NULL;
    size_t np = 0, nq = 0;
    en_err ignore = {0};
    const char *eot = "";
    size_t n_eot = 0;
    if (render_text(t, msgs, 1, NULL, 1, &p, &np, &ignore) == EN_OK &&
        render_text(t, msgs, 2, NULL, 0, &q, &nq, &ignore) == EN_OK) {
        size_t at = find_from(q, nq, np <= nq ? np : 0, answer, sizeof answer - 1);
        if (at != (size_t)-1) {
            eot = q + at + sizeof answer - 1;
            n_eot = nq - (at + sizeof answer - 1);
        }
    }
    t->eot = en_strndup(eot, n_eot);
    /* The stop string: the first line of the end-of-turn text, trimmed. */
    size_t a = 0;
    while (a < n_eot && strchr(" \t\r\n", eot[a]))
        a++;
    size_t b = a;
    while (b < n_eot && eot[b] != '\n')
        b++;
    while (b > a && strchr(" \t\r", eot[b - 1]))
        b--;
    t->stop = en_strndup(eot + a, b - a);
    en_free(p);
    en_free(q);
    json_decref(msgs);
    if (!t->eot || !t->stop) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (t->stop[0]) {
        t->stops[0] = t->stop;
        t->n_stops = 1;
    }
    return EN_OK;
}

en_status en_chat_template_from_jinja(const char *src, size_t len, const char *name,
                                      const en_tokenizer *tok, en_chat_template **out,
                                      en_err *err) {
    *out = NULL;
    en_chat_template *t = en_calloc(1, sizeof *t);
    if (!t) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    en_jinja_config cfg = en_jinja_config_default();
    en_status s = en_jinja_create(src, len, name, &cfg, &t->jinja, err);
    if (s == EN_OK) {
        t->name = en_strdup(name);
        t->source = en_strndup(src, len);
        t->bos_text = en_strdup(tok ? en_tokenizer_bos_text(tok) : "");
        t->eos_text = en_strdup(tok ? en_tokenizer_eos_text(tok) : "");
        if (!t->name || !t->source || !t->bos_text || !t->eos_text)
            s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    if (s == EN_OK) s = probe_eot(t, err);
    if (s != EN_OK) {
        en_chat_template_destroy(t);
        return s;
    }
    *out = t;
    return EN_OK;
}

static en_status from_file(const char *path, const en_tokenizer *tok, en_chat_template **out,
                           en_err *err) {
    char *src = NULL;
    size_t len = 0;
    EN_TRY(en_file_read_all(path, &src, &len, err));
    en_status s = en_chat_template_from_jinja(src, len, path, tok, out, err);
    en_free(src);
    return s;
}

/* The template of a .gguf file: its tokenizer.chat_template key, else the
 * built-in fallback. */
static en_status from_gguf(const char *path, const en_tokenizer *tok,
                           en_chat_template_id fallback, en_chat_template **out, en_err *err) {
    en_gguf *g = NULL;
    EN_TRY(en_gguf_open(path, &g, err));
    en_status s;
    if (en_gguf_find_kv(g, "tokenizer.chat_template") >= 0) {
        const char *src;
        size_t len;
        s = en_gguf_get_str(g, "tokenizer.chat_template", &src, &len, err);
        char name[4096];
        snprintf(name, sizeof name, "%s (tokenizer.chat_template)", path);
        if (s == EN_OK) s = en_chat_template_from_jinja(src, len, name, tok, out, err);
    } else {
        s = en_chat_template_builtin(fallback, out, err);
    }
    en_gguf_close(g);
    return s;
}

/* tokenizer_config.json's "chat_template": a string, or a list of
 * {name, template} from which transformers uses "default". */
static const char *config_template(const json_t *root) {
    const json_t *v = json_object_get(root, "chat_template");
    if (json_is_string(v)) return json_string_value(v);
    size_t i;
    const json_t *it;
    json_array_foreach(v, i, it) {
        const char *name = json_string_value(json_object_get(it, "name"));
        if (name && strcmp(name, "default") == 0)
            return json_string_value(json_object_get(it, "template"));
    }
    return NULL;
}

en_status en_chat_template_load(const char *model_dir, const char *override_path,
                                const en_tokenizer *tok, en_chat_template_id fallback,
                                en_chat_template **out, en_err *err) {
    if (!out) return EN_ERR(err, EN_ERR_ARG, "en_chat_template_load: out is NULL");
    *out = NULL;
    if (override_path) return from_file(override_path, tok, out, err);
    if (en_gguf_is_gguf_path(model_dir)) return from_gguf(model_dir, tok, fallback, out, err);
    char *path = en_path_join(model_dir, "chat_template.jinja");
    if (!path) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (en_path_exists(path)) {
        en_status s = from_file(path, tok, out, err);
        en_free(path);
        return s;
    }
    en_free(path);
    path = en_path_join(model_dir, "tokenizer_config.json");
    if (!path) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    json_t *root = NULL;
    en_status s = EN_OK;
    if (en_path_exists(path)) s = en_json_load_file(path, &root, err);
    const char *src = s == EN_OK ? config_template(root) : NULL;
    if (s == EN_OK && src) {
        char name[4096];
        snprintf(name, sizeof name, "%s (chat_template)", path);
        s = en_chat_template_from_jinja(src, strlen(src), name, tok, out, err);
    } else if (s == EN_OK) {
        s = en_chat_template_builtin(fallback, out, err);
    }
    json_decref(root);
    en_free(path);
    return s;
}

int en_chat_template_is_file_name(const char *value) {
    size_t n = value ? strlen(value) : 0;
    return n > 6 && strcmp(value + n - 6, ".jinja") == 0;
}

en_status en_chat_template_select(const char *model_dir, const char *value,
                                  const en_tokenizer *tok, en_chat_template **out, en_err *err) {
    if (!value || en_chat_template_is_file_name(value))
        return en_chat_template_load(model_dir, value, tok, EN_CHAT_PLAIN, out, err);
    en_chat_template_id id;
    if (out) *out = NULL;
    if (en_chat_template_from_name(value, &id, err) != EN_OK) {
        if (err) {
            size_t n = strlen(err->msg);
            snprintf(err->msg + n, sizeof err->msg - n, ", or a file ending in .jinja");
        }
        return EN_ERR_ARG;
    }
    return en_chat_template_builtin(id, out, err);
}
