/*
 * model.c - load a Hugging Face model directory into one parameter
 * allocation (each tensor sliced for this tensor-parallel rank as its
 * family's layout declares), and the inference context (KV cache +
 * scratch) around the forward pass in forward.c.
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "../common/file.h"
#include "../common/quant.h"
#include "../common/safetensors.h"
#include "family.h"
#include "gguf_model.h"

en_model_params en_model_params_default(void) {
    en_model_params p = {0};
    p.tp_size = 1;
    p.output_weights = EN_WEIGHTS_AUTO;
    return p;
}

en_ctx_params en_ctx_params_default(void) {
    en_ctx_params p = {0, 0};
    return p;
}

/* The safetensors files of a directory: model.safetensors, or the shards
 * named by model.safetensors.index.json ("weight_map": name -> file). */
typedef struct shard_set {
    en_st_file *files;
    int n;
    en_gguf *gguf; /* or a GGUF file (gguf_model.h) */
    json_t *qformats; /* a quantised directory's tensor_formats (quantized.c) */
} shard_set;

static void shards_close(shard_set *ss) {
    en_gguf_close(ss->gguf);
    ss->gguf = NULL;
    if (ss->qformats) json_decref(ss->qformats);
    ss->qformats = NULL;
    for (int i = 0; i < ss->n; i++) en_st_close(&ss->files[i]);
    en_free(ss->files);
    ss->n = 0;
}

static en_status shards_open(const char *dir, shard_set *ss, en_err *err) {
    json_t *qf = ss->qformats; /* read from config.json before */
    memset(ss, 0, sizeof *ss);
    ss->qformats = qf;
    char *single = en_path_join(dir, "model.safetensors");
    char *index = en_path_join(dir, "model.safetensors.index.json");
    en_status s = EN_OK;
    char *text = NULL;
    if (!single || !index) {
        s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (en_path_exists(single)) {
        ss->files = en_calloc(1, sizeof(en_st_file));
        if (!ss->files) {
            s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
            goto done;
        }
        s = en_st_open(single, &ss->files[0], err);
        if (s == EN_OK) ss->n = 1;
        goto done;
    }
    if (!en_path_exists(index)) {
        s = EN_ERR(err, EN_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json",
                   dir);
        goto done;
    }
    size_t len;
    s = en_file_read_all(index, &text, &len, err);
    if (s != EN_OK) goto done;
    en_st_index idx;
    s = en_st_index_parse(text, len, index, &idx, err);
    if (s != EN_OK) goto done;
    ss->files = en_calloc((size_t)idx.n_files, sizeof(en_st_file));
    if (!ss->files) s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < idx.n_files && s == EN_OK; i++) {
        char *p = en_path_join(dir, idx.files[i]);
        if (!p) {
            s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
            break;
        }
        s = en_st_open(p, &ss->files[ss->n], err);
        if (s == EN_OK) ss->n++;
        en_free(p);
    }
    en_st_index_deinit(&idx);
done:
    en_free(text);
    en_free(single);
    en_free(index);
    if (s != EN_OK) shards_close(ss);
    return s;
}

static const en_st_tensor *shards_find(const shard_set *ss, const char *name, const char **file) {
    for (int i = 0; i < ss->n; i++) {
        const en_st_tensor *t = en_st_find(&ss->files[i], name);
        if (t) {
            *file = ss->files[i].path;
            return t;
        }
    }
    return NULL;
}

/* One tensor of the checkpoint, by its Hugging Face name: where it is and
 * its shape in Hugging Face's row-major (rows, cols) order. */
typedef struct src_tensor {
    const char *file, *name; /* for messages */
    int n_dims;
    int64_t shape[2];
    int64_t n_elem;
    const en_st_tensor *st;  /* safetensors */
    const en_gguf_tensor *gt; /* or GGUF */
    int perm;                /* GGUF: 1 / 2 q / k rows to unpermute */
    int qsrc;                /* stored block-quantised (en_quant_fmt), 0: not */
    char gname[96];
} src_tensor;

/* GPT-2 checkpoints on the Hub also store "transformer.h.0..." as
 * "h.0..." (the base model's names), which is accepted too. */
static int src_find(const shard_set *ss, const char *name, src_tensor *t) {
    memset(t, 0, sizeof *t);
    if (ss->gguf) {
        t->perm = en_gguf_model_tensor_name(ss->gguf, name, t->gname, sizeof t->gname);
        t->gt = t->perm >= 0 ? en_gguf_find_tensor(ss->gguf, t->gname) : NULL;
        if (!t->gt) return 0;
        t->file = en_gguf_name(ss->gguf);
        t->name = t->gname;
        t->n_dims = t->gt->n_dims;
        t->shape[0] = t->gt->n_dims > 1 ? t->gt->dims[1] : t->gt->dims[0];
        t->shape[1] = t->gt->n_dims > 1 ? t->gt->dims[0] : 0;
        t->n_elem = t->gt->n_elem;
        t->qsrc = (int)en_quant_from_ggml(t->gt->type);
        if (t->gt->n_dims > 2) t->n_dims = t->gt->n_dims; /* found; the shape check refuses it */
        return 1;
    }
    t->st = shards_find(ss, name, &t->file);
    static const char pre[] = "transformer.";
    if (!t->st && strncmp(name, pre, sizeof pre - 1) == 0)
        t->st = shards_find(ss, name + sizeof pre - 1, &t->file);
    if (!t->st) return 0;
    t->name = t->st->name;
    t->n_dims = t->st->n_dims;
    t->shape[0] = t->st->shape[0];
    t->shape[1] = t->st->n_dims > 1 ? t->st->shape[1] : 0;
    t->n_elem = t->st->n_elem;
    t->qsrc = en_quant_config_fmt(ss->qformats, t->name);
    if (t->qsrc) { /* stored (rows, bytes): its shape in inputs */
        const int blk = en_quant_block_elems((en_quant_fmt)t->qsrc);
        const size_t bb = en_quant_row_size((en_quant_fmt)t->qsrc, blk);
        const int64_t bytes = t->shape[1];
        t->shape[1] = bytes > 0 && bytes % (int64_t)bb == 0 ? bytes / (int64_t)bb * blk : -1;
        t->n_elem = t->shape[0] * (t->shape[1] > 0 ? t->shape[1] : 0);
    }
    return 1;
}

