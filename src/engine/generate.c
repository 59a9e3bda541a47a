#include "generate.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"
#include "scheduler.h"
#include "util.h"


typedef struct {
    float *full;        /* (rows, vocab): gathered vocabulary shards, tp > 1 */
    float *tmp;         /* the same size, for the gather */
    ValueIndex *pairs;  /* greedy rows' local maxima, for MAXLOC */
    char *greedy;       /* per row: its request samples greedily */
    const int **drafts; /* per chunk: its drafted tokens */
    void *scratch;      /* per thread, for top-p */
    size_t scratch_bytes;
    const float **rows; /* per logit row: its full logits row where it samples, or NULL */
    int *counts, *displs; /* per TP rank: its vocabulary shard, for the gather */
    /* log-probabilities: one job per scored position */
    struct LogprobJob *jobs;
    float *lp_rows;       /* raw shard rows of sampled positions, before sampling changes them */
    float *recs, *all_recs; /* this rank's records (logprob_record), and every TP rank's */
    int *seen;            /* a request's output and drafts, for the penalties; grown as needed */
    size_t seen_cap;
} PickBuffers;

/* A position whose log-probabilities a request asks for: the logits row
 * (this rank's shard) and the token scored (a prompt token, or the one
 * sampled there). */
typedef struct LogprobJob {
    const float *row;
    int chosen, k;
    int chunk;  /* sampled: the chunk whose token it is; -1 for a prompt token */
    int req, pos; /* prompt token: the request and the position scored */
} LogprobJob;

/* Gathers rows (count, shard.vocab) of every TP rank's vocabulary shard
 * into full (count, vocab), as many rows at a time as MPI's int counts and
 * displacements allow (a 151K vocabulary: 14,000 rows). */
static void gather_vocab(Engine *e, PickBuffers *b, const float *local, int count, float *full, float *tmp)
{
    const Topology *tp = e->env.topo;
    const Config *c = &e->env.model->cfg;
    const Shard *s = &e->env.model->shard;
    int *counts = b->counts, *displs = b->displs;
    int per_call = (int)(INT_MAX / c->vocab_size);
    for (int row0 = 0; row0 < count; row0 += per_call) {
        int rows = count - row0 < per_call ? count - row0 : per_call;
        for (int r = 0, off = 0; r < tp->tp; r++) {
            int v0, vn;
            balanced_part(c->vocab_size, tp->tp, r, &v0, &vn);
            counts[r] = vn * rows;
            displs[r] = off;
            off += counts[r];
        }
        comm_allgatherv(e->env.comm, local + (size_t)row0 * s->vocab, counts[tp->tp_rank], tmp, counts, displs,
                        GROUP_TP);
        /* tmp is (rank, row, shard column); full is (row, vocabulary) */
        for (int r = 0; r < tp->tp; r++) {
            int v0, vn;
            balanced_part(c->vocab_size, tp->tp, r, &v0, &vn);
            for (int i = 0; i < rows; i++)
                memcpy(full + (size_t)(row0 + i) * c->vocab_size + v0, tmp + displs[r] + (size_t)i * vn,
                       sizeof(float) * vn);
        }
    }
}

/* The jobs of a step: its prompt positions with prompt_logprobs (recorded
 * now, as the rows may be overwritten by the token choice) and its sampled
 * rows with logprobs (their raw rows copied, recorded once the token is
 * chosen). Returns the jobs; *kmax: the most top tokens asked. */
static int logprob_jobs(Engine *e, Scheduler *sch, const StepPlan *p, const float *local, int all, PickBuffers *b,
                        int *kmax)
{
    const Shard *s = &e->env.model->shard;
    int nj = 0, n_copy = 0;
    *kmax = 0;
    for (int i = 0; i < p->nc; i++) {
        const Request *q = &sch->rs->r[p->req[i]];
        int row0 = i ? p->row_end[i - 1] : 0, rows = p->row_end[i] - row0;
        for (int j = 0; all && q->prompt_logprobs >= 0 && j < rows; j++) {
            int pos = p->chunks[i].pos0 + j + 1;
            if (pos >= q->n_prompt) break;
            b->jobs[nj++] = (LogprobJob){local + (size_t)(row0 + j) * s->vocab, q->prompt_tokens[pos],
                                         q->prompt_logprobs, -1, p->req[i], pos};
            *kmax = q->prompt_logprobs > *kmax ? q->prompt_logprobs : *kmax;
        }
        for (int row = p->row_end[i] - 1 - p->drafts[i]; p->samples[i] && q->logprobs >= 0 && row < p->row_end[i];
             row++) {
            float *copy = b->lp_rows + (size_t)n_copy++ * s->vocab;
            memcpy(copy, local + (size_t)row * s->vocab, sizeof(float) * s->vocab);
            b->jobs[nj++] = (LogprobJob){copy, -1, q->logprobs, row, p->req[i], -1};
            *kmax = q->logprobs > *kmax ? q->logprobs : *kmax;
        }
    }
    return nj;
}

/* A row whose token was not chosen: a draft before it was rejected */
#define ROW_UNSAMPLED (-2)

