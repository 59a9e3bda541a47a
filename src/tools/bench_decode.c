/* dcpinfer-bench-decode: one decode step of b requests at context L, timed
 * on the real forward pass, for plain TP and for DCP with each merge
 * backend. The KV shards are filled with random values (the numbers do not
 * matter here, only the shapes). Prints per step: time, the bytes and
 * seconds of the DCP merge collectives, of the TP allreduces, and the KV
 * bytes a rank holds. Times are the slowest rank's (ranks synchronise per
 * step). Step times are taken with no wait inside the step (the logits'
 * copy ends it); the attention / GEMM split from the same steps run
 * again with the device waited for around each phase. */
#include <getopt.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "comm.h"
#include "device.h"
#include "engine.h"
#include "job.h"
#include "model.h"
#include "topology.h"
#include "check.h"
#include "util.h"

typedef struct {
    int dcp;
    MergeBackend merge;
} Variant;

static void fill_random(float *p, size_t n, uint64_t *st)
{
    for (size_t i = 0; i < n; i++) p[i] = (float)((splitmix64(st) >> 40) / 16777216.0) - 0.5f;
}

static const Backend *be;
static int device = -1;

/* One (b, L, variant): prints a row on rank 0. Bandwidth: the bytes the
 * GEMMs must read (this rank's weights, once per step) and the bytes the
 * attention must read (this rank's K/V shard of the batch), over the time
 * of each phase on the slowest rank. */
