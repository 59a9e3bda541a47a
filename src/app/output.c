#include "output.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "durable.h"
#include "reasoning.h"
#include "util.h"

/* A dataset of rows x cols (rows 0: one dimension of cols). */
static int write_table(hid_t g, const char *name, hid_t type, const void *data, size_t rows, size_t cols)
{
    hsize_t dims[2] = {rows ? rows : cols, cols};
    hid_t sp = H5Screate_simple(rows ? 2 : 1, dims, NULL);
    hid_t ds = H5Dcreate2(g, name, type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    size_t n = rows ? rows * cols : cols;
    herr_t st = ds < 0 ? -1 : (n > 0 ? H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) : 0);
    if (ds >= 0) H5Dclose(ds);
    H5Sclose(sp);
    return st < 0 ? dcp_fail("HDF5: cannot write dataset %s", name) : 0;
}

static int write_array(hid_t g, const char *name, hid_t type, const void *data, size_t n)
{
    return write_table(g, name, type, data, 0, n);
}

static hid_t string_type(void)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    return t;
}

static int write_strings(hid_t g, const char *name, const char *const *s, size_t n)
{
    hid_t t = string_type();
    int rc = write_array(g, name, t, s, n);
    H5Tclose(t);
    return rc;
}

static void attr_str(hid_t obj, const char *name, const char *v)
{
    hid_t t = string_type();
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, t, &v);
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
}

static void attr_num(hid_t obj, const char *name, hid_t type, const void *v)
{
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, type, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, type, v);
    H5Aclose(a);
    H5Sclose(sp);
}

static void attr_int(hid_t obj, const char *name, long long v) { attr_num(obj, name, H5T_NATIVE_LLONG, &v); }

static void write_root_attrs(hid_t f, const RunInfo *in)
{
    const Config *c = in->cfg;
    static const char *formats[] = {"generated", "llama2c", "huggingface"};
    attr_str(f, "program", PACKAGE_NAME);
    attr_str(f, "version", PACKAGE_VERSION);
    attr_str(f, "model_path", in->model_path);
    attr_str(f, "model_format", formats[c->format]);
    attr_str(f, "prompts_path", in->prompts_path);
    attr_int(f, "dim", c->dim);
    attr_int(f, "hidden_dim", c->hidden_dim);
    attr_int(f, "n_layers", c->n_layers);
    attr_int(f, "n_heads", c->n_heads);
    attr_int(f, "n_kv_heads", c->n_kv_heads);
    attr_int(f, "head_dim", c->head_dim);
    attr_int(f, "vocab_size", c->vocab_size);
    attr_int(f, "max_model_len", in->max_model_len);
    attr_int(f, "world_size", in->world_size);
    attr_int(f, "tp", in->tp);
    attr_int(f, "dcp", in->dcp);
    attr_int(f, "dp", in->dp);
    attr_int(f, "interleave", in->interleave);
    attr_str(f, "dcp_comm_backend", in->dcp_comm_backend);
    attr_str(f, "speculative_config", in->speculative_config ? in->speculative_config : "");
    attr_int(f, "threads_per_rank", in->threads_per_rank);
    attr_str(f, "backend", in->backend);
    attr_str(f, "mpi_buffers", in->mpi_buffers);
    attr_str(f, "cpu_kernels", in->cpu_kernels ? in->cpu_kernels : "");
    unsigned long long seed = in->seed;
    attr_num(f, "seed", H5T_NATIVE_ULLONG, &seed);
    char when[64];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    attr_str(f, "created", when);
    attr_str(f, "run_identity", in->identity ? in->identity : "");
    attr_str(f, "reduction_order", in->reduction_order ? in->reduction_order : "");
    attr_int(f, "k_chunks", in->k_chunks);
    attr_int(f, "key_shards", in->key_shards);
    attr_int(f, "resumed_requests", in->resumed_requests);
}

/* The run_identity attribute of an HDF5 results file, malloc'ed; NULL when
 * the file or the attribute is missing. */
