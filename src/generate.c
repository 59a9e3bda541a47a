#include "generate.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"
#include "util.h"

typedef struct {
    int req;        /* index in the request set */
    int slot;       /* KV cache slot */
    int prefilled;  /* prompt tokens already in the cache */
    Sampler sampler;
} Running;

static void push_token(Result *r, int tok)
{
    if (r->n == r->cap) r->tokens = xrealloc(r->tokens, sizeof(int) * (size_t)(r->cap = r->cap ? 2 * r->cap : 16));
    r->tokens[r->n++] = tok;
}

int is_stop_token(const Config *c, const Request *q, int tok)
{
    for (int i = 0; i < c->n_eos; i++)
        if (tok == c->eos_ids[i]) return 1;
    for (int i = 0; i < q->n_stop; i++)
        if (tok == q->stop_ids[i]) return 1;
    return 0;
}

typedef struct {
    float *full;        /* (rows, vocab): gathered vocabulary shards, tp > 1 */
    float *tmp;         /* the same size, for the gather */
    ValueIndex *pairs;  /* greedy rows' local maxima, for MAXLOC */
    void *scratch;      /* per thread, for top-p */
    size_t scratch_bytes;
    const float **rows; /* per chunk: its full logits row, or NULL */
} PickBuffers;

/* Gathers rows (count, shard.vocab) of every TP rank's vocabulary shard
 * into full (count, vocab). */
static void gather_vocab(Engine *e, const float *local, int count, float *full, float *tmp)
{
    const Topology *tp = e->topo;
    const Config *c = &e->model->cfg;
    int *counts = xmalloc(sizeof(int) * tp->tp), *displs = xmalloc(sizeof(int) * tp->tp);
    for (int r = 0, off = 0; r < tp->tp; r++) {
        int v0, vn;
        balanced_part(c->vocab_size, tp->tp, r, &v0, &vn);
        counts[r] = vn * count;
        displs[r] = off;
        off += counts[r];
    }
    comm_allgatherv(e->comm, local, counts[tp->tp_rank], tmp, counts, displs, tp->tp_comm);
    /* tmp is (rank, row, shard column); full is (row, vocabulary) */
    for (int r = 0; r < tp->tp; r++) {
        int v0, vn;
        balanced_part(c->vocab_size, tp->tp, r, &v0, &vn);
        for (int i = 0; i < count; i++)
            memcpy(full + (size_t)i * c->vocab_size + v0, tmp + displs[r] + (size_t)i * vn, sizeof(float) * vn);
    }
    free(counts);
    free(displs);
}

/* Chooses the next token of every sampling chunk. local holds this rank's
 * vocabulary shard of R rows (one per chunk, or one per token with
 * on_logits). With tensor parallelism greedy rows take the global argmax
 * by MPI_MAXLOC (lowest index wins ties) and sampled rows gather the whole
 * vocabulary, so every rank of the group picks the same token. */
static void pick_tokens(Engine *e, Running *run, const int *chunk_run, const Chunk *chunks, int nc, int R,
                        const int *sampling, RequestSet *rs, float *local, PickBuffers *b, const GenOptions *o,
                        int *out)
{
    const Shard *s = &e->model->shard;
    int vocab = e->model->cfg.vocab_size, tp = e->topo->tp;
    const float *full = local;
    if (tp > 1 && o->on_logits) {
        gather_vocab(e, local, R, b->full, b->tmp);
        full = b->full;
    }
    /* last row of each chunk */
    for (int i = 0, row = 0; i < nc; i++) {
        int rows = o->on_logits ? chunks[i].n : 1;
        if (o->on_logits)
            for (int j = 0; j < chunks[i].n; j++)
                o->on_logits(o->on_logits_ctx, run[chunk_run[i]].req, chunks[i].pos0 + j,
                             full + (size_t)(row + j) * vocab, vocab);
        b->rows[i] = sampling[i] ? full + (size_t)(row + rows - 1) * (full == local ? s->vocab : vocab) : NULL;
        row += rows;
    }
    if (tp > 1 && !o->on_logits) {
        /* greedy: local maxima, then MAXLOC; sampled: gather their rows */
        int ng = 0, ns = 0;
        for (int i = 0; i < nc; i++) {
            if (!sampling[i]) continue;
            if (rs->r[run[chunk_run[i]].req].temperature == 0.0f) {
                int a = argmax_f32(b->rows[i], s->vocab);
                b->pairs[ng++] = (ValueIndex){b->rows[i][a], s->vocab0 + a};
            } else {
                memmove(local + (size_t)ns++ * s->vocab, b->rows[i], sizeof(float) * s->vocab);
            }
        }
        if (ng) comm_argmax(e->comm, b->pairs, ng, e->topo->tp_comm);
        if (ns) gather_vocab(e, local, ns, b->full, b->tmp);
        ng = ns = 0;
        for (int i = 0; i < nc; i++) {
            if (!sampling[i]) continue;
            if (rs->r[run[chunk_run[i]].req].temperature == 0.0f) {
                out[i] = b->pairs[ng++].index;
                b->rows[i] = NULL;
            } else {
                b->rows[i] = b->full + (size_t)ns++ * vocab;
            }
        }
    }
    /* requests sample independently, each from its own generator */
#pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < nc; i++)
        if (b->rows[i])
            out[i] = sampler_sample(&run[chunk_run[i]].sampler, (float *)b->rows[i], vocab,
                                    (char *)b->scratch + b->scratch_bytes * (size_t)omp_get_thread_num());
}

