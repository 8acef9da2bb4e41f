/*
 * json.c - lenient JSON file reading for model-directory files (json.h).
 */
#include "json.h"

#include <math.h>
#include <string.h>

#include "file.h"

en_status en_json_parse(const char *text, size_t len, const char *what, json_t **out,
                        en_err *err) {
    json_error_t je;
    *out = json_loadb(text, len, JSON_DECODE_ANY, &je);
    /* jansson reports an int64 overflow as json_error_numeric_overflow. */
    if (!*out && json_error_code(&je) == json_error_numeric_overflow)
        *out = json_loadb(text, len, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, &je);
    if (!*out)
        return EN_ERR(err, EN_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", what, je.line,
                      je.column, je.text);
    return EN_OK;
}

en_status en_json_load_file(const char *path, json_t **out, en_err *err) {
    char *text = NULL;
    size_t len = 0;
    *out = NULL;
    EN_TRY(en_file_read_all(path, &text, &len, err));
    en_status s = en_json_parse(text, len, path, out, err);
    en_free(text);
    return s;
}

int en_json_int(const json_t *j, int64_t *out) {
    if (json_is_integer(j)) {
        *out = (int64_t)json_integer_value(j);
        return 1;
    }
    if (json_is_real(j)) {
        double v = json_real_value(j);
        if (v != floor(v) || v < -9.2e18 || v > 9.2e18) return 0;
        *out = (int64_t)v;
        return 1;
    }
    return 0;
}