static char *hdf5_identity(const char *path)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (H5Fis_hdf5(path) <= 0) return NULL;
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return NULL;
    char *out = NULL;
    hid_t a = H5Aexists(f, "run_identity") > 0 ? H5Aopen(f, "run_identity", H5P_DEFAULT) : -1;
    if (a >= 0) {
        hid_t t = string_type();
        char *v = NULL;
        if (H5Aread(a, t, &v) >= 0 && v && v[0]) out = xstrdup(v);
        if (v) H5free_memory(v);
        H5Tclose(t);
        H5Aclose(a);
    }
    H5Fclose(f);
    return out;
}

/* The identity in OUT.run.json, if the file names the results file as it
 * is (its size and hash): a results file replaced or cut since has none. */
static char *jsonl_identity(const char *path)
{
    char *side = xmalloc(strlen(path) + 16), *text = NULL, *data = NULL, *out = NULL;
    sprintf(side, "%s.run.json", path);
    size_t len, size;
    if (check_regular_file(side, "run") == 0 && read_file(side, &text, &len) == 0 &&
        read_file(path, &data, &size) == 0) {
        json_t *o = json_loads(text, 0, NULL);
        char hash[17];
        snprintf(hash, sizeof hash, "%016llx", (unsigned long long)fnv1a(FNV_START, data, size));
        const char *h = json_string_value(json_object_get(o, "results_hash"));
        if (json_integer_value(json_object_get(o, "results_bytes")) == (json_int_t)size && h && !strcmp(h, hash)) {
            char *s = json_dumps(json_object_get(o, "identity"), JSON_COMPACT);
            if (s) out = xstrdup(s);
            free(s);
        }
        json_decref(o);
    }
    free(text);
    free(data);
    free(side);
    return out;
}

char *output_read_identity(const char *path, const char *format)
{
    if (access(path, R_OK) || check_regular_file(path, "results")) return NULL;
    return strcmp(format, "jsonl") ? hdf5_identity(path) : jsonl_identity(path);
}

/* One kind of log-probabilities (output or prompt) of every request, flat:
 * per token the scored token's (NaN where not asked; aligned with the
 * tokens) and the top N (N per request, -1 when not asked). */
typedef struct {
    int *n_top;
    float *lp;
    int64_t *top_off;
    int *top_id;
    float *top_lp;
} FlatLogprobs;

static void flatten_logprobs(const RequestSet *rs, const Result *res, const int64_t *tok_off, int prompt,
                             FlatLogprobs *f)
{
    int n = rs->n;
    f->n_top = xmalloc(sizeof(int) * (size_t)(n + 1));
    f->top_off = xmalloc(sizeof(int64_t) * (size_t)(n + 1));
    f->lp = xmalloc(sizeof(float) * (size_t)(tok_off[n] + 1));
    f->top_off[0] = 0;
    for (int i = 0; i < n; i++) {
        const float *lp = prompt ? res[i].plp : res[i].lp;
        int k = prompt ? rs->r[i].prompt_logprobs : rs->r[i].logprobs;
        f->n_top[i] = lp ? k : -1;
        f->top_off[i + 1] = f->top_off[i] + (lp ? (tok_off[i + 1] - tok_off[i]) * k : 0);
    }
    f->top_id = xmalloc(sizeof(int) * (size_t)(f->top_off[n] + 1));
    f->top_lp = xmalloc(sizeof(float) * (size_t)(f->top_off[n] + 1));
    for (int i = 0; i < n; i++) {
        const Result *r = &res[i];
        const float *lp = prompt ? r->plp : r->lp;
        size_t m = (size_t)(tok_off[i + 1] - tok_off[i]), tops = (size_t)(f->top_off[i + 1] - f->top_off[i]);
        for (size_t j = 0; j < m; j++) f->lp[tok_off[i] + j] = lp ? lp[j] : NAN;
        if (tops) {
            memcpy(f->top_id + f->top_off[i], prompt ? r->ptop_id : r->top_id, sizeof(int) * tops);
            memcpy(f->top_lp + f->top_off[i], prompt ? r->ptop_lp : r->top_lp, sizeof(float) * tops);
        }
    }
}