int generate(Engine *e, RequestSet *rs, Result *res, const GenOptions *o)
{
    const Config *c = &e->model->cfg;
    int vocab = c->vocab_size;
    Timings *tm = e->tm;
    memset(res, 0, sizeof(Result) * (size_t)rs->n);
    int *waiting = xmalloc(sizeof(int) * (size_t)rs->n);
    int n_waiting = 0, next_wait = 0, done = 0;
    for (int i = 0; i < rs->n; i++) {
        if (rs->r[i].error) {
            res[i].finish_reason = "error";
            done++;
        } else {
            waiting[n_waiting++] = i;
        }
    }
    Running *run = xmalloc(sizeof(Running) * (size_t)o->max_num_seqs);
    int n_run = 0;
    int cap_T = o->max_batched_tokens + o->max_num_seqs;
    int *tokens = xmalloc(sizeof(int) * (size_t)cap_T);
    Chunk *chunks = xmalloc(sizeof(Chunk) * (size_t)o->max_num_seqs);
    int *chunk_run = xmalloc(sizeof(int) * (size_t)o->max_num_seqs);
    size_t logits_rows = o->on_logits ? (size_t)cap_T : (size_t)o->max_num_seqs;
    float *local = xmalloc(sizeof(float) * logits_rows * e->model->shard.vocab);
    PickBuffers bufs = {0};
    bufs.full = e->topo->tp > 1 ? xmalloc(sizeof(float) * logits_rows * vocab) : NULL;
    bufs.tmp = e->topo->tp > 1 ? xmalloc(sizeof(float) * logits_rows * vocab) : NULL;
    bufs.pairs = xmalloc(sizeof(ValueIndex) * (size_t)o->max_num_seqs);
    bufs.scratch_bytes = sampler_scratch_bytes(vocab);
    bufs.scratch = xmalloc(bufs.scratch_bytes * (size_t)omp_get_max_threads());
    bufs.rows = xmalloc(sizeof(float *) * (size_t)o->max_num_seqs);
    int *sampling = xmalloc(sizeof(int) * (size_t)o->max_num_seqs);
    int *sampled = xmalloc(sizeof(int) * (size_t)o->max_num_seqs);
    double t_start = now_s(), last_progress = t_start;
    long generated = 0;

    while (done < rs->n) {
        /* admit FIFO while there is room */
        while (next_wait < n_waiting && n_run < o->max_num_seqs) {
            int ri = waiting[next_wait++];
            Request *q = &rs->r[ri];
            int cap = q->n_prompt + q->max_tokens;
            if (cap > o->max_model_len) cap = o->max_model_len;
            Running *r = &run[n_run++];
            r->req = ri;
            r->slot = engine_seq_alloc(e, cap);
            r->prefilled = 0;
            sampler_init(&r->sampler, q->temperature, q->top_p, q->seed);
        }
        /* decode tokens first, then prefill chunks under the token budget */
        int T = 0, nc = 0, budget = o->max_batched_tokens, any_prefill = 0;
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < n_run; i++) {
                Running *r = &run[i];
                Request *q = &rs->r[r->req];
                Result *out = &res[r->req];
                int decoding = r->prefilled == q->n_prompt;
                if (decoding != (pass == 0)) continue;
                int n = decoding ? 1 : q->n_prompt - r->prefilled;
                if (!decoding && n > budget) n = budget;
                if (n <= 0) continue;
                if (decoding) {
                    chunks[nc] = (Chunk){r->slot, q->n_prompt + out->n - 1, 1};
                    tokens[T] = out->tokens[out->n - 1];
                } else {
                    chunks[nc] = (Chunk){r->slot, r->prefilled, n};
                    memcpy(tokens + T, q->prompt_tokens + r->prefilled, sizeof(int) * (size_t)n);
                    any_prefill = 1;
                }
                chunk_run[nc++] = i;
                T += n;
                budget -= n;
            }

        double t0 = now_s();
        e->comm->phase = any_prefill ? PHASE_PREFILL : PHASE_DECODE;
        engine_forward(e, tokens, chunks, nc, o->on_logits != NULL, local);
        double t1 = now_s();
        if (any_prefill) tm->prefill += t1 - t0;
        else tm->decode += t1 - t0;

        /* which chunks sample: those ending at their sequence's last known
         * token; full-vocabulary rows where needed (see pick_tokens) */
        int R = o->on_logits ? T : nc;
        for (int i = 0; i < nc; i++) {
            Running *r = &run[chunk_run[i]];
            Request *q = &rs->r[r->req];
            sampling[i] = 1;
            if (r->prefilled < q->n_prompt) {
                r->prefilled += chunks[i].n;
                sampling[i] = r->prefilled == q->n_prompt;
            }
        }
        pick_tokens(e, run, chunk_run, chunks, nc, R, sampling, rs, local, &bufs, o, sampled);
        double now = now_s();
        for (int i = 0; i < nc; i++) {
            if (!sampling[i]) continue;
            Running *r = &run[chunk_run[i]];
            Request *q = &rs->r[r->req];
            Result *out = &res[r->req];
            int tok = sampled[i];
            push_token(out, tok);
            generated++;
            if (out->n == 1) out->ttft_s = now - t_start;
            if (is_stop_token(c, q, tok)) out->finish_reason = "stop";
            else if (out->n >= q->max_tokens || q->n_prompt + out->n >= o->max_model_len)
                out->finish_reason = "length";
            if (out->finish_reason) {
                out->e2e_s = now - t_start;
                out->tpot_s = out->n > 1 ? (out->e2e_s - out->ttft_s) / (out->n - 1) : 0.0;
            }
        }
        tm->sampling += now_s() - t1;

        /* retire finished requests, keeping admission order */
        int kept = 0;
        for (int i = 0; i < n_run; i++) {
            if (res[run[i].req].finish_reason) {
                engine_seq_free(e, run[i].slot);
                done++;
            } else {
                run[kept++] = run[i];
            }
        }
        n_run = kept;
        if (o->progress && now_s() - last_progress >= 1.0) {
            last_progress = now_s();
            fprintf(stderr, "dcpinfer: %d/%d requests done, %d running, %.1f tokens/s\n", done, rs->n, n_run,
                    generated / (last_progress - t_start));
        }
    }
    free(waiting);
    free(run);
    free(tokens);
    free(chunks);
    free(chunk_run);
    free(local);
    free(bufs.full);
    free(bufs.tmp);
    free(bufs.pairs);
    free(bufs.scratch);
    free(bufs.rows);
    free(sampling);
    free(sampled);
    return 0;
}

int *dp_assign(const RequestSet *rs, int dp)
{
    int *group = xmalloc(sizeof(int) * (size_t)(rs->n ? rs->n : 1));
    int *order = xmalloc(sizeof(int) * (size_t)(rs->n ? rs->n : 1));
    long long *load = xcalloc((size_t)dp, sizeof(long long));
    for (int i = 0; i < rs->n; i++) order[i] = i;
    for (int i = 1; i < rs->n; i++) { /* insertion sort: stable, by prompt length descending */
        int v = order[i], j = i;
        while (j > 0 && rs->r[order[j - 1]].n_prompt < rs->r[v].n_prompt) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = v;
    }
    for (int k = 0; k < rs->n; k++) {
        int i = order[k], best = 0;
        for (int g = 1; g < dp; g++)
            if (load[g] < load[best]) best = g;
        group[i] = best;
        load[best] += rs->r[i].n_prompt + rs->r[i].max_tokens;
    }
    free(order);
    free(load);
    return group;
}

void results_free(Result *res, int n)
{
    for (int i = 0; i < n; i++) free(res[i].tokens);
}
