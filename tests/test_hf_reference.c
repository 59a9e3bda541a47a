/* Hugging Face model families against transformers: for each model under
 * tests/data/hf (written by tests/ref/make_hf_refs.py: Llama with llama3,
 * linear, yarn and rope_parameters-style RoPE, Mistral with a sliding
 * window shorter than the prompt, Qwen2 with biases, Qwen3 with q/k norms,
 * Llama with MLP and attention biases) and under tests/data/deepseek
 * (tests/ref/make_deepseek_refs.py: DeepSeek-V3 with q_lora_rank, YaRN and
 * 8 experts in 4 groups, DeepSeek-V2 without q_lora_rank and with softmax
 * routing), dcpinfer's logits at every prompt
 * position are within 1e-4 of transformers' (relative to the row's largest
 * absolute logit), and its 32 greedy tokens are transformers' tokens. */
#include "arch.h"
#include "backend.h"
#include "engine.h"
#include "generate.h"
#include "model.h"
#include "safetensors.h"
#include "testutil.h"

static const char *cases[] = {"hf/llama3",        "hf/rope_parameters", "hf/linear",
                              "hf/yarn",          "hf/mistral_window",  "hf/qwen2_bias",
                              "hf/qwen3_qk_norm", "hf/mlp_bias",        "deepseek/v3_yarn",
                              "deepseek/v2_softmax", "deepseek/v3_fp8"};

/* One request of the prompt at one rank: its logits at every position
 * ((n + max_tokens) x vocab, malloc'ed) and its result. */
static float *run_prompt(const Model *m, const int *prompt, int n, int max_tokens, Result *res)
{
    int vocab = m->cfg.vocab_size;
    RequestSet rs = {0};
    add_request(&rs, prompt, n, max_tokens, 0.0f, 1.0f, 0);
    PromptLogits cap = {xcalloc((size_t)(n + max_tokens) * vocab, sizeof(float)), vocab};
    Timings tm = {0};
    Engine e;
    engine_init(&e, m, backend_cpu(), NULL, NULL, &tm, NULL);
    GenOptions go = {.max_model_len = m->cfg.max_seq_len, .max_num_seqs = 4, .max_batched_tokens = 4096,
                     .on_logits = capture_prompt_logits, .on_logits_ctx = &cap};
    generate(&e, &rs, res, &go, NULL);
    engine_free(&e);
    requests_free(&rs);
    return cap.logits;
}

/* Logits of every position of a model folder's prompt.txt, at one rank. */
static float *prompt_logits(const char *dir, int *n_out, int *vocab_out)
{
    char path[4200];
    int prompt[1024];
    snprintf(path, sizeof path, "%s/prompt.txt", dir);
    int n = read_ids(path, prompt, 1024);
    Model m;
    if (!CHECK_OK(n > 0 && model_load(&m, dir, 1, 0) == 0, "%s: %s", dir, dcp_error())) return NULL;
    Result res;
    float *logits = run_prompt(&m, prompt, n, 1, &res);
    results_free(&res, 1);
    *n_out = n;
    *vocab_out = m.cfg.vocab_size;
    model_free(&m);
    return logits;
}

/* A block-scaled FP8 checkpoint (F8_E4M3 with weight_scale_inv) gives the
 * logits of its dequantized float32 twin. */
