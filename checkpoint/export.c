/*
 * export.c — consolidated weights as a safetensors file.
 *
 * safetensors (Hugging Face) is the simplest self-describing tensor file:
 *   u64 LE  N = length of the JSON header
 *   N bytes {"wte": {"dtype": "F32", "shape": [V, C],
 *                    "data_offsets": [begin, end]}, ...}  (padded with
 *            spaces to a multiple of 8, which the format allows)
 *   data    the tensors' bytes, offsets relative to the end of the header
 * Names and shapes come from the model's tensor table (PyTorch state_dict
 * names), so `safetensors.torch.load_file` gives a dict that loads into
 * the PyTorch twin of MiniGPT. The flat buffer is already in table order,
 * so the data section is the parameter buffer written as it is.
 * The header's "__metadata__" (string values only, as the format asks)
 * carries the model config, "V", "C", "H", "L", "T", so a reader can build
 * the model without the checkpoint's manifest.
 *
 * Writing: OUT.tmp, fsync, rename over OUT, as every checkpoint file is
 * written (fsutil.c), so a failed export leaves no half file and a symlink
 * at OUT is replaced, never written through. Only a safetensors file is
 * ever replaced: a shard, a manifest or `latest` given as OUT by mistake is
 * refused by name, not overwritten.
 *
 * Memory. From a step directory (dt_ckpt_export_dir, what `dtrain-ckpt
 * export` runs) the export is streamed: every shard is verified first
 * (its SHA-256, through the reader's 1 MiB scratch), then the data
 * section is written a window of EXPORT_WINDOW parameters at a time,
 * each read from the shards whose ranges meet it (checking reads, no
 * second hash). It holds 4 MiB and the manifest, never the model: a
 * 162M-parameter checkpoint (2.6 GB with its optimizer state) exports in
 * the memory of a small one. The header's tensor table comes from the
 * config (dt_config_tensors), not from a model. A --tp checkpoint's
 * shares are laid out per share, not as windows of the flat buffer; its
 * export still joins them in memory (dtrain-ckpt: dt_ckpt_tp_convert).
 *
 * Names: dtrain's own, or the seed curriculum's MiniGPT module's. The two
 * modules are the same network with the same shapes, registered in the
 * same order; only five names differ, renamed one by one (seed_name).
 *
 * dtype: F32, the checkpoint's own values, or BF16 on request (half the
 * bytes, what a bf16 inference or fine-tuning run loads): each value
 * rounded to the nearest bf16, ties to even, the rule the collectives and
 * --precision bf16 round by (dt_f32_to_bf16_n), a window at a time on
 * its way out; the checkpoint keeps its fp32 masters either way.
 */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_internal.h"

/* Parameters a streamed export holds at once: 4 MiB. */
#define EXPORT_WINDOW ((size_t)1 << 20)

/* {"format": "pt", "V": "256", "C": "128", ...}: the config as strings. */
static json_t *config_metadata(const dt_config *cfg)
{
    char v[5][16];
    const int values[5] = {cfg->V, cfg->C, cfg->H, cfg->L, cfg->T};
    for (int i = 0; i < 5; i++)
        snprintf(v[i], sizeof v[i], "%d", values[i]);
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "format", "pt", "V", v[0], "C", v[1], "H",
                     v[2], "L", v[3], "T", v[4]);
}

/* A tensor's name in the seed curriculum's module: nn.Embedding tok_embed
 * and pos_embed, the MLP an nn.Sequential(Linear, GELU, Linear) (so its
 * Linears are "mlp.0" and "mlp.2"), and the head plain "head". */
static void seed_name(char *out, size_t len, const char *name)
{
    static const struct {
        const char *dtrain, *seed;
    } renamed[] = {
        {"wte.", "tok_embed."}, {"wpe.", "pos_embed."},  {"lm_head.", "head."},
        {"mlp.fc.", "mlp.0."},  {"mlp.proj.", "mlp.2."},
    };
    for (size_t i = 0; i < sizeof renamed / sizeof renamed[0]; i++) {
        const char *at = strstr(name, renamed[i].dtrain);
        if (at && (at == name || at[-1] == '.')) {
            snprintf(out, len, "%.*s%s%s", (int)(at - name), name, renamed[i].seed,
                     at + strlen(renamed[i].dtrain));
            return;
        }
    }
    snprintf(out, len, "%s", name);
}

