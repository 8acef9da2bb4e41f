/*
 * index.c - the document index in SQLite + FTS5 (see index.h and
 * docs/retrieval.md): schema, incremental update in one transaction, BM25
 * search.
 */
#include "index.h"

#include <dirent.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/file.h"
#include "../common/utf8.h"
#include "docs.h"

struct en_index {
    sqlite3 *db;
    char *path;
    /* en_index_vector_info's strings (owned; replaced on each call) */
    char *vec_pooling, *vec_name, *vec_hash, *vec_arch;
};

en_index_config en_index_config_default(void) {
    en_index_config c = {.chunk_tokens = 256, .overlap = 32, .embedder = NULL,
                         .fail_after_files = 0};
    return c;
}

static const char k_schema[] =
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE files(id INTEGER PRIMARY KEY, root TEXT NOT NULL, path TEXT NOT NULL,"
    " kind TEXT NOT NULL, hash TEXT NOT NULL, size INTEGER NOT NULL, mtime INTEGER NOT NULL,"
    " n_passages INTEGER NOT NULL, UNIQUE(root, path));"
    "CREATE TABLE passages(id INTEGER PRIMARY KEY, file_id INTEGER NOT NULL REFERENCES"
    " files(id), section TEXT NOT NULL, text TEXT NOT NULL, byte_start INTEGER,"
    " byte_end INTEGER, line_start INTEGER, line_end INTEGER, record_id TEXT);"
    "CREATE INDEX passages_file ON passages(file_id);"
    "CREATE VIRTUAL TABLE passages_fts USING fts5(section, text, content='passages',"
    " content_rowid='id', tokenize='unicode61 remove_diacritics 2');"
    "CREATE TRIGGER passages_ai AFTER INSERT ON passages BEGIN"
    " INSERT INTO passages_fts(rowid, section, text) VALUES (new.id, new.section, new.text);"
    " END;"
    "CREATE TRIGGER passages_ad AFTER DELETE ON passages BEGIN"
    " INSERT INTO passages_fts(passages_fts, rowid, section, text)"
    " VALUES ('delete', old.id, old.section, old.text); END;"
    "CREATE TRIGGER passages_au AFTER UPDATE ON passages BEGIN"
    " INSERT INTO passages_fts(passages_fts, rowid, section, text)"
    " VALUES ('delete', old.id, old.section, old.text);"
    " INSERT INTO passages_fts(rowid, section, text) VALUES (new.id, new.section, new.text);"
    " END;";

static en_status db_err(en_index *idx, en_err *err, const char *what) {
    return EN_ERR(err, EN_ERR_IO, "%s: %s: %s", idx->path, what, sqlite3_errmsg(idx->db));
}

static en_status exec(en_index *idx, const char *sql, en_err *err) {
    char *msg = NULL;
    if (sqlite3_exec(idx->db, sql, NULL, NULL, &msg) == SQLITE_OK) return EN_OK;
    en_status st = EN_ERR(err, EN_ERR_IO, "%s: %s", idx->path, msg ? msg : "SQLite error");
    sqlite3_free(msg);
    return st;
}

/* The single text value of a one-row query with one bound text, or NULL. */
static char *query_text(en_index *idx, const char *sql, const char *arg) {
    sqlite3_stmt *st = NULL;
    char *out = NULL;
    if (sqlite3_prepare_v2(idx->db, sql, -1, &st, NULL) != SQLITE_OK) return NULL;
    if (arg) sqlite3_bind_text(st, 1, arg, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
        out = en_strdup((const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    return out;
}

static char *col_dup(sqlite3_stmt *st, int c) {
    const unsigned char *t = sqlite3_column_text(st, c);
    return t ? en_strdup((const char *)t) : NULL;
}

static en_status check_schema(en_index *idx, int create, en_err *err) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(idx->db, "SELECT count(*) FROM sqlite_master", -1, &st, NULL) !=
        SQLITE_OK)
        return db_err(idx, err, "not a readable SQLite database");
    int n = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
    sqlite3_finalize(st);
    if (n < 0) return db_err(idx, err, "not a readable SQLite database");
    if (n == 0) {
        if (!create)
            return EN_ERR(err, EN_ERR_FORMAT, "%s: an empty database, not an energon index",
                          idx->path);
        char sql[sizeof k_schema + 128];
        snprintf(sql, sizeof sql,
                 "BEGIN IMMEDIATE;%sINSERT INTO meta VALUES('schema_version','%d');COMMIT;",
                 k_schema, EN_INDEX_SCHEMA_VERSION);
        en_status s = exec(idx, sql, err);
        if (s != EN_OK) {
            sqlite3_exec(idx->db, "ROLLBACK", NULL, NULL, NULL);
            en_err_prefix(err, "creating the index: ");
        }
        return s;
    }
    char *v = query_text(idx, "SELECT value FROM meta WHERE key = 'schema_version'", NULL);
    if (!v)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: a SQLite database but not an energon index "
                      "(no meta table with a schema_version)", idx->path);
    int ver = atoi(v);
    en_free(v);
    if (ver != EN_INDEX_SCHEMA_VERSION)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: index schema version %d, this build reads %d",
                      idx->path, ver, EN_INDEX_SCHEMA_VERSION);
    /* The empty schema is committed on its own, before the first update's
     * transaction: a file whose first update was killed has it and nothing
     * else, and would read as a valid empty index. 'complete' is written in
     * every update's transaction (update_all), so it exists only once one
     * has committed; 'chunking' is written in the same transaction and
     * stands for it in indexes made before 'complete' was. A writer goes
     * on: its update is the rebuild. */
    if (create) return EN_OK;
    char *c = query_text(idx, "SELECT count(*) FROM meta WHERE key IN ('complete', 'chunking')",
                         NULL);
    int complete = c && atoi(c) > 0;
    en_free(c);
    if (!complete)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: an unfinished index (the `energon index` run "
                      "that made it was interrupted before its first update committed); "
                      "rebuild it: energon index --docs FOLDER --out %s", idx->path, idx->path);
    return EN_OK;
}

