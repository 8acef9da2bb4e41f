/*
 * jinja_ops.c - the operators of Jinja expressions with Python's meaning:
 * + - * / // % ** on ints (64-bit; overflow is an error where Python would
 * grow the integer), floats and bools; + on strings, lists and tuples; *
 * repeating strings and lists; "%" formatting of a string with %s/%d/%r;
 * ~ concatenation; comparisons and `in`; slicing by character or item.
 * Undefined operands fail with the undefined's message, as jinja2's
 * default Undefined does.
 * Used by jinja_eval.c.
 */
#include "jinja_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const op_names[] = {"+", "-", "*", "/", "//", "%", "**", "~",
                                       "==", "!=", "<", "<=", ">", ">=", "in", "not in"};

static en_jv type_error(en_jctx *c, const en_jnode *at, int op, en_jv a, en_jv b) {
    if (a.type == EN_JV_UNDEF) en_jj_fail_undef(c, at, a);
    else if (b.type == EN_JV_UNDEF) en_jj_fail_undef(c, at, b);
    else
        en_jj_fail(c, at, "unsupported operand type(s) for %s: '%s' and '%s'", op_names[op],
                   en_jv_type_name(a), en_jv_type_name(b));
    return en_jv_undef(NULL);
}

static en_jv concat_seq(en_jctx *c, en_jv a, en_jv b) {
    en_jv r = en_jv_list(c, a.u.l->n + b.u.l->n);
    if (r.type != EN_JV_LIST) return r;
    r.tuple = a.tuple;
    if (a.u.l->n) memcpy(r.u.l->v, a.u.l->v, a.u.l->n * sizeof(en_jv));
    if (b.u.l->n) memcpy(r.u.l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof(en_jv));
    return r;
}

static en_jv concat_str(en_jctx *c, const en_jnode *at, en_jv a, en_jv b) {
    if (a.u.s.n + b.u.s.n > c->max_output) {
        en_jj_fail(c, at, "string longer than max_output (%zu bytes)", c->max_output);
        return en_jv_undef(NULL);
    }
    char *s = en_jj_alloc(c, a.u.s.n + b.u.s.n + 1);
    if (!s) return en_jv_undef(NULL);
    memcpy(s, a.u.s.p, a.u.s.n);
    memcpy(s + a.u.s.n, b.u.s.p, b.u.s.n);
    return en_jv_str(s, a.u.s.n + b.u.s.n);
}

static en_jv repeat(en_jctx *c, const en_jnode *at, en_jv seq, int64_t times) {
    if (times < 0) times = 0;
    size_t unit = seq.type == EN_JV_STR ? seq.u.s.n : seq.u.l->n * sizeof(en_jv);
    if (unit && (uint64_t)times > c->max_output / unit) {
        en_jj_fail(c, at, "repetition result larger than max_output (%zu bytes)", c->max_output);
        return en_jv_undef(NULL);
    }
    if (en_jj_step(c, at, (long)(unit * (size_t)times / 64)) != 0) return en_jv_undef(NULL);
    if (seq.type == EN_JV_STR) {
        char *s = en_jj_alloc(c, seq.u.s.n * (size_t)times + 1);
        if (!s) return en_jv_undef(NULL);
        for (int64_t i = 0; i < times; i++) memcpy(s + (size_t)i * seq.u.s.n, seq.u.s.p, seq.u.s.n);
        return en_jv_str(s, seq.u.s.n * (size_t)times);
    }
    size_t n = seq.u.l->n;
    en_jv r = en_jv_list(c, n * (size_t)times);
    if (r.type != EN_JV_LIST) return r;
    r.tuple = seq.tuple;
    for (int64_t i = 0; i < times && n; i++) memcpy(r.u.l->v + (size_t)i * n, seq.u.l->v, n * sizeof(en_jv));
    return r;
}

static int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

static double float_mod(double a, double b) {
    double m = fmod(a, b);
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return m;
}

