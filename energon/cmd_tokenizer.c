/*
 * cmd_tokenizer.c - `energon tokenizer`: train a SentencePiece model, encode
 * a text to ids and decode ids to text with either kind of tokenizer
 * (tokenizer.json or tokenizer.model), and render a conversation with the
 * model's chat template, through tokenizer.h and chat.h.
 *
 *   energon tokenizer train --data FILE [--data FILE...] --vocab-size N --out PATH
 *                           [--model-type bpe|unigram] [--threads N]
 *                           [--character-coverage F] [--no-byte-fallback]
 *   energon tokenizer encode --model PATH --text TEXT [--bos]
 *   energon tokenizer decode --model PATH --ids "1 2 3"
 *   energon tokenizer render --model DIR|FILE.gguf --messages FILE.json
 *                            [--add-generation-prompt] [--chat-template T]
 *
 * Exit codes: 0 success, 1 a failure while doing the work (unreadable model,
 * training error), 2 bad arguments (the message names the flag). Options
 * take their value as the next argument or after '=' (--out=x.model).
 * main.c dispatches here with argv[0] == "tokenizer".
 */
#include "../common/status.h"
#include "cli.h"
#include "../tokenizer/chat.h"
#include "../tokenizer/tokenizer.h"
#include "../common/file.h"
#include "../common/gguf.h"
#include "../common/json.h"


#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DATA 256 /* --data files per training run */

static const char usage_text[] =
    "usage: energon tokenizer <command> [options]\n"
    "\n"
    "commands:\n"
    "  train    train a SentencePiece model on text files\n"
    "  encode   print the token ids of a text\n"
    "  decode   print the text of token ids\n"
    "  render   print a conversation as the model's chat template renders it\n"
    "\n"
    "energon tokenizer train --data FILE [--data FILE ...] --vocab-size N --out PATH\n"
    "                        [--model-type bpe|unigram] [--threads N]\n"
    "                        [--character-coverage F] [--no-byte-fallback]\n"
    "  --data FILE             training text, one sentence or paragraph per line\n"
    "                          (lines over 4192 bytes are skipped; repeat the flag\n"
    "                          for several files)\n"
    "  --vocab-size N          number of pieces, e.g. 512 .. 32000; with byte\n"
    "                          fallback it must exceed 259 plus the characters seen\n"
    "  --out PATH              the model file to write (e.g. out/tok.model)\n"
    "  --model-type T          bpe (default) or unigram\n"
    "  --threads N             trainer threads (default: the trainer's)\n"
    "  --character-coverage F  share of characters to cover, in (0, 1]\n"
    "  --no-byte-fallback      map unseen characters to <unk> instead of bytes\n"
    "\n"
    "energon tokenizer encode --model PATH --text TEXT [--bos]\n"
    "  prints the ids separated by spaces. PATH is a model directory (its\n"
    "  tokenizer.json, else tokenizer.model), a tokenizer.json, a .model file\n"
    "  or a .gguf file (the tokenizer in its metadata);\n"
    "  --bos adds the special tokens the model's own tokenizer adds (BOS for\n"
    "  Llama, nothing for Qwen or SmolLM2)\n"
    "\n"
    "energon tokenizer decode --model PATH --ids \"ID ID ...\"\n"
    "  prints the decoded text (special tokens skipped); ids are separated by\n"
    "  spaces or commas\n"
    "\n"
    "energon tokenizer render --model DIR --messages FILE.json\n"
    "                         [--add-generation-prompt] [--chat-template T]\n"
    "  prints the prompt DIR's chat template (chat_template.jinja or\n"
    "  tokenizer_config.json; for a .gguf file its tokenizer.chat_template;\n"
    "  T: a FILE.jinja or plain|llama2|chatml instead)\n"
    "  makes of the messages in FILE.json: an array of {\"role\", \"content\", ...},\n"
    "  or an object {\"messages\": [...], \"tools\": [...], ...} whose other keys\n"
    "  are template variables (e.g. \"enable_thinking\": false)\n";

