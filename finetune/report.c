/*
 * report.c - see report.h. metrics.jsonl through stdio and jansson, the SVG
 * plot built in memory and written with en_file_write_atomic, the progress
 * line with plain fprintf (\r and the ANSI "erase to end of line" sequence,
 * which every terminal emulator in use understands).
 */
#include "report.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/file.h"

/* ==== metrics.jsonl ==== */

struct en_metrics {
    int fd; /* O_APPEND */
    char *path;
};

/* A growable byte buffer; `oom` latches the first allocation failure so that
 * callers check once at the end. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_reserve(sbuf *b, size_t extra) {
    /* Bound: with n and extra at most SIZE_MAX / 8 the doubling below stays
     * under 2 * (n + extra + 1) and cannot wrap; a report is far smaller. */
    if (!b->oom && (extra > SIZE_MAX / 8 || b->n > SIZE_MAX / 8)) b->oom = 1;
    if (b->oom || b->n + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + extra + 1) cap *= 2;
    char *np = en_realloc(b->p, cap);
    if (!np) {
        b->oom = 1;
        return;
    }
    b->p = np;
    b->cap = cap;
}

static void sb_put(sbuf *b, const char *s, size_t n) {
    sb_reserve(b, n);
    if (b->oom) return;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (need < 0) return;
    sb_reserve(b, (size_t)need);
    if (b->oom) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)need + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)need;
}

/* The numeric "step" of a JSON object, if any. */
static int json_step(json_t *o, double *step) {
    json_t *s = json_object_get(o, "step");
    if (!json_is_number(s)) return 0;
    *step = json_number_value(s);
    return 1;
}

/* Keep the lines of metrics.jsonl that belong to steps <= resume_step. */
static en_status truncate_for_resume(const char *path, int64_t resume_step, sbuf *out,
                                     en_err *err) {
    if (!en_path_exists(path)) return EN_OK;
    char *text;
    size_t len;
    EN_TRY(en_file_read_all(path, &text, &len, err));
    int after = 0, dropped_bad = 0; /* after: the last step seen is > resume_step */
    size_t i = 0;
    while (i < len) {
        size_t e = i;
        while (e < len && text[e] != '\n') e++;
        size_t n = e - i;
        if (n && text[i + n - 1] == '\r') n--;
        if (n) {
            json_t *o = json_loadb(text + i, n, 0, NULL);
            double step;
            if (!json_is_object(o)) {
                dropped_bad++;
            } else {
                if (json_step(o, &step)) after = step > (double)resume_step;
                if (!after) {
                    sb_put(out, text + i, n);
                    sb_put(out, "\n", 1);
                }
            }
            json_decref(o);
        }
        i = e + 1;
    }
    en_free(text);
    if (dropped_bad)
        EN_LOGW("%s: dropped %d line%s that %s not JSON objects (a run killed mid-write)", path,
                dropped_bad, dropped_bad == 1 ? "" : "s", dropped_bad == 1 ? "is" : "are");
    if (out->oom) return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", path);
    return EN_OK;
}