/* The log-probabilities of one phase's jobs: prompt positions (phase 0,
 * while their rows are intact) or sampled rows (phase 1, once their
 * tokens are chosen; rows after a rejected draft have none). Each rank
 * records its shard, the TP group gathers the records, and each row's
 * log-sum-exp comes from the maximum over the shards and the shards'
 * exact integer sums (lse_fixed). */
static void logprob_finish(Engine *e, Scheduler *sch, StepPlan *p, PickBuffers *b, int nj, int kmax,
                           const int *out, int sampled_phase)
{
    const Shard *s = &e->env.model->shard;
    size_t stride = LOGPROB_RECORD(kmax);
    int n = 0, *job = xmalloc(sizeof(int) * (size_t)(nj ? nj : 1));
    for (int j = 0; j < nj; j++) {
        LogprobJob *jb = &b->jobs[j];
        if ((jb->chunk >= 0) != sampled_phase || (jb->chunk >= 0 && out[jb->chunk] == ROW_UNSAMPLED)) continue;
        if (jb->chunk >= 0) jb->chosen = out[jb->chunk];
        logprob_record(jb->row, s->vocab0, s->vocab, jb->chosen, kmax, b->recs + n * stride);
        job[n++] = j;
    }
    if (!n) { /* the same jobs on every rank of the group: none anywhere */
        free(job);
        return;
    }
    int tp = e->env.topo->tp;
    comm_gather_logprobs(e->env.comm, b->recs, comm_count(n * stride), b->all_recs, GROUP_TP);
    const float *all = tp > 1 ? b->all_recs : b->recs;
    int bits = lse_fixed_bits(e->env.model->cfg.vocab_size);
    float *mx = xmalloc(sizeof(float) * (size_t)n);
    int64_t *sums = xmalloc(sizeof(int64_t) * (size_t)n);
    for (int i = 0; i < n; i++) {
        mx[i] = -INFINITY;
        for (int r = 0; r < tp; r++) mx[i] = fmaxf(mx[i], all[((size_t)r * n + i) * stride]);
        sums[i] = lse_fixed_sum(b->jobs[job[i]].row, s->vocab, mx[i], bits);
    }
    comm_sum_int64(e->env.comm, sums, n, GROUP_TP);
    float *one = xmalloc(sizeof(float) * stride * (size_t)tp);
    for (int i = 0; i < n; i++) {
        const LogprobJob *jb = &b->jobs[job[i]];
        for (int r = 0; r < tp; r++) memcpy(one + r * stride, all + ((size_t)r * n + i) * stride, sizeof(float) * stride);
        TokenLogprobs lp;
        logprob_combine(one, tp, kmax, lse_fixed(mx[i], sums[i], bits), &lp);
        if (jb->chunk >= 0) {
            p->lp[jb->chunk] = lp;
            continue;
        }
        Result *res = &sch->res[jb->req];
        const Request *q = &sch->rs->r[jb->req];
        result_prompt_logprobs(res, q->n_prompt, q->prompt_logprobs);
        res->plp[jb->pos] = lp.lp;
        memcpy(res->ptop_lp + (size_t)jb->pos * jb->k, lp.top_lp, sizeof(float) * (size_t)jb->k);
        memcpy(res->ptop_id + (size_t)jb->pos * jb->k, lp.top_id, sizeof(int) * (size_t)jb->k);
    }
    free(one);
    free(mx);
    free(sums);
    free(job);
}

/* min_tokens: while a request has generated fewer, its stop tokens cannot
 * be chosen, as vLLM masks them (row holds the logits of ids v0..v0+vn-1) */
static void mask_stop_tokens(float *row, int v0, int vn, const Config *c, const Request *q)
{
    for (int k = 0; k < c->n_eos + q->n_stop; k++) {
        int id = k < c->n_eos ? (q->ignore_eos ? -1 : c->eos_ids[k]) : q->stop_ids[k - c->n_eos];
        if (id >= v0 && id < v0 + vn) row[id - v0] = -FLT_MAX;
    }
}

/* Chooses the token of every sampling row: a chunk's last row, or with
 * drafts its last 1 + drafts rows, the j-th of which sees the output so
 * far and the j drafts before it, as a plain decode step after accepting
 * them would. local holds this rank's vocabulary shard of the step's
 * rows. With tensor parallelism greedy rows take the global argmax by
 * MPI_MAXLOC (lowest index wins ties) and sampled rows gather the whole
 * vocabulary, so every rank of the group picks the same token. A
 * request's generator draws once per token it outputs, in order: its
 * rows are sampled one after another until a token differs from the
 * draft its next row was computed with; the rows after it stay
 * ROW_UNSAMPLED. */
