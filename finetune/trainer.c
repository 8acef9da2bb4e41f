/*
 * trainer.c - the fine-tuning loop. See trainer.h for the run directory.
 *
 * One optimizer step = `accum` micro-batches of `batch` windows, with
 * accum = ceil(batch_tokens / (batch * seq_len)). The loss of a step is the
 * mean negative log-likelihood over every trained token of the step, and
 * its gradient is exact for that mean (en_train_fwd_bwd scales by 1/N with
 * N counted before the backward passes). Windows are taken in the
 * deterministic order of en_dataset_order(seed, epoch); the cursor into
 * that order is part of the checkpoint, so a resumed run sees exactly the
 * windows the uninterrupted run would have, and with a fixed thread count
 * reproduces its losses bit for bit.
 */
#include "trainer.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../common/backend.h"
#include "../common/file.h"
#include "../common/safetensors.h"
#include "../models/convert.h"
#include "../models/lora.h"
#include "../models/model.h"
#include "../models/optim.h"
#include "../models/parallel.h"
#include "../models/train.h"
#include "../models/whole.h"
#include "checkpoint.h"
#include "ground_data.h"
#include "report.h"
#include "run_dir.h"

#define STATE_MAGIC "energon-trainer-state"
#define STATE_VERSION 1

en_finetune_config en_finetune_config_default(void) {
    en_finetune_config c;
    memset(&c, 0, sizeof c);
    c.val_fraction = 0.0;
    c.seed = 1;
    c.batch = 4;
    c.batch_tokens = 0;
    c.epochs = 1;
    c.retrieval_top_k = 3;
    c.lr = 3e-4f;
    c.min_lr_ratio = 0.1f;
    c.weight_decay = 0.0f;
    c.beta1 = 0.9f;
    c.beta2 = 0.999f;
    c.eps = 1e-8f;
    c.grad_clip = 1.0f;
    c.warmup = 0;
    c.lora_alpha = 16.0f;
    c.lora_targets = EN_LORA_Q | EN_LORA_K | EN_LORA_V | EN_LORA_O;
    c.eval_every = 50;
    c.eval_batches = 0;
    c.save_every = 100;
    c.keep = 2;
    c.log_every = 10;
    c.data_cfg = en_data_config_default();
    c.data_cfg.seq_len = 256;
    return c;
}

/* ---- run.json: the configuration of a run ---- */

static json_t *str_array(const char *const *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_string(v[i]));
    return a;
}

