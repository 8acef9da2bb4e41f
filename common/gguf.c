/*
 * gguf.c - see gguf.h. Parsing runs twice over the same bytes: the first
 * pass validates the whole header, metadata and tensor table and only
 * counts (keys, names, array offsets); the second pass, after one
 * allocation of each array sized by those counts, fills them in. So no
 * allocation is ever sized by a number the file merely claims. Every read
 * goes through a cursor that checks the remaining length first.
 * Dequantisation (en_ggml_to_f32) is at the end of this file.
 */
#include "gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file.h"
#include "safetensors.h" /* en_f16_to_f32, en_bf16_to_f32 */

#define EN_GGUF_MAGIC "GGUF"
#define EN_GGUF_DEFAULT_ALIGN 32
#define EN_GGUF_MAX_KEY 65535      /* the spec's bound on key length */
#define EN_GGUF_MAX_NAME 1024      /* ggml uses 64; be lenient but bounded */
#define EN_GGUF_MAX_NEST 4         /* arrays of arrays of ... */

typedef struct en_gguf_kv {
    const char *key;
    en_gguf_value v;
} en_gguf_kv;

struct en_gguf {
    char *name;
    en_mmap map; /* zeroed for en_gguf_open_memory */
    const uint8_t *base;
    size_t size;
    uint32_t version;
    size_t alignment, data_offset;
    int64_t n_kv, n_tensors;
    en_gguf_kv *kvs;
    en_gguf_tensor *tensors;
    int64_t *kv_sorted, *tensor_sorted; /* indices sorted by key / name */
    char *strs;                         /* NUL-terminated keys and names */
    uint64_t *offs;                     /* element offsets, see en_gguf_value */
};

/* ---- ggml type table ---------------------------------------------------- */

static const struct {
    uint32_t id;
    const char *name;
    uint32_t block, size;
} k_ggml_types[] = {
    {0, "F32", 1, 4},         {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},      {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 36},      {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},
    {17, "IQ2_XS", 256, 74},  {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},        {27, "I64", 1, 8},        {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 56},   {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},
};
#define N_GGML_TYPES (sizeof k_ggml_types / sizeof k_ggml_types[0])

const char *en_ggml_type_name(uint32_t t) {
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (k_ggml_types[i].id == t) return k_ggml_types[i].name;
    return NULL;
}

size_t en_ggml_type_block(uint32_t t) {
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (k_ggml_types[i].id == t) return k_ggml_types[i].block;
    return 0;
}

size_t en_ggml_type_size(uint32_t t) {
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (k_ggml_types[i].id == t) return k_ggml_types[i].size;
    return 0;
}

static const char *const k_value_names[] = {"uint8",  "int8",   "uint16", "int16", "uint32",
                                            "int32",  "float32", "bool",  "string", "array",
                                            "uint64", "int64",  "float64"};

const char *en_gguf_type_name(en_gguf_type t) {
    return (unsigned)t <= EN_GGUF_TYPE_FLOAT64 ? k_value_names[t] : "?";
}

/* Bytes of a fixed-size value type; 0 for string, array and unknown. */
static size_t value_size(uint32_t t) {
    static const uint8_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t <= EN_GGUF_TYPE_FLOAT64 ? sz[t] : 0;
}

/* The least number of bytes one element of type t can take in the file. */
static size_t value_min_size(uint32_t t) {
    if (t == EN_GGUF_TYPE_STRING) return 8;
    if (t == EN_GGUF_TYPE_ARRAY) return 12;
    return value_size(t);
}

/* Little-endian loads, independent of host byte order and alignment. */
static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32; }

/* ---- the cursor and the two passes -------------------------------------- */

typedef struct parser {
    const char *name;
    const uint8_t *b;
    size_t size, pos;
    en_err *err;
    en_gguf *g;      /* NULL in the counting pass */
    size_t n_strs;   /* bytes of keys + names (with NULs) */
    size_t n_offs;   /* element offsets of top-level string/array arrays */
    const char *ctx; /* "metadata key 'x'" or "tensor 'x'" for messages */
} parser;

static size_t left(const parser *p) { return p->size - p->pos; }

/* Need n more bytes for `what`, else EN_ERR_FORMAT naming it. */
static en_status need(parser *p, size_t n, const char *what) {
    if (n <= left(p)) return EN_OK;
    return EN_ERR(p->err, EN_ERR_FORMAT,
                  "%s: %s%s%s at offset %zu needs %zu bytes, only %zu left (file size %zu)",
                  p->name, p->ctx ? p->ctx : "", p->ctx ? ": " : "", what, p->pos, n, left(p),
                  p->size);
}