static en_jv int_pow(en_jctx *c, const en_jnode *at, int64_t base, int64_t e) {
    int64_t r = 1;
    while (e > 0) {
        if (e & 1 && __builtin_mul_overflow(r, base, &r)) goto ovf;
        e >>= 1;
        if (e && __builtin_mul_overflow(base, base, &base)) goto ovf;
    }
    return en_jv_int(r);
ovf:
    en_jj_fail(c, at, "integer overflow in **");
    return en_jv_undef(NULL);
}

static en_jv int_op(en_jctx *c, const en_jnode *at, int op, int64_t x, int64_t y) {
    int64_t r = 0;
    int ovf = 0;
    switch (op) {
    case EN_JOP_ADD: ovf = __builtin_add_overflow(x, y, &r); break;
    case EN_JOP_SUB: ovf = __builtin_sub_overflow(x, y, &r); break;
    case EN_JOP_MUL: ovf = __builtin_mul_overflow(x, y, &r); break;
    case EN_JOP_DIV:
        if (y == 0) break;
        return en_jv_float((double)x / (double)y);
    case EN_JOP_FLOORDIV:
    case EN_JOP_MOD:
        if (y == 0) break;
        if (y == -1) { /* INT64_MIN / -1 overflows */
            if (op == EN_JOP_MOD) return en_jv_int(0);
            ovf = __builtin_sub_overflow((int64_t)0, x, &r);
            break;
        }
        r = op == EN_JOP_FLOORDIV ? floor_div(x, y) : x - floor_div(x, y) * y;
        break;
    case EN_JOP_POW:
        if (y < 0) return en_jv_float(pow((double)x, (double)y));
        return int_pow(c, at, x, y);
    }
    if ((op == EN_JOP_DIV || op == EN_JOP_FLOORDIV || op == EN_JOP_MOD) && y == 0) {
        en_jj_fail(c, at, "division by zero");
        return en_jv_undef(NULL);
    }
    if (ovf) {
        en_jj_fail(c, at, "integer overflow in %s", op_names[op]);
        return en_jv_undef(NULL);
    }
    return en_jv_int(r);
}

static en_jv float_op(en_jctx *c, const en_jnode *at, int op, double x, double y) {
    if ((op == EN_JOP_DIV || op == EN_JOP_FLOORDIV || op == EN_JOP_MOD) && y == 0) {
        en_jj_fail(c, at, "float division by zero");
        return en_jv_undef(NULL);
    }
    switch (op) {
    case EN_JOP_ADD: return en_jv_float(x + y);
    case EN_JOP_SUB: return en_jv_float(x - y);
    case EN_JOP_MUL: return en_jv_float(x * y);
    case EN_JOP_DIV: return en_jv_float(x / y);
    case EN_JOP_FLOORDIV: return en_jv_float(floor(x / y));
    case EN_JOP_MOD: return en_jv_float(float_mod(x, y));
    default: return en_jv_float(pow(x, y));
    }
}

/* "%s" % args: %s, %r, %d, %i, %f and %% only. */
en_jv en_jj_percent_format(en_jctx *c, const en_jnode *at, en_jv fmt, en_jv args) {
    en_jbuf b = {0};
    size_t next = 0, n_args = args.type == EN_JV_LIST && args.tuple ? args.u.l->n : 1;
    int rc = 0;
    for (size_t i = 0; i < fmt.u.s.n && rc == 0; i++) {
        char ch = fmt.u.s.p[i];
        if (ch != '%' || i + 1 >= fmt.u.s.n) {
            rc = en_jbuf_put(&b, &ch, 1);
            continue;
        }
        char conv = fmt.u.s.p[++i];
        if (conv == '%') {
            rc = en_jbuf_put(&b, "%", 1);
            continue;
        }
        if (!strchr("srdif", conv) || next >= n_args) goto bad;
        en_jv a = n_args == 1 && !(args.type == EN_JV_LIST && args.tuple) ? args : args.u.l->v[next];
        next++;
        if (conv == 's') rc = en_jv_str_put(&b, a, 0);
        else if (conv == 'r') rc = en_jv_repr_put(&b, a, 0);
        else if (!en_jv_is_number(a)) goto bad;
        else {
            char tmp[64];
            if (conv == 'f') snprintf(tmp, sizeof tmp, "%f", en_jv_num(a));
            else snprintf(tmp, sizeof tmp, "%lld", a.type == EN_JV_FLOAT ? (long long)trunc(a.u.f) : (long long)a.u.i);
            rc = en_jbuf_put(&b, tmp, strlen(tmp));
        }
    }
    if (rc == 0 && next == n_args) {
        en_jv r = en_jv_strdup(c, b.p ? b.p : "", b.n);
        en_jbuf_free(&b);
        return r;
    }
bad:
    en_jbuf_free(&b);
    en_jj_fail(c, at, "bad %% format string or arguments");
    return en_jv_undef(NULL);
}

