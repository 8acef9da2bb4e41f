/*
 * safetensors.h - read and write the safetensors format: an 8-byte
 * little-endian header length N, N bytes of JSON mapping tensor names to
 * {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
 * byte after the header), then the raw little-endian tensor data.
 *
 * The reader memory-maps the file and checks everything a lying header could
 * get wrong: header length within the file, JSON shape, known dtypes, shapes
 * whose element count times dtype size equals the offset span, offsets inside
 * the data section, and no two tensors overlapping. Every error names the
 * file and, where it applies, the tensor. The index of a sharded checkpoint
 * (model.safetensors.index.json) is read here too (en_st_index_parse).
 * Used by models/ and finetune/.
 */
#ifndef EN_SAFETENSORS_H
#define EN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "file.h"
#include "status.h"

typedef enum en_dtype {
    EN_DTYPE_F32 = 0,
    EN_DTYPE_F16 = 1,
    EN_DTYPE_BF16 = 2,
    EN_DTYPE_I32 = 3,
    EN_DTYPE_I64 = 4,
    EN_DTYPE_U8 = 5,
    EN_DTYPE_F64 = 6
} en_dtype;

const char *en_dtype_name(en_dtype t); /* "F32", "BF16", ... */
size_t en_dtype_size(en_dtype t);

#define EN_ST_MAX_DIMS 8

typedef struct en_st_tensor {
    char *name;
    en_dtype dtype;
    int n_dims;
    int64_t shape[EN_ST_MAX_DIMS];
    int64_t n_elem;
    const uint8_t *data; /* points into the map */
    size_t n_bytes;
} en_st_tensor;

typedef struct en_st_file {
    char *path;
    en_mmap map;
    en_st_tensor *tensors;
    int n_tensors;
} en_st_file;

/* Open and validate. On failure nothing needs closing. */
en_status en_st_open(const char *path, en_st_file *f, en_err *err);
/* The same for a file already open for reading (borrowed: fd stays the
 * caller's, and may be closed once this returns); path names it in
 * messages. Used where the caller must choose how the file is opened
 * (models/lora.c under a server's --adapter-dir). */
en_status en_st_open_fd(int fd, const char *path, en_st_file *f, en_err *err);
void en_st_close(en_st_file *f);
/* Borrowed pointer into f, or NULL. */
const en_st_tensor *en_st_find(const en_st_file *f, const char *name);

/* Convert n elements of a tensor's data (F32, F16 or BF16) to float32.
 * Other dtypes return EN_ERR_FORMAT. */
en_status en_st_to_f32(const en_st_tensor *t, float *dst, en_err *err);

/* Writer: collect tensors (borrowed pointers, must live until write), then
 * write the file atomically. Tensors are written in the order added. */
typedef struct en_st_writer_item {
    const char *name;
    en_dtype dtype;
    int n_dims;
    int64_t shape[EN_ST_MAX_DIMS];
    const void *data;
} en_st_writer_item;

/* Write `n` tensors to `path` (F32 data written as given; when
 * out_dtype is EN_DTYPE_BF16 or EN_DTYPE_F16, F32 items are converted with
 * round-to-nearest-even). The header carries
 * "__metadata__": {"format": "pt"} so that Hugging Face tools accept it. */
en_status en_st_write(const char *path, const en_st_writer_item *items, int n,
                      en_dtype out_dtype, en_err *err);

/* ---- sharded checkpoints: model.safetensors.index.json ----
 * {"metadata": {...}, "weight_map": {TENSOR: FILE, ...}} as transformers
 * writes it; metadata is not read. The files lie beside the index. */
#define EN_ST_INDEX_MAX_FILES 1024 /* distinct shard files */
#define EN_ST_INDEX_MAX_BYTES (64u * 1024u * 1024u) /* of index text */

typedef struct en_st_index {
    char **files;     /* distinct shard file names, in order of first appearance */
    int n_files;      /* 1..EN_ST_INDEX_MAX_FILES */
    size_t n_tensors; /* entries of weight_map */
} en_st_index;

/* Parse len bytes of index text (not NUL-terminated); path only names the
 * index in messages. Checks: JSON (a duplicate key is an error, naming the
 * key), an object whose "weight_map" is a non-empty object of strings, each
 * a plain file name (no '/', no backslash, no "..": never outside the index's
 * directory) ending in ".safetensors", and at most EN_ST_INDEX_MAX_FILES
 * distinct files; a file named for many tensors counts once. EN_ERR_FORMAT
 * with a message starting "PATH: " and naming the field (e.g.
 * "weight_map['lm_head.weight']"), EN_ERR_NOMEM. On failure *out is empty.
 * *out is the caller's storage: release it with en_st_index_deinit. */
en_status en_st_index_parse(const char *text, size_t len, const char *path, en_st_index *out,
                            en_err *err);
void en_st_index_deinit(en_st_index *idx); /* a zeroed or deinited idx is a no-op */

/* float <-> half helpers (round to nearest even). */
float en_f16_to_f32(uint16_t h);
float en_bf16_to_f32(uint16_t h);
uint16_t en_f32_to_f16(float f);
uint16_t en_f32_to_bf16(float f);

#endif /* EN_SAFETENSORS_H */
