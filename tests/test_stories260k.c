/* stories260K, the real llama2.c checkpoint, against llama2.c's own run.c:
 * prompt tokens, greedy tokens of cases 1 and 2, the sampled tokens of case
 * 6, the logits of every position of case 1 (1e-3), and the decoded text.
 * All three requests run in one batch. */
#include "backend.h"
#include "engine.h"
#include "generate.h"
#include "model.h"
#include "testutil.h"
#include "tokenizer.h"

#define VOCAB 512

/* The exact stdout of a CASE, between <<<BEGIN and END>>>. */
static char *reference_stdout(const char *ref, int case_no)
{
    char head[32];
    snprintf(head, sizeof head, "CASE %d:", case_no);
    const char *p = strstr(ref, head);
    p = p ? strstr(p, "<<<BEGIN\n") : NULL;
    const char *e = p ? strstr(p, "END>>>") : NULL;
    if (!e) return NULL;
    p += 9;
    char *s = xmalloc((size_t)(e - p) + 1);
    memcpy(s, p, (size_t)(e - p));
    s[e - p] = '\0';
    return s;
}

/* bf16 weights against run.c's fp32 logits (stories260K's logits span
 * about +-15; measured: 0.091) */
#define BF16_LOGIT_TOL 0.15

typedef struct {
    float *logits; /* (64, VOCAB) of request 0 */
    int seen;
} Capture;

