/*
 * safetensors.c - see safetensors.h. The header is parsed with jansson; all
 * arithmetic on sizes from the file is checked for overflow before use.
 */
#include "safetensors.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A header larger than this is not a model file (the format's own readers
 * cap it at 100 MB). */
#define EN_ST_MAX_HEADER (100u * 1024u * 1024u)

static const struct {
    const char *name;
    en_dtype t;
    size_t size;
} k_dtypes[] = {
    {"F32", EN_DTYPE_F32, 4}, {"F16", EN_DTYPE_F16, 2}, {"BF16", EN_DTYPE_BF16, 2},
    {"I32", EN_DTYPE_I32, 4}, {"I64", EN_DTYPE_I64, 8}, {"U8", EN_DTYPE_U8, 1},
    {"F64", EN_DTYPE_F64, 8},
};

const char *en_dtype_name(en_dtype t) {
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (k_dtypes[i].t == t) return k_dtypes[i].name;
    return "?";
}

size_t en_dtype_size(en_dtype t) {
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (k_dtypes[i].t == t) return k_dtypes[i].size;
    return 0;
}

static int dtype_parse(const char *s, en_dtype *t) {
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (strcmp(k_dtypes[i].name, s) == 0) {
            *t = k_dtypes[i].t;
            return 1;
        }
    return 0;
}

float en_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: value = man * 2^-24 */
            float v = (float)man * 5.9604644775390625e-8f;
            memcpy(&bits, &v, 4);
            bits |= sign;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float en_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t en_f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40); /* NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

uint16_t en_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);   /* NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  /* overflow -> inf */
    if (ax < 0x38800000u) {                                    /* subnormal or zero */
        float a;
        memcpy(&a, &ax, 4);
        /* a * 2^24 rounded to nearest even gives the subnormal mantissa */
        return (uint16_t)(sign | (uint32_t)nearbyintf(a * 16777216.0f));
    }
    uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u) - (112u << 23);
    return (uint16_t)(sign | (r >> 13));
}

static void st_free(en_st_file *f) {
    if (f->tensors)
        for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    en_free(f->tensors);
    en_mmap_close(&f->map);
    en_free(f->path);
    f->n_tensors = 0;
}

static int cmp_by_offset(const void *a, const void *b) {
    const en_st_tensor *x = *(const en_st_tensor *const *)a, *y = *(const en_st_tensor *const *)b;
    return x->data < y->data ? -1 : x->data > y->data;
}

static en_status st_parse(const char *path, en_st_file *f, en_err *err);

en_status en_st_open(const char *path, en_st_file *f, en_err *err) {
    memset(f, 0, sizeof *f);
    en_status s = en_mmap_open(path, &f->map, err);
    if (s != EN_OK) return s;
    return st_parse(path, f, err);
}

en_status en_st_open_fd(int fd, const char *path, en_st_file *f, en_err *err) {
    memset(f, 0, sizeof *f);
    en_status s = en_mmap_fd(fd, path, &f->map, err);
    if (s != EN_OK) return s;
    return st_parse(path, f, err);
}

/* f->map holds the file: the header checked and indexed into f. On failure
 * f is freed (its map closed). */