/* The tensor as float32 into dst (n_elem); tmp: room for as many. */
static en_status src_read(const en_model *m, const shard_set *ss, const src_tensor *t, float *dst,
                          float *tmp, en_err *err) {
    if (t->st && t->qsrc)
        return en_dequantize_rows((en_quant_fmt)t->qsrc, dst, t->st->data, (int)t->shape[0],
                                  (int)t->shape[1]) == EN_OK
                   ? EN_OK
                   : EN_ERR(err, EN_ERR_FORMAT, "%s: tensor '%s': bad quantised data", t->file,
                            t->name);
    if (t->st) return en_st_to_f32(t->st, dst, err);
    if (!t->perm) return en_gguf_tensor_to_f32(ss->gguf, t->gt, dst, err);
    EN_TRY(en_gguf_tensor_to_f32(ss->gguf, t->gt, tmp, err));
    int64_t heads = t->perm == 1 ? m->hp.n_head : m->hp.n_kv_head;
    int64_t cols = t->shape[1] ? t->shape[1] : 1;
    en_gguf_unpermute_rows(dst, tmp, heads, t->shape[0] / heads, cols);
    return EN_OK;
}

/* The whole model's shape of a tensor this rank holds a shard of: its
 * shape times the parts along the declared split (the vocabulary: its
 * real size, not the padded one). */
static void full_shape(const en_model *m, const en_param_spec *sp, int64_t *d0, int64_t *d1) {
    int split = m->tp_size > 1 ? sp->split : 0;
    int parts, idx;
    en_model_tp_row_block(m, sp->name, &parts, &idx);
    *d0 = sp->shape[0] * (split == EN_SPLIT_ROWS ? parts : 1);
    if (split == EN_SPLIT_ROWS && (sp->flags & EN_PARAM_VOCAB)) *d0 = m->hp.n_vocab;
    *d1 = sp->shape[1] * (split == EN_SPLIT_COLS ? m->tp_size : 1);
}

/* What the checkpoint must hold for spec sp: the file tensor's name and
 * shape (a fused block's whole tensor; Conv1D's (in, out) orientation). */
static void file_shape(const en_model *m, const en_param_spec *sp, const char **name,
                       int *n_dims, int64_t shape[2]) {
    int64_t d0, d1;
    full_shape(m, sp, &d0, &d1);
    if (sp->src[0]) d0 = sp->src_rows;
    *name = sp->src[0] ? sp->src : sp->name;
    *n_dims = sp->n_dims;
    shape[0] = (sp->flags & EN_PARAM_TRANSPOSED) ? d1 : d0;
    shape[1] = (sp->flags & EN_PARAM_TRANSPOSED) ? d0 : d1;
}

static en_status check_tensor(const en_model *m, const shard_set *ss, const en_param_spec *sp,
                              const char *dir, size_t *n_elem, en_err *err) {
    const char *name, *file = NULL;
    int nd;
    int64_t want[2];
    file_shape(m, sp, &name, &nd, want);
    src_tensor st, *t = &st;
    if (!src_find(ss, name, t))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: tensor '%s' is missing from the checkpoint", dir,
                      ss->gguf && st.gname[0] ? st.gname : name);
    file = t->file;
    int shape_ok = t->n_dims == nd && t->shape[0] == want[0] && (nd == 1 || t->shape[1] == want[1]);
    if (!shape_ok) {
        char got[128] = "", exp[64];
        size_t k = 0;
        for (int d = 0; d < t->n_dims && k < sizeof got - 24; d++)
            k += (size_t)snprintf(got + k, sizeof got - k, "%s%lld", d ? ", " : "",
                                  (long long)t->shape[d]);
        if (nd == 1)
            snprintf(exp, sizeof exp, "%lld", (long long)want[0]);
        else
            snprintf(exp, sizeof exp, "%lld, %lld", (long long)want[0], (long long)want[1]);
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: tensor '%s' has shape [%s]%s but %s implies [%s]", file, t->name, got,
                      ss->gguf ? " (rows, columns)" : "", ss->gguf ? "the metadata" : "config.json",
                      exp);
    }
    if (t->st && t->qsrc && (t->st->dtype != EN_DTYPE_U8 || t->n_dims != 2))
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: tensor '%s' is %s in quantization_config but stored as %s with %d "
                      "dimensions (need U8 (rows, bytes))",
                      file, name, en_quant_name((en_quant_fmt)t->qsrc),
                      en_dtype_name(t->st->dtype), t->n_dims);
    if (t->st && !t->qsrc && t->st->dtype != EN_DTYPE_F32 && t->st->dtype != EN_DTYPE_F16 &&
        t->st->dtype != EN_DTYPE_BF16)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: tensor '%s' has dtype %s (need F32, F16 or BF16)",
                      file, name, en_dtype_name(t->st->dtype));
    if (t->gt) { /* a type we cannot dequantise: said before anything is read */
        float probe[256];
        size_t blk = en_ggml_type_block(t->gt->type), bs = en_ggml_type_size(t->gt->type);
        if (!blk || !bs || blk > 256 ||
            en_ggml_to_f32(t->gt->type, t->gt->data, probe, (int64_t)blk) != EN_OK)
            return EN_ERR(err, EN_ERR_UNSUPPORTED,
                          "%s: tensor '%s' has type %s, which cannot be loaded (F32, F16, BF16, "
                          "Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K)",
                          file, t->name, en_ggml_type_name(t->gt->type));
    }
    *n_elem = (size_t)t->n_elem;
    return EN_OK;
}

/* Upload the host blocks hq of spec sp (its rows) and point its slot there. */
static void put_q(en_model *m, en_param_spec *sp, uint8_t *hq) {
    const size_t rs = en_quant_row_size((en_quant_fmt)sp->qfmt, (int)sp->shape[1]);
    /* the CPU kernels' layout: rows interleaved by fours (quant.h); kept
     * plain when there is no memory for it (the kernels take both) */
    if (en_quant_x4_ok((en_quant_fmt)sp->qfmt, (int)sp->shape[0]) &&
        en_quant_interleave((en_quant_fmt)sp->qfmt, hq, (int)sp->shape[0],
                            (int)sp->shape[1]) == EN_OK)
        sp->qfmt |= EN_QUANT_X4;
    en_backend_upload(m->be, m->paramsq + sp->offset, hq, (size_t)sp->shape[0] * rs);
    if (sp->slot) *sp->slot = (float *)(void *)(m->paramsq + sp->offset);
}