en_jv en_jj_binop(en_jctx *c, const en_jnode *at, int op, en_jv a, en_jv b) {
    if (op == EN_JOP_CONCAT) {
        en_jv sa = en_jv_to_str(c, at, a), sb = en_jv_to_str(c, at, b);
        return c->failed ? en_jv_undef(NULL) : concat_str(c, at, sa, sb);
    }
    if (en_jv_is_number(a) && en_jv_is_number(b)) {
        if (a.type != EN_JV_FLOAT && b.type != EN_JV_FLOAT) return int_op(c, at, op, a.u.i, b.u.i);
        return float_op(c, at, op, en_jv_num(a), en_jv_num(b));
    }
    if (op == EN_JOP_ADD && a.type == EN_JV_STR && b.type == EN_JV_STR) return concat_str(c, at, a, b);
    if (op == EN_JOP_ADD && a.type == EN_JV_LIST && b.type == EN_JV_LIST && a.tuple == b.tuple)
        return concat_seq(c, a, b);
    if (op == EN_JOP_MUL && (a.type == EN_JV_STR || a.type == EN_JV_LIST) &&
        (b.type == EN_JV_INT || b.type == EN_JV_BOOL))
        return repeat(c, at, a, b.u.i);
    if (op == EN_JOP_MUL && (b.type == EN_JV_STR || b.type == EN_JV_LIST) &&
        (a.type == EN_JV_INT || a.type == EN_JV_BOOL))
        return repeat(c, at, b, a.u.i);
    if (op == EN_JOP_MOD && a.type == EN_JV_STR && b.type != EN_JV_UNDEF) return en_jj_percent_format(c, at, a, b);
    return type_error(c, at, op, a, b);
}

static int contains(en_jctx *c, const en_jnode *at, en_jv hay, en_jv needle) {
    switch (hay.type) {
    case EN_JV_STR:
        if (needle.type != EN_JV_STR) {
            en_jj_fail(c, at, "'in <string>' requires string as left operand, not %s", en_jv_type_name(needle));
            return 0;
        }
        return en_jj_str_contains(hay, needle);
    case EN_JV_LIST:
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (en_jv_equal(hay.u.l->v[i], needle, 0)) return 1;
        return 0;
    case EN_JV_DICT:
    case EN_JV_NS: return en_jv_dict_find(hay.u.d, needle) != NULL;
    case EN_JV_UNDEF: return 0;
    case EN_JV_RANGE: {
        if (needle.type != EN_JV_INT && needle.type != EN_JV_BOOL) return 0;
        const en_jrange *r = hay.u.r;
        int64_t x = needle.u.i;
        int inside = r->step > 0 ? (x >= r->start && x < r->stop) : (x <= r->start && x > r->stop);
        uint64_t dist = x >= r->start ? (uint64_t)x - (uint64_t)r->start : (uint64_t)r->start - (uint64_t)x;
        uint64_t step = r->step > 0 ? (uint64_t)r->step : (uint64_t)0 - (uint64_t)r->step;
        return inside && dist % step == 0;
    }
    default:
        en_jj_fail(c, at, "argument of type '%s' is not iterable", en_jv_type_name(hay));
        return 0;
    }
}