static en_status st_parse(const char *path, en_st_file *f, en_err *err) {
    en_status s;
    f->path = en_malloc(strlen(path) + 1);
    if (!f->path) {
        en_mmap_close(&f->map);
        return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", path);
    }
    strcpy(f->path, path);
    json_t *root = NULL;
    const en_st_tensor **order = NULL;

    if (f->map.size < 8) {
        s = EN_ERR(err, EN_ERR_FORMAT, "%s: truncated safetensors file (%zu bytes, no header)",
                   path, f->map.size);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->map.data[i];
    if (hlen > EN_ST_MAX_HEADER || hlen > f->map.size - 8) {
        s = EN_ERR(err, EN_ERR_FORMAT,
                   "%s: header length %llu exceeds the file size %zu (truncated or not a "
                   "safetensors file)",
                   path, (unsigned long long)hlen, f->map.size);
        goto fail;
    }
    const uint8_t *base = f->map.data + 8 + hlen;
    size_t data_size = f->map.size - 8 - (size_t)hlen;
    json_error_t jerr;
    root = json_loadb((const char *)f->map.data + 8, (size_t)hlen, 0, &jerr);
    if (!root || !json_is_object(root)) {
        s = EN_ERR(err, EN_ERR_FORMAT, "%s: header is not a JSON object (%s)", path,
                   root ? "not an object" : jerr.text);
        goto fail;
    }
    size_t cap = json_object_size(root);
    f->tensors = en_calloc(cap ? cap : 1, sizeof(en_st_tensor));
    order = en_calloc(cap ? cap : 1, sizeof(*order));
    if (!f->tensors || !order) {
        s = EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        en_st_tensor *t = &f->tensors[f->n_tensors];
        json_t *jd = json_object_get(val, "dtype");
        json_t *js = json_object_get(val, "shape");
        json_t *jo = json_object_get(val, "data_offsets");
        if (!json_is_object(val) || !json_is_string(jd) || !json_is_array(js) ||
            !json_is_array(jo) || json_array_size(jo) != 2) {
            s = EN_ERR(err, EN_ERR_FORMAT,
                       "%s: tensor '%s': header entry needs dtype, shape and data_offsets[2]",
                       path, key);
            goto fail;
        }
        if (!dtype_parse(json_string_value(jd), &t->dtype)) {
            s = EN_ERR(err, EN_ERR_FORMAT, "%s: tensor '%s': unsupported dtype '%s'", path, key,
                       json_string_value(jd));
            goto fail;
        }
        size_t nd = json_array_size(js);
        if (nd > EN_ST_MAX_DIMS) {
            s = EN_ERR(err, EN_ERR_FORMAT, "%s: tensor '%s': %zu dimensions (max %d)", path, key,
                       nd, EN_ST_MAX_DIMS);
            goto fail;
        }
        int64_t n_elem = 1;
        for (size_t d = 0; d < nd; d++) {
            json_t *x = json_array_get(js, d);
            if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                json_integer_value(x) > ((int64_t)1 << 40)) {
                s = EN_ERR(err, EN_ERR_FORMAT, "%s: tensor '%s': bad shape entry %zu", path, key,
                           d);
                goto fail;
            }
            t->shape[d] = json_integer_value(x);
            if (t->shape[d] && n_elem > ((int64_t)1 << 50) / t->shape[d]) {
                s = EN_ERR(err, EN_ERR_FORMAT, "%s: tensor '%s': shape too large", path, key);
                goto fail;
            }
            n_elem *= t->shape[d];
        }
        t->n_dims = (int)nd;
        t->n_elem = n_elem;
        json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
        if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 ||
            json_integer_value(je) < json_integer_value(jb)) {
            s = EN_ERR(err, EN_ERR_FORMAT, "%s: tensor '%s': bad data_offsets", path, key);
            goto fail;
        }
        uint64_t b = (uint64_t)json_integer_value(jb), e = (uint64_t)json_integer_value(je);
        if (e > data_size) {
            s = EN_ERR(err, EN_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the data "
                       "(%zu bytes; file truncated?)",
                       path, key, (unsigned long long)b, (unsigned long long)e, data_size);
            goto fail;
        }
        uint64_t want = (uint64_t)n_elem * en_dtype_size(t->dtype);
        if (e - b != want) {
            s = EN_ERR(err, EN_ERR_FORMAT,
                       "%s: tensor '%s': shape and dtype need %llu bytes but data_offsets span "
                       "%llu",
                       path, key, (unsigned long long)want, (unsigned long long)(e - b));
            goto fail;
        }
        t->data = base + b;
        t->n_bytes = (size_t)(e - b);
        t->name = strdup(key);
        if (!t->name) {
            s = EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
        order[f->n_tensors] = t;
        f->n_tensors++;
    }
    /* Overlapping tensors mean the header lies about its layout. */
    qsort(order, (size_t)f->n_tensors, sizeof *order, cmp_by_offset);
    for (int i = 1; i < f->n_tensors; i++) {
        if (order[i - 1]->data + order[i - 1]->n_bytes > order[i]->data) {
            s = EN_ERR(err, EN_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", path,
                       order[i - 1]->name, order[i]->name);
            goto fail;
        }
    }
    en_free(order);
    json_decref(root);
    return EN_OK;
fail:
    en_free(order);
    if (root) json_decref(root);
    st_free(f);
    return s;
}