static void pick_tokens(Engine *e, Scheduler *sch, StepPlan *p, float *local, int all, PickBuffers *b,
                        const GenOptions *o, int *out)
{
    const Chunk *chunks = p->chunks;
    int nc = p->nc;
    int kmax, nj = logprob_jobs(e, sch, p, local, all, b, &kmax);
    logprob_finish(e, sch, p, b, nj, kmax, out, 0);
    RequestSet *rs = sch->rs;
    const Shard *s = &e->env.model->shard;
    const Config *c = &e->env.model->cfg;
    int vocab = c->vocab_size, tp = e->env.topo->tp;
    const float *full = local;
    if (tp > 1 && o->on_logits) {
        gather_vocab(e, b, local, p->R, b->full, b->tmp);
        full = b->full;
    }
    int v0 = full == local ? s->vocab0 : 0, vn = full == local ? s->vocab : vocab;
    for (int r = 0; r < p->R; r++) b->rows[r] = NULL, out[r] = ROW_UNSAMPLED;
    for (int i = 0, t0 = 0; i < nc; t0 += chunks[i++].n) {
        int row0 = i ? p->row_end[i - 1] : 0, d = p->drafts[i];
        if (o->on_logits)
            for (int j = 0; j < chunks[i].n; j++)
                o->on_logits(o->on_logits_ctx, p->req[i], chunks[i].pos0 + j, full + (size_t)(row0 + j) * vocab, vocab);
        if (!p->samples[i]) continue;
        const Request *q = &rs->r[p->req[i]];
        const Result *res = &sch->res[p->req[i]];
        const int *drafts = b->drafts[i] = p->tokens + t0 + chunks[i].n - d;
        int *seen = NULL; /* the output so far and the drafts, for the penalties */
        if (d && sampler_adjusts(q)) {
            if ((size_t)(res->n + d) > b->seen_cap)
                b->seen = xrealloc(b->seen, sizeof(int) * (b->seen_cap = 2 * (size_t)(res->n + d)));
            seen = b->seen;
            if (res->n) memcpy(seen, res->tokens, sizeof(int) * (size_t)res->n);
            memcpy(seen + res->n, drafts, sizeof(int) * (size_t)d);
        }
        for (int j = 0, r = p->row_end[i] - 1 - d; j <= d; j++, r++) {
            float *row = (float *)full + (size_t)r * vn;
            b->rows[r] = row;
            b->greedy[r] = q->temperature == 0.0f;
            /* logit_bias and the penalties: on the shard's logits before
             * greedy's argmax and the gather, as vLLM applies them before
             * either */
            if (sampler_adjusts(q)) sampler_adjust(row, v0, vn, q, seen ? seen : res->tokens, res->n + j);
            if (res->n + j < q->min_tokens) mask_stop_tokens(row, v0, vn, c, q);
        }
    }
    if (tp > 1 && !o->on_logits) {
        /* greedy: local maxima, then MAXLOC; sampled: gather their rows */
        int ng = 0, ns = 0;
        for (int r = 0; r < p->R; r++) {
            if (!b->rows[r]) continue;
            if (b->greedy[r]) {
                /* a shard with a NaN or inf makes the group's MAXLOC give
                 * SAMPLE_NONFINITE (+inf, lowest index) on every rank */
                int a = argmax_f32(b->rows[r], s->vocab);
                b->pairs[ng++] = logits_finite(b->rows[r], s->vocab) ? (ValueIndex){b->rows[r][a], s->vocab0 + a}
                                                                     : (ValueIndex){INFINITY, SAMPLE_NONFINITE};
            } else {
                memmove(local + (size_t)ns++ * s->vocab, b->rows[r], sizeof(float) * s->vocab);
            }
        }
        if (ng) comm_argmax(e->env.comm, b->pairs, ng, GROUP_TP);
        if (ns) gather_vocab(e, b, local, ns, b->full, b->tmp);
        ng = ns = 0;
        for (int r = 0; r < p->R; r++) {
            if (!b->rows[r]) continue;
            if (b->greedy[r]) {
                out[r] = b->pairs[ng++].index;
                b->rows[r] = NULL;
            } else {
                b->rows[r] = b->full + (size_t)ns++ * vocab;
            }
        }
    }
    /* requests sample independently, each from its own generator, its
     * rows in order while their drafts hold */
#pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < nc; i++) {
        if (!p->samples[i]) continue;
        int d = p->drafts[i], r = p->row_end[i] - 1 - d;
        const int *drafts = b->drafts[i];
        for (int j = 0; j <= d; j++, r++) {
            if (b->rows[r])
                out[r] = sampler_sample(&sch->seq[p->req[i]].sampler, (float *)b->rows[r], vocab,
                                        (char *)b->scratch + b->scratch_bytes * (size_t)omp_get_thread_num());
            if (j == d || out[r] != drafts[j] || out[r] == SAMPLE_NONFINITE) break;
        }
    }
    if (nj) logprob_finish(e, sch, p, b, nj, kmax, out, 1);
}

/* Speculative decoding's MTP passes (engine_mtp): their inputs and
 * outputs for a step's chunks */
typedef struct {
    int *tokens, *prev_rows, *row_end;
    int *write_at, *chunk_of, *row_of; /* draft steps: per row, where its draft goes and its chunk; per chunk, its row */
    Chunk *chunks;
    float *logits, *hidden, *prev;
    ValueIndex *pairs;
} MtpBuffers;

static void mtp_buffers(MtpBuffers *b, const Model *m, size_t tokens, size_t seqs)
{
    size_t dim = (size_t)m->cfg.dim;
    *b = (MtpBuffers){.tokens = xmalloc(sizeof(int) * tokens), .prev_rows = xmalloc(sizeof(int) * tokens),
                      .row_end = xmalloc(sizeof(int) * seqs), .write_at = xmalloc(sizeof(int) * seqs),
                      .chunk_of = xmalloc(sizeof(int) * seqs),
                      .row_of = xmalloc(sizeof(int) * seqs), .chunks = xmalloc(sizeof(Chunk) * seqs),
                      .logits = xmalloc(sizeof(float) * seqs * (size_t)(m->shard.vocab ? m->shard.vocab : 1)),
                      .hidden = xmalloc(sizeof(float) * seqs * dim), .prev = xmalloc(sizeof(float) * seqs * dim),
                      .pairs = xmalloc(sizeof(ValueIndex) * seqs)};
}

