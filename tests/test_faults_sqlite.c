/*
 * test_faults_sqlite.c - for test_faults.c: SQLite (the index, rag/index.c)
 * writes its files through its own VFS and allocates through its own
 * allocator, not through common/file.c and en_malloc. This wraps the
 * default VFS so that file writes, truncations and syncs count as
 * EN_FAULT_WRITE / EN_FAULT_FSYNC (failing with SQLITE_FULL / SQLITE_IOERR_*
 * as a full or broken disk would), and installs an allocator whose calls
 * count as EN_FAULT_ALLOC. Reads and locks are passed through unchanged.
 */
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#include "common/fault.h"

typedef struct ffile {
    sqlite3_file base; /* pMethods = &k_io */
    sqlite3_file *real;
} ffile;

static sqlite3_vfs *g_real_vfs;
static sqlite3_vfs g_vfs;

#define REAL(f) (((ffile *)(f))->real)

static int f_close(sqlite3_file *f) {
    int rc = REAL(f)->pMethods ? REAL(f)->pMethods->xClose(REAL(f)) : SQLITE_OK;
    sqlite3_free(REAL(f));
    return rc;
}
static int f_read(sqlite3_file *f, void *b, int n, sqlite3_int64 off) {
    return REAL(f)->pMethods->xRead(REAL(f), b, n, off);
}
static int f_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 off) {
    if (en_fault_hit(EN_FAULT_WRITE)) return SQLITE_FULL;
    return REAL(f)->pMethods->xWrite(REAL(f), b, n, off);
}
static int f_truncate(sqlite3_file *f, sqlite3_int64 size) {
    if (en_fault_hit(EN_FAULT_WRITE)) return SQLITE_IOERR_TRUNCATE;
    return REAL(f)->pMethods->xTruncate(REAL(f), size);
}
static int f_sync(sqlite3_file *f, int flags) {
    if (en_fault_hit(EN_FAULT_FSYNC)) return SQLITE_IOERR_FSYNC;
    return REAL(f)->pMethods->xSync(REAL(f), flags);
}
static int f_size(sqlite3_file *f, sqlite3_int64 *size) {
    return REAL(f)->pMethods->xFileSize(REAL(f), size);
}
static int f_lock(sqlite3_file *f, int l) { return REAL(f)->pMethods->xLock(REAL(f), l); }
static int f_unlock(sqlite3_file *f, int l) { return REAL(f)->pMethods->xUnlock(REAL(f), l); }
static int f_check(sqlite3_file *f, int *out) {
    return REAL(f)->pMethods->xCheckReservedLock(REAL(f), out);
}
static int f_control(sqlite3_file *f, int op, void *arg) {
    return REAL(f)->pMethods->xFileControl(REAL(f), op, arg);
}
static int f_sector(sqlite3_file *f) { return REAL(f)->pMethods->xSectorSize(REAL(f)); }
static int f_caps(sqlite3_file *f) { return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f)); }

/* Version 1 methods: no shared memory (the index uses a rollback journal)
 * and no memory maps, so SQLite does every write through xWrite. */
static const sqlite3_io_methods k_io = {
    .iVersion = 1,
    .xClose = f_close,
    .xRead = f_read,
    .xWrite = f_write,
    .xTruncate = f_truncate,
    .xSync = f_sync,
    .xFileSize = f_size,
    .xLock = f_lock,
    .xUnlock = f_unlock,
    .xCheckReservedLock = f_check,
    .xFileControl = f_control,
    .xSectorSize = f_sector,
    .xDeviceCharacteristics = f_caps,
};