static int usage_error(const char *cmd, const char *fmt, const char *what) {
    fprintf(stderr, "energon tokenizer%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    fprintf(stderr, fmt, what);
    fprintf(stderr, "\n(see 'energon tokenizer --help')\n");
    return 2;
}

/* Options of all three commands; a command rejects the ones it does not use. */
typedef struct opts {
    const char *data[MAX_DATA];
    int n_data;
    const char *vocab_size, *out, *model_type, *threads, *coverage, *model, *text, *ids;
    const char *messages, *chat_template;
    int no_byte_fallback, bos, gen_prompt;
} opts;

typedef struct opt_spec {
    const char *name;
    int takes_value;
    const char *cmds; /* first letters of the commands that accept it */
} opt_spec;

static const opt_spec specs[] = {
    {"--data", 1, "t"},
    {"--vocab-size", 1, "t"},
    {"--out", 1, "t"},
    {"--model-type", 1, "t"},
    {"--threads", 1, "t"},
    {"--character-coverage", 1, "t"},
    {"--no-byte-fallback", 0, "t"},
    {"--model", 1, "edr"},
    {"--messages", 1, "r"},
    {"--chat-template", 1, "r"},
    {"--add-generation-prompt", 0, "r"},
    {"--text", 1, "e"},
    {"--ids", 1, "d"},
    {"--bos", 0, "e"},
};

/* Store one option; returns 0 or prints the problem and returns 2. */
static int set_opt(opts *o, const char *cmd, const char *name, const char *value) {
    const char **slot = NULL;
    if (strcmp(name, "--data") == 0) {
        if (o->n_data == MAX_DATA) return usage_error(cmd, "too many --data files (max %s)", "256");
        o->data[o->n_data++] = value;
        return 0;
    }
    if (strcmp(name, "--no-byte-fallback") == 0) {
        o->no_byte_fallback = 1;
        return 0;
    }
    if (strcmp(name, "--bos") == 0) {
        o->bos = 1;
        return 0;
    }
    if (strcmp(name, "--add-generation-prompt") == 0) {
        o->gen_prompt = 1;
        return 0;
    }
    if (strcmp(name, "--vocab-size") == 0)
        slot = &o->vocab_size;
    else if (strcmp(name, "--out") == 0)
        slot = &o->out;
    else if (strcmp(name, "--model-type") == 0)
        slot = &o->model_type;
    else if (strcmp(name, "--threads") == 0)
        slot = &o->threads;
    else if (strcmp(name, "--character-coverage") == 0)
        slot = &o->coverage;
    else if (strcmp(name, "--model") == 0)
        slot = &o->model;
    else if (strcmp(name, "--text") == 0)
        slot = &o->text;
    else if (strcmp(name, "--ids") == 0)
        slot = &o->ids;
    else if (strcmp(name, "--messages") == 0)
        slot = &o->messages;
    else if (strcmp(name, "--chat-template") == 0)
        slot = &o->chat_template;
    if (!slot) return usage_error(cmd, "unknown option '%s'", name);
    if (*slot) return usage_error(cmd, "option '%s' is given more than once", name);
    *slot = value;
    return 0;
}

/* Parse argv[first..] into o. Returns 0, 1 when --help was printed, or 2. */
static int parse_opts(int argc, char **argv, int first, const char *cmd, opts *o) {
    memset(o, 0, sizeof *o);
    for (int i = first; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(usage_text, stdout);
            return 1;
        }
        if (strncmp(arg, "--", 2) != 0)
            return usage_error(cmd, "unexpected argument '%s' (options start with --)", arg);
        /* --name=value or --name value */
        char name[64];
        const char *eq = strchr(arg, '=');
        size_t nlen = eq ? (size_t)(eq - arg) : strlen(arg);
        if (nlen >= sizeof name) return usage_error(cmd, "unknown option '%s'", arg);
        memcpy(name, arg, nlen);
        name[nlen] = '\0';
        const opt_spec *spec = NULL;
        for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++)
            if (strcmp(specs[k].name, name) == 0) spec = &specs[k];
        if (!spec || !strchr(spec->cmds, cmd[0]))
            return usage_error(cmd, "unknown option '%s'", name);
        const char *value = NULL;
        if (spec->takes_value) {
            if (eq) {
                value = eq + 1;
            } else if (i + 1 < argc) {
                value = argv[++i];
            } else {
                return usage_error(cmd, "option '%s' needs a value", name);
            }
        } else if (eq) {
            return usage_error(cmd, "option '%s' takes no value", name);
        }
        int rc = set_opt(o, cmd, name, value);
        if (rc) return rc;
    }
    return 0;
}