static void capture(void *ctx, int request, int pos, const float *logits, int vocab)
{
    Capture *c = ctx;
    if (request != 0 || pos >= 64 || vocab != VOCAB) return;
    memcpy(c->logits + (size_t)pos * VOCAB, logits, sizeof(float) * VOCAB);
    c->seen++;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    char *model_path = shared_path("models/stories260K/stories260K.bin");
    char *tok_path = shared_path("models/stories260K/tok512.bin");
    char *ref_path = shared_path("models/stories260K/REFERENCE-llama2c.txt");
    char *logit_path = shared_path("models/stories260K/logits_case1_once_upon_a_time_n64.f32");
    if (!path_exists(model_path) || !path_exists(ref_path) || !path_exists(logit_path)) {
        fprintf(stderr, "stories260K not found under %s: skipped\n", shared_dir());
        MPI_Finalize();
        return TEST_SKIP;
    }
    char *ref;
    read_file(ref_path, &ref, NULL);
    int want1[128], want2[300], want6[300];
    int n1 = reference_tokens(ref, 1, want1, 128), n2 = reference_tokens(ref, 2, want2, 300),
        n6 = reference_tokens(ref, 6, want6, 300);
    CHECK(n1 == 65 && n2 == 257 && n6 == 257, "reference token counts %d %d %d", n1, n2, n6);

    Model m;
    CHECK(model_load(&m, model_path, 1, 0) == 0, "load: %s", dcp_error());
    Tokenizer tok;
    CHECK(tokenizer_load(&tok, tok_path, m.cfg.vocab_size) == 0, "tokenizer: %s", dcp_error());

    int *prompt, np;
    tokenizer_encode(&tok, "Once upon a time", m.cfg.bos_id, &prompt, &np);
    CHECK(np == 5 && !memcmp(prompt, want1, sizeof(int) * 5), "prompt tokens of case 1");
    int *empty, ne;
    tokenizer_encode(&tok, "", m.cfg.bos_id, &empty, &ne);
    CHECK(ne == 1 && empty[0] == 1, "empty prompt is BOS alone");

    RequestSet rs = {0};
    add_request(&rs, prompt, np, 60, 0.0f, 1.0f, 0);         /* case 1: -n 64 */
    add_request(&rs, empty, ne, 256, 0.0f, 1.0f, 0);         /* case 2 */
    add_request(&rs, empty, ne, 256, 1.0f, 0.9f, 133742);    /* case 6 */
    Capture cap = {xcalloc(64 * VOCAB, sizeof(float)), 0};
    Timings tm = {0};
    Engine e;
    engine_init(&e, &m, backend_cpu(), NULL, NULL, &tm, NULL);
    GenOptions go = {.max_model_len = m.cfg.max_seq_len, .max_num_seqs = 8, .max_batched_tokens = 64,
                     .on_logits = capture, .on_logits_ctx = &cap};
    Result res[3];
    GenStats gs;
    generate(&e, &rs, res, &go, &gs);
    CHECK(gs.kv_blocks_left == 0 && e.att.pool.n_free == e.att.pool.n_blocks, "KV blocks released after the run");
    free(gs.steps);
    engine_free(&e);

    CHECK(res[0].n == 60 && !memcmp(res[0].tokens, want1 + 5, sizeof(int) * 60), "case 1 greedy tokens");
    CHECK(res[1].n == 256 && !memcmp(res[1].tokens, want2 + 1, sizeof(int) * 256), "case 2 greedy tokens");
    CHECK(res[2].n == 256 && !memcmp(res[2].tokens, want6 + 1, sizeof(int) * 256), "case 6 sampled tokens");
    for (int i = 0; i < 3; i++) CHECK(!strcmp(res[i].finish_reason, "length"), "finish reason %d", i);
    for (int i = 0; i < res[0].n && i < 60; i++)
        if (res[0].tokens[i] != want1[5 + i]) {
            fprintf(stderr, "  case 1 first difference at output %d: %d vs %d\n", i, res[0].tokens[i],
                    want1[5 + i]);
            break;
        }

    /* logits of every position of case 1 */
    char *raw;
    size_t raw_len;
    read_file(logit_path, &raw, &raw_len);
    CHECK(raw_len == 64 * VOCAB * sizeof(float), "logits file size %zu", raw_len);
    CHECK(cap.seen == 64, "captured %d positions", cap.seen);
    double worst = 0;
    int worst_pos = -1;
    for (int p = 0; p < 64; p++)
        for (int v = 0; v < VOCAB; v++) {
            float want;
            memcpy(&want, raw + ((size_t)p * VOCAB + v) * 4, 4);
            double d = fabs((double)cap.logits[p * VOCAB + v] - want);
            if (d > worst) {
                worst = d;
                worst_pos = p;
            }
        }
    fprintf(stderr, "case 1: max |logit - run.c| = %.3g (position %d)\n", worst, worst_pos);
    CHECK(worst <= 1e-3, "logits differ from run.c by %g", worst);

    /* text: run.c prints the prompt's pieces, the generated ones, then "\n" */
    char *out1 = reference_stdout(ref, 1);
    const char *gen_text = out1 + strlen("Once upon a time");
    size_t len = 0;
    char text[4096] = "";
    int prev = prompt[np - 1];
    for (int i = 0; i < res[0].n; i++) {
        const char *piece = tokenizer_decode(&tok, prev, res[0].tokens[i], m.cfg.bos_id);
        len += snprintf(text + len, sizeof text - len, "%s", piece);
        prev = res[0].tokens[i];
    }
    CHECK(strlen(gen_text) == len + 1 && !strncmp(text, gen_text, len), "case 1 text:\n%s\nvs\n%s", text, gen_text);

    /* bf16 GEMM weights (--dtype bfloat16): the same 64 positions, fed the
     * reference tokens (the prompt is run.c's whole sequence, so every
     * position sees the same inputs), against run.c's fp32 logits; bf16
     * keeps 8 bits of mantissa, so a logit moves by a few hundredths;
     * loaded as dcpinfer loads it (the CPU's row groups where they fit) */
    Model mb;
    CHECK(model_load_as(&mb, model_path, 1, 0, "bfloat16", backend_cpu()->gemm_row_group(DTYPE_BF16)) == 0 &&
              mb.w.wq.dtype == DTYPE_BF16,
          "bf16 load: %s", dcp_error());
    RequestSet rb = {0};
    add_request(&rb, want1, 64, 1, 0.0f, 1.0f, 0);
    Capture capb = {xcalloc(64 * VOCAB, sizeof(float)), 0};
    go.on_logits_ctx = &capb;
    engine_init(&e, &mb, backend_cpu(), NULL, NULL, &tm, NULL);
    Result rbres;
    generate(&e, &rb, &rbres, &go, &gs);
    free(gs.steps);
    engine_free(&e);
    double worst_bf16 = 0;
    int same_top = 0;
    for (int p = 0; p < 64; p++) {
        int top = 0, top_ref = 0;
        float want[VOCAB];
        memcpy(want, raw + (size_t)p * VOCAB * 4, sizeof want);
        for (int v = 0; v < VOCAB; v++) {
            worst_bf16 = fmax(worst_bf16, fabs((double)capb.logits[p * VOCAB + v] - want[v]));
            if (capb.logits[p * VOCAB + v] > capb.logits[p * VOCAB + top]) top = v;
            if (want[v] > want[top_ref]) top_ref = v;
        }
        same_top += top == top_ref;
    }
    fprintf(stderr, "bf16 weights: max |logit - run.c fp32| = %.3g over 64 positions, same top token at %d\n",
            worst_bf16, same_top);
    CHECK(capb.seen == 64 && worst_bf16 <= BF16_LOGIT_TOL, "bf16 logits differ from fp32 by %g (tolerance %g)",
          worst_bf16, BF16_LOGIT_TOL);
    CHECK(same_top >= 62, "bf16: the top token agrees with fp32 at only %d of 64 positions", same_top);
    results_free(&rbres, 1);
    requests_free(&rb);
    free(capb.logits);
    model_free(&mb);

    free(out1);
    free(raw);
    free(cap.logits);
    results_free(res, 3);
    requests_free(&rs);
    free(prompt);
    free(empty);
    tokenizer_free(&tok);
    model_free(&m);
    free(ref);
    free(model_path);
    free(tok_path);
    free(ref_path);
    free(logit_path);
    MPI_Finalize();
    return test_finish("test_stories260k");
}
