/* vLLM's sampling parameters against their references
 * (tests/ref/make_sampling_refs.py): on the logits of a random-weight model
 * over a real 32,000-token vocabulary (mistral-sp), logit_bias and the
 * repetition penalty (transformers' RepetitionPenaltyLogitsProcessor over
 * prompt and output) and the frequency and presence penalties (OpenAI's
 * formula over the output) give the reference's logits within 1e-6, and
 * temperature with min_p, top_k and top_p (transformers' warpers, in
 * vLLM's order) the reference's distribution within 1e-6, the same tokens
 * kept. The request fields come through the prompt-file parser; the
 * adjustments give the same bits on any split of the vocabulary. */
#include <jansson.h>

#include "sampler.h"
#include "testutil.h"

#define VOCAB 32000

static float logits[VOCAB];

static int load_logits(void)
{
    char path[4200];
    const char *src = getenv("srcdir");
    snprintf(path, sizeof path, "%s/tests/data/sampling/logits.f32", src ? src : ".");
    FILE *f = fopen(path, "rb");
    int ok = f && fread(logits, sizeof(float), VOCAB, f) == VOCAB;
    if (f) fclose(f);
    return ok;
}

/* the case's parameters as a prompt-file line, through the parser */
static int case_request(json_t *c, RequestSet *rs)
{
    json_t *line = json_object();
    json_object_set(line, "prompt_token_ids", json_object_get(c, "prompt"));
    static const char *const keys[] = {"temperature", "top_p", "top_k", "min_p", "presence_penalty",
                                       "frequency_penalty", "repetition_penalty", "logit_bias", NULL};
    for (int k = 0; keys[k]; k++)
        if (json_object_get(c, keys[k])) json_object_set(line, keys[k], json_object_get(c, keys[k]));
    char *text = json_dumps(line, JSON_COMPACT);
    json_decref(line);
    RequestDefaults d = {16, 1.0f, 1.0f, 7, {.repetition_penalty = 1.0f}};
    int rc = requests_parse("(case)", text, strlen(text), &d, 0, rs);
    free(text);
    return rc;
}

int main(void)
{
    if (!load_logits()) {
        fprintf(stderr, "tests/data/sampling/logits.f32 missing\n");
        return 1;
    }
    char path[4200];
    const char *src = getenv("srcdir");
    snprintf(path, sizeof path, "%s/tests/data/sampling/cases.jsonl", src ? src : ".");
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    char *buf = NULL;
    size_t cap = 0;
    int cases = 0;
    float *row = xmalloc(sizeof(float) * VOCAB), *probs = xmalloc(sizeof(float) * VOCAB),
          *shards = xmalloc(sizeof(float) * VOCAB);
    void *scratch = xmalloc(sampler_scratch_bytes(VOCAB));
    while (getline(&buf, &cap, f) > 0) {
        json_t *c = json_loads(buf, 0, NULL);
        const char *name = json_string_value(json_object_get(c, "name"));
        RequestSet rs;
        if (!CHECK_OK(c && !case_request(c, &rs), "%s: the request line is refused: %s", name, dcp_error())) continue;
        const Request *q = &rs.r[0];
        json_t *out = json_object_get(c, "output");
        int n_out = (int)json_array_size(out), *ids = xmalloc(sizeof(int) * (size_t)(n_out + 1));
        for (int i = 0; i < n_out; i++) ids[i] = (int)json_integer_value(json_array_get(out, (size_t)i));
        memcpy(row, logits, sizeof logits);
        sampler_adjust(row, 0, VOCAB, q, ids, n_out);
        /* the same bits over four uneven shards of the vocabulary */
        memcpy(shards, logits, sizeof logits);
        static const int cut[] = {0, 7000, 16001, 29900, VOCAB};
        for (int s = 0; s < 4; s++) sampler_adjust(shards + cut[s], cut[s], cut[s + 1] - cut[s], q, ids, n_out);
        CHECK(!memcmp(row, shards, sizeof logits), "%s: adjusting by shards changes the bits", name);
        json_t *want = json_object_get(c, "logits");
        if (want) {
            char *touched = xcalloc(VOCAB, 1);
            size_t i;
            json_t *e;
            double worst = 0;
            json_array_foreach(want, i, e)
            {
                int t = (int)json_integer_value(json_array_get(e, 0));
                touched[t] = 1;
                double d = fabs(row[t] - json_number_value(json_array_get(e, 1)));
                worst = d > worst ? d : worst;
            }
            int others = 0;
            for (int t = 0; t < VOCAB; t++) others += !touched[t] && memcmp(&row[t], &logits[t], sizeof(float));
            CHECK(worst <= 1e-6 && !others, "%s: adjusted logits off by %g, %d untouched ids changed", name, worst,
                  others);
            printf("%-20s %zu adjusted logits, largest difference %.2g\n", name, json_array_size(want), worst);
            free(touched);
        } else {
            Sampler s;
            sampler_init(&s, q->temperature, q->top_p, q->seed);
            sampler_set_extra(&s, &q->x);
            sampler_distribution(&s, row, VOCAB, probs, scratch);
            want = json_object_get(c, "probs");
            char *kept = xcalloc(VOCAB, 1);
            size_t i;
            json_t *e;
            double worst = 0;
            int missing = 0, extra = 0;
            json_array_foreach(want, i, e)
            {
                int t = (int)json_integer_value(json_array_get(e, 0));
                kept[t] = 1;
                missing += probs[t] == 0.0f;
                double d = fabs(probs[t] - json_number_value(json_array_get(e, 1)));
                worst = d > worst ? d : worst;
            }
            for (int t = 0; t < VOCAB; t++) extra += !kept[t] && probs[t] != 0.0f;
            CHECK(worst <= 1e-6 && !missing && !extra, "%s: distribution off by %g, %d tokens missing, %d extra", name,
                  worst, missing, extra);
            printf("%-20s %zu tokens kept, largest difference %.2g\n", name, json_array_size(want), worst);
            free(kept);
        }
        cases++;
        free(ids);
        requests_free(&rs);
        json_decref(c);
    }
    fclose(f);
    free(buf);
    CHECK(cases == 10, "%d cases read, want 10", cases);
    /* the request fields' ranges, as vLLM's and OpenAI's */
    static const char *const bad[] = {
        "{\"prompt_token_ids\": [1], \"top_k\": -2}",       "{\"prompt_token_ids\": [1], \"min_p\": 1.5}",
        "{\"prompt_token_ids\": [1], \"presence_penalty\": 2.5}", "{\"prompt_token_ids\": [1], \"repetition_penalty\": 0}",
        "{\"prompt_token_ids\": [1], \"logit_bias\": {\"x\": 1}}", "{\"prompt_token_ids\": [1], \"logit_bias\": {\"5\": 101}}",
        "{\"prompt_token_ids\": [1], \"logit_bias\": [1]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        RequestSet rs;
        RequestDefaults d = {16, 1.0f, 1.0f, 7, {.repetition_penalty = 1.0f}};
        CHECK(requests_parse("(bad)", bad[i], strlen(bad[i]), &d, 0, &rs) != 0, "accepted: %s", bad[i]);
    }
    free(row);
    free(probs);
    free(shards);
    free(scratch);
    if (test_failures) fprintf(stderr, "%d check(s) failed\n", test_failures);
    return test_failures ? 1 : 0;
}
