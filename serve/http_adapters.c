/*
 * http_adapters.c - LoRA adapters loaded and unloaded while serving:
 *   GET    /v1/adapters          the loaded adapters, with the requests on each
 *   POST   /v1/adapters          {"name","path"}: load a PEFT adapter directory
 *                                (ours or one PEFT wrote) from --adapter-dir
 *   GET    /v1/adapters/{name}   one of them
 *   DELETE /v1/adapters/{name}   unload: the name goes at once (new requests
 *                                get 404), the weights when its running
 *                                requests end
 * Behind the API key like every route but /health. A path outside
 * --adapter-dir (after symbolic links are resolved) is refused with 403.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "adapters_request.h"
#include "http_impl.h"

static json_t *adapter_json(const en_adapter_info *a, const char *base) {
    return json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:I}", "id", a->name, "object", "adapter",
                     "parent", base, "path", a->path, "rank", a->rank, "running", a->users,
                     "created", (json_int_t)a->created);
}

/* path (relative to dir, or absolute) -> its real path, which must lie in
 * dir; a path that is outside dir written out is refused before the file
 * system is asked about it, so the answer says nothing of what is there. */
static int resolve(const char *dir, const char *path, char *out, oa_err *e) {
    char rdir[PATH_MAX], joined[2 * PATH_MAX];
    if (!realpath(dir, rdir))
        return oa_fail(e, 500, NULL, NULL, "--adapter-dir %s: %s", dir, strerror(errno));
    const size_t n = strlen(rdir);
    if (path[0] == '/') {
        size_t nd = strlen(dir);
        int under = (strncmp(path, rdir, n) == 0 && (path[n] == '/' || !path[n])) ||
                    (strncmp(path, dir, nd) == 0 && (path[nd] == '/' || !path[nd]));
        if (!under)
            return oa_fail(e, 403, "path_not_allowed", "path",
                           "path '%.300s' is outside the server's --adapter-dir", path);
        snprintf(joined, sizeof joined, "%s", path);
    } else {
        snprintf(joined, sizeof joined, "%s/%s", rdir, path);
    }
    if (!realpath(joined, out))
        return oa_fail(e, 404, "adapter_not_found", "path",
                       "path '%.300s': no such directory in --adapter-dir (%s)", path,
                       strerror(errno));
    if (strncmp(out, rdir, n) != 0 || (out[n] != '/' && out[n] != 0))
        return oa_fail(e, 403, "path_not_allowed", "path",
                       "path '%.300s' leads outside the server's --adapter-dir", path);
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
    char real[PATH_MAX];
    int rc = resolve(dir, q.path, real, e);
    en_engine *eng = NULL;
    if (!rc && !srv_get_engine(r->srv, &eng, NULL))
        rc = oa_fail(e, 503, NULL, NULL, "The model is still loading.");
    en_lora *l = NULL;
    en_err err = {0};
    if (!rc) {
        en_model *m = en_engine_model(eng);
        if (en_lora_load_peft(en_model_get_backend(m), en_model_get_hparams(m), real, &l,
                              &err) != EN_OK)
            rc = oa_fail(e, 400, "invalid_adapter", "path", "%s", err.msg);
    }
    if (!rc) {
        en_status st = en_adapter_set_add(set, name, real, l, &err);
        if (st == EN_ERR_BUSY)
            rc = oa_fail(e, 409, strstr(err.msg, "already") ? "adapter_exists"
                                                            : "too_many_adapters",
                         "name", "%s", err.msg);
        else if (st != EN_OK)
            rc = oa_fail(e, 400, NULL, strstr(err.msg, "rank") ? "path" : "name", "%s",
                         err.msg);
    }
    en_adapter_info info;
    if (!rc && !en_adapter_set_find(set, name, &info))
        rc = oa_fail(e, 500, NULL, NULL, "the adapter went away while loading");
    if (!rc) *ans = adapter_json(&info, base);
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