static en_status rd32(parser *p, uint32_t *v, const char *what) {
    EN_TRY(need(p, 4, what));
    *v = ld32(p->b + p->pos);
    p->pos += 4;
    return EN_OK;
}

static en_status rd64(parser *p, uint64_t *v, const char *what) {
    EN_TRY(need(p, 8, what));
    *v = ld64(p->b + p->pos);
    p->pos += 8;
    return EN_OK;
}

/* A length-prefixed string: its length must fit in the bytes left and
 * under `max` (0: no bound besides the file). */
static en_status rd_str(parser *p, const uint8_t **s, uint64_t *len, uint64_t max,
                        const char *what) {
    EN_TRY(rd64(p, len, what));
    if (*len > left(p))
        return EN_ERR(p->err, EN_ERR_FORMAT,
                      "%s: %s%s%s length %llu at offset %zu runs past the end of the file "
                      "(size %zu)",
                      p->name, p->ctx ? p->ctx : "", p->ctx ? ": " : "", what,
                      (unsigned long long)*len, p->pos - 8, p->size);
    if (max && *len > max)
        return EN_ERR(p->err, EN_ERR_FORMAT, "%s: %s%s%s length %llu exceeds the limit %llu",
                      p->name, p->ctx ? p->ctx : "", p->ctx ? ": " : "", what,
                      (unsigned long long)*len, (unsigned long long)max);
    *s = p->b + p->pos;
    p->pos += (size_t)*len;
    return EN_OK;
}

/* Walk one value of type t. For a top-level array of strings or arrays,
 * `offs` (second pass) receives each element's offset from the first. */
static en_status walk_value(parser *p, uint32_t t, int depth, en_gguf_value *out,
                            uint64_t *offs) {
    if (t > EN_GGUF_TYPE_FLOAT64)
        return EN_ERR(p->err, EN_ERR_FORMAT, "%s: %s: unknown value type %u", p->name, p->ctx, t);
    if (out) {
        out->type = (en_gguf_type)t;
        out->data = p->b + p->pos;
    }
    if (t == EN_GGUF_TYPE_STRING) {
        const uint8_t *s;
        uint64_t len;
        EN_TRY(rd_str(p, &s, &len, 0, "string"));
        if (out) out->data = s, out->n = len;
        return EN_OK;
    }
    if (t != EN_GGUF_TYPE_ARRAY) {
        EN_TRY(need(p, value_size(t), en_gguf_type_name(t)));
        p->pos += value_size(t);
        return EN_OK;
    }
    if (depth >= EN_GGUF_MAX_NEST)
        return EN_ERR(p->err, EN_ERR_FORMAT, "%s: %s: arrays nested deeper than %d", p->name,
                      p->ctx, EN_GGUF_MAX_NEST);
    uint32_t et;
    uint64_t n;
    EN_TRY(rd32(p, &et, "array element type"));
    EN_TRY(rd64(p, &n, "array count"));
    if (et > EN_GGUF_TYPE_FLOAT64)
        return EN_ERR(p->err, EN_ERR_FORMAT, "%s: %s: unknown array element type %u", p->name,
                      p->ctx, et);
    size_t min = value_min_size(et);
    if (n > left(p) / min)
        return EN_ERR(p->err, EN_ERR_FORMAT,
                      "%s: %s: array of %llu %s needs at least %llu bytes, only %zu left "
                      "(file size %zu)",
                      p->name, p->ctx, (unsigned long long)n, en_gguf_type_name(et),
                      n > UINT64_MAX / min ? UINT64_MAX : (unsigned long long)(n * min), left(p),
                      p->size);
    if (out) out->elem_type = (en_gguf_type)et, out->n = n, out->data = p->b + p->pos;
    if (value_size(et)) {
        p->pos += (size_t)n * value_size(et);
        return EN_OK;
    }
    size_t start = p->pos;
    if (depth == 0) p->n_offs += (size_t)n;
    for (uint64_t i = 0; i < n; i++) {
        if (offs) offs[i] = p->pos - start;
        EN_TRY(walk_value(p, et, depth + 1, NULL, NULL));
    }
    if (out) out->offsets = offs;
    return EN_OK;
}

