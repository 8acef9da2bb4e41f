/*
 * cmd_serve.c - `energon serve`: load a model, start the serving engine
 * (continuous batching over a paged KV cache) and the OpenAI-compatible HTTP
 * server, and run until SIGTERM or SIGINT.
 *
 * Order: bind first (a taken port fails before minutes of loading; /health
 * says 503 meanwhile), then load the model and create the engine, then hand
 * them to the server. Signals are blocked in every thread and taken by
 * sigwait in this one, so no work happens in a signal handler. On a signal:
 * stop accepting, let running requests finish within --grace seconds,
 * cancel the rest, exit 0.
 *
 * Before any of that, unless the user chose an OpenMP wait policy, serve
 * runs itself again with one (exec_omp_wait: a short spin where the cores
 * are free, passive where other work has them).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h> /* mallopt */
#endif

#include "../common/blas_core.h"
#include "../common/file.h"
#include "../rag/index.h"
#include "../serve/adapters.h"
#include "../serve/engine.h"
#include "../serve/retrieval.h"
#include "../serve/server.h"
#include "../tokenizer/chat.h"
#include "cli.h"

#define CMD "serve"

/* --index: an energon index opens (its meta table and schema version are
 * checked); requests then open their own connections (http_retrieve.c). */
static int index_ok(const char *path) {
    en_err err = {0};
    en_index *idx = NULL;
    if (access(path, R_OK) != 0) {
        en_cli_error(CMD, "--index: %s: %s", path, strerror(errno));
        return 0;
    }
    if (en_index_open(path, 0, &idx, &err)) {
        en_cli_error(CMD, "--index: %s is not an energon index: %s", path, err.msg);
        return 0;
    }
    en_index_destroy(idx);
    return 1;
}

/* --index with vectors (energon index --embed): they must be this model's,
 * checked once the model is loaded rather than failing every request. */
