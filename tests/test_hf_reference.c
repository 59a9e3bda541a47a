/* Hugging Face model families against transformers: for each model under
 * tests/data/hf (written by tests/ref/make_hf_refs.py: Llama with llama3,
 * linear, yarn and rope_parameters-style RoPE, Mistral with a sliding
 * window shorter than the prompt, Qwen2 with biases, Qwen3 with q/k norms,
 * Llama with MLP and attention biases, Qwen3-MoE with 8 experts of which 2
 * per token) and under tests/data/deepseek
 * (tests/ref/make_deepseek_refs.py: DeepSeek-V3 with q_lora_rank, YaRN and
 * 8 experts in 4 groups, DeepSeek-V2 without q_lora_rank and with softmax
 * routing), dcpinfer's logits at every prompt
 * position are within 1e-4 of transformers' (relative to the row's largest
 * absolute logit), and its 32 greedy tokens are transformers' tokens. A
 * DeepSeek-V3 model's MTP layer (tests/ref/make_mtp_refs.py) gives a
 * torch implementation's draft logits (mtp_against_torch). */
#include "arch.h"
#include "backend.h"
#include "engine.h"
#include "generate.h"
#include "model.h"
#include "safetensors.h"
#include "sampler.h"
#include "testutil.h"

static const char *cases[] = {"hf/llama3",        "hf/rope_parameters", "hf/linear",
                              "hf/yarn",          "hf/mistral_window",  "hf/qwen2_bias",
                              "hf/qwen3_qk_norm", "hf/mlp_bias",        "hf/qwen3_moe",       "hf/glm4_moe",
                              "deepseek/v3_yarn",
                              "deepseek/v2_softmax", "deepseek/v3_fp8", "deepseek/v3_int4", "deepseek/v3_nvfp4",
                              "deepseek/v3_nvfp4_modelopt", "deepseek/v3_w4a4", "deepseek/v3_w4a4_mo"};

/* One request of the prompt at one rank: its logits at every position
 * ((n + max_tokens) x vocab, malloc'ed) and its result. */
static float *run_prompt_with(const Model *m, const int *prompt, int n, int max_tokens, Result *res,
                              const EngineOptions *eo)
{
    int vocab = m->cfg.vocab_size;
    RequestSet rs = {0};
    add_request(&rs, prompt, n, max_tokens, 0.0f, 1.0f, 0);
    PromptLogits cap = {xcalloc((size_t)(n + max_tokens) * vocab, sizeof(float)), vocab};
    Timings tm = {0};
    Engine e;
    engine_init(&e, m, backend_cpu(), NULL, eo, &tm, NULL);
    GenOptions go = {.max_model_len = m->cfg.max_seq_len, .max_num_seqs = 4, .max_batched_tokens = 4096,
                     .on_logits = capture_prompt_logits, .on_logits_ctx = &cap};
    generate(&e, &rs, res, &go, NULL);
    engine_free(&e);
    requests_free(&rs);
    return cap.logits;
}