/* The metadata section: n_kv key/value pairs. */
static en_status walk_kvs(parser *p, uint64_t n_kv) {
    char ctx[160];
    for (uint64_t i = 0; i < n_kv; i++) {
        const uint8_t *key;
        uint64_t klen;
        uint32_t t;
        snprintf(ctx, sizeof ctx, "metadata entry %llu", (unsigned long long)i);
        p->ctx = ctx;
        EN_TRY(rd_str(p, &key, &klen, EN_GGUF_MAX_KEY, "key"));
        snprintf(ctx, sizeof ctx, "metadata key '%.*s'", (int)(klen > 100 ? 100 : klen),
                 (const char *)key);
        EN_TRY(rd32(p, &t, "value type"));
        en_gguf_kv *kv = p->g ? &p->g->kvs[i] : NULL;
        uint64_t *offs = NULL;
        if (kv) {
            char *k = p->g->strs + p->n_strs;
            memcpy(k, key, (size_t)klen);
            k[klen] = '\0';
            kv->key = k;
            if (p->g->offs) offs = p->g->offs + p->n_offs;
        }
        p->n_strs += (size_t)klen + 1;
        EN_TRY(walk_value(p, t, 0, kv ? &kv->v : NULL, offs));
    }
    p->ctx = NULL;
    return EN_OK;
}

/* The tensor info table: names, dims, types, offsets (checked later,
 * once the alignment and the data section are known). */
static en_status walk_tensor_infos(parser *p, uint64_t n_tensors) {
    char ctx[160];
    for (uint64_t i = 0; i < n_tensors; i++) {
        const uint8_t *name;
        uint64_t nlen;
        uint32_t n_dims, type;
        uint64_t dims[EN_GGUF_MAX_DIMS], off;
        snprintf(ctx, sizeof ctx, "tensor %llu", (unsigned long long)i);
        p->ctx = ctx;
        EN_TRY(rd_str(p, &name, &nlen, EN_GGUF_MAX_NAME, "name"));
        snprintf(ctx, sizeof ctx, "tensor '%.*s'", (int)(nlen > 100 ? 100 : nlen),
                 (const char *)name);
        EN_TRY(rd32(p, &n_dims, "n_dims"));
        if (n_dims > EN_GGUF_MAX_DIMS)
            return EN_ERR(p->err, EN_ERR_FORMAT, "%s: %s: %u dims, at most %d are supported",
                          p->name, ctx, n_dims, EN_GGUF_MAX_DIMS);
        for (uint32_t d = 0; d < n_dims; d++) EN_TRY(rd64(p, &dims[d], "dim"));
        EN_TRY(rd32(p, &type, "type"));
        EN_TRY(rd64(p, &off, "offset"));
        if (!en_ggml_type_name(type))
            return EN_ERR(p->err, EN_ERR_FORMAT, "%s: %s: unknown ggml type %u", p->name, ctx,
                          type);
        for (uint32_t d = 0; d < n_dims; d++)
            if (dims[d] > INT64_MAX)
                return EN_ERR(p->err, EN_ERR_FORMAT, "%s: %s: dim %u is %llu (negative as int64)",
                              p->name, ctx, d, (unsigned long long)dims[d]);
        if (p->g) {
            en_gguf_tensor *t = &p->g->tensors[i];
            char *s = p->g->strs + p->n_strs;
            memcpy(s, name, (size_t)nlen);
            s[nlen] = '\0';
            t->name = s;
            t->type = type;
            t->n_dims = (int)n_dims;
            for (int d = 0; d < EN_GGUF_MAX_DIMS; d++)
                t->dims[d] = d < (int)n_dims ? (int64_t)dims[d] : 1;
            t->offset = off;
        }
        p->n_strs += (size_t)nlen + 1;
    }
    p->ctx = NULL;
    return EN_OK;
}

/* ---- open --------------------------------------------------------------- */

/* `general.alignment`: a uint32 power of two when present. */
static en_status find_alignment(en_gguf *g, en_err *err) {
    g->alignment = EN_GGUF_DEFAULT_ALIGN;
    int64_t i = en_gguf_find_kv(g, "general.alignment");
    if (i < 0) return EN_OK;
    const en_gguf_value *v = &g->kvs[i].v;
    if (v->type != EN_GGUF_TYPE_UINT32)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: metadata key 'general.alignment' is a %s, not a uint32",
                      g->name, en_gguf_type_name(v->type));
    uint32_t a = ld32(v->data);
    if (a == 0 || (a & (a - 1)) != 0)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: metadata key 'general.alignment' is %u, not a power of two", g->name, a);
    g->alignment = a;
    return EN_OK;
}

/* Element count and byte size of each tensor, with overflow checks; then
 * alignment and bounds of its data inside the data section. */