/* On the CPU a 16-bit matrix (not an embedding table, N and K multiples
 * of 8, one rank) is held with its rows interleaved by eights, the layout
 * the batch-1 kernel reads as one stream (backend.h EN_WTYPE_X8). Kept
 * plain when the 8 rows of scratch cannot be had. */
static void w16_interleave(en_model *m, en_param_spec *sp, uint16_t *h16) {
    const int64_t N = sp->shape[0], K = sp->shape[1];
    if (!en_backend_supports_quant(m->be) || m->tp_size > 1 || sp->n_dims != 2 || N % 8 ||
        K % 8 || N <= 0 || (size_t)(N * K) != sp->n_elem || sp->slot == &m->w.tok_embd ||
        sp->slot == &m->w.pos_embd)
        return;
    uint16_t *tmp = en_malloc((size_t)8 * (size_t)K * sizeof *tmp);
    if (!tmp) return;
    en_w16_interleave(h16, (int)N, (int)K, tmp);
    en_free(tmp);
    sp->w16x8 = 1;
}

/* dst(N,K) = the values of an interleaved 16-bit matrix, 8 rows at a time
 * through dst's first 8 rows as scratch (each block's rows land after the
 * rows already written, so nothing unread is overwritten). */
static void w16x8_to_f32(const en_model *m, const en_param_spec *sp, float *dst,
                         const uint16_t *src) {
    const int N = (int)sp->shape[0], K = (int)sp->shape[1];
    for (int n = 0; n < N; n += 8) {
        uint16_t *rows = (uint16_t *)(void *)(dst + (size_t)n * K) + (size_t)8 * K; /* 2nd half */
        en_w16_deinterleave(rows, src + (size_t)n * K, 8, K);
        en_w16_to_f32(dst + (size_t)n * K, rows, (size_t)8 * K, m->wtype);
    }
}

/* A tensor the checkpoint stores in the format the model holds it at: its
 * rows' bytes as they are (GGUF's q / k rows put back in Hugging Face's
 * order; a fused tensor's block from its first row), uploaded. hq: room
 * for the tensor's bytes. Tensor parallelism is refused for quantised
 * weights, so this rank's tensor is the whole one. */
static en_status load_raw_q(en_model *m, en_param_spec *sp, const src_tensor *t, uint8_t *hq) {
    const int64_t rows = sp->shape[0];
    const size_t rs = en_quant_row_size((en_quant_fmt)sp->qfmt, (int)sp->shape[1]);
    const uint8_t *src = t->st ? t->st->data : (const uint8_t *)t->gt->data;
    const int64_t row0 = sp->src[0] ? sp->src_row0 : 0;
    const int64_t heads = t->perm == 1 ? m->hp.n_head : m->hp.n_kv_head;
    const int64_t D = t->perm ? rows / heads : 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t sr = r; /* Hugging Face row r is GGUF row h*D + 2i + c */
        if (t->perm) {
            const int64_t h = r / D, c = (r % D) / (D / 2), i = (r % D) % (D / 2);
            sr = h * D + 2 * i + c;
        }
        memcpy(hq + (size_t)r * rs, src + (size_t)(row0 + sr) * rs, rs);
    }
    put_q(m, sp, hq);
    return EN_OK;
}

/* Read spec sp's tensor (or its block of a fused one), turn it to the
 * model's orientation, slice this rank's part and upload it. staging
 * holds 3 * cap floats. */
static en_status load_tensor(en_model *m, const shard_set *ss, en_param_spec *sp, float *staging,
                             size_t cap, en_err *err) {
    const char *name;
    int nd;
    int64_t fs[2], d0, d1;
    file_shape(m, sp, &name, &nd, fs);
    full_shape(m, sp, &d0, &d1);
    src_tensor t;
    src_find(ss, name, &t); /* checked by check_tensor */
    if (sp->qfmt && t.qsrc == (int)en_quant_base((en_quant_fmt)sp->qfmt))
        return load_raw_q(m, sp, &t, (uint8_t *)staging);
    EN_TRY(src_read(m, ss, &t, staging, staging + cap, err));
    float *whole = staging;
    if (sp->flags & EN_PARAM_TRANSPOSED) { /* (in, out) -> (out, in) */
        float *tr = staging + cap;
        for (int64_t i = 0; i < fs[0]; i++)
            for (int64_t j = 0; j < fs[1]; j++) tr[j * fs[0] + i] = staging[i * fs[1] + j];
        whole = tr;
    }
    if (sp->src[0]) whole += (size_t)sp->src_row0 * (size_t)(d1 ? d1 : 1);
    float *dst = staging + 2 * cap;
    en_tp_slice(m, sp->name, whole, d0, d1, dst, sp->n_elem);
    if (sp->qfmt) { /* quantised on the host, uploaded as blocks (staging's first part is free) */
        uint8_t *hq = (uint8_t *)staging;
        const int rows = (int)sp->shape[0], K = (int)sp->shape[1];
        if (en_quantize_rows((en_quant_fmt)sp->qfmt, hq, dst, rows, K) != EN_OK)
            return EN_ERR(err, EN_ERR_ARG, "%s: cannot quantise", sp->name);
        put_q(m, sp, hq);
        return EN_OK;
    }
    if (sp->w16) { /* narrowed on the host, uploaded at 16 bits (staging's first part is free) */
        uint16_t *h16 = (uint16_t *)staging;
        en_f32_to_w16(h16, dst, sp->n_elem, m->wtype);
        w16_interleave(m, sp, h16);
        uint16_t *p16 = m->params16 + sp->offset;
        en_backend_upload(m->be, p16, h16, sp->n_elem * sizeof(uint16_t));
        if (sp->slot) *sp->slot = (float *)(void *)p16; /* read through the _w16 ops */
        return EN_OK;
    }
    en_backend_upload(m->be, m->params + sp->offset, dst, sp->n_elem * sizeof(float));
    if (sp->slot) *sp->slot = m->params + sp->offset;
    return EN_OK;
}