en_status en_metrics_open(const char *run_dir, int64_t resume_step, en_metrics **out,
                          en_err *err) {
    if (out) *out = NULL;
    if (!run_dir || !out) return EN_ERR(err, EN_ERR_ARG, "en_metrics_open: NULL argument");
    if (resume_step < -1)
        return EN_ERR(err, EN_ERR_ARG, "resume step must be >= 0 (or -1 for a new run), got %lld",
                      (long long)resume_step);
    EN_TRY(en_mkdir_p(run_dir, err));
    en_metrics *m = en_calloc(1, sizeof *m);
    if (!m || !(m->path = en_path_join(run_dir, "metrics.jsonl"))) {
        en_free_impl(m);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    m->fd = -1;
    sbuf kept = {0};
    en_status s = EN_OK;
    if (resume_step >= 0) s = truncate_for_resume(m->path, resume_step, &kept, err);
    if (s == EN_OK) s = en_file_write_atomic(m->path, kept.p ? kept.p : "", kept.n, err);
    en_free(kept.p);
    if (s == EN_OK) {
        m->fd = open(m->path, O_WRONLY | O_APPEND | O_CLOEXEC);
        if (m->fd < 0)
            s = EN_ERR(err, EN_ERR_IO, "%s: cannot open for appending: %s", m->path,
                       strerror(errno));
    }
    if (s != EN_OK) {
        en_free(m->path);
        en_free_impl(m);
        return s;
    }
    *out = m;
    return EN_OK;
}

en_status en_metrics_log(en_metrics *m, const char *line, en_err *err) {
    if (!m || !line) return EN_ERR(err, EN_ERR_ARG, "en_metrics_log: NULL argument");
    if (strchr(line, '\n'))
        return EN_ERR(err, EN_ERR_ARG, "%s: a metrics line must not contain a newline", m->path);
    /* one write(2) of the whole line; if any of it fails, what reached the
     * file is cut off again, so that no partial line is left behind */
    size_t n = strlen(line);
    char *buf = en_malloc(n + 1);
    if (!buf) return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", m->path);
    memcpy(buf, line, n);
    buf[n] = '\n';
    off_t at = lseek(m->fd, 0, SEEK_END);
    int rc = at < 0 ? -1 : en_write_fd(m->fd, buf, n + 1);
    en_free(buf);
    if (rc == 0) return EN_OK;
    en_status s = EN_ERR(err, EN_ERR_IO, "%s: write failed: %s", m->path, strerror(errno));
    if (at >= 0 && ftruncate(m->fd, at) != 0)
        EN_LOGW("%s: could not cut a partly written line: %s", m->path, strerror(errno));
    return s;
}

void en_metrics_close(en_metrics *m) {
    if (!m) return;
    if (m->fd >= 0) close(m->fd);
    en_free(m->path);
    en_free_impl(m);
}

/* A growable array of doubles. */
typedef struct dvec {
    double *v;
    int n, cap;
} dvec;

static int dvec_push(dvec *d, double x) {
    if (d->n == d->cap) {
        int cap = d->cap ? d->cap * 2 : 256;
        double *nv = en_realloc(d->v, (size_t)cap * sizeof *nv);
        if (!nv) return -1;
        d->v = nv;
        d->cap = cap;
    }
    d->v[d->n++] = x;
    return 0;
}

en_status en_metrics_read_series(const char *path, double **train_step, double **train_loss,
                                 int *n_train, double **val_step, double **val_loss, int *n_val,
                                 en_err *err) {
    if (!path || !train_step || !train_loss || !n_train || !val_step || !val_loss || !n_val)
        return EN_ERR(err, EN_ERR_ARG, "en_metrics_read_series: NULL argument");
    *train_step = *train_loss = *val_step = *val_loss = NULL;
    *n_train = *n_val = 0;
    char *text;
    size_t len;
    EN_TRY(en_file_read_all(path, &text, &len, err));
    dvec ts = {0}, tl = {0}, vs = {0}, vl = {0};
    int oom = 0;
    size_t i = 0;
    while (i < len && !oom) {
        size_t e = i;
        while (e < len && text[e] != '\n') e++;
        if (e > i) {
            json_t *o = json_loadb(text + i, e - i, 0, NULL);
            double step;
            if (json_is_object(o) && json_step(o, &step)) {
                json_t *l = json_object_get(o, "loss"), *v = json_object_get(o, "val_loss");
                if (json_is_number(l))
                    oom |= dvec_push(&ts, step) | dvec_push(&tl, json_number_value(l));
                if (json_is_number(v))
                    oom |= dvec_push(&vs, step) | dvec_push(&vl, json_number_value(v));
            }
            json_decref(o);
        }
        i = e + 1;
    }
    en_free(text);
    if (oom) {
        en_free(ts.v);
        en_free(tl.v);
        en_free(vs.v);
        en_free(vl.v);
        return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", path);
    }
    *train_step = ts.v;
    *train_loss = tl.v;
    *n_train = ts.n;
    *val_step = vs.v;
    *val_loss = vl.v;
    *n_val = vs.n;
    return EN_OK;
}

/* ==== loss plot ==== */

/* Canvas and plot area, in SVG user units (pixels). */
#define SVG_W 800
#define SVG_H 480
#define PLOT_X0 80.0
#define PLOT_X1 780.0
#define PLOT_Y0 50.0  /* top */
#define PLOT_Y1 420.0 /* bottom */

/* An axis: [lo, hi] widened to whole multiples of a "nice" tick spacing
 * (1, 2 or 5 times a power of ten, the one nearest a fifth of the range,
 * after Heckbert, "Nice numbers for graph labels", Graphics Gems 1990). */
typedef struct axis {
    double lo, hi, tick;
    int n_ticks;  /* ticks at lo + i * tick, i in [0, n_ticks) */
    int decimals; /* for tick labels */
} axis;

static axis axis_make(double mn, double mx) {
    axis a;
    if (!(mx > mn)) { /* one value or none: centre it in a unit-ish range */
        double pad = fabs(mn) * 0.05;
        if (pad < 0.5) pad = 0.5;
        mn -= pad;
        mx += pad;
    }
    double raw = (mx - mn) / 5.0;
    double p10 = pow(10.0, floor(log10(raw)));
    double f = raw / p10;
    double mult = f < 1.5 ? 1.0 : f < 3.0 ? 2.0 : f < 7.0 ? 5.0 : 10.0;
    a.tick = mult * p10;
    a.lo = floor(mn / a.tick) * a.tick;
    a.hi = ceil(mx / a.tick) * a.tick;
    if (!(a.hi > a.lo)) a.hi = a.lo + a.tick;
    /* Counted, not stepped with v += tick: near 1e17 adding a tick of 1
     * changes nothing and such a loop would never end. */
    double n = floor((a.hi - a.lo) / a.tick + 0.5) + 1;
    a.n_ticks = n < 2 ? 2 : n > 50 ? 50 : (int)n;
    int d = (int)-floor(log10(a.tick) + 1e-9);
    a.decimals = d > 0 ? d : 0;
    return a;
}

/* Tick i of an axis, with -0 shown as 0. */
static double axis_tick(const axis *a, int i) {
    double v = a->lo + i * a->tick;
    return fabs(v) < a->tick * 1e-9 ? 0.0 : v;
}

static double map_x(const axis *a, double v) {
    return PLOT_X0 + (v - a->lo) / (a->hi - a->lo) * (PLOT_X1 - PLOT_X0);
}

static double map_y(const axis *a, double v) {
    return PLOT_Y1 - (v - a->lo) / (a->hi - a->lo) * (PLOT_Y1 - PLOT_Y0);
}

static void xml_escape(sbuf *b, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': sb_put(b, "&amp;", 5); break;
        case '<': sb_put(b, "&lt;", 4); break;
        case '>': sb_put(b, "&gt;", 4); break;
        case '"': sb_put(b, "&quot;", 6); break;
        case '\'': sb_put(b, "&apos;", 6); break;
        default:
            /* Control characters are not allowed in XML 1.0. */
            if ((unsigned char)*s >= 0x20 || *s == '\t') sb_put(b, s, 1);
        }
    }
}