static int index_model_ok(const char *path, const char *model_dir, const en_model *m) {
    en_err err = {0};
    en_index *idx = NULL;
    en_retrieval_model id;
    en_status st = en_index_open(path, 0, &idx, &err);
    if (st == EN_OK) st = en_retrieval_model_id(model_dir, m, &id, &err);
    if (st == EN_OK) st = en_retrieval_check_model(idx, &id, &err);
    en_index_destroy(idx);
    if (st != EN_OK) en_cli_error(CMD, "--index: %s", err.msg);
    return st == EN_OK;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: energon serve --model DIR [options]\n"
            "\n"
            "Serve the model in DIR (a Hugging Face directory with tokenizer.json or\n"
            "tokenizer.model) over an OpenAI-compatible HTTP API: /v1/chat/completions,\n"
            "/v1/completions, /v1/embeddings, /v1/models, /health, /metrics, /tokenize,\n"
            "/detokenize and a chat page at /.\n"
            "\n"
            "  --adapter RUN_DIR       a LoRA adapter (run directory or PEFT directory)\n"
            "                          applied to every request for the base model\n"
            "  --adapter NAME=RUN_DIR  an adapter served by name beside the base (repeat for\n"
            "                          more): a request's \"model\" picks it; requests of\n"
            "                          different adapters share the batched steps\n"
            "  --adapter-dir DIR       POST /v1/adapters may load adapters from DIR while\n"
            "                          serving (DELETE /v1/adapters/NAME unloads)\n"
            "  --index INDEX.db        POST /v1/retrieve searches this document index (made\n"
            "                          by energon index)\n"
            "  --max-adapters N        named adapters loaded at once (default 16)\n"
            "  --max-lora-rank R       largest adapter rank accepted (default 64)\n"
            "  --host ADDR             address to bind (default 127.0.0.1: this machine only)\n"
            "  --port N                TCP port (default 8080; 0 = any free port)\n"
            "  --api-key KEY           require 'Authorization: Bearer KEY'\n"
            "  --api-key-file F        the same, with the key read from file F\n"
            "  --model-name NAME       the model id clients use (default: basename of DIR)\n"
            "  --chat-template T       FILE.jinja or plain | llama2 | chatml (default: the\n"
            "                          model's chat_template.jinja or tokenizer_config.json\n"
            "                          template, else plain)\n"
            "  --ctx N                 context per request, prompt + answer (default: the\n"
            "                          model's maximum, at most 4096)\n"
            "  --max-batch N           sequences decoded together (default 32)\n"
            "  --kv-cache-tokens N     KV-cache budget in tokens (default --max-batch x --ctx,\n"
            "                          at most 1 GiB of cache)\n"
            "  --max-queue N           waiting requests before 429 (default 256)\n"
            "  --prefill-chunk N       prompt tokens per step, over all requests (default 256)\n"
            "  --block-size N          tokens per KV-cache block (default 16)\n"
            "  --no-prefix-cache       never share KV blocks between requests (by default a\n"
            "                          prompt that starts with another's full blocks of\n"
            "                          tokens reuses their keys and values)\n"
            "  --max-body BYTES        largest request body (default 1048576)\n"
            "  --timeout S             idle connection timeout: no byte sent or received\n"
            "                          for S seconds (default 30)\n"
            "  --request-timeout S     total time a client has to send a request's head and\n"
            "                          body, however slowly it drips (default 30)\n"
            "  --max-connections N     open connections, idle ones included (default 4096;\n"
            "                          the open-file limit is raised to fit)\n"
            "  --max-client-connections N  open connections per client address (default:\n"
            "                          no cap)\n"
            "  --http-threads N        event threads for HTTP (default: one per core, 2..8)\n"
            "  --grace S               on SIGTERM, time for running requests (default 30)\n"
            "  --embedding-pooling P   mean | last: how /v1/embeddings pools the final\n"
            "                          hidden states of an input's tokens (default mean)\n"
            "  --quiet                 no per-request log lines\n"
            "  --threads N             CPU threads\n"
            "  --device cpu|cuda       compute device (default cpu)\n"
            "  --weights W             auto | f32 | bf16 | f16 | q8 | q4 | q4_1: weight\n"
            "                          matrices in memory (default auto: as the checkpoint\n"
            "                          stores them; --dtype: the older name; see\n"
            "                          docs/quantization.md)\n"
            "  --output-weights W      with q8|q4|q4_1: f32 | q8 | q4 | q4_1 for the output\n"
            "                          projection (default q8)\n"
            "  --precision P           fp32 | tf32 | bf16: matmul arithmetic (default bf16 on\n"
            "                          cuda; the CPU has fp32 only)\n"
            "\n"
            "  --omp-wait W            auto | spin | passive: how OpenMP threads wait\n"
            "                          between parallel regions (default auto: spin briefly\n"
            "                          if the cores the threads need are idle at startup,\n"
            "                          else sleep); ignored when OMP_WAIT_POLICY or\n"
            "                          GOMP_SPINCOUNT is set: see docs/serving.md\n");
}

/* OpenMP's default wait policy spins: a thread waiting for the next
 * parallel region or at a barrier keeps its core. A decode step opens
 * dozens of small regions, and on a machine whose cores are shared (more
 * runnable threads than cores) the spinning thread takes the core that the
 * thread it waits for needs, so a fork-join can cost a time slice: on a
 * loaded 2-core machine the server spent most of its time in libgomp's spin
 * loop and served 14 tok/s at concurrency 1 and ~100 at 32, against 95 and
 * ~440 with OMP_WAIT_POLICY=passive (issue 13). But a sleeping thread takes
 * a futex wake-up at every region: on 2 idle cores (s110m q4) passive
 * served 158-169 tok/s at concurrency 1 against 246-278 with a spin of
 * GOMP_SPINCOUNT=3000-10000 iterations before sleeping, while with 2 busy
 * loops beside it the short spin lost (95 against 139). So --omp-wait auto
 * looks at the machine at startup: spin (GOMP_SPINCOUNT=10000) when at
 * least as many cores as threads were idle over 200 ms, else passive.
 * libgomp reads these when it is loaded, before main, so the only way to
 * choose here is to run again with one set (execv keeps the pid, the
 * descriptors and the signal mask). Nothing happens when the user set
 * either variable, and if the exec fails the server goes on with the
 * default. */