/* The 16-bit type the matrices are held at (0: float32): the request, or
 * for AUTO the checkpoint's own width when every matrix has it. */
static int choose_wtype(const en_model *m, const shard_set *ss, int want) {
    if (want == EN_WEIGHTS_BF16) return EN_WTYPE_BF16;
    if (want == EN_WEIGHTS_F16) return EN_WTYPE_F16;
    if (want != EN_WEIGHTS_AUTO) return 0;
    int bf16 = 1, f16 = 1, any = 0;
    for (int i = 0; i < m->n_specs; i++) {
        const en_param_spec *sp = &m->specs[i];
        const char *name;
        int nd;
        int64_t fs[2];
        src_tensor t;
        if (sp->n_dims != 2) continue;
        file_shape(m, sp, &name, &nd, fs);
        if (!src_find(ss, name, &t)) return 0; /* check_tensor will say */
        int is_bf16 = t.st ? t.st->dtype == EN_DTYPE_BF16 : t.gt->type == EN_GGML_TYPE_BF16;
        int is_f16 = t.st ? t.st->dtype == EN_DTYPE_F16 : t.gt->type == EN_GGML_TYPE_F16;
        bf16 &= is_bf16;
        f16 &= is_f16;
        any = 1;
    }
    return !any ? 0 : bf16 ? EN_WTYPE_BF16 : f16 ? EN_WTYPE_F16 : 0;
}

/* Offsets of the float32 tensors in params and the 16-bit ones in
 * params16 (matrices, when the model holds them at 16 bits). */
static void place_tensors(en_model *m) {
    size_t off = 0, off16 = 0, offq = 0;
    for (int i = 0; i < m->n_specs; i++) {
        en_param_spec *sp = &m->specs[i];
        sp->w16 = m->wtype && sp->n_dims == 2 && !sp->qfmt;
        /* keep every tensor 64-byte aligned for vector loads */
        if (sp->qfmt) {
            sp->offset = offq;
            offq += ((size_t)sp->shape[0] *
                         en_quant_row_size((en_quant_fmt)sp->qfmt, (int)sp->shape[1]) +
                     63) &
                    ~(size_t)63;
        } else if (sp->w16) {
            sp->offset = off16;
            off16 += (sp->n_elem + 31) & ~(size_t)31;
        } else {
            sp->offset = off;
            off += (sp->n_elem + 15) & ~(size_t)15;
        }
    }
    m->n_params = off;
    m->n_params16 = off16;
    m->n_paramsq = offq;
}

/* Which tensors are held block-quantised (sp->qfmt; quantized.c decides):
 * the request, or for AUTO the checkpoint's own quantised tensors when
 * the backend has the kernels. Refused with a message: quantised weights
 * on a backend without the kernels, or with tensor parallelism. */
static en_status choose_qfmts(en_model *m, const shard_set *ss, const en_model_params *params,
                              const char *where, en_err *err) {
    const int want = params->weights, can = en_backend_supports_quant(m->be);
    const int asked = want == EN_WEIGHTS_Q8 || want == EN_WEIGHTS_Q4 || want == EN_WEIGHTS_Q4_1;
    if (asked && !can)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "%s: --weights %s: block-quantised weights run on the CPU backend only "
                      "(use --weights bf16 or f32 on %s)",
                      where, want == EN_WEIGHTS_Q8 ? "q8" : want == EN_WEIGHTS_Q4 ? "q4" : "q4_1",
                      en_backend_name(m->be));
    int any = 0;
    for (int i = 0; i < m->n_specs; i++) {
        en_param_spec *sp = &m->specs[i];
        const char *name;
        int nd;
        int64_t fs[2];
        src_tensor t;
        file_shape(m, sp, &name, &nd, fs);
        int src = src_find(ss, name, &t) && can && !(sp->flags & EN_PARAM_TRANSPOSED) ? t.qsrc : 0;
        sp->qfmt = m->wtype ? 0 : en_model_choose_qfmt(m, sp, want, params->output_weights, src);
        any |= sp->qfmt != 0;
    }
    if (any && m->tp_size > 1)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "%s: block-quantised weights with tensor parallelism (--tp %d) are not "
                      "supported: load the model with --weights f32 or bf16",
                      where, m->tp_size);
    return EN_OK;
}

/* Every tensor of the layout from the checkpoint into m->params (sliced
 * for this rank): all checked first, so a wrong checkpoint fails before
 * anything is written and names the tensor. */
/* Every tensor of the layout checked against the checkpoint (presence,
 * shape, type) before anything is allocated or written, so a wrong or
 * lying checkpoint fails fast, names the tensor and never makes us
 * allocate what its header claims; *max_elem: the largest file tensor. */
static en_status check_weights(en_model *m, const shard_set *ss, const char *where,
                               size_t *max_elem, en_err *err) {
    /* fused blocks: where each starts in its checkpoint tensor */
    int64_t *rows0 = en_malloc((size_t)m->n_specs * sizeof(int64_t));
    if (!rows0) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < m->n_specs; i++) {
        int64_t d1;
        full_shape(m, &m->specs[i], &rows0[i], &d1);
    }
    en_model_fuse_offsets(m->specs, m->n_specs, rows0);
    en_free(rows0);
    *max_elem = 0;
    for (int i = 0; i < m->n_specs; i++) {
        size_t ne = 0;
        EN_TRY(check_tensor(m, ss, &m->specs[i], where, &ne, err));
        if (ne > *max_elem) *max_elem = ne;
    }
    return EN_OK;
}

/* Every tensor (checked by check_weights) into the parameters, sliced for
 * this rank. */
static en_status read_weights(en_model *m, const shard_set *ss, const char *where,
                              size_t max_elem, en_err *err) {
    /* room for a whole file tensor, its transpose and this rank's slice */
    float *staging = en_malloc(3 * (max_elem ? max_elem : 1) * sizeof(float));
    if (!staging) return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", where);
    en_status s = EN_OK;
    for (int i = 0; i < m->n_specs && s == EN_OK; i++)
        s = load_tensor(m, ss, &m->specs[i], staging, max_elem, err);
    en_free(staging);
    return s;
}

