/*
 * rope.c - rotary position embedding for every rope_scaling type. Each
 * type is a table of n_rot/2 inverse frequencies plus an attention factor
 * on cos/sin (en_op_rope_freq applies it), computed here on the host the
 * way Hugging Face transformers' modeling_rope_utils.py defines it:
 *
 *   default   inv[i] = theta^(-2i/d)                        (d = n_rot)
 *   linear    inv[i] / factor
 *   dynamic   theta' = theta (factor L/max - (factor-1))^(d/(d-2)) when the
 *             sequence length L exceeds max_position_embeddings
 *   llama3    wavelengths above orig/low_freq_factor divided by factor,
 *             below orig/high_freq_factor kept, smoothed in between
 *   yarn      interpolation and extrapolation mixed by a linear ramp over
 *             the correction range of beta_fast..beta_slow rotations;
 *             attention factor 0.1 ln(factor) + 1
 *   longrope  inv[i] / ext[i], ext = long_factor when L > orig else
 *             short_factor; attention factor sqrt(1 + ln f / ln orig)
 *
 * The tables live in backend buffers owned by the model (en_rope_init);
 * dynamic and longrope pick theirs per forward call from the longest
 * position it covers.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "family.h"

static const char *const k_types[] = {"default", "linear", "dynamic", "llama3", "yarn",
                                      "longrope"};

static en_status num_field(json_t *o, const char *key, const char *path, const char *where,
                           double def, double *out, int required, en_err *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return EN_ERR(err, EN_ERR_FORMAT, "%s: %s needs field '%s'", path, where, key);
        *out = def;
        return EN_OK;
    }
    if (!json_is_number(v))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: %s field '%s' must be a number", path, where, key);
    *out = json_number_value(v);
    return EN_OK;
}

static en_status factors_field(json_t *o, const char *key, const char *path, int n, float *out,
                               en_err *err) {
    json_t *v = json_object_get(o, key);
    if (!json_is_array(v) || (int)json_array_size(v) != n)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: rope_scaling 'longrope' needs '%s', a list of %d numbers (head_dim / 2)",
                      path, key, n);
    for (int i = 0; i < n; i++) {
        json_t *e = json_array_get(v, (size_t)i);
        out[i] = json_is_number(e) ? (float)json_number_value(e) : 0;
        if (!(out[i] > 0))
            return EN_ERR(err, EN_ERR_FORMAT, "%s: rope_scaling '%s'[%d] must be a positive number",
                          path, key, i);
    }
    return EN_OK;
}

/* One rope dict (rope_parameters, one of its per-layer-type entries, or
 * rope_scaling; NULL: none) over the top-level fields of root. */