/* A read-only open of an index that a killed update left with a hot
 * rollback journal fails (SQLITE_READONLY_ROLLBACK): only a writer may roll
 * the journal back. Do that with a read-write open (the file then holds the
 * index as it was before the killed update, as any writer would make it);
 * where the file cannot be written (a read-only file system), say so. */
static en_status roll_back_hot_journal(const char *path, en_err *err) {
    sqlite3 *db = NULL;
    int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_busy_timeout(db, 5000);
        rc = sqlite3_exec(db, "SELECT count(*) FROM sqlite_master", NULL, NULL, NULL);
    }
    sqlite3_close(db);
    if (rc == SQLITE_OK) return EN_OK;
    return EN_ERR(err, EN_ERR_IO, "%s: an interrupted update left %s-journal, which only a "
                  "writable open can roll back (%s); run `energon index` on it where it can "
                  "be written", path, path, sqlite3_errstr(rc));
}

en_status en_index_open(const char *path, int create, en_index **out, en_err *err) {
    *out = NULL;
    if (!sqlite3_compileoption_used("ENABLE_FTS5"))
        return EN_ERR(err, EN_ERR_UNSUPPORTED, "%s: this SQLite (%s) is built without FTS5; "
                      "install Debian's libsqlite3-0 (scripts/install-deps)", path,
                      sqlite3_libversion());
    if (!create && !en_path_exists(path))
        return EN_ERR(err, EN_ERR_IO, "%s: no such index file", path);
    en_index *idx = en_calloc(1, sizeof *idx);
    if (!idx || !(idx->path = en_strdup(path))) {
        en_free(idx);
        return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", path);
    }
    /* create = 0 is for readers (the server, --search): they never write */
    int flags = create ? SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE : SQLITE_OPEN_READONLY;
    en_status s = EN_OK;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (sqlite3_open_v2(path, &idx->db, flags, NULL) != SQLITE_OK) {
            s = db_err(idx, err, "cannot open");
            break;
        }
        sqlite3_busy_timeout(idx->db, 5000);
        s = check_schema(idx, create, err);
        if (s == EN_OK || create || attempt ||
            sqlite3_extended_errcode(idx->db) != SQLITE_READONLY_ROLLBACK)
            break;
        sqlite3_close(idx->db);
        idx->db = NULL;
        if ((s = roll_back_hot_journal(path, err)) != EN_OK) break;
    }
    if (s != EN_OK) {
        en_index_destroy(idx);
        return s;
    }
    *out = idx;
    return EN_OK;
}

void en_index_destroy(en_index *idx) {
    if (!idx) return;
    sqlite3_close(idx->db);
    en_free(idx->path);
    en_free(idx->vec_pooling);
    en_free(idx->vec_name);
    en_free(idx->vec_hash);
    en_free(idx->vec_arch);
    en_free(idx);
}

/* ---- walking the folders ---- */

typedef struct file_list {
    char **rel; /* paths relative to the root */
    int n, cap;
} file_list;

static int by_name(const struct dirent **a, const struct dirent **b) {
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* Files under root/rel (rel "" for the root), in sorted order; symbolic links
 * to folders are not followed. */
static en_status walk(const char *root, const char *rel, file_list *fl, en_err *err) {
    char *dir = rel[0] ? en_path_join(root, rel) : en_strdup(root);
    if (!dir) return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", root);
    struct dirent **ents = NULL;
    int n = scandir(dir, &ents, NULL, by_name);
    if (n < 0) {
        en_status s = EN_ERR(err, EN_ERR_IO, "--docs %s: cannot read folder %s", root, dir);
        en_free(dir);
        return s;
    }
    en_status s = EN_OK;
    for (int i = 0; i < n; i++) {
        const char *name = ents[i]->d_name;
        if (s != EN_OK || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) continue;
        char *r = rel[0] ? en_path_join(rel, name) : en_strdup(name);
        char *full = r ? en_path_join(root, r) : NULL;
        struct stat lst, st;
        if (!full) s = EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", root);
        else if (lstat(full, &lst) == 0 && S_ISDIR(lst.st_mode)) s = walk(root, r, fl, err);
        else if (stat(full, &st) == 0 && S_ISREG(st.st_mode)) {
            if (fl->n == fl->cap) {
                int cap = fl->cap ? fl->cap * 2 : 64;
                char **g = en_realloc(fl->rel, (size_t)cap * sizeof *g);
                if (!g) s = EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", root);
                else fl->rel = g, fl->cap = cap;
            }
            if (s == EN_OK) fl->rel[fl->n++] = r, r = NULL;
        }
        en_free(r);
        en_free(full);
    }
    for (int i = 0; i < n; i++) free(ents[i]);
    free(ents);
    en_free(dir);
    return s;
}

/* ---- the update ---- */

typedef struct updater {
    en_index *idx;
    const en_index_config *cfg;
    en_index_stats *stats;
    sqlite3_stmt *find, *del_passages, *upsert, *ins_passage, *seen;
    int written; /* files written in this transaction */
} updater;

static const char *kind_name(en_doc_kind k) {
    return k == EN_DOC_TXT ? "txt" : k == EN_DOC_MD ? "md" : k == EN_DOC_HTML ? "html" : "jsonl";
}

static en_status step_done(updater *u, sqlite3_stmt *st, en_err *err) {
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) return db_err(u->idx, err, "writing");
    return EN_OK;
}

/* Chunk a read document and write its passages as file_id's. */
static en_status write_passages(updater *u, const en_doc *doc, int64_t file_id, int *n_out,
                                en_err *err) {
    en_passage *ps = NULL;
    int n = 0;
    EN_TRY(en_doc_chunk(doc, u->cfg->chunk_tokens, u->cfg->overlap, &ps, &n, err));
    en_status s = EN_OK;
    sqlite3_stmt *st = u->ins_passage;
    for (int i = 0; s == EN_OK && i < n; i++) {
        const en_doc_section *sec = &doc->sections[ps[i].section];
        sqlite3_bind_int64(st, 1, file_id);
        sqlite3_bind_text(st, 2, sec->title, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, ps[i].text, -1, SQLITE_STATIC);
        if (ps[i].byte_start >= 0) {
            sqlite3_bind_int64(st, 4, ps[i].byte_start);
            sqlite3_bind_int64(st, 5, ps[i].byte_end);
        }
        sqlite3_bind_int(st, 6, ps[i].line_start);
        sqlite3_bind_int(st, 7, ps[i].line_end);
        if (sec->record_id) sqlite3_bind_text(st, 8, sec->record_id, -1, SQLITE_STATIC);
        s = step_done(u, st, err);
    }
    en_passages_free(ps, n);
    *n_out = n;
    return s;
}

