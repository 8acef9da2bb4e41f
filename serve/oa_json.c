/*
 * oa_json.c - OpenAI-shaped errors and the JSON field readers of the
 * endpoints (http_impl.h): each names the field at fault. Apart from the
 * rest of the HTTP layer so that the request parsers link without
 * libmicrohttpd (tests/fuzz/).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "http_impl.h"

/* ---- errors ---- */

int oa_fail(oa_err *e, int status, const char *code, const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = status >= 500 ? "server_error" : "invalid_request_error";
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- JSON fields ---- */

/* A present, non-null value (OpenAI clients send null for "not given"). */
static const json_t *field(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

int oa_get_bool(const json_t *o, const char *key, const char *param, int *out, oa_err *e) {
    const json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_boolean(v))
        return oa_fail(e, 400, NULL, param ? param : key, "%s must be a boolean",
                       param ? param : key);
    *out = json_is_true(v);
    return 0;
}

int oa_get_int(const json_t *o, const char *key, const char *param, long long lo, long long hi,
               long long *out, oa_err *e) {
    const char *p = param ? param : key;
    const json_t *v = field(o, key);
    if (!v) return 0;
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v)) {
        /* 5.0 is an integer to most JSON writers; 1e30 or 2.5 is not. The
         * range check comes first so that the cast below is defined. */
        double d = json_real_value(v);
        if (!(d >= (double)lo && d <= (double)hi && fabs(d) < 9e18))
            return oa_fail(e, 400, NULL, p, "%s must be an integer from %lld to %lld", p, lo,
                           hi);
        if (d != floor(d)) return oa_fail(e, 400, NULL, p, "%s must be an integer", p);
        x = (long long)d;
    } else {
        return oa_fail(e, 400, NULL, p, "%s must be an integer", p);
    }
    if (x < lo || x > hi)
        return oa_fail(e, 400, NULL, p, "%s must be an integer from %lld to %lld (got %lld)", p,
                       lo, hi, x);
    *out = x;
    return 0;
}

int oa_get_num(const json_t *o, const char *key, const char *param, double lo, double hi,
               int lo_open, double *out, oa_err *e) {
    const char *p = param ? param : key;
    const json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_number(v)) return oa_fail(e, 400, NULL, p, "%s must be a number", p);
    double d = json_number_value(v);
    int ok = lo_open ? d > lo : d >= lo;
    if (!ok || !(d <= hi))
        return oa_fail(e, 400, NULL, p, "%s must be a number %s %g and <= %g (got %g)", p,
                       lo_open ? ">" : ">=", lo, hi, d);
    *out = d;
    return 0;
}

int oa_get_str(const json_t *o, const char *key, const char *param, const char **out, oa_err *e) {
    const char *p = param ? param : key;
    const json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_string(v)) return oa_fail(e, 400, NULL, p, "%s must be a string", p);
    *out = json_string_value(v);
    return 0;
}

json_t *oa_parse_body(const char *body, size_t len, oa_err *e) {
    if (!body || len == 0) {
        oa_fail(e, 400, NULL, NULL, "the request body is empty; expected a JSON object");
        return NULL;
    }
    /* jansson rejects invalid UTF-8, lone surrogate escapes and "\u0000"
     * (without JSON_ALLOW_NUL), so every string we read later is valid
     * NUL-free UTF-8. */
    json_error_t je;
    json_t *j = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        oa_fail(e, 400, NULL, NULL, "invalid JSON in the request body: %s (line %d, column %d)",
                je.text, je.line, je.column);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        oa_fail(e, 400, NULL, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return j;
}