static void range_of(const double *x, const double *y, int n, double *xmn, double *xmx,
                     double *ymn, double *ymx, int *any) {
    for (int i = 0; i < n; i++) {
        if (!isfinite(x[i]) || !isfinite(y[i])) continue;
        if (!*any || x[i] < *xmn) *xmn = x[i];
        if (!*any || x[i] > *xmx) *xmx = x[i];
        if (!*any || y[i] < *ymn) *ymn = y[i];
        if (!*any || y[i] > *ymx) *ymx = y[i];
        *any = 1;
    }
}

static void polyline(sbuf *b, const axis *ax, const axis *ay, const double *x, const double *y,
                     int n, const char *cls, const char *color) {
    sb_printf(b, "<polyline class=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
                 "stroke-linejoin=\"round\" points=\"",
              cls, color);
    int first = 1;
    for (int i = 0; i < n; i++) {
        if (!isfinite(x[i]) || !isfinite(y[i])) continue;
        sb_printf(b, "%s%.2f,%.2f", first ? "" : " ", map_x(ax, x[i]), map_y(ay, y[i]));
        first = 0;
    }
    sb_printf(b, "\"/>\n");
}

en_status en_loss_svg_write(const char *path, const char *title, const double *train_step,
                            const double *train_loss, int n_train, const double *val_step,
                            const double *val_loss, int n_val, en_err *err) {
    if (!path || n_train < 0 || n_val < 0 || (n_train && (!train_step || !train_loss)) ||
        (n_val && (!val_step || !val_loss)))
        return EN_ERR(err, EN_ERR_ARG, "en_loss_svg_write: bad argument (NULL array or count < 0)");
    double xmn = 0, xmx = 1, ymn = 0, ymx = 1;
    int any = 0;
    range_of(train_step, train_loss, n_train, &xmn, &xmx, &ymn, &ymx, &any);
    range_of(val_step, val_loss, n_val, &xmn, &xmx, &ymn, &ymx, &any);
    axis ax = axis_make(xmn, xmx), ay = axis_make(ymn, ymx);

    sbuf b = {0};
    sb_printf(&b,
              "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
              "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
              SVG_W, SVG_H, SVG_W, SVG_H);
    sb_printf(&b, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n", SVG_W,
              SVG_H);
    sb_printf(&b, "<text x=\"%.1f\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">",
              (PLOT_X0 + PLOT_X1) / 2);
    xml_escape(&b, title ? title : "loss");
    sb_printf(&b, "</text>\n");

    /* Grid, ticks and labels. */
    sb_printf(&b, "<g class=\"axes\" stroke=\"#dddddd\" stroke-width=\"1\">\n");
    for (int i = 0; i < ax.n_ticks; i++) {
        double x = map_x(&ax, axis_tick(&ax, i));
        sb_printf(&b, "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\"/>\n", x, PLOT_Y0, x,
                  PLOT_Y1);
    }
    for (int i = 0; i < ay.n_ticks; i++) {
        double y = map_y(&ay, axis_tick(&ay, i));
        sb_printf(&b, "<line x1=\"%.1f\" y1=\"%.2f\" x2=\"%.1f\" y2=\"%.2f\"/>\n", PLOT_X0, y,
                  PLOT_X1, y);
    }
    sb_printf(&b, "</g>\n<g class=\"ticks\" fill=\"#333333\">\n");
    for (int i = 0; i < ax.n_ticks; i++)
        sb_printf(&b, "<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\">%.*f</text>\n",
                  map_x(&ax, axis_tick(&ax, i)), PLOT_Y1 + 18, ax.decimals, axis_tick(&ax, i));
    for (int i = 0; i < ay.n_ticks; i++)
        sb_printf(&b, "<text x=\"%.1f\" y=\"%.2f\" text-anchor=\"end\">%.*f</text>\n",
                  PLOT_X0 - 6, map_y(&ay, axis_tick(&ay, i)) + 4, ay.decimals, axis_tick(&ay, i));
    sb_printf(&b, "</g>\n");
    sb_printf(&b,
              "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
              "stroke=\"#333333\"/>\n",
              PLOT_X0, PLOT_Y0, PLOT_X1 - PLOT_X0, PLOT_Y1 - PLOT_Y0);
    sb_printf(&b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">step</text>\n",
              (PLOT_X0 + PLOT_X1) / 2, SVG_H - 16);
    sb_printf(&b,
              "<text x=\"20\" y=\"%.1f\" text-anchor=\"middle\" "
              "transform=\"rotate(-90 20 %.1f)\">loss</text>\n",
              (PLOT_Y0 + PLOT_Y1) / 2, (PLOT_Y0 + PLOT_Y1) / 2);

    /* Series. */
    static const char train_color[] = "#1f77b4", val_color[] = "#ff7f0e";
    if (n_train) polyline(&b, &ax, &ay, train_step, train_loss, n_train, "train", train_color);
    if (n_val) {
        polyline(&b, &ax, &ay, val_step, val_loss, n_val, "val", val_color);
        sb_printf(&b, "<g class=\"val-points\" fill=\"%s\">\n", val_color);
        for (int i = 0; i < n_val; i++)
            if (isfinite(val_step[i]) && isfinite(val_loss[i]))
                sb_printf(&b, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"2.5\"/>\n",
                          map_x(&ax, val_step[i]), map_y(&ay, val_loss[i]));
        sb_printf(&b, "</g>\n");
    }
    if (!any)
        sb_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#888888\">"
                      "no data yet</text>\n",
                  (PLOT_X0 + PLOT_X1) / 2, (PLOT_Y0 + PLOT_Y1) / 2);

    /* Legend, top right inside the plot. */
    int rows = 1 + (n_val > 0);
    double lx = PLOT_X1 - 150, ly = PLOT_Y0 + 10;
    sb_printf(&b, "<g class=\"legend\">\n");
    sb_printf(&b,
              "<rect x=\"%.1f\" y=\"%.1f\" width=\"140\" height=\"%d\" fill=\"white\" "
              "fill-opacity=\"0.85\" stroke=\"#999999\"/>\n",
              lx, ly, 8 + 18 * rows);
    sb_printf(&b,
              "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
              "stroke-width=\"2\"/>\n<text x=\"%.1f\" y=\"%.1f\">train loss</text>\n",
              lx + 8, ly + 13, lx + 32, ly + 13, train_color, lx + 40, ly + 17);
    if (n_val)
        sb_printf(&b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                  "stroke-width=\"2\"/>\n<text x=\"%.1f\" y=\"%.1f\">validation loss</text>\n",
                  lx + 8, ly + 31, lx + 32, ly + 31, val_color, lx + 40, ly + 35);
    sb_printf(&b, "</g>\n</svg>\n");

    en_status s;
    if (b.oom)
        s = EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory drawing the plot", path);
    else
        s = en_file_write_atomic(path, b.p, b.n, err);
    en_free(b.p);
    return s;
}