/* Index one file unless its hash is the stored one. */
static en_status update_file(updater *u, const char *root, const char *rel, en_err *err) {
    en_doc_kind kind = en_doc_kind_of(rel);
    if (kind == EN_DOC_NONE) {
        u->stats->skipped++;
        return EN_OK;
    }
    char *full = en_path_join(root, rel);
    char *data = NULL;
    size_t len = 0;
    struct stat sb;
    if (!full) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    en_status s = en_file_read_all(full, &data, &len, err);
    if (s == EN_OK && stat(full, &sb) != 0) sb.st_mtime = 0;
    char hash[48];
    if (s == EN_OK)
        snprintf(hash, sizeof hash, "crc32:%08x:size:%zu", en_crc32(0, data, len), len);
    int64_t file_id = -1;
    int same = 0;
    if (s == EN_OK) {
        sqlite3_bind_text(u->find, 1, root, -1, SQLITE_STATIC);
        sqlite3_bind_text(u->find, 2, rel, -1, SQLITE_STATIC);
        int rc = sqlite3_step(u->find);
        if (rc == SQLITE_ROW && sqlite3_column_int(u->find, 2)) {
            file_id = -2; /* named twice in this run (a file and its folder): done */
        } else if (rc == SQLITE_ROW) {
            file_id = sqlite3_column_int64(u->find, 0);
            same = strcmp((const char *)sqlite3_column_text(u->find, 1), hash) == 0;
        } else if (rc != SQLITE_DONE) {
            s = db_err(u->idx, err, "reading");
        }
        sqlite3_reset(u->find);
    }
    en_doc doc = {0};
    if (file_id == -2) {
        /* already indexed in this run */
    } else if (s == EN_OK && same) {
        u->stats->unchanged++;
        sqlite3_bind_int64(u->seen, 1, file_id);
        s = step_done(u, u->seen, err);
    } else if (s == EN_OK) {
        s = en_doc_read(full, kind, (const unsigned char *)data, len, &doc, err);
        if (s == EN_OK && (doc.not_documents || doc.binary)) {
            /* a data or binary file: gone from the index if it was there */
            u->stats->skipped++;
        } else if (s == EN_OK) {
            if (file_id >= 0) {
                sqlite3_bind_int64(u->del_passages, 1, file_id);
                s = step_done(u, u->del_passages, err);
            }
            sqlite3_stmt *up = u->upsert;
            sqlite3_bind_text(up, 1, root, -1, SQLITE_STATIC);
            sqlite3_bind_text(up, 2, rel, -1, SQLITE_STATIC);
            sqlite3_bind_text(up, 3, kind_name(kind), -1, SQLITE_STATIC);
            sqlite3_bind_text(up, 4, hash, -1, SQLITE_STATIC);
            sqlite3_bind_int64(up, 5, (int64_t)len);
            sqlite3_bind_int64(up, 6, (int64_t)sb.st_mtime);
            if (s == EN_OK && sqlite3_step(up) == SQLITE_ROW) {
                int64_t id = sqlite3_column_int64(up, 0);
                sqlite3_reset(up);
                int n = 0;
                s = write_passages(u, &doc, id, &n, err);
                char sql[192];
                snprintf(sql, sizeof sql, "UPDATE files SET n_passages = %d WHERE id = %lld;"
                         "INSERT INTO temp.seen VALUES(%lld)", n, (long long)id, (long long)id);
                if (s == EN_OK) s = exec(u->idx, sql, err);
            } else if (s == EN_OK) {
                s = db_err(u->idx, err, "writing");
            }
            sqlite3_reset(up);
            sqlite3_clear_bindings(up);
            if (s == EN_OK) {
                if (file_id >= 0) u->stats->changed++;
                else u->stats->added++;
                if (u->cfg->fail_after_files && ++u->written == u->cfg->fail_after_files)
                    abort(); /* test only: a crash in the middle of the transaction */
            }
        }
    }
    en_doc_deinit(&doc);
    en_free(data);
    en_free(full);
    return s;
}

/* Chunk settings: equal to the stored ones, else store them and empty the
 * index (a rebuild). */
static en_status check_settings(en_index *idx, const en_index_config *cfg,
                                en_index_stats *stats, en_err *err) {
    char want[64];
    snprintf(want, sizeof want, "words:%d:%d", cfg->chunk_tokens, cfg->overlap);
    char *have = query_text(idx, "SELECT value FROM meta WHERE key = 'chunking'", NULL);
    int same = have && strcmp(have, want) == 0;
    en_free(have);
    if (same) return EN_OK;
    char *n = query_text(idx, "SELECT count(*) FROM files", NULL);
    stats->rebuilt = n && atoi(n) > 0;
    en_free(n);
    char sql[512];
    snprintf(sql, sizeof sql,
             "DELETE FROM passages; DELETE FROM files;"
             "INSERT OR REPLACE INTO meta VALUES('chunking', '%s');"
             "INSERT OR REPLACE INTO meta VALUES('chunk_tokens', '%d');"
             "INSERT OR REPLACE INTO meta VALUES('overlap', '%d');",
             want, cfg->chunk_tokens, cfg->overlap);
    return exec(idx, sql, err);
}

static en_status prepare(en_index *idx, const char *sql, sqlite3_stmt **st, en_err *err) {
    if (sqlite3_prepare_v2(idx->db, sql, -1, st, NULL) != SQLITE_OK)
        return db_err(idx, err, "preparing a statement");
    return EN_OK;
}