static en_status config_save(const en_finetune_config *c, en_err *err) {
    json_t *r = json_object();
    json_object_set_new(r, "magic", json_string("energon-run"));
    json_object_set_new(r, "version", json_integer(1));
    json_object_set_new(r, "model", json_string(c->model_dir));
    json_object_set_new(r, "data", str_array(c->data, c->n_data));
    json_object_set_new(r, "val_data", str_array(c->val_data, c->n_val_data));
    json_object_set_new(r, "val_fraction", json_real(c->val_fraction));
    json_object_set_new(r, "seed", json_integer((json_int_t)c->seed));
    json_object_set_new(r, "seq_len", json_integer(c->data_cfg.seq_len));
    json_object_set_new(r, "batch", json_integer(c->batch));
    json_object_set_new(r, "batch_tokens", json_integer(c->batch_tokens));
    json_object_set_new(r, "steps", json_integer(c->steps));
    json_object_set_new(r, "epochs", json_integer(c->epochs));
    json_object_set_new(r, "lr", json_real(c->lr));
    json_object_set_new(r, "min_lr_ratio", json_real(c->min_lr_ratio));
    json_object_set_new(r, "weight_decay", json_real(c->weight_decay));
    json_object_set_new(r, "beta1", json_real(c->beta1));
    json_object_set_new(r, "beta2", json_real(c->beta2));
    json_object_set_new(r, "eps", json_real(c->eps));
    json_object_set_new(r, "grad_clip", json_real(c->grad_clip));
    json_object_set_new(r, "warmup", json_integer(c->warmup));
    json_object_set_new(r, "lora_rank", json_integer(c->lora_rank));
    json_object_set_new(r, "lora_alpha", json_real(c->lora_alpha));
    json_object_set_new(r, "lora_targets", json_integer(c->lora_targets));
    json_object_set_new(r, "eval_every", json_integer(c->eval_every));
    json_object_set_new(r, "eval_batches", json_integer(c->eval_batches));
    json_object_set_new(r, "save_every", json_integer(c->save_every));
    json_object_set_new(r, "keep", json_integer(c->keep));
    json_object_set_new(r, "log_every", json_integer(c->log_every));
    json_object_set_new(r, "doc_sep_blank", json_boolean(c->data_cfg.doc_sep_blank));
    json_object_set_new(r, "train_on_all", json_boolean(c->data_cfg.train_on_all));
    json_object_set_new(r, "skip_bad_records", json_boolean(c->data_cfg.skip_bad_records));
    json_object_set_new(r, "chat_template",
                        json_string(c->chat_template ? c->chat_template : "model"));
    if (c->index_path) json_object_set_new(r, "index", json_string(c->index_path));
    json_object_set_new(r, "retrieval_top_k", json_integer(c->retrieval_top_k));
    json_object_set_new(r, "threads", json_integer(c->n_threads));
    json_object_set_new(r, "recompute", json_integer(c->recompute));
    char *text = json_dumps(r, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(r);
    char *p = en_path_join(c->run_dir, "run.json");
    en_status s = (text && p) ? en_file_write_atomic(p, text, strlen(text), err)
                              : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    free(text);
    en_free(p);
    return s;
}

/* Strings of a loaded config live in one block: a JSON text kept alive. */
en_status en_finetune_config_load(const char *run_dir, en_finetune_config *c, void **keep,
                                  en_err *err) {
    *keep = NULL;
    char *p = en_path_join(run_dir, "run.json");
    char *text = NULL;
    size_t len;
    en_status s = p ? en_file_read_all(p, &text, &len, err) : EN_ERR(err, EN_ERR_NOMEM, "oom");
    if (s != EN_OK) {
        en_err_prefix(err, "--resume %s: not a run directory", run_dir);
        en_free(p);
        return s;
    }
    json_error_t jerr;
    json_t *r = json_loadb(text, len, 0, &jerr);
    en_free(text);
    if (!json_is_object(r) || !json_is_string(json_object_get(r, "model"))) {
        if (r) json_decref(r);
        s = EN_ERR(err, EN_ERR_FORMAT, "%s: not a valid run configuration", p);
        en_free(p);
        return s;
    }
    json_t *v = json_object_get(r, "version");
    if (!json_is_integer(v) || json_integer_value(v) != 1) {
        json_decref(r);
        s = EN_ERR(err, EN_ERR_FORMAT, "%s: unknown run.json version", p);
        en_free(p);
        return s;
    }
    *c = en_finetune_config_default();
    c->run_dir = run_dir;
#define GI(k, dst) do { json_t *x_ = json_object_get(r, k); if (json_is_integer(x_)) dst = json_integer_value(x_); } while (0)
#define GF(k, dst) do { json_t *x_ = json_object_get(r, k); if (json_is_number(x_)) dst = json_number_value(x_); } while (0)
#define GB(k, dst) do { json_t *x_ = json_object_get(r, k); if (json_is_boolean(x_)) dst = json_is_true(x_); } while (0)
    c->model_dir = json_string_value(json_object_get(r, "model"));
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(r, "data"), i, x) if (json_is_string(x) &&
                                                             c->n_data < EN_FT_MAX_FILES)
        c->data[c->n_data++] = json_string_value(x);
    json_array_foreach(json_object_get(r, "val_data"), i, x) if (json_is_string(x) &&
                                                                 c->n_val_data < EN_FT_MAX_FILES)
        c->val_data[c->n_val_data++] = json_string_value(x);
    GF("val_fraction", c->val_fraction);
    GI("seed", c->seed);
    GI("seq_len", c->data_cfg.seq_len);
    GI("batch", c->batch);
    GI("batch_tokens", c->batch_tokens);
    GI("steps", c->steps);
    GI("epochs", c->epochs);
    GF("lr", c->lr);
    GF("min_lr_ratio", c->min_lr_ratio);
    GF("weight_decay", c->weight_decay);
    GF("beta1", c->beta1);
    GF("beta2", c->beta2);
    GF("eps", c->eps);
    GF("grad_clip", c->grad_clip);
    GI("warmup", c->warmup);
    GI("lora_rank", c->lora_rank);
    GF("lora_alpha", c->lora_alpha);
    GI("lora_targets", c->lora_targets);
    GI("eval_every", c->eval_every);
    GI("eval_batches", c->eval_batches);
    GI("save_every", c->save_every);
    GI("keep", c->keep);
    GI("log_every", c->log_every);
    GB("doc_sep_blank", c->data_cfg.doc_sep_blank);
    GB("train_on_all", c->data_cfg.train_on_all);
    GB("skip_bad_records", c->data_cfg.skip_bad_records);
    GI("threads", c->n_threads);
    GI("recompute", c->recompute);
    c->index_path = json_string_value(json_object_get(r, "index"));
    GI("retrieval_top_k", c->retrieval_top_k);
    /* "model" (the model's own template), a built-in name, or a .jinja path;
     * runs from before templates were objects wrote the built-in's name */
    const char *ct = json_string_value(json_object_get(r, "chat_template"));
    c->chat_template = ct && strcmp(ct, "model") != 0 ? ct : NULL;
#undef GI
#undef GF
#undef GB
    en_free(p);
    *keep = r; /* the strings above point into r; released by en_finetune_config_free */
    return EN_OK;
}

void en_finetune_config_free(void *keep) {
    if (keep) json_decref((json_t *)keep);
}

/* ---- the run ---- */

typedef struct run {
    const en_finetune_config *cfg;
    en_backend *be;
    en_tokenizer *tok;
    en_chat_template *tmpl; /* for chat and prompt/completion records */
    en_model *model;
    en_lora *lora;
    en_dataset *train, *val;
    en_train *tr;
    en_optim *opt; /* AdamW, DP reduction, ZeRO-1, norm and clipping (models/optim.h) */
    size_t n_params;
    int B, T, accum;
    int64_t total_steps, step, epoch, cursor;
    int64_t *perm;
    int32_t *inputs, *targets; /* (accum, B, T) */
    en_metrics *metrics;
    en_progress *progress;
    double t_start;
    int64_t tokens_seen;
    /* the parallel layout (one process: NULL comm) */
    en_comm *comm; /* borrowed */
    en_parallel par;
    int D, dp_rank, main, tp;
    en_whole *whole; /* whole tensors for layout-free checkpoints */
    const float *p_whole; /* the parameters the last checkpoint gathered */
} run;

static void warn_cb(const char *msg, void *user) {
    (void)user;
    en_log(EN_LOG_WARN, "%s", msg);
}