static float *run_prompt(const Model *m, const int *prompt, int n, int max_tokens, Result *res)
{
    return run_prompt_with(m, prompt, n, max_tokens, res, NULL);
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

/* A quantized checkpoint gives exactly the logits of its dequantized
 * float32 twin, and holds its matrices as stored: every matrix the GEMMs
 * read that the checkpoint quantizes takes its stored bits per element
 * (FP8 8, INT4 and NVFP4 4) and a 4-byte scale per run of gcd(block or
 * group, its K chunk's columns) columns (NVFP4: its 1-byte E4M3 code, and
 * a table of the codes' values and the input scale, WEIGHT_TABLE floats,
 * per matrix), against the twin's 4 bytes. */
static void quant_twin(const char *src, const char *name, DType t, int block)
{
    char dir[4096], twin[4200];
    snprintf(dir, sizeof dir, "%s/tests/data/deepseek/%s", src, name);
    snprintf(twin, sizeof twin, "%s_twin", dir);
    Model q, w;
    if (CHECK_OK(model_load(&q, dir, 1, 0) == 0 && model_load(&w, twin, 1, 0) == 0, "%s", dcp_error())) {
        TensorSpec *mt = xmalloc(sizeof(TensorSpec) * (size_t)layer_max_tensors(&q.cfg));
        StCheckpoint ck;
        long long want = (long long)w.w.bytes, kept = 0, unkept = 0;
        CHECK(st_checkpoint_open(&ck, dir) == 0, "%s", dcp_error());
        for (int l = 0; l < q.cfg.n_layers; l++) {
            int n = mla_tensors(&q.cfg, &q.shard, l, &q.w.mla[l], mt);
            for (int i = 0; i < n; i++) {
                char packed[160];
                snprintf(packed, sizeof packed, "%.*s.weight_packed", (int)strlen(mt[i].name) - 7, mt[i].name);
                const StTensor *st = st_find(&ck, mt[i].name);
                int stored = st ? st->dtype == ST_F8_E4M3 || st->dtype == ST_U8 : st_find(&ck, packed) != NULL;
                if (!mt[i].mat || !stored) continue;
                long long e = (long long)mt[i].nrows * mt[i].ncols;
                int run = block, cc = mt[i].ncols / mt[i].chunks;
                while (cc % run) run /= 2; /* gcd(block, cc): both powers of two here */
                /* NVFP4: a 1-byte code per run and one table of 256 fp32 values per matrix */
                want += e * (long long)dtype_bits(t) / 8 + (t == DTYPE_FP4 ? e / run + 4 * WEIGHT_TABLE : 4 * e / run) -
                        4 * e;
                kept += mt[i].mat->dtype == t;
                unkept += mt[i].mat->dtype != t;
            }
        }
        st_checkpoint_close(&ck);
        if (q.cfg.quant.kv_fp8) want += 2 * 4 * q.cfg.n_layers; /* an FP8 cache's k_scale and v_scale per layer */
        fprintf(stderr, "deepseek/%-17s weights %zu bytes as stored (%lld %s matrices), %zu as the float32 twin\n",
                name, q.w.bytes, kept, dtype_name(t), w.w.bytes);
        CHECK(kept > 0 && !unkept, "%s: %lld quantized matrices widened on loading", name, unkept);
        CHECK((long long)q.w.bytes == want, "%s: weights take %zu bytes, the formula says %lld", name, q.w.bytes, want);
        free(mt);
        model_free(&q);
        model_free(&w);
    }
    int n1, n2, v1, v2;
    float *a = prompt_logits(dir, &n1, &v1), *b = prompt_logits(twin, &n2, &v2);
    if (a && b && CHECK_OK(n1 == n2 && v1 == v2, "%s and twin differ in shape", name)) {
        double worst = 0;
        for (size_t i = 0; i < (size_t)n1 * v1; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
        fprintf(stderr, "deepseek/%-17s max |logit - float32 twin's| = %.2g over %d positions\n", name, worst, n1);
        CHECK(worst == 0, "%s logits differ from the dequantized twin's by %g", name, worst);
    }
    free(a);
    free(b);
}

/* The model under tests/data/NAME against transformers: logits at every
 * prompt position within 1e-4 of its logitsSUFFIX.f32 (relative to the
 * row's largest), its 32 greedy tokens those of greedySUFFIX.txt; eo: the
 * engine's options (NULL: defaults). */
static void against_transformers(const char *src, const char *name, const char *suffix, const EngineOptions *eo)
{
    char dir[4096], path[4200], label[96];
    snprintf(dir, sizeof dir, "%s/tests/data/%s", src, name);
    snprintf(label, sizeof label, "%s%s", name, suffix);
    int prompt[1024], want[64];
    snprintf(path, sizeof path, "%s/prompt.txt", dir);
    int n = read_ids(path, prompt, 1024);
    snprintf(path, sizeof path, "%s/greedy%s.txt", dir, suffix);
    int n_want = read_ids(path, want, 64);
    Model m;
    if (!CHECK_OK(n >= 64 && n_want == 32, "%s: reference data missing (%d prompt, %d greedy ids)", label, n,
                  n_want) ||
        !CHECK_OK(model_load(&m, dir, 1, 0) == 0, "%s: %s", label, dcp_error()))
        return;
    int vocab = m.cfg.vocab_size;
    snprintf(path, sizeof path, "logits%s.f32", suffix);
    float *ref = read_ref_logits_named(dir, path, n, vocab);
    /* every position's logits, then the greedy continuation */
    Result res;
    float *logits = run_prompt_with(&m, prompt, n, 32, &res, eo);
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
    fprintf(stderr, "%-25s %-20s max |logit - transformers| / max |logit| = %.2g over %d positions; greedy %s\n",
            label, arch_table[m.cfg.arch].name, worst, n, same ? "identical" : "DIFFER");
    CHECK(worst <= 1e-4, "%s: logits differ from transformers by %g (relative)", label, worst);
    CHECK(same, "%s: greedy tokens differ from transformers' (%d tokens)", label, res.n);
    results_free(&res, 1);
    free(logits);
    free(ref);
    model_free(&m);
}

/* Largest |a - b| over n rows of vocab logits, relative to each row's
 * largest |b| */
static double rel_diff(const float *a, const float *b, int n, int vocab)
{
    double worst = 0;
    for (int p = 0; p < n; p++, a += vocab, b += vocab) {
        double big = 0, d = 0;
        for (int v = 0; v < vocab; v++) {
            big = fmax(big, fabs(b[v]));
            d = fmax(d, fabs((double)a[v] - b[v]));
        }
        worst = fmax(worst, d / (big > 0 ? big : 1));
    }
    return worst;
}

/* DeepSeek's MTP layer against a short torch implementation of it
 * (tests/ref/make_mtp_refs.py, deepseek/v3_mtp): over the prompt, the
 * model's pass and then the MTP layer's with the tokens shifted by one
 * (the greedy token after the prompt last) and the model's final-normed
 * hidden states; its draft logits at every position within 1e-4 of the
 * reference's (relative to the row's largest). Then two chained draft
 * steps, each one position on, on the draft before it and the MTP
 * layer's own state: their logits within 1e-4, their drafts the
 * reference's. */
static void mtp_against_torch(const char *src)
{
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/tests/data/deepseek/v3_mtp", src);
    snprintf(path, sizeof path, "%s/prompt.txt", dir);
    int ids[1024];
    int n = read_ids(path, ids, 1024) - 1; /* the prompt, then the greedy token after it */
    Model m;
    if (!CHECK_OK(n >= 16, "v3_mtp: reference data missing") ||
        !CHECK_OK(model_load_mtp(&m, dir, 1, 0, 0, 0, "float32", 0, 1) == 0, "v3_mtp: %s", dcp_error()))
        return;
    int vocab = m.cfg.vocab_size;
    float *ref = read_ref_logits_named(dir, "mtp_logits.f32", n, vocab);
    float *chain_ref = read_ref_logits_named(dir, "mtp_chain_logits.f32", 2, vocab);
    int drafts[3];
    snprintf(path, sizeof path, "%s/mtp_drafts.txt", dir);
    CHECK(read_ids(path, drafts, 3) == 3, "v3_mtp: mtp_drafts.txt must hold 3 ids");
    Timings tm = {0};
    Engine e;
    engine_init(&e, &m, backend_cpu(), NULL, NULL, &tm, NULL);
    BlockTable table = {0};
    table_reserve(&e.att.pool, &table, kv_blocks_for(e.env.topo, n + 2, e.att.pool.block_size));
    Chunk c = {table.ids, table.n, 0, n};
    float *logits = xmalloc(sizeof(float) * (size_t)n * vocab), *hidden = xmalloc(sizeof(float) * (size_t)n * m.cfg.dim);
    int *rows = xmalloc(sizeof(int) * (size_t)n), all = n;
    engine_forward(&e, ids, &c, 1, NULL, logits);
    for (int t = 0; t < n; t++) rows[t] = t;
    engine_mtp(&e, ids + 1, &c, 1, rows, NULL, &all, logits, hidden);
    double worst = ref ? rel_diff(logits, ref, n, vocab) : INFINITY, chain_worst = 0;
    int got[3] = {argmax_f32(logits + (size_t)(n - 1) * vocab, vocab)};
    float *state = xmalloc(sizeof(float) * (size_t)m.cfg.dim);
    memcpy(state, hidden + (size_t)(n - 1) * m.cfg.dim, sizeof(float) * (size_t)m.cfg.dim);
    for (int j = 0; j < 2; j++) { /* the reference's drafts as inputs, whatever this run's argmax */
        Chunk step = {table.ids, table.n, n + j, 1};
        engine_mtp(&e, &drafts[j], &step, 1, NULL, state, NULL, logits, hidden);
        memcpy(state, hidden, sizeof(float) * (size_t)m.cfg.dim);
        got[j + 1] = argmax_f32(logits, vocab);
        chain_worst = fmax(chain_worst, chain_ref ? rel_diff(logits, chain_ref + (size_t)j * vocab, 1, vocab) : INFINITY);
    }
    fprintf(stderr, "deepseek/v3_mtp           MTP layer: max |logit - torch| / max |logit| = %.2g over %d positions, "
                    "%.2g over 2 chained steps; drafts %d %d %d (torch %d %d %d)\n",
            worst, n, chain_worst, got[0], got[1], got[2], drafts[0], drafts[1], drafts[2]);
    CHECK(worst <= 1e-4, "v3_mtp: MTP draft logits differ from the torch reference by %g (relative)", worst);
    CHECK(chain_worst <= 1e-4, "v3_mtp: chained draft logits differ from the torch reference by %g (relative)",
          chain_worst);
    CHECK(!memcmp(got, drafts, sizeof got), "v3_mtp: drafts %d %d %d, the reference's %d %d %d", got[0], got[1],
          got[2], drafts[0], drafts[1], drafts[2]);
    free(state);
    free(chain_ref);
    table_release(&e.att.pool, &table);
    table_free(&table);
    engine_free(&e);
    free(logits);
    free(hidden);
    free(rows);
    free(ref);
    model_free(&m);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    const char *src = getenv("DCP_SRCDIR") ? getenv("DCP_SRCDIR") : ".";
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) against_transformers(src, cases[k], "", NULL);
    /* W4A4 NVFP4 with emulated activations: compressed-tensors' own fake
     * quantization of every expert's input in the reference */
    EngineOptions emulate = {.nvfp4_act = 1};
    against_transformers(src, "deepseek/v3_w4a4", "_emulate", &emulate);
    against_transformers(src, "deepseek/v3_w4a4_mo", "_emulate", &emulate);
    mtp_against_torch(src);
    quant_twin(src, "v3_fp8", DTYPE_F8_E4M3, 16);
    quant_twin(src, "v3_int4", DTYPE_I4, 32);
    quant_twin(src, "v3_nvfp4", DTYPE_FP4, 16);
    quant_twin(src, "v3_nvfp4_modelopt", DTYPE_FP4, 16);
    quant_twin(src, "v3_w4a4", DTYPE_FP4, 16);
    quant_twin(src, "v3_w4a4_mo", DTYPE_FP4, 16);
    MPI_Finalize();
    return test_finish("test_hf_reference");
}
