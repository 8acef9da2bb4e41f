/*
 * http_adapters.c - LoRA adapters loaded and unloaded while serving:
 *   GET    /v1/adapters          the loaded adapters, with the requests on each
 *   POST   /v1/adapters          {"name","path"}: load a PEFT adapter directory
 *                                (ours or one PEFT wrote) from --adapter-dir;
 *                                with "dry_run": true (and "rank"), only say
 *                                whether such a load would be taken
 *   GET    /v1/adapters/{name}   one of them
 *   DELETE /v1/adapters/{name}   unload: the name goes at once (new requests
 *                                get 404), the weights when its running
 *                                requests end
 * Behind the API key like every route but /health.
 *
 * Nothing outside --adapter-dir is opened, stat'ed or described: every open
 * goes through en_open_beneath from a descriptor of the directory, so a
 * ".." or a symbolic link leading out is refused (403) the same way whether
 * or not its target exists, and links inside it (a Hugging Face cache's
 * snapshots) still work. Files are opened non-blocking and must be regular
 * (models/lora.c), so a FIFO in the directory holds no thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/file.h"
#include "adapters_request.h"
#include "http_impl.h"

static json_t *adapter_json(const en_adapter_info *a, const char *base) {
    return json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:I}", "id", a->name, "object", "adapter",
                     "parent", base, "path", a->path, "rank", a->rank, "running", a->users,
                     "created", (json_int_t)a->created);
}

/* A path of the request, relative to --adapter-dir or absolute under it. */
typedef struct adapter_path {
    int root;            /* --adapter-dir, O_PATH; -1 when not open */
    char rel[PATH_MAX];  /* the path relative to it ("." for itself) */
    char shown[PATH_MAX]; /* the adapter directory's real path, for answers */
} adapter_path;

static void adapter_path_close(adapter_path *p) {
    if (p->root >= 0) close(p->root);
    p->root = -1;
}

/* The request's path written relative to --adapter-dir (rdir is its real
 * path, dir as given): an absolute path must start with either, and is
 * refused before the file system is asked about it. */
static int relative_path(const char *dir, const char *rdir, const char *path, char *rel,
                         size_t cap, oa_err *e) {
    const char *rest = path;
    if (path[0] == '/') {
        const size_t n = strlen(rdir), nd = strlen(dir);
        if (strncmp(path, rdir, n) == 0 && (path[n] == '/' || !path[n]))
            rest = path + n;
        else if (strncmp(path, dir, nd) == 0 && (path[nd] == '/' || !path[nd]))
            rest = path + nd;
        else
            return oa_fail(e, 403, "path_not_allowed", "path",
                           "path '%.300s' is outside the server's --adapter-dir", path);
        while (*rest == '/') rest++;
    }
    if (snprintf(rel, cap, "%s", *rest ? rest : ".") >= (int)cap)
        return oa_fail(e, 400, NULL, "path", "path is over %zu bytes", cap - 1);
    return 0;
}

/* errno of en_open_beneath -> the answer; an outside path is 403 whatever
 * is there (EXDEV / ELOOP come before any lookup outside). */
static int open_error(int en, const char *path, oa_err *e) {
    if (en == EXDEV || en == ELOOP)
        return oa_fail(e, 403, "path_not_allowed", "path",
                       "path '%.300s' leads outside the server's --adapter-dir (a '..' or a "
                       "symbolic link out of it)",
                       path);
    if (en == ENOENT || en == ENOTDIR)
        return oa_fail(e, 404, "adapter_not_found", "path",
                       "path '%.300s': no such directory in --adapter-dir", path);
    return oa_fail(e, 400, "invalid_adapter", "path", "path '%.300s': %s", path, strerror(en));
}

/* The real path of an open descriptor (beneath root by construction), else
 * rdir/rel. */
static void shown_path(int fd, const char *rdir, const char *rel, char *out, size_t cap) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, cap - 1);
    if (n > 0) {
        out[n] = 0;
        return;
    }
    snprintf(out, cap, "%.2000s/%.2000s", rdir, rel);
}

