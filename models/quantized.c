/*
 * quantized.c - block-quantised weight matrices in the model (the formats
 * and kernels are common/quant.h's): which tensors are held quantised, the
 * lookup from a weight's address to its format that the layers use
 * (en_model_qfmt), the quantised copy of a tied output matrix, and the
 * `quantization_config` of a directory written by `energon quantize`
 * (docs/quantization.md).
 *
 * What is quantised: with --weights q8 / q4 every matrix but the
 * embeddings (token and learned positions stay float32: a lookup reads one
 * row, so its bytes do not matter to speed, and its error would reach every
 * token), the output projection at its own format (default q8: the logits
 * are the most sensitive product). Matrices whose input width is not a
 * multiple of the block stay float32. With --weights auto a checkpoint's
 * quantised tensors (a GGUF file's, or a quantised directory's) are kept as
 * they are, when the backend has the kernels.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../common/file.h"
#include "../common/quant.h"
#include "model_impl.h"

static const en_qref *find_qref(const en_model *m, const void *w) {
    int lo = 0, hi = m->n_qrefs - 1;
    const uintptr_t p = (uintptr_t)w;
    while (lo <= hi) {
        const int mid = lo + (hi - lo) / 2;
        const uintptr_t q = (uintptr_t)m->qrefs[mid].p;
        if (q == p) return &m->qrefs[mid];
        if (q < p)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

int en_model_qfmt(const en_model *m, const void *w) {
    const en_qref *r = find_qref(m, w);
    return r ? r->fmt : 0;
}

int en_model_w16type(const en_model *m, const void *w) {
    const en_qref *r = m->n_qrefs ? find_qref(m, w) : NULL;
    return m->wtype | (r && r->w16x8 ? EN_WTYPE_X8 : 0);
}

static int weights_fmt(int weights) {
    return weights == EN_WEIGHTS_Q8     ? EN_QUANT_Q8
           : weights == EN_WEIGHTS_Q4   ? EN_QUANT_Q4
           : weights == EN_WEIGHTS_Q4_1 ? EN_QUANT_Q4_1
                                        : 0;
}

int en_model_out_qfmt(int weights, int output) {
    if (!weights_fmt(weights)) return 0;
    return output == EN_WEIGHTS_AUTO ? EN_QUANT_Q8 : weights_fmt(output);
}

int en_model_choose_qfmt(const en_model *m, const en_param_spec *sp, int weights, int output,
                         int src_fmt) {
    if (sp->n_dims != 2) return 0;
    int f;
    if (weights == EN_WEIGHTS_AUTO) {
        f = src_fmt;
    } else {
        if (sp->slot == &m->w.tok_embd || sp->slot == &m->w.pos_embd) return 0;
        f = sp->slot == &m->w.lm_head ? en_model_out_qfmt(weights, output) : weights_fmt(weights);
    }
    return f && en_quant_row_size((en_quant_fmt)f, (int)sp->shape[1]) ? f : 0;
}

static int qref_cmp(const void *a, const void *b) {
    const uintptr_t x = (uintptr_t)((const en_qref *)a)->p, y = (uintptr_t)((const en_qref *)b)->p;
    return x < y ? -1 : x > y;
}

/* A quantised copy of the tied output matrix (the embedding, float32). */
static en_status tied_output(en_model *m, int fmt, en_err *err) {
    const int V = m->hl.n_vocab, C = m->hl.n_embd;
    const size_t rs = en_quant_row_size((en_quant_fmt)fmt, C);
    if (!rs) return EN_OK; /* C not a multiple of the block: stays float32 */
    const size_t nf = (size_t)V * (size_t)C;
    float *host = en_backend_host_memory(m->be) ? NULL : en_malloc(nf * sizeof(float));
    uint8_t *hq = en_malloc((size_t)V * rs);
    m->lm_head_q = en_backend_alloc(m->be, (size_t)V * rs);
    if ((!host && !en_backend_host_memory(m->be)) || !hq || !m->lm_head_q) {
        en_free(host);
        en_free(hq);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory for the quantised output matrix");
    }
    const float *src = m->w.tok_embd;
    if (host) {
        en_backend_download(m->be, host, m->w.tok_embd, nf * sizeof(float));
        src = host;
    }
    en_status s = en_quantize_rows((en_quant_fmt)fmt, hq, src, V, C);
    if (s == EN_OK && en_quant_x4_ok((en_quant_fmt)fmt, V) &&
        en_quant_interleave((en_quant_fmt)fmt, hq, V, C) == EN_OK)
        m->lm_head_qfmt = fmt | EN_QUANT_X4;
    else
        m->lm_head_qfmt = fmt;
    if (s == EN_OK) {
        en_backend_upload(m->be, m->lm_head_q, hq, (size_t)V * rs);
        m->w.lm_head = m->lm_head_q;
    } else {
        s = EN_ERR(err, s, "quantising the output matrix failed");
    }
    en_free(host);
    en_free(hq);
    return s;
}

