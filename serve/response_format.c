/*
 * response_format.c - the "response_format" field into a grammar mask for
 * the engine (response_format.h).
 */
#include "response_format.h"

#include <string.h>

#include "../models/json_schema.h"
#include "../models/regex.h"
#include "engine.h"

/* "json_object" is the JSON Schema of any object, compiled like any schema
 * (models/json_schema.c: the same JSON rules, bounded whitespace). */
static const char JSON_OBJECT_SCHEMA[] = "{\"type\": \"object\", \"additionalProperties\": true}";

int srv_grammar_mask(en_server *srv, const char *text, size_t len, const char *param,
                     en_gmask **out, oa_err *e) {
    en_engine *eng = NULL;
    const en_tokenizer *tok = NULL;
    if (!srv_get_engine(srv, &eng, &tok))
        return oa_fail(e, 503, NULL, NULL, "The model is still loading.");
    en_err err = {0};
    en_grammar *g = NULL;
    if (en_grammar_parse(text, len, NULL, &g, &err) != EN_OK)
        return oa_fail(e, err.status == EN_ERR_NOMEM ? 500 : 400, NULL, param, "%s: %s", param,
                       err.msg);
    const int32_t *stop = NULL;
    int n_stop = en_engine_stop_ids(eng, &stop);
    en_gvocab *v = srv_gvocab(srv, tok, &err);
    if (!v || en_gmask_create_vocab(g, v, stop, n_stop, 256, out, &err) != EN_OK) {
        en_gvocab_destroy(v);
        en_grammar_destroy(g);
        return oa_fail(e, 500, NULL, NULL, "%s", err.msg);
    }
    en_gvocab_destroy(v); /* the mask holds its own reference */
    en_gmask_own_grammar(*out);
    return 0;
}

int response_format_parse(en_server *srv, const json_t *body, en_gmask **out, oa_err *e) {
    *out = NULL;
    const json_t *rf = json_object_get(body, "response_format");
    if (!rf || json_is_null(rf)) return 0;
    if (!json_is_object(rf))
        return oa_fail(e, 400, NULL, "response_format", "response_format must be an object "
                       "such as {\"type\": \"json_object\"}");
    const char *type = NULL;
    if (oa_get_str(rf, "type", "response_format.type", &type, e)) return -1;
    if (!type)
        return oa_fail(e, 400, NULL, "response_format.type", "response_format.type is required");
    if (strcmp(type, "text") == 0) return 0;
    if (strcmp(type, "json_object") == 0) {
        en_err err = {0};
        *out = srv_json_object_mask(srv, &err);
        return *out ? 0 : oa_fail(e, 500, NULL, NULL, "json_object: %s", err.msg);
    }
    if (strcmp(type, "json_schema") == 0) {
        json_t *js = json_object_get(rf, "json_schema");
        if (!json_is_object(js))
            return oa_fail(e, 400, NULL, "response_format.json_schema", "response_format."
                           "json_schema must be an object {\"name\", \"schema\", \"strict\"}");
        json_t *schema = json_object_get(js, "schema");
        if (!schema)
            return oa_fail(e, 400, NULL, "response_format.json_schema.schema",
                           "response_format.json_schema.schema is required");
        char *text = NULL;
        en_err err = {0};
        if (en_json_schema_grammar_json(schema, &text, &err) != EN_OK)
            return oa_fail(e, err.status == EN_ERR_NOMEM ? 500 : 400, NULL,
                           "response_format.json_schema.schema", "%s", err.msg);
        int rc = srv_grammar_mask(srv, text, strlen(text), "response_format.json_schema.schema",
                                  out, e);
        en_free(text);
        return rc;
    }
    if (strcmp(type, "grammar") == 0) {
        const char *text = NULL;
        if (oa_get_str(rf, "grammar", "response_format.grammar", &text, e)) return -1;
        if (!text)
            return oa_fail(e, 400, NULL, "response_format.grammar", "response_format.grammar "
                           "(the grammar text, docs/grammar.md) is required");
        return srv_grammar_mask(srv, text, strlen(text), "response_format.grammar", out, e);
    }
    if (strcmp(type, "regex") == 0) {
        const char *re = NULL;
        if (oa_get_str(rf, "regex", "response_format.regex", &re, e)) return -1;
        if (!re)
            return oa_fail(e, 400, NULL, "response_format.regex", "response_format.regex (a "
                           "regular expression the whole answer must match) is required");
        char *text = NULL;
        en_err err = {0};
        if (en_regex_grammar(re, strlen(re), "root", 0, &text, &err) != EN_OK)
            return oa_fail(e, err.status == EN_ERR_NOMEM ? 500 : 400, NULL,
                           "response_format.regex", "response_format.regex: %s", err.msg);
        int rc = srv_grammar_mask(srv, text, strlen(text), "response_format.regex", out, e);
        en_free(text);
        return rc;
    }
    return oa_fail(e, 400, NULL, "response_format.type", "response_format.type must be text, "
                   "json_object, json_schema, grammar or regex, not '%s'", type);
}

en_gmask *srv_json_object_build(en_server *srv, en_err *err) {
    en_engine *eng = NULL;
    const en_tokenizer *tok = NULL;
    if (!srv_get_engine(srv, &eng, &tok)) {
        EN_ERR(err, EN_ERR_ARG, "the model is still loading");
        return NULL;
    }
    en_grammar *g = NULL;
    char *text = NULL;
    en_status st = en_json_schema_grammar(JSON_OBJECT_SCHEMA, strlen(JSON_OBJECT_SCHEMA), &text,
                                          err);
    if (st == EN_OK) st = en_grammar_parse(text, strlen(text), NULL, &g, err);
    en_free(text);
    if (st != EN_OK) return NULL;
    const int32_t *stop = NULL;
    int n_stop = en_engine_stop_ids(eng, &stop);
    en_gmask *k = NULL;
    en_gvocab *v = srv_gvocab(srv, tok, err);
    if (!v || en_gmask_create_vocab(g, v, stop, n_stop, 512, &k, err) != EN_OK) {
        en_gvocab_destroy(v);
        en_grammar_destroy(g);
        return NULL;
    }
    en_gvocab_destroy(v);
    en_gmask_own_grammar(k);
    return k;
}
