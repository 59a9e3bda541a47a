/* Weights stored in a type other than fp32 are stepped through by their
 * own element size. A stand-in backend keeps the CPU's arithmetic but
 * stores GEMM weights as bf16 (2 bytes, in allocations of exactly that
 * size, as a GPU with --dtype bfloat16 does): run on the 4-layer default
 * model, it must give bit for bit the logits of the CPU backend on the
 * same model with its GEMM weights (and the embedding, held as the LM
 * head's rows are) rounded to bf16. Reading a layer at a
 * float-sized offset would read the wrong layer (different logits) and,
 * from the middle layer on, past the allocation (AddressSanitizer).
 * Weights that make the logits NaN stop each request with a reason
 * instead of sampling from garbage. */
#include "backend.h"
#include "engine.h"
#include "generate.h"
#include "model.h"
#include "testutil.h"

static Backend bf16_be;
static int bf16_matmuls;

static void *stacks[64];
static int n_stacks;

static WeightRef bf16_gemm_weights(WeightRef host, size_t n)
{
    const float *f = host.data;
    uint16_t *p = xmalloc(sizeof(uint16_t) * n);
    for (size_t i = 0; i < n; i++) p[i] = f32_to_bf16(f[i]);
    stacks[n_stacks++] = p;
    return weight_ref(p, DTYPE_BF16, 0);
}

/* fp32 arrays are the model's own (the CPU copies nothing); the bf16
 * stacks are ours */
static void bf16_release_weights(const void *p)
{
    for (int i = 0; i < n_stacks; i++)
        if (stacks[i] == p) {
            free(stacks[i]);
            stacks[i] = stacks[--n_stacks];
            return;
        }
}

static void bf16_matmul(float *y, const float *x, WeightRef w, int T, int in, int out)
{
    CHECK(w.dtype == DTYPE_BF16, "matmul got dtype %d", (int)w.dtype);
    const uint16_t *h = w.data;
    float *f = xmalloc(sizeof(float) * (size_t)in * out);
    for (size_t i = 0; i < (size_t)in * out; i++) f[i] = bf16_to_f32(h[i]);
    backend_cpu()->matmul(y, x, weight_ref(f, DTYPE_F32, 0), T, in, out);
    free(f);
    bf16_matmuls++;
}

/* a stack of products (a row-parallel product's K chunks): each matrix
 * by bf16_matmul, at the stack's strides */
static void bf16_matmul_batched(float *y, int ldy, size_t y_step, const float *x, int ldx, size_t x_step, WeightRef w,
                                int batch, int T, int in, int out)
{
    float *xb = xmalloc(sizeof(float) * (size_t)T * in), *yb = xmalloc(sizeof(float) * (size_t)T * out);
    for (int b = 0; b < batch; b++) {
        for (int t = 0; t < T; t++) memcpy(xb + (size_t)t * in, x + b * x_step + (size_t)t * ldx, sizeof(float) * in);
        bf16_matmul(yb, xb, weight_at(w, (size_t)b * out * in), T, in, out);
        for (int t = 0; t < T; t++) memcpy(y + b * y_step + (size_t)t * ldy, yb + (size_t)t * out, sizeof(float) * out);
    }
    free(xb), free(yb);
}

static void round_to_bf16(WeightRef w, size_t n)
{
    float *f = (float *)w.data; /* the model's own fp32 copy */
    for (size_t i = 0; i < n; i++) f[i] = bf16_to_f32(f32_to_bf16(f[i]));
}

