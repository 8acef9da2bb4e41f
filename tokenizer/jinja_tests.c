/*
 * jinja_tests.c - the `is` tests of the Jinja interpreter (jinja2's
 * tests.py): defined, undefined, none, string, number, integer, float,
 * boolean, true, false, mapping, iterable, sequence, callable, odd, even,
 * divisibleby, lower, upper, sameas, escaped, and the comparison tests
 * eq/equalto/==, ne/!=, lt/lessthan/<, le/<=, gt/greaterthan/>, ge/>=, in.
 * Used by jinja_eval.c (`x is test`) and jinja_filters.c (select, reject,
 * selectattr, rejectattr).
 */
#include "jinja_impl.h"

#include <string.h>

static const struct {
    const char *name;
    int op;
} compare_tests[] = {
    {"eq", EN_JOP_EQ}, {"equalto", EN_JOP_EQ}, {"==", EN_JOP_EQ},   {"ne", EN_JOP_NE},
    {"!=", EN_JOP_NE}, {"lt", EN_JOP_LT},      {"lessthan", EN_JOP_LT}, {"<", EN_JOP_LT},
    {"le", EN_JOP_LE}, {"<=", EN_JOP_LE},      {"gt", EN_JOP_GT},   {"greaterthan", EN_JOP_GT},
    {">", EN_JOP_GT},  {"ge", EN_JOP_GE},      {">=", EN_JOP_GE},   {"in", EN_JOP_IN},
};

static const char *const simple_tests[] = {
    "defined", "undefined", "none",     "string",   "number", "integer", "float",
    "boolean", "true",      "false",    "mapping",  "iterable", "sequence", "callable",
    "odd",     "even",      "divisibleby", "lower", "upper",  "sameas",  "escaped"};

int en_jj_has_test(const char *name) {
    for (size_t i = 0; i < sizeof compare_tests / sizeof compare_tests[0]; i++)
        if (!strcmp(name, compare_tests[i].name)) return 1;
    for (size_t i = 0; i < sizeof simple_tests / sizeof simple_tests[0]; i++)
        if (!strcmp(name, simple_tests[i])) return 1;
    return 0;
}

/* odd, even, divisibleby: integers only. */
static int parity_test(en_jctx *c, const en_jnode *at, const char *name, en_jv v, const en_jargs *a) {
    if (v.type != EN_JV_INT && v.type != EN_JV_BOOL) {
        if (v.type == EN_JV_UNDEF) en_jj_fail_undef(c, at, v);
        else en_jj_fail(c, at, "test '%s' needs an integer, got '%s'", name, en_jv_type_name(v));
        return 0;
    }
    int64_t d = 2;
    if (name[0] == 'd') {
        en_jv arg = en_jargs_get(a, 0, "num");
        if (arg.type != EN_JV_INT || arg.u.i == 0) {
            en_jj_fail(c, at, "divisibleby needs a non-zero integer");
            return 0;
        }
        d = arg.u.i;
        if (d == -1) return 1;
        return v.u.i % d == 0;
    }
    int odd = v.u.i % 2 != 0;
    return name[0] == 'o' ? odd : !odd;
}

static int case_test(en_jctx *c, en_jv v, int upper) {
    en_jv s = en_jv_to_str(c, NULL, v);
    if (c->failed) return 0;
    en_jv conv = en_jj_case(c, s, upper ? EN_JCASE_UPPER : EN_JCASE_LOWER);
    en_jv other = en_jj_case(c, s, upper ? EN_JCASE_LOWER : EN_JCASE_UPPER);
    /* Python: islower() is true when there is a cased character and none is upper */
    return !c->failed && en_jv_equal(conv, s, 0) && !en_jv_equal(other, s, 0);
}

static int type_test(const char *name, en_jv v, int *out) {
    int t = v.type;
    if (!strcmp(name, "defined")) *out = t != EN_JV_UNDEF;
    else if (!strcmp(name, "undefined")) *out = t == EN_JV_UNDEF;
    else if (!strcmp(name, "none")) *out = t == EN_JV_NONE;
    else if (!strcmp(name, "string")) *out = t == EN_JV_STR;
    else if (!strcmp(name, "number")) *out = t == EN_JV_INT || t == EN_JV_FLOAT || t == EN_JV_BOOL;
    else if (!strcmp(name, "integer")) *out = t == EN_JV_INT;
    else if (!strcmp(name, "float")) *out = t == EN_JV_FLOAT;
    else if (!strcmp(name, "boolean")) *out = t == EN_JV_BOOL;
    else if (!strcmp(name, "true")) *out = t == EN_JV_BOOL && v.u.i;
    else if (!strcmp(name, "false")) *out = t == EN_JV_BOOL && !v.u.i;
    else if (!strcmp(name, "mapping")) *out = t == EN_JV_DICT;
    else if (!strcmp(name, "iterable"))
        *out = t == EN_JV_STR || t == EN_JV_LIST || t == EN_JV_DICT || t == EN_JV_RANGE || t == EN_JV_UNDEF || t == EN_JV_LOOP;
    else if (!strcmp(name, "sequence"))
        *out = t == EN_JV_STR || t == EN_JV_LIST || t == EN_JV_DICT || t == EN_JV_RANGE || t == EN_JV_UNDEF;
    else if (!strcmp(name, "callable")) *out = t == EN_JV_MACRO || t == EN_JV_FUNC || t == EN_JV_METHOD;
    else if (!strcmp(name, "escaped")) *out = 0;
    else return 0;
    return 1;
}

int en_jj_test(en_jctx *c, const en_jnode *at, const char *name, en_jv v, const en_jargs *a) {
    int r = 0;
    if (type_test(name, v, &r)) return r;
    for (size_t i = 0; i < sizeof compare_tests / sizeof compare_tests[0]; i++)
        if (!strcmp(name, compare_tests[i].name)) {
            if (!en_jargs_has(a, 0, NULL)) {
                en_jj_fail(c, at, "test '%s' needs an argument", name);
                return 0;
            }
            en_jv res = en_jj_compare(c, at, compare_tests[i].op, v, a->pos[0]);
            return !c->failed && en_jv_truthy(res);
        }
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby"))
        return parity_test(c, at, name, v, a);
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) return case_test(c, v, name[0] == 'u');
    if (!strcmp(name, "sameas")) {
        en_jv o = en_jargs_get(a, 0, "other");
        if (v.type != o.type) return 0;
        if (v.type == EN_JV_NONE || v.type == EN_JV_UNDEF) return 1;
        return en_jv_is_number(v) ? v.u.i == o.u.i : v.u.d == o.u.d;
    }
    en_jj_fail(c, at, "no test named '%s'", name);
    return 0;
}
