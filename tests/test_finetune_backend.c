/*
 * test_finetune_backend.c - the fine-tuning loop on a second backend
 * object: the tests' guard backend (backend_guard.c), whose buffers the
 * host cannot touch between ops and whose ops refuse host pointers,
 * stands in for a GPU. A small model is made here (energon tokenizer train
 * + init), then for LoRA and for full fine-tuning:
 *  - 10 steps on the plain CPU backend and 10 on the guard backend, same
 *    data, seed and thread count: every step's loss must be equal (the
 *    same CPU kernels run behind the guard, so bit for bit), and the
 *    outputs (the PEFT adapter; model/model.safetensors) byte-identical.
 *    A host access to backend memory anywhere in the trainer, the
 *    optimizer, the checkpoint writer or the loss would abort the run;
 *  - resume on the guard backend from the step-5 checkpoint (the weights or
 *    adapter and the moments uploaded back): steps 6..10 must give the
 *    uninterrupted run's losses.
 * The checkpoints every 5 steps exercise gathering the trainable tensors
 * and moments out of backend memory.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_guard.h"
#include "common/backend.h"
#include "finetune/trainer.h"
#include "test_util.h"

#define STEPS 10

/* Every "loss" of dir/metrics.jsonl in order; returns the count. */
static int read_losses(const char *dir, double *loss, int cap) {
    char path[512], line[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && fgets(line, sizeof line, f) && n < cap) {
        const char *p = strstr(line, "\"loss\":");
        if (p) loss[n++] = strtod(p + 7, NULL);
    }
    if (f) fclose(f);
    return n;
}

static int same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = en_test_read_file(a, &na), *y = en_test_read_file(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

static int run(const char *model, const char *data, const char *out, int lora, en_backend *be,
               int resume) {
    en_finetune_config c = en_finetune_config_default();
    c.model_dir = model;
    c.data[0] = data;
    c.n_data = 1;
    c.run_dir = out;
    c.seed = 7;
    c.batch = 2;
    c.data_cfg.seq_len = 32;
    c.data_cfg.doc_sep_blank = 1;
    c.steps = STEPS;
    c.lr = lora ? 5e-3f : 2e-3f;
    c.warmup = 2;
    c.weight_decay = 0.1f;
    c.save_every = 5;
    c.keep = 3;
    c.eval_every = 0;
    c.n_threads = 2;
    c.lora_rank = lora ? 4 : 0;
    c.backend = be;
    en_finetune_result res;
    en_err err = {0};
    if (en_finetune_run(&c, resume, NULL, &res, &err) != EN_OK) {
        fprintf(stderr, "finetune (%s, %s): %s\n", lora ? "LoRA" : "full", en_backend_name(be),
                err.msg);
        return 0;
    }
    return res.steps_done == STEPS;
}

static void compare(const char *what, const char *a, const char *b, int from) {
    double la[STEPS + 1], lb[STEPS + 1];
    int na = read_losses(a, la, STEPS + 1), nb = read_losses(b, lb, STEPS + 1);
    int same = na == STEPS && nb == STEPS;
    for (int i = from; same && i < STEPS; i++) same = la[i] == lb[i];
    CHECK(same, "%s: losses differ (%d and %d steps)", what, na, nb);
    if (same) printf("  ok %s: steps %d..%d equal (last %.6f)\n", what, from + 1, STEPS, lb[STEPS - 1]);
}

int main(void) {
    char dir[64], cmd[4096], model[128], data[128];
    snprintf(dir, sizeof dir, "/tmp/en_test_ftbe_%d", (int)getpid());
    snprintf(model, sizeof model, "%s/model", dir);
    snprintf(data, sizeof data, "%s/docs.txt", dir);
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && for i in $(seq 1 80); do echo \"Order $i ships from bay $((i %% 5)) "
             "with $((i %% 11)) boxes.\"; [ $((i %% 5)) -eq 0 ] && echo; done > %s && "
             "%s tokenizer train --data %s --vocab-size 300 --out %s/tok.model >/dev/null 2>&1 && "
             "echo '{\"model_type\":\"llama\",\"hidden_size\":48,\"intermediate_size\":96,"
             "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
             "\"max_position_embeddings\":64}' > %s/cfg.json && "
             "%s init --config %s/cfg.json --tokenizer %s/tok.model --out %s >/dev/null 2>&1",
             dir, data, EN_BINARY, data, dir, dir, EN_BINARY, dir, dir, model);
    if (system(cmd) != 0) {
        fprintf(stderr, "could not make the test model: %s\n", cmd);
        return 1;
    }
    en_err err = {0};
    en_backend *cpu = NULL, *guard = NULL;
    en_backend_config bc = en_backend_config_default();
    bc.n_threads = 2;
    if (en_backend_cpu_create(&bc, &cpu, &err) || en_backend_guard_create(&bc, &guard, &err)) {
        fprintf(stderr, "test_finetune_backend: %s\n", err.msg);
        return 1;
    }
    for (int lora = 1; lora >= 0; lora--) {
        const char *kind = lora ? "lora" : "full";
        char a[320], b[320], r[320], fa[400], fb[400];
        snprintf(a, sizeof a, "%s/%s_cpu", dir, kind);
        snprintf(b, sizeof b, "%s/%s_guard", dir, kind);
        snprintf(r, sizeof r, "%s/%s_resume", dir, kind);
        CHECK(run(model, data, a, lora, cpu, 0), "%s: the CPU run failed", kind);
        CHECK(run(model, data, b, lora, guard, 0), "%s: the guard run failed", kind);
        char what[96];
        snprintf(what, sizeof what, "%s, guard backend vs CPU", kind);
        compare(what, a, b, 0);
        const char *outf = lora ? "adapter_model.safetensors" : "model/model.safetensors";
        snprintf(fa, sizeof fa, "%s/%s", a, outf);
        snprintf(fb, sizeof fb, "%s/%s", b, outf);
        CHECK(same_file(fa, fb), "%s: %s differs between the backends", kind, outf);
        /* resume on the guard backend from step 5 */
        snprintf(cmd, sizeof cmd, "cp -r %s %s && rm -rf %s/checkpoints/step-*10", b, r, r);
        CHECK(system(cmd) == 0, "%s", cmd);
        CHECK(run(model, data, r, lora, guard, 1), "%s: resume on the guard backend failed", kind);
        snprintf(what, sizeof what, "%s, resumed at step 5 on the guard backend", kind);
        compare(what, a, r, 5);
    }
    en_backend_destroy(guard);
    en_backend_destroy(cpu);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (en_test_failures == 0 && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return en_test_finish("test_finetune_backend");
}