static void bench(const char *model_path, int tp, Variant v, int b, int L, int steps)
{
    int rank;
    DCP_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    Topology t;
    topology_init(&t, MPI_COMM_WORLD, tp, v.dcp, 1);
    Model m;
    if (model_load(&m, model_path, t.tp, t.tp_rank)) {
        fprintf(stderr, "rank %d: %s\n", rank, dcp_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    Timings tm = {0};
    CommStats cs = {0};
    Engine e;
    /* a pool just large enough for the batch */
    size_t per_seq = (size_t)kv_blocks_for(&t, L + 2 * steps + 1, 16) * 16;
    EngineOptions eo = {.merge = v.merge,
                        .kv_cache_memory = per_seq * b *
                                           kv_bytes_per_position(m.cfg.n_layers, m.shard.kv_heads, m.cfg.head_dim,
                                                                 sizeof(float)),
                        .block_size = 16, .timing_sync = 0, .kv_dtype = DTYPE_F32};
    engine_init(&e, &m, be, &t, &eo, &tm, &cs);
    Chunk *chunks = xmalloc(sizeof(Chunk) * b);
    BlockTable *tables = xcalloc((size_t)b, sizeof(BlockTable));
    int *tokens = xmalloc(sizeof(int) * b);
    uint64_t st = 17 + rank;
    /* random K/V in every block: the numbers do not matter, only the shapes */
    size_t pool_floats = (size_t)e.att.pool.n_blocks * e.att.pool.block_size * m.cfg.n_layers * m.shard.kv_heads * m.cfg.head_dim;
    /* one random chunk of at most 16M floats, repeated over the pool */
    size_t chunk = pool_floats < ((size_t)1 << 24) ? pool_floats : (size_t)1 << 24;
    float *host = xmalloc(sizeof(float) * (chunk ? chunk : 1));
    fill_random(host, chunk, &st);
    for (size_t off = 0; off < pool_floats; off += chunk) {
        size_t n = pool_floats - off < chunk ? pool_floats - off : chunk;
        e.env.be->upload((float *)e.att.k_pool + off, host, sizeof(float) * n);
        if (e.att.v_pool) e.env.be->upload((float *)e.att.v_pool + off, host, sizeof(float) * n); /* MLA: keys only */
        e.env.be->synchronize();
    }
    free(host);
    for (int i = 0; i < b; i++) {
        if (table_reserve(&e.att.pool, &tables[i], kv_blocks_for(&t, L + 2 * steps + 1, 16))) {
            fprintf(stderr, "rank %d: KV pool too small\n", rank);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        chunks[i] = (Chunk){tables[i].ids, tables[i].n, L, 1};
        tokens[i] = i % m.cfg.vocab_size;
    }
    long long kv_bytes = 0;
    for (int i = 0; i < b; i++)
        kv_bytes += (long long)kv_local_len(&t, L, t.dcp_rank) * (long long)engine_kv_bytes_per_token(&e);
    float *logits = xmalloc(sizeof(float) * b * m.shard.vocab);
    cs.phase = PHASE_DECODE;
    engine_forward(&e, tokens, chunks, b, NULL, logits); /* warm-up, not counted */
    for (int i = 0; i < b; i++) chunks[i].pos0++;
    memset(cs.c, 0, sizeof cs.c);
    cs.phase = PHASE_DECODE;
    memset(&tm, 0, sizeof tm);
    double total = 0;
    for (int s = 0; s < steps; s++) {
        DCP_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        double t0 = now_s();
        engine_forward(&e, tokens, chunks, b, NULL, logits);
        double dt = now_s() - t0, worst;
        DCP_CHECK(MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
        total += worst;
        for (int i = 0; i < b; i++) chunks[i].pos0++;
    }
    /* the split into attention and GEMMs: the same steps again, the device
     * waited for around each phase (timing_sync), which the step times
     * above do not pay */
    const CommStats timed = cs;
    memset(&tm, 0, sizeof tm);
    e.env.timing_sync = 1;
    for (int s = 0; s < steps; s++) {
        DCP_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        engine_forward(&e, tokens, chunks, b, NULL, logits);
        for (int i = 0; i < b; i++) chunks[i].pos0++;
    }
    cs = timed;
    const CommCounter *c = cs.c[PHASE_DECODE];
    double merge_s = c[COMM_q_allgather].seconds + c[COMM_merge_exchange].seconds + c[COMM_all_to_all].seconds;
    long long merge_b = c[COMM_q_allgather].bytes + c[COMM_merge_exchange].bytes + c[COMM_all_to_all].bytes;
    double mine[3] = {merge_s, tm.attention, tm.matmul + tm.lm_head}, worst[3];
    DCP_CHECK(MPI_Reduce(mine, worst, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD));
    const Config *cf = &m.cfg;
    const Shard *sh = &m.shard;
    double weight_bytes = 4.0 * ((double)cf->n_layers * ((2.0 * sh->q_heads + 2.0 * sh->kv_heads) * cf->head_dim * cf->dim +
                                                         3.0 * sh->hidden * cf->dim) +
                                 (double)sh->vocab * cf->dim);
    double att_bw = kv_bytes * (double)steps / worst[1], gemm_bw = weight_bytes * steps / worst[2];
    double peak = device_peak_bandwidth(device);
    if (rank == 0) {
        printf("  %5d %7d %4d %-6s %10.3f %12.3f %14lld %14lld %14lld %9.0f %8.1f %9.0f %8.1f %9.0f\n", b, L, v.dcp,
               v.dcp == 1 ? "tp" : v.merge == MERGE_A2A ? "a2a" : "ag_rs", 1e3 * total / steps,
               1e3 * worst[0] / steps, merge_b / steps, c[COMM_tp_sum].bytes / steps, kv_bytes, att_bw / 1e9,
               peak > 0 ? 100.0 * att_bw / peak : 0.0, gemm_bw / 1e9, peak > 0 ? 100.0 * gemm_bw / peak : 0.0,
               b * steps / total);
    }
    for (int i = 0; i < b; i++) table_free(&tables[i]);
    free(tables);
    free(chunks);
    free(tokens);
    free(logits);
    engine_free(&e);
    model_free(&m);
    topology_free(&t);
}

int main(int argc, char **argv)
{
    /* the options first: the GPU is chosen from --backend before MPI_Init */
    int rank = dcp_env_rank(), size;
    const char *model = NULL, *cases = "1:1024,8:1024,8:4096,32:4096", *backend = "cpu";
    int steps = 5, max_dcp = 0;
    static const struct option opts[] = {{"model", 1, 0, 'm'},   {"cases", 1, 0, 'c'},   {"steps", 1, 0, 's'},
                                         {"max-dcp", 1, 0, 'd'}, {"backend", 1, 0, 'b'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'm') model = optarg;
        else if (c == 'c') cases = optarg;
        else if (c == 's') steps = atoi(optarg);
        else if (c == 'd') max_dcp = atoi(optarg);
        else if (c == 'b') backend = optarg;
        else {
            if (rank == 0)
                fprintf(stderr, "usage: mpirun -np N dcpinfer-bench-decode --model PATH [--cases b:L,...] "
                                "[--steps S] [--max-dcp N] [--backend cpu|cuda]\n");
            return 2;
        }
    }
    device = device_select(backend);
    MPI_Init(&argc, &argv);
    DCP_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    DCP_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    backend_set_threads(threads_per_rank(MPI_COMM_WORLD, NULL, NULL));
    be = backend_find(backend);
    if (!be) {
        if (rank == 0) fprintf(stderr, "dcpinfer-bench-decode: %s\n", dcp_error());
        MPI_Finalize();
        return 1;
    }
    Config cfg;
    if (model_read_config(model, &cfg)) {
        if (rank == 0) fprintf(stderr, "dcpinfer-bench-decode: %s\n", dcp_error());
        MPI_Finalize();
        return 1;
    }
    int tp = size, limit = cfg.n_kv_heads < tp ? tp / cfg.n_kv_heads : 1;
    if (max_dcp <= 0 || max_dcp > limit) max_dcp = limit;
    if (rank == 0) {
        printf("# dcpinfer-bench-decode: %d ranks, tp %d, backend %s%s%s, model %s (%d layers, dim %d, %d heads / %d "
               "KV heads, head dim %d), %d timed step(s) per row\n",
               size, tp, be->name, device >= 0 ? " on " : "", device >= 0 ? device_name(device) : "",
               model ? model : "(generated default)", cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads,
               cfg.head_dim, steps);
        if (device_peak_bandwidth(device) > 0)
            printf("# peak memory bandwidth %.0f GB/s; att_%% and gemm_%% are fractions of it\n",
                   device_peak_bandwidth(device) / 1e9);
        printf("# %5s %7s %4s %-6s %10s %12s %14s %14s %14s %9s %8s %9s %8s %9s\n", "batch", "context", "dcp", "merge",
               "step_ms", "merge_ms", "merge_bytes", "allreduce_B", "kv_bytes/rank", "att_GB/s", "att_%", "gemm_GB/s",
               "gemm_%", "tok/s");
    }
    char *list = xstrdup(cases);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int b = 0, L = 0;
        if (sscanf(tok, "%d:%d", &b, &L) != 2 || b < 1 || L < 1) continue;
        bench(model, tp, (Variant){1, MERGE_AG_RS}, b, L, steps);
        for (int n = 2; n <= max_dcp; n *= 2)
            if (limit % n == 0) {
                bench(model, tp, (Variant){n, MERGE_AG_RS}, b, L, steps);
                bench(model, tp, (Variant){n, MERGE_A2A}, b, L, steps);
            }
    }
    free(list);
    MPI_Finalize();
    return 0;
}