en_status en_model_quant_finish(en_model *m, int output, en_err *err) {
    int n = 0;
    for (int i = 0; i < m->n_specs; i++) n += m->specs[i].qfmt != 0 || m->specs[i].w16x8;
    if (m->hp.tie_embeddings && output && !en_model_qfmt(m, m->w.tok_embd) && !m->wtype) {
        int embd_q = 0;
        for (int i = 0; i < m->n_specs; i++)
            if (m->specs[i].slot == &m->w.tok_embd) embd_q = m->specs[i].qfmt;
        if (!embd_q) EN_TRY(tied_output(m, output, err));
    }
    m->qrefs = en_calloc((size_t)n + 1, sizeof *m->qrefs);
    if (!m->qrefs) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    int k = 0;
    for (int i = 0; i < m->n_specs; i++)
        if (m->specs[i].qfmt) {
            m->qrefs[k].p = m->paramsq + m->specs[i].offset;
            m->qrefs[k++].fmt = m->specs[i].qfmt;
        } else if (m->specs[i].w16x8) {
            m->qrefs[k].p = m->params16 + m->specs[i].offset;
            m->qrefs[k++].w16x8 = 1;
        }
    if (m->lm_head_q) {
        m->qrefs[k].p = m->lm_head_q;
        m->qrefs[k++].fmt = m->lm_head_qfmt;
    }
    qsort(m->qrefs, (size_t)k, sizeof *m->qrefs, qref_cmp);
    m->n_qrefs = k;
    return EN_OK;
}

void en_model_quant_destroy(en_model *m) {
    if (m->paramsq) en_backend_free(m->be, m->paramsq);
    if (m->lm_head_q) en_backend_free(m->be, m->lm_head_q);
    en_free(m->qrefs);
    m->paramsq = NULL;
    m->lm_head_q = NULL;
    m->qrefs = NULL;
    m->n_qrefs = 0;
}

const char *en_model_quant_name(const en_model *m) {
    int f = 0, mixed = 0;
    for (int i = 0; i < m->n_specs; i++) {
        const int q = en_quant_base((en_quant_fmt)m->specs[i].qfmt);
        if (!q || (m->specs[i].slot == &m->w.lm_head)) continue;
        if (f && q != f) mixed = 1;
        f = q;
    }
    return mixed ? "mixed" : f ? en_quant_name((en_quant_fmt)f) : NULL;
}

/* ---- writing a quantised directory (`energon quantize`) ---- */

/* Whether spec sp is written as quantised blocks. A Conv1D matrix (GPT-2,
 * stored (in, out) in its checkpoints) is written float32 instead: its
 * blocks run along the model's (out, in) rows, which the loader's
 * transposing path for that checkpoint layout does not expect. */
static int file_quantised(const en_param_spec *sp) {
    return sp->qfmt && !(sp->flags & EN_PARAM_TRANSPOSED);
}

/* The bytes of one quantised file tensor: the blocks of a fused tensor
 * (consecutive specs naming the same src) concatenated in order, or spec
 * i's own. *rows: its rows; *next: the spec after it. en_malloc'd. */
static uint8_t *file_bytes(const en_model *m, const uint8_t *hq, int i, int64_t *rows,
                           size_t *rs, int *next) {
    const en_param_spec *sp = &m->specs[i];
    *rs = en_quant_row_size((en_quant_fmt)sp->qfmt, (int)sp->shape[1]);
    int j = i + 1;
    int64_t r = sp->shape[0];
    while (sp->src[0] && j < m->n_specs && strcmp(m->specs[j].src, sp->src) == 0 &&
           en_quant_base((en_quant_fmt)m->specs[j].qfmt) == en_quant_base((en_quant_fmt)sp->qfmt) &&
           m->specs[j].shape[1] == sp->shape[1])
        r += m->specs[j++].shape[0];
    uint8_t *buf = en_malloc((size_t)r * *rs);
    if (!buf) return NULL;
    size_t at = 0;
    for (int k = i; k < j; k++) { /* files hold the plain layout */
        const en_param_spec *sk = &m->specs[k];
        const size_t nb = (size_t)sk->shape[0] * *rs;
        if ((int)en_quant_base((en_quant_fmt)sk->qfmt) != sk->qfmt)
            en_quant_deinterleave((en_quant_fmt)sk->qfmt, buf + at, hq + sk->offset,
                                  (int)sk->shape[0], (int)sk->shape[1]);
        else
            memcpy(buf + at, hq + sk->offset, nb);
        at += nb;
    }
    *rows = r;
    *next = j;
    return buf;
}