static void mtp_buffers_free(MtpBuffers *b)
{
    void *p[] = {b->tokens, b->prev_rows, b->row_end, b->write_at, b->chunk_of, b->row_of, b->chunks, b->logits, b->hidden,
                 b->prev, b->pairs};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) free(p[i]);
}

/* The drafts: each of R rows' greedy token over the whole vocabulary (the
 * TP group's MAXLOC; lowest index wins ties) into pairs[r].index; a row
 * with a NaN or inf drafts token 0 (verification decides anyway) */
static void mtp_argmax(Engine *e, MtpBuffers *b, int R)
{
    const Shard *s = &e->env.model->shard;
    for (int r = 0; r < R; r++) {
        const float *row = b->logits + (size_t)r * s->vocab;
        int a = argmax_f32(row, s->vocab);
        b->pairs[r] = logits_finite(row, s->vocab) ? (ValueIndex){row[a], s->vocab0 + a}
                                                   : (ValueIndex){INFINITY, SAMPLE_NONFINITE};
    }
    if (e->env.topo->tp > 1 && R) comm_argmax(e->env.comm, b->pairs, R, GROUP_TP);
    for (int r = 0; r < R; r++)
        if (b->pairs[r].index < 0) b->pairs[r].index = 0;
}

/* Draft steps 2..d of every verification chunk, before the step runs
 * (its blocks are taken): step j of a chunk with d > j runs the MTP layer
 * on draft j at the position of the token before it, from the hidden
 * state step j - 1 left there (the request's own after the last step's
 * pass, for j = 1), and its greedy token becomes draft j + 1. passes:
 * the steps to run (DP groups in lockstep run K - 1 each, idle where
 * they have none); -1: as many as the step's drafts need. */
static void mtp_draft_steps(Engine *e, Scheduler *sch, StepPlan *p, MtpBuffers *b, int passes)
{
    size_t dim = (size_t)e->env.model->cfg.dim;
    if (passes < 0) {
        passes = 0;
        for (int i = 0; i < p->nc; i++) passes = p->drafts[i] - 1 > passes ? p->drafts[i] - 1 : passes;
    }
    for (int j = 1; j <= passes; j++) {
        int n = 0;
        for (int i = 0, t0 = 0; i < p->nc; t0 += p->chunks[i++].n) {
            const Chunk *c = &p->chunks[i];
            int d = p->drafts[i], pending = c->n - d - 1;
            if (d <= j) continue;
            const float *prev = j == 1 ? sch->seq[p->req[i]].mtp_hidden : b->hidden + (size_t)b->row_of[i] * dim;
            memcpy(b->prev + (size_t)n * dim, prev, sizeof(float) * dim);
            b->tokens[n] = p->tokens[t0 + pending + j];
            b->chunks[n] = (Chunk){c->blocks, c->n_blocks, c->pos0 + pending + j - 1, 1};
            b->write_at[n] = t0 + pending + j + 1;
            b->chunk_of[n++] = i;
        }
        if (!n) {
            engine_mtp_idle(e);
            continue;
        }
        engine_mtp(e, b->tokens, b->chunks, n, NULL, b->prev, NULL, b->logits, b->hidden);
        mtp_argmax(e, b, n);
        for (int k = 0; k < n; k++) {
            p->tokens[b->write_at[k]] = b->pairs[k].index;
            b->row_of[b->chunk_of[k]] = k;
        }
    }
}

/* After the step's tokens are chosen, the MTP layer over every chunk's
 * kept positions (its tokens and the accepted drafts: the K/V of its own
 * cache there), each row taking the token after its position: the next
 * in the chunk, the prompt's next, or the one just chosen. A chunk that
 * samples gets its request's next first draft and hidden state from its
 * last kept row. */
static void mtp_catch_up(Engine *e, Scheduler *sch, const StepPlan *p, const int *sampled, MtpBuffers *b)
{
    const Config *c = &e->env.model->cfg;
    size_t dim = (size_t)c->dim;
    int T = 0, R = 0;
    for (int i = 0, t0 = 0; i < p->nc; t0 += p->chunks[i++].n) {
        const Chunk *ch = &p->chunks[i];
        int d = p->drafts[i], kept = ch->n, next;
        if (p->samples[i]) {
            int row = p->row_end[i] - 1 - d, a = 0;
            const int *drafts = p->tokens + t0 + ch->n - d;
            while (a < d && sampled[row + a] == drafts[a]) a++;
            kept = ch->n - d + a;
            next = sampled[row + a];
        } else {
            next = scheduler_token(sch, p->req[i], ch->pos0 + ch->n);
        }
        for (int k = 0; k < kept; k++) {
            b->tokens[T + k] = k + 1 < kept ? p->tokens[t0 + k + 1] : next >= 0 ? next : c->vocab_size;
            b->prev_rows[T + k] = t0 + k;
        }
        b->chunks[i] = (Chunk){ch->blocks, ch->n_blocks, ch->pos0, kept};
        b->row_end[i] = R += p->samples[i];
        T += kept;
    }
    engine_mtp(e, b->tokens, b->chunks, p->nc, b->prev_rows, NULL, b->row_end, b->logits, b->hidden);
    mtp_argmax(e, b, R);
    for (int i = 0, r = 0; i < p->nc; i++) {
        if (!p->samples[i]) continue;
        SeqState *q = &sch->seq[p->req[i]];
        if (!q->mtp_hidden) q->mtp_hidden = xmalloc(sizeof(float) * dim);
        memcpy(q->mtp_hidden, b->hidden + (size_t)r * dim, sizeof(float) * dim);
        q->mtp_draft = b->pairs[r++].index;
        q->mtp_pos = b->chunks[i].pos0 + b->chunks[i].n;
    }
}