static float lr_at(const run *r, int64_t step) {
    const en_finetune_config *c = r->cfg;
    if (c->warmup > 0 && step < c->warmup) return c->lr * (float)(step + 1) / (float)c->warmup;
    double span = (double)(r->total_steps - c->warmup);
    double prog = span > 0 ? (double)(step - c->warmup) / span : 1.0;
    if (prog > 1) prog = 1;
    double min_lr = c->lr * c->min_lr_ratio;
    return (float)(min_lr + 0.5 * (c->lr - min_lr) * (1 + cos(M_PI * prog)));
}

/* Fill the step's (accum * B) windows from the epoch order. */
static void next_windows(run *r) {
    const int64_t nw = en_dataset_n_windows(r->train);
    for (int i = 0; i < r->accum * r->B * r->D; i++) {
        if (r->cursor == nw) {
            r->epoch++;
            r->cursor = 0;
            en_dataset_order(r->train, r->cfg->seed, r->epoch, r->perm);
        }
        int64_t w = r->perm[r->cursor++];
        en_dataset_window(r->train, w, r->inputs + (size_t)i * r->T, r->targets + (size_t)i * r->T);
    }
}

static en_status evaluate(run *r, double *val_loss, en_err *err) {
    *val_loss = NAN;
    if (!r->val) return EN_OK;
    const int64_t nw = en_dataset_n_windows(r->val);
    int64_t n_mb = (nw + r->B - 1) / r->B;
    if (r->cfg->eval_batches > 0 && n_mb > r->cfg->eval_batches) n_mb = r->cfg->eval_batches;
    double sum = 0;
    int64_t cnt = 0;
    for (int64_t b = 0; b < n_mb; b++) {
        if (b % r->D != r->dp_rank) continue; /* data-parallel: every D-th */
        for (int i = 0; i < r->B; i++) {
            int64_t w = b * r->B + i;
            int32_t *in = r->inputs + (size_t)i * r->T, *tg = r->targets + (size_t)i * r->T;
            if (w < nw) {
                en_dataset_window(r->val, w, in, tg);
            } else { /* pad the last micro-batch with untrained rows */
                for (int t = 0; t < r->T; t++) in[t] = 0, tg[t] = -1;
            }
        }
        double s;
        int64_t n;
        EN_TRY(en_train_loss(r->tr, r->inputs, r->targets, &s, &n, err));
        sum += s;
        cnt += n;
    }
    double red[2] = {sum, (double)cnt};
    EN_TRY(en_parallel_dp_sum(r->comm, red, 2, err));
    if (red[1] > 0) *val_loss = red[0] / red[1];
    return EN_OK;
}

/* The weights (model.safetensors as the family stores them) or the
 * adapter (PEFT files) from the whole parameter vector p. */
static en_status write_weights(run *r, en_ckpt_writer *w, const float *p, en_err *err) {
    if (r->lora) {
        EN_TRY(en_lora_save_peft(en_whole_adapter(r->whole, p), r->cfg->model_dir,
                                 en_ckpt_writer_dir(w), err));
        EN_TRY(en_ckpt_add_existing(w, "adapter_config.json", err));
        return en_ckpt_add_existing(w, "adapter_model.safetensors", err);
    }
    en_st_writer_item *it;
    float *scratch;
    int n_it = en_whole_model_items(r->whole, p, &it, &scratch);
    en_status s = n_it >= 0 ? en_ckpt_write_safetensors(w, "model.safetensors", it, n_it, err)
                            : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    en_free(it);
    en_free(scratch);
    return s;
}

/* optimizer.safetensors: m.NAME and v.NAME, whole tensors. */
static en_status write_moments(run *r, en_ckpt_writer *w, const float *m, const float *v,
                               en_err *err) {
    const int n = en_train_n_tensors(r->tr);
    char(*names)[160] = en_calloc((size_t)n * 2 + 1, 160);
    int nm = 0, nv = 0;
    en_st_writer_item *im = names ? en_whole_items(r->whole, m, "m.", names, &nm) : NULL;
    en_st_writer_item *iv = names ? en_whole_items(r->whole, v, "v.", names + n, &nv) : NULL;
    en_st_writer_item *all = en_calloc((size_t)n * 2 + 1, sizeof *all);
    en_status s = EN_OK;
    if (!names || !im || !iv || !all) {
        s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    } else {
        memcpy(all, im, (size_t)nm * sizeof *all);
        memcpy(all + nm, iv, (size_t)nv * sizeof *all);
        s = en_ckpt_write_safetensors(w, "optimizer.safetensors", all, nm + nv, err);
    }
    en_free(names);
    en_free(im);
    en_free(iv);
    en_free(all);
    return s;
}

static en_status write_state(run *r, en_ckpt_writer *w, en_err *err) {
    char buf[512];
    int len = snprintf(buf, sizeof buf,
                       "{\"magic\":\"%s\",\"version\":%d,\"step\":%lld,\"epoch\":%lld,"
                       "\"cursor\":%lld,\"seed\":%llu,\"tokens_seen\":%lld,\"lora\":%s}\n",
                       STATE_MAGIC, STATE_VERSION, (long long)r->step, (long long)r->epoch,
                       (long long)r->cursor, (unsigned long long)r->cfg->seed,
                       (long long)r->tokens_seen, r->lora ? "true" : "false");
    return en_ckpt_write_file(w, "trainer_state.json", buf, (size_t)len, err);
}