/* config.json with quantization_config added (en_malloc'd text). */
static char *quant_config_text(const en_model *m, const char *fmt_name) {
    const int out_fmt = en_model_qfmt(m, m->w.lm_head);
    json_error_t jerr;
    json_t *root = json_loadb(m->config_text, m->config_len, 0, &jerr);
    if (!root) return NULL;
    json_t *qc = json_object(), *tf = json_object();
    json_object_set_new(qc, "quant_method", json_string("energon"));
    json_object_set_new(qc, "format", json_string(fmt_name));
    json_object_set_new(qc, "output_format",
                        json_string(out_fmt ? en_quant_name((en_quant_fmt)out_fmt) : "f32"));
    json_object_set_new(qc, "block_size", json_integer(EN_QUANT_BLOCK));
    json_object_set_new(qc, "layout", json_string("docs/quantization.md"));
    for (int i = 0; i < m->n_specs; i++) {
        const en_param_spec *sp = &m->specs[i];
        if (file_quantised(sp))
            json_object_set_new(tf, sp->src[0] ? sp->src : sp->name,
                                json_string(en_quant_name((en_quant_fmt)sp->qfmt)));
    }
    json_object_set_new(qc, "tensor_formats", tf);
    json_object_set_new(root, "quantization_config", qc);
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!s) return NULL;
    /* bound: "%s\n" is strlen(s) + 1 bytes and the NUL */
    char *out = en_malloc(strlen(s) + 2);
    if (out) snprintf(out, strlen(s) + 2, "%s\n", s);
    free(s);
    return out;
}

en_status en_model_save_quantized(const en_model *m, const char *dir, en_err *err) {
    /* float32 tensors: a host copy laid out without the quantised ones */
    en_param_spec *fs = en_malloc((size_t)m->n_specs * sizeof *fs);
    size_t total = 0;
    int nf = 0, nq = 0;
    for (int i = 0; fs && i < m->n_specs; i++) {
        if (file_quantised(&m->specs[i])) {
            nq++;
            continue;
        }
        fs[nf] = m->specs[i];
        fs[nf].offset = total;
        total += m->specs[i].n_elem;
        nf++;
    }
    float *host = fs ? en_malloc((total ? total : 1) * sizeof(float)) : NULL;
    uint8_t *hq = en_malloc(m->n_paramsq ? m->n_paramsq : 1);
    en_st_writer_item *items = NULL, *all = NULL;
    float *scratch = NULL;
    uint8_t **bufs = en_calloc((size_t)nq + 1, sizeof *bufs);
    char *st = en_path_join(dir, "model.safetensors"), *cfg = en_path_join(dir, "config.json");
    char *cfg_text = quant_config_text(m, en_model_quant_name(m));
    en_status s = EN_OK;
    if (!host || !hq || !bufs || !st || !cfg || !cfg_text) {
        s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (m->n_paramsq) en_backend_download(m->be, hq, m->paramsq, m->n_paramsq);
    for (int i = 0, k = 0; i < m->n_specs; i++) {
        const en_param_spec *sp = &m->specs[i];
        if (file_quantised(sp)) continue;
        float *h = host + fs[k++].offset;
        if (sp->qfmt) /* a Conv1D matrix: the values its blocks stand for */
            en_dequantize_rows((en_quant_fmt)sp->qfmt, h, hq + sp->offset, (int)sp->shape[0],
                               (int)sp->shape[1]);
        else
            en_backend_download(m->be, h, m->params + sp->offset, sp->n_elem * sizeof(float));
    }
    int n = en_model_file_items(fs, nf, host, &items, &scratch);
    all = n < 0 ? NULL : en_calloc((size_t)(n + nq + 1), sizeof *all);
    if (!all) {
        s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        goto done;
    }
    memcpy(all, items, (size_t)n * sizeof *all);
    int nb = 0;
    for (int i = 0; i < m->n_specs;) {
        const en_param_spec *sp = &m->specs[i];
        if (!file_quantised(sp)) {
            i++;
            continue;
        }
        int64_t rows;
        size_t rs;
        bufs[nb] = file_bytes(m, hq, i, &rows, &rs, &i);
        if (!bufs[nb]) {
            s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
            goto done;
        }
        en_st_writer_item *it = &all[n++];
        it->name = sp->src[0] ? sp->src : sp->name;
        it->dtype = EN_DTYPE_U8;
        it->n_dims = 2;
        it->shape[0] = rows;
        it->shape[1] = (int64_t)rs;
        it->data = bufs[nb++];
    }
    s = en_mkdir_p(dir, err);
    if (s == EN_OK) s = en_st_write(st, all, n, EN_DTYPE_F32, err);
    if (s == EN_OK) s = en_file_write_atomic(cfg, cfg_text, strlen(cfg_text), err);
done:
    for (int i = 0; bufs && i < nq; i++) en_free(bufs[i]);
    en_free(bufs);
    en_free(all);
    en_free(items);
    en_free(scratch);
    en_free(host);
    en_free(hq);
    en_free(fs);
    en_free(st);
    en_free(cfg);
    en_free(cfg_text);
    return s;
}