/* 1 when a chunk of the step scores prompt tokens (prompt_logprobs): the
 * step then needs the logits of every position */
static int wants_prompt_logprobs(const Scheduler *sch, const StepPlan *p)
{
    for (int i = 0; i < p->nc; i++) {
        const Request *q = &sch->rs->r[p->req[i]];
        if (q->prompt_logprobs >= 0 && p->chunks[i].pos0 < q->n_prompt - 1) return 1;
    }
    return 0;
}

/* A device backend's counts at a point of the run, and the transports' waits */
typedef struct {
    BackendCounts c;
    long comm_waits;
} DeviceMark;

static DeviceMark device_mark(const Engine *e)
{
    DeviceMark m = {{0}, e->env.comm->device_waits};
    if (e->env.be->counts) m.c = *e->env.be->counts;
    return m;
}

/* What the device did since `m`, into the step's record: a wait is a
 * synchronisation or a download (which waits), outside MPI unless a
 * transport made it */
static void device_step(const Engine *e, const DeviceMark *m, StepRecord *r)
{
    DeviceMark now = device_mark(e);
    long waits = now.c.synchronizes + now.c.downloads - m->c.synchronizes - m->c.downloads;
    r->mpi_syncs = now.comm_waits - m->comm_waits;
    r->host_syncs = waits - r->mpi_syncs;
    r->launches = now.c.launches - m->c.launches;
    r->allocations = now.c.allocations - m->c.allocations;
    r->d2h_copies = now.c.downloads - m->c.downloads;
    r->d2h_bytes = now.c.d2h_bytes - m->c.d2h_bytes;
}

static void record_step(GenStats *st, const StepRecord *r)
{
    if (st->n_steps == st->cap_steps)
        st->steps = xrealloc(st->steps, sizeof(StepRecord) * (size_t)(st->cap_steps = st->cap_steps ? 2 * st->cap_steps : 256));
    st->steps[st->n_steps++] = *r;
}

/* "1h02m", "3m05s", "12s" */
static void format_duration(char *buf, size_t n, double s)
{
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%lds", t);
}

/* The progress line: requests done, tokens/s, KV use, and the time the
 * unfinished requests' remaining token budgets take at the rate so far (an
 * upper bound when requests stop early). With DP it is rank 0's group's. */
static void print_progress(const GenOptions *o, const Scheduler *sch, long generated, double elapsed, double kv_pct)
{
    const RequestSet *rs = sch->rs;
    long left = 0;
    long long prompt = 0, prefilled = 0; /* prompt positions, and those with their K/V stored (or finished) */
    for (int i = 0; i < rs->n; i++) {
        if (rs->r[i].error) continue;
        int n = rs->r[i].n_prompt, c = sch->seq[i].computed;
        prompt += n;
        prefilled += sch->res[i].finish_reason ? n : c < n ? c : n;
        if (!sch->res[i].finish_reason) {
            long cap = (long)sch->max_model_len - rs->r[i].n_prompt, want = rs->r[i].max_tokens;
            left += (want < cap ? want : cap) - sch->res[i].n;
        }
    }
    double rate = elapsed > 0 ? generated / elapsed : 0.0;
    char eta[32] = "?", took[32], group[48] = "";
    if (left <= 0) strcpy(eta, "0s");
    else if (rate > 0 && left / rate < 1) strcpy(eta, "<1s");
    else if (rate > 0) format_duration(eta, sizeof eta, left / rate);
    format_duration(took, sizeof took, elapsed);
    if (o->dp > 1) snprintf(group, sizeof group, "DP group %d of %d: ", o->dp_rank, o->dp);
    int terminal = o->progress == PROGRESS_TERMINAL;
    fprintf(stderr, "%sdcpinfer: %s%d/%d requests done, %d running, %d waiting, prompts %lld/%lld tokens in, "
                    "%.1f tokens/s, KV %.0f%% used, %s elapsed, ETA %s%s",
            terminal ? "\r\033[K" : "", group, sch->done, rs->n, sch->n_running, sch->tail - sch->head, prefilled,
            prompt, rate, kv_pct, took, eta, terminal ? "" : "\n");
    fflush(stderr);
}

