#include "journal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "durable.h"
#include "identity.h"
#include "util.h"

enum { JOURNAL_VERSION = 3 }; /* 3: each record's sum covers its run's identity */

static char *joined(const char *a, const char *b)
{
    char *s = xmalloc(strlen(a) + strlen(b) + 1);
    strcpy(s, a);
    strcat(s, b);
    return s;
}

/* ---- files --------------------------------------------------------------- */

/* The journal files of out: OUT.journal, then OUT.journal.dpG for G = 0, 1,
 * ... as a directory listing finds them (exact names: digits after "dp",
 * nothing else), in a malloc'ed list of paths. */
static char **journal_files(const char *out, int *n_out)
{
    const char *slash = strrchr(out, '/');
    char *dir = slash ? xstrdup(out) : xstrdup(".");
    if (slash) dir[slash - out + (slash == out)] = '\0';
    const char *base = slash ? slash + 1 : out;
    char *prefix = joined(base, ".journal");
    size_t plen = strlen(prefix);
    long *groups = NULL;
    int n = 0, whole = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, prefix, plen)) continue;
        const char *rest = e->d_name + plen;
        if (!*rest) {
            whole = 1;
            continue;
        }
        if (strncmp(rest, ".dp", 3) || !rest[3] || strspn(rest + 3, "0123456789") != strlen(rest + 3) ||
            strlen(rest + 3) > 9)
            continue;
        groups = xrealloc(groups, sizeof(long) * (size_t)(n + 1));
        groups[n++] = atol(rest + 3);
    }
    if (d) closedir(d);
    for (int a = 1; a < n; a++) /* in group order */
        for (int b = a; b > 0 && groups[b - 1] > groups[b]; b--) {
            long t = groups[b];
            groups[b] = groups[b - 1];
            groups[b - 1] = t;
        }
    char **files = xmalloc(sizeof(char *) * (size_t)(n + 1));
    int k = 0;
    if (whole) files[k++] = joined(out, ".journal");
    for (int g = 0; g < n; g++) {
        char suffix[32];
        snprintf(suffix, sizeof suffix, ".journal.dp%ld", groups[g]);
        files[k++] = joined(out, suffix);
    }
    free(groups);
    free(prefix);
    free(dir);
    *n_out = k;
    return files;
}

static void free_list(char **files, int n)
{
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
}

/* The whole of a journal file, which must be a regular file (not a FIFO
 * that would block, a device that never ends, or a link to either). */
static int read_journal_file(const char *path, char **data, size_t *size)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 && errno == ELOOP)
        return dcp_fail("%s: a symbolic link, not a journal file dcpinfer wrote; remove it", path);
    if (fd < 0) return dcp_fail("%s: %s", path, strerror(errno));
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return dcp_fail("%s: not a regular file (a %s), so not a journal dcpinfer wrote; remove it", path,
                        S_ISFIFO(st.st_mode) ? "FIFO" : S_ISDIR(st.st_mode) ? "directory" : "device or socket");
    }
    size_t cap = (size_t)st.st_size + 1, len = 0;
    char *buf = xmalloc(cap + 1);
    for (;;) {
        if (len == cap) buf = xrealloc(buf, (cap *= 2) + 1);
        ssize_t got = read(fd, buf + len, cap - len);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            int err = errno;
            free(buf);
            close(fd);
            return dcp_fail("%s: %s", path, strerror(err));
        }
        if (got == 0) break;
        len += (size_t)got;
    }
    close(fd);
    buf[len] = '\0';
    *data = buf;
    *size = len;
    return 0;
}

/* ---- records ------------------------------------------------------------- */

/* A record line is {"sum":"<16 hex>",<the record's other fields>}: the sum
 * is the FNV-1a hash of the run's identity (identity_json) followed by the
 * line from the brace that follows "sum"'s value to the end, taken as "{"
 * + those bytes. A record is proof of its own run only: one copied from a
 * journal of other inputs or options fails its sum under this run's
 * identity, and its request runs again. */