void en_st_close(en_st_file *f) {
    if (f) st_free(f);
}

const en_st_tensor *en_st_find(const en_st_file *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

en_status en_st_to_f32(const en_st_tensor *t, float *dst, en_err *err) {
    size_t n = (size_t)t->n_elem;
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case EN_DTYPE_F32: memcpy(dst, p, n * 4); return EN_OK;
    case EN_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = en_f16_to_f32(h);
        }
        return EN_OK;
    case EN_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = en_bf16_to_f32(h);
        }
        return EN_OK;
    default:
        return EN_ERR(err, EN_ERR_FORMAT, "tensor '%s': dtype %s cannot be used as weights",
                      t->name, en_dtype_name(t->dtype));
    }
}

en_status en_st_write(const char *path, const en_st_writer_item *items, int n, en_dtype out_dtype,
                      en_err *err) {
    if (out_dtype != EN_DTYPE_F32 && out_dtype != EN_DTYPE_BF16 && out_dtype != EN_DTYPE_F16)
        return EN_ERR(err, EN_ERR_ARG, "%s: output dtype must be F32, F16 or BF16", path);
    json_t *root = json_object();
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", meta);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const en_st_writer_item *it = &items[i];
        en_dtype dt = it->dtype == EN_DTYPE_F32 ? out_dtype : it->dtype;
        int64_t ne = 1;
        json_t *shape = json_array();
        for (int d = 0; d < it->n_dims; d++) {
            ne *= it->shape[d];
            json_array_append_new(shape, json_integer(it->shape[d]));
        }
        uint64_t nb = (uint64_t)ne * en_dtype_size(dt);
        json_t *e = json_object();
        json_object_set_new(e, "dtype", json_string(en_dtype_name(dt)));
        json_object_set_new(e, "shape", shape);
        json_t *offs = json_array();
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + nb)));
        json_object_set_new(e, "data_offsets", offs);
        json_object_set_new(root, it->name, e);
        off += nb;
    }
    char *hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!hdr) return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", path);
    /* Pad the header with spaces to a multiple of 8 so data stays aligned. */
    size_t hl = strlen(hdr);
    size_t padded = (hl + 7) & ~(size_t)7;
    en_file_writer w;
    en_status s = en_file_writer_open(&w, path, err);
    if (s != EN_OK) {
        free(hdr);
        return s;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    s = en_file_writer_write(&w, len8, 8, err);
    if (s == EN_OK) s = en_file_writer_write(&w, hdr, hl, err);
    for (size_t i = hl; s == EN_OK && i < padded; i++) s = en_file_writer_write(&w, " ", 1, err);
    free(hdr);
    uint16_t buf[4096];
    for (int i = 0; s == EN_OK && i < n; i++) {
        const en_st_writer_item *it = &items[i];
        int64_t ne = 1;
        for (int d = 0; d < it->n_dims; d++) ne *= it->shape[d];
        if (it->dtype != EN_DTYPE_F32 || out_dtype == EN_DTYPE_F32) {
            s = en_file_writer_write(&w, it->data, (size_t)ne * en_dtype_size(it->dtype), err);
            continue;
        }
        const float *src = it->data;
        for (int64_t j = 0; s == EN_OK && j < ne; j += 4096) {
            int64_t m = ne - j < 4096 ? ne - j : 4096;
            for (int64_t k = 0; k < m; k++)
                buf[k] = out_dtype == EN_DTYPE_BF16 ? en_f32_to_bf16(src[j + k])
                                                    : en_f32_to_f16(src[j + k]);
            s = en_file_writer_write(&w, buf, (size_t)m * 2, err);
        }
    }
    if (s != EN_OK) {
        en_file_writer_abort(&w);
        return s;
    }
    return en_file_writer_commit(&w, err);
}