int generate(Engine *e, RequestSet *rs, Result *res, const GenOptions *o, GenStats *stats)
{
    const Config *c = &e->env.model->cfg;
    int vocab = c->vocab_size;
    Timings *tm = e->env.tm;
    GenStats local_stats;
    GenStats *st = stats ? stats : &local_stats;
    memset(st, 0, sizeof *st);
    memset(res, 0, sizeof(Result) * (size_t)rs->n);
    Scheduler sch;
    SchedulerLimits limits = {o->max_model_len, o->max_num_seqs, o->max_batched_tokens};
    /* every position's logits (on_logits) need every position computed */
    const Topology *topo = e->env.topo;
    pool_prefix_caching(&e->att.pool, o->prefix_caching && !o->on_logits, topo->dcp, topo->interleave,
                        (int)e->att.kv_dtype);
    scheduler_init(&sch, rs, res, c, e->env.topo, &e->att.pool, &limits);
    sch.tok = o->tok;
    sch.bos = c->bos_id;
    sch.spec = o->spec;
    int prompt_lp = 0, any_lp = 0;
    for (int i = 0; i < rs->n; i++) {
        prompt_lp |= rs->r[i].prompt_logprobs >= 0;
        any_lp |= rs->r[i].prompt_logprobs >= 0 || rs->r[i].logprobs >= 0;
    }
    StepPlan plan;
    plan_init(&plan, &limits);
    /* a step has at most one chunk per request: buffers by the requests
     * there are, not by --max-num-seqs (1M of them would be 128 GB of
     * logits rows at a 32K vocabulary) */
    size_t seqs = (size_t)(o->max_num_seqs < rs->n ? o->max_num_seqs : rs->n > 0 ? rs->n : 1);
    /* rows that sample: one per request, 1 + K with K drafts */
    size_t spec_rows = o->spec.method ? (size_t)(1 + o->spec.k) : 1;
    size_t samples = seqs * spec_rows < (size_t)o->max_batched_tokens ? seqs * spec_rows : (size_t)o->max_batched_tokens;
    size_t logits_rows = o->on_logits || prompt_lp ? (size_t)o->max_batched_tokens : samples;
    size_t full_rows = o->on_logits ? (size_t)o->max_batched_tokens : samples;
    float *local = xmalloc(sizeof(float) * logits_rows * e->env.model->shard.vocab);
    PickBuffers bufs = {0};
    bufs.full = e->env.topo->tp > 1 ? xmalloc(sizeof(float) * full_rows * vocab) : NULL;
    bufs.tmp = e->env.topo->tp > 1 ? xmalloc(sizeof(float) * full_rows * vocab) : NULL;
    if (any_lp) {
        size_t jobs = logits_rows + samples, rec = jobs * LOGPROB_RECORD(MAX_LOGPROBS);
        bufs.jobs = xmalloc(sizeof(LogprobJob) * jobs);
        bufs.lp_rows = xmalloc(sizeof(float) * samples * e->env.model->shard.vocab);
        bufs.recs = xmalloc(sizeof(float) * rec);
        bufs.all_recs = e->env.topo->tp > 1 ? xmalloc(sizeof(float) * rec * (size_t)e->env.topo->tp) : NULL;
    }
    bufs.pairs = xmalloc(sizeof(ValueIndex) * logits_rows);
    bufs.greedy = xmalloc(logits_rows);
    bufs.drafts = xmalloc(sizeof(int *) * seqs);
    bufs.scratch_bytes = sampler_scratch_bytes(vocab);
    bufs.scratch = xmalloc(bufs.scratch_bytes * (size_t)omp_get_max_threads());
    bufs.rows = xmalloc(sizeof(float *) * logits_rows);
    bufs.counts = xmalloc(sizeof(int) * (size_t)e->env.topo->tp);
    bufs.displs = xmalloc(sizeof(int) * (size_t)e->env.topo->tp);
    int *sampled = xmalloc(sizeof(int) * logits_rows);
    int *finished = xmalloc(sizeof(int) * seqs);
    double t_start = now_s(), last_progress = t_start;
    long generated = 0;
    int shown = 0, behind = 0; /* a line shown; a step since the last line */

    /* expert parallelism across DP groups: every rank enters every MoE
     * layer's exchange, so the groups step together while any has work,
     * and one without runs an idle pass (engine_idle) */
    int lockstep = topo->expert_parallel && topo->dp > 1, stuck = 0;
    int mtp = o->spec.method == SPEC_MTP && e->mtp;
    MtpBuffers mtp_bufs = {0};
    if (mtp) mtp_buffers(&mtp_bufs, e->env.model, (size_t)o->max_batched_tokens, seqs);
    for (;;) {
        int have = !stuck && scheduler_plan(&sch, &plan);
        if (have && plan.nc == 0) { /* cannot happen while every request fits the cache alone */
            for (int i = 0; i < rs->n; i++)
                if (!res[i].finish_reason) {
                    request_fail(&rs->r[i], "%s:%d: request \"%s\": the scheduler could not place it", rs->path,
                                 rs->r[i].line, rs->r[i].id);
                    res[i].finish_reason = "error";
                }
            have = 0, stuck = 1;
        }
        if (lockstep && comm_any(e->env.comm, have, GROUP_WORLD) && !have) {
            e->env.comm->phase = PHASE_DECODE;
            /* the MTP passes of a step, in its order: draft steps, the model, the catch-up */
            for (int j = 0; mtp && j < o->spec.k - 1; j++) engine_mtp_idle(e);
            engine_idle(e);
            if (mtp) engine_mtp_idle(e);
            if (o->on_step) o->on_step(o->on_step_ctx, finished, 0); /* alive, for the watchdog */
            continue;
        }
        if (!have) break;
        double t0 = now_s();
        DeviceMark mark = device_mark(e);
        e->env.comm->phase = plan.prefill_tokens ? PHASE_PREFILL : PHASE_DECODE;
        int all = o->on_logits || (prompt_lp && wants_prompt_logprobs(&sch, &plan));
        plan_rows(&plan, all);
        if (mtp) mtp_draft_steps(e, &sch, &plan, &mtp_bufs, lockstep ? o->spec.k - 1 : -1);
        engine_forward(e, plan.tokens, plan.chunks, plan.nc, plan.row_end, local);
        double t1 = now_s();
        if (plan.prefill_tokens) tm->prefill += t1 - t0;
        else tm->decode += t1 - t0;
        pick_tokens(e, &sch, &plan, local, all, &bufs, o, sampled);
        double t2 = now_s();
        tm->sampling += t2 - t1;
        if (mtp) { /* the MTP layer's pass counts with the step's model time */
            mtp_catch_up(e, &sch, &plan, sampled, &mtp_bufs);
            double t3 = now_s();
            if (plan.prefill_tokens) tm->prefill += t3 - t2;
            else tm->decode += t3 - t2;
            t2 = t3;
        }
        StepRecord rec = {.t_start = t0 - t_start, .seconds = t2 - t0, .decode_tokens = plan.decode_tokens,
                          .prefill_tokens = plan.prefill_tokens, .cached_tokens = plan.cached_tokens,
                          .running = plan.nc, .waiting = sch.tail - sch.head,
                          .preempted = plan.preempted, .kv_blocks_used = pool_used(&e->att.pool)};
        device_step(e, &mark, &rec);
        for (int i = 0; i < plan.nc; i++) generated -= res[plan.req[i]].n;
        scheduler_commit(&sch, &plan, sampled, t2 - t_start);
        rec.spec_drafted = plan.spec_drafted;
        rec.spec_accepted = plan.spec_accepted;
        int n_finished = 0;
        for (int i = 0; i < plan.nc; i++) {
            generated += res[plan.req[i]].n;
            const char *fin = res[plan.req[i]].finish_reason;
            if (plan.samples[i] && fin && strcmp(fin, "error")) finished[n_finished++] = plan.req[i];
        }
        if (o->on_step) o->on_step(o->on_step_ctx, finished, n_finished);
        record_step(st, &rec);
        behind = 1;
        if (o->progress && now_s() - last_progress >= o->progress_interval) {
            last_progress = now_s();
            print_progress(o, &sch, generated, last_progress - t_start,
                           100.0 * rec.kv_blocks_used / (e->att.pool.n_blocks ? e->att.pool.n_blocks : 1));
            shown = 1, behind = 0;
        }
    }
    /* the final state, unless the last line showed it; a terminal's line is
     * then left */
    if (shown && (behind || o->progress == PROGRESS_TERMINAL)) print_progress(o, &sch, generated, now_s() - t_start, 0.0);
    if (shown && o->progress == PROGRESS_TERMINAL) fputc('\n', stderr);
    st->preemptions = sch.preemptions;
    st->kv_positions_peak = sch.kv_positions_peak;
    st->kv_blocks_left = pool_used(&e->att.pool);
    st->evictions = e->att.pool.evictions;
    st->spec_steps = sch.spec_steps;
    memcpy(st->spec_accepted_at, sch.spec_accepted_at, sizeof st->spec_accepted_at);
    scheduler_free(&sch);
    if (mtp) mtp_buffers_free(&mtp_bufs);
    pool_prefix_caching(&e->att.pool, 0, 1, 1, 0); /* the cache lives for one run */
    plan_free(&plan);
    free(local);
    free(bufs.full);
    free(bufs.tmp);
    free(bufs.pairs);
    free(bufs.greedy);
    free(bufs.drafts);
    free(bufs.scratch);
    free(bufs.rows);
    free(bufs.counts);
    free(bufs.displs);
    free(bufs.jobs);
    free(bufs.lp_rows);
    free(bufs.recs);
    free(bufs.all_recs);
    free(bufs.seen);
    free(sampled);
    free(finished);
    if (!stats) free(local_stats.steps);
    return 0;
}