static int v_open(sqlite3_vfs *v, const char *name, sqlite3_file *f, int flags, int *out_flags) {
    (void)v;
    ffile *ff = (ffile *)f;
    ff->base.pMethods = NULL;
    ff->real = sqlite3_malloc(g_real_vfs->szOsFile);
    if (!ff->real) return SQLITE_NOMEM;
    memset(ff->real, 0, (size_t)g_real_vfs->szOsFile);
    int rc = g_real_vfs->xOpen(g_real_vfs, name, ff->real, flags, out_flags);
    if (rc != SQLITE_OK) {
        if (ff->real->pMethods) ff->real->pMethods->xClose(ff->real);
        sqlite3_free(ff->real);
        ff->real = NULL;
        return rc;
    }
    ff->base.pMethods = &k_io;
    return SQLITE_OK;
}
static int v_delete(sqlite3_vfs *v, const char *name, int sync) {
    (void)v;
    return g_real_vfs->xDelete(g_real_vfs, name, sync);
}
static int v_access(sqlite3_vfs *v, const char *name, int flags, int *out) {
    (void)v;
    return g_real_vfs->xAccess(g_real_vfs, name, flags, out);
}
static int v_full(sqlite3_vfs *v, const char *name, int n, char *out) {
    (void)v;
    return g_real_vfs->xFullPathname(g_real_vfs, name, n, out);
}
static int v_random(sqlite3_vfs *v, int n, char *out) {
    (void)v;
    return g_real_vfs->xRandomness(g_real_vfs, n, out);
}
static int v_sleep(sqlite3_vfs *v, int us) {
    (void)v;
    return g_real_vfs->xSleep(g_real_vfs, us);
}
static int v_time(sqlite3_vfs *v, double *out) {
    (void)v;
    return g_real_vfs->xCurrentTime(g_real_vfs, out);
}
static int v_last_error(sqlite3_vfs *v, int n, char *out) {
    (void)v;
    return g_real_vfs->xGetLastError(g_real_vfs, n, out);
}

/* ---- the allocator: a size header before each block ---- */

static void *m_malloc(int n) {
    if (n <= 0 || en_fault_hit(EN_FAULT_ALLOC)) return NULL;
    sqlite3_int64 *p = malloc((size_t)n + 8);
    if (!p) return NULL;
    p[0] = n;
    return p + 1;
}
static void m_free(void *p) {
    if (p) free((sqlite3_int64 *)p - 1);
}
static void *m_realloc(void *p, int n) {
    if (en_fault_hit(EN_FAULT_ALLOC)) return NULL;
    sqlite3_int64 *q = realloc((sqlite3_int64 *)p - 1, (size_t)n + 8);
    if (!q) return NULL;
    q[0] = n;
    return q + 1;
}
static int m_size(void *p) { return p ? (int)((sqlite3_int64 *)p)[-1] : 0; }
static int m_roundup(int n) { return (n + 7) & ~7; }
static int m_init(void *u) {
    (void)u;
    return SQLITE_OK;
}
static void m_shutdown(void *u) { (void)u; }

int en_test_sqlite_faults_install(void) {
    static const sqlite3_mem_methods mem = {m_malloc, m_free,   m_realloc,  m_size,
                                            m_roundup, m_init, m_shutdown, NULL};
    if (sqlite3_config(SQLITE_CONFIG_MALLOC, &mem) != SQLITE_OK) return 0;
    if (sqlite3_initialize() != SQLITE_OK) return 0;
    g_real_vfs = sqlite3_vfs_find(NULL);
    if (!g_real_vfs) return 0;
    g_vfs.iVersion = 1;
    g_vfs.szOsFile = (int)sizeof(ffile);
    g_vfs.mxPathname = g_real_vfs->mxPathname;
    g_vfs.zName = "en_faults";
    g_vfs.xOpen = v_open;
    g_vfs.xDelete = v_delete;
    g_vfs.xAccess = v_access;
    g_vfs.xFullPathname = v_full;
    g_vfs.xRandomness = v_random;
    g_vfs.xSleep = v_sleep;
    g_vfs.xCurrentTime = v_time;
    g_vfs.xGetLastError = v_last_error;
    return sqlite3_vfs_register(&g_vfs, 1) == SQLITE_OK;
}