static en_status check_tensor(en_gguf *g, en_gguf_tensor *t, en_err *err) {
    uint64_t n = 1;
    for (int d = 0; d < t->n_dims; d++) {
        uint64_t v = (uint64_t)t->dims[d];
        if (v != 0 && n > (uint64_t)INT64_MAX / v)
            return EN_ERR(err, EN_ERR_FORMAT,
                          "%s: tensor '%s': dims [%lld, %lld, %lld, %lld] overflow the element count",
                          g->name, t->name, (long long)t->dims[0], (long long)t->dims[1],
                          (long long)t->dims[2], (long long)t->dims[3]);
        n *= v;
    }
    size_t blk = en_ggml_type_block(t->type), bsz = en_ggml_type_size(t->type);
    if (t->dims[0] % (int64_t)blk != 0)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: tensor '%s': first dim %lld is not a multiple of the %s block size %zu",
                      g->name, t->name, (long long)t->dims[0], en_ggml_type_name(t->type), blk);
    uint64_t nblk = n / blk;
    if (nblk > SIZE_MAX / bsz || nblk * bsz > (uint64_t)INT64_MAX)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: tensor '%s': %llu elements of %s overflow the byte size",
                      g->name, t->name, (unsigned long long)n, en_ggml_type_name(t->type));
    t->n_elem = (int64_t)n;
    t->n_bytes = (size_t)(nblk * bsz);
    if (t->offset % g->alignment != 0)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: tensor '%s': offset %llu is not a multiple of the alignment %zu",
                      g->name, t->name, (unsigned long long)t->offset, g->alignment);
    size_t room = g->size - g->data_offset;
    if (t->offset > room || t->n_bytes > room - t->offset)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: tensor '%s': offset %llu + %zu bytes runs past the end of the file "
                      "(data section at %zu, file size %zu)",
                      g->name, t->name, (unsigned long long)t->offset, t->n_bytes, g->data_offset,
                      g->size);
    t->data = g->base + g->data_offset + t->offset;
    return EN_OK;
}

/* qsort/bsearch over index arrays need the strings; pass them by a small
 * struct array instead of a global: sort (name, index) pairs. */
typedef struct named {
    const char *s;
    int64_t i;
} named;

static int named_cmp(const void *a, const void *b) {
    return strcmp(((const named *)a)->s, ((const named *)b)->s);
}

/* Sort the indices of n strings; reject duplicates naming `what`. */
static en_status sort_names(en_gguf *g, int64_t n, const char *(*get)(const en_gguf *, int64_t),
                            int64_t *out, const char *what, en_err *err) {
    if (n == 0) return EN_OK;
    named *tmp = en_malloc((size_t)n * sizeof *tmp);
    if (!tmp) return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory sorting %s", g->name, what);
    for (int64_t i = 0; i < n; i++) tmp[i] = (named){get(g, i), i};
    qsort(tmp, (size_t)n, sizeof *tmp, named_cmp);
    en_status s = EN_OK;
    for (int64_t i = 0; i < n; i++) {
        out[i] = tmp[i].i;
        if (i > 0 && strcmp(tmp[i].s, tmp[i - 1].s) == 0 && s == EN_OK)
            s = EN_ERR(err, EN_ERR_FORMAT, "%s: duplicate %s '%s'", g->name, what, tmp[i].s);
    }
    en_free(tmp);
    return s;
}

static const char *tensor_name_at(const en_gguf *g, int64_t i) { return g->tensors[i].name; }

/* Header: magic, version, counts; counts bounded by the bytes left. */
static en_status parse_header(parser *p, uint32_t *version, uint64_t *n_t, uint64_t *n_kv) {
    if (p->size < 4 || memcmp(p->b, EN_GGUF_MAGIC, 4) != 0) {
        if (p->size < 4)
            return EN_ERR(p->err, EN_ERR_FORMAT, "%s: truncated header (%zu bytes, not a GGUF file)",
                          p->name, p->size);
        return EN_ERR(p->err, EN_ERR_FORMAT,
                      "%s: bad magic %02x %02x %02x %02x (expected \"GGUF\")", p->name, p->b[0],
                      p->b[1], p->b[2], p->b[3]);
    }
    p->pos = 4;
    EN_TRY(rd32(p, version, "header version"));
    if (*version != 2 && *version != 3)
        return EN_ERR(p->err, EN_ERR_FORMAT,
                      "%s: unsupported GGUF version %u (supported: 2, 3%s)", p->name, *version,
                      *version > 0xffff ? "; a big-endian file?" : "");
    EN_TRY(rd64(p, n_t, "header tensor count"));
    EN_TRY(rd64(p, n_kv, "header metadata count"));
    /* each entry takes at least 12 bytes (key length + type), each tensor
     * info at least 24 (name length + n_dims + type + offset) */
    if (*n_kv > left(p) / 12)
        return EN_ERR(p->err, EN_ERR_FORMAT,
                      "%s: header metadata count %llu cannot fit in the %zu bytes left", p->name,
                      (unsigned long long)*n_kv, left(p));
    if (*n_t > left(p) / 24)
        return EN_ERR(p->err, EN_ERR_FORMAT,
                      "%s: header tensor count %llu cannot fit in the %zu bytes left", p->name,
                      (unsigned long long)*n_t, left(p));
    return EN_OK;
}