/* The JSON header, padded to a multiple of 8 bytes; NULL on ENOMEM. */
static char *build_header(const dt_config *cfg, const dt_ckpt_export_options *o, size_t *len)
{
    size_t size = o->dtype == DT_BF16 ? sizeof(uint16_t) : sizeof(float);
    dt_tensor_info *tab;
    int nt;
    if (dt_config_tensors(cfg, &tab, &nt) != DT_OK)
        return NULL;
    json_t *root = json_object();
    if (root)
        json_object_set_new(root, "__metadata__", config_metadata(cfg));
    for (int i = 0; root && i < nt; i++) {
        const dt_tensor_info *t = &tab[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        size_t begin = t->offset * size;
        size_t end = begin + t->numel * size;
        char name[96];
        if (o->names == DT_CKPT_NAMES_SEED)
            seed_name(name, sizeof name, t->name);
        else
            snprintf(name, sizeof name, "%s", t->name);
        json_object_set_new(root, name,
                            json_pack("{s:s, s:o, s:[II]}", "dtype",
                                      o->dtype == DT_BF16 ? "BF16" : "F32", "shape", shape,
                                      "data_offsets", (json_int_t)begin, (json_int_t)end));
    }
    char *text = root ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    free(tab);
    if (!text)
        return NULL;
    size_t n = strlen(text), padded = (n + 7) / 8 * 8;
    char *out = realloc(text, padded + 1);
    if (!out) {
        free(text);
        return NULL;
    }
    memset(out + n, ' ', padded - n);
    out[padded] = '\0';
    *len = padded;
    return out;
}

/* Whether export may write path: nothing is there, or a regular file of
 * this kind (a u64 header length, then the JSON's '{'). */
static dt_status replaceable(dt_ckpt *ck, const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0 && errno == ENOENT)
        return DT_OK;
    int fd = ckpt_open_regular(ck, path, &st);
    if (fd < 0)
        return ck->status;
    unsigned char head[9];
    bool ours = read(fd, head, sizeof head) == (ssize_t)sizeof head && head[8] == '{';
    close(fd);
    if (ours)
        return DT_OK;
    return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_UNSAFE_NAME,
                     "export: %s exists and is not a safetensors file: export replaces "
                     "nothing else (a shard, a manifest, `latest`); give another OUT",
                     path);
}

/* Where the data section comes from: one buffer, or a step directory's
 * shards read a window at a time; and in which dtype it is written. */
typedef struct body {
    const float *params;    /* the whole buffer, or NULL */
    const char *dir;        /* else: the step directory */
    const ckpt_manifest *m; /* its manifest */
    size_t n;               /* parameters */
    dt_dtype dtype;         /* DT_F32 or DT_BF16 */
    uint16_t *narrow;       /* bf16: EXPORT_WINDOW values of scratch */
} body;

/* w parameters onto fd, as they are or rounded to bf16. */
static bool write_values(int fd, const body *b, const float *v, size_t w)
{
    if (b->dtype != DT_BF16)
        return ckpt_write_all(fd, v, w * sizeof(float));
    dt_f32_to_bf16_n(b->narrow, v, w);
    return ckpt_write_all(fd, b->narrow, w * sizeof(uint16_t));
}

/* The parameters onto fd, EXPORT_WINDOW at a time: from the buffer, or
 * each window read from every shard whose ranges meet it (checking reads:
 * the caller verified the hashes first). */
static dt_status write_data(dt_ckpt *ck, int fd, const body *b)
{
    float *win = b->params ? NULL : malloc(EXPORT_WINDOW * sizeof(float));
    if (!b->params && !win)
        return ckpt_fail(ck, DT_ENOMEM, DT_CKPT_FAULT_IO, "export: out of memory");
    dt_status st = DT_OK;
    for (size_t lo = 0; lo < b->n && st == DT_OK; lo += EXPORT_WINDOW) {
        size_t w = b->n - lo < EXPORT_WINDOW ? b->n - lo : EXPORT_WINDOW;
        dt_ckpt_state s = {.cfg = b->m ? b->m->cfg : (dt_config){0},
                           .num_params = b->n,
                           .params = win,
                           .held_lo = lo,
                           .held_n = w};
        for (int r = 0; win && r < b->m->world && st == DT_OK; r++)
            st = ckpt_read_shard(ck, b->dir, b->m, r, &s, false);
        if (st == DT_OK && !write_values(fd, b, win ? win : b->params + lo, w))
            st = ckpt_fail(ck, DT_ESYS, DT_CKPT_FAULT_IO, "export: writing: %s", strerror(errno));
    }
    free(win);
    return st;
}