/* Refuse, before anything is allocated, weights that host memory cannot
 * hold: Linux lets such an allocation through and then kills the process
 * part-way through reading the file. CPU backend only (a GPU's memory is
 * checked by its allocator). */
static void human_bytes(double b, char *out, size_t cap) {
    static const char *const unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024.0 && u < 4) b /= 1024.0, u++;
    snprintf(out, cap, u ? "%.2f %s" : "%.0f %s", b, unit[u]);
}

static en_status check_fits(const en_model *m, const char *dir, en_err *err) {
    if (!en_backend_host_memory(m->be)) return EN_OK;
    double need = 4.0 * (double)m->n_params + 2.0 * (double)m->n_params16 + (double)m->n_paramsq;
    size_t avail = en_mem_available();
    if (avail == SIZE_MAX || need <= (double)avail) return EN_OK;
    char need_s[32], avail_s[32];
    human_bytes(need, need_s, sizeof need_s);
    human_bytes((double)avail, avail_s, sizeof avail_s);
    int narrowest = strncmp(en_model_weights_name(m), "q4", 2) == 0;
    return EN_ERR(err, EN_ERR_NOMEM,
                  "%s: the weights need %s as %s but only %s of memory is available "
                  "(MemAvailable, the cgroup limit and EN_MEMORY_LIMIT); %s",
                  dir, need_s, en_model_weights_name(m), avail_s,
                  narrowest ? "free memory or use a smaller model"
                            : "load them narrower (--weights q8 or q4) or free memory");
}

en_status en_model_load_weights(en_model *m, const char *path, en_err *err) {
    shard_set ss = {0};
    ss.files = en_calloc(1, sizeof(en_st_file));
    if (!ss.files) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    en_status s = en_st_open(path, &ss.files[0], err);
    size_t max_elem = 0;
    if (s == EN_OK) {
        ss.n = 1;
        s = check_weights(m, &ss, path, &max_elem, err);
    }
    if (s == EN_OK) s = read_weights(m, &ss, path, max_elem, err);
    shards_close(&ss);
    return s;
}

en_status en_model_load(const char *dir, const en_model_params *params, en_model **out,
                        en_err *err) {
    *out = NULL;
    if (!params || !params->backend) return EN_ERR(err, EN_ERR_ARG, "en_model_load: no backend");
    en_status s;
    char *cfg_path = en_path_join(dir, "config.json");
    char *cfg_text = NULL;
    size_t cfg_len = 0;
    shard_set ss = {0};
    int cfg_out = 0; /* a quantised directory's output_format */
    en_model *m = en_calloc(1, sizeof *m);
    if (!cfg_path || !m) {
        s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        goto fail;
    }
    m->be = params->backend;
    /* a Hugging Face directory, or a GGUF file whose metadata stands in for
     * config.json (gguf_model.c) */
    const int is_gguf = !en_path_is_dir(dir) && en_gguf_is_gguf_path(dir);
    if (is_gguf) {
        s = en_gguf_open(dir, &ss.gguf, err);
        if (s == EN_OK) s = en_gguf_model_config(ss.gguf, &cfg_text, &cfg_len, err);
    } else {
        s = en_file_read_all(cfg_path, &cfg_text, &cfg_len, err);
        if (s == EN_OK)
            s = en_quant_config_read(cfg_text, cfg_len, cfg_path, &ss.qformats, &cfg_out, err);
    }
    if (s != EN_OK) goto fail;
    const char *where = is_gguf ? dir : cfg_path; /* what messages name */
    s = en_model_hparams_parse(cfg_text, cfg_len, where, &m->hp, err);
    if (s != EN_OK) goto fail;
    m->config_text = cfg_text; /* kept: written out again with the weights */
    m->config_len = cfg_len;
    cfg_text = NULL;
    m->w.layers = en_calloc((size_t)m->hp.n_layer, sizeof(en_layer_w));
    if (!m->w.layers) {
        s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        goto fail;
    }
    m->tp_size = params->tp_size > 1 ? params->tp_size : 1;
    m->tp_rank = params->tp_rank;
    if (m->tp_rank < 0 || m->tp_rank >= m->tp_size) {
        s = EN_ERR(err, EN_ERR_ARG, "tensor-parallel rank %d is outside [0, %d)", m->tp_rank,
                   m->tp_size);
        goto fail;
    }
    m->fam = en_family_find(m->hp.model_type);
    s = en_tp_local_hparams(&m->hp, m->tp_size, where, &m->hl, &m->kv_rep, err);
    if (s != EN_OK) goto fail;
    m->comm = params->comm;
    s = en_model_layout(&m->hl, &m->specs, &m->n_specs, &m->n_params, &m->w, err);
    if (s != EN_OK) goto fail;
    if (!is_gguf) {
        s = shards_open(dir, &ss, err);
        if (s != EN_OK) goto fail;
    }
    size_t max_elem = 0;
    s = check_weights(m, &ss, dir, &max_elem, err);
    if (s != EN_OK) goto fail;
    m->wtype = choose_wtype(m, &ss, params->weights);
    s = choose_qfmts(m, &ss, params, dir, err);
    if (s != EN_OK) goto fail;
    place_tensors(m);
    s = check_fits(m, dir, err);
    if (s != EN_OK) goto fail;
    m->params = en_backend_alloc(m->be, (m->n_params ? m->n_params : 1) * sizeof(float));
    if (m->n_params16)
        m->params16 = en_backend_alloc(m->be, m->n_params16 * sizeof(uint16_t));
    if (m->n_paramsq) m->paramsq = en_backend_alloc(m->be, m->n_paramsq);
    if (!m->params || (m->n_params16 && !m->params16) || (m->n_paramsq && !m->paramsq)) {
        s = EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory for %zu parameters", dir,
                   m->n_params + m->n_params16);
        goto fail;
    }
    s = read_weights(m, &ss, dir, max_elem, err);
    if (s != EN_OK) goto fail;
    if (m->hp.tie_embeddings) m->w.lm_head = m->w.tok_embd;
    s = en_model_quant_finish(m, params->weights == EN_WEIGHTS_AUTO ? cfg_out
                                 : en_model_out_qfmt(params->weights, params->output_weights),
                              err);
    if (s != EN_OK) goto fail;
    s = en_rope_init(m, err);
    if (s != EN_OK) goto fail;
    if (m->hp.norm_plus1) { /* Gemma's 1 + w norms */
        size_t n = (size_t)(m->hp.n_embd > m->hp.head_dim ? m->hp.n_embd : m->hp.head_dim);
        float *ones = en_malloc(n * sizeof(float));
        m->ones = en_backend_alloc(m->be, n * sizeof(float));
        m->norm_w = en_backend_alloc(m->be, n * sizeof(float));
        if (!ones || !m->ones || !m->norm_w) {
            en_free(ones);
            s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
            goto fail;
        }
        for (size_t i = 0; i < n; i++) ones[i] = 1.0f;
        en_backend_upload(m->be, m->ones, ones, n * sizeof(float));
        en_free(ones);
    }
    shards_close(&ss);
    en_free(cfg_text);
    en_free(cfg_path);
    *out = m;
    return EN_OK;