/* Both passes over metadata and tensor infos; p->g NULL counts only. */
static en_status walk_all(parser *p, uint64_t n_kv, uint64_t n_t) {
    p->pos = 24;
    p->n_strs = p->n_offs = 0;
    EN_TRY(walk_kvs(p, n_kv));
    return walk_tensor_infos(p, n_t);
}

static en_status build(en_gguf *g, parser *p, uint64_t n_kv, uint64_t n_t, en_err *err) {
    g->n_kv = (int64_t)n_kv;
    g->n_tensors = (int64_t)n_t;
    /* sizes below are bounded by the file size (validated in pass one) */
    g->kvs = en_calloc(n_kv ? n_kv : 1, sizeof *g->kvs);
    g->kv_sorted = en_calloc(n_kv ? n_kv : 1, sizeof *g->kv_sorted);
    g->tensors = en_calloc(n_t ? n_t : 1, sizeof *g->tensors);
    g->tensor_sorted = en_calloc(n_t ? n_t : 1, sizeof *g->tensor_sorted);
    g->strs = en_malloc(p->n_strs ? p->n_strs : 1);
    g->offs = p->n_offs ? en_calloc(p->n_offs, sizeof *g->offs) : NULL;
    if (!g->kvs || !g->kv_sorted || !g->tensors || !g->tensor_sorted || !g->strs ||
        (p->n_offs && !g->offs))
        return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory for the GGUF tables", g->name);
    p->g = g;
    EN_TRY(walk_all(p, n_kv, n_t));
    EN_TRY(sort_names(g, g->n_kv, en_gguf_kv_key, g->kv_sorted, "metadata key", err));
    EN_TRY(sort_names(g, g->n_tensors, tensor_name_at, g->tensor_sorted, "tensor", err));
    EN_TRY(find_alignment(g, err));
    size_t a = g->alignment;
    g->data_offset = p->pos + (a - p->pos % a) % a;
    if (g->n_tensors > 0 && g->data_offset > g->size)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: data section at %zu (after alignment %zu) is past the end of the file "
                      "(size %zu)",
                      g->name, g->data_offset, a, g->size);
    for (int64_t i = 0; i < g->n_tensors; i++) EN_TRY(check_tensor(g, &g->tensors[i], err));
    return EN_OK;
}

en_status en_gguf_open_memory(const void *data, size_t len, const char *name, en_gguf **out,
                              en_err *err) {
    *out = NULL;
    if (!name) name = "(memory)";
    parser p = {.name = name, .b = data, .size = data ? len : 0, .err = err};
    uint32_t version;
    uint64_t n_t, n_kv;
    EN_TRY(parse_header(&p, &version, &n_t, &n_kv));
    EN_TRY(walk_all(&p, n_kv, n_t)); /* pass one: validate and count */
    en_gguf *g = en_calloc(1, sizeof *g);
    if (!g || !(g->name = en_strdup(name))) {
        en_free(g);
        return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", name);
    }
    g->base = p.b;
    g->size = p.size;
    g->version = version;
    en_status s = build(g, &p, n_kv, n_t, err); /* pass two: fill in */
    if (s != EN_OK) {
        en_gguf_close(g);
        return s;
    }
    *out = g;
    return EN_OK;
}

en_status en_gguf_open(const char *path, en_gguf **out, en_err *err) {
    en_mmap m = {0};
    *out = NULL;
    EN_TRY(en_mmap_open(path, &m, err));
    en_status s = en_gguf_open_memory(m.data, m.size, path, out, err);
    if (s != EN_OK) {
        en_mmap_close(&m);
        return s;
    }
    (*out)->map = m;
    return EN_OK;
}

void en_gguf_close(en_gguf *g) {
    if (!g) return;
    en_mmap_close(&g->map);
    en_free(g->name);
    en_free(g->kvs);
    en_free(g->kv_sorted);
    en_free(g->tensors);
    en_free(g->tensor_sorted);
    en_free(g->strs);
    en_free(g->offs);
    en_free(g);
}

/* ---- accessors ---------------------------------------------------------- */

uint32_t en_gguf_version(const en_gguf *g) { return g->version; }
size_t en_gguf_alignment(const en_gguf *g) { return g->alignment; }
size_t en_gguf_data_offset(const en_gguf *g) { return g->data_offset; }
int en_gguf_is_gguf_path(const char *path) {
    if (!path || en_path_is_dir(path)) return 0;
    size_t n = strlen(path);
    if (n > 5 && strcmp(path + n - 5, ".gguf") == 0) return 1;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char magic[4];
    int yes = fread(magic, 1, 4, f) == 4 && memcmp(magic, EN_GGUF_MAGIC, 4) == 0;
    fclose(f);
    return yes;
}

