/*
 * cmd_index.c - `energon index`: build or update the document index of one
 * or more folders (rag/index.h, docs/retrieval.md), with --embed a dense
 * vector of every passage computed by the serving engine (serve/engine.h,
 * serve/retrieval.h), and search it from the command line (BM25, or hybrid
 * with --model on an index with vectors).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/file.h"
#include "../rag/index.h"
#include "../serve/engine.h"
#include "../serve/retrieval.h"
#include "cli.h"

#define CMD "index"
#define MAX_ROOTS 1024 /* --docs values (a shell glob can give many) */

static void usage(FILE *f) {
    fprintf(f,
            "usage: energon index --docs DIR|FILE... --out INDEX.db [--chunk-tokens N]\n"
            "                     [--overlap M]\n"
            "                     [--embed --model M [--embedding-pooling mean|last]\n"
            "                      [--threads N] [--weights W] [--device D]]\n"
            "       energon index --search INDEX.db --query TEXT [--top-k K] [--model M]\n"
            "\n"
            "Index the .txt, .md, .html and .jsonl ({\"id\",\"title\",\"text\"}) files under\n"
            "each DIR (recursively), and each FILE, into passages of about N words\n"
            "(whitespace-separated words, not model tokens; default 256; a long\n"
            "paragraph is cut into windows overlapping by M words, default 32) in a SQLite\n"
            "file with a BM25 full-text table. Re-running updates only the files whose\n"
            "content changed, in one transaction; other settings rebuild the index.\n"
            "--embed also stores each passage's embedding by model M (a GGUF file or a\n"
            "model folder; mean pooling by default, as /v1/embeddings), re-embedding only\n"
            "new and changed passages; an index with vectors must be updated with --embed.\n"
            "--search prints the top K (default 5) passages for TEXT: BM25, or with\n"
            "--model on an index with vectors BM25 and the vectors fused by reciprocal rank.\n"
            "See docs/retrieval.md.\n");
}

/* A model and the engine that embeds with it. */
typedef struct embedder {
    en_cli_model cm;
    int loaded;
    en_engine *eng;
    en_retrieval_model id;
    int pooling;
    int truncated;   /* passages cut to the context */
    double t_last;   /* last progress line */
} embedder;

static int embedder_open(const en_cli_load_opts *lo, embedder *e) {
    int rc = en_cli_load(CMD, lo, &e->cm);
    if (rc) return rc;
    e->loaded = 1;
    en_err err = {0};
    en_engine_config ec = en_engine_config_default();
    if (en_retrieval_model_id(lo->dir, e->cm.model, &e->id, &err) != EN_OK ||
        en_engine_create(e->cm.model, e->cm.tok, &ec, &e->eng, &err) != EN_OK) {
        en_cli_error(CMD, "--model %s: %s", lo->dir, err.msg);
        return EN_EXIT_ERROR;
    }
    return EN_EXIT_OK;
}

static void embedder_close(embedder *e) {
    if (e->eng) en_engine_destroy(e->eng);
    if (e->loaded) en_cli_unload(&e->cm);
    e->eng = NULL, e->loaded = 0;
}

static en_status embed_cb(void *ctx, const char *const *texts, int n, float *out, en_err *err) {
    embedder *e = ctx;
    int cut = 0;
    en_status s = en_retrieval_embed(e->eng, texts, n, e->pooling, out, &cut, err);
    e->truncated += cut;
    return s;
}

static void progress_cb(void *ctx, int64_t done, int64_t total) {
    embedder *e = ctx;
    double now = en_time_now();
    if (done < total && now - e->t_last < 2.0) return;
    e->t_last = now;
    fprintf(stderr, "energon index: embedded %lld / %lld passages\n", (long long)done,
            (long long)total);
}

static void print_hits(const en_index_hit *hits, int n) {
    for (int i = 0; i < n; i++) {
        const en_index_hit *h = &hits[i];
        printf("%d. [%.6f] %s/%s:%d-%d%s%s (passage %lld)\n%s\n\n", i + 1, h->score, h->root,
               h->file, h->line_start, h->line_end, h->section[0] ? " # " : "", h->section,
               (long long)h->id, h->text);
    }
    if (n == 0) printf("no passage matches\n");
}

/* --search: BM25, or hybrid with --model on an index with vectors (the
 * model checked against the index's first). */