/* A checkpoint holds whole tensors (the weights or adapter and the full
 * moments) whatever the layout, so a run resumes under any data- and
 * tensor-parallel size: every rank takes part in gathering them (ZeRO's
 * moment shards, tensor-parallel parts, a device's memory), then rank 0
 * writes. r->p_whole keeps the gathered parameters for write_final. */
static en_status save_checkpoint(run *r, en_err *err) {
    const en_finetune_config *c = r->cfg;
    const float *ml, *vl, *m, *v;
    size_t np;
    EN_TRY(en_optim_moments(r->opt, &ml, &vl, err));
    EN_TRY(en_whole_gather(r->whole, 0, en_train_params(r->tr, &np), &r->p_whole, err));
    EN_TRY(en_whole_gather(r->whole, 1, ml, &m, err));
    EN_TRY(en_whole_gather(r->whole, 2, vl, &v, err));
    if (!r->main) return EN_OK;
    en_ckpt_writer *w = NULL;
    EN_TRY(en_ckpt_begin(c->run_dir, r->step, &w, err));
    en_status s = write_weights(r, w, r->p_whole, err);
    if (s == EN_OK) s = write_moments(r, w, m, v, err);
    if (s == EN_OK) s = write_state(r, w, err);
    if (s != EN_OK) {
        en_ckpt_abort(w);
        return s;
    }
    return en_ckpt_commit(w, c->keep, err);
}

static en_status load_checkpoint(run *r, en_err *err) {
    const en_finetune_config *c = r->cfg;
    char *dir = NULL;
    int64_t step = 0;
    EN_TRY(en_ckpt_find_latest(c->run_dir, &dir, &step, warn_cb, NULL, err));
    char *text = NULL;
    size_t len = 0;
    en_status s = en_ckpt_read_file(dir, "trainer_state.json", &text, &len, err);
    json_t *st = NULL;
    if (s == EN_OK) {
        json_error_t jerr;
        st = json_loadb(text, len, 0, &jerr);
        json_t *mg = st ? json_object_get(st, "magic") : NULL;
        json_t *ver = st ? json_object_get(st, "version") : NULL;
        if (!json_is_string(mg) || strcmp(json_string_value(mg), STATE_MAGIC) != 0 ||
            !json_is_integer(ver) || json_integer_value(ver) != STATE_VERSION)
            s = EN_ERR(err, EN_ERR_FORMAT, "%s/trainer_state.json: not a version-%d trainer state",
                       dir, STATE_VERSION);
        else if (json_is_true(json_object_get(st, "lora")) != (r->lora != NULL))
            s = EN_ERR(err, EN_ERR_ARG, "%s: checkpoint and run disagree about LoRA", dir);
    }
    if (s == EN_OK) {
        r->step = json_integer_value(json_object_get(st, "step"));
        r->epoch = json_integer_value(json_object_get(st, "epoch"));
        r->cursor = json_integer_value(json_object_get(st, "cursor"));
        r->tokens_seen = json_integer_value(json_object_get(st, "tokens_seen"));
        if (r->cursor < 0 || r->cursor > en_dataset_n_windows(r->train))
            s = EN_ERR(err, EN_ERR_FORMAT,
                       "%s: data cursor %lld does not fit this dataset (%lld windows): the "
                       "training data changed since the checkpoint",
                       dir, (long long)r->cursor, (long long)en_dataset_n_windows(r->train));
    }
    char *wp = NULL, *op = NULL;
    if (s == EN_OK) {
        wp = en_path_join(dir, r->lora ? "adapter_model.safetensors" : "model.safetensors");
        op = en_path_join(dir, "optimizer.safetensors");
        size_t np;
        en_train_params(r->tr, &np);
        /* the model's weights through the core's loader (fused and sliced
         * as its family stores them); the adapter's by name */
        s = r->lora ? en_whole_load_params(r->whole, wp, err)
                    : en_model_load_weights(r->model, wp, err);
        /* full moments in the file: the optimizer keeps its part */
        float *mw = en_malloc((np ? np : 1) * sizeof(float));
        float *vw = en_malloc((np ? np : 1) * sizeof(float));
        if (s == EN_OK && (!mw || !vw)) s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        if (s == EN_OK) s = en_whole_read(r->whole, op, "m.", mw, err);
        if (s == EN_OK) s = en_whole_read(r->whole, op, "v.", vw, err);
        if (s == EN_OK) en_optim_set_moments(r->opt, mw, vw);
        en_free(mw);
        en_free(vw);
    }
    if (s == EN_OK && r->main)
        en_log(EN_LOG_INFO, "resuming from %s (step %lld, epoch %lld)", dir, (long long)r->step,
               (long long)r->epoch);
    en_free(wp);
    en_free(op);
    if (st) json_decref(st);
    en_free(text);
    en_free(dir);
    return s;
}

static en_status write_plot(run *r, en_err *err) {
    char *mp = en_path_join(r->cfg->run_dir, "metrics.jsonl");
    char *sp = en_path_join(r->cfg->run_dir, "loss.svg");
    double *ts = NULL, *tl = NULL, *vs = NULL, *vl = NULL;
    int nt = 0, nv = 0;
    en_status s = en_metrics_read_series(mp, &ts, &tl, &nt, &vs, &vl, &nv, err);
    if (s == EN_OK) s = en_loss_svg_write(sp, "energon finetune: loss", ts, tl, nt, vs, vl, nv, err);
    en_free(ts);
    en_free(tl);
    en_free(vs);
    en_free(vl);
    en_free(mp);
    en_free(sp);
    return s;
}