const char *en_gguf_name(const en_gguf *g) { return g->name; }
int64_t en_gguf_n_kv(const en_gguf *g) { return g->n_kv; }
int64_t en_gguf_n_tensors(const en_gguf *g) { return g->n_tensors; }

const char *en_gguf_kv_key(const en_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv ? g->kvs[i].key : NULL;
}

const en_gguf_value *en_gguf_kv_value(const en_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv ? &g->kvs[i].v : NULL;
}

const en_gguf_tensor *en_gguf_tensor_at(const en_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

/* Binary search over sorted indices; -1 when absent. */
static int64_t find_sorted(const en_gguf *g, const int64_t *idx, int64_t n,
                           const char *(*get)(const en_gguf *, int64_t), const char *s) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(get(g, idx[mid]), s);
        if (c == 0) return idx[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

int64_t en_gguf_find_kv(const en_gguf *g, const char *key) {
    return key ? find_sorted(g, g->kv_sorted, g->n_kv, en_gguf_kv_key, key) : -1;
}

const en_gguf_tensor *en_gguf_find_tensor(const en_gguf *g, const char *name) {
    int64_t i = name ? find_sorted(g, g->tensor_sorted, g->n_tensors, tensor_name_at, name) : -1;
    return i < 0 ? NULL : &g->tensors[i];
}

/* ---- values -------------------------------------------------------------- */

int en_gguf_value_i64(const en_gguf_value *v, int64_t *out) {
    const uint8_t *d = v->data;
    switch (v->type) {
    case EN_GGUF_TYPE_UINT8: *out = d[0]; return 1;
    case EN_GGUF_TYPE_INT8: *out = (int8_t)d[0]; return 1;
    case EN_GGUF_TYPE_UINT16: *out = ld16(d); return 1;
    case EN_GGUF_TYPE_INT16: *out = (int16_t)ld16(d); return 1;
    case EN_GGUF_TYPE_UINT32: *out = ld32(d); return 1;
    case EN_GGUF_TYPE_INT32: *out = (int32_t)ld32(d); return 1;
    case EN_GGUF_TYPE_INT64: *out = (int64_t)ld64(d); return 1;
    case EN_GGUF_TYPE_UINT64:
        if (ld64(d) > INT64_MAX) return 0;
        *out = (int64_t)ld64(d);
        return 1;
    default: return 0;
    }
}

int en_gguf_value_u64(const en_gguf_value *v, uint64_t *out) {
    if (v->type == EN_GGUF_TYPE_UINT64) {
        *out = ld64(v->data);
        return 1;
    }
    int64_t i;
    if (!en_gguf_value_i64(v, &i) || i < 0) return 0;
    *out = (uint64_t)i;
    return 1;
}

int en_gguf_value_f64(const en_gguf_value *v, double *out) {
    int64_t i;
    if (v->type == EN_GGUF_TYPE_FLOAT32) {
        uint32_t b = ld32(v->data);
        float f;
        memcpy(&f, &b, 4);
        *out = f;
    } else if (v->type == EN_GGUF_TYPE_FLOAT64) {
        uint64_t b = ld64(v->data);
        memcpy(out, &b, 8);
    } else if (v->type == EN_GGUF_TYPE_UINT64) {
        *out = (double)ld64(v->data);
    } else if (en_gguf_value_i64(v, &i)) {
        *out = (double)i;
    } else {
        return 0;
    }
    return 1;
}

int en_gguf_value_bool(const en_gguf_value *v, int *out) {
    if (v->type != EN_GGUF_TYPE_BOOL) return 0;
    *out = v->data[0] != 0;
    return 1;
}

int en_gguf_value_str(const en_gguf_value *v, const char **s, size_t *len) {
    if (v->type != EN_GGUF_TYPE_STRING) return 0;
    *s = (const char *)v->data;
    *len = (size_t)v->n;
    return 1;
}

/* Bytes of an already validated value of type t at p (no bounds needed). */
static size_t span(uint32_t t, const uint8_t *p) {
    if (t == EN_GGUF_TYPE_STRING) return 8 + (size_t)ld64(p);
    if (t != EN_GGUF_TYPE_ARRAY) return value_size(t);
    uint32_t et = ld32(p);
    uint64_t n = ld64(p + 4);
    if (value_size(et)) return 12 + (size_t)n * value_size(et);
    size_t off = 12;
    for (uint64_t i = 0; i < n; i++) off += span(et, p + off);
    return off;
}

int en_gguf_arr_get(const en_gguf_value *arr, uint64_t i, en_gguf_value *e) {
    if (arr->type != EN_GGUF_TYPE_ARRAY || i >= arr->n) return 0;
    const en_gguf_value a = *arr, *v = &a; /* e may alias arr */
    memset(e, 0, sizeof *e);
    uint32_t et = v->elem_type;
    const uint8_t *p;
    if (value_size(et)) {
        p = v->data + i * value_size(et);
    } else if (v->offsets) {
        p = v->data + v->offsets[i];
    } else {
        p = v->data;
        for (uint64_t k = 0; k < i; k++) p += span(et, p);
    }
    e->type = (en_gguf_type)et;
    e->data = p;
    if (et == EN_GGUF_TYPE_STRING) {
        e->n = ld64(p);
        e->data = p + 8;
    } else if (et == EN_GGUF_TYPE_ARRAY) {
        e->elem_type = (en_gguf_type)ld32(p);
        e->n = ld64(p + 4);
        e->data = p + 12;
    }
    return 1;
}

/* The value of `key`, or EN_ERR_ARG naming the file and key. */
static en_status lookup(const en_gguf *g, const char *key, const en_gguf_value **v, en_err *err) {
    int64_t i = en_gguf_find_kv(g, key);
    if (i < 0)
        return EN_ERR(err, EN_ERR_ARG, "%s: no metadata key '%s'", g->name, key ? key : "(null)");
    *v = &g->kvs[i].v;
    return EN_OK;
}

static en_status wrong(const en_gguf *g, const char *key, const en_gguf_value *v,
                       const char *want, en_err *err) {
    return EN_ERR(err, EN_ERR_FORMAT, "%s: metadata key '%s' is a %s, expected %s", g->name, key,
                  en_gguf_type_name(v->type), want);
}

en_status en_gguf_get_i64(const en_gguf *g, const char *key, int64_t *out, en_err *err) {
    const en_gguf_value *v = NULL;
    EN_TRY(lookup(g, key, &v, err));
    return en_gguf_value_i64(v, out) ? EN_OK : wrong(g, key, v, "an integer within int64", err);
}

en_status en_gguf_get_u64(const en_gguf *g, const char *key, uint64_t *out, en_err *err) {
    const en_gguf_value *v = NULL;
    EN_TRY(lookup(g, key, &v, err));
    return en_gguf_value_u64(v, out) ? EN_OK : wrong(g, key, v, "a non-negative integer", err);
}

en_status en_gguf_get_f64(const en_gguf *g, const char *key, double *out, en_err *err) {
    const en_gguf_value *v = NULL;
    EN_TRY(lookup(g, key, &v, err));
    return en_gguf_value_f64(v, out) ? EN_OK : wrong(g, key, v, "a number", err);
}

en_status en_gguf_get_bool(const en_gguf *g, const char *key, int *out, en_err *err) {
    const en_gguf_value *v = NULL;
    EN_TRY(lookup(g, key, &v, err));
    return en_gguf_value_bool(v, out) ? EN_OK : wrong(g, key, v, "a bool", err);
}

en_status en_gguf_get_str(const en_gguf *g, const char *key, const char **s, size_t *len,
                          en_err *err) {
    const en_gguf_value *v = NULL;
    EN_TRY(lookup(g, key, &v, err));
    return en_gguf_value_str(v, s, len) ? EN_OK : wrong(g, key, v, "a string", err);
}

en_status en_gguf_get_arr(const en_gguf *g, const char *key, en_gguf_value *arr, en_err *err) {
    const en_gguf_value *v = NULL;
    EN_TRY(lookup(g, key, &v, err));
    if (v->type != EN_GGUF_TYPE_ARRAY) return wrong(g, key, v, "an array", err);
    *arr = *v;
    return EN_OK;
}

/* ---- dequantisation ------------------------------------------------------ */
/* Block layouts as in ggml-common.h (fp16 scales little-endian). Each
 * formula keeps ggml's float32 operation order, e.g. (d * sc) * q - dmin * m
 * for the K-quants, so that results are bit-identical to ggml and to the
 * gguf Python package; no FMA contraction happens under -std=c11. */

static float h2f(const uint8_t *p) { return en_f16_to_f32(ld16(p)); }

/* Q4_0: d, 16 bytes of nibbles; low nibbles are elements 0..15. */
static void deq_q4_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 18, y += 32) {
        float d = h2f(b);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((b[2 + j] & 0xF) - 8) * d;
            y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
        }
    }
}