#define SUM_PREFIX "{\"sum\":\""
enum { SUM_PREFIX_LEN = sizeof SUM_PREFIX - 1, SUM_HEX = 16 };

/* the hash a run's record sums start from */
static uint64_t identity_sum(const RunIdentity *id)
{
    char *ij = identity_json(id);
    uint64_t h = fnv1a(FNV_START, ij, strlen(ij));
    free(ij);
    return h;
}

static uint64_t record_sum(uint64_t id_sum, const char *body, size_t n)
{
    return fnv1a(fnv1a(id_sum, "{", 1), body, n);
}

/* The line of a record object of the run whose identity_sum is id_sum: its
 * sum, then its fields; malloc'ed, with the newline. */
static char *record_line(uint64_t id_sum, json_t *o, size_t *len)
{
    char *body = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER); /* "{...}" */
    size_t n = strlen(body) - 1;                                   /* after the "{" */
    char *line = xmalloc(SUM_PREFIX_LEN + SUM_HEX + 2 + n + 2);
    int k = snprintf(line, SUM_PREFIX_LEN + SUM_HEX + 3, SUM_PREFIX "%016llx\",",
                     (unsigned long long)record_sum(id_sum, body + 1, n));
    memcpy(line + k, body + 1, n);
    line[k + n] = '\n';
    line[k + n + 1] = '\0';
    *len = (size_t)k + n + 1;
    free(body);
    return line;
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