static en_status parse_one(json_t *root, json_t *d, const char *path, const en_model_hparams *hp,
                           double theta_def, en_rope_params *r, en_err *err) {
    memset(r, 0, sizeof *r);
    double theta = theta_def, prf = 1.0, v;
    if (d) EN_TRY(num_field(d, "rope_theta", path, "rope_parameters", theta, &theta, 0, err));
    EN_TRY(num_field(root, "partial_rotary_factor", path, "config", 1.0, &prf, 0, err));
    if (d) EN_TRY(num_field(d, "partial_rotary_factor", path, "rope_parameters", prf, &prf, 0, err));
    if (!(theta > 0) || !(prf > 0) || prf > 1)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: rope_theta must be positive and partial_rotary_factor in (0, 1]", path);
    r->theta = (float)theta;
    if (!(r->theta > 0))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: rope_theta %g rounds to 0 as a float32", path,
                      theta);
    r->n_rot = (int)(hp->head_dim * prf);
    r->n_rot -= r->n_rot % 2;
    if (r->n_rot < 2)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: partial_rotary_factor %g leaves no rotary dims",
                      path, prf);
    json_t *t = d ? json_object_get(d, "rope_type") : NULL;
    if (!t && d) t = json_object_get(d, "type");
    const char *tn = json_is_string(t) ? json_string_value(t) : "default";
    r->type = -1;
    for (int i = 0; i < (int)(sizeof k_types / sizeof k_types[0]); i++)
        if (strcmp(tn, k_types[i]) == 0) r->type = i;
    if (strcmp(tn, "su") == 0) r->type = EN_ROPE_LONGROPE; /* Phi-3's early name */
    if (r->type < 0)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "%s: rope_scaling type '%s' is not supported (supported: default, linear, "
                      "dynamic, llama3, yarn, longrope)",
                      path, tn);
    if (r->type == EN_ROPE_DEFAULT) return EN_OK;
    /* original_max_position_embeddings: top level first (Phi-3), then the dict */
    double orig = hp->max_pos;
    EN_TRY(num_field(d, "original_max_position_embeddings", path, "rope_scaling", orig, &orig, 0,
                     err));
    EN_TRY(num_field(root, "original_max_position_embeddings", path, "config", orig, &orig, 0,
                     err));
    if (!(orig >= 1) || orig > (1 << 30))
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: original_max_position_embeddings %g must be in [1, 2^30]", path, orig);
    r->orig_max = (int)orig;
    if (r->type == EN_ROPE_DYNAMIC) r->orig_max = hp->max_pos; /* its scale is the config's */
    int need_factor = r->type != EN_ROPE_YARN && r->type != EN_ROPE_LONGROPE;
    double factor;
    EN_TRY(num_field(d, "factor", path, "rope_scaling", 0, &factor, need_factor, err));
    if (factor == 0 && !need_factor) factor = (double)hp->max_pos / r->orig_max;
    r->factor = (float)factor; /* checked as float32: 1e-50 would round to 0 */
    if (!(r->factor > 0) || r->orig_max <= 0)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: rope_scaling factor and original_max_position_embeddings must be positive",
                      path);
    if (r->type == EN_ROPE_LLAMA3) {
        EN_TRY(num_field(d, "low_freq_factor", path, "rope_scaling 'llama3'", 0, &v, 1, err));
        r->low_freq_factor = (float)v;
        EN_TRY(num_field(d, "high_freq_factor", path, "rope_scaling 'llama3'", 0, &v, 1, err));
        r->high_freq_factor = (float)v;
        if (!(r->high_freq_factor > r->low_freq_factor) || !(r->low_freq_factor > 0))
            return EN_ERR(err, EN_ERR_FORMAT,
                          "%s: rope_scaling 'llama3' needs 0 < low_freq_factor < high_freq_factor",
                          path);
    }
    double af = 0;
    EN_TRY(num_field(d, "attention_factor", path, "rope_scaling", 0, &af, 0, err));
    if (r->type == EN_ROPE_YARN) {
        double bf, bs, ms, msa;
        EN_TRY(num_field(d, "beta_fast", path, "rope_scaling", 32, &bf, 0, err));
        EN_TRY(num_field(d, "beta_slow", path, "rope_scaling", 1, &bs, 0, err));
        EN_TRY(num_field(d, "mscale", path, "rope_scaling", 0, &ms, 0, err));
        EN_TRY(num_field(d, "mscale_all_dim", path, "rope_scaling", 0, &msa, 0, err));
        r->beta_fast = (float)(bf ? bf : 32);
        r->beta_slow = (float)(bs ? bs : 1);
        json_t *tr = json_object_get(d, "truncate");
        r->truncate = !json_is_false(tr);
#define YARN_MSCALE(s, m) ((s) <= 1 ? 1.0 : 0.1 * (m) * log(s) + 1.0)
        if (af == 0)
            af = ms != 0 && msa != 0 ? YARN_MSCALE(factor, ms) / YARN_MSCALE(factor, msa)
                                     : YARN_MSCALE(factor, 1);
#undef YARN_MSCALE
    }
    if (r->type == EN_ROPE_LONGROPE) {
        r->n_factors = r->n_rot / 2;
        if (r->n_factors > EN_ROPE_MAX_FACTORS)
            return EN_ERR(err, EN_ERR_UNSUPPORTED, "%s: head_dim %d is too large for longrope",
                          path, hp->head_dim);
        EN_TRY(factors_field(d, "short_factor", path, r->n_factors, r->short_factor, err));
        EN_TRY(factors_field(d, "long_factor", path, r->n_factors, r->long_factor, err));
        if (af == 0) af = factor <= 1 ? 1.0 : sqrt(1 + log(factor) / log((double)r->orig_max));
    }
    r->attn_factor = (float)(af ? af : 1.0);
    return EN_OK;
}