fail:
    shards_close(&ss);
    en_free(cfg_text);
    en_free(cfg_path);
    en_model_destroy(m);
    return s;
}

void en_model_destroy(en_model *m) {
    if (!m) return;
    en_rope_destroy(m);
    en_model_quant_destroy(m);
    en_free(m->config_text);
    if (m->params16) en_backend_free(m->be, m->params16);
    en_backend_free(m->be, m->ones);
    en_backend_free(m->be, m->norm_w);
    if (m->params) en_backend_free(m->be, m->params);
    en_free(m->specs);
    en_free(m->w.layers);
    en_free(m);
}

const en_model_hparams *en_model_get_hparams(const en_model *m) { return &m->hp; }
en_backend *en_model_get_backend(const en_model *m) { return m->be; }
const en_model_hparams *en_model_get_local_hparams(const en_model *m) { return &m->hl; }

size_t en_model_param_bytes(const en_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_specs; i++) {
        const en_param_spec *sp = &m->specs[i];
        if (sp->qfmt)
            n += (size_t)sp->shape[0] * en_quant_row_size((en_quant_fmt)sp->qfmt, (int)sp->shape[1]);
        else
            n += sp->n_elem * (sp->w16 ? sizeof(uint16_t) : sizeof(float));
    }
    if (m->lm_head_q) /* read per token instead of the tied embedding's float32 */
        n += (size_t)m->hl.n_vocab *
             en_quant_row_size((en_quant_fmt)en_model_qfmt(m, m->lm_head_q), m->hl.n_embd);
    return n;
}

size_t en_model_read_bytes(const en_model *m) {
    size_t n = en_model_param_bytes(m);
    for (int i = 0; i < m->n_specs; i++) {
        const en_param_spec *sp = &m->specs[i];
        const int embd = sp->slot == &m->w.tok_embd || sp->slot == &m->w.pos_embd;
        if (!embd || (sp->slot == &m->w.tok_embd && m->w.lm_head == m->w.tok_embd)) continue;
        n -= sp->qfmt ? (size_t)sp->shape[0] *
                            en_quant_row_size((en_quant_fmt)sp->qfmt, (int)sp->shape[1])
                      : sp->n_elem * (sp->w16 ? sizeof(uint16_t) : sizeof(float));
    }
    return n;
}

float *en_model_param(en_model *m, const char *name, size_t *n_elem) {
    for (int i = 0; i < m->n_specs; i++)
        if (strcmp(m->specs[i].name, name) == 0) {
            if (m->specs[i].w16 || m->specs[i].qfmt) return NULL;
            if (n_elem) *n_elem = m->specs[i].n_elem;
            return m->params + m->specs[i].offset;
        }
    return NULL;
}

