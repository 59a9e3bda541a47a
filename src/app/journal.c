#include "journal.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

void fingerprint_hex(uint64_t h, char out[17]) { snprintf(out, 17, "%016llx", (unsigned long long)h); }

void fingerprint_line(const Fingerprint *fp, char *buf, size_t n)
{
    snprintf(buf, n, "model %s, prompts %s, sampling %s", fp->model, fp->prompts, fp->sampling);
}

static char *joined(const char *a, const char *b)
{
    char *s = xmalloc(strlen(a) + strlen(b) + 1);
    strcpy(s, a);
    strcat(s, b);
    return s;
}

static void write_header(FILE *f, const Fingerprint *fp)
{
    fprintf(f, "{\"dcpinfer_journal\": 1, \"model\": \"%s\", \"prompts\": \"%s\", \"sampling\": \"%s\"}\n",
            fp->model, fp->prompts, fp->sampling);
}

/* The journal files of out: OUT.journal and OUT.journal.dp*, in a
 * malloc'ed list of paths. */
static char **journal_files(const char *out, int *n_out)
{
    const char *slash = strrchr(out, '/');
    char *dir = slash ? xstrdup(out) : xstrdup(".");
    if (slash) dir[slash - out + (slash == out)] = '\0';
    const char *base = slash ? slash + 1 : out;
    char *prefix = joined(base, ".journal");
    size_t plen = strlen(prefix);
    char **files = NULL;
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, prefix, plen) || (e->d_name[plen] && strncmp(e->d_name + plen, ".dp", 3))) continue;
        files = xrealloc(files, sizeof(char *) * (size_t)(n + 1));
        files[n] = xmalloc(strlen(dir) + strlen(e->d_name) + 2);
        if (slash) sprintf(files[n++], "%s/%s", dir, e->d_name);
        else strcpy(files[n++], e->d_name);
    }
    if (d) closedir(d);
    free(prefix);
    free(dir);
    *n_out = n;
    return files;
}

static void free_list(char **files, int n)
{
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
}

static int check_header(const char *path, json_t *h, const Fingerprint *fp)
{
    static const char *names[3] = {"model", "prompts", "sampling"};
    const char *want[3] = {fp->model, fp->prompts, fp->sampling};
    static const char *what[3] = {"a different model", "a different prompt file",
                                  "different sampling options (--max-tokens, --temperature, --top-p, --seed, "
                                  "--max-model-len or the tokenizer)"};
    if (!json_is_object(h) || !json_integer_value(json_object_get(h, "dcpinfer_journal")))
        return dcp_fail("%s: not a dcpinfer journal (its first line is no journal header)", path);
    for (int k = 0; k < 3; k++) {
        const char *got = json_string_value(json_object_get(h, names[k]));
        if (!got || strcmp(got, want[k]))
            return dcp_fail("--resume: %s was written for %s; run without --resume to start afresh (this removes "
                            "it), or give the inputs of the run it belongs to",
                            path, what[k]);
    }
    return 0;
}

/* n numbers of a JSON array (null: NaN), malloc'ed */
static float *floats_of(json_t *a, size_t n)
{
    float *v = xmalloc(sizeof(float) * (n + 1));
    for (size_t k = 0; k < n; k++) {
        json_t *e = json_array_get(a, k);
        v[k] = json_is_number(e) ? (float)json_number_value(e) : NAN;
    }
    return v;
}

static int *ints_of(json_t *a, size_t n)
{
    int *v = xmalloc(sizeof(int) * (n + 1));
    for (size_t k = 0; k < n; k++) v[k] = (int)json_integer_value(json_array_get(a, k));
    return v;
}

static json_t *json_floats(const float *v, size_t n)
{
    json_t *a = json_array();
    for (size_t k = 0; k < n; k++) json_array_append_new(a, isfinite(v[k]) ? json_real(v[k]) : json_null());
    return a;
}

static json_t *json_ints(const int *v, size_t n)
{
    json_t *a = json_array();
    for (size_t k = 0; k < n; k++) json_array_append_new(a, json_integer(v[k]));
    return a;
}