/* ---- vectors (--embed) ---- */

/* The meta keys of the vectors, each with the embedder's value. */
typedef struct vec_meta {
    const char *key;
    char value[256];
} vec_meta;

static int vec_meta_of(const en_index_embedder *e, vec_meta *m) {
    int n = 0;
#define VM(k, ...) (m[n].key = k, snprintf(m[n].value, sizeof m[n].value, __VA_ARGS__), n++)
    VM("embed_dim", "%d", e->dim);
    VM("embed_pooling", "%s", e->pooling);
    VM("embed_model_hash", "%s", e->model_hash);
    VM("embed_model_arch", "%s", e->model_arch);
    VM("embed_vocab", "%d", e->vocab);
    VM("embed_layers", "%d", e->layers);
    VM("embed_max_tokens", "%d", e->max_tokens);
    VM("embed_model", "%s", e->model_name); /* informational: not compared */
#undef VM
    return n;
}

static int index_has_vectors(en_index *idx) {
    char *d = query_text(idx, "SELECT value FROM meta WHERE key = 'embed_dim'", NULL);
    int has = d != NULL;
    en_free(d);
    return has;
}

/* Without an embedder: an index with vectors would get passages without
 * them, so it is refused. */
static en_status vectors_refuse(en_index *idx, en_err *err) {
    if (!index_has_vectors(idx)) return EN_OK;
    char *name = query_text(idx, "SELECT value FROM meta WHERE key = 'embed_model'", NULL);
    en_status s = EN_ERR(err, EN_ERR_ARG, "%s holds vectors of the model %s: update it with "
                         "--embed --model M (another model re-embeds every passage)",
                         idx->path, name ? name : "?");
    en_free(name);
    return s;
}

/* With an embedder: the vectors table and the trigger that drops a
 * passage's vector with the passage (created when missing: an additive
 * change to schema version 1), and the identity in meta; vectors of
 * another model, dimension, pooling or truncation are all dropped. */
static en_status vectors_begin(en_index *idx, const en_index_embedder *e,
                               en_index_stats *stats, en_err *err) {
    EN_TRY(exec(idx, "CREATE TABLE IF NOT EXISTS vectors(passage_id INTEGER PRIMARY KEY,"
                     " v BLOB NOT NULL);"
                     "CREATE TRIGGER IF NOT EXISTS passages_vec_ad AFTER DELETE ON passages"
                     " BEGIN DELETE FROM vectors WHERE passage_id = old.id; END;", err));
    vec_meta m[8];
    int n = vec_meta_of(e, m), same = 1;
    for (int i = 0; i < n - 1 && same; i++) { /* embed_model (last) is not compared */
        char *have = query_text(idx, "SELECT value FROM meta WHERE key = ?1", m[i].key);
        same = have && strcmp(have, m[i].value) == 0;
        en_free(have);
    }
    if (!same) {
        char *c = query_text(idx, "SELECT count(*) FROM vectors", NULL);
        stats->reembedded = c && atoll(c) > 0;
        en_free(c);
        EN_TRY(exec(idx, "DELETE FROM vectors", err));
    }
    sqlite3_stmt *st = NULL;
    EN_TRY(prepare(idx, "INSERT OR REPLACE INTO meta VALUES(?1, ?2)", &st, err));
    en_status s = EN_OK;
    for (int i = 0; i < n && s == EN_OK; i++) {
        sqlite3_bind_text(st, 1, m[i].key, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, m[i].value, -1, SQLITE_STATIC);
        if (sqlite3_step(st) != SQLITE_DONE) s = db_err(idx, err, "writing meta");
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    return s;
}

/* float32 little-endian bytes, whatever the host's order. */
static void put_f32le(unsigned char *b, const float *v, int n) {
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++) b[4 * i + k] = (unsigned char)(u >> (8 * k));
    }
}

static float get_f32le(const unsigned char *b) {
    uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                 (uint32_t)b[3] << 24;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Embed texts[0..n) and store the vectors of ids[0..n). */
static en_status vectors_store(en_index *idx, const en_index_embedder *e, sqlite3_stmt *ins,
                               int64_t *ids, char **texts, int n, float *vec,
                               unsigned char *blob, en_err *err) {
    EN_TRY(e->embed(e->ctx, (const char *const *)texts, n, vec, err));
    for (int i = 0; i < n; i++) {
        put_f32le(blob, vec + (size_t)i * e->dim, e->dim);
        sqlite3_bind_int64(ins, 1, ids[i]);
        sqlite3_bind_blob(ins, 2, blob, 4 * e->dim, SQLITE_STATIC);
        int rc = sqlite3_step(ins);
        sqlite3_reset(ins);
        if (rc != SQLITE_DONE) return db_err(idx, err, "writing a vector");
    }
    return EN_OK;
}

/* Every passage without a vector gets one, `batch` at a time. */
static en_status vectors_fill(en_index *idx, const en_index_embedder *e,
                              en_index_stats *stats, en_err *err) {
    const int batch = e->batch > 0 ? e->batch : 64;
    char *c = query_text(idx, "SELECT count(*) FROM passages WHERE id NOT IN"
                              " (SELECT passage_id FROM vectors)", NULL);
    const int64_t total = c ? atoll(c) : 0;
    en_free(c);
    if (total == 0) return EN_OK;
    int64_t *ids = en_malloc((size_t)batch * sizeof *ids);
    char **texts = en_calloc((size_t)batch, sizeof *texts);
    float *vec = en_malloc((size_t)batch * (size_t)e->dim * sizeof *vec);
    unsigned char *blob = en_malloc((size_t)e->dim * 4);
    sqlite3_stmt *sel = NULL, *ins = NULL;
    en_status s = ids && texts && vec && blob ? EN_OK : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK)
        s = prepare(idx, "SELECT id, text FROM passages WHERE id NOT IN"
                         " (SELECT passage_id FROM vectors) ORDER BY id", &sel, err);
    if (s == EN_OK) s = prepare(idx, "INSERT INTO vectors VALUES(?1, ?2)", &ins, err);
    int n = 0, rc = SQLITE_ROW;
    /* passages are read in id order and not written meanwhile; whether
     * the SELECT sees the vectors inserted as it goes makes no difference
     * (their passages are behind it) */
    while (s == EN_OK && rc == SQLITE_ROW) {
        rc = sqlite3_step(sel);
        if (rc == SQLITE_ROW) {
            ids[n] = sqlite3_column_int64(sel, 0);
            texts[n] = col_dup(sel, 1);
            if (!texts[n++]) s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        } else if (rc != SQLITE_DONE) {
            s = db_err(idx, err, "reading passages");
        }
        if (s == EN_OK && n && (n == batch || rc == SQLITE_DONE)) {
            s = vectors_store(idx, e, ins, ids, texts, n, vec, blob, err);
            stats->embedded += n;
            if (s == EN_OK && e->progress) e->progress(e->ctx, stats->embedded, total);
        }
        if (n == batch || rc != SQLITE_ROW || s != EN_OK) {
            for (int i = 0; i < n; i++) en_free(texts[i]), texts[i] = NULL;
            n = 0;
        }
    }
    for (int i = 0; i < n; i++) en_free(texts[i]);
    sqlite3_finalize(sel);
    sqlite3_finalize(ins);
    en_free(ids);
    en_free(texts);
    en_free(vec);
    en_free(blob);
    return s;
}