/* The final adapter, or model/ (weights, config, the base model's
 * tokenizer files as they are: tokenizer.json or .model,
 * tokenizer_config.json, chat_template.jinja, ...), from the parameters
 * the final checkpoint gathered. */
static en_status write_final(run *r, en_err *err) {
    const en_finetune_config *c = r->cfg;
    if (r->lora)
        return en_lora_save_peft(en_whole_adapter(r->whole, r->p_whole), c->model_dir, c->run_dir,
                                 err);
    char *dir = en_path_join(c->run_dir, "model");
    char *st = dir ? en_path_join(dir, "model.safetensors") : NULL;
    en_st_writer_item *it = NULL;
    float *scratch = NULL;
    int n_it = en_whole_model_items(r->whole, r->p_whole, &it, &scratch);
    en_status s = (dir && st && n_it >= 0) ? en_mkdir_p(dir, err)
                                           : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK) s = en_st_write(st, it, n_it, EN_DTYPE_F32, err);
    if (s == EN_OK) s = en_model_write_config(r->model, dir, err);
    if (s == EN_OK)
        s = en_hf_copy_tokenizer(c->model_dir, dir, en_tokenizer_bos(r->tok),
                                 en_tokenizer_eos(r->tok), NULL, err);
    en_free(it);
    en_free(scratch);
    en_free(dir);
    en_free(st);
    return s;
}

static void run_free(run *r) {
    en_progress_destroy(r->progress);
    en_metrics_close(r->metrics);
    en_train_destroy(r->tr);
    en_optim_destroy(r->opt);
    en_free(r->perm);
    en_free(r->inputs);
    en_free(r->targets);
    en_whole_destroy(r->whole);
    en_dataset_destroy(r->train);
    en_dataset_destroy(r->val);
    if (r->model) en_model_set_lora(r->model, NULL, NULL);
    en_lora_destroy(r->lora);
    en_model_destroy(r->model);
    en_chat_template_destroy(r->tmpl);
    en_tokenizer_destroy(r->tok);
}

static void print_stats(const char *what, const en_dataset *ds, int seq_len) {
    const en_data_stats *st = en_dataset_stats(ds);
    en_log(EN_LOG_INFO,
           "%s: %lld records, %lld tokens (%lld trained) in %lld windows of %d tokens, from %lld "
           "file(s)", what, (long long)st->n_records, (long long)st->n_tokens,
           (long long)st->n_trained_tokens, (long long)st->n_windows, seq_len,
           (long long)st->n_files);
    if (st->n_files_skipped)
        en_log(EN_LOG_WARN,
               "%s: passed over %lld files of other formats in data directories (read: .txt, "
               ".jsonl, .md, .html, optionally .gz)", what, (long long)st->n_files_skipped);
    if (st->n_bad_skipped)
        en_log(EN_LOG_WARN, "%s: skipped %lld malformed records (first: %s)", what,
               (long long)st->n_bad_skipped,
               en_dataset_first_skipped(ds) ? en_dataset_first_skipped(ds) : "?");
    if (st->n_truncated)
        en_log(EN_LOG_WARN,
               "%s: %lld records were longer than --seq-len %d + 1 tokens and were truncated "
               "(their ends take no loss); consider a larger --seq-len",
               what, (long long)st->n_truncated, seq_len);
}

/* The training (and --val-data) datasets, grounded in cfg->index_path's
 * passages when it is set (ground_data.h), with a summary line. */
static en_status load_datasets(run *r, const en_finetune_config *cfg, en_data_config *dc,
                               en_err *err) {
    en_ground_data *g = NULL;
    en_status s;
    if (cfg->index_path) {
        EN_TRY(en_ground_data_create(cfg->index_path, cfg->retrieval_top_k, r->tmpl, &g, err));
        dc->rewrite = en_ground_data_rewrite;
        dc->rewrite_ctx = g;
    }
    if ((s = en_dataset_create(cfg->data, cfg->n_data, r->tok, dc, &r->train, err)) != EN_OK)
        goto done;
    if (g) {
        const en_ground_data_stats *gs = en_ground_data_stats_get(g);
        const en_data_stats *st = en_dataset_stats(r->train);
        int64_t nr = st->n_records > 0 ? st->n_records : 1;
        en_log(EN_LOG_INFO,
               "grounded %lld prompt/completion records in %s (BM25 top %d, %.2f passages "
               "each): %lld with a citation marker, %lld without; mean untrained (prompt) "
               "tokens per record %.1f",
               (long long)gs->n_records, cfg->index_path, cfg->retrieval_top_k,
               gs->n_records ? (double)gs->n_passages / (double)gs->n_records : 0.0,
               (long long)gs->n_marked, (long long)(gs->n_records - gs->n_marked),
               (double)(st->n_tokens - st->n_trained_tokens) / (double)nr);
    }
    if (cfg->n_val_data > 0 &&
        (s = en_dataset_create(cfg->val_data, cfg->n_val_data, r->tok, dc, &r->val, err)) !=
            EN_OK)
        en_err_prefix(err, "--val-data");
done:
    en_ground_data_destroy(g);
    dc->rewrite = NULL;
    dc->rewrite_ctx = NULL;
    return s;
}

/* The template cfg->chat_template names (see trainer.h). */
static en_status load_template(const en_finetune_config *cfg, const en_tokenizer *tok,
                               en_chat_template **out, en_err *err) {
    en_status s = en_chat_template_select(cfg->model_dir, cfg->chat_template, tok, out, err);
    if (s != EN_OK && s != EN_ERR_ARG) en_err_prefix(err, "chat template");
    return s;
}