/* One finished request from its line; 0 when the line is not whole. */
static int parse_entry(json_t *o, const RequestSet *rs, Result *res, char *done)
{
    json_t *ji = json_object_get(o, "i"), *toks = json_object_get(o, "tokens"), *times = json_object_get(o, "times");
    const char *id = json_string_value(json_object_get(o, "id"));
    const char *fin = json_string_value(json_object_get(o, "finish"));
    if (!json_is_integer(ji) || !json_is_array(toks) || !json_is_array(times) || !id || !fin) return 0;
    json_int_t i = json_integer_value(ji);
    if (i < 0 || i >= rs->n || strcmp(rs->r[i].id, id) || json_array_size(toks) != json_array_size(times)) return 0;
    Result *r = &res[i];
    results_free(r, 1);
    memset(r, 0, sizeof *r);
    r->n = r->cap = (int)json_array_size(toks);
    r->tokens = xmalloc(sizeof(int) * (size_t)(r->n + 1));
    r->times = xmalloc(sizeof(double) * (size_t)(r->n + 1));
    for (int k = 0; k < r->n; k++) {
        r->tokens[k] = (int)json_integer_value(json_array_get(toks, k));
        r->times[k] = json_number_value(json_array_get(times, k));
    }
    r->finish_reason = !strcmp(fin, "stop") ? "stop" : "length";
    r->stop_token = -1;
    json_t *v;
    if ((v = json_object_get(o, "stop_token"))) r->stop_token = (int)json_integer_value(v);
    if ((v = json_object_get(o, "stop_str"))) r->stop_str = xstrdup(json_string_value(v));
    if ((v = json_object_get(o, "text"))) {
        r->text = xstrdup(json_string_value(v));
        r->text_len = r->text_cap = strlen(r->text);
    }
    const Request *q = &rs->r[i];
    if (json_object_get(o, "lp")) {
        int k = q->logprobs;
        r->lp = floats_of(json_object_get(o, "lp"), (size_t)r->n);
        r->top_lp = floats_of(json_object_get(o, "top_lp"), (size_t)r->n * k);
        r->top_id = ints_of(json_object_get(o, "top_id"), (size_t)r->n * k);
    }
    if (json_object_get(o, "plp")) {
        int k = q->prompt_logprobs;
        r->plp = floats_of(json_object_get(o, "plp"), (size_t)q->n_prompt);
        r->ptop_lp = floats_of(json_object_get(o, "ptop_lp"), (size_t)q->n_prompt * k);
        r->ptop_id = ints_of(json_object_get(o, "ptop_id"), (size_t)q->n_prompt * k);
    }
    r->ttft_s = json_number_value(json_object_get(o, "ttft"));
    r->tpot_s = json_number_value(json_object_get(o, "tpot"));
    r->e2e_s = json_number_value(json_object_get(o, "e2e"));
    int fresh = !done[i];
    done[i] = 1;
    return fresh;
}

int journal_load(const char *out, const Fingerprint *fp, const RequestSet *rs, Result *res, char *done)
{
    int n_files, found = 0, rc = 0;
    char **files = journal_files(out, &n_files);
    for (int k = 0; k < n_files && !rc; k++) {
        char *data;
        size_t size;
        if (read_file(files[k], &data, &size)) {
            rc = -1;
            break;
        }
        size_t at = 0;
        for (int line = 0; at < size; line++) {
            char *nl = memchr(data + at, '\n', size - at);
            if (!nl) break; /* the last line was cut short */
            json_t *o = json_loadb(data + at, (size_t)(nl - data - at), 0, NULL);
            if (line == 0) rc = check_header(files[k], o, fp);
            else if (o) found += parse_entry(o, rs, res, done);
            json_decref(o);
            at = (size_t)(nl - data) + 1;
            if (rc) break;
        }
        free(data);
    }
    free_list(files, n_files);
    return rc ? -1 : found;
}