/* Q4_1: d, m, 16 bytes of nibbles: y = q * d + m. */
static void deq_q4_1(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 20, y += 32) {
        float d = h2f(b), m = h2f(b + 2);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b[4 + j] & 0xF) * d + m;
            y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
        }
    }
}

/* Q8_0: d, 32 int8. */
static void deq_q8_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 34, y += 32) {
        float d = h2f(b);
        for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
    }
}

/* The 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes
 * of Q4_K/Q5_K: j < 4 in the low 6 bits of bytes j and j+4; j >= 4 split
 * between the nibbles of bytes j+4 and the top 2 bits of bytes j-4 / j. */
static void k_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q4_K: d, dmin, 12 scale bytes, 128 bytes of nibbles; 8 sub-blocks of 32:
 * per 32 bytes, low nibbles then high nibbles. */
static void deq_q4_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 144) {
        float d = h2f(b), dmin = h2f(b + 2);
        const uint8_t *sc = b + 4, *q = b + 16;
        for (int j = 0; j < 8; j += 2, q += 32) {
            int s1, m1, s2, m2;
            k_scale_min(j, sc, &s1, &m1);
            k_scale_min(j + 1, sc, &s2, &m2);
            float d1 = d * (float)s1, dm1 = dmin * (float)m1;
            float d2 = d * (float)s2, dm2 = dmin * (float)m2;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - dm1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - dm2;
        }
    }
}