/* A --docs that names a file: stored as root = its folder as written (the
 * text before the last '/', "." when none), path = its name, the same row
 * as when that folder is given. */
static en_status update_named_file(updater *u, const char *path, en_err *err) {
    const char *slash = strrchr(path, '/');
    if (!slash) return update_file(u, ".", path, err);
    if (!slash[1]) return EN_ERR(err, EN_ERR_ARG, "--docs %s: not a folder", path);
    char *dir = slash == path ? en_strdup("/") : en_strndup(path, (size_t)(slash - path));
    if (!dir) return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", path);
    en_status s = update_file(u, dir, slash + 1, err);
    en_free(dir);
    return s;
}

static en_status update_all(updater *u, const char *const *roots, int n_roots, en_err *err) {
    en_index *idx = u->idx;
    const en_index_embedder *e = u->cfg->embedder;
    EN_TRY(e ? vectors_begin(idx, e, u->stats, err) : vectors_refuse(idx, err));
    EN_TRY(check_settings(idx, u->cfg, u->stats, err));
    EN_TRY(exec(idx, "CREATE TEMP TABLE IF NOT EXISTS seen(id INTEGER PRIMARY KEY);"
                     "DELETE FROM temp.seen;", err));
    EN_TRY(prepare(idx, "SELECT id, hash, id IN (SELECT id FROM temp.seen) FROM files"
                        " WHERE root = ?1 AND path = ?2", &u->find, err));
    EN_TRY(prepare(idx, "DELETE FROM passages WHERE file_id = ?1", &u->del_passages, err));
    EN_TRY(prepare(idx, "INSERT INTO files(root, path, kind, hash, size, mtime, n_passages)"
                        " VALUES(?1, ?2, ?3, ?4, ?5, ?6, 0) ON CONFLICT(root, path) DO UPDATE"
                        " SET kind = excluded.kind, hash = excluded.hash, size = excluded.size,"
                        " mtime = excluded.mtime RETURNING id", &u->upsert, err));
    EN_TRY(prepare(idx, "INSERT INTO passages(file_id, section, text, byte_start, byte_end,"
                        " line_start, line_end, record_id) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                   &u->ins_passage, err));
    EN_TRY(prepare(idx, "INSERT OR IGNORE INTO temp.seen VALUES(?1)", &u->seen, err));
    for (int r = 0; r < n_roots; r++) {
        file_list fl = {0};
        struct stat rs;
        if (stat(roots[r], &rs) == 0 && !S_ISDIR(rs.st_mode)) {
            EN_TRY(update_named_file(u, roots[r], err));
            continue;
        }
        en_status s = walk(roots[r], "", &fl, err);
        for (int i = 0; s == EN_OK && i < fl.n; i++) s = update_file(u, roots[r], fl.rel[i], err);
        for (int i = 0; i < fl.n; i++) en_free(fl.rel[i]);
        en_free(fl.rel);
        EN_TRY(s);
    }
    char *gone = query_text(idx, "SELECT count(*) FROM files WHERE id NOT IN"
                                 " (SELECT id FROM temp.seen)", NULL);
    u->stats->removed = gone ? atoi(gone) : 0;
    en_free(gone);
    EN_TRY(exec(idx, "DELETE FROM passages WHERE file_id NOT IN (SELECT id FROM temp.seen);"
                     "DELETE FROM files WHERE id NOT IN (SELECT id FROM temp.seen);", err));
    if (e) EN_TRY(vectors_fill(idx, e, u->stats, err));
    /* in the update's transaction: readers take the file for an index only
     * once an update committed (check_schema) */
    EN_TRY(exec(idx, "INSERT OR REPLACE INTO meta VALUES('complete', '1')", err));
    char *np = query_text(idx, "SELECT count(*) FROM passages", NULL);
    u->stats->passages = np ? atoll(np) : 0;
    en_free(np);
    return EN_OK;
}

en_status en_index_update(en_index *idx, const char *const *roots, int n_roots,
                          const en_index_config *cfg, en_index_stats *stats, en_err *err) {
    memset(stats, 0, sizeof *stats);
    if (cfg->chunk_tokens < 1 || cfg->overlap < 0 || cfg->overlap >= cfg->chunk_tokens)
        return EN_ERR(err, EN_ERR_ARG, "chunk size %d with overlap %d: need 0 <= overlap < "
                      "size", cfg->chunk_tokens, cfg->overlap);
    en_index_config c = *cfg;
    updater u = {0};
    u.idx = idx, u.cfg = &c, u.stats = stats;
    EN_TRY(exec(idx, "BEGIN IMMEDIATE", err));
    en_status s = update_all(&u, roots, n_roots, err);
    sqlite3_finalize(u.find);
    sqlite3_finalize(u.del_passages);
    sqlite3_finalize(u.upsert);
    sqlite3_finalize(u.ins_passage);
    sqlite3_finalize(u.seen);
    if (s == EN_OK) s = exec(idx, "COMMIT", err);
    if (s != EN_OK) sqlite3_exec(idx->db, "ROLLBACK", NULL, NULL, NULL);
    return s;
}

/* ---- search ---- */

static int is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* A word of the query: p[0, len) (pointing into the query), its ordinal,
 * the key it is compared by (below) and whether an earlier word has the
 * same key. */
typedef struct query_word {
    const char *p;
    size_t len, ordinal;
    const char *key;
    size_t key_off, key_len;
    int repeat;
} query_word;

/* By key, then by ordinal. */
static int by_key(const void *pa, const void *pb) {
    const query_word *a = pa, *b = pb;
    int d = memcmp(a->key, b->key, a->key_len < b->key_len ? a->key_len : b->key_len);
    if (d) return d;
    if (a->key_len != b->key_len) return a->key_len < b->key_len ? -1 : 1;
    return a->ordinal < b->ordinal ? -1 : a->ordinal > b->ordinal;
}

/* The words' keys, one after another (grown as needed). */
typedef struct key_buf {
    char *b;
    size_t n, cap;
} key_buf;

static int key_put(key_buf *k, const char *s, size_t n) {
    if (k->n + n > k->cap) {
        size_t cap = k->cap ? k->cap : 256;
        while (cap < k->n + n) cap *= 2; /* n + k->n: bytes of tokens of the query, < 2^62 */
        char *g = en_realloc(k->b, cap);
        if (!g) return 0;
        k->b = g, k->cap = cap;
    }
    memcpy(k->b + k->n, s, n);
    k->n += n;
    return 1;
}

/* Each token FTS5's tokenizer gives for a word, then a NUL. */
static int key_token(void *ctx, int flags, const char *tok, int n, int start, int end) {
    (void)flags, (void)start, (void)end;
    return n >= 0 && key_put(ctx, tok, (size_t)n) && key_put(ctx, "", 1) ? SQLITE_OK : SQLITE_NOMEM;
}

/* The tokenizer of passages_fts (k_schema: unicode61 remove_diacritics 2),
 * from SQLite's fts5_api; 0 when there is none to be had. */
static int fts5_tokenizer_open(sqlite3 *db, fts5_tokenizer *mod, Fts5Tokenizer **tok) {
    static const char *args[2] = {"remove_diacritics", "2"};
    fts5_api *api = NULL;
    sqlite3_stmt *st = NULL;
    void *ud = NULL;
    *tok = NULL;
    if (sqlite3_prepare_v2(db, "SELECT fts5(?1)", -1, &st, NULL) != SQLITE_OK) return 0;
    sqlite3_bind_pointer(st, 1, (void *)&api, "fts5_api_ptr", NULL);
    sqlite3_step(st);
    sqlite3_finalize(st);
    if (!api || api->iVersion < 2 || api->xFindTokenizer(api, "unicode61", &ud, mod) != SQLITE_OK)
        return 0;
    return mod->xCreate(ud, args, 2, tok) == SQLITE_OK && *tok;
}

/* Key every word: the tokens FTS5 reads it as (case and diacritics folded
 * as the index folds them), so that two words with the same key are the
 * same phrase to FTS5; without a tokenizer, the word with ASCII letters
 * folded. Then mark each word whose key an earlier word has. 0 when out of
 * memory. */
static int mark_repeats(sqlite3 *db, query_word *w, size_t k) {
    fts5_tokenizer mod;
    Fts5Tokenizer *tok = NULL;
    key_buf kb = {0};
    int ok = 1, have = fts5_tokenizer_open(db, &mod, &tok);
    for (size_t i = 0; ok && i < k; i++) {
        w[i].key_off = kb.n;
        if (have && w[i].len <= INT_MAX) {
            ok = mod.xTokenize(tok, &kb, FTS5_TOKENIZE_QUERY, w[i].p, (int)w[i].len,
                               key_token) == SQLITE_OK;
        } else {
            for (size_t j = 0; ok && j < w[i].len; j++) {
                char c = w[i].p[j];
                c = c >= 'A' && c <= 'Z' ? (char)(c | 32) : c;
                ok = key_put(&kb, &c, 1);
            }
        }
        w[i].key_len = kb.n - w[i].key_off;
    }
    if (tok) mod.xDelete(tok);
    query_word *sorted = ok ? en_malloc(k * sizeof *sorted) : NULL;
    ok = sorted != NULL;
    if (sorted) {
        for (size_t i = 0; i < k; i++) w[i].key = kb.b ? kb.b + w[i].key_off : "";
        memcpy(sorted, w, k * sizeof *w);
        qsort(sorted, k, sizeof *sorted, by_key);
        for (size_t j = 1; j < k; j++) {
            const query_word *a = &sorted[j - 1], *b = &sorted[j];
            if (a->key_len == b->key_len && !memcmp(a->key, b->key, a->key_len))
                w[b->ordinal].repeat = 1;
        }
    }
    en_free(sorted);
    en_free(kb.b);
    return ok;
}

/* The words of q[0..n) with a letter or digit (*n_words of them, in order,
 * en_malloc'd; NULL with *n_words 0 for none or out of memory: *oom says
 * which), each repeat of an earlier one marked (mark_repeats). */
static query_word *query_words(sqlite3 *db, const char *q, size_t n, size_t *n_words,
                               int *oom) {
    *n_words = 0, *oom = 0;
    /* a word and its separator take two bytes at least: k <= n / 2 + 1 */
    if (n / 2 + 1 > SIZE_MAX / sizeof(query_word)) return *oom = 1, NULL;
    query_word *w = en_malloc((n / 2 + 1) * sizeof *w);
    if (!w) return *oom = 1, NULL;
    size_t k = 0, i = 0;
    while (i < n) {
        while (i < n && is_space(q[i])) i++;
        size_t a = i;
        int word = 0;
        while (i < n && !is_space(q[i])) {
            unsigned char c = (unsigned char)q[i++];
            word |= (c >= 0x80 || (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z'));
        }
        if (word) w[k] = (query_word){q + a, i - a, k, NULL, 0, 0, 0}, k++;
    }
    if (k > 1 && !mark_repeats(db, w, k)) {
        en_free(w);
        return *oom = 1, NULL;
    }
    if (!k) en_free(w);
    *n_words = k;
    return w;
}

/* Write the MATCH expression of words[0..n) to out (NULL: only count) and
 * return its length without the NUL. One function for both passes, so that
 * the size counted is the size written: a word of L bytes with d quotes
 * becomes " OR " + '"' + L + d + '"' (d < L: a word has a letter), at most
 * 3.5 bytes per byte of input with its separator (one-letter words, 7 out
 * for 2 in: more than the 3n + 8 once allocated here, issue 31). */
static size_t match_write(const query_word *words, size_t n, char *out) {
    size_t len = 0;
#define PUT(c) (out ? (void)(out[len] = (c)) : (void)0, len++)
    for (size_t i = 0; i < n; i++) {
        if (words[i].repeat) continue;
        if (len) {
            if (out) memcpy(out + len, " OR ", 4);
            len += 4;
        }
        PUT('"');
        for (size_t k = 0; k < words[i].len; k++) {
            if (words[i].p[k] == '"') PUT('"');
            PUT(words[i].p[k]);
        }
        PUT('"');
    }
#undef PUT
    return len;
}

/* The MATCH expression of a query: each word quoted ("" inside), OR-ed,
 * once: a repeat of an earlier word (the same tokens to FTS5: case and
 * diacritics folded) is left out, as are words with no letter or digit.
 * Why once: FTS5's bm25() costs about the square of the phrases that match
 * a row (4096 one-letter words took 13 s of CPU on a 77-passage index,
 * against 0.01 s for the word once), so repeats were a cheap way to pin a
 * server thread; and a word said twice is no stronger evidence of what the
 * user means. NULL on OOM (or a query over SIZE_MAX / 4 bytes, whose count
 * could wrap); "" for none. */
static char *match_expr(sqlite3 *db, const char *q) {
    size_t n = strlen(q), k = 0;
    if (n > SIZE_MAX / 4) return NULL; /* the count is at most 3.5 n + 1 */
    int oom = 0;
    query_word *words = query_words(db, q, n, &k, &oom);
    if (oom) return NULL;
    size_t len = match_write(words, k, NULL);
    char *out = en_malloc(len + 1);
    if (out) {
        size_t w = match_write(words, k, out);
        EN_ASSERT(w == len);
        out[w] = 0;
    }
    en_free(words);
    return out;
}

void en_index_hits_free(en_index_hit *hits, int n) {
    if (!hits) return;
    for (int i = 0; i < n; i++) {
        en_free(hits[i].root);
        en_free(hits[i].file);
        en_free(hits[i].section);
        en_free(hits[i].text);
        en_free(hits[i].record_id);
    }
    en_free(hits);
}

/* A hit from a row of HIT_COLUMNS; 0 when out of memory. */
#define HIT_COLUMNS                                                                            \
    "f.root, f.path, p.section, p.text, p.record_id, p.line_start, p.line_end, p.byte_start,"  \
    " p.byte_end"
static int fill_hit(sqlite3_stmt *st, en_index_hit *x) {
    x->id = sqlite3_column_int64(st, 0);
    x->score = sqlite3_column_double(st, 1);
    x->root = col_dup(st, 2), x->file = col_dup(st, 3), x->section = col_dup(st, 4);
    x->text = col_dup(st, 5), x->record_id = col_dup(st, 6);
    x->line_start = sqlite3_column_int(st, 7), x->line_end = sqlite3_column_int(st, 8);
    x->byte_start = sqlite3_column_type(st, 9) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 9);
    x->byte_end = sqlite3_column_type(st, 10) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 10);
    return x->root && x->file && x->section && x->text;
}

en_status en_index_search(en_index *idx, const char *query, int top_k, en_index_hit **hits,
                          int *n, en_err *err) {
    *hits = NULL, *n = 0;
    if (top_k < 1 || top_k > 1000)
        return EN_ERR(err, EN_ERR_ARG, "top_k %d: must be 1..1000", top_k);
    if (en_utf8_first_invalid((const unsigned char *)query, strlen(query)) < strlen(query))
        return EN_ERR(err, EN_ERR_ARG, "the query is not valid UTF-8");
    char *m = match_expr(idx->db, query);
    if (!m) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (!m[0]) {
        en_free(m);
        return EN_OK;
    }
    en_index_hit *h = en_calloc((size_t)top_k, sizeof *h);
    sqlite3_stmt *st = NULL;
    en_status s = h ? EN_OK : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK)
        s = prepare(idx, "SELECT p.id, -bm25(passages_fts), " HIT_COLUMNS
                         " FROM passages_fts JOIN passages p ON p.id = passages_fts.rowid"
                         " JOIN files f ON f.id = p.file_id WHERE passages_fts MATCH ?1"
                         " ORDER BY bm25(passages_fts), p.id LIMIT ?2", &st, err);
    int k = 0, rc = SQLITE_DONE;
    if (s == EN_OK) {
        sqlite3_bind_text(st, 1, m, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 2, top_k);
        while (k < top_k && (rc = sqlite3_step(st)) == SQLITE_ROW) {
            if (!fill_hit(st, &h[k++])) {
                s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
                break;
            }
        }
        if (s == EN_OK && rc != SQLITE_ROW && rc != SQLITE_DONE) s = db_err(idx, err, "search");
    }
    sqlite3_finalize(st);
    en_free(m);
    if (s != EN_OK) {
        en_index_hits_free(h, k);
        return s;
    }
    *hits = h, *n = k;
    return EN_OK;
}

const char *en_index_path(const en_index *idx) { return idx->path; }

/* ---- vectors: info and dense search ---- */

static char *meta_value(en_index *idx, const char *key) {
    return query_text(idx, "SELECT value FROM meta WHERE key = ?1", key);
}

/* Refresh the cached meta value *slot, keeping the old string (and so the
 * pointers handed out by an earlier en_index_vector_info) when unchanged. */
static void cache_meta(en_index *idx, char **slot, const char *key) {
    char *v = meta_value(idx, key);
    if (v && *slot && strcmp(v, *slot) == 0) {
        en_free(v);
        return;
    }
    en_free(*slot);
    *slot = v;
}

en_status en_index_vector_info(en_index *idx, en_index_vectors *out, en_err *err) {
    memset(out, 0, sizeof *out);
    char *dim = meta_value(idx, "embed_dim");
    if (!dim) return EN_OK;
    out->dim = atoi(dim);
    en_free(dim);
    char *v[3] = {meta_value(idx, "embed_vocab"), meta_value(idx, "embed_layers"),
                  meta_value(idx, "embed_max_tokens")};
    out->vocab = v[0] ? atoi(v[0]) : 0;
    out->layers = v[1] ? atoi(v[1]) : 0;
    out->max_tokens = v[2] ? atoi(v[2]) : 0;
    for (int i = 0; i < 3; i++) en_free(v[i]);
    cache_meta(idx, &idx->vec_pooling, "embed_pooling");
    cache_meta(idx, &idx->vec_name, "embed_model");
    cache_meta(idx, &idx->vec_hash, "embed_model_hash");
    cache_meta(idx, &idx->vec_arch, "embed_model_arch");
    if (out->dim < 1 || !idx->vec_pooling || !idx->vec_name || !idx->vec_hash ||
        !idx->vec_arch)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: the vectors' meta entries (embed_*) are "
                      "incomplete", idx->path);
    char *c = query_text(idx, "SELECT count(*) FROM vectors", NULL);
    if (!c) return db_err(idx, err, "no vectors table though meta has embed_dim");
    out->count = atoll(c);
    en_free(c);
    out->has = 1;
    out->pooling = idx->vec_pooling, out->model_name = idx->vec_name;
    out->model_hash = idx->vec_hash, out->model_arch = idx->vec_arch;
    return EN_OK;
}