static int write_flat_logprobs(hid_t g, const char *prefix, const FlatLogprobs *f, int n)
{
    char name[5][64];
    static const char *what[5] = {"", "logprobs_n", "top_offsets", "top_ids", "top_logprobs"};
    for (int k = 1; k < 5; k++) snprintf(name[k], sizeof name[k], "%s%s", prefix, what[k]);
    int rc = write_array(g, name[1], H5T_NATIVE_INT, f->n_top, (size_t)n) ||
             write_array(g, name[2], H5T_NATIVE_INT64, f->top_off, (size_t)n + 1) ||
             write_array(g, name[3], H5T_NATIVE_INT, f->top_id, (size_t)f->top_off[n]) ||
             write_array(g, name[4], H5T_NATIVE_FLOAT, f->top_lp, (size_t)f->top_off[n]);
    return rc;
}

/* stop_str, stop_token and the log-probability datasets of /requests */
static int write_stops_and_logprobs(hid_t g, const RequestSet *rs, const Result *res, const int64_t *poff,
                                    const int64_t *ooff)
{
    int n = rs->n;
    const char **stop = xmalloc(sizeof(char *) * (size_t)(n + 1));
    int *stop_tok = xmalloc(sizeof(int) * (size_t)(n + 1));
    for (int i = 0; i < n; i++) {
        stop[i] = res[i].stop_str ? res[i].stop_str : "";
        stop_tok[i] = res[i].finish_reason && !strcmp(res[i].finish_reason, "stop") ? res[i].stop_token : -1;
    }
    FlatLogprobs out, prompt;
    flatten_logprobs(rs, res, ooff, 0, &out);
    flatten_logprobs(rs, res, poff, 1, &prompt);
    int rc = write_strings(g, "stop_str", stop, (size_t)n) || write_array(g, "stop_token", H5T_NATIVE_INT, stop_tok, (size_t)n) ||
             write_array(g, "output_logprobs", H5T_NATIVE_FLOAT, out.lp, (size_t)ooff[n]) ||
             write_flat_logprobs(g, "output_", &out, n) ||
             write_array(g, "prompt_logprobs", H5T_NATIVE_FLOAT, prompt.lp, (size_t)poff[n]) ||
             write_flat_logprobs(g, "prompt_", &prompt, n);
    FlatLogprobs *both[2] = {&out, &prompt};
    for (int k = 0; k < 2; k++) {
        free(both[k]->n_top);
        free(both[k]->lp);
        free(both[k]->top_off);
        free(both[k]->top_id);
        free(both[k]->top_lp);
    }
    free(stop);
    free(stop_tok);
    return rc;
}

/* With a reasoning parser: each text's reasoning and content ("" where
 * the parser finds none) */
static int write_reasoning(hid_t g, const RequestSet *rs, char *const *texts, int parser)
{
    int n = rs->n;
    char **parts[2] = {xcalloc((size_t)n + 1, sizeof(char *)), xcalloc((size_t)n + 1, sizeof(char *))};
    for (int i = 0; i < n; i++) {
        TextSpan s[2];
        const char *t = texts[i] ? texts[i] : "";
        reasoning_split(parser, t, strlen(t), rs->r[i].thinking_off, &s[0], &s[1]);
        for (int k = 0; k < 2; k++) {
            size_t len = s[k].n > 0 ? (size_t)s[k].n : 0;
            parts[k][i] = xmalloc(len + 1);
            memcpy(parts[k][i], s[k].p, len);
            parts[k][i][len] = '\0';
        }
    }
    int rc = write_strings(g, "reasoning_content", (const char *const *)parts[0], (size_t)n) ||
             write_strings(g, "content", (const char *const *)parts[1], (size_t)n);
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < n; i++) free(parts[k][i]);
        free(parts[k]);
    }
    return rc;
}