/* ---- model.safetensors.index.json ---- */

/* NULL when fn (len bytes) may name a shard beside the index, else what is
 * wrong with it. */
static const char *shard_name_problem(const char *fn, size_t len) {
    static const char ext[] = ".safetensors";
    const size_t n_ext = sizeof ext - 1;
    if (len == 0 || strchr(fn, '/') || strchr(fn, '\\') || strstr(fn, ".."))
        return "must be a plain file name (no '/', no backslash, no '..')";
    if (len > 255) return "is longer than 255 bytes";
    if (len <= n_ext || strcmp(fn + len - n_ext, ext) != 0) return "must end in .safetensors";
    return NULL;
}

void en_st_index_deinit(en_st_index *idx) {
    for (int i = 0; i < idx->n_files; i++) en_free(idx->files[i]);
    en_free(idx->files);
    idx->n_files = 0;
    idx->n_tensors = 0;
}

/* Add fn to the distinct files (a file named before counts once). */
static en_status index_add_file(en_st_index *idx, const char *fn, size_t len, const char *path,
                                const char *key, en_err *err) {
    for (int i = 0; i < idx->n_files; i++)
        if (strcmp(idx->files[i], fn) == 0) return EN_OK;
    if (idx->n_files == EN_ST_INDEX_MAX_FILES)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: weight_map['%s']: more than %d distinct shard "
                      "files", path, key, EN_ST_INDEX_MAX_FILES);
    /* bound: len = strlen(fn), + 1 for the NUL copied with it */
    char *copy = en_malloc(len + 1);
    if (!copy) return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", path);
    memcpy(copy, fn, len + 1);
    idx->files[idx->n_files++] = copy;
    return EN_OK;
}

en_status en_st_index_parse(const char *text, size_t len, const char *path, en_st_index *out,
                            en_err *err) {
    memset(out, 0, sizeof *out);
    if (len > EN_ST_INDEX_MAX_BYTES)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: %zu bytes; an index is at most %u", path, len,
                      EN_ST_INDEX_MAX_BYTES);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: invalid JSON at line %d, column %d: %s", path,
                      jerr.line, jerr.column, jerr.text);
    json_t *wm = json_object_get(root, "weight_map");
    en_status s = EN_OK;
    if (!json_is_object(root)) {
        s = EN_ERR(err, EN_ERR_FORMAT, "%s: not a JSON object", path);
        goto done;
    }
    if (!wm) {
        s = EN_ERR(err, EN_ERR_FORMAT, "%s: missing object 'weight_map'", path);
        goto done;
    }
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        s = EN_ERR(err, EN_ERR_FORMAT, "%s: 'weight_map' must be a non-empty object of tensor "
                   "name -> shard file", path);
        goto done;
    }
    size_t cap = json_object_size(wm);
    out->files = en_calloc(cap < EN_ST_INDEX_MAX_FILES ? cap : EN_ST_INDEX_MAX_FILES,
                           sizeof *out->files);
    if (!out->files) {
        s = EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        if (!json_is_string(val)) {
            s = EN_ERR(err, EN_ERR_FORMAT, "%s: weight_map['%s'] is not a file name", path, key);
            goto done;
        }
        const char *fn = json_string_value(val);
        const char *bad = shard_name_problem(fn, json_string_length(val));
        if (bad) {
            s = EN_ERR(err, EN_ERR_FORMAT, "%s: weight_map['%s']: shard name '%s' %s", path, key,
                       fn, bad);
            goto done;
        }
        s = index_add_file(out, fn, json_string_length(val), path, key, err);
        if (s != EN_OK) goto done;
        out->n_tensors++;
    }
done:
    json_decref(root);
    if (s != EN_OK) en_st_index_deinit(out);
    return s;
}
