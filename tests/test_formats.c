/* One generated model written as llama2.c .bin (adjacent-pair RoPE) and as
 * Hugging Face safetensors (rotate-half RoPE), single file and sharded:
 * all give the same logits (1e-4) at every position. bf16 checkpoints load
 * as the bf16-rounded weights. Shapes include MQA and sizes that do not
 * divide by 8. */
#include "backend.h"
#include "engine.h"
#include "mkmodel_write.h"
#include "model.h"
#include "testutil.h"

enum { NTOK = 23 };

/* logits (NTOK, vocab) of a fixed token sequence, prefilled in two chunks
 * (so both the context and the new attention parts run) */
static float *run_logits(const char *path, int *vocab)
{
    Model m;
    if (model_load(&m, path, 1, 0)) {
        CHECK(0, "load %s: %s", path, dcp_error());
        return NULL;
    }
    Timings tm = {0};
    Engine e;
    engine_init(&e, &m, backend_cpu(), NULL, NULL, &tm, NULL);
    BlockTable table = {0};
    table_reserve(&e.att.pool, &table, kv_blocks_for(e.env.topo, NTOK, e.att.pool.block_size));
    int tokens[NTOK];
    for (int i = 0; i < NTOK; i++) tokens[i] = (i * 37 + 11) % m.cfg.vocab_size;
    *vocab = m.cfg.vocab_size;
    float *logits = xmalloc(sizeof(float) * NTOK * (size_t)*vocab);
    Chunk c1 = {table.ids, table.n, 0, 9}, c2 = {table.ids, table.n, 9, NTOK - 9};
    engine_forward(&e, tokens, &c1, 1, &c1.n, logits);
    engine_forward(&e, tokens + 9, &c2, 1, &c2.n, logits + (size_t)9 * *vocab);
    table_free(&table);
    engine_free(&e);
    model_free(&m);
    return logits;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double w = 0;
    for (size_t i = 0; i < n; i++) w = fmax(w, fabs((double)a[i] - b[i]));
    return w;
}

static void check_shape(const char *dir, ModelSpec s, const char *label)
{
    char hf[4200], bin[4200], sharded[4200];
    snprintf(hf, sizeof hf, "%s/%s-hf", dir, label);
    snprintf(bin, sizeof bin, "%s/%s.bin", dir, label);
    snprintf(sharded, sizeof sharded, "%s/%s-sharded", dir, label);
    CHECK(mkmodel_write_hf(&s, hf, 0, 1) == 0, "write hf: %s", dcp_error());
    CHECK(mkmodel_write_llama2c(&s, bin) == 0, "write llama2c: %s", dcp_error());
    CHECK(mkmodel_write_hf(&s, sharded, 0, 3) == 0, "write sharded: %s", dcp_error());
    int v1 = 0, v2 = 0, v3 = 0;
    float *a = run_logits(hf, &v1), *b = run_logits(bin, &v2), *c = run_logits(sharded, &v3);
    if (a && b && c) {
        double d = max_diff(a, b, (size_t)NTOK * v1);
        fprintf(stderr, "%s: max |logit(hf) - logit(llama2c)| = %.3g\n", label, d);
        CHECK(v1 == s.vocab && v2 == s.vocab && d <= 1e-4, "%s: formats differ by %g", label, d);
        CHECK(max_diff(a, c, (size_t)NTOK * v1) == 0.0, "%s: sharded checkpoint differs", label);
        double spread = 0;
        for (int i = 1; i < v1; i++) spread = fmax(spread, fabs(a[i] - a[0]));
        CHECK(spread > 0.1, "%s: logits are not degenerate (spread %g)", label, spread);
    }
    free(a);
    free(b);
    free(c);
}

static void check_bf16(const char *dir)
{
    ModelSpec s;
    mkmodel_default_spec(&s);
    s.layers = 2;
    char path[4200];
    snprintf(path, sizeof path, "%s/bf16", dir);
    CHECK(mkmodel_write_hf(&s, path, 1, 1) == 0, "write bf16: %s", dcp_error());
    Model m;
    CHECK(model_load(&m, path, 1, 0) == 0, "load bf16: %s", dcp_error());
    Config c;
    mkmodel_config(&s, &c);
    int rows, cols;
    tensor_full_shape(&c, T_WQ, &rows, &cols);
    float *want = xmalloc(sizeof(float) * rows * cols);
    mkmodel_tensor(&s, T_WQ, 1, want);
    int bad = 0;
    for (int i = 0; i < rows * cols; i++) bad += ((const float *)m.w.wq.data)[(size_t)rows * cols + i] != bf16_to_f32(f32_to_bf16(want[i]));
    CHECK(bad == 0, "bf16 layer-1 wq: %d values differ from the rounded f32 weights", bad);
    free(want);
    model_free(&m);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    char *dir = scratch_dir();
    ModelSpec s;
    mkmodel_default_spec(&s);
    s.layers = 3;
    check_shape(dir, s, "gqa");
    /* MQA, 16 query heads, untied */
    s = (ModelSpec){.layers = 4, .dim = 128, .heads = 16, .kv_heads = 1, .hidden = 200, .vocab = 300, .max_len = 64,
                    .tied = 0, .eos = -1, .rope_theta = 10000.0f, .seed = 77};
    check_shape(dir, s, "mqa");
    /* stories260K-like odd sizes: hidden 172, vocab 500, tied */
    s = (ModelSpec){.layers = 2, .dim = 48, .heads = 6, .kv_heads = 3, .hidden = 172, .vocab = 500, .max_len = 64,
                    .tied = 1, .eos = -1, .rope_theta = 10000.0f, .seed = 3};
    check_shape(dir, s, "odd");
    check_bf16(dir);
    remove_tree(dir);
    free(dir);
    MPI_Finalize();
    return test_finish("test_formats");
}