/* requests by size, largest first; file order among equals */
static const RequestSet *dp_order_rs;
static long long dp_weight(int i) { return (long long)dp_order_rs->r[i].n_prompt + dp_order_rs->r[i].max_tokens; }
static int cmp_dp_order(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    long long wx = dp_weight(x), wy = dp_weight(y);
    return wx != wy ? (wx < wy ? 1 : -1) : x - y;
}

int *dp_assign(const RequestSet *rs, int dp, const char *skip)
{
    int *group = xmalloc(sizeof(int) * (size_t)(rs->n ? rs->n : 1));
    int *order = xmalloc(sizeof(int) * (size_t)(rs->n ? rs->n : 1));
    long long *load = xcalloc((size_t)dp, sizeof(long long));
    for (int i = 0; i < rs->n; i++) order[i] = i;
    dp_order_rs = rs;
    qsort(order, (size_t)rs->n, sizeof(int), cmp_dp_order);
    for (int k = 0; k < rs->n; k++) {
        int i = order[k], best = 0;
        if (skip && skip[i]) {
            group[i] = -1;
            continue;
        }
        for (int g = 1; g < dp; g++)
            if (load[g] < load[best]) best = g;
        group[i] = best;
        load[best] += dp_weight(i);
    }
    free(order);
    free(load);
    return group;
}