/* path.tmp = u64 hlen, header, the parameters; fsync; rename over path. */
static dt_status write_replacing(dt_ckpt *ck, const char *path, const char *header, size_t hlen,
                                 const body *b)
{
    char tmp[CKPT_PATH_MAX];
    if (strlen(path) + 5 > sizeof tmp)
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_IO, "export: too long a path");
    if (replaceable(ck, path) != DT_OK)
        return ck->status;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = ckpt_create_tmp(ck, tmp);
    if (fd < 0)
        return ck->status;
    unsigned char lenbuf[8];
    put_le64(lenbuf, hlen);
    bool ok = ckpt_write_all(fd, lenbuf, 8) && ckpt_write_all(fd, header, hlen);
    if (ok && write_data(ck, fd, b) != DT_OK) {
        close(fd);
        unlink(tmp);
        return ck->status;
    }
    ok = ok && fsync(fd) == 0;
    int e = errno;
    ok = close(fd) == 0 && ok;
    if (ok && rename(tmp, path) != 0)
        ok = false, e = errno;
    if (!ok) {
        unlink(tmp);
        return ckpt_fail(ck, DT_ESYS, DT_CKPT_FAULT_IO, "export: writing %s: %s", path,
                         strerror(e));
    }
    return DT_OK;
}

/* The header for cfg, then the body, into path. */
static dt_status export_body(dt_ckpt *ck, const char *path, const dt_config *cfg,
                             const dt_ckpt_export_options *o, body *b)
{
    char err[160];
    if (dt_config_check(cfg, err, sizeof err) != DT_OK)
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_CONFIG, "export: %s", err);
    if (o->dtype != DT_F32 && o->dtype != DT_BF16)
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_CONFIG,
                         "export: the dtype is f32 or bf16, not %s", dt_dtype_name(o->dtype));
    b->dtype = o->dtype;
    size_t hlen = 0;
    char *header = build_header(cfg, o, &hlen);
    b->narrow = o->dtype == DT_BF16 ? malloc(EXPORT_WINDOW * sizeof(uint16_t)) : NULL;
    dt_status st = DT_ENOMEM;
    if (!header || (o->dtype == DT_BF16 && !b->narrow))
        ckpt_fail(ck, DT_ENOMEM, DT_CKPT_FAULT_IO, "export: out of memory");
    else
        st = write_replacing(ck, path, header, hlen, b);
    free(b->narrow);
    free(header);
    return st;
}

dt_status dt_ckpt_export_safetensors(dt_ckpt *ck, const char *path, const dt_config *cfg,
                                     const float *params)
{
    return dt_ckpt_export_safetensors_as(ck, path, cfg, params, &(dt_ckpt_export_options){0});
}

dt_status dt_ckpt_export_safetensors_as(dt_ckpt *ck, const char *path, const dt_config *cfg,
                                        const float *params, const dt_ckpt_export_options *o)
{
    body b = {.params = params, .n = dt_config_num_params(cfg)};
    return export_body(ck, path, cfg, o, &b);
}

dt_status dt_ckpt_export_dir(dt_ckpt *ck, const char *step_dir, const char *path,
                             const dt_ckpt_export_options *o)
{
    dt_status st = dt_ckpt_verify(ck, step_dir); /* every hash, through 1 MiB */
    if (st != DT_OK)
        return st;
    ckpt_manifest m;
    if ((st = ckpt_manifest_read(ck, step_dir, &m)) != DT_OK)
        return st;
    if (m.tp > 1)
        st = ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_CONFIG,
                       "export: %s holds --tp %d shares, which a window of the flat buffer "
                       "does not join: load it whole (dt_ckpt_tp_convert)",
                       step_dir, m.tp);
    body b = {.dir = step_dir, .m = &m, .n = (size_t)m.num_params};
    if (st == DT_OK)
        st = export_body(ck, path, &m.cfg, o, &b);
    ckpt_manifest_free(&m);
    return st;
}