static int search(const char *db, const char *query, int top_k, const en_cli_load_opts *lo) {
    en_err err = {0};
    en_index *idx = NULL;
    en_index_hit *hits = NULL;
    en_index_vectors v = {0};
    embedder e = {0};
    int n = 0, rc = EN_EXIT_ERROR;
    if (en_index_open(db, 0, &idx, &err) != EN_OK ||
        en_index_vector_info(idx, &v, &err) != EN_OK) {
        en_cli_error(CMD, "--search: %s", err.msg);
        goto done;
    }
    if (lo->dir && !v.has)
        fprintf(stderr, "energon index: %s holds no vectors: BM25 only (--model unused)\n", db);
    else if (!lo->dir && v.has)
        fprintf(stderr, "energon index: BM25 only (pass --model to fuse it with the vectors of "
                        "%s)\n", v.model_name);
    if (lo->dir && v.has) {
        if ((rc = embedder_open(lo, &e)) != EN_EXIT_OK) goto done;
        rc = EN_EXIT_ERROR;
        if (en_retrieval_check_model(idx, &e.id, &err) != EN_OK) {
            en_cli_error(CMD, "--model: %s", err.msg);
            goto done;
        }
        fprintf(stderr, "energon index: hybrid: BM25 and %s's vectors, reciprocal rank "
                        "(k = %d)\n", v.model_name, EN_RRF_K);
    }
    if (en_retrieve(idx, e.eng, query, top_k, &hits, &n, &err) != EN_OK) {
        en_cli_error(CMD, "--search: %s", err.msg);
        goto done;
    }
    print_hits(hits, n);
    rc = EN_EXIT_OK;
done:
    en_index_hits_free(hits, n);
    en_index_destroy(idx);
    embedder_close(&e);
    return rc;
}

static int build(const char *const *roots, int n_roots, const char *out, en_index_config *cfg,
                 const en_cli_load_opts *lo, int pooling) {
    for (int r = 0; r < n_roots; r++) {
        struct stat sb;
        size_t len = strlen(roots[r]);
        if (stat(roots[r], &sb) != 0 || (!S_ISDIR(sb.st_mode) && !S_ISREG(sb.st_mode)) ||
            (!S_ISDIR(sb.st_mode) && roots[r][len - 1] == '/')) {
            en_cli_error(CMD, "--docs %s: %s", roots[r],
                         en_path_exists(roots[r]) ? "not a file or folder"
                                                  : "no such file or folder");
            return EN_EXIT_USAGE;
        }
    }
    double t0 = en_time_now();
    en_err err = {0};
    en_index *idx = NULL;
    en_index_stats st;
    embedder e = {0};
    en_index_embedder ie = {0};
    if (lo->dir) {
        int rc = embedder_open(lo, &e);
        if (rc) {
            embedder_close(&e);
            return rc;
        }
        e.pooling = pooling, e.t_last = en_time_now();
        ie.embed = embed_cb, ie.progress = progress_cb, ie.ctx = &e;
        ie.dim = e.id.dim, ie.batch = 256, ie.pooling = en_retrieval_pooling_name(pooling);
        ie.model_name = e.id.name, ie.model_hash = e.id.hash, ie.model_arch = e.id.arch;
        ie.vocab = e.id.vocab, ie.layers = e.id.layers;
        ie.max_tokens = en_engine_n_ctx(e.eng) - 1;
        cfg->embedder = &ie;
    }
    if (en_index_open(out, 1, &idx, &err) != EN_OK) {
        en_cli_error(CMD, "--out: %s", err.msg);
        embedder_close(&e);
        return EN_EXIT_ERROR;
    }
    en_status s = en_index_update(idx, roots, n_roots, cfg, &st, &err);
    en_index_destroy(idx);
    embedder_close(&e);
    if (s != EN_OK) {
        en_cli_error(CMD, "%s (the index is unchanged)", err.msg);
        return s == EN_ERR_ARG ? EN_EXIT_USAGE : EN_EXIT_ERROR;
    }
    if (st.rebuilt)
        fprintf(stderr, "energon index: the chunk settings differ from the index's: rebuilt\n");
    printf("energon index: %s: files %d added, %d changed, %d unchanged, %d removed, "
           "%d skipped; %lld passages; %.2f s\n",
           out, st.added, st.changed, st.unchanged, st.removed, st.skipped,
           (long long)st.passages, en_time_now() - t0);
    if (st.added + st.changed + st.unchanged == 0)
        fprintf(stderr, "energon index: warning: no .txt, .md, .html or .jsonl document under "
                        "--docs %s%s (%d other files skipped): the index is empty\n", roots[0],
                n_roots > 1 ? " ..." : "", st.skipped);
    if (lo->dir) {
        if (st.reembedded)
            fprintf(stderr, "energon index: the stored vectors were another model's (or "
                            "pooling's): every passage re-embedded\n");
        printf("energon index: embedded %lld passages (model %s, %s pooling, %d floats); "
               "%d cut to %d tokens\n", (long long)st.embedded, e.id.name, ie.pooling, ie.dim,
               e.truncated, ie.max_tokens);
    }
    return EN_EXIT_OK;
}

