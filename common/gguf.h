/*
 * gguf.h - read GGUF files (llama.cpp's model format, versions 2 and 3):
 * "GGUF", a u32 version, u64 tensor count, u64 metadata count, the typed
 * metadata (scalars, strings, arrays, arrays of arrays), a table of tensor
 * infos (name, dims fastest-varying first, ggml type, offset into the data
 * section) and the data section, aligned to `general.alignment` (default 32).
 *
 * The reader maps the file and validates all of it before it allocates
 * anything whose size comes from the file: every count, length and offset is
 * checked against the bytes actually present, element counts and byte sizes
 * for overflow, tensor offsets for alignment and for lying inside the data
 * section. Errors are EN_ERR_FORMAT and name the file and the key or tensor.
 * Nothing is copied: values and tensor data are views into the map.
 *
 * Also here: dequantisation to float32 of F32, F16, BF16, Q8_0, Q4_0, Q4_1,
 * Q4_K, Q5_K and Q6_K (ggml's block layouts). Other ggml types open fine and
 * report EN_ERR_UNSUPPORTED when converted. Writing GGUF is not supported.
 * Big-endian GGUF files are rejected (their version reads as a huge number).
 * For models/ (GGUF model loading, the next piece of that work); tested by
 * tests/test_gguf.c and tests/fuzz/fuzz_gguf.c.
 */
#ifndef EN_GGUF_H
#define EN_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Metadata value types, numbered as in the file. */
typedef enum en_gguf_type {
    EN_GGUF_TYPE_UINT8 = 0,
    EN_GGUF_TYPE_INT8 = 1,
    EN_GGUF_TYPE_UINT16 = 2,
    EN_GGUF_TYPE_INT16 = 3,
    EN_GGUF_TYPE_UINT32 = 4,
    EN_GGUF_TYPE_INT32 = 5,
    EN_GGUF_TYPE_FLOAT32 = 6,
    EN_GGUF_TYPE_BOOL = 7,
    EN_GGUF_TYPE_STRING = 8,
    EN_GGUF_TYPE_ARRAY = 9,
    EN_GGUF_TYPE_UINT64 = 10,
    EN_GGUF_TYPE_INT64 = 11,
    EN_GGUF_TYPE_FLOAT64 = 12
} en_gguf_type;

/* Static name of a metadata type ("uint32", "string", ...; "?" if unknown). */
const char *en_gguf_type_name(en_gguf_type t);

/* ggml tensor types, numbered as in the file (ggml.h enum ggml_type). */
typedef enum en_ggml_type {
    EN_GGML_TYPE_F32 = 0,
    EN_GGML_TYPE_F16 = 1,
    EN_GGML_TYPE_Q4_0 = 2,
    EN_GGML_TYPE_Q4_1 = 3,
    EN_GGML_TYPE_Q5_0 = 6,
    EN_GGML_TYPE_Q5_1 = 7,
    EN_GGML_TYPE_Q8_0 = 8,
    EN_GGML_TYPE_Q8_1 = 9,
    EN_GGML_TYPE_Q2_K = 10,
    EN_GGML_TYPE_Q3_K = 11,
    EN_GGML_TYPE_Q4_K = 12,
    EN_GGML_TYPE_Q5_K = 13,
    EN_GGML_TYPE_Q6_K = 14,
    EN_GGML_TYPE_Q8_K = 15,
    EN_GGML_TYPE_I8 = 24,
    EN_GGML_TYPE_I16 = 25,
    EN_GGML_TYPE_I32 = 26,
    EN_GGML_TYPE_I64 = 27,
    EN_GGML_TYPE_F64 = 28,
    EN_GGML_TYPE_BF16 = 30
    /* the IQ*, TQ* and MXFP4 types are known by number (sizes only) */
} en_ggml_type;

/* Static name of a ggml type ("Q4_K", ...); NULL for a number ggml does not
 * define. en_ggml_type_block: elements per block (0 if unknown);
 * en_ggml_type_size: bytes per block (0 if unknown). */
const char *en_ggml_type_name(uint32_t t);
size_t en_ggml_type_block(uint32_t t);
size_t en_ggml_type_size(uint32_t t);

#define EN_GGUF_MAX_DIMS 4 /* GGML_MAX_DIMS */

/* A metadata value: a view into the file. Scalars: `data` points at the
 * little-endian bytes. Strings: `data` at the bytes (not NUL-terminated),
 * `n` the length. Arrays: `elem_type`, `n` elements starting at `data`;
 * use en_gguf_arr_get for element access. */
typedef struct en_gguf_value {
    en_gguf_type type;
    en_gguf_type elem_type; /* arrays only */
    uint64_t n;             /* strings: bytes; arrays: elements */
    const uint8_t *data;
    const uint64_t *offsets; /* internal: element offsets of top-level
                                string/array arrays, else NULL */
} en_gguf_value;

/* A tensor: a view into the file. dims are fastest-varying first
 * (ggml order: token_embd.weight [n_embd, n_vocab]). */
