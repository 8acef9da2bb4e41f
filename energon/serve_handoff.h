/*
 * serve_handoff.h - `energon finetune --serve-url`: hand a finished LoRA
 * adapter to a running `energon serve` (POST /v1/adapters, see
 * serve/http_adapters.c) so that it serves the adapter by name without a
 * restart.
 *
 * Before training, en_serve_handoff_check asks the server whether it would
 * take the run's name, path and rank (a dry run: nothing is loaded), so
 * that a refusal costs no training. Left out: retries; the caller decides
 * what a failure means (a server that is not up yet may start while the run
 * trains). Used by energon/cmd_finetune.c.
 */
#ifndef EN_SERVE_HANDOFF_H
#define EN_SERVE_HANDOFF_H

#include <stddef.h>

/* Connect and whole-request limits, in seconds. Loading an adapter reads its
 * safetensors file, so the server gets a while to answer. */
#define EN_HANDOFF_CONNECT_S 10
#define EN_HANDOFF_TIMEOUT_S 120

/* How the server answered. */
typedef struct en_serve_handoff_answer {
    long status;    /* HTTP status; 0 when no answer came (see msg) */
    int reached;    /* 1 when the transfer itself worked (status is the server's) */
    int rank;       /* on 200: the loaded adapter's LoRA rank ("rank"); else 0 */
    char code[64];  /* on an error answer: error.code, else error.type; may be empty */
    char msg[600];  /* error.message, the body, or libcurl's error when not reached */
    char url[1100]; /* the endpoint posted to: BASE/v1/adapters */
} en_serve_handoff_answer;

/* The base address of url: trailing slashes and one trailing "/v1" (an
 * OpenAI base URL) removed, into out[cap]. Returns 1, or 0 when nothing is
 * left or it does not fit. Pure; thread-safe. */
int en_serve_handoff_base(const char *url, char *out, size_t cap);

/* POST {"name": name, "path": path} to BASE/v1/adapters (BASE from url as
 * en_serve_handoff_base makes it) with "Authorization: Bearer api_key" when
 * api_key is not NULL or empty; connect timeout EN_HANDOFF_CONNECT_S, the
 * whole request EN_HANDOFF_TIMEOUT_S. All strings are borrowed.
 * Returns 0 when the server answered 200 with an adapter (ans->rank set),
 * else 1 with ans saying why: reached = 0 for a transfer that failed
 * (connection refused, timeout, bad URL: msg is libcurl's message), else the
 * status and the server's error. Calls curl_global_init/cleanup itself, so
 * it must not run beside other libcurl users. */
int en_serve_handoff(const char *url, const char *api_key, const char *name, const char *path,
                     en_serve_handoff_answer *ans);

/* The same POST with "dry_run": true and "rank": rank (>= 1): the server
 * answers 200 or the 4xx a load would get now (serve/http_adapters.c), and
 * loads nothing; path need not exist yet. Returns 0 on a dry run's 200
 * ({"dry_run": true}), else 1 with ans as for en_serve_handoff (a 200
 * without "dry_run": a server from before dry runs). Same limits and
 * libcurl rule. */
int en_serve_handoff_check(const char *url, const char *api_key, const char *name,
                           const char *path, int rank, en_serve_handoff_answer *ans);

#endif