/* Print a window: its ids, a 0/1 per id (1: the id is a target that takes
 * a loss), and its text (each id's bytes, special tokens as their text) with
 * the trained ids inside ⟦ ⟧. */
static void dump_window(const run *r, int64_t w) {
    const int32_t *ids;
    const uint8_t *train;
    int64_t n = en_dataset_window_tokens(r->train, w, &ids, &train), n_trained = 0;
    for (int64_t k = 1; k < n; k++)
        n_trained += train[k];
    printf("window %lld (%lld tokens, %lld trained)\nids:", (long long)w, (long long)n,
           (long long)n_trained);
    for (int64_t k = 0; k < n; k++)
        printf(" %d", (int)ids[k]);
    printf("\ntrain:");
    for (int64_t k = 0; k < n; k++)
        printf(" %d", k > 0 && train[k]);
    printf("\ntext: ");
    int open = 0;
    char buf[256];
    for (int64_t k = 0; k < n; k++) {
        int t = k > 0 && train[k];
        if (t != open) fputs(t ? "\xe2\x9f\xa6" : "\xe2\x9f\xa7", stdout); /* ⟦ ⟧ */
        open = t;
        long m = en_tokenizer_token_bytes(r->tok, ids[k], buf, sizeof buf);
        if (m > 0) fwrite(buf, 1, (size_t)m < sizeof buf ? (size_t)m : sizeof buf, stdout);
    }
    if (open) fputs("\xe2\x9f\xa7", stdout);
    fputs("\n\n", stdout);
}