typedef struct scored {
    int64_t id;
    double score;
} scored;

/* Insert (id, score) into the best-first list top[0..*n) of at most k:
 * higher score first, then lower id. */
static void top_insert(scored *top, int *n, int k, int64_t id, double score) {
    int i = *n;
    if (i == k) {
        const scored *w = &top[k - 1];
        if (score < w->score || (score == w->score && id > w->id)) return;
        i = k - 1;
    } else {
        (*n)++;
    }
    while (i > 0 &&
           (top[i - 1].score < score || (top[i - 1].score == score && top[i - 1].id > id))) {
        top[i] = top[i - 1];
        i--;
    }
    top[i].id = id, top[i].score = score;
}

/* The best-first (id, score) pairs of every stored vector against q. */
static en_status dense_rank(en_index *idx, const float *q, int dim, scored *top, int k, int *n,
                            en_err *err) {
    sqlite3_stmt *st = NULL;
    EN_TRY(prepare(idx, "SELECT passage_id, v FROM vectors", &st, err));
    en_status s = EN_OK;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const unsigned char *b = sqlite3_column_blob(st, 1);
        if (sqlite3_column_bytes(st, 1) != 4 * dim || !b) {
            s = EN_ERR(err, EN_ERR_FORMAT, "%s: the vector of passage %lld has %d bytes, not "
                       "%d", idx->path, (long long)sqlite3_column_int64(st, 0),
                       sqlite3_column_bytes(st, 1), 4 * dim);
            break;
        }
        double dot = 0;
        for (int i = 0; i < dim; i++) dot += (double)q[i] * (double)get_f32le(b + 4 * i);
        top_insert(top, n, k, sqlite3_column_int64(st, 0), dot);
    }
    if (s == EN_OK && rc != SQLITE_DONE) s = db_err(idx, err, "reading vectors");
    sqlite3_finalize(st);
    return s;
}