/* 1 when a component of the '/'-separated path is "..". */
static int has_dotdot(const char *path) {
    for (const char *c = path; *c;) {
        size_t n = strcspn(c, "/");
        if (n == 2 && c[0] == '.' && c[1] == '.') return 1;
        c += n;
        while (*c == '/') c++;
    }
    return 0;
}

/* Open --adapter-dir and find the request's path beneath it: an existing
 * directory, or with may_be_missing (a dry run: the directory a run will
 * write) a path whose deepest existing ancestor is a directory beneath it
 * and whose missing part holds no "..". 0 with *p open; else -1 with e. */
static int adapter_path_open(const char *dir, const char *path, int may_be_missing,
                             adapter_path *p, oa_err *e) {
    char rdir[PATH_MAX], probe[PATH_MAX];
    p->root = -1;
    if (!realpath(dir, rdir))
        return oa_fail(e, 500, NULL, NULL, "--adapter-dir %s: %s", dir, strerror(errno));
    if (relative_path(dir, rdir, path, p->rel, sizeof p->rel, e)) return -1;
    p->root = open(rdir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (p->root < 0)
        return oa_fail(e, 500, NULL, NULL, "--adapter-dir %s: %s", dir, strerror(errno));
    snprintf(probe, sizeof probe, "%s", p->rel);
    int fd = en_open_beneath(p->root, p->rel, O_PATH | O_DIRECTORY);
    int en = errno;
    size_t keep = strlen(p->rel); /* bytes of rel that exist */
    while (fd < 0 && may_be_missing && en == ENOENT && keep > 0) {
        while (keep > 0 && p->rel[keep - 1] != '/') keep--; /* drop the last component */
        while (keep > 0 && p->rel[keep - 1] == '/') keep--;
        snprintf(probe, sizeof probe, "%.*s", (int)keep, keep ? p->rel : ".");
        fd = en_open_beneath(p->root, probe, O_PATH | O_DIRECTORY);
        en = errno;
    }
    if (fd < 0) {
        adapter_path_close(p);
        return open_error(en, path, e);
    }
    shown_path(fd, rdir, keep ? probe : ".", p->shown, sizeof p->shown);
    close(fd);
    const char *rest = p->rel + keep; /* to be made by the run: "" for an existing path */
    if (has_dotdot(rest)) {
        adapter_path_close(p);
        return open_error(EXDEV, path, e);
    }
    while (*rest == '/') rest++;
    size_t n = strlen(p->shown);
    if (*rest) snprintf(p->shown + n, sizeof p->shown - n, "/%s", rest);
    return 0;
}

/* "dry_run": the answers a load of this name and path would get now, and
 * the rank checked against --max-lora-rank, with nothing read or loaded. */
static int dry_run(en_adapter_set *set, const adapters_req *q, const adapter_path *p,
                   json_t **ans, oa_err *e) {
    int max_adapters, max_rank, loaded, draining;
    en_adapter_set_limits(set, &max_adapters, &max_rank);
    en_adapter_set_counts(set, &loaded, &draining);
    en_adapter_info info;
    if (en_adapter_set_find(set, q->name, &info))
        return oa_fail(e, 409, "adapter_exists", "name", "an adapter named '%s' is already loaded",
                       q->name);
    if (loaded >= max_adapters)
        return oa_fail(e, 409, "too_many_adapters", "name",
                       "%d adapters are loaded, the most --max-adapters allows", loaded);
    if (q->rank > max_rank)
        return oa_fail(e, 400, "invalid_adapter", "rank",
                       "LoRA rank %d is over this server's --max-lora-rank %d", q->rank, max_rank);
    *ans = json_pack("{s:s, s:s, s:s, s:b, s:i}", "id", q->name, "object", "adapter.check",
                     "path", p->shown, "dry_run", 1, "max_lora_rank", max_rank);
    return 0;
}

static int load(http_req *r, en_adapter_set *set, json_t **ans, oa_err *e) {
    const char *dir = srv_adapter_dir(r->srv);
    const char *base = srv_config(r->srv)->model_name;
    if (!dir)
        return oa_fail(e, 403, "adapter_loading_disabled", NULL,
                       "loading adapters while serving is off; start the server with "
                       "--adapter-dir DIR");
    adapters_req q;
    if (adapters_req_parse(r->body, r->body_len, base, &q, e)) return -1;
    const char *name = q.name;
    adapter_path p;
    int rc = adapter_path_open(dir, q.path, q.dry_run, &p, e);
    if (!rc && q.dry_run) {
        rc = dry_run(set, &q, &p, ans, e);
        adapter_path_close(&p);
        adapters_req_free(&q);
        return rc;
    }
    en_engine *eng = NULL;
    if (!rc && !srv_get_engine(r->srv, &eng, NULL))
        rc = oa_fail(e, 503, NULL, NULL, "The model is still loading.");
    en_lora *l = NULL;
    en_err err = {0};
    if (!rc) {
        en_model *m = en_engine_model(eng);
        en_lora_load_opts o = en_lora_load_opts_default();
        int max_adapters;
        en_adapter_set_limits(set, &max_adapters, &o.max_rank);
        o.max_rank_flag = "this server's --max-lora-rank";
        o.root_fd = p.root;
        o.shown = p.shown;
        if (en_lora_load_peft_opts(en_model_get_backend(m), en_model_get_hparams(m), p.rel, &o,
                                   &l, &err) != EN_OK)
            rc = oa_fail(e, 400, "invalid_adapter", "path", "%s", err.msg);
    }
    en_adapter_info info;
    if (!rc) {
        en_status st = en_adapter_set_add_info(set, name, p.shown, l, &info, &err);
        if (st == EN_ERR_BUSY)
            rc = oa_fail(e, 409, strstr(err.msg, "already") ? "adapter_exists"
                                                            : "too_many_adapters",
                         "name", "%s", err.msg);
        else if (st != EN_OK)
            rc = oa_fail(e, 400, NULL, strstr(err.msg, "rank") ? "path" : "name", "%s",
                         err.msg);
    }
    /* info was taken when it was added: a DELETE racing this load may have
     * unloaded it since, and the load still succeeded */
    if (!rc) *ans = adapter_json(&info, base);
    adapter_path_close(&p);
    adapters_req_free(&q);
    return rc;
}

enum MHD_Result http_adapters(http_req *r) {
    oa_err e = {0};
    en_adapter_set *set = srv_adapters(r->srv);
    const char *base = srv_config(r->srv)->model_name;
    if (!set) {
        oa_fail(&e, 404, "adapters_not_enabled", NULL, "this server holds no adapter set");
        return http_send_error(r, &e);
    }
    const char *name = r->route == ROUTE_ADAPTER ? r->url + strlen("/v1/adapters/") : NULL;
    if (strcmp(r->method, "POST") == 0) {
        json_t *ans = NULL;
        if (load(r, set, &ans, &e)) return http_send_error(r, &e);
        return http_send_json(r, 200, ans);
    }
    if (strcmp(r->method, "DELETE") == 0) {
        if (!en_adapter_set_remove(set, name)) {
            oa_fail(&e, 404, "adapter_not_found", NULL, "no adapter named '%.200s' is loaded",
                    name);
            return http_send_error(r, &e);
        }
        return http_send_json(r, 200, json_pack("{s:s, s:s, s:b}", "id", name, "object",
                                                "adapter", "deleted", 1));
    }
    json_t *ans = NULL;
    en_adapter_info info;
    if (name) {
        if (en_adapter_set_find(set, name, &info)) ans = adapter_json(&info, base);
    } else {
        en_adapter_info *all = NULL;
        int n = en_adapter_set_list(set, &all);
        json_t *data = json_array();
        for (int i = 0; i < n; i++) json_array_append_new(data, adapter_json(&all[i], base));
        en_free(all);
        ans = json_pack("{s:s, s:o}", "object", "list", "data", data);
    }
    if (!ans) {
        oa_fail(&e, 404, "adapter_not_found", NULL, "no adapter named '%.200s' is loaded", name);
        return http_send_error(r, &e);
    }
    return http_send_json(r, 200, ans);
}
