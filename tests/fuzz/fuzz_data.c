/*
 * fuzz_data.c - libFuzzer target for the fine-tuning data files
 * (finetune/data.c through en_dataset_create): .txt documents, .jsonl
 * records (text, prompt/completion, chat "messages" with content parts,
 * "tools", "tool_calls" and "tool" messages), both gzipped, and .md and
 * .html documents (read through rag/docs.c).
 *   byte 0: bits 0-1 the file: .txt, .jsonl, .txt.gz, .jsonl.gz; bit 2
 *           doc_sep_blank; bit 3 train_on_all; bit 4 skip_bad_records;
 *           bits 5-6 the template: plain, llama2, chatml (built-in) or a
 *           small Hermes-style Jinja template with tools; bit 7, for a .gz
 *           file: the rest is the gzip file itself (else this harness
 *           gzips the rest); for .txt and .jsonl: the file is .md and
 *           .html instead
 *   byte 1: seq_len: 2 + b for b < 128 (packing), else 2 + 16 * (b - 128), up
 *           to 2034 (whole chat records)
 *   the rest: the file, written to a temporary file (the loader reads
 *           paths)
 * Any input must give EN_OK or an error with a message, never a crash,
 * leak or sanitizer report. A dataset that loads must hold windows of 2 ..
 * seq_len + 1 tokens with ids in the vocabulary, targets -1 or an id, at
 * least one trained target each, a permutation for an epoch order, and a
 * validation split that is either refused or leaves both sides valid.
 * The tokenizer is stories260K's tok512.model (a SentencePiece BPE of 512
 * pieces with byte fallback, bos and eos; tests/fuzz/corpus/spm/), loaded
 * once. Inputs over 8 KiB, and gzip files that
 * inflate beyond 16 KiB, are skipped (they only cost time).
 * Seeds: tests/fuzz/corpus/data/ (records of tests/test_data.c and
 * tests/fixtures/data/). Run: tests/fuzz/run.sh 60 data
 */
// fuzz-sources: finetune/data.c rag/docs.c tokenizer/chat.c tokenizer/chat_template.c
// fuzz-sources: tokenizer/chat_tools.c tokenizer/detok.c tokenizer/stop.c
// fuzz-sources: tokenizer/tokenizer.c tokenizer/tokenizer_spm.cpp tokenizer/tokenizer_gguf.c
// fuzz-sources: tokenizer/hf_bpe.c tokenizer/hf_decode.c tokenizer/hf_encode.c
// fuzz-sources: tokenizer/hf_json.c tokenizer/hf_normalize.c tokenizer/hf_pretokenize.c
// fuzz-sources: tokenizer/hf_text.c tokenizer/hf_tokenizer.c
// fuzz-sources: tokenizer/jinja.c tokenizer/jinja_arena.c tokenizer/jinja_lex.c
// fuzz-sources: tokenizer/jinja_parse.c tokenizer/jinja_expr.c tokenizer/jinja_value.c
// fuzz-sources: tokenizer/jinja_json.c tokenizer/jinja_eval.c tokenizer/jinja_exec.c
// fuzz-sources: tokenizer/jinja_ops.c tokenizer/jinja_filters.c tokenizer/jinja_tests.c
// fuzz-sources: tokenizer/jinja_methods.c tokenizer/jinja_globals.c tokenizer/jinja_str.c
// fuzz-sources: common/status.c common/gguf.c common/safetensors.c common/file.c
// fuzz-sources: common/json.c common/utf8.c common/rng.c
// fuzz-libs: -ljansson -lonig -lutf8proc -lz -lsentencepiece -lsentencepiece_train
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "finetune/data.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define DATA_MAX_INPUT 8192
#define DATA_MAX_INFLATED 16384

/* Qwen2.5's tool layout in a few lines: "<tool_call>" makes it the hermes
 * format (tokenizer/chat_tools.h), and "tools" is a template variable. */
