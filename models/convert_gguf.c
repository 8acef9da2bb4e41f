/*
 * convert_gguf.c - GGUF file -> Hugging Face directory (`energon convert
 * gguf`). See convert.h.
 *
 * The model is loaded from the file by the core's own loader
 * (en_model_load reads GGUF through gguf_model.c: metadata as config.json,
 * tensors dequantised to float32 under their Hugging Face names, llama.cpp's
 * q/k permutation undone) and saved as any model is (model.safetensors and
 * its config.json). The tokenizer files (tokenizer.json,
 * tokenizer_config.json, generation_config.json, chat_template.jinja) are
 * built from the tokenizer.ggml.* metadata by tokenizer/tokenizer_gguf.h,
 * the same code that lets en_tokenizer_load read a .gguf directly.
 */
#include <stdio.h>
#include <string.h>

#include "../common/file.h"
#include "../common/gguf.h"
#include "../tokenizer/tokenizer_gguf.h"
#include "convert.h"

en_status en_convert_gguf(en_backend *be, const char *gguf_path, const char *out_dir,
                          en_err *err) {
    en_gguf *g = NULL;
    EN_TRY(en_gguf_open(gguf_path, &g, err));
    en_tokenizer_gguf tg = {0};
    en_model *m = NULL;
    en_model_params mp = en_model_params_default();
    mp.backend = be;
    /* Model and tokenizer are read before anything is written, so that a
     * file we cannot read leaves no half-written directory. */
    en_status s = en_model_load(gguf_path, &mp, &m, err);
    if (s == EN_OK) s = en_tokenizer_gguf_init(&tg, g, err);
    if (s == EN_OK && en_model_get_hparams(m)->n_vocab != tg.n_vocab)
        s = EN_ERR(err, EN_ERR_FORMAT,
                   "%s: token_embd.weight has %d rows but the tokenizer has %d tokens",
                   gguf_path, en_model_get_hparams(m)->n_vocab, (int)tg.n_vocab);
    char *st = NULL;
    if (s == EN_OK) s = en_mkdir_p(out_dir, err);
    if (s == EN_OK && !(st = en_path_join(out_dir, "model.safetensors")))
        s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK) s = en_model_save_safetensors(m, st, err);
    if (s == EN_OK) s = en_model_write_config(m, out_dir, err);
    if (s == EN_OK) s = en_tokenizer_gguf_write(&tg, out_dir, err);
    en_free(st);
    en_model_destroy(m);
    en_tokenizer_gguf_deinit(&tg);
    en_gguf_close(g);
    return s;
}
