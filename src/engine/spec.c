#include "spec.h"

#include <jansson.h>
#include <string.h>

#include "util.h"

/* an integer field of the config: absent leaves *v; 0 or -1 */
static int spec_int(json_t *o, const char *key, int lo, int hi, int *v)
{
    json_t *f = json_object_get(o, key);
    if (!f) return 0;
    if (!json_is_integer(f) || json_integer_value(f) < lo || json_integer_value(f) > hi) {
        char *s = json_dumps(f, JSON_ENCODE_ANY | JSON_COMPACT);
        int rc = dcp_fail("--speculative-config: %s %s: give an integer from %d to %d", key, s ? s : "?", lo, hi);
        free(s);
        return rc;
    }
    *v = (int)json_integer_value(f);
    return 0;
}

int spec_parse(const char *text, SpecConfig *out)
{
    memset(out, 0, sizeof *out);
    json_error_t err;
    json_t *o = json_loads(text, 0, &err);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        return dcp_fail("--speculative-config '%s': not a JSON object (%s)", text, o ? "another JSON value" : err.text);
    }
    int rc = 0;
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        if (strcmp(key, "method") && strcmp(key, "num_speculative_tokens") && strcmp(key, "prompt_lookup_min") &&
            strcmp(key, "prompt_lookup_max")) {
            rc = dcp_fail("--speculative-config: unknown field \"%s\" (dcpinfer reads method, "
                          "num_speculative_tokens, prompt_lookup_min and prompt_lookup_max)", key);
            break;
        }
    }
    const char *m = json_string_value(json_object_get(o, "method"));
    if (!rc && !m) rc = dcp_fail("--speculative-config: no \"method\" (ngram, mtp or deepseek_mtp)");
    if (!rc) {
        if (!strcmp(m, "ngram")) out->method = SPEC_NGRAM;
        else if (!strcmp(m, "mtp") || !strcmp(m, "deepseek_mtp")) out->method = SPEC_MTP;
        else rc = dcp_fail("--speculative-config: method \"%s\": choose ngram, mtp or deepseek_mtp", m);
    }
    out->k = -1;
    out->lookup_min = out->lookup_max = -1;
    rc = rc || spec_int(o, "num_speculative_tokens", 1, SPEC_MAX_TOKENS, &out->k) ||
         spec_int(o, "prompt_lookup_min", 1, 1 << 16, &out->lookup_min) ||
         spec_int(o, "prompt_lookup_max", 1, 1 << 16, &out->lookup_max);
    if (!rc && out->k < 0) rc = dcp_fail("--speculative-config: no \"num_speculative_tokens\"");
    if (!rc && out->method != SPEC_NGRAM && (out->lookup_min > 0 || out->lookup_max > 0))
        rc = dcp_fail("--speculative-config: prompt_lookup_min and prompt_lookup_max are the ngram method's");
    if (!rc && out->method == SPEC_NGRAM) {
        /* vLLM's defaults: each the other's, both 5 */
        if (out->lookup_min < 0 && out->lookup_max < 0) out->lookup_min = out->lookup_max = 5;
        else if (out->lookup_min < 0) out->lookup_min = out->lookup_max;
        else if (out->lookup_max < 0) out->lookup_max = out->lookup_min;
        if (out->lookup_min > out->lookup_max)
            rc = dcp_fail("--speculative-config: prompt_lookup_min %d exceeds prompt_lookup_max %d", out->lookup_min,
                          out->lookup_max);
    }
    json_decref(o);
    if (rc) memset(out, 0, sizeof *out);
    return rc;
}

int spec_ngram_propose(const int *tokens, int n, int lookup_min, int lookup_max, int k, int *out)
{
    if (n < lookup_min + 1 || k <= 0) return 0;
    const int *last = tokens + n - 1;
    int best = 0, end = -1;
    /* e: where an earlier occurrence ends (e < n - 1, so at least one token
     * follows it); its length: the tokens before e equal to the suffix's */
    for (int e = lookup_min - 1; e < n - 1; e++) {
        if (tokens[e] != *last) continue;
        int len = 1, cap = lookup_max < e + 1 ? lookup_max : e + 1;
        while (len < cap && tokens[e - len] == last[-len]) len++;
        if (len > best) {
            best = len, end = e;
            if (best == lookup_max) break;
        }
    }
    if (best < lookup_min) return 0;
    int m = n - 1 - end < k ? n - 1 - end : k;
    memcpy(out, tokens + end + 1, sizeof(int) * (size_t)m);
    return m;
}
