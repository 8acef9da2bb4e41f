/*
 * fuzz_adapters_request.c - libFuzzer target for the body of POST
 * /v1/adapters (serve/adapters_request.c): any bytes as the body give a
 * name and path to load (with dry_run 0 or 1 and a rank of 0, not given, or
 * 1..EN_LORA_RANK_MAX), or a 400 / 409 naming the field, never a crash,
 * leak or sanitizer report. Each input is read for two base models: one
 * whose name an adapter could take ("base") and one it could not
 * ("org/base-model"). serve/adapters.c is linked for en_adapter_name_ok;
 * the two LoRA calls it makes are defined here and never run. Seeds:
 * tests/fuzz/corpus/adapters_request/ (the bodies of tests/serve/adapters.py
 * and odd names). Run: tests/fuzz/run.sh 60 adapters_request
 */
// fuzz-sources: serve/adapters_request.c serve/oa_json.c serve/adapters.c common/status.c
// fuzz-libs: -ljansson -lpthread
#include <stdlib.h>
#include <string.h>

#include "serve/adapters_request.h"

/* adapters.c's set frees and inspects adapters; no set is made here. */
void en_lora_destroy(en_lora *l) {
    (void)l;
    abort();
}

const en_lora_config *en_lora_get_config(const en_lora *l) {
    (void)l;
    abort();
}

static void one(const uint8_t *data, size_t size, const char *base) {
    oa_err e = {0};
    adapters_req q;
    if (adapters_req_parse((const char *)data, size, base, &q, &e) == 0) {
        if (e.status || !q.body || !q.name || !q.path || !*q.path) abort();
        if (!en_adapter_name_ok(q.name) || strcmp(q.name, base) == 0) abort();
        if ((q.dry_run != 0 && q.dry_run != 1) || q.rank < 0 || q.rank > EN_LORA_RANK_MAX) abort();
        adapters_req_free(&q);
        if (q.body || q.name || q.path) abort();
        return;
    }
    if (q.body || q.name || q.path) abort(); /* nothing left to free */
    if ((e.status != 400 && e.status != 409) || !e.msg[0]) abort();
    if (e.status == 409 && strcmp(e.param, "name") != 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    one(data, size, "base");
    one(data, size, "org/base-model");
    return 0;
}