/* CPU time counters of /proc/stat's first line: idle (idle + iowait) and
 * total; 0 when it cannot be read. */
static int cpu_times(unsigned long long *idle, unsigned long long *total) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return 0;
    unsigned long long v[8] = {0};
    const int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                         &v[3], &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n < 4) return 0;
    *idle = v[3] + v[4];
    *total = 0;
    for (int i = 0; i < 8; i++) *total += v[i];
    return 1;
}

/* How many cores were idle over the next 200 ms; -1 if unknown. */
static double idle_cores(void) {
    unsigned long long i0, t0, i1, t1;
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 1 || !cpu_times(&i0, &t0)) return -1.0;
    const struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    if (!cpu_times(&i1, &t1) || t1 <= t0) return -1.0;
    return (double)ncpu * (double)(i1 - i0) / (double)(t1 - t0);
}

/* mode: "auto", "spin" or "passive" (checked); n_threads 0 for all cores. */
static void exec_omp_wait(int argc, char **argv, const char *mode, int n_threads) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    int spin = strcmp(mode, "spin") == 0;
    if (strcmp(mode, "auto") == 0) {
        const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        const int need = n_threads > 0 ? n_threads : (int)(ncpu > 0 ? ncpu : 1);
        spin = idle_cores() >= (double)need - 0.25;
    }
    const char *var = spin ? "GOMP_SPINCOUNT" : "OMP_WAIT_POLICY";
    char **av = en_calloc((size_t)argc + 2, sizeof *av);
    if (!av || setenv(var, spin ? "10000" : "passive", 1) != 0) {
        en_free(av);
        return;
    }
    av[0] = "energon"; /* argv is main's from "serve" on */
    for (int i = 0; i < argc; i++) av[i + 1] = argv[i];
    fflush(NULL);
    execv("/proc/self/exe", av);
    unsetenv(var); /* still here: the exec failed */
    en_free(av);
}

/* The key from --api-key-file: the first line, without surrounding space. */
static char *read_key_file(const char *path) {
    char *data = NULL;
    size_t len = 0;
    en_err err = {0};
    if (en_file_read_all(path, &data, &len, &err) != EN_OK) {
        en_cli_error(CMD, "--api-key-file: %s", err.msg);
        return NULL;
    }
    char *s = data;
    while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n') s++;
    size_t n = strcspn(s, "\r\n");
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
    if (n == 0) {
        en_cli_error(CMD, "--api-key-file: %s holds no key", path);
        en_free(data);
        return NULL;
    }
    memmove(data, s, n);
    data[n] = 0;
    return data;
}

/* --adapter NAME=DIR: each loaded and added to the set by name. */
static int load_named(en_cli_model *cm, en_adapter_set *set, const char *const *named, int n) {
    en_err err = {0};
    for (int i = 0; i < n; i++) {
        const char *eq = strchr(named[i], '=');
        char name[EN_ADAPTER_NAME_MAX];
        snprintf(name, sizeof name, "%.*s", (int)(eq - named[i]), named[i]);
        en_lora *l = NULL;
        int rank = 0, max_adapters;
        /* --max-lora-rank goes into the load: refused before allocation */
        en_lora_load_opts o = en_lora_load_opts_default();
        en_adapter_set_limits(set, &max_adapters, &o.max_rank);
        o.max_rank_flag = "--max-lora-rank";
        en_status st = en_lora_load_peft_opts(cm->be, en_model_get_hparams(cm->model), eq + 1,
                                              &o, &l, &err);
        if (st == EN_OK) {
            rank = en_lora_get_config(l)->rank;
            st = en_adapter_set_add(set, name, eq + 1, l, &err);
        }
        if (st != EN_OK) {
            en_cli_error(CMD, "--adapter %s: %s", named[i], err.msg);
            return EN_EXIT_ERROR;
        }
        fprintf(stderr, "energon serve: adapter '%s' from %s (rank %d)\n", name, eq + 1, rank);
    }
    return EN_EXIT_OK;
}