static void fp8_twin(const char *src)
{
    char fp8[4096], twin[4096], file[4200];
    snprintf(fp8, sizeof fp8, "%s/tests/data/deepseek/v3_fp8", src);
    snprintf(twin, sizeof twin, "%s/tests/data/deepseek/v3_fp8_twin", src);
    snprintf(file, sizeof file, "%s/model.safetensors", fp8);
    StFile f;
    int n_f8 = 0;
    if (CHECK_OK(st_open(&f, file) == 0, "%s: %s", file, dcp_error())) {
        for (int i = 0; i < f.n; i++) n_f8 += f.tensors[i].dtype == ST_F8_E4M3;
        st_close(&f);
    }
    CHECK(n_f8 > 0, "%s holds no FP8 tensor", file);
    /* kept in FP8: every matrix the GEMMs read that the checkpoint stores
     * in FP8 takes a byte per element and a 4-byte scale per run of
     * gcd(16, its K chunk's columns) columns, against the twin's 4 bytes */
    Model q, t;
    if (CHECK_OK(model_load(&q, fp8, 1, 0) == 0 && model_load(&t, twin, 1, 0) == 0, "%s", dcp_error())) {
        MlaTensor *mt = xmalloc(sizeof(MlaTensor) * (size_t)mla_max_tensors(&q.cfg));
        StCheckpoint ck;
        long long want = (long long)t.w.bytes, kept = 0, unkept = 0;
        CHECK(st_checkpoint_open(&ck, fp8) == 0, "%s", dcp_error());
        for (int l = 0; l < q.cfg.n_layers; l++) {
            int n = mla_tensors(&q.cfg, &q.shard, l, &q.w.mla[l], mt);
            for (int i = 0; i < n; i++) {
                if (!mt[i].mat || st_find(&ck, mt[i].name)->dtype != ST_F8_E4M3) continue;
                long long e = (long long)mt[i].nrows * mt[i].ncols;
                int run = 16, cc = mt[i].ncols / mt[i].chunks;
                while (cc % run) run /= 2; /* gcd(16, cc) */
                want += e + 4 * e / run - 4 * e;
                kept += mt[i].mat->dtype == DTYPE_F8_E4M3;
                unkept += mt[i].mat->dtype != DTYPE_F8_E4M3;
            }
        }
        st_checkpoint_close(&ck);
        fprintf(stderr, "deepseek/v3_fp8      weights %zu bytes in FP8 (%lld matrices), %zu as float32 twin\n", q.w.bytes,
                kept, t.w.bytes);
        CHECK(kept > 0 && !unkept, "%lld FP8 matrices widened on loading", unkept);
        CHECK((long long)q.w.bytes == want, "FP8 weights take %zu bytes, the formula says %lld", q.w.bytes, want);
        free(mt);
        model_free(&q);
        model_free(&t);
    }
    int n1, n2, v1, v2;
    float *a = prompt_logits(fp8, &n1, &v1), *b = prompt_logits(twin, &n2, &v2);
    if (a && b && CHECK_OK(n1 == n2 && v1 == v2, "FP8 and twin differ in shape")) {
        double worst = 0;
        for (size_t i = 0; i < (size_t)n1 * v1; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
        fprintf(stderr, "deepseek/v3_fp8      %d FP8 matrices: max |logit - float32 twin's| = %.2g over %d positions\n",
                n_f8, worst, n1);
        CHECK(worst == 0, "FP8 logits differ from the dequantized twin's by %g", worst);
    }
    free(a);
    free(b);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    const char *src = getenv("DCP_SRCDIR") ? getenv("DCP_SRCDIR") : ".";
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char dir[4096], path[4200];
        snprintf(dir, sizeof dir, "%s/tests/data/%s", src, cases[k]);
        int prompt[1024], want[64];
        snprintf(path, sizeof path, "%s/prompt.txt", dir);
        int n = read_ids(path, prompt, 1024);
        snprintf(path, sizeof path, "%s/greedy.txt", dir);
        int n_want = read_ids(path, want, 64);
        Model m;
        if (!CHECK_OK(n >= 200 && n_want == 32, "%s: reference data missing (%d prompt, %d greedy ids)", cases[k], n,
                      n_want) ||
            !CHECK_OK(model_load(&m, dir, 1, 0) == 0, "%s: %s", cases[k], dcp_error()))
            continue;
        int vocab = m.cfg.vocab_size;
        float *ref = read_ref_logits(dir, n, vocab);
        /* every position's logits, then the greedy continuation */
        Result res;
        float *logits = run_prompt(&m, prompt, n, 32, &res);
        double worst = 0;
        for (int p = 0; p < n; p++) {
            const float *a = logits + (size_t)p * vocab, *b = ref + (size_t)p * vocab;
            double big = 0, d = 0;
            for (int v = 0; v < vocab; v++) {
                big = fmax(big, fabs(b[v]));
                d = fmax(d, fabs((double)a[v] - b[v]));
            }
            worst = fmax(worst, d / (big > 0 ? big : 1));
        }
        int same = res.n == 32 && !memcmp(res.tokens, want, sizeof(int) * 32);
        fprintf(stderr, "%-16s %-20s max |logit - transformers| / max |logit| = %.2g over %d positions; greedy %s\n",
                cases[k], arch_table[m.cfg.arch].name, worst, n, same ? "identical" : "DIFFER");
        CHECK(worst <= 1e-4, "%s: logits differ from transformers by %g (relative)", cases[k], worst);
        CHECK(same, "%s: greedy tokens differ from transformers' (%d tokens)", cases[k], res.n);
        results_free(&res, 1);
        free(logits);
        free(ref);
        model_free(&m);
    }
    fp8_twin(src);
    MPI_Finalize();
    return test_finish("test_hf_reference");
}