/* ==== progress ==== */

struct en_progress {
    FILE *fp;
    int64_t total, first, last_step;
    int interval;
    int tty;
    double t0;
    double last_val; /* NAN until a validation loss is reported */
    char line[256];  /* the current progress line */
    int live;        /* tty: a live line is on screen */
    int printed;     /* not tty: the line for last_step was printed */
    int finished;
};

en_status en_progress_create(void *fp, int64_t total_steps, int64_t first_step, int interval,
                             en_progress **out, en_err *err) {
    if (out) *out = NULL;
    if (!fp || !out) return EN_ERR(err, EN_ERR_ARG, "en_progress_create: NULL argument");
    if (total_steps < 0 || first_step < 0 || first_step > total_steps)
        return EN_ERR(err, EN_ERR_ARG,
                      "progress: first step %lld must lie in [0, total steps %lld]",
                      (long long)first_step, (long long)total_steps);
    if (interval < 1)
        return EN_ERR(err, EN_ERR_ARG, "progress: interval must be >= 1, got %d", interval);
    en_progress *p = en_calloc(1, sizeof *p);
    if (!p) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    p->fp = fp;
    p->total = total_steps;
    p->first = p->last_step = first_step;
    p->interval = interval;
    p->tty = isatty(fileno(p->fp));
    p->t0 = en_time_now();
    p->last_val = NAN;
    *out = p;
    return EN_OK;
}

