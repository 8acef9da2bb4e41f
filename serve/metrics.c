/*
 * metrics.c - GET /metrics in the Prometheus text format 0.0.4: request
 * counters kept by the server, and the engine's snapshot (queue, KV cache,
 * token counters, time-to-first-token and inter-token latency histograms).
 * Engine series are left out while the model is loading.
 */
#include <stdio.h>

#include "http_impl.h"

static void gauge(char **b, size_t *n, size_t *c, const char *name, const char *help, double v) {
    buf_printf(b, n, c, "# HELP %s %s\n# TYPE %s gauge\n%s %.17g\n", name, help, name, name, v);
}

static void counter(char **b, size_t *n, size_t *c, const char *name, const char *help,
                    uint64_t v) {
    buf_printf(b, n, c, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name,
               (unsigned long long)v);
}

static void counter_f(char **b, size_t *n, size_t *c, const char *name, const char *help,
                      double v) {
    buf_printf(b, n, c, "# HELP %s %s\n# TYPE %s counter\n%s %.9g\n", name, help, name, name, v);
}

/* The engine's buckets are cumulative already (count[i]: observations
 * <= bounds[i]; count[N]: all of them, the +Inf bucket). */
static void histogram(char **b, size_t *n, size_t *c, const char *name, const char *help,
                      const double *bounds, const uint64_t *count, double sum, uint64_t total) {
    buf_printf(b, n, c, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < EN_ENGINE_HIST_N; i++)
        buf_printf(b, n, c, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i],
                   (unsigned long long)count[i]);
    buf_printf(b, n, c, "%s_bucket{le=\"+Inf\"} %llu\n", name,
               (unsigned long long)count[EN_ENGINE_HIST_N]);
    buf_printf(b, n, c, "%s_sum %.17g\n%s_count %llu\n", name, sum, name,
               (unsigned long long)total);
}

enum MHD_Result metrics_send(http_req *r) {
    char *b = NULL;
    size_t n = 0, c = 0;
    srv_requests_metrics(r->srv, &b, &n, &c);
    srv_conns_metrics(r->srv, &b, &n, &c);
    en_engine *e = NULL;
    if (srv_get_engine(r->srv, &e, NULL)) {
        en_engine_stats st;
        en_engine_get_stats(e, &st);
        counter(&b, &n, &c, "energon_prompt_tokens_total", "Prompt tokens prefilled.",
                st.prompt_tokens);
        counter(&b, &n, &c, "energon_generation_tokens_total", "Tokens generated.",
                st.generated_tokens);
        histogram(&b, &n, &c, "energon_time_to_first_token_seconds",
                  "Time from submission to the first generated token.", st.hist_bounds,
                  st.ttft_count, st.ttft_sum, st.ttft_n);
        histogram(&b, &n, &c, "energon_inter_token_latency_seconds",
                  "Time between consecutive tokens of a request.", st.hist_bounds, st.itl_count,
                  st.itl_sum, st.itl_n);
        gauge(&b, &n, &c, "energon_requests_running", "Requests in the running batch.",
              st.running);
        gauge(&b, &n, &c, "energon_requests_waiting", "Requests waiting for admission.",
              st.waiting);
        gauge(&b, &n, &c, "energon_kv_cache_blocks_used", "KV-cache blocks in use.",
              st.kv_blocks_used);
        gauge(&b, &n, &c, "energon_kv_cache_blocks_total", "KV-cache blocks in the pool.",
              st.kv_blocks_total);
        gauge(&b, &n, &c, "energon_kv_cache_block_size", "Tokens per KV-cache block.",
              st.block_size);
        counter(&b, &n, &c, "energon_engine_steps_total", "Batched forward steps run.",
                st.steps);
        counter(&b, &n, &c, "energon_engine_step_tokens_total",
                "Tokens fed to the forward steps (prompt chunks and decode tokens).",
                st.step_tokens);
        counter_f(&b, &n, &c, "energon_engine_forward_seconds_total",
                  "Seconds in the forward steps.", st.forward_s);
        counter_f(&b, &n, &c, "energon_engine_sample_seconds_total",
                  "Seconds after the forward steps: sampling, events, stop strings.",
                  st.sample_s);
        counter(&b, &n, &c, "energon_preemptions_total",
                "Running requests whose KV blocks were taken back (recomputed later).",
                st.preemptions);
        counter(&b, &n, &c, "energon_prefix_cache_queries_total",
                "Prompt tokens in full KV blocks looked up in the prefix cache.",
                st.prefix_queries);
        counter(&b, &n, &c, "energon_prefix_cache_hits_total",
                "Prompt tokens found in the prefix cache (their prefill skipped).",
                st.prefix_hits);
        counter(&b, &n, &c, "energon_prefix_cache_evictions_total",
                "Cached KV blocks evicted to make room.", st.prefix_evictions);
        gauge(&b, &n, &c, "energon_prefix_cache_blocks",
              "KV blocks in the prefix cache (held by a request or idle).",
              st.prefix_cached_blocks);
    }
    en_adapter_set *set = srv_adapters(r->srv);
    if (set) {
        int loaded = 0, draining = 0;
        en_adapter_set_counts(set, &loaded, &draining);
        gauge(&b, &n, &c, "energon_lora_adapters_loaded", "LoRA adapters loaded by name.",
              loaded);
        gauge(&b, &n, &c, "energon_lora_adapters_draining",
              "Adapters unloaded but still used by running requests.", draining);
    }
    if (!b) return MHD_NO;
    enum MHD_Result ret =
        http_send_text(r, 200, "text/plain; version=0.0.4; charset=utf-8", b, n, 0);
    en_free(b);
    return ret;
}