en_status en_rope_parse(json_t *root, const char *path, en_model_hparams *hp, en_err *err) {
    double theta;
    EN_TRY(en_cfg_num(root, "rope_theta", path, 10000.0, &theta, err));
    json_t *rp = json_object_get(root, "rope_parameters");
    if (rp && !json_is_null(rp) && !json_is_object(rp))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: field 'rope_parameters' must be an object", path);
    json_t *rs = json_object_get(root, "rope_scaling");
    if (rs && !json_is_null(rs) && !json_is_object(rs))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: field 'rope_scaling' must be an object", path);
    if (json_is_null(rp)) rp = NULL;
    if (json_is_null(rs)) rs = NULL;
    /* transformers >= 5 nests the parameters per layer type (Gemma 3) */
    json_t *full = rp ? json_object_get(rp, "full_attention") : NULL;
    json_t *slide = rp ? json_object_get(rp, "sliding_attention") : NULL;
    hp->has_rope_local = 0;
    if (json_is_object(full) || json_is_object(slide)) {
        if (json_is_object(full))
            EN_TRY(parse_one(root, full, path, hp, theta, &hp->rope, err));
        else
            EN_TRY(parse_one(root, NULL, path, hp, theta, &hp->rope, err));
        if (json_is_object(slide)) {
            EN_TRY(parse_one(root, slide, path, hp, theta, &hp->rope_local, err));
            hp->has_rope_local = 1;
        }
    } else {
        EN_TRY(parse_one(root, rp ? rp : rs, path, hp, theta, &hp->rope, err));
        /* an old-style rope_scaling beside rope_parameters */
        if (rp && rs && hp->rope.type == EN_ROPE_DEFAULT) {
            float th = hp->rope.theta;
            EN_TRY(parse_one(root, rs, path, hp, th, &hp->rope, err));
        }
    }
    hp->rope_theta = hp->rope.theta;
    /* Scaling that extends the context: dynamic NTK by its factor, YaRN to
     * factor x the original length (as vLLM reads them). */
    const en_rope_params *r = &hp->rope;
    double ext = r->type == EN_ROPE_DYNAMIC || r->type == EN_ROPE_YARN
                     ? (double)r->orig_max * r->factor
                     : 0;
    if (ext > hp->max_pos && ext < (1 << 30)) hp->max_pos = (int)ext;
    return EN_OK;
}