/* Logits of every position of one prompt (vocab floats per token). */
static float *forward(const Model *m, const Backend *be, const int *ids, int n)
{
    Timings tm = {0};
    Engine e;
    engine_init(&e, m, be, NULL, NULL, &tm, NULL);
    int blocks[8];
    for (int i = 0; i < 8; i++) blocks[i] = i;
    Chunk ch = {.blocks = blocks, .n_blocks = 8, .pos0 = 0, .n = n};
    float *logits = xmalloc(sizeof(float) * (size_t)n * m->shard.vocab);
    engine_forward(&e, ids, &ch, 1, &n, logits);
    engine_free(&e);
    return logits;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    bf16_be = *backend_cpu();
    bf16_be.name = "bf16-storage";
    bf16_be.gemm_weights = bf16_gemm_weights;
    bf16_be.release_weights = bf16_release_weights;
    bf16_be.matmul = bf16_matmul;
    bf16_be.matmul_batched = bf16_matmul_batched;

    Model m;
    CHECK(model_load(&m, NULL, 1, 0) == 0, "default model: %s", dcp_error());
    CHECK(m.cfg.n_layers >= 4, "the default model has %d layers; the test needs a stack", m.cfg.n_layers);
    int ids[] = {1, 17, 300, 42, 9, 511, 256, 3, 77, 128};
    int n = (int)(sizeof ids / sizeof *ids);
    float *got = forward(&m, &bf16_be, ids, n);
    /* q, k, v, gate, up; o and down one per canonical K chunk (Shard); the LM head */
    int want_mm = m.cfg.n_layers * (5 + 2 * m.shard.chunks) + 1;
    CHECK(bf16_matmuls == want_mm, "%d bf16 matmuls, expected %d", bf16_matmuls, want_mm);

    /* the reference: the CPU backend on the same model, GEMM weights
     * rounded to bf16 in place */
    const Config *c = &m.cfg;
    const Shard *s = &m.shard;
    size_t L = (size_t)c->n_layers, dim = (size_t)c->dim, qd = (size_t)s->q_heads * c->head_dim,
           kvd = (size_t)s->kv_heads * c->head_dim, hid = (size_t)s->hidden;
    Weights *w = &m.w;
    round_to_bf16(w->wq, L * qd * dim);
    round_to_bf16(w->wk, L * kvd * dim);
    round_to_bf16(w->wv, L * kvd * dim);
    round_to_bf16(w->wo, L * dim * qd);
    round_to_bf16(w->w_gate, L * hid * dim);
    round_to_bf16(w->w_up, L * hid * dim);
    round_to_bf16(w->w_down, L * dim * hid);
    round_to_bf16(w->lm_head, (size_t)s->vocab * dim);
    /* the embedding, a GEMM weight's rows (and a tied LM head itself) */
    if (w->token_embedding.data != w->lm_head.data) round_to_bf16(w->token_embedding, (size_t)s->vocab * dim);
    float *want = forward(&m, backend_cpu(), ids, n);
    size_t count = (size_t)n * s->vocab, differ = 0;
    double worst = 0;
    for (size_t i = 0; i < count; i++) {
        differ += got[i] != want[i];
        worst = fmax(worst, fabs((double)got[i] - want[i]));
    }
    fprintf(stderr, "bf16 storage vs bf16-rounded fp32: %zu of %zu logits differ, max %g\n", differ, count, worst);
    CHECK(differ == 0, "%zu logits differ (max %g): a layer read the wrong weights", differ, worst);
    free(got);
    model_free(&m);

    /* bf16 loaded as such (--dtype bfloat16) and computed by the CPU's bf16
     * kernels: exactly the rounded fp32 model's logits, the kernels
     * widening each weight exactly; rows after rows, and in the row groups
     * the CPU asks for (dcpinfer's load: 6 on AVX2) */
    int groups[2] = {0, backend_cpu()->gemm_row_group(DTYPE_BF16)};
    for (int g = 0; g < 2; g++) {
        Model mb;
        CHECK(model_load_as(&mb, NULL, 1, 0, "bfloat16", groups[g]) == 0 && mb.gemm_dtype == DTYPE_BF16 &&
                  mb.w.wq.dtype == DTYPE_BF16 && mb.w.lm_head.dtype == DTYPE_BF16,
              "bf16 load: %s", dcp_error());
        /* grouped exactly where the layout allows: whole steps of 16
         * columns and a whole group of rows */
        const Config *cb = &mb.cfg;
        const Shard *sb = &mb.shard;
        int qdb = sb->q_heads * cb->head_dim, kvdb = sb->kv_heads * cb->head_dim, G = groups[g], grouped = 0;
        const WeightRef *mats[] = {&mb.w.wq, &mb.w.wk, &mb.w.wv, &mb.w.wo, &mb.w.w_gate, &mb.w.w_up, &mb.w.w_down,
                                   &mb.w.lm_head};
        const int rows[] = {qdb, kvdb, kvdb, cb->dim, sb->hidden, sb->hidden, cb->dim, sb->vocab};
        /* o and down: each K chunk a matrix of its own */
        const int cols[] = {cb->dim, cb->dim, cb->dim, qdb / sb->chunks, cb->dim, cb->dim, sb->hidden / sb->chunks,
                            cb->dim};
        for (int i = 0; i < 8; i++) {
            int want_group = G && cols[i] % 16 == 0 && rows[i] >= G ? G : 0;
            CHECK(mats[i]->group == want_group, "row groups %d: matrix %d (%d x %d) has group %d, expected %d", G, i,
                  rows[i], cols[i], mats[i]->group, want_group);
            grouped += mats[i]->group != 0;
        }
        got = forward(&mb, backend_cpu(), ids, n);
        differ = 0;
        for (size_t i = 0; i < count; i++) differ += got[i] != want[i];
        CHECK(differ == 0, "CPU bf16 weights, row groups %d: %zu of %zu logits differ from the bf16-rounded fp32 model",
              groups[g], differ, count);
        if (!differ)
            fprintf(stderr, "bf16 weights in row groups of %d (%d grouped matrices): the rounded fp32 model's logits\n",
                groups[g], grouped);
        free(got);
        model_free(&mb);
    }
    free(want);

    CHECK(model_load(&m, NULL, 1, 0) == 0, "default model: %s", dcp_error());
    m.w.rms_final[3] = NAN;
    RequestSet rs = {0};
    add_request(&rs, ids, 4, 5, 0.0f, 1.0f, 1);
    add_request(&rs, ids, 6, 5, 0.8f, 0.9f, 2);
    Result res[2];
    Timings tm = {0};
    Engine e;
    engine_init(&e, &m, backend_cpu(), NULL, NULL, &tm, NULL);
    GenOptions go = {.max_model_len = 64, .max_num_seqs = 4, .max_batched_tokens = 64};
    generate(&e, &rs, res, &go, NULL);
    for (int i = 0; i < 2; i++)
        CHECK(res[i].n == 0 && res[i].finish_reason && !strcmp(res[i].finish_reason, "error") && rs.r[i].error &&
                  strstr(rs.r[i].error, "logits are not finite"),
              "NaN weights, request %d: %d tokens, finish %s, error %s", i, res[i].n, res[i].finish_reason,
              rs.r[i].error ? rs.r[i].error : "(none)");
    engine_free(&e);
    results_free(res, 2);
    requests_free(&rs);
    model_free(&m);
    MPI_Finalize();
    return test_finish("test_weights");
}