/* Parse a whole decimal integer in [lo, hi] into *out; 0 on success. */
static int parse_int(const char *s, long lo, long hi, long *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int load_model(const char *cmd, const char *path, en_tokenizer **tok) {
    en_err err;
    if (en_tokenizer_create(path, tok, &err) != EN_OK) {
        fprintf(stderr, "energon tokenizer %s: --model: %s\n", cmd, err.msg);
        return 1;
    }
    return 0;
}

static int cmd_train(const opts *o) {
    const char *cmd = "train";
    if (o->n_data == 0) return usage_error(cmd, "missing %s (a training text file)", "--data FILE");
    if (!o->vocab_size) return usage_error(cmd, "missing %s", "--vocab-size N");
    if (!o->out) return usage_error(cmd, "missing %s", "--out PATH");
    en_tokenizer_train_config cfg = en_tokenizer_train_config_default();
    long v;
    if (parse_int(o->vocab_size, 1, INT_MAX, &v) != 0)
        return usage_error(cmd, "--vocab-size: '%s' is not a positive integer", o->vocab_size);
    cfg.vocab_size = (int)v;
    if (o->model_type) {
        if (strcmp(o->model_type, "bpe") != 0 && strcmp(o->model_type, "unigram") != 0)
            return usage_error(cmd, "--model-type: '%s' is not bpe or unigram", o->model_type);
        cfg.model_type = o->model_type;
    }
    if (o->threads) {
        if (parse_int(o->threads, 1, 1024, &v) != 0)
            return usage_error(cmd, "--threads: '%s' is not an integer in 1..1024", o->threads);
        cfg.n_threads = (int)v;
    }
    if (o->coverage) {
        char *end;
        errno = 0;
        double c = strtod(o->coverage, &end);
        if (errno || end == o->coverage || *end || !(c > 0 && c <= 1))
            return usage_error(cmd, "--character-coverage: '%s' is not a number in (0, 1]",
                               o->coverage);
        cfg.character_coverage = c;
    }
    cfg.byte_fallback = !o->no_byte_fallback;
    cfg.inputs = o->data;
    cfg.n_inputs = o->n_data;
    cfg.out_path = o->out;

    en_err err;
    double t0 = en_time_now();
    en_status st = en_tokenizer_train(&cfg, &err);
    if (st != EN_OK) {
        fprintf(stderr, "energon tokenizer: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s (%s, %d pieces, byte fallback %s) in %.1f s\n", cfg.out_path, cfg.model_type,
           cfg.vocab_size, cfg.byte_fallback ? "on" : "off", en_time_now() - t0);
    return 0;
}

static int cmd_encode(const opts *o) {
    const char *cmd = "encode";
    if (!o->model) return usage_error(cmd, "missing %s", "--model PATH");
    if (!o->text) return usage_error(cmd, "missing %s", "--text TEXT");
    en_tokenizer *tok;
    if (load_model(cmd, o->model, &tok)) return 1;
    int32_t *ids = NULL;
    size_t n = 0;
    en_err err;
    en_status st = en_tokenizer_encode(tok, o->text, strlen(o->text), o->bos, &ids, &n, &err);
    en_tokenizer_destroy(tok);
    if (st != EN_OK) {
        fprintf(stderr, "energon tokenizer encode: --text: %s\n", err.msg);
        return st == EN_ERR_ARG ? 2 : 1;
    }
    for (size_t i = 0; i < n; i++)
        printf("%s%d", i ? " " : "", (int)ids[i]);
    printf("\n");
    en_free(ids);
    return 0;
}

/* Parse "1 2 3" or "1,2,3" into a malloc'd array; 0 or 2 (message printed). */
static int parse_ids(const char *s, int32_t **out, size_t *n_out) {
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) {
        fprintf(stderr, "energon tokenizer decode: out of memory\n");
        return 1;
    }
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == ',')
            p++;
        if (!*p) break;
        const char *start = p;
        while (*p && *p != ' ' && *p != '\t' && *p != '\n' && *p != ',')
            p++;
        char tok[32];
        size_t len = (size_t)(p - start);
        long v;
        if (len < sizeof tok) {
            memcpy(tok, start, len);
            tok[len] = '\0';
        }
        if (len >= sizeof tok || parse_int(tok, INT32_MIN, INT32_MAX, &v) != 0) {
            fprintf(stderr, "energon tokenizer decode: --ids: '%.*s' is not an integer id\n",
                    (int)(len > 40 ? 40 : len), start);
            free(ids);
            return 2;
        }
        if (n == cap) {
            int32_t *q = realloc(ids, 2 * cap * sizeof *q);
            if (!q) {
                free(ids);
                fprintf(stderr, "energon tokenizer decode: out of memory\n");
                return 1;
            }
            ids = q;
            cap *= 2;
        }
        ids[n++] = (int32_t)v;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

static int cmd_decode(const opts *o) {
    const char *cmd = "decode";
    if (!o->model) return usage_error(cmd, "missing %s", "--model PATH");
    if (!o->ids) return usage_error(cmd, "missing %s", "--ids \"ID ID ...\"");
    int32_t *ids;
    size_t n;
    int rc = parse_ids(o->ids, &ids, &n);
    if (rc) return rc;
    en_tokenizer *tok;
    if (load_model(cmd, o->model, &tok)) {
        free(ids);
        return 1;
    }
    char *text = NULL;
    size_t len = 0;
    en_err err;
    en_status st = en_tokenizer_decode(tok, ids, n, &text, &len, &err);
    en_tokenizer_destroy(tok);
    free(ids);
    if (st != EN_OK) {
        fprintf(stderr, "energon tokenizer decode: --ids: %s\n", err.msg);
        return st == EN_ERR_ARG ? 2 : 1;
    }
    fwrite(text, 1, len, stdout);
    printf("\n");
    en_free(text);
    return 0;
}

/* The messages file: an array, or an object with "messages" and the
 * template's other variables. *msgs and *extra are new references. */
static int read_messages(const char *path, json_t **msgs, json_t **extra) {
    json_t *root = NULL;
    en_err err;
    *msgs = *extra = NULL;
    if (en_json_load_file(path, &root, &err) != EN_OK) {
        fprintf(stderr, "energon tokenizer render: --messages: %s\n", err.msg);
        return 1;
    }
    if (json_is_array(root)) {
        *msgs = root;
        return 0;
    }
    json_t *m = json_object_get(root, "messages");
    if (!json_is_array(m)) {
        fprintf(stderr, "energon tokenizer render: --messages: %s: expected an array of "
                        "messages or an object with a \"messages\" array\n", path);
        json_decref(root);
        return 1;
    }
    *msgs = json_incref(m);
    json_object_del(root, "messages");
    *extra = root;
    return 0;
}

static int cmd_render(const opts *o) {
    const char *cmd = "render";
    if (!o->model) return usage_error(cmd, "missing %s", "--model DIR");
    if (!o->messages) return usage_error(cmd, "missing %s", "--messages FILE.json");
    if (!en_path_is_dir(o->model) && !en_gguf_is_gguf_path(o->model))
        return usage_error(cmd, "--model: '%s' is not a model directory or a .gguf file",
                           o->model);
    json_t *msgs, *extra;
    if (read_messages(o->messages, &msgs, &extra)) return 1;
    en_tokenizer *tok = NULL;
    en_chat_template *t = NULL;
    en_chat_render *r = NULL;
    en_err err;
    int rc = 1;
    if (load_model(cmd, o->model, &tok)) goto done;
    if ((rc = en_cli_chat_template("tokenizer render", o->model, o->chat_template, tok, &t)))
        goto done;
    rc = 1;
    if (en_chat_template_render(t, msgs, extra, o->gen_prompt, 0, &r, &err) != EN_OK) {
        fprintf(stderr, "energon tokenizer render: %s\n", err.msg);
        goto done;
    }
    size_t len;
    const char *text = en_chat_render_text(r, &len);
    fwrite(text, 1, len, stdout);
    rc = 0;
done:
    en_chat_render_destroy(r);
    en_chat_template_destroy(t);
    en_tokenizer_destroy(tok);
    json_decref(msgs);
    json_decref(extra);
    return rc;
}

int en_cmd_tokenizer(int argc, char **argv);

int en_cmd_tokenizer(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage_text, stderr);
        return 2;
    }
    const char *sub = argv[1];
    if (strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0 || strcmp(sub, "help") == 0) {
        fputs(usage_text, stdout);
        return 0;
    }
    int (*run)(const opts *) = NULL;
    if (strcmp(sub, "train") == 0)
        run = cmd_train;
    else if (strcmp(sub, "encode") == 0)
        run = cmd_encode;
    else if (strcmp(sub, "decode") == 0)
        run = cmd_decode;
    else if (strcmp(sub, "render") == 0)
        run = cmd_render;
    else
        return usage_error(NULL, "unknown command '%s' (expected train, encode, decode or render)",
                           sub);
    opts o;
    int rc = parse_opts(argc, argv, 2, sub, &o);
    if (rc == 1) return 0; /* --help */
    if (rc) return rc;
    return run(&o);
}