void en_rope_table(const en_rope_params *r, int max_pos, int seq_len, float *inv_freq,
                   float *mscale) {
    const int d = r->n_rot, n = d / 2;
    double base = r->theta;
    (void)max_pos;
    if (r->type == EN_ROPE_DYNAMIC && seq_len > r->orig_max) {
        double f = r->factor;
        base *= pow(f * seq_len / r->orig_max - (f - 1), (double)d / (d - 2));
    }
    *mscale = r->type == EN_ROPE_YARN || r->type == EN_ROPE_LONGROPE ? r->attn_factor : 1.0f;
    double low = 0, high = 0;
    if (r->type == EN_ROPE_YARN) { /* the correction range, in dims */
        const double two_pi = 2 * M_PI;
        low = d * log(r->orig_max / (r->beta_fast * two_pi)) / (2 * log(base));
        high = d * log(r->orig_max / (r->beta_slow * two_pi)) / (2 * log(base));
        if (r->truncate) {
            low = floor(low);
            high = ceil(high);
        }
        if (low < 0) low = 0;
        if (high > d - 1) high = d - 1;
        if (low == high) high += 0.001;
    }
    for (int i = 0; i < n; i++) {
        double inv = 1.0 / pow(base, 2.0 * i / d);
        switch (r->type) {
        case EN_ROPE_LINEAR: inv /= r->factor; break;
        case EN_ROPE_LLAMA3: {
            double wl = 2 * M_PI / inv;
            double low_wl = r->orig_max / r->low_freq_factor;
            double high_wl = r->orig_max / r->high_freq_factor;
            if (wl > low_wl) {
                inv /= r->factor;
            } else if (wl >= high_wl) {
                double sf = (r->orig_max / wl - r->low_freq_factor) /
                            (r->high_freq_factor - r->low_freq_factor);
                inv = (1 - sf) * inv / r->factor + sf * inv;
            }
            break;
        }
        case EN_ROPE_YARN: {
            double ramp = (i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extra = 1 - ramp; /* share of the extrapolated (unscaled) frequency */
            inv = inv / r->factor * (1 - extra) + inv * extra;
            break;
        }
        case EN_ROPE_LONGROPE:
            inv /= seq_len > r->orig_max ? r->long_factor[i] : r->short_factor[i];
            break;
        default: break;
        }
        inv_freq[i] = (float)inv;
    }
}

/* ---- the model's tables ---- */

/* One rope configuration's tables: the fixed one, and for dynamic and
 * longrope the one of the current sequence length (recomputed when it
 * changes). */
typedef struct rope_rt {
    const en_rope_params *p;
    float *fixed;     /* (n_rot / 2) backend buffer */
    float fixed_scale;
    float *cur;       /* (n_rot / 2) backend buffer: the seq-len-dependent table */
    float cur_scale;
    int cur_len;      /* which table cur holds (-1: none) */
    float *host;      /* (n_rot / 2) staging */
} rope_rt;

struct en_rope_rt {
    rope_rt r[2]; /* global (or every) layer, local layers */
};

static int seq_dependent(const en_rope_params *p) {
    return p->type == EN_ROPE_DYNAMIC || p->type == EN_ROPE_LONGROPE;
}

en_status en_rope_init(en_model *m, en_err *err) {
    m->rope = en_calloc(1, sizeof *m->rope);
    if (!m->rope) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    for (int k = 0; k < 2; k++) {
        rope_rt *r = &m->rope->r[k];
        r->p = k == 0 || !m->hp.has_rope_local ? &m->hp.rope : &m->hp.rope_local;
        size_t bytes = (size_t)(r->p->n_rot / 2) * sizeof(float);
        r->fixed = en_backend_alloc(m->be, bytes);
        r->cur = en_backend_alloc(m->be, bytes);
        r->host = en_malloc(bytes);
        if (!r->fixed || !r->cur || !r->host) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        r->cur_len = -1;
        en_rope_table(r->p, m->hp.max_pos, 0, r->host, &r->fixed_scale);
        en_backend_upload(m->be, r->fixed, r->host, bytes);
    }
    return EN_OK;
}

void en_rope_destroy(en_model *m) {
    if (!m->rope) return;
    for (int k = 0; k < 2; k++) {
        en_backend_free(m->be, m->rope->r[k].fixed);
        en_backend_free(m->be, m->rope->r[k].cur);
        en_free(m->rope->r[k].host);
    }
    en_free(m->rope);
    m->rope = NULL;
}

/* The table for layer l over a call whose longest position is seq_len - 1. */
static const float *table(const en_model *m, int l, int seq_len, float *mscale, int *n_rot) {
    rope_rt *r = &m->rope->r[m->hp.has_rope_local && m->hp.layer_swa[l] ? 1 : 0];
    *n_rot = r->p->n_rot;
    if (!seq_dependent(r->p)) {
        *mscale = r->fixed_scale;
        return r->fixed;
    }
    /* dynamic: unchanged up to max_position_embeddings; longrope: two tables */
    int key = seq_len;
    if (r->p->type == EN_ROPE_DYNAMIC && seq_len <= r->p->orig_max) key = 0;
    if (r->p->type == EN_ROPE_LONGROPE) key = seq_len > r->p->orig_max ? 2 : 1;
    if (r->cur_len != key) {
        en_rope_table(r->p, m->hp.max_pos, key == 1 ? 0 : seq_len, r->host, &r->cur_scale);
        en_backend_upload(m->be, r->cur, r->host, (size_t)(r->p->n_rot / 2) * sizeof(float));
        r->cur_len = key;
    }
    *mscale = r->cur_scale;
    return r->cur;
}

void en_rope_fwd(const en_model *m, int l, float *x, const int32_t *pos, int n, int H,
                 size_t row_stride, int seq_len) {
    float ms;
    int n_rot;
    const float *inv = table(m, l, seq_len, &ms, &n_rot);
    en_op_rope_freq(m->be, x, pos, n, H, m->hp.head_dim, row_stride, inv, n_rot, ms);
}

void en_rope_bwd(const en_model *m, int l, float *dx, const int32_t *pos, int n, int H,
                 size_t row_stride, int seq_len) {
    float ms;
    int n_rot;
    const float *inv = table(m, l, seq_len, &ms, &n_rot);
    en_op_rope_freq_bwd(m->be, dx, pos, n, H, m->hp.head_dim, row_stride, inv, n_rot, ms);
}

int en_rope_seq_dependent(const en_model *m) {
    return seq_dependent(&m->hp.rope) || (m->hp.has_rope_local && seq_dependent(&m->hp.rope_local));
}