typedef struct en_gguf_tensor {
    const char *name; /* NUL-terminated, owned by the en_gguf */
    uint32_t type;    /* en_ggml_type */
    int n_dims;
    int64_t dims[EN_GGUF_MAX_DIMS]; /* unused dims are 1 */
    int64_t n_elem;
    uint64_t offset; /* from the start of the data section */
    const uint8_t *data;
    size_t n_bytes;
} en_gguf_tensor;

typedef struct en_gguf en_gguf;

/* Map and validate a GGUF file. On success *g owns the map (close with
 * en_gguf_close); on failure *g is NULL and nothing needs closing.
 * Errors: EN_ERR_IO (cannot open/map), EN_ERR_FORMAT (anything wrong in the
 * file; the message names the file and the field, key or tensor),
 * EN_ERR_NOMEM. Thread-safe for distinct files; a parsed en_gguf is
 * read-only and may be shared between threads. */
en_status en_gguf_open(const char *path, en_gguf **g, en_err *err);

/* Parse a GGUF image already in memory. Borrows `data` (must outlive *g);
 * `name` is copied and used in error messages. Same errors as
 * en_gguf_open. Used by en_gguf_open and by the fuzzer. */
en_status en_gguf_open_memory(const void *data, size_t len, const char *name, en_gguf **g,
                              en_err *err);

/* 1 when `path` names a GGUF file: a path ending in ".gguf" (so that a
 * damaged one reaches en_gguf_open and its precise error), or a file whose
 * first four bytes are "GGUF" whatever its name; 0 for directories, other
 * files and paths that cannot be opened. Reads at most 4 bytes. Used where a
 * command takes either a model directory or a .gguf file (tokenizer.h). */
int en_gguf_is_gguf_path(const char *path);

/* Free everything and unmap. NULL is allowed. */
void en_gguf_close(en_gguf *g);

uint32_t en_gguf_version(const en_gguf *g);
size_t en_gguf_alignment(const en_gguf *g);
size_t en_gguf_data_offset(const en_gguf *g); /* file offset of the data section */
const char *en_gguf_name(const en_gguf *g);   /* the path or name given to open */

/* Metadata by index (0 <= i < n_kv) or by key. en_gguf_find_kv returns the
 * index or -1. Returned pointers are borrowed from g. */
int64_t en_gguf_n_kv(const en_gguf *g);
const char *en_gguf_kv_key(const en_gguf *g, int64_t i);
const en_gguf_value *en_gguf_kv_value(const en_gguf *g, int64_t i);
int64_t en_gguf_find_kv(const en_gguf *g, const char *key);

/* Value conversions; each returns 1 on success, 0 when the value has the
 * wrong type or does not fit (e.g. a uint64 above INT64_MAX for _i64, a
 * negative integer for _u64). _f64 accepts every numeric type. */
int en_gguf_value_i64(const en_gguf_value *v, int64_t *out);
int en_gguf_value_u64(const en_gguf_value *v, uint64_t *out);
int en_gguf_value_f64(const en_gguf_value *v, double *out);
int en_gguf_value_bool(const en_gguf_value *v, int *out);
int en_gguf_value_str(const en_gguf_value *v, const char **s, size_t *len);

/* Element i of an array (a view; nested arrays give array views). Returns 0
 * when v is not an array or i >= v->n. O(1) for arrays of fixed-size
 * elements and for top-level arrays of strings/arrays; O(i) for the elements
 * of a nested array of strings. */
int en_gguf_arr_get(const en_gguf_value *arr, uint64_t i, en_gguf_value *elem);

/* Getters by key. Errors (message names the file and the key):
 * EN_ERR_ARG when the key is absent, EN_ERR_FORMAT when it has another
 * type or the value does not fit. The string is not NUL-terminated. */
en_status en_gguf_get_i64(const en_gguf *g, const char *key, int64_t *out, en_err *err);
en_status en_gguf_get_u64(const en_gguf *g, const char *key, uint64_t *out, en_err *err);
en_status en_gguf_get_f64(const en_gguf *g, const char *key, double *out, en_err *err);
en_status en_gguf_get_bool(const en_gguf *g, const char *key, int *out, en_err *err);
en_status en_gguf_get_str(const en_gguf *g, const char *key, const char **s, size_t *len,
                          en_err *err);
en_status en_gguf_get_arr(const en_gguf *g, const char *key, en_gguf_value *arr, en_err *err);

/* Tensors by index (file order) or name (NULL if absent). Borrowed. */
int64_t en_gguf_n_tensors(const en_gguf *g);
const en_gguf_tensor *en_gguf_tensor_at(const en_gguf *g, int64_t i);
const en_gguf_tensor *en_gguf_find_tensor(const en_gguf *g, const char *name);

/* Dequantise a whole tensor into out (t->n_elem floats, caller-owned).
 * Types F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K; others return
 * EN_ERR_UNSUPPORTED naming the tensor and type. Results equal ggml's and
 * the gguf Python package's bit for bit (same float32 operation order). */
en_status en_gguf_tensor_to_f32(const en_gguf *g, const en_gguf_tensor *t, float *out,
                                en_err *err);

/* Dequantise n elements (a multiple of the type's block size) from raw
 * block data. EN_ERR_UNSUPPORTED / EN_ERR_ARG without a message. */
en_status en_ggml_to_f32(uint32_t type, const void *src, float *out, int64_t n);

#endif /* EN_GGUF_H */
