/*
 * fuzz_docs.c - libFuzzer target for the document readers and the chunker
 * (rag/docs.c, rag/chunk.c): the first input byte picks the kind (HTML,
 * markdown, txt, JSON lines) and the chunk size, the rest is the file.
 * Accepted input gives passages that hold at most chunk_tokens words, whose
 * text is valid UTF-8 and, for txt / md, exactly the source bytes of their
 * range, with 1 <= line_start <= line_end; refused input is EN_ERR_FORMAT.
 * Never a crash, leak or sanitizer report.
 * Seeds: tests/fuzz/corpus/docs/ (small files of each kind).
 * Run: tests/fuzz/run.sh 60 docs
 */
// fuzz-sources: rag/docs.c rag/chunk.c common/utf8.c common/status.c
// fuzz-libs: -ljansson
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"
#include "rag/docs.h"

static int n_words(const char *s) {
    int n = 0, in = 0;
    for (; *s; s++) {
        int sp = (*s == ' ' || (*s >= '\t' && *s <= '\r'));
        n += !sp && !in;
        in = !sp;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const en_doc_kind kinds[4] = {EN_DOC_HTML, EN_DOC_MD, EN_DOC_TXT, EN_DOC_JSONL};
    en_doc_kind kind = kinds[data[0] & 3];
    int N = 1 + ((data[0] >> 2) & 15), M = (data[0] >> 6) % N;
    en_doc doc;
    en_err err = {0};
    en_status s = en_doc_read("fuzz", kind, data + 1, size - 1, &doc, &err);
    if (s != EN_OK) {
        if (s != EN_ERR_FORMAT) abort();
        en_doc_deinit(&doc);
        return 0;
    }
    if (doc.binary) {
        if (!memchr(data + 1, 0, size - 1)) abort();
        en_doc_deinit(&doc);
        return 0;
    }
    en_passage *ps = NULL;
    int n = 0;
    if (en_doc_chunk(&doc, N, M, &ps, &n, &err) != EN_OK) abort();
    for (int i = 0; i < n; i++) {
        const en_passage *p = &ps[i];
        size_t len = strlen(p->text);
        if (n_words(p->text) > N || n_words(p->text) != p->n_words || p->n_words < 1) abort();
        if (en_utf8_first_invalid((const unsigned char *)p->text, len) != len) abort();
        if (p->section < 0 || p->section >= doc.n_sections) abort();
        if (p->line_start < 1 || p->line_end < p->line_start) abort();
        if (kind == EN_DOC_TXT || kind == EN_DOC_MD) {
            if (p->byte_start < 0 || p->byte_end > (int64_t)size - 1 ||
                (size_t)(p->byte_end - p->byte_start) != len ||
                memcmp(data + 1 + p->byte_start, p->text, len) != 0)
                abort();
        }
    }
    for (int i = 0; i < doc.n_sections; i++) {
        size_t tl = strlen(doc.sections[i].title);
        if (en_utf8_first_invalid((const unsigned char *)doc.sections[i].title, tl) != tl)
            abort();
    }
    en_passages_free(ps, n);
    en_doc_deinit(&doc);
    return 0;
}