int en_cmd_index(int argc, char **argv) {
    const char *roots[MAX_ROOTS];
    int n_roots = 0, bad = 0, top_k = 5, embed = 0, pooling = EN_EMBED_MEAN;
    en_cli_load_opts lo = {0};
    lo.need_tokenizer = 1;
    const char *out = NULL, *db = NULL, *query = NULL;
    en_index_config cfg = en_index_config_default();
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        if (en_cli_switch(argv, i, "--help") || en_cli_switch(argv, i, "-h")) {
            usage(stdout);
            return EN_EXIT_OK;
        } else if (en_cli_flag(argc, argv, &i, "--docs", &v, &bad)) {
            /* --docs A B C (folders or files, e.g. a shell glob): every value up
             * to the next flag */
            for (;;) {
                if (n_roots == MAX_ROOTS) {
                    en_cli_error(CMD, "--docs: at most %d folders or files", MAX_ROOTS);
                    return EN_EXIT_USAGE;
                }
                roots[n_roots++] = v;
                if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0) break;
                v = argv[++i];
            }
        } else if (en_cli_flag(argc, argv, &i, "--out", &v, &bad)) {
            out = v;
        } else if (en_cli_flag(argc, argv, &i, "--search", &v, &bad)) {
            db = v;
        } else if (en_cli_flag(argc, argv, &i, "--query", &v, &bad)) {
            query = v;
        } else if (en_cli_flag(argc, argv, &i, "--top-k", &v, &bad)) {
            if (!en_cli_int(CMD, "--top-k", v, 1, 1000, &top_k)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--chunk-tokens", &v, &bad)) {
            if (!en_cli_int(CMD, "--chunk-tokens", v, 1, 100000, &cfg.chunk_tokens)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--overlap", &v, &bad)) {
            if (!en_cli_int(CMD, "--overlap", v, 0, 99999, &cfg.overlap)) bad = 1;
        } else if (en_cli_switch(argv, i, "--embed")) {
            embed = 1;
        } else if (en_cli_flag(argc, argv, &i, "--embedding-pooling", &v, &bad)) {
            pooling = en_retrieval_pooling_parse(v);
            if (pooling < 0) {
                en_cli_error(CMD, "--embedding-pooling: '%s' is not mean or last", v);
                bad = 1;
            }
        } else if (en_cli_load_flag(CMD, argc, argv, &i, &lo, &bad)) {
        } else {
            en_cli_error(CMD, "unknown argument '%s'", argv[i]);
            bad = 1;
        }
    }
    if (bad) return EN_EXIT_USAGE;
    if (db) {
        if (!query || n_roots || out) {
            en_cli_error(CMD, "--search needs --query, and no --docs or --out");
            return EN_EXIT_USAGE;
        }
        if (embed) {
            en_cli_error(CMD, "--embed builds an index; --search takes --model alone");
            return EN_EXIT_USAGE;
        }
        return search(db, query, top_k, &lo);
    }
    if (!n_roots || !out) {
        en_cli_error(CMD, "--docs and --out are required (or --search DB --query TEXT)");
        return EN_EXIT_USAGE;
    }
    if (embed != (lo.dir != NULL)) {
        en_cli_error(CMD, embed ? "--embed needs --model M (a GGUF file or a model folder)"
                                : "--model is for --embed (or --search)");
        return EN_EXIT_USAGE;
    }
    if (cfg.overlap >= cfg.chunk_tokens) {
        en_cli_error(CMD, "--overlap %d: must be less than --chunk-tokens %d", cfg.overlap,
                     cfg.chunk_tokens);
        return EN_EXIT_USAGE;
    }
    /* test only (tests/test_index.sh): abort after N files are written
     * inside the update's transaction */
    const char *fail = getenv("EN_INDEX_FAIL_AFTER");
    if (fail && fail[0]) cfg.fail_after_files = atoi(fail);
    return build(roots, n_roots, out, &cfg, &lo, pooling);
}