static json_t *record_object(int i, const Request *q, const Result *r)
{
    json_t *o = json_object(), *times = json_array();
    for (int k = 0; k < r->n; k++) json_array_append_new(times, json_real(r->times[k]));
    json_object_set_new(o, "i", json_integer(i));
    json_object_set_new(o, "line", json_integer(q->line));
    json_object_set_new(o, "id", json_string(q->id));
    json_object_set_new(o, "finish", json_string(r->finish_reason));
    json_object_set_new(o, "ttft", json_real(r->ttft_s));
    json_object_set_new(o, "tpot", json_real(r->tpot_s));
    json_object_set_new(o, "e2e", json_real(r->e2e_s));
    json_object_set_new(o, "cached", json_integer(r->num_cached_tokens));
    if (r->spec_draft_tokens) {
        json_object_set_new(o, "spec_draft", json_integer(r->spec_draft_tokens));
        json_object_set_new(o, "spec_accepted", json_integer(r->spec_accepted_tokens));
    }
    json_object_set_new(o, "tokens", json_ints(r->tokens, (size_t)r->n));
    json_object_set_new(o, "times", times);
    if (r->stop_token >= 0) json_object_set_new(o, "stop_token", json_integer(r->stop_token));
    if (r->stop_str) json_object_set_new(o, "stop_str", json_string(r->stop_str));
    if (r->text) json_object_set_new(o, "text", json_stringn(r->text, r->text_len));
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
    return o;
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

/* 0 when a is an array of n numbers (or nulls, with nulls), each an
 * integer in [lo, hi) when ints; else the reason */
static const char *check_array(json_t *a, size_t n, int ints, long lo, long hi, int nulls)
{
    if (!json_is_array(a)) return "a field that must be an array is missing or not one";
    if (json_array_size(a) != n) return "an array of the wrong length for its request";
    size_t k;
    json_t *e;
    json_array_foreach(a, k, e)
    {
        if (nulls && json_is_null(e)) continue;
        if (ints && (!json_is_integer(e) || json_integer_value(e) < lo || json_integer_value(e) >= hi))
            return "a token id outside the vocabulary";
        if (!ints && (!json_is_number(e) || !isfinite(json_number_value(e)))) return "a number that is not finite";
    }
    return NULL;
}

static int is_stop_id(const Config *c, const Request *q, int tok)
{
    for (int i = 0; i < c->n_eos && !q->ignore_eos; i++)
        if (tok == c->eos_ids[i]) return 1;
    for (int i = 0; i < q->n_stop; i++)
        if (tok == q->stop_ids[i]) return 1;
    return 0;
}

/* Whether record o fits its request; NULL when it does, else why not. */
static const char *check_record(json_t *o, const RequestSet *rs, const JournalCheck *chk, int *index)
{
    json_t *ji = json_object_get(o, "i"), *toks = json_object_get(o, "tokens");
    if (!json_is_integer(ji) || json_integer_value(ji) < 0 || json_integer_value(ji) >= rs->n)
        return "no request of the prompt file has its index";
    int i = *index = (int)json_integer_value(ji);
    const Request *q = &rs->r[i];
    const char *id = json_string_value(json_object_get(o, "id")), *fin = json_string_value(json_object_get(o, "finish"));
    json_t *line = json_object_get(o, "line");
    if (!id || strcmp(id, q->id) || !json_is_integer(line) || json_integer_value(line) != q->line)
        return "its id or line is not its request's";
    if (q->error) return "its request failed in this run's checks";
    if (!json_is_array(toks)) return "no tokens";
    size_t n = json_array_size(toks);
    long room = (long)chk->max_model_len - q->n_prompt;
    if (n < 1 || (long)n > q->max_tokens || (long)n > room) return "more tokens than its request may have";
    const char *bad = check_array(toks, n, 1, 0, chk->cfg->vocab_size, 0);
    if (!bad) bad = check_array(json_object_get(o, "times"), n, 0, 0, 0, 0);
    if (bad) return bad;
    int last = (int)json_integer_value(json_array_get(toks, n - 1));
    json_t *st = json_object_get(o, "stop_token"), *ss = json_object_get(o, "stop_str");
    if (!fin || (strcmp(fin, "stop") && strcmp(fin, "length"))) return "its finish reason is neither stop nor length";
    if (!strcmp(fin, "length") && (long)n != q->max_tokens && (long)n != room)
        return "finished by length before its limit";
    if (st && (!json_is_integer(st) || json_integer_value(st) != last || !is_stop_id(chk->cfg, q, last)))
        return "its stop token is not its last token, or not a stop token of its request";
    if (ss) {
        int known = 0;
        for (int k = 0; k < q->n_stop_str && json_is_string(ss); k++) known |= !strcmp(q->stop[k], json_string_value(ss));
        if (!known) return "its stop string is not one of its request's";
    }
    if (!strcmp(fin, "stop") && !st && !ss) return "finished by stop with neither a stop token nor a stop string";
    if (!json_is_string(json_object_get(o, "text")) != !chk->has_text) return "a text where the run makes none, or none where it does";
    /* the prompt positions taken from the prefix cache: absent in a journal
     * from before prefix caching; else whole positions short of the prompt */
    json_t *cached = json_object_get(o, "cached");
    if (cached && (!json_is_integer(cached) || json_integer_value(cached) < 0 ||
                   json_integer_value(cached) >= (q->n_prompt > 0 ? q->n_prompt : 1)))
        return "a cached token count that is not a whole number below its prompt's length";
    static const char *lat[] = {"ttft", "tpot", "e2e"};
    for (int k = 0; k < 3; k++) {
        json_t *v = json_object_get(o, lat[k]);
        if (!json_is_number(v) || !(json_number_value(v) >= 0)) return "a latency that is missing or negative";
    }
    /* log-probabilities exactly where the request asked for them */
    const char *names[2][3] = {{"lp", "top_lp", "top_id"}, {"plp", "ptop_lp", "ptop_id"}};
    int k_of[2] = {q->logprobs, q->prompt_logprobs};
    size_t len[2] = {n, (size_t)q->n_prompt};
    for (int kind = 0; kind < 2; kind++) {
        int asked = k_of[kind] >= 0;
        for (int f = 0; f < 3; f++)
            if (!json_object_get(o, names[kind][f]) != !asked) return "log-probabilities its request did not ask for, or lacks";
        if (!asked) continue;
        size_t k = (size_t)k_of[kind];
        if ((bad = check_array(json_object_get(o, names[kind][0]), len[kind], 0, 0, 0, 1)) ||
            (bad = check_array(json_object_get(o, names[kind][1]), len[kind] * k, 0, 0, 0, 1)) ||
            (bad = check_array(json_object_get(o, names[kind][2]), len[kind] * k, 1, -1, chk->cfg->vocab_size, 0)))
            return bad;
    }
    return NULL;
}

/* The result of a checked record. */
static void parse_record(json_t *o, const Request *q, Result *r)
{
    json_t *toks = json_object_get(o, "tokens"), *times = json_object_get(o, "times"), *v;
    memset(r, 0, sizeof *r);
    r->n = r->cap = (int)json_array_size(toks);
    r->tokens = ints_of(toks, (size_t)r->n);
    r->times = xmalloc(sizeof(double) * (size_t)(r->n + 1));
    for (int k = 0; k < r->n; k++) r->times[k] = json_number_value(json_array_get(times, k));
    r->finish_reason = !strcmp(json_string_value(json_object_get(o, "finish")), "stop") ? "stop" : "length";
    r->stop_token = (v = json_object_get(o, "stop_token")) ? (int)json_integer_value(v) : -1;
    if ((v = json_object_get(o, "stop_str"))) r->stop_str = xstrdup(json_string_value(v));
    if ((v = json_object_get(o, "text"))) {
        r->text_len = r->text_cap = json_string_length(v);
        r->text = xmalloc(r->text_len + 1);
        memcpy(r->text, json_string_value(v), r->text_len + 1);
    }
    if (q->logprobs >= 0) {
        size_t k = (size_t)q->logprobs;
        r->lp = floats_of(json_object_get(o, "lp"), (size_t)r->n);
        r->top_lp = floats_of(json_object_get(o, "top_lp"), (size_t)r->n * k);
        r->top_id = ints_of(json_object_get(o, "top_id"), (size_t)r->n * k);
    }
    if (q->prompt_logprobs >= 0) {
        size_t k = (size_t)q->prompt_logprobs;
        r->plp = floats_of(json_object_get(o, "plp"), (size_t)q->n_prompt);
        r->ptop_lp = floats_of(json_object_get(o, "ptop_lp"), (size_t)q->n_prompt * k);
        r->ptop_id = ints_of(json_object_get(o, "ptop_id"), (size_t)q->n_prompt * k);
    }
    r->ttft_s = json_number_value(json_object_get(o, "ttft"));
    r->tpot_s = json_number_value(json_object_get(o, "tpot"));
    r->e2e_s = json_number_value(json_object_get(o, "e2e"));
    r->num_cached_tokens = (int)json_integer_value(json_object_get(o, "cached"));
    r->spec_draft_tokens = (int)json_integer_value(json_object_get(o, "spec_draft"));
    r->spec_accepted_tokens = (int)json_integer_value(json_object_get(o, "spec_accepted"));
}

static int same_tokens(const Result *a, const Result *b)
{
    return a->n == b->n && !memcmp(a->tokens, b->tokens, sizeof(int) * (size_t)a->n) &&
           !a->text == !b->text && (!a->text || !strcmp(a->text, b->text));
}

/* ---- loading ------------------------------------------------------------- */

/* The header line: the journal's version and its run's identity. */
static char *header_line(const RunIdentity *id)
{
    char *ij = identity_json(id), *line = xmalloc(strlen(ij) + 64);
    sprintf(line, "{\"dcpinfer_journal\":%d,\"identity\":%s}\n", JOURNAL_VERSION, ij);
    free(ij);
    return line;
}

static int check_header(const char *path, const char *line, size_t n, const RunIdentity *id)
{
    json_t *h = json_loadb(line, n, 0, NULL), *ver = json_object_get(h, "dcpinfer_journal");
    int rc;
    if (!json_is_object(h) || !json_is_integer(ver)) {
        rc = dcp_fail("--resume: %s: not a dcpinfer journal (its first line is no journal header); remove it", path);
    } else if (json_integer_value(ver) != JOURNAL_VERSION) {
        rc = dcp_fail("--resume: %s was written by another version of dcpinfer (journal version %lld); rerun "
                      "without --resume to start afresh (which removes it)",
                      path, (long long)json_integer_value(ver));
    } else {
        char *stored = json_dumps(json_object_get(h, "identity"), JSON_COMPACT);
        rc = identity_check(id, stored, path);
        free(stored);
    }
    json_decref(h);
    return rc;
}

/* One record line (without its newline) of file path, line number ln:
 * taken into res/done, or dropped with the reason counted in st. */
static void load_record(const char *path, int ln, const char *line, size_t n, uint64_t id_sum, const RequestSet *rs,
                        const JournalCheck *chk, Result *res, char *done, char *conflict, JournalLoad *st)
{
    const char *why = NULL;
    json_t *o = NULL;
    int i = -1;
    char hex[SUM_HEX + 1];
    if (n < SUM_PREFIX_LEN + SUM_HEX + 3 || memcmp(line, SUM_PREFIX, SUM_PREFIX_LEN) ||
        line[SUM_PREFIX_LEN + SUM_HEX] != '"' || line[SUM_PREFIX_LEN + SUM_HEX + 1] != ',') {
        why = "no checksum";
    } else {
        memcpy(hex, line + SUM_PREFIX_LEN, SUM_HEX);
        hex[SUM_HEX] = '\0';
        const char *body = line + SUM_PREFIX_LEN + SUM_HEX + 2;
        char want[SUM_HEX + 1];
        snprintf(want, sizeof want, "%016llx", (unsigned long long)record_sum(id_sum, body, n - (size_t)(body - line)));
        if (strcmp(hex, want))
            why = "its checksum does not hold (the line was changed or cut, or written by a run of other inputs or "
                  "options)";
        else if (!(o = json_loadb(line, n, 0, NULL)) || !json_is_object(o)) why = "not a JSON object";
        else why = check_record(o, rs, chk, &i);
    }
    if (!why && conflict[i]) why = "another record of its request differs from it";
    if (!why) {
        Result r;
        parse_record(o, &rs->r[i], &r);
        if (!done[i]) {
            res[i] = r;
            done[i] = 1;
        } else if (same_tokens(&res[i], &r)) {
            st->duplicates++;
            results_free(&r, 1);
        } else { /* two different records of one request: neither is trusted */
            results_free(&res[i], 1);
            memset(&res[i], 0, sizeof res[i]);
            results_free(&r, 1);
            done[i] = 0;
            conflict[i] = 1;
            why = "another record of its request differs from it";
        }
    }
    if (why && !st->dropped++)
        snprintf(st->first_drop, sizeof st->first_drop, "%s:%d: %s", path, ln, why);
    json_decref(o);
}

int journal_load(const char *out, const RunIdentity *id, const RequestSet *rs, const JournalCheck *chk, Result *res,
                 char *done, JournalLoad *st)
{
    memset(st, 0, sizeof *st);
    int n_files, rc = 0;
    char **files = journal_files(out, &n_files);
    char **data = xcalloc((size_t)n_files + 1, sizeof(char *));
    size_t *size = xcalloc((size_t)n_files + 1, sizeof(size_t));
    /* every file's kind and header first: a refusal changes nothing */
    for (int k = 0; k < n_files && !rc; k++) {
        rc = read_journal_file(files[k], &data[k], &size[k]);
        char *nl = rc ? NULL : memchr(data[k], '\n', size[k]);
        /* a file cut before its header's end holds no record */
        if (nl) rc = check_header(files[k], data[k], (size_t)(nl - data[k]), id);
    }
    char *conflict = xcalloc((size_t)rs->n + 1, 1);
    uint64_t id_sum = identity_sum(id);
    for (int k = 0; k < n_files && !rc; k++) {
        char *nl = memchr(data[k], '\n', size[k]);
        size_t at = nl ? (size_t)(nl - data[k]) + 1 : size[k];
        for (int ln = 2; at < size[k]; ln++) {
            char *nl = memchr(data[k] + at, '\n', size[k] - at);
            if (!nl) break; /* the last line was cut short by a kill: never written whole */
            load_record(files[k], ln, data[k] + at, (size_t)(nl - data[k] - at), id_sum, rs, chk, res, done, conflict,
                        st);
            at = (size_t)(nl - data[k]) + 1;
        }
    }
    for (int i = 0; i < rs->n; i++) st->taken += done[i];
    st->files = n_files;
    for (int k = 0; k < n_files; k++) free(data[k]);
    free(data);
    free(size);
    free(conflict);
    free_list(files, n_files);
    return rc;
}

/* ---- writing ------------------------------------------------------------- */

/* Writes all n bytes; 0 or -1 with errno. */
static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int journal_consolidate(const char *out, const RunIdentity *id, const RequestSet *rs, const Result *res,
                        const char *done)
{
    char *path = joined(out, ".journal"), *tmp = durable_temp_name(path), *header = header_line(id);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), rc = 0;
    if (fd < 0 || write_all(fd, header, strlen(header)))
        rc = dcp_fail("%s: cannot write the journal: %s", tmp, strerror(errno));
    uint64_t id_sum = identity_sum(id);
    for (int i = 0; i < rs->n && !rc; i++) {
        if (!done[i]) continue;
        json_t *o = record_object(i, &rs->r[i], &res[i]);
        size_t len;
        char *line = record_line(id_sum, o, &len);
        json_decref(o);
        if (write_all(fd, line, len)) rc = dcp_fail("%s: writing the journal: %s", tmp, strerror(errno));
        free(line);
    }
    if (!rc && fsync(fd)) rc = dcp_fail("%s: writing the journal: %s", tmp, strerror(errno));
    if (fd >= 0) close(fd);
    if (!rc) crash_point("written", path);
    /* in place first, then the per-group files go: a crash in between
     * leaves duplicates, which loading takes once */
    if (!rc) rc = durable_rename(tmp, path);
    if (!rc) {
        int n;
        char **files = journal_files(out, &n);
        for (int k = 0; k < n; k++)
            if (strcmp(files[k], path) && unlink(files[k]) == 0) crash_point("removed", files[k]);
        free_list(files, n);
        rc = durable_sync_dir(path);
    } else {
        unlink(tmp);
    }
    free(header);
    free(path);
    free(tmp);
    return rc;
}