static int write_requests(hid_t f, const RequestSet *rs, const Result *res, char *const *texts, int parser)
{
    int n = rs->n;
    hid_t g = H5Gcreate2(f, "requests", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) return dcp_fail("HDF5: cannot create /requests");
    const char **ids = xmalloc(sizeof(char *) * (n + 1));
    const char **fin = xmalloc(sizeof(char *) * (n + 1));
    const char **err = xmalloc(sizeof(char *) * (n + 1));
    int *line = xmalloc(sizeof(int) * (n + 1)), *choice = xmalloc(sizeof(int) * (n + 1)),
        *cached = xmalloc(sizeof(int) * (n + 1)), *drafted = xmalloc(sizeof(int) * (n + 1)),
        *accepted = xmalloc(sizeof(int) * (n + 1));
    int64_t *poff = xmalloc(sizeof(int64_t) * (n + 1)), *ooff = xmalloc(sizeof(int64_t) * (n + 1));
    double *ttft = xmalloc(sizeof(double) * (n + 1)), *tpot = xmalloc(sizeof(double) * (n + 1)),
           *e2e = xmalloc(sizeof(double) * (n + 1));
    poff[0] = ooff[0] = 0;
    for (int i = 0; i < n; i++) {
        const Request *q = &rs->r[i];
        ids[i] = q->id;
        fin[i] = res[i].finish_reason ? res[i].finish_reason : "error";
        err[i] = q->error ? q->error : "";
        line[i] = q->line;
        choice[i] = q->choice;
        cached[i] = res[i].num_cached_tokens;
        drafted[i] = res[i].spec_draft_tokens;
        accepted[i] = res[i].spec_accepted_tokens;
        poff[i + 1] = poff[i] + (q->prompt_tokens ? q->n_prompt : 0);
        ooff[i + 1] = ooff[i] + res[i].n;
        ttft[i] = res[i].ttft_s;
        tpot[i] = res[i].tpot_s;
        e2e[i] = res[i].e2e_s;
    }
    int *ptok = xmalloc(sizeof(int) * (size_t)(poff[n] + 1)), *otok = xmalloc(sizeof(int) * (size_t)(ooff[n] + 1));
    /* inter-token latencies: n_out - 1 per request */
    int64_t *ioff = xmalloc(sizeof(int64_t) * (n + 1));
    ioff[0] = 0;
    for (int i = 0; i < n; i++) ioff[i + 1] = ioff[i] + (res[i].n > 1 ? res[i].n - 1 : 0);
    double *itl = xmalloc(sizeof(double) * (size_t)(ioff[n] + 1));
    for (int i = 0; i < n; i++)
        for (int j = 1; j < res[i].n; j++) itl[ioff[i] + j - 1] = res[i].times[j] - res[i].times[j - 1];
    for (int i = 0; i < n; i++) {
        if (rs->r[i].prompt_tokens)
            memcpy(ptok + poff[i], rs->r[i].prompt_tokens, sizeof(int) * (size_t)(poff[i + 1] - poff[i]));
        if (res[i].n) memcpy(otok + ooff[i], res[i].tokens, sizeof(int) * (size_t)res[i].n);
    }
    int rc = write_strings(g, "id", ids, n) || write_array(g, "line", H5T_NATIVE_INT, line, n) ||
             write_array(g, "choice", H5T_NATIVE_INT, choice, n) ||
             write_array(g, "prompt_offsets", H5T_NATIVE_INT64, poff, n + 1) ||
             write_array(g, "prompt_tokens", H5T_NATIVE_INT, ptok, (size_t)poff[n]) ||
             write_array(g, "num_cached_tokens", H5T_NATIVE_INT, cached, n) ||
             write_array(g, "spec_draft_tokens", H5T_NATIVE_INT, drafted, n) ||
             write_array(g, "spec_accepted_tokens", H5T_NATIVE_INT, accepted, n) ||
             write_array(g, "output_offsets", H5T_NATIVE_INT64, ooff, n + 1) ||
             write_array(g, "output_tokens", H5T_NATIVE_INT, otok, (size_t)ooff[n]) ||
             write_strings(g, "text", (const char *const *)texts, n) ||
             write_strings(g, "finish_reason", fin, n) || write_strings(g, "error", err, n) ||
             write_array(g, "ttft_s", H5T_NATIVE_DOUBLE, ttft, n) ||
             write_array(g, "tpot_s", H5T_NATIVE_DOUBLE, tpot, n) ||
             write_array(g, "e2e_s", H5T_NATIVE_DOUBLE, e2e, n) ||
             write_array(g, "itl_offsets", H5T_NATIVE_INT64, ioff, n + 1) ||
             write_array(g, "itl_s", H5T_NATIVE_DOUBLE, itl, (size_t)ioff[n]);
    rc = rc || write_stops_and_logprobs(g, rs, res, poff, ooff);
    if (parser != REASONING_NONE) rc = rc || write_reasoning(g, rs, texts, parser);
    free(ioff);
    free(itl);
    free(ids);
    free(fin);
    free(err);
    free(line);
    free(choice);
    free(cached);
    free(drafted);
    free(accepted);
    free(poff);
    free(ooff);
    free(ttft);
    free(tpot);
    free(e2e);
    free(ptok);
    free(otok);
    H5Gclose(g);
    return rc ? -1 : 0;
}

