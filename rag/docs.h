/*
 * docs.h - reading document files into sections and paragraphs, and
 * splitting those into passages (rag/docs.c reads, rag/chunk.c splits).
 *
 * Kinds: .txt (paragraphs end at blank lines; a title line - a one-line
 * paragraph of at most 12 words without final . ! ? : ; , followed by a
 * paragraph that is not such a line - starts a section and is not text),
 * .md (ATX '#' headings start sections, fenced code kept as text),
 * .html/.htm (tags removed, <script> and <style> dropped, a few entities
 * decoded, <h1>-<h6> start sections, block tags end paragraphs), .jsonl
 * (one {"id","title","text"} record a line, each record its own section). The whole file must be UTF-8; a file
 * with a NUL byte is binary and not read.
 * Used by rag/index.c and the fuzz target tests/fuzz/fuzz_docs.c.
 */
#ifndef EN_DOCS_H
#define EN_DOCS_H

#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"

typedef enum en_doc_kind {
    EN_DOC_NONE = 0, /* not a document file (skipped) */
    EN_DOC_TXT,
    EN_DOC_MD,
    EN_DOC_HTML,
    EN_DOC_JSONL
} en_doc_kind;

/* The kind of a file by its extension (case-insensitive); EN_DOC_NONE for
 * any other. */
en_doc_kind en_doc_kind_of(const char *path);

/* A paragraph: text[0..len). For txt and md the text is the raw bytes
 * src[src_start .. src_start + len); for html each byte's source offset is
 * off[i]; jsonl paragraphs have no source offsets (off NULL, src_start 0) and
 * line is the record's line. */
typedef struct en_doc_para {
    const char *text; /* borrowed from the source or from en_doc.heap */
    size_t len;
    size_t src_start;
    size_t *off; /* owned (html), else NULL */
    int section;  /* index into en_doc.sections */
    int line;     /* jsonl: the 1-based line of its record; else 0 */
} en_doc_para;

typedef struct en_doc_section {
    char *title;     /* owned; "" before the first heading */
    char *record_id; /* owned; jsonl only, else NULL */
} en_doc_section;

typedef struct en_doc {
    en_doc_kind kind;
    const unsigned char *src; /* borrowed: the file's bytes */
    size_t src_len;
    en_doc_section *sections;
    int n_sections;
    en_doc_para *paras;
    int n_paras;
    char **heap; /* owned text buffers (html, jsonl) */
    int n_heap;
    /* jsonl: 1 when the file's first record has no "text" field (a data
     * file, not documents: the caller skips it) */
    int not_documents;
    /* 1 when the file holds a NUL byte: a binary file (skipped), not read */
    int binary;
} en_doc;

/* Read src[0..len) (borrowed: it must outlive *doc) as a file of `kind`.
 * `name` only labels errors ("handbook.txt: not UTF-8 at byte 12",
 * "notes.jsonl:3: ..."). EN_ERR_FORMAT on bad input, EN_ERR_NOMEM. *doc is
 * empty on failure; en_doc_deinit frees it either way. */
en_status en_doc_read(const char *name, en_doc_kind kind, const unsigned char *src,
                      size_t len, en_doc *doc, en_err *err);
void en_doc_deinit(en_doc *doc);

/* ---- passages (rag/chunk.c) ---- */

/* A passage: about chunk_tokens words of one section. Words are maximal
 * runs of non-space bytes. Whole paragraphs are grouped while they fit; a
 * paragraph longer than chunk_tokens words is cut into windows of
 * chunk_tokens words, each overlapping the previous by `overlap` words.
 * A passage never crosses a section. */
typedef struct en_passage {
    char *text;    /* owned */
    int section;   /* index into en_doc.sections */
    int64_t byte_start, byte_end; /* txt/md: the source bytes; else -1 */
    int line_start, line_end;     /* 1-based; 0 when unknown */
    int n_words;
} en_passage;

/* Split doc into passages (*out owned: en_passages_free). Requires
 * chunk_tokens >= 1 and 0 <= overlap < chunk_tokens (EN_ERR_ARG). */
en_status en_doc_chunk(const en_doc *doc, int chunk_tokens, int overlap, en_passage **out,
                       int *n_out, en_err *err);
void en_passages_free(en_passage *p, int n);

#endif