en_status en_index_search_dense(en_index *idx, const float *q, int dim, int top_k,
                                en_index_hit **hits, int *n, en_err *err) {
    *hits = NULL, *n = 0;
    if (top_k < 1 || top_k > 1000)
        return EN_ERR(err, EN_ERR_ARG, "top_k %d: must be 1..1000", top_k);
    en_index_vectors info;
    EN_TRY(en_index_vector_info(idx, &info, err));
    if (!info.has)
        return EN_ERR(err, EN_ERR_ARG, "%s holds no vectors (build it with energon index "
                      "--embed)", idx->path);
    if (dim != info.dim)
        return EN_ERR(err, EN_ERR_ARG, "%s: a query vector of %d floats; the index's have %d",
                      idx->path, dim, info.dim);
    scored *top = en_malloc((size_t)top_k * sizeof *top);
    en_index_hit *h = en_calloc((size_t)top_k, sizeof *h);
    sqlite3_stmt *st = NULL;
    int k = 0, filled = 0;
    en_status s = top && h ? EN_OK : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK) s = dense_rank(idx, q, dim, top, top_k, &k, err);
    if (s == EN_OK)
        s = prepare(idx, "SELECT p.id, 0.0, " HIT_COLUMNS " FROM passages p"
                         " JOIN files f ON f.id = p.file_id WHERE p.id = ?1", &st, err);
    for (int i = 0; s == EN_OK && i < k; i++) {
        sqlite3_bind_int64(st, 1, top[i].id);
        if (sqlite3_step(st) != SQLITE_ROW) {
            s = EN_ERR(err, EN_ERR_FORMAT, "%s: a vector for passage %lld, which is not in "
                       "the index", idx->path, (long long)top[i].id);
        } else if (!fill_hit(st, &h[filled++])) {
            s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        }
        h[i].score = top[i].score;
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    en_free(top);
    if (s != EN_OK) {
        en_index_hits_free(h, filled);
        return s;
    }
    *hits = h, *n = k;
    return EN_OK;
}