static hid_t group(hid_t parent, const char *name)
{
    return H5Gcreate2(parent, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
}

static int write_layout(hid_t f, const RankInfo *ranks, int world)
{
    hid_t g = group(f, "layout");
    if (g < 0) return dcp_fail("HDF5: cannot create /layout");
    int *col = xmalloc(sizeof(int) * (size_t)world);
    const char **hosts = xmalloc(sizeof(char *) * (size_t)world);
    int rc = 0;
#define LAYOUT_FIELD(field)                                                   \
    for (int r = 0; r < world; r++) col[r] = ranks[r].field;                   \
    rc = rc || write_array(g, #field, H5T_NATIVE_INT, col, (size_t)world);
    LAYOUT_FIELD(world_rank)
    LAYOUT_FIELD(dp_rank)
    LAYOUT_FIELD(tp_rank)
    LAYOUT_FIELD(dcp_rank)
    LAYOUT_FIELD(q_head0)
    LAYOUT_FIELD(q_heads)
    LAYOUT_FIELD(kv_head0)
    LAYOUT_FIELD(kv_heads)
    LAYOUT_FIELD(device)
#undef LAYOUT_FIELD
    for (int r = 0; r < world; r++) hosts[r] = ranks[r].host;
    rc = rc || write_strings(g, "host", hosts, (size_t)world);
    free(col);
    free(hosts);
    H5Gclose(g);
    return rc;
}

static int write_comm(hid_t f, const CommStats *stats, const RankReports *rep, int world)
{
    hid_t g = group(f, "comm");
    if (g < 0) return dcp_fail("HDF5: cannot create /comm");
    attr_str(g, "bytes", "bytes each rank sent (comm.h): tp_sum: 4*(count - s + (N-1)*s), s this rank's slice of count; "
                         "q_allgather, merge_exchange, logits_gather: count*4; all_to_all: N*count*4; argmax: rows*8; "
                         "logprob_gather: count*4 + rows*8; moe_dispatch: 4*(N-1)*E/N + 4*dim*rows sent to other "
                         "ranks; moe_combine: 4*dim*rows returned to other ranks + 4*dim*(tp-1)*rows combined here; "
                         "ep_step: 4");
    long long *calls = xmalloc(sizeof(long long) * (size_t)world), *bytes = xmalloc(sizeof(long long) * (size_t)world);
    double *secs = xmalloc(sizeof(double) * (size_t)world);
    int rc = 0;
    for (int p = 0; p < PHASE_N && !rc; p++) {
        hid_t gp = group(g, phase_names[p]);
        for (int k = 0; k < COMM_N && !rc; k++) {
            hid_t gk = group(gp, comm_kind_names[k]);
            for (int r = 0; r < world; r++) {
                calls[r] = stats[r].c[p][k].calls;
                bytes[r] = stats[r].c[p][k].bytes;
                secs[r] = stats[r].c[p][k].seconds;
            }
            rc = write_array(gk, "calls", H5T_NATIVE_LLONG, calls, (size_t)world) ||
                 write_array(gk, "bytes", H5T_NATIVE_LLONG, bytes, (size_t)world) ||
                 write_array(gk, "seconds", H5T_NATIVE_DOUBLE, secs, (size_t)world);
            H5Gclose(gk);
        }
        H5Gclose(gp);
    }
    H5Gclose(g);
    if (!rc) {
        hid_t gm = group(f, "memory");
        rc = write_array(gm, "kv_bytes_peak", H5T_NATIVE_LLONG, rep->kv_peak_bytes, (size_t)world) ||
             write_array(gm, "weight_bytes", H5T_NATIVE_LLONG, rep->weight_bytes, (size_t)world) ||
             write_array(gm, "rss_bytes_peak", H5T_NATIVE_LLONG, rep->rss_peak_bytes, (size_t)world);
        H5Gclose(gm);
    }
    const MoeReport *mo = rep->moe;
    if (!rc && mo && mo->expert_tokens) {
        hid_t gm = group(f, "moe");
        attr_int(gm, "expert_parallel_ranks", mo->ep);
        attr_str(gm, "expert_tokens", "(layers, routed experts): the (token, expert) pairs each expert received in "
                                      "each layer, summed over steps and DP groups; dense layers' rows are 0");
        rc = write_table(gm, "expert_tokens", H5T_NATIVE_LLONG, mo->expert_tokens, (size_t)mo->layers,
                         (size_t)mo->experts) ||
             write_array(gm, "idle_steps", H5T_NATIVE_LLONG, mo->idle_steps, (size_t)world) ||
             write_array(gm, "idle_seconds", H5T_NATIVE_DOUBLE, mo->idle_seconds, (size_t)world);
        H5Gclose(gm);
    }
    free(calls);
    free(bytes);
    free(secs);
    return rc;
}

static int write_steps(hid_t f, const StepReport *sr)
{
    hid_t g = group(f, "steps");
    if (g < 0) return dcp_fail("HDF5: cannot create /steps");
    attr_int(g, "kv_blocks_per_rank", sr->kv_blocks);
    attr_int(g, "block_size", sr->block_size);
    attr_int(g, "kv_capacity_tokens", sr->kv_capacity);
    size_t n = (size_t)sr->n_steps;
    double *d = xmalloc(sizeof(double) * (n + 1));
    int *v = xmalloc(sizeof(int) * (n + 1));
    int rc = write_array(g, "dp_rank", H5T_NATIVE_INT, sr->dp_rank, n);
/* one /steps or /gpu/steps dataset: field of every step, through buf (n
 * elements of the HDF5 type's C type) */
#define STEP_FIELD(grp, buf, type, field)                          \
    for (size_t i = 0; i < n; i++) buf[i] = sr->steps[i].field;    \
    rc = rc || write_array(grp, #field, type, buf, n);
    STEP_FIELD(g, d, H5T_NATIVE_DOUBLE, t_start)
    STEP_FIELD(g, d, H5T_NATIVE_DOUBLE, seconds)
    STEP_FIELD(g, v, H5T_NATIVE_INT, decode_tokens)
    STEP_FIELD(g, v, H5T_NATIVE_INT, prefill_tokens)
    STEP_FIELD(g, v, H5T_NATIVE_INT, cached_tokens)
    STEP_FIELD(g, v, H5T_NATIVE_INT, running)
    STEP_FIELD(g, v, H5T_NATIVE_INT, waiting)
    STEP_FIELD(g, v, H5T_NATIVE_INT, preempted)
    STEP_FIELD(g, v, H5T_NATIVE_INT, kv_blocks_used)
    STEP_FIELD(g, v, H5T_NATIVE_INT, spec_drafted)
    STEP_FIELD(g, v, H5T_NATIVE_INT, spec_accepted)
    H5Gclose(g);
    if (sr->device && !rc) { /* what a device backend did in each step (docs/output.md) */
        hid_t gg = group(f, "gpu"), gs = gg < 0 ? -1 : group(gg, "steps");
        if (gs < 0) rc = dcp_fail("HDF5: cannot create /gpu/steps");
        long long *w = xmalloc(sizeof(long long) * (n + 1));
        STEP_FIELD(gs, w, H5T_NATIVE_LLONG, launches)
        STEP_FIELD(gs, w, H5T_NATIVE_LLONG, host_syncs)
        STEP_FIELD(gs, w, H5T_NATIVE_LLONG, mpi_syncs)
        STEP_FIELD(gs, w, H5T_NATIVE_LLONG, allocations)
        STEP_FIELD(gs, w, H5T_NATIVE_LLONG, d2h_copies)
        STEP_FIELD(gs, w, H5T_NATIVE_LLONG, d2h_bytes)
        if (gs >= 0) {
            attr_str(gs, "ranks", "each step's DP group's first rank (the steps' own order, as /steps)");
            H5Gclose(gs);
        }
        if (gg >= 0) H5Gclose(gg);
        free(w);
    }
#undef STEP_FIELD
    free(d);
    free(v);
    return rc;
}

static int write_timings(hid_t f, const double *timings, int world)
{
    hid_t g = H5Gcreate2(f, "timings", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) return dcp_fail("HDF5: cannot create /timings");
    attr_str(g, "units", "seconds per rank (index = world rank)");
    double *col = xmalloc(sizeof(double) * (size_t)world);
    int rc = 0;
    for (int p = 0; p < TIMING_N && !rc; p++) {
        for (int r = 0; r < world; r++) col[r] = timings[(size_t)r * TIMING_N + p];
        rc = write_array(g, timing_names[p], H5T_NATIVE_DOUBLE, col, (size_t)world);
    }
    free(col);
    H5Gclose(g);
    return rc;
}

int output_check_writable(const char *path)
{
    if (!path[0]) return dcp_fail("--output is empty");
    if (path_is_dir(path)) return dcp_fail("%s: --output names a directory; give a file name, e.g. %s/results.h5", path, path);
    const char *slash = strrchr(path, '/');
    char *dir = slash ? xstrdup(path) : xstrdup(".");
    if (slash) dir[slash - path + (slash == path)] = '\0';
    int ok = path_is_dir(dir) && access(dir, W_OK) == 0;
    int rc = ok ? 0 : dcp_fail("%s: cannot create the output file (folder %s missing or not writable)", path, dir);
    free(dir);
    /* temporaries of this output, its journal and its identity left by a
     * run of this host that stopped while writing them */
    static const char *const kinds[] = {"", ".journal", ".run.json"};
    for (size_t k = 0; !rc && k < sizeof kinds / sizeof *kinds; k++) {
        char *p = xmalloc(strlen(path) + 16);
        sprintf(p, "%s%s", path, kinds[k]);
        durable_remove_stale(p);
        free(p);
    }
    return rc;
}

int output_write(const char *path, const RunInfo *info, const RequestSet *rs, const Result *res,
                 char *const *texts, const RankReports *rep, const StepReport *steps)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* our own one-line messages instead of HDF5's trace */
    /* The file is built in memory (HDF5's core driver, no backing store) and
     * written out by durable_replace, so that every disk error is
     * ours to report and HDF5 never holds a half-written file. */
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_core(fapl, 1 << 20, 0);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    if (f < 0) return dcp_fail("%s: HDF5 cannot create the file in memory", path);
    write_root_attrs(f, info);
    int rc = write_requests(f, rs, res, texts, info->reasoning_parser) || write_layout(f, rep->ranks, info->world_size) ||
             write_timings(f, rep->timings, info->world_size) ||
             write_comm(f, rep->comm, rep, info->world_size) || write_steps(f, steps);
    if (!rc) {
        double secs = steps->generation_s, tps = secs > 0 ? info->run_tokens / secs : 0,
               rps = secs > 0 ? info->run_requests / secs : 0;
        attr_num(f, "generation_s", H5T_NATIVE_DOUBLE, &secs);
        attr_num(f, "output_tokens_per_s", H5T_NATIVE_DOUBLE, &tps);
        attr_num(f, "requests_per_s", H5T_NATIVE_DOUBLE, &rps);
    }
    void *image = NULL;
    ssize_t size = -1;
    if (!rc && H5Fflush(f, H5F_SCOPE_GLOBAL) >= 0 && (size = H5Fget_file_image(f, NULL, 0)) > 0) {
        image = xmalloc((size_t)size);
        if (H5Fget_file_image(f, image, (size_t)size) != size) size = -1;
    }
    H5Fclose(f);
    if (!rc && size <= 0) rc = dcp_fail("%s: HDF5 could not produce the file image", path);
    if (!rc) rc = durable_replace(path, image, (size_t)size);
    free(image);
    return rc ? -1 : 0;
}