void dp_select(const RequestSet *rs, const int *group, int g, RequestSet *out, int *index)
{
    *out = (RequestSet){.path = rs->path, .r = xmalloc(sizeof(Request) * (size_t)(rs->n ? rs->n : 1))};
    for (int i = 0; i < rs->n; i++)
        if (group[i] == g) {
            index[out->n] = i;
            out->r[out->n++] = rs->r[i];
        }
}


/* The profiling step's allocations through the backend: those alive now
 * and the most at once */
static struct {
    const Backend *be;
    void **p;
    size_t *bytes;
    size_t n, cap, now, peak;
} prof;

static void *prof_alloc(size_t bytes)
{
    void *p = prof.be->alloc(bytes);
    if (prof.n == prof.cap) {
        prof.cap = prof.cap ? 2 * prof.cap : 64;
        prof.p = xrealloc(prof.p, sizeof(void *) * prof.cap);
        prof.bytes = xrealloc(prof.bytes, sizeof(size_t) * prof.cap);
    }
    prof.p[prof.n] = p;
    prof.bytes[prof.n++] = bytes;
    prof.now += bytes;
    if (prof.now > prof.peak) prof.peak = prof.now;
    return p;
}

static void prof_release(void *p)
{
    for (size_t i = 0; i < prof.n; i++)
        if (prof.p[i] == p) {
            prof.now -= prof.bytes[i];
            prof.p[i] = prof.p[--prof.n];
            prof.bytes[i] = prof.bytes[prof.n];
            break;
        }
    prof.be->release(p);
}

/* The requests of a profiling step of `tokens` prompt tokens: prompts of
 * at most max_model_len - 1 tokens, each to give one token */
static int profile_requests(int tokens, int max_model_len, int *per)
{
    *per = max_model_len - 1 < tokens ? max_model_len - 1 : tokens;
    if (*per < 1) *per = 1;
    return (tokens + *per - 1) / *per;
}

size_t generate_profile_kv(const Model *m, int dcp, const EngineOptions *eo, int tokens, int max_model_len)
{
    KvSizing kv;
    engine_kv_sizing(m, dcp, eo, &kv);
    int per, n = profile_requests(tokens, max_model_len, &per);
    /* every request's positions on every rank, rounded up to whole blocks */
    return ((size_t)tokens + (size_t)(n + 1) * kv.block_size) * kv.bytes_per_token;
}

size_t generate_profile(Engine *e, int tokens, int max_model_len, int dp, int dp_rank)
{
    /* what the step allocates goes through a counting copy of the backend;
     * its collectives, timings and expert counts are not the run's */
    const Backend *real = e->env.be;
    Backend counting = *real;
    counting.alloc = prof_alloc;
    counting.release = prof_release;
    prof = (__typeof__(prof)){.be = real};
    CommStats *cs = e->env.comm;
    CommCounter saved[PHASE_N][COMM_N];
    memcpy(saved, cs->c, sizeof saved);
    Timings *tm = e->env.tm, scratch_tm = {0};
    MoeCounts *mc = e->env.moe_counts, moe_saved = e->moe_counts;
    e->env.be = e->att.be = &counting;
    e->env.tm = &scratch_tm;
    e->env.moe_counts = NULL;

    int per, n = profile_requests(tokens, max_model_len, &per);
    int *ids = xcalloc((size_t)per, sizeof(int));
    for (int i = 0; i < per; i++) ids[i] = e->env.model->cfg.bos_id > 0 ? e->env.model->cfg.bos_id : 0;
    RequestSet rs = {.r = xcalloc((size_t)n, sizeof(Request)), .n = n, .path = "(the profiling step)"};
    for (int i = 0; i < n; i++)
        rs.r[i] = (Request){.id = "profile", .line = i + 1, .prompt_tokens = ids,
                            .n_prompt = i < n - 1 ? per : tokens - per * (n - 1), .max_tokens = 1, .top_p = 1.0f,
                            .x = {.repetition_penalty = 1.0f}, .ignore_eos = 1, .logprobs = -1, .prompt_logprobs = -1,
                            .n_choices = 1};
    Result *res = xcalloc((size_t)n, sizeof(Result));
    GenOptions go = {.max_model_len = max_model_len, .max_num_seqs = n, .max_batched_tokens = tokens, .dp = dp,
                     .dp_rank = dp_rank};
    generate(e, &rs, res, &go, NULL);
    results_free(res, n);
    free(res);
    free(rs.r);
    free(ids);

    e->env.be = e->att.be = real;
    e->env.tm = tm;
    e->env.moe_counts = mc;
    e->moe_counts = moe_saved;
    memcpy(cs->c, saved, sizeof saved);
    free(prof.p);
    free(prof.bytes);
    size_t peak = prof.peak;
    prof = (__typeof__(prof)){0};
    return peak;
}