/* Syncs what was written, every interval seconds while there is any. */
static void *syncer(void *arg)
{
    Journal *j = arg;
    pthread_mutex_lock(&j->lock);
    while (!j->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        double at = until.tv_sec + until.tv_nsec * 1e-9 + j->interval;
        until.tv_sec = (time_t)at;
        until.tv_nsec = (long)((at - (double)until.tv_sec) * 1e9);
        pthread_cond_timedwait(&j->wake, &j->lock, &until);
        if (j->dirty) {
            j->dirty = 0;
            pthread_mutex_unlock(&j->lock);
            fdatasync(j->fd);
            pthread_mutex_lock(&j->lock);
            j->syncs++;
        }
    }
    pthread_mutex_unlock(&j->lock);
    return NULL;
}

int journal_open(Journal *j, const char *out, int dp_group, const RunIdentity *id, double interval)
{
    memset(j, 0, sizeof *j);
    j->fd = -1;
    char suffix[32];
    snprintf(suffix, sizeof suffix, ".journal.dp%d", dp_group);
    j->path = joined(out, suffix);
    j->fd = open(j->path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
    char *header = header_line(id);
    int rc = 0;
    if (j->fd < 0 || write_all(j->fd, header, strlen(header)) || fdatasync(j->fd))
        rc = dcp_fail("%s: cannot write the journal: %s", j->path, strerror(errno));
    free(header);
    if (rc) {
        if (j->fd >= 0) close(j->fd);
        j->fd = -1;
        return rc;
    }
    j->interval = interval;
    j->id_sum = identity_sum(id);
    pthread_mutex_init(&j->lock, NULL);
    pthread_cond_init(&j->wake, NULL);
    pthread_create(&j->syncer, NULL, syncer, j);
    return 0;
}

void journal_append(Journal *j, int i, const Request *q, const Result *r)
{
    if (j->fd < 0) return;
    json_t *o = record_object(i, q, r);
    size_t len;
    char *line = record_line(j->id_sum, o, &len);
    json_decref(o);
    /* one write of the whole line (O_APPEND): a kill never leaves half a
     * record behind another */
    if (write_all(j->fd, line, len) == 0) {
        pthread_mutex_lock(&j->lock);
        j->dirty = 1;
        pthread_mutex_unlock(&j->lock);
        crash_point("appended", j->path);
    }
    free(line);
}

void journal_close(Journal *j)
{
    if (j->fd >= 0) {
        pthread_mutex_lock(&j->lock);
        j->stop = 1;
        pthread_cond_signal(&j->wake);
        pthread_mutex_unlock(&j->lock);
        pthread_join(j->syncer, NULL);
        fdatasync(j->fd);
        close(j->fd);
        pthread_mutex_destroy(&j->lock);
        pthread_cond_destroy(&j->wake);
    }
    free(j->path);
    memset(j, 0, sizeof *j);
    j->fd = -1;
}

int journal_remove(const char *out)
{
    int n;
    char **files = journal_files(out, &n);
    for (int k = 0; k < n; k++)
        if (unlink(files[k]) == 0) crash_point("removed", files[k]);
    if (n) durable_sync_dir(out);
    free_list(files, n);
    return n;
}

/* ---- the output's lock ----------------------------------------------------- */

int output_lock(OutputLock *l, const char *out)
{
    l->fd = -1;
    l->path = joined(out, ".lock");
    for (int tries = 0; tries < 100; tries++) {
        int fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0) return dcp_fail("%s: cannot create the output's lock file: %s", l->path, strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB)) {
            int err = errno;
            char holder[128] = "";
            ssize_t got = pread(fd, holder, sizeof holder - 1, 0);
            holder[got > 0 ? got : 0] = '\0';
            holder[strcspn(holder, "\n")] = '\0';
            close(fd);
            if (err == EWOULDBLOCK)
                return dcp_fail("%s: another dcpinfer job is writing this output (%s); wait for it to end, or give "
                                "another --output",
                                out, holder[0] ? holder : "its lock file names no holder");
            fprintf(stderr, "dcpinfer: %s: the file system gives no locks (%s): nothing stops a second job from "
                            "writing the same output\n", l->path, strerror(err));
            free(l->path);
            l->path = NULL;
            return 0;
        }
        /* the lock holds only if the name still points at the file locked
         * (a job ending in between removes it) */
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(l->path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            char host[64] = "", text[160];
            gethostname(host, sizeof host - 1);
            int n = snprintf(text, sizeof text, "host %s, pid %ld\n", host, (long)getpid());
            if (ftruncate(fd, 0) == 0 && pwrite(fd, text, (size_t)n, 0) != n) { /* the holder's name is a courtesy */
            }
            l->fd = fd;
            return 0;
        }
        close(fd);
    }
    return dcp_fail("%s: cannot take the output's lock (it keeps being replaced)", l->path);
}

void output_unlock(OutputLock *l)
{
    if (l->fd >= 0) {
        unlink(l->path);
        close(l->fd);
    }
    free(l->path);
    l->path = NULL;
    l->fd = -1;
}