en_jv en_jj_compare(en_jctx *c, const en_jnode *at, int op, en_jv a, en_jv b) {
    int r = 0;
    switch (op) {
    case EN_JOP_EQ: return en_jv_bool(en_jv_equal(a, b, 0));
    case EN_JOP_NE: return en_jv_bool(!en_jv_equal(a, b, 0));
    case EN_JOP_IN: return en_jv_bool(contains(c, at, b, a));
    case EN_JOP_NOTIN: return en_jv_bool(!contains(c, at, b, a));
    default: break;
    }
    if (en_jv_order(a, b, &r) != 0) {
        if (a.type == EN_JV_UNDEF || b.type == EN_JV_UNDEF) return type_error(c, at, op, a, b);
        en_jj_fail(c, at, "'%s' not supported between instances of '%s' and '%s'", op_names[op],
                   en_jv_type_name(a), en_jv_type_name(b));
        return en_jv_undef(NULL);
    }
    switch (op) {
    case EN_JOP_LT: return en_jv_bool(r < 0);
    case EN_JOP_LE: return en_jv_bool(r <= 0);
    case EN_JOP_GT: return en_jv_bool(r > 0);
    default: return en_jv_bool(r >= 0);
    }
}

/* Python's slice.indices(): clamp start/stop for a sequence of length n. */
static int slice_bound(en_jctx *c, const en_jnode *at, en_jv v, int64_t n, int64_t step, int is_start, int64_t *out) {
    if (v.type == EN_JV_NONE || v.type == EN_JV_UNDEF) {
        *out = step > 0 ? (is_start ? 0 : n) : (is_start ? n - 1 : -1);
        return 0;
    }
    if (v.type != EN_JV_INT && v.type != EN_JV_BOOL) {
        en_jj_fail(c, at, "slice indices must be integers or None");
        return -1;
    }
    int64_t x = v.u.i;
    if (x < 0) {
        x = x < -n ? -1 : x + n;
        if (x < 0) x = step > 0 ? 0 : -1;
    } else if (x >= n) {
        x = step > 0 ? n : n - 1;
    }
    *out = x;
    return 0;
}

en_jv en_jj_slice(en_jctx *c, const en_jnode *at, en_jv obj, en_jv start, en_jv stop, en_jv step_v) {
    int64_t step = 1, lo, hi;
    if (step_v.type == EN_JV_INT || step_v.type == EN_JV_BOOL) step = step_v.u.i;
    else if (step_v.type != EN_JV_NONE && step_v.type != EN_JV_UNDEF) step = 0;
    if (step == INT64_MIN) step = -INT64_MAX;
    if (step == 0) {
        en_jj_fail(c, at, "slice step cannot be zero");
        return en_jv_undef(NULL);
    }
    if (obj.type == EN_JV_UNDEF) {
        en_jj_fail_undef(c, at, obj);
        return obj;
    }
    int is_str = obj.type == EN_JV_STR;
    size_t *off = NULL, n_chars = 0;
    if (is_str && !(off = en_jj_char_offsets(c, obj.u.s.p, obj.u.s.n, &n_chars))) return en_jv_undef(NULL);
    en_jv items = is_str ? en_jv_none() : en_jv_iter_list(c, at, obj);
    if (c->failed) return en_jv_undef(NULL);
    int64_t n = is_str ? (int64_t)n_chars : (int64_t)items.u.l->n;
    if (slice_bound(c, at, start, n, step, 1, &lo) || slice_bound(c, at, stop, n, step, 0, &hi))
        return en_jv_undef(NULL);
    int64_t count = step > 0 ? (hi > lo ? (hi - lo - 1) / step + 1 : 0) : (lo > hi ? (lo - hi - 1) / -step + 1 : 0);
    if (is_str && step == 1) return en_jv_str(obj.u.s.p + off[lo], count ? off[hi] - off[lo] : 0);
    en_jbuf b = {0};
    en_jv r = is_str ? en_jv_none() : en_jv_list(c, (size_t)count);
    if (!is_str && r.type != EN_JV_LIST) return r;
    r.tuple = obj.tuple;
    for (int64_t k = 0, i = lo; k < count; k++, i += step) {
        if (!is_str) r.u.l->v[k] = items.u.l->v[i];
        else if (en_jbuf_put(&b, obj.u.s.p + off[i], off[i + 1] - off[i])) {
            en_jbuf_free(&b);
            en_jj_fail_nomem(c);
            return en_jv_undef(NULL);
        }
    }
    if (!is_str) return r;
    r = en_jv_strdup(c, b.p ? b.p : "", b.n);
    en_jbuf_free(&b);
    return r;
}