void journal_append(Journal *j, int i, const Request *q, const Result *r)
{
    if (!j->f) return;
    json_t *o = json_object(), *toks = json_array(), *times = json_array();
    for (int k = 0; k < r->n; k++) {
        json_array_append_new(toks, json_integer(r->tokens[k]));
        json_array_append_new(times, json_real(r->times[k]));
    }
    json_object_set_new(o, "i", json_integer(i));
    json_object_set_new(o, "id", json_string(q->id));
    json_object_set_new(o, "finish", json_string(r->finish_reason));
    json_object_set_new(o, "ttft", json_real(r->ttft_s));
    json_object_set_new(o, "tpot", json_real(r->tpot_s));
    json_object_set_new(o, "e2e", json_real(r->e2e_s));
    json_object_set_new(o, "tokens", toks);
    json_object_set_new(o, "times", times);
    if (r->stop_token >= 0) json_object_set_new(o, "stop_token", json_integer(r->stop_token));
    if (r->stop_str) json_object_set_new(o, "stop_str", json_string(r->stop_str));
    if (r->text) json_object_set_new(o, "text", json_string(r->text));
    if (r->lp) {
        size_t k = (size_t)q->logprobs;
        json_object_set_new(o, "lp", json_floats(r->lp, (size_t)r->n));
        json_object_set_new(o, "top_lp", json_floats(r->top_lp, (size_t)r->n * k));
        json_object_set_new(o, "top_id", json_ints(r->top_id, (size_t)r->n * k));
    }
    if (r->plp) {
        size_t k = (size_t)q->prompt_logprobs;
        json_object_set_new(o, "plp", json_floats(r->plp, (size_t)q->n_prompt));
        json_object_set_new(o, "ptop_lp", json_floats(r->ptop_lp, (size_t)q->n_prompt * k));
        json_object_set_new(o, "ptop_id", json_ints(r->ptop_id, (size_t)q->n_prompt * k));
    }
    json_dumpf(o, j->f, JSON_COMPACT);
    json_decref(o);
    fputc('\n', j->f);
    /* in the kernel now (a killed process loses nothing); on the disk at
     * most 10 s later (a lost node loses at most that) */
    fflush(j->f);
    if (now_s() - j->last_sync >= 10.0) {
        fsync(fileno(j->f));
        j->last_sync = now_s();
    }
}

int journal_open(Journal *j, const char *out, int dp_group, const Fingerprint *fp)
{
    memset(j, 0, sizeof *j);
    char suffix[32];
    snprintf(suffix, sizeof suffix, ".journal.dp%d", dp_group);
    j->path = joined(out, suffix);
    j->f = fopen(j->path, "w");
    if (!j->f) return dcp_fail("%s: cannot write the journal: %s", j->path, strerror(errno));
    write_header(j->f, fp);
    fflush(j->f);
    j->last_sync = now_s();
    return 0;
}

void journal_close(Journal *j)
{
    if (j->f) fclose(j->f);
    free(j->path);
    memset(j, 0, sizeof *j);
}

int journal_consolidate(const char *out, const Fingerprint *fp, const RequestSet *rs, const Result *res,
                        const char *done)
{
    char *path = joined(out, ".journal"), *tmp = joined(out, ".journal.tmp");
    Journal j = {.f = fopen(tmp, "w"), .last_sync = now_s()};
    int rc = 0;
    if (!j.f) {
        rc = dcp_fail("%s: cannot write the journal: %s", tmp, strerror(errno));
    } else {
        write_header(j.f, fp);
        for (int i = 0; i < rs->n; i++)
            if (done[i]) journal_append(&j, i, &rs->r[i], &res[i]);
        if (fflush(j.f) || fsync(fileno(j.f))) rc = dcp_fail("%s: writing the journal: %s", tmp, strerror(errno));
        fclose(j.f);
    }
    if (!rc) {
        int n;
        char **files = journal_files(out, &n);
        for (int k = 0; k < n; k++)
            if (strcmp(files[k], path)) unlink(files[k]);
        free_list(files, n);
        if (rename(tmp, path)) rc = dcp_fail("%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
    }
    if (rc) unlink(tmp);
    free(path);
    free(tmp);
    return rc;
}

int journal_remove(const char *out)
{
    int n;
    char **files = journal_files(out, &n);
    for (int k = 0; k < n; k++) unlink(files[k]);
    free_list(files, n);
    return n;
}
