/*
 * cmd_index.c - `energon index`: build or update the document index of one
 * or more folders (rag/index.h, docs/retrieval.md), and search it from the
 * command line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/file.h"
#include "../rag/index.h"
#include "cli.h"

#define CMD "index"
#define MAX_ROOTS 1024 /* --docs values (a shell glob can give many) */

static void usage(FILE *f) {
    fprintf(f,
            "usage: energon index --docs DIR|FILE... --out INDEX.db [--chunk-tokens N]\n"
            "                     [--overlap M]\n"
            "       energon index --search INDEX.db --query TEXT [--top-k K]\n"
            "\n"
            "Index the .txt, .md, .html and .jsonl ({\"id\",\"title\",\"text\"}) files under\n"
            "each DIR (recursively), and each FILE, into passages of about N words\n"
            "(whitespace-separated words, not model tokens; default 256; a long\n"
            "paragraph is cut into windows overlapping by M words, default 32) in a SQLite\n"
            "file with a BM25 full-text table. Re-running updates only the files whose\n"
            "content changed, in one transaction; other settings rebuild the index.\n"
            "--search prints the top K (default 5) passages for TEXT. See\n"
            "docs/retrieval.md.\n");
}

static int search(const char *db, const char *query, int top_k) {
    en_err err = {0};
    en_index *idx = NULL;
    en_index_hit *hits = NULL;
    int n = 0;
    if (en_index_open(db, 0, &idx, &err) != EN_OK ||
        en_index_search(idx, query, top_k, &hits, &n, &err) != EN_OK) {
        en_cli_error(CMD, "--search: %s", err.msg);
        en_index_destroy(idx);
        return EN_EXIT_ERROR;
    }
    for (int i = 0; i < n; i++) {
        const en_index_hit *h = &hits[i];
        printf("%d. [%.6f] %s/%s:%d-%d%s%s (passage %lld)\n%s\n\n", i + 1, h->score, h->root,
               h->file, h->line_start, h->line_end, h->section[0] ? " # " : "", h->section,
               (long long)h->id, h->text);
    }
    if (n == 0) printf("no passage matches\n");
    en_index_hits_free(hits, n);
    en_index_destroy(idx);
    return EN_EXIT_OK;
}

static int build(const char *const *roots, int n_roots, const char *out,
                 const en_index_config *cfg) {
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
    if (en_index_open(out, 1, &idx, &err) != EN_OK) {
        en_cli_error(CMD, "--out: %s", err.msg);
        return EN_EXIT_ERROR;
    }
    if (en_index_update(idx, roots, n_roots, cfg, &st, &err) != EN_OK) {
        en_cli_error(CMD, "%s (the index is unchanged)", err.msg);
        en_index_destroy(idx);
        return EN_EXIT_ERROR;
    }
    en_index_destroy(idx);
    if (st.rebuilt)
        fprintf(stderr, "energon index: the chunk settings differ from the index's: rebuilt\n");
    printf("energon index: %s: files %d added, %d changed, %d unchanged, %d removed, "
           "%d skipped; %lld passages; %.2f s\n",
           out, st.added, st.changed, st.unchanged, st.removed, st.skipped,
           (long long)st.passages, en_time_now() - t0);
    return EN_EXIT_OK;
}

int en_cmd_index(int argc, char **argv) {
    const char *roots[MAX_ROOTS];
    int n_roots = 0, bad = 0, top_k = 5;
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
        return search(db, query, top_k);
    }
    if (!n_roots || !out) {
        en_cli_error(CMD, "--docs and --out are required (or --search DB --query TEXT)");
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
    return build(roots, n_roots, out, &cfg);
}