int en_weights_parse(const char *s) {
    static const char *const names[] = {"f32", "bf16", "f16", "auto", "q8", "q4", "q4_1"};
    for (int i = 0; i < 7; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

const char *en_model_weights_name(const en_model *m) {
    const char *q = en_model_quant_name(m);
    if (q) return q;
    return m->wtype == EN_WTYPE_BF16 ? "bf16" : m->wtype == EN_WTYPE_F16 ? "f16" : "f32";
}

int en_model_file_items(const en_param_spec *specs, int n, const float *host,
                        en_st_writer_item **items_out, float **scratch_out) {
    *items_out = NULL;
    *scratch_out = NULL;
    size_t extra = 0; /* floats of fused or transposed tensors rebuilt */
    for (int i = 0; i < n; i++)
        if (specs[i].src[0] || (specs[i].flags & EN_PARAM_TRANSPOSED)) extra += specs[i].n_elem;
    en_st_writer_item *items = en_calloc((size_t)(n ? n : 1), sizeof *items);
    float *scratch = en_malloc((extra ? extra : 1) * sizeof(float));
    if (!items || !scratch) {
        en_free(items);
        en_free(scratch);
        return -1;
    }
    int k = 0;
    size_t used = 0;
    for (int i = 0; i < n;) {
        const en_param_spec *sp = &specs[i];
        en_st_writer_item *it = &items[k++];
        it->dtype = EN_DTYPE_F32;
        it->n_dims = sp->n_dims;
        it->shape[0] = sp->shape[0];
        it->shape[1] = sp->shape[1];
        it->name = sp->name;
        it->data = host + sp->offset;
        int j = i + 1;
        if (!sp->src[0] && !(sp->flags & EN_PARAM_TRANSPOSED)) {
            i = j;
            continue;
        }
        /* the blocks of one fused tensor, one after the other */
        for (; sp->src[0] && j < n && strcmp(specs[j].src, sp->src) == 0; j++) {}
        float *dst = scratch + used;
        size_t rows = 0, cols = (size_t)(sp->shape[1] ? sp->shape[1] : 1);
        for (int b = i; b < j; b++) {
            memcpy(dst + rows * cols, host + specs[b].offset, specs[b].n_elem * sizeof(float));
            rows += (size_t)specs[b].shape[0];
        }
        used += rows * cols;
        if (sp->src[0]) it->name = sp->src;
        it->shape[0] = (int64_t)rows;
        it->data = dst;
        if (sp->flags & EN_PARAM_TRANSPOSED) { /* back to (in, out) */
            float *tr = en_malloc(rows * cols * sizeof(float));
            if (!tr) {
                en_free(items);
                en_free(scratch);
                return -1;
            }
            for (size_t r = 0; r < rows; r++)
                for (size_t c = 0; c < cols; c++) tr[c * rows + r] = dst[r * cols + c];
            memcpy(dst, tr, rows * cols * sizeof(float));
            en_free(tr);
            it->shape[0] = (int64_t)cols;
            it->shape[1] = (int64_t)rows;
        }
        i = j;
    }
    *items_out = items;
    *scratch_out = scratch;
    return k;
}

en_status en_model_save_safetensors(const en_model *m, const char *path, en_err *err) {
    /* one float32 host copy of every tensor, in a layout without 16-bit
     * parts (offsets counted anew) */
    en_param_spec *specs = en_malloc((size_t)m->n_specs * sizeof *specs);
    size_t total = 0;
    for (int i = 0; specs && i < m->n_specs; i++) {
        specs[i] = m->specs[i];
        specs[i].offset = total;
        total += m->specs[i].n_elem;
    }
    float *host = specs ? en_malloc((total ? total : 1) * sizeof(float)) : NULL;
    uint16_t *h16 = m->n_params16 ? en_malloc(m->n_params16 * sizeof(uint16_t)) : NULL;
    uint8_t *hq = m->n_paramsq ? en_malloc(m->n_paramsq) : NULL;
    if (!host || (m->n_params16 && !h16) || (m->n_paramsq && !hq)) {
        en_free(specs);
        en_free(host);
        en_free(h16);
        en_free(hq);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    if (h16) en_backend_download(m->be, h16, m->params16, m->n_params16 * sizeof(uint16_t));
    if (hq) en_backend_download(m->be, hq, m->paramsq, m->n_paramsq);
    for (int i = 0; i < m->n_specs; i++) {
        const en_param_spec *sp = &m->specs[i];
        if (sp->qfmt) /* the values the blocks stand for */
            en_dequantize_rows((en_quant_fmt)sp->qfmt, host + specs[i].offset, hq + sp->offset,
                               (int)sp->shape[0], (int)sp->shape[1]);
        else if (sp->w16 && sp->w16x8) /* back to rows, then widened */
            w16x8_to_f32(m, sp, host + specs[i].offset, h16 + sp->offset);
        else if (sp->w16)
            en_w16_to_f32(host + specs[i].offset, h16 + sp->offset, sp->n_elem, m->wtype);
        else
            en_backend_download(m->be, host + specs[i].offset, m->params + sp->offset,
                                sp->n_elem * sizeof(float));
    }
    en_free(h16);
    en_free(hq);
    en_st_writer_item *items;
    float *scratch;
    int n = en_model_file_items(specs, m->n_specs, host, &items, &scratch);
    en_status s = n < 0 ? EN_ERR(err, EN_ERR_NOMEM, "out of memory")
                        : en_st_write(path, items, n, EN_DTYPE_F32, err);
    en_free(items);
    en_free(scratch);
    en_free(host);
    en_free(specs);
    return s;
}

const char *en_model_file_tensor(const en_model *m, const char *name, int64_t *row0,
                                 int *transposed) {
    const en_param_spec *sp = en_model_find_spec(m, name);
    if (row0) *row0 = sp && sp->src[0] ? sp->src_row0 : 0;
    if (transposed) *transposed = sp && (sp->flags & EN_PARAM_TRANSPOSED);
    return sp && sp->src[0] ? sp->src : name;
}

en_status en_model_write_config(const en_model *m, const char *dir, en_err *err) {
    char *path = en_path_join(dir, "config.json");
    if (!path) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    en_status s = en_file_write_atomic(path, m->config_text, m->config_len, err);
    en_free(path);
    return s;
}

/* ---- context ---- */

en_status en_ctx_create(en_model *m, const en_ctx_params *p, en_ctx **out, en_err *err) {
    *out = NULL;
    if (m->tp_size > 1 && (!m->comm || en_comm_size(m->comm, EN_GROUP_TP) != m->tp_size))
        return EN_ERR(err, EN_ERR_ARG,
                      "a model sharded %d ways needs a communicator with a TP group of %d",
                      m->tp_size, m->tp_size);
    if (m->tp_size > 1 && m->lora)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "LoRA adapters with tensor parallelism are not supported yet (issue #4)");
    const en_model_hparams *hp = &m->hp;
    en_ctx_params d = p ? *p : en_ctx_params_default();
    if (d.n_ctx < 0 || d.n_batch < 0)
        return EN_ERR(err, EN_ERR_ARG, "context size and batch must not be negative");
    if (d.n_ctx == 0) d.n_ctx = hp->max_pos < 4096 ? hp->max_pos : 4096;
    if (d.n_ctx > hp->max_pos)
        return EN_ERR(err, EN_ERR_ARG,
                      "context size %d exceeds the model's max_position_embeddings %d", d.n_ctx,
                      hp->max_pos);
    if (d.n_batch == 0) d.n_batch = 256;
    if (d.n_batch > d.n_ctx) d.n_batch = d.n_ctx;
    en_ctx *c = en_calloc(1, sizeof *c);
    if (!c) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    c->m = m;
    c->n_ctx = d.n_ctx;
    c->n_batch = d.n_batch;
    en_backend *be = m->be;
    const en_model_hparams *hl = &m->hl; /* this rank's shard */
    size_t kvd = (size_t)hl->n_kv_head * hl->head_dim;
    size_t qd = (size_t)hl->n_head * hl->head_dim;
    size_t B = (size_t)d.n_batch, C = (size_t)hp->n_embd, F = (size_t)hl->n_ff;
    size_t cache = (size_t)hp->n_layer * (size_t)d.n_ctx * kvd * sizeof(float);
    c->k_cache = en_backend_alloc(be, cache);
    c->v_cache = en_backend_alloc(be, cache);
    c->x = en_backend_alloc(be, B * C * sizeof(float));
    c->xn = en_backend_alloc(be, B * C * sizeof(float));
    c->q = en_backend_alloc(be, B * qd * sizeof(float));
    c->att = en_backend_alloc(be, B * (qd > C ? qd : C) * sizeof(float));
    c->gate = en_backend_alloc(be, B * F * sizeof(float));
    c->up = en_backend_alloc(be, B * F * sizeof(float));
    size_t wide = C > F ? C : F;
    if (qd > wide) wide = qd;
    c->tmp = en_backend_alloc(be, B * wide * sizeof(float));
    if (m->lora) {
        c->lora_u = en_backend_alloc(be, B * (size_t)en_lora_get_config(m->lora)->rank *
                                             sizeof(float));
    }
    c->pos = en_malloc(B * sizeof(int32_t));
    if (m->tp_size > 1) {
        c->ids_local = en_malloc(B * sizeof(int32_t));
        c->lg_local = en_backend_alloc(be, B * (size_t)hl->n_vocab * sizeof(float));
        c->lg_gather =
            en_backend_alloc(be, B * (size_t)hl->n_vocab * (size_t)m->tp_size * sizeof(float));
        c->rows = en_malloc(B * sizeof(int32_t));
        for (size_t r = 0; c->rows && r < B; r++) c->rows[r] = (int32_t)r;
    }
    c->logits = en_backend_alloc(be, B * (size_t)hp->n_vocab * sizeof(float));
    c->nll = en_backend_alloc(be, B * sizeof(float));
    c->nll_h = en_malloc(B * sizeof(float));
    if (!c->k_cache || !c->v_cache || !c->x || !c->xn || !c->q || !c->att || !c->gate || !c->up ||
        !c->pos || !c->logits || !c->nll || !c->nll_h || !c->tmp || (m->lora && !c->lora_u) ||
        (m->tp_size > 1 && (!c->ids_local || !c->lg_local || !c->lg_gather || !c->rows))) {
        en_ctx_destroy(c);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory for a context of %d tokens (%zu MiB KV)",
                      d.n_ctx, 2 * cache >> 20);
    }
    *out = c;
    return EN_OK;
}

void en_ctx_destroy(en_ctx *c) {
    if (!c) return;
    en_backend *be = c->m->be;
    en_backend_free(be, c->k_cache);
    en_backend_free(be, c->v_cache);
    en_backend_free(be, c->x);
    en_backend_free(be, c->xn);
    en_backend_free(be, c->q);
    en_backend_free(be, c->att);
    en_backend_free(be, c->gate);
    en_backend_free(be, c->up);
    en_backend_free(be, c->tmp);
    en_backend_free(be, c->lora_u);
    en_free(c->pos);
    en_free(c->ids_local);
    en_backend_free(be, c->lg_local);
    en_backend_free(be, c->lg_gather);
    en_free(c->rows);
    en_backend_free(be, c->logits);
    en_backend_free(be, c->nll);
    en_free(c->nll_h);
    en_free(c);
}

void en_ctx_reset(en_ctx *c) { c->n_past = 0; }
int en_ctx_n_past(const en_ctx *c) { return c->n_past; }
int en_ctx_n_ctx(const en_ctx *c) { return c->n_ctx; }

en_status en_model_forward(en_ctx *c, const int32_t *ids, int n, float *logits, int all_logits,
                           en_err *err) {
    const en_model_hparams *hp = &c->m->hp;
    if (n < 0) return EN_ERR(err, EN_ERR_ARG, "negative token count");
    if (n == 0) return EN_OK;
    if ((int64_t)c->n_past + n > c->n_ctx)
        return EN_ERR(err, EN_ERR_ARG,
                      "%d tokens do not fit the context: %d already cached, capacity %d",
                      n, c->n_past, c->n_ctx);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= hp->n_vocab)
            return EN_ERR(err, EN_ERR_ARG, "token id %d at index %d is outside [0, %d)", ids[i],
                          i, hp->n_vocab);
    for (int done = 0; done < n; done += c->n_batch) {
        int chunk = n - done < c->n_batch ? n - done : c->n_batch;
        int last = done + chunk == n;
        int want = !logits ? 0 : all_logits ? 2 : last;
        float *host = want == 2 ? logits + (size_t)done * hp->n_vocab : want ? logits : NULL;
        en_forward_chunk(c, ids + done, chunk, want, host);
    }
    return EN_OK;
}

