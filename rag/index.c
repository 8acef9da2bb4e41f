/*
 * index.c - the document index in SQLite + FTS5 (see index.h and
 * docs/retrieval.md): schema, incremental update in one transaction, BM25
 * search.
 */
#include "index.h"

#include <dirent.h>
#include <sqlite3.h>
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
};

en_index_config en_index_config_default(void) {
    en_index_config c = {256, 32, 0};
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

/* The MATCH expression of a query: each word quoted ("" inside), OR-ed;
 * words with no letter or digit are left out. NULL on OOM; "" for none. */
static char *match_expr(const char *q) {
    size_t n = strlen(q);
    char *out = en_malloc(3 * n + 8), *o = out;
    if (!out) return NULL;
    size_t i = 0;
    while (i < n) {
        while (i < n && (q[i] == ' ' || (q[i] >= '\t' && q[i] <= '\r'))) i++;
        size_t a = i;
        int word = 0;
        while (i < n && !(q[i] == ' ' || (q[i] >= '\t' && q[i] <= '\r'))) {
            unsigned char c = (unsigned char)q[i++];
            word |= (c >= 0x80 || (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z'));
        }
        if (!word) continue;
        if (o != out) memcpy(o, " OR ", 4), o += 4;
        *o++ = '"';
        for (size_t k = a; k < i; k++) {
            if (q[k] == '"') *o++ = '"';
            *o++ = q[k];
        }
        *o++ = '"';
    }
    *o = 0;
    return out;
}

static char *col_dup(sqlite3_stmt *st, int c) {
    const unsigned char *t = sqlite3_column_text(st, c);
    return t ? en_strdup((const char *)t) : NULL;
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

en_status en_index_search(en_index *idx, const char *query, int top_k, en_index_hit **hits,
                          int *n, en_err *err) {
    *hits = NULL, *n = 0;
    if (top_k < 1 || top_k > 1000)
        return EN_ERR(err, EN_ERR_ARG, "top_k %d: must be 1..1000", top_k);
    if (en_utf8_first_invalid((const unsigned char *)query, strlen(query)) < strlen(query))
        return EN_ERR(err, EN_ERR_ARG, "the query is not valid UTF-8");
    char *m = match_expr(query);
    if (!m) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (!m[0]) {
        en_free(m);
        return EN_OK;
    }
    en_index_hit *h = en_calloc((size_t)top_k, sizeof *h);
    sqlite3_stmt *st = NULL;
    en_status s = h ? EN_OK : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK)
        s = prepare(idx, "SELECT p.id, -bm25(passages_fts), f.root, f.path, p.section, p.text,"
                         " p.record_id, p.line_start, p.line_end, p.byte_start, p.byte_end"
                         " FROM passages_fts JOIN passages p ON p.id = passages_fts.rowid"
                         " JOIN files f ON f.id = p.file_id WHERE passages_fts MATCH ?1"
                         " ORDER BY bm25(passages_fts), p.id LIMIT ?2", &st, err);
    int k = 0, rc = SQLITE_DONE;
    if (s == EN_OK) {
        sqlite3_bind_text(st, 1, m, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 2, top_k);
        while (k < top_k && (rc = sqlite3_step(st)) == SQLITE_ROW) {
            en_index_hit *x = &h[k++];
            x->id = sqlite3_column_int64(st, 0);
            x->score = sqlite3_column_double(st, 1);
            x->root = col_dup(st, 2), x->file = col_dup(st, 3), x->section = col_dup(st, 4);
            x->text = col_dup(st, 5), x->record_id = col_dup(st, 6);
            x->line_start = sqlite3_column_int(st, 7), x->line_end = sqlite3_column_int(st, 8);
            x->byte_start = sqlite3_column_type(st, 9) == SQLITE_NULL
                                ? -1 : sqlite3_column_int64(st, 9);
            x->byte_end = sqlite3_column_type(st, 10) == SQLITE_NULL
                              ? -1 : sqlite3_column_int64(st, 10);
            if (!x->root || !x->file || !x->section || !x->text) {
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