/* A server loads and frees adapters (and request buffers) on many threads
 * for days. glibc raises its mmap threshold to the size of each large block
 * freed, after which blocks of that size come from the heap of whichever
 * thread's arena asked, and arenas keep what is freed: resident memory then
 * creeps after every adapter unloaded on a new connection thread. A fixed
 * threshold keeps every block of 1 MiB or more a mapping of its own, given
 * back to the system when freed (tests/serve/finetuned_adapters.py). */
static void server_malloc_policy(void) {
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
}

int en_cmd_serve(int argc, char **argv) {
    server_malloc_policy();
    en_cli_load_opts lo = {0};
    lo.need_tokenizer = 1;
    en_server_config sc = en_server_config_default();
    en_engine_config ec = en_engine_config_default();
    const char *api_key = NULL, *api_key_file = NULL, *tmpl_name = NULL, *model_name = NULL;
    int grace = 30, quiet = 0, bad = 0, max_body = 0;
    const char *omp_wait = "auto";
    int max_adapters = 16, max_rank = 64, n_named = 0;
    const char *named[64]; /* NAME=DIR of --adapter */
    en_err err = {0};
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        if (en_cli_switch(argv, i, "--help") || en_cli_switch(argv, i, "-h")) {
            usage(stdout);
            return EN_EXIT_OK;
        } else if (strcmp(argv[i], "--adapter") == 0 && i + 1 < argc && strchr(argv[i + 1], '=')) {
            if (n_named == 64) {
                en_cli_error(CMD, "--adapter NAME=DIR: at most 64 at start-up");
                bad = 1;
            } else {
                named[n_named++] = argv[i + 1];
            }
            i++;
        } else if (en_cli_load_flag(CMD, argc, argv, &i, &lo, &bad)) {
        } else if (en_cli_flag(argc, argv, &i, "--host", &v, &bad)) {
            sc.host = v;
        } else if (en_cli_flag(argc, argv, &i, "--port", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--port", v, 0, 65535, &sc.port)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--api-key", &v, &bad)) {
            api_key = v;
        } else if (en_cli_flag(argc, argv, &i, "--api-key-file", &v, &bad)) {
            api_key_file = v;
        } else if (en_cli_flag(argc, argv, &i, "--model-name", &v, &bad)) {
            model_name = v;
        } else if (en_cli_flag(argc, argv, &i, "--chat-template", &v, &bad)) {
            tmpl_name = v;
        } else if (en_cli_flag(argc, argv, &i, "--ctx", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--ctx", v, 1, 1 << 24, &ec.n_ctx)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--max-batch", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--max-batch", v, 1, 4096, &ec.max_batch)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--kv-cache-tokens", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--kv-cache-tokens", v, 1, 1 << 30, &ec.kv_cache_tokens))
                bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--prefill-chunk", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--prefill-chunk", v, 1, 1 << 20, &ec.prefill_chunk))
                bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--block-size", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--block-size", v, 1, 1024, &ec.block_size)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--max-queue", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--max-queue", v, 0, 1 << 24, &ec.max_queue)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--max-body", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--max-body", v, 1024, 1 << 30, &max_body)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--timeout", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--timeout", v, 1, 86400, &sc.io_timeout_s)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--request-timeout", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--request-timeout", v, 1, 86400, &sc.request_timeout_s))
                bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--max-client-connections", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--max-client-connections", v, 1, 65536,
                                    &sc.max_client_connections))
                bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--http-threads", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--http-threads", v, 1, 64, &sc.http_threads)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--max-connections", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--max-connections", v, 1, 65536, &sc.max_connections))
                bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--grace", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--grace", v, 0, 86400, &grace)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--embedding-pooling", &v, &bad)) {
            if (!bad && strcmp(v, "mean") == 0) {
                sc.embedding_pooling = EN_EMBED_MEAN;
            } else if (!bad && strcmp(v, "last") == 0) {
                sc.embedding_pooling = EN_EMBED_LAST;
            } else if (!bad) {
                en_cli_error(CMD, "--embedding-pooling: '%s' is not mean or last", v);
                bad = 1;
            }
        } else if (en_cli_flag(argc, argv, &i, "--adapter-dir", &v, &bad)) {
            sc.adapter_dir = v;
        } else if (en_cli_flag(argc, argv, &i, "--index", &v, &bad)) {
            sc.index_path = v;
        } else if (en_cli_flag(argc, argv, &i, "--max-adapters", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--max-adapters", v, 1, 4096, &max_adapters)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--max-lora-rank", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--max-lora-rank", v, 1, 65536, &max_rank)) bad = 1;
        } else if (en_cli_switch(argv, i, "--no-prefix-cache")) {
            ec.no_prefix_cache = 1;
        } else if (en_cli_switch(argv, i, "--quiet")) {
            quiet = 1;
        } else if (en_cli_flag(argc, argv, &i, "--omp-wait", &v, &bad)) {
            if (!bad && strcmp(v, "auto") != 0 && strcmp(v, "spin") != 0 &&
                strcmp(v, "passive") != 0) {
                en_cli_error(CMD, "--omp-wait: '%s' is not auto, spin or passive", v);
                bad = 1;
            }
            omp_wait = v;
        } else {
            en_cli_error(CMD, "unknown argument '%s' (see energon serve --help)", argv[i]);
            bad = 1;
        }
    }
    if (bad) return EN_EXIT_USAGE;
    if (!lo.dir) {
        en_cli_error(CMD, "--model DIR is required (see energon serve --help)");
        return EN_EXIT_USAGE;
    }
    if (lo.tp > 1) {
        en_cli_error(CMD, "--tp: tensor-parallel serving is not supported; serve on one process");
        return EN_EXIT_USAGE;
    }
    if (api_key && api_key_file) {
        en_cli_error(CMD, "--api-key and --api-key-file both given; use one");
        return EN_EXIT_USAGE;
    }
    if (api_key && !*api_key) {
        en_cli_error(CMD, "--api-key: the key is empty");
        return EN_EXIT_USAGE;
    }
    if (sc.adapter_dir && !en_path_is_dir(sc.adapter_dir)) {
        en_cli_error(CMD, "--adapter-dir: %s is not a directory", sc.adapter_dir);
        return EN_EXIT_USAGE;
    }
    if (sc.index_path && !index_ok(sc.index_path)) return EN_EXIT_USAGE;
    if (n_named > max_adapters) {
        en_cli_error(CMD, "%d --adapter NAME=DIR given but --max-adapters is %d", n_named,
                     max_adapters);
        return EN_EXIT_USAGE;
    }
    exec_omp_wait(argc, argv, omp_wait, lo.n_threads);
    char name_buf[256];
    en_cli_dir_basename(lo.dir, name_buf, sizeof name_buf);
    char *key_buf = NULL;
    if (api_key_file && !(key_buf = read_key_file(api_key_file))) return EN_EXIT_USAGE;
    sc.api_key = key_buf ? key_buf : api_key;
    sc.model_name = model_name ? model_name : name_buf;
    sc.log_requests = !quiet;
    if (max_body) sc.max_body_bytes = (size_t)max_body;

    /* Block the stop signals before any thread exists (MHD's, the
     * engine's, OpenMP's), so that every thread inherits the mask and only
     * sigwait below ever sees them. */
    sigset_t stop_set;
    sigemptyset(&stop_set);
    sigaddset(&stop_set, SIGINT);
    sigaddset(&stop_set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_set, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client that vanished is an error return, not a death */

    int rc = EN_EXIT_ERROR;
    en_server *srv = NULL;
    en_engine *eng = NULL;
    en_cli_model cm;
    en_chat_template *tmpl = NULL;
    int loaded = 0;
    en_adapter_set *set = NULL;
    if (en_adapter_set_create(max_adapters, max_rank, &set, &err) != EN_OK) {
        en_cli_error(CMD, "%s", err.msg);
        return EN_EXIT_USAGE;
    }
    sc.adapters = set;
    /* Bind first, so that a taken port fails at once; requests get 503
     * until the model is in. "listening" is printed once it is. */
    if (en_server_start(NULL, NULL, NULL, &sc, &srv, &err) != EN_OK) {
        en_cli_error(CMD, "%s", err.msg);
        goto done;
    }
    int v6 = strchr(sc.host, ':') != NULL;
    fprintf(stderr, "energon serve: bound to %s%s%s:%d; loading %s\n", v6 ? "[" : "", sc.host,
            v6 ? "]" : "", en_server_port(srv), lo.dir);
    if (!sc.api_key && strcmp(sc.host, "127.0.0.1") != 0 && strcmp(sc.host, "localhost") != 0 &&
        strcmp(sc.host, "::1") != 0)
        fprintf(stderr, "energon serve: warning: listening beyond this machine without "
                        "--api-key: anyone who can reach %s can use the model\n",
                sc.host);

    rc = en_cli_load(CMD, &lo, &cm);
    if (rc) goto done;
    loaded = 1;
    if (sc.index_path && !index_model_ok(sc.index_path, lo.dir, cm.model)) {
        rc = EN_EXIT_USAGE;
        goto done;
    }
    rc = load_named(&cm, set, named, n_named);
    if (rc) goto done;
    rc = en_cli_chat_template(CMD, lo.dir, tmpl_name, cm.tok, &tmpl);
    if (rc) goto done;
    rc = EN_EXIT_ERROR;
    ec.n_stop_ids = en_cli_template_stop_ids(tmpl, cm.tok, ec.stop_ids, 8);
    if (en_engine_create(cm.model, cm.tok, &ec, &eng, &err) != EN_OK) {
        en_cli_error(CMD, "%s", err.msg);
        goto done;
    }
    en_server_set_engine(srv, eng, cm.tok, tmpl);
    const en_engine_config *got = en_engine_get_config(eng);
    fprintf(stderr, "energon serve: listening on http://%s%s%s:%d (model %s): context %d "
                    "tokens, batch %d, KV cache %d tokens (%d-token blocks), tokenizer %s, chat "
                    "template %s\n",
            v6 ? "[" : "", sc.host, v6 ? "]" : "", en_server_port(srv), sc.model_name,
            en_engine_n_ctx(eng), got->max_batch, got->kv_cache_tokens, got->block_size,
            en_tokenizer_file(cm.tok), en_chat_template_describe(tmpl));
    const char *owp = getenv("OMP_WAIT_POLICY"), *osc = getenv("GOMP_SPINCOUNT");
    fprintf(stderr, "energon serve: OpenMP threads wait with %s%s (--omp-wait %s)\n",
            owp ? "OMP_WAIT_POLICY=" : osc ? "GOMP_SPINCOUNT=" : "libgomp's default",
            owp ? owp : osc ? osc : "", omp_wait);
    char blas[256];
    en_blas_core_describe(blas, sizeof blas);
    fprintf(stderr, "energon serve: BLAS (prefill): %s\n", blas);

    int sig = 0;
    while (sigwait(&stop_set, &sig) != 0) {
    }
    fprintf(stderr, "energon serve: %s: stopping (running requests get up to %d s)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", grace);
    rc = EN_EXIT_OK;
done:
    /* The server goes first: it borrows the engine and the tokenizer. */
    en_server_stop(srv, grace);
    if (eng) en_engine_destroy(eng);
    en_chat_template_destroy(tmpl);
    en_adapter_set_destroy(set); /* after the engine: no request holds one now */
    if (loaded) en_cli_unload(&cm);
    en_free(key_buf);
    if (rc == EN_EXIT_OK) fprintf(stderr, "energon serve: stopped\n");
    return rc;
}