en_status en_model_score(en_ctx *c, const int32_t *ids, int n, double *nll_sum, int *n_scored,
                         en_err *err) {
    *nll_sum = 0;
    *n_scored = 0;
    en_ctx_reset(c);
    if (n < 2) return EN_OK;
    const int V = c->m->hp.n_vocab;
    if (n > c->n_ctx)
        return EN_ERR(err, EN_ERR_ARG, "sequence of %d tokens exceeds the context %d", n,
                      c->n_ctx);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return EN_ERR(err, EN_ERR_ARG, "token id %d at index %d is outside [0, %d)", ids[i],
                          i, V);
    double sum = 0;
    /* Tokens [0, n-1) are inputs; token t+1 is the target of input t. */
    for (int done = 0; done < n - 1; done += c->n_batch) {
        int chunk = (n - 1) - done < c->n_batch ? (n - 1) - done : c->n_batch;
        /* checked above: ids in range, n <= n_ctx, chunk <= n_batch */
        en_forward_chunk(c, ids + done, chunk, 2, NULL);
        en_op_cross_entropy(c->m->be, c->nll, c->logits, ids + done + 1, chunk, V);
        en_backend_download(c->m->be, c->nll_h, c->nll, (size_t)chunk * sizeof(float));
        for (int t = 0; t < chunk; t++) sum += c->nll_h[t];
    }
    *nll_sum = sum;
    *n_scored = n - 1;
    return EN_OK;
}

en_status en_model_set_lora(en_model *m, const en_lora *l, en_err *err) {
    if (l) {
        /* The adapter must have been made for this model's shapes. */
        const en_lora_pair *p = NULL;
        for (int layer = 0; layer < m->hp.n_layer && !p; layer++)
            for (int t = 0; t < EN_LORA_N_TARGETS && !p; t++) p = en_lora_get(l, layer, t);
        if (!p) return EN_ERR(err, EN_ERR_ARG, "the adapter adapts nothing");
    }
    m->lora = l;
    return EN_OK;
}

const en_lora *en_model_get_lora(const en_model *m) { return m->lora; }