static const char k_hermes[] =
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>\n{%- for t in tools %}\n"
    "{{ t | tojson }}{%- endfor %}\n</tools>\nReturn each call as <tool_call>\n"
    "{\"name\": NAME, \"arguments\": ARGS}\n</tool_call><|im_end|>\n{%- endif %}\n"
    "{%- for m in messages %}\n"
    "{%- if m.role == 'assistant' %}\n{{- '<|im_start|>assistant\\n' }}"
    "{%- if m.content %}{{ m.content }}{%- endif %}"
    "{%- for c in m.tool_calls %}\n<tool_call>\n{\"name\": \"{{ c.function.name }}\", "
    "\"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>{%- endfor %}"
    "{{- '<|im_end|>\\n' }}\n"
    "{%- elif m.role == 'tool' %}\n{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + "
    "'\\n</tool_response><|im_end|>\\n' }}\n"
    "{%- else %}\n{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}\n"
    "{%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n";

static en_tokenizer *g_tok;
static en_chat_template *g_tmpl[4];
static char g_dir[64];
static char g_path[6][128];
static const char *const k_ext[6] = {"txt", "jsonl", "txt.gz", "jsonl.gz", "md", "html"};

static void cleanup(void) {
    for (int i = 0; i < 6; i++)
        unlink(g_path[i]);
    rmdir(g_dir);
    for (int i = 0; i < 4; i++)
        en_chat_template_destroy(g_tmpl[i]);
    en_tokenizer_destroy(g_tok);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    /* stories260K's tok512.model, the spm target's seed: run.sh compiles
     * this file by its absolute path, ROOT/tests/fuzz/fuzz_data.c */
    char fix[1024];
    snprintf(fix, sizeof fix, "%s", __FILE__);
    char *cut = strstr(fix, "fuzz_data.c");
    if (!cut) abort();
    snprintf(cut, sizeof fix - (size_t)(cut - fix), "corpus/spm/tok512.model");
    en_err err = {0};
    if (en_tokenizer_create(fix, &g_tok, &err) != EN_OK) {
        fprintf(stderr, "fuzz_data: %s\n", err.msg);
        abort();
    }
    for (int i = 0; i < 3; i++)
        if (en_chat_template_builtin((en_chat_template_id)i, &g_tmpl[i], &err) != EN_OK) abort();
    if (en_chat_template_from_jinja(k_hermes, sizeof k_hermes - 1, "hermes.jinja", g_tok,
                                    &g_tmpl[3], &err) != EN_OK) {
        fprintf(stderr, "fuzz_data: %s\n", err.msg);
        abort();
    }
    snprintf(g_dir, sizeof g_dir, "/tmp/en_fuzz_data_XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    for (int i = 0; i < 6; i++)
        snprintf(g_path[i], sizeof g_path[i], "%s/data.%s", g_dir, k_ext[i]);
    atexit(cleanup);
    return 0;
}

static int write_plain(const char *path, const uint8_t *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static int write_gz(const char *path, const uint8_t *p, size_t n) {
    gzFile gz = gzopen(path, "wb");
    if (!gz) return 0;
    int ok = n == 0 || gzwrite(gz, p, (unsigned)n) == (int)n;
    return gzclose(gz) == Z_OK && ok;
}

/* What the loader will inflate, bounded: 1 when it is at most DATA_MAX_INFLATED
 * bytes (or corrupt, which the loader reports), 0 for a bomb. */
static int gz_small(const char *path) {
    gzFile gz = gzopen(path, "rb");
    if (!gz) return 1;
    static char buf[DATA_MAX_INFLATED + 1];
    size_t n = 0;
    int got;
    while (n < sizeof buf && (got = gzread(gz, buf + n, (unsigned)(sizeof buf - n))) > 0)
        n += (size_t)got;
    gzclose(gz);
    return n <= DATA_MAX_INFLATED;
}

/* Every window of ds is well formed, and an epoch's order is a permutation. */
static void check_dataset(const en_dataset *ds, int seq_len) {
    const int32_t nv = en_tokenizer_n_vocab(g_tok);
    const int64_t n_win = en_dataset_n_windows(ds);
    const en_data_stats *st = en_dataset_stats(ds);
    if (n_win < 1 || st->n_windows != n_win || st->n_records < 1 ||
        en_dataset_seq_len(ds) != seq_len || st->n_trained_tokens < n_win)
        abort();
    int32_t *in = malloc((size_t)seq_len * sizeof *in), *tg = malloc((size_t)seq_len * sizeof *tg);
    if (!in || !tg) abort();
    for (int64_t w = 0; w < n_win && w < 512; w++) {
        const int32_t *ids;
        const uint8_t *train;
        int64_t n = en_dataset_window_tokens(ds, w, &ids, &train);
        if (n < 2 || n > seq_len + 1) abort();
        en_dataset_window(ds, w, in, tg);
        int trained = 0;
        for (int t = 0; t < seq_len; t++) {
            if (in[t] < 0 || in[t] >= nv || tg[t] < -1 || tg[t] >= nv) abort();
            if (t < n && in[t] != ids[t]) abort();
            if (t + 1 >= n ? tg[t] != -1 : tg[t] >= 0 && (tg[t] != ids[t + 1] || !train[t + 1]))
                abort();
            trained += tg[t] >= 0;
        }
        if (!trained) abort();
    }
    free(in);
    free(tg);
    if (n_win <= 4096) {
        int64_t *perm = malloc((size_t)n_win * sizeof *perm);
        uint8_t *seen = calloc((size_t)n_win, 1);
        if (!perm || !seen) abort();
        en_dataset_order(ds, 42, 3, perm);
        for (int64_t i = 0; i < n_win; i++) {
            if (perm[i] < 0 || perm[i] >= n_win || seen[perm[i]]) abort();
            seen[perm[i]] = 1;
        }
        free(perm);
        free(seen);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 || size > DATA_MAX_INPUT) return 0;
    const uint8_t flags = data[0];
    const int kind = flags & 3, gz = kind >= 2, doc = !gz && (flags & 0x80);
    const char *path = g_path[doc ? 4 + kind : kind];
    const uint8_t *body = data + 2;
    size_t n = size - 2;
    if (gz && !(flags & 0x80) ? !write_gz(path, body, n) : !write_plain(path, body, n)) abort();
    if (gz && (flags & 0x80) && !gz_small(path)) return 0;

    en_data_config cfg = en_data_config_default();
    cfg.seq_len = data[1] < 128 ? 2 + data[1] : 2 + 16 * (data[1] - 128);
    cfg.doc_sep_blank = (flags >> 2) & 1;
    cfg.train_on_all = (flags >> 3) & 1;
    cfg.skip_bad_records = (flags >> 4) & 1;
    cfg.chat_template = g_tmpl[(flags >> 5) & 3];
    const char *files[1] = {path};
    en_err err = {0};
    en_dataset *ds = NULL;
    en_status st = en_dataset_create(files, 1, g_tok, &cfg, &ds, &err);
    if (st != EN_OK) {
        if (ds || !err.msg[0] || st == EN_ERR_ARG || st == EN_ERR_IO) abort();
        return 0;
    }
    check_dataset(ds, cfg.seq_len);
    const en_data_stats *s = en_dataset_stats(ds);
    if (!cfg.skip_bad_records && (s->n_bad_skipped || en_dataset_first_skipped(ds))) abort();
    if (s->n_bad_skipped && !en_dataset_first_skipped(ds)) abort();
    int64_t n_rec = s->n_records;
    en_dataset *val = NULL;
    st = en_dataset_split(ds, 0.5, 7, &val, &err);
    if (st == EN_OK) {
        if (!val) abort();
        check_dataset(ds, cfg.seq_len);
        check_dataset(val, cfg.seq_len);
        if (en_dataset_stats(ds)->n_records + en_dataset_stats(val)->n_records != n_rec) abort();
        en_dataset_destroy(val);
    } else if (val || (st == EN_ERR_ARG && n_rec >= 2)) {
        abort();
    }
    en_dataset_destroy(ds);
    return 0;
}