en_status en_finetune_run(const en_finetune_config *cfg, int resume, volatile sig_atomic_t *stop,
                          en_finetune_result *res, en_err *err) {
    run R;
    memset(&R, 0, sizeof R);
    run *r = &R;
    r->cfg = cfg;
    res->steps_done = 0;
    res->last_loss = res->last_val_loss = NAN;
    res->interrupted = 0;
    en_status s;

    if (cfg->n_data < 1) return EN_ERR(err, EN_ERR_ARG, "--data FILE is required");
    if (cfg->batch < 1) return EN_ERR(err, EN_ERR_ARG, "--batch must be >= 1");
    r->comm = cfg->comm; /* NULL: one process */
    r->par = en_parallel_of(r->comm);
    r->tp = r->par.tp;
    r->D = r->par.dp;
    r->dp_rank = r->par.dp_rank;
    r->main = r->par.main;
    r->be = cfg->backend; /* borrowed: the front end made it */
    if (!r->be) {
        s = EN_ERR(err, EN_ERR_ARG, "en_finetune_run: no backend");
        goto fail;
    }
    if ((s = en_tokenizer_load(cfg->model_dir, &r->tok, err)) != EN_OK) goto fail;
    if ((s = load_template(cfg, r->tok, &r->tmpl, err)) != EN_OK) goto fail;
    en_model_params mp = en_model_params_default();
    mp.backend = r->be;
    mp.comm = r->comm;
    mp.tp_size = r->tp;
    mp.tp_rank = r->par.tp_rank;
    /* LoRA keeps the frozen base at its stored width (bf16 checkpoints at
     * half the memory); full fine-tuning trains float32 weights */
    mp.weights = cfg->lora_rank > 0 ? EN_WEIGHTS_AUTO : EN_WEIGHTS_F32;
    if ((s = en_model_load(cfg->model_dir, &mp, &r->model, err)) != EN_OK) goto fail;
    const en_model_hparams *hp = en_model_get_hparams(r->model);
    if (en_tokenizer_n_vocab(r->tok) > hp->n_vocab) {
        s = EN_ERR(err, EN_ERR_FORMAT, "%s has %d tokens but the model's vocab_size is %d",
                   en_tokenizer_file(r->tok), en_tokenizer_n_vocab(r->tok), hp->n_vocab);
        goto fail;
    }
    r->T = cfg->data_cfg.seq_len;
    r->B = cfg->batch;
    if (r->T > hp->max_pos) {
        s = EN_ERR(err, EN_ERR_ARG, "--seq-len %d exceeds the model's max_position_embeddings %d",
                   r->T, hp->max_pos);
        goto fail;
    }
    if (cfg->lora_rank > 0) {
        en_lora_config lc = {cfg->lora_rank, cfg->lora_alpha, cfg->lora_targets};
        /* this rank's shard of the adapter (the whole one without TP) */
        if ((s = en_lora_create(r->be, en_model_get_local_hparams(r->model), &lc, &r->lora,
                                err)) != EN_OK)
            goto fail;
        en_lora_init_tp(r->lora, cfg->seed, r->par.tp_rank, r->tp);
        if ((s = en_model_set_lora(r->model, r->lora, err)) != EN_OK) goto fail;
    }

    /* data */
    en_data_config dc = cfg->data_cfg;
    dc.chat_template = r->tmpl;
    en_log(EN_LOG_INFO, "reading %d --data path(s); tokenizer %s; chat template %s",
           cfg->n_data, en_tokenizer_file(r->tok), en_chat_template_describe(r->tmpl));
    if ((s = load_datasets(r, cfg, &dc, err)) != EN_OK) goto fail;
    if (cfg->n_val_data == 0 && cfg->val_fraction > 0) {
        if ((s = en_dataset_split(r->train, cfg->val_fraction, cfg->seed, &r->val, err)) != EN_OK) {
            en_err_prefix(err, "--val-fraction");
            goto fail;
        }
    }
    print_stats("train", r->train, r->T);
    if (r->val) print_stats("validation", r->val, r->T);
    if (cfg->dump_data > 0) { /* rank 0 prints; every rank stops here */
        int64_t nw = en_dataset_n_windows(r->train);
        for (int64_t w = 0; r->main && w < nw && w < cfg->dump_data; w++)
            dump_window(r, w);
        fflush(stdout);
        run_free(r);
        return EN_OK;
    }

    /* schedule */
    int64_t per_mb = (int64_t)r->B * r->T;
    int64_t per_mb_all = per_mb * r->D; /* one micro-batch on every rank */
    r->accum = cfg->batch_tokens > per_mb_all
                   ? (int)((cfg->batch_tokens + per_mb_all - 1) / per_mb_all)
                   : 1;
    /* windows per optimizer step, over all data-parallel ranks */
    int64_t per_step = (int64_t)r->accum * r->B * r->D;
    int64_t nw = en_dataset_n_windows(r->train);
    r->total_steps = cfg->steps > 0 ? cfg->steps
                                    : ((int64_t)cfg->epochs * nw + per_step - 1) / per_step;
    if (r->total_steps < 1) r->total_steps = 1;

    en_train_config tc = {r->B, r->T, 0, cfg->recompute, cfg->sequence_parallel};
    if ((s = en_train_create(r->model, &tc, &r->tr, err)) != EN_OK) goto fail;
    float *params = en_train_params(r->tr, &r->n_params);
    (void)params;
    /* AdamW moments: all of them, or with ZeRO-1 this rank's slice */
    en_optim_config oc = {cfg->beta1, cfg->beta2, cfg->eps, cfg->weight_decay, cfg->grad_clip,
                          cfg->zero};
    if ((s = en_optim_create(r->tr, r->model, r->comm, &oc, &r->opt, err)) != EN_OK) goto fail;
    /* whole tensors for checkpoints, whatever the layout */
    if ((s = en_whole_create(r->tr, r->model, r->lora, &r->whole, err)) != EN_OK) goto fail;
    r->perm = en_malloc((size_t)nw * sizeof(int64_t));
    r->inputs = en_malloc((size_t)per_step * r->T * sizeof(int32_t));
    r->targets = en_malloc((size_t)per_step * r->T * sizeof(int32_t));
    if (!r->perm || !r->inputs || !r->targets) {
        s = EN_ERR(err, EN_ERR_NOMEM, "out of memory for the optimizer state");
        goto fail;
    }
    size_t act_layer = 0, act_total = en_train_activation_bytes(r->tr, &act_layer);
    en_log(EN_LOG_INFO,
           "%s: %zu trainable parameters%s; AdamW state %.1f MB; activations held for the "
           "backward pass (recompute %s%s): %zu bytes per layer, %.1f MB in total",
           r->lora ? "LoRA" : "full fine-tuning", r->n_params,
           r->lora ? " (base weights frozen: no gradients or optimizer state for them)" : "",
           2.0 * r->n_params * 4 / 1e6,
           cfg->recompute == EN_RECOMPUTE_FULL   ? "full"
           : cfg->recompute == EN_RECOMPUTE_NONE ? "none"
                                                 : "selective",
           cfg->sequence_parallel ? ", sequence parallel" : "", act_layer,
           act_total / 1e6);
    en_log(EN_LOG_INFO,
           "batch: %d x %d tokens x %d accumulation (x data-parallel ranks) = %lld tokens per step; %lld steps "
           "(%.2f epochs of %lld windows)",
           r->B, r->T, r->accum, (long long)(per_step * r->T), (long long)r->total_steps,
           (double)(r->total_steps * per_step) / (double)nw, (long long)nw);
    if (r->D > 1)
        en_log(EN_LOG_INFO,
               "data parallel: %d ranks; global batch = %d sequences x %d accumulation x %d "
               "ranks = %lld sequences; %s",
               r->D, r->B, r->accum, r->D, (long long)per_step,
               cfg->zero ? "ZeRO-1: each rank keeps 1/D of the AdamW moments"
                         : "AdamW moments replicated");

    r->epoch = 0;
    r->cursor = 0;
    s = EN_OK;
    /* Only now, with the model and data loaded, may an old run be cleared
     * out (--overwrite): a failure before this point leaves it as it was. */
    if (r->main && !resume) s = en_run_dir_prepare(cfg->run_dir, cfg->overwrite, err);
    if (s == EN_OK && r->main) s = en_mkdir_p(cfg->run_dir, err);
    if (s == EN_OK && resume) s = load_checkpoint(r, err);
    if (s == EN_OK && !resume && r->main) s = config_save(cfg, err);
    /* one rank's failure (a bad file, no checkpoint) ends every rank */
    if ((s = en_parallel_agree(r->comm, s, err)) != EN_OK) goto fail;
    en_dataset_order(r->train, cfg->seed, r->epoch, r->perm);
    if (r->main) {
        if ((s = en_metrics_open(cfg->run_dir, resume ? r->step : -1, &r->metrics, err)) != EN_OK)
            goto fail;
        if ((s = en_progress_create(stderr, r->total_steps, r->step, cfg->log_every,
                                    &r->progress, err)) != EN_OK)
            goto fail;
    }

    double val = NAN, last_loss = NAN;
    r->t_start = en_time_now();
    int64_t tokens_run = 0;
    int64_t first_step = r->step;
    while (r->step < r->total_steps) {
        /* a signal on any rank stops every rank at the same step */
        int stop_all;
        if ((s = en_parallel_any(r->comm, stop && *stop, &stop_all, err)) != EN_OK) goto fail;
        if (stop_all) {
            res->interrupted = 1;
            break;
        }
        double t0 = en_time_now();
        next_windows(r);
        int64_t n_tok = 0; /* trained tokens of the whole (global) step */
        for (int64_t i = 0; i < per_step * r->T; i++) n_tok += r->targets[i] >= 0;
        en_train_zero_grad(r->tr);
        double sum = 0;
        for (int a = 0; a < r->accum && n_tok > 0; a++) {
            double ls;
            int64_t lc;
            /* this rank's share: micro-batches dp_rank, dp_rank + D, ... */
            size_t off = ((size_t)a * r->D + (size_t)r->dp_rank) * r->B * r->T;
            if ((s = en_train_fwd_bwd(r->tr, r->inputs + off, r->targets + off,
                                      1.0f / (float)n_tok, &ls, &lc, err)) != EN_OK)
                goto fail;
            sum += ls;
        }
        en_train_reduce_grads(r->tr);
        if ((s = en_parallel_dp_sum(r->comm, &sum, 1, err)) != EN_OK) goto fail;
        double loss = n_tok ? sum / (double)n_tok : 0.0;
        if (!isfinite(loss)) {
            s = EN_ERR(err, EN_ERR_ARG,
                       "the loss became %g at step %lld; lower --lr (now %g) or check the data",
                       loss, (long long)r->step + 1, (double)cfg->lr);
            goto fail;
        }
        /* the core's optimizer: data-parallel sum (each rank's gradient is
         * already scaled by 1 / the global token count), global norm,
         * clipping, AdamW (ZeRO-1: on this rank's slice, then the
         * parameters' all-gather) */
        double gnorm;
        const float lr = lr_at(r, r->step);
        if ((s = en_optim_step(r->opt, lr, r->step + 1, &gnorm, err)) != EN_OK) goto fail;
        r->step++;
        r->tokens_seen += per_step * r->T;
        tokens_run += per_step * r->T;
        last_loss = loss;
        double dt = en_time_now() - t0;
        double tps = dt > 0 ? (double)(per_step * r->T) / dt : 0;
        int do_eval = r->val && (r->step == r->total_steps ||
                                 (cfg->eval_every > 0 && r->step % cfg->eval_every == 0));
        if (do_eval && (s = evaluate(r, &val, err)) != EN_OK) goto fail;
        if (r->main) {
            char line[512];
            int k = snprintf(line, sizeof line,
                             "{\"step\":%lld,\"loss\":%.17g,\"lr\":%.9g,\"grad_norm\":%.9g,"
                             "\"tokens\":%lld,\"trained_tokens\":%lld,\"tokens_per_s\":%.1f,"
                             "\"epoch\":%lld",
                             (long long)r->step, loss, (double)lr, gnorm,
                             (long long)r->tokens_seen, (long long)n_tok, tps, (long long)r->epoch);
            if (do_eval && isfinite(val))
                k += snprintf(line + k, sizeof line - (size_t)k, ",\"val_loss\":%.17g", val);
            snprintf(line + k, sizeof line - (size_t)k, "}");
            if ((s = en_metrics_log(r->metrics, line, err)) != EN_OK) goto fail;
            en_progress_update(r->progress, r->step, loss, do_eval ? val : NAN, tps);
            if (do_eval && (s = write_plot(r, err)) != EN_OK) goto fail;
        }
        if (cfg->save_every > 0 && r->step % cfg->save_every == 0 && r->step < r->total_steps) {
            s = save_checkpoint(r, err);
            if ((s = en_parallel_agree(r->comm, s, err)) != EN_OK) goto fail;
        }
    }
    if (r->progress) en_progress_finish(r->progress);
    /* final (or interrupted) checkpoint, outputs, plot */
    if (r->step > first_step || resume || r->step == r->total_steps) {
        s = save_checkpoint(r, err);
        if ((s = en_parallel_agree(r->comm, s, err)) != EN_OK) goto fail;
    }
    s = EN_OK;
    if (r->main) s = write_plot(r, err);
    if (s == EN_OK && r->main && !res->interrupted) s = write_final(r, err);
    if ((s = en_parallel_agree(r->comm, s, err)) != EN_OK) goto fail;
    double el = en_time_now() - r->t_start;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    en_log(EN_LOG_INFO,
           "%s at step %lld/%lld: loss %.4f; %.1f tokens/s; peak memory %.1f MB resident, "
           "%.1f MB in energon's host allocations",
           res->interrupted ? "interrupted" : "done", (long long)r->step,
           (long long)r->total_steps, last_loss, el > 0 ? tokens_run / el : 0.0,
           ru.ru_maxrss / 1024.0, en_mem_peak() / 1e6);
    if (isfinite(val)) en_log(EN_LOG_INFO, "final validation loss %.4f", val);
    en_log(EN_LOG_INFO, "outputs in %s: %s, metrics.jsonl, loss.svg, checkpoints/",
           cfg->run_dir,
           res->interrupted ? "(resume with --resume)"
                            : (r->lora ? "adapter_config.json + adapter_model.safetensors"
                                       : "model/"));
    res->steps_done = r->step;
    res->last_loss = last_loss;
    res->last_val_loss = val;
    run_free(r);
    return EN_OK;
fail:
    if (r->progress) en_progress_finish(r->progress);
    run_free(r);
    return s;
}