/* "45s", "1m23s", "2h05m". */
static void fmt_duration(char *buf, size_t cap, double secs) {
    long s = (long)(secs + 0.5);
    if (s < 60)
        snprintf(buf, cap, "%lds", s);
    else if (s < 3600)
        snprintf(buf, cap, "%ldm%02lds", s / 60, s % 60);
    else
        snprintf(buf, cap, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
}

void en_progress_update(en_progress *p, int64_t step, double loss, double val_loss,
                        double tokens_per_s) {
    if (!p) return;
    if (!isnan(val_loss)) p->last_val = val_loss;
    char eta[32] = "--";
    int64_t done = step - p->first;
    if (done > 0) {
        double per = (en_time_now() - p->t0) / (double)done;
        int64_t left = p->total > step ? p->total - step : 0;
        fmt_duration(eta, sizeof eta, per * (double)left);
    }
    int n = snprintf(p->line, sizeof p->line, "step %lld/%lld | loss %.3f", (long long)step,
                     (long long)p->total, loss);
    if (!isnan(p->last_val) && n > 0 && (size_t)n < sizeof p->line)
        n += snprintf(p->line + n, sizeof p->line - (size_t)n, " | val %.3f", p->last_val);
    if (tokens_per_s > 0 && n > 0 && (size_t)n < sizeof p->line)
        n += snprintf(p->line + n, sizeof p->line - (size_t)n, " | %.0f tok/s", tokens_per_s);
    if (n > 0 && (size_t)n < sizeof p->line)
        snprintf(p->line + n, sizeof p->line - (size_t)n, " | ETA %s", eta);
    p->last_step = step;
    if (p->tty) {
        fprintf(p->fp, "\r%s\033[K", p->line);
        p->live = 1;
        p->printed = 1;
    } else if (step % p->interval == 0 || step == p->total) {
        fprintf(p->fp, "%s\n", p->line);
        p->printed = 1;
    } else {
        p->printed = 0;
    }
    fflush(p->fp);
}

void en_progress_message(en_progress *p, const char *msg) {
    if (!p || !msg) return;
    if (p->tty && p->live)
        fprintf(p->fp, "\r\033[K%s\n%s", msg, p->line);
    else
        fprintf(p->fp, "%s\n", msg);
    fflush(p->fp);
}

void en_progress_finish(en_progress *p) {
    if (!p || p->finished) return;
    if (p->tty) {
        if (p->live) fputc('\n', p->fp);
    } else if (!p->printed && p->last_step > p->first) {
        fprintf(p->fp, "%s\n", p->line);
    }
    p->live = 0;
    p->finished = 1;
    fflush(p->fp);
}

void en_progress_destroy(en_progress *p) {
    if (!p) return;
    en_free_impl(p);
}