/* Q5_K: as Q4_K plus 32 bytes qh whose bit k of byte l is the fifth bit of
 * element l of sub-block k. */
static void deq_q5_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 176) {
        float d = h2f(b), dmin = h2f(b + 2);
        const uint8_t *sc = b + 4, *qh = b + 16, *q = b + 48;
        for (int j = 0; j < 8; j += 2, q += 32) {
            int s1, m1, s2, m2;
            k_scale_min(j, sc, &s1, &m1);
            k_scale_min(j + 1, sc, &s2, &m2);
            float d1 = d * (float)s1, dm1 = dmin * (float)m1;
            float d2 = d * (float)s2, dm2 = dmin * (float)m2;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)((q[l] & 0xF) | (((qh[l] >> j) & 1) << 4)) - dm1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)((q[l] >> 4) | (((qh[l] >> (j + 1)) & 1) << 4)) - dm2;
        }
    }
}

/* Q6_K: 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 int8 scales
 * (one per 16 elements), d last. Two halves of 128 elements, each four
 * runs of 32: (ql[l] low, qh bits 0-1), (ql[l+32] low, bits 2-3),
 * (ql[l] high, bits 4-5), (ql[l+32] high, bits 6-7); q is 6 bits - 32. */
static void deq_q6_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 210) {
        float d = h2f(b + 208);
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, y += 128) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

en_status en_ggml_to_f32(uint32_t type, const void *src, float *out, int64_t n) {
    const uint8_t *b = src;
    size_t blk = en_ggml_type_block(type);
    if (blk == 0) return EN_ERR_UNSUPPORTED;
    if (n < 0 || n % (int64_t)blk != 0) return EN_ERR_ARG;
    int64_t nb = n / (int64_t)blk;
    switch (type) {
    case EN_GGML_TYPE_F32:
        if (n) memcpy(out, b, (size_t)n * 4); /* little-endian host */
        break;
    case EN_GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) out[i] = h2f(b + 2 * i);
        break;
    case EN_GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = en_bf16_to_f32(ld16(b + 2 * i));
        break;
    case EN_GGML_TYPE_Q4_0: deq_q4_0(b, out, nb); break;
    case EN_GGML_TYPE_Q4_1: deq_q4_1(b, out, nb); break;
    case EN_GGML_TYPE_Q8_0: deq_q8_0(b, out, nb); break;
    case EN_GGML_TYPE_Q4_K: deq_q4_k(b, out, nb); break;
    case EN_GGML_TYPE_Q5_K: deq_q5_k(b, out, nb); break;
    case EN_GGML_TYPE_Q6_K: deq_q6_k(b, out, nb); break;
    default: return EN_ERR_UNSUPPORTED;
    }
    return EN_OK;
}

en_status en_gguf_tensor_to_f32(const en_gguf *g, const en_gguf_tensor *t, float *out,
                                en_err *err) {
    en_status s = en_ggml_to_f32(t->type, t->data, out, t->n_elem);
    if (s == EN_ERR_UNSUPPORTED)
        return EN_ERR(err, s, "%s: tensor '%s': conversion of ggml type %s to float32 is not "
                      "supported", g->name, t->name, en_ggml_type_name(t->type));
    if (s != EN_OK)
        return EN_ERR(err, s, "%s: tensor '%s': %lld elements do not fill whole %s blocks",
                      g->name, t->name, (long long)t->n_elem, en_ggml_type_name(t->type));
    return EN_OK;
}
