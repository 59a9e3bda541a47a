#include "scheduler.h"

#include <stdlib.h>
#include <string.h>

#include "detok.h"
#include "util.h"

int is_stop_token(const Config *c, const Request *q, int tok)
{
    for (int i = 0; i < c->n_eos && !q->ignore_eos; i++)
        if (tok == c->eos_ids[i]) return 1;
    for (int i = 0; i < q->n_stop; i++)
        if (tok == q->stop_ids[i]) return 1;
    return 0;
}

static int seq_len(const Scheduler *s, int r) { return s->rs->r[r].n_prompt + s->res[r].n; }

static int token_at(const Scheduler *s, int r, int p)
{
    const Request *q = &s->rs->r[r];
    return p < q->n_prompt ? q->prompt_tokens[p] : s->res[r].tokens[p - q->n_prompt];
}

int scheduler_token(const Scheduler *s, int r, int pos) { return token_at(s, r, pos); }

/* A request leaving the running set (finished or preempted) drops its MTP draft */
static void mtp_forget(SeqState *q)
{
    free(q->mtp_hidden);
    q->mtp_hidden = NULL;
    q->mtp_pos = -1;
}

/* the most positions a request can reach */
static int final_len(const Request *q, int max_model_len)
{
    long long n = (long long)q->n_prompt + q->max_tokens;
    return n < max_model_len ? (int)n : max_model_len;
}

void requests_check_kv(RequestSet *rs, const Topology *topo, const BlockPool *pool, int max_model_len)
{
    for (int i = 0; i < rs->n; i++) {
        Request *q = &rs->r[i];
        if (q->error) continue;
        int len = final_len(q, max_model_len), need = kv_blocks_for(topo, len, pool->block_size);
        if (need > pool->n_blocks)
            request_fail(q, "%s:%d: request \"%s\": %d positions need %d KV blocks of %d per rank, the cache has "
                         "%d; raise --kv-cache-memory or lower max_tokens",
                         rs->path, q->line, q->id, len, need, pool->block_size, pool->n_blocks);
    }
}

void scheduler_init(Scheduler *s, RequestSet *rs, Result *res, const Config *cfg, const Topology *topo,
                    BlockPool *pool, const SchedulerLimits *o)
{
    memset(s, 0, sizeof *s);
    s->rs = rs;
    s->res = res;
    s->cfg = cfg;
    s->topo = topo;
    s->pool = pool;
    s->max_num_seqs = o->max_num_seqs;
    s->max_batched_tokens = o->max_batched_tokens;
    s->max_model_len = o->max_model_len;
    int n = rs->n ? rs->n : 1;
    s->seq = xcalloc((size_t)n, sizeof(SeqState));
    if (pool->caching) {
        s->match = xmalloc(sizeof(int) * (size_t)(kv_blocks_for(topo, s->max_model_len, pool->block_size) + 1));
        s->block_buf = xmalloc(sizeof(int) * (size_t)pool->block_tokens);
    }
    s->waiting = xmalloc(sizeof(int) * (size_t)n);
    s->running = xmalloc(sizeof(int) * (size_t)n);
    requests_check_kv(rs, topo, pool, s->max_model_len);
    for (int i = 0; i < rs->n; i++) {
        Request *q = &rs->r[i];
        s->seq[i].admitted = -1;
        s->seq[i].mtp_pos = -1;
        s->seq[i].chain_hash = pool->root;
        res[i].stop_token = -1;
        sampler_init(&s->seq[i].sampler, q->temperature, q->top_p, q->seed);
        sampler_set_extra(&s->seq[i].sampler, &q->x);
        if (q->error) {
            res[i].finish_reason = "error";
            s->done++;
        } else {
            s->waiting[s->tail++] = i;
        }
    }
}

void scheduler_free(Scheduler *s)
{
    for (int i = 0; i < s->rs->n; i++) {
        table_release(s->pool, &s->seq[i].table);
        table_free(&s->seq[i].table);
        mtp_forget(&s->seq[i]);
    }
    free(s->seq);
    free(s->match);
    free(s->block_buf);
    free(s->context);
    free(s->waiting);
    free(s->running);
    memset(s, 0, sizeof *s);
}

void plan_init(StepPlan *p, const SchedulerLimits *o)
{
    memset(p, 0, sizeof *p);
    p->chunks = xmalloc(sizeof(Chunk) * (size_t)o->max_num_seqs);
    p->req = xmalloc(sizeof(int) * (size_t)o->max_num_seqs);
    p->samples = xmalloc(sizeof(int) * (size_t)o->max_num_seqs);
    p->drafts = xmalloc(sizeof(int) * (size_t)o->max_num_seqs);
    p->row_end = xmalloc(sizeof(int) * (size_t)o->max_num_seqs);
    p->tokens = xmalloc(sizeof(int) * (size_t)o->max_batched_tokens);
    p->lp = xmalloc(sizeof(TokenLogprobs) * (size_t)o->max_batched_tokens);
}

int plan_rows(StepPlan *p, int all)
{
    p->R = 0;
    for (int i = 0; i < p->nc; i++) p->row_end[i] = p->R += all ? p->chunks[i].n : 1 + p->drafts[i];
    return p->R;
}

void plan_free(StepPlan *p)
{
    free(p->chunks);
    free(p->req);
    free(p->samples);
    free(p->drafts);
    free(p->row_end);
    free(p->tokens);
    free(p->lp);
    memset(p, 0, sizeof *p);
}

/* The tokens of logical block b of request r: in its prompt, or copied
 * into block_buf where the block reaches its output. */
static const int *block_tokens(Scheduler *s, int r, int b)
{
    const Request *q = &s->rs->r[r];
    int n = s->pool->block_tokens, p0 = b * n;
    if (p0 + n <= q->n_prompt) return q->prompt_tokens + p0;
    for (int j = 0; j < n; j++) s->block_buf[j] = token_at(s, r, p0 + j);
    return s->block_buf;
}

static void chain_reset(Scheduler *s, SeqState *q)
{
    q->chain_blocks = 0;
    q->chain_hash = s->pool->root;
    q->chain_serial = 0;
}

/* The cached blocks request r can start from (into s->match): the longest
 * chain of them holding its first tokens, short of its last token, whose
 * logits it needs. A request that scores its prompt (prompt_logprobs)
 * computes every position. Advances r's chain over them. */
static int match_prefix(Scheduler *s, int r)
{
    const Request *rq = &s->rs->r[r];
    SeqState *q = &s->seq[r];
    if (!s->pool->caching || rq->prompt_logprobs >= 0) return 0;
    int most = (seq_len(s, r) - 1) / s->pool->block_tokens, b;
    for (b = 0; b < most; b++) {
        const int *t = block_tokens(s, r, b);
        uint64_t h = prefix_hash(s->pool, q->chain_hash, t);
        int id = prefix_find(s->pool, h, q->chain_serial, t);
        if (id < 0) break;
        s->match[b] = id;
        q->chain_hash = h;
        q->chain_serial = prefix_serial(s->pool, id);
    }
    q->chain_blocks = b;
    return b;
}

/* Records request r's blocks that are full of stored positions. */
static void record_full_blocks(Scheduler *s, int r)
{
    SeqState *q = &s->seq[r];
    int n = s->pool->block_tokens;
    for (; (q->chain_blocks + 1) * n <= q->computed; q->chain_blocks++) {
        const int *t = block_tokens(s, r, q->chain_blocks);
        uint64_t h = prefix_hash(s->pool, q->chain_hash, t);
        q->chain_serial = prefix_record(s->pool, q->table.ids[q->chain_blocks], h, q->chain_serial, t);
        q->chain_hash = h;
    }
}

/* Frees the request's blocks and puts it back at the front of the queue;
 * its output so far stays and is recomputed on readmission, from whatever
 * of its blocks are still cached then. */
static void preempt_last(Scheduler *s)
{
    int r = s->running[--s->n_running];
    table_release(s->pool, &s->seq[r].table);
    chain_reset(s, &s->seq[r]);
    mtp_forget(&s->seq[r]);
    s->seq[r].computed = 0;
    s->seq[r].admitted = -1;
    s->waiting[--s->head] = r;
    s->preemptions++;
}

/* Request r's next n pending tokens as a chunk, and after them the d
 * tokens drafted (d > 0 only when those n end its sequence). */
static void add_chunk(Scheduler *s, StepPlan *p, int r, int n, const int *drafted, int d)
{
    SeqState *q = &s->seq[r];
    Chunk *c = &p->chunks[p->nc];
    c->blocks = q->table.ids;
    c->n_blocks = q->table.n;
    c->pos0 = q->computed;
    c->n = n + d;
    p->req[p->nc] = r;
    p->samples[p->nc] = q->computed + n == seq_len(s, r);
    p->drafts[p->nc] = d;
    for (int j = 0; j < n; j++) p->tokens[p->T + j] = token_at(s, r, q->computed + j);
    if (d) memcpy(p->tokens + p->T + n, drafted, sizeof(int) * (size_t)d);
    if (n == 1 && q->computed >= s->rs->r[r].n_prompt) p->decode_tokens += 1 + d;
    else p->prefill_tokens += n;
    p->spec_drafted += d;
    p->row_end[p->nc] = p->R += 1 + d;
    p->T += n + d;
    p->nc++;
}

/* The tokens drafted for decoding request r (into out), within `room`
 * rows beyond its pending one: none while it is not decoding, and never
 * so many that its output could pass max_tokens or the context limit.
 * With "mtp", the MTP layer's draft from the last step and as many
 * copies of it as further drafts, which the engine's draft steps replace
 * (generate.c) once their blocks are taken. */
static int draft(Scheduler *s, int r, int room, int *out)
{
    const Request *q = &s->rs->r[r];
    const Result *res = &s->res[r];
    int len = seq_len(s, r), k = s->spec.k;
    if (!s->spec.method || res->n < 1 || len - s->seq[r].computed != 1) return 0;
    if (s->spec.method == SPEC_MTP && s->seq[r].mtp_pos != len - 1) return 0;
    /* a step of 1 + k rows emits at most 1 + k tokens */
    if (k > room) k = room;
    if (k > q->max_tokens - res->n - 1) k = q->max_tokens - res->n - 1;
    if (k > s->max_model_len - len - 1) k = s->max_model_len - len - 1;
    if (k <= 0) return 0;
    if (s->spec.method == SPEC_MTP) {
        for (int j = 0; j < k; j++) out[j] = s->seq[r].mtp_draft;
        return k;
    }
    if (!s->context) s->context = xmalloc(sizeof(int) * (size_t)s->max_model_len);
    memcpy(s->context, q->prompt_tokens, sizeof(int) * (size_t)q->n_prompt);
    memcpy(s->context + q->n_prompt, res->tokens, sizeof(int) * (size_t)res->n);
    return spec_ngram_propose(s->context, len, s->spec.lookup_min, s->spec.lookup_max, k, out);
}

/* The blocks request r lacks for its pending tokens and d more */
static int missing_blocks(const Scheduler *s, int r, int d)
{
    const SeqState *q = &s->seq[r];
    int m = kv_blocks_for(s->topo, seq_len(s, r) + d, s->pool->block_size) - q->table.n;
    return m > 0 ? m : 0;
}

int scheduler_plan(Scheduler *s, StepPlan *p)
{
    p->nc = p->T = p->R = p->prefill_tokens = p->decode_tokens = p->preempted = p->cached_tokens = 0;
    p->spec_drafted = p->spec_accepted = 0;
    int drafted[SPEC_MAX_TOKENS];
    if (s->done == s->rs->n) return 0;
    int budget = s->max_batched_tokens, B = s->pool->block_size;
    long long before = s->preemptions;
    /* the blocks the running requests' pending tokens still need: drafts
     * take only blocks that none of them needs, so they never preempt */
    int later = 0;
    for (int i = 0; s->spec.method && i < s->n_running; i++) later += missing_blocks(s, s->running[i], 0);
    /* running requests, oldest first: their pending tokens */
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        int r = s->running[i];
        SeqState *q = &s->seq[r];
        int n = seq_len(s, r) - q->computed;
        if (n > budget) n = budget;
        int d = draft(s, r, budget - n, drafted);
        if (s->spec.method) later -= missing_blocks(s, r, 0);
        if (d && s->pool->n_free - missing_blocks(s, r, d) < later) d = 0;
        if (d && table_reserve(s->pool, &q->table, kv_blocks_for(s->topo, q->computed + n + d, B)) != 0) d = 0;
        int need = kv_blocks_for(s->topo, q->computed + n, B);
        while (table_reserve(s->pool, &q->table, need) != 0) {
            /* out of blocks: the most recently admitted request makes room,
             * even if that is this one */
            int last = s->running[s->n_running - 1];
            preempt_last(s);
            if (last == r) break;
        }
        if (q->admitted < 0) break; /* r itself was preempted: everything after it is gone too */
        add_chunk(s, p, r, n, drafted, d);
        budget -= n + d;
    }
    p->preempted = (int)(s->preemptions - before);
    /* admit waiting requests, first come first served, unless this step
     * had to preempt */
    while (!p->preempted && s->head < s->tail && s->n_running < s->max_num_seqs && budget > 0) {
        int r = s->waiting[s->head];
        SeqState *q = &s->seq[r];
        int hit = match_prefix(s, r), cached = hit * s->pool->block_tokens;
        int n = seq_len(s, r) - cached;
        if (n > budget) n = budget;
        if (table_share_reserve(s->pool, &q->table, s->match, hit, kv_blocks_for(s->topo, cached + n, B)) != 0) {
            chain_reset(s, q);
            break;
        }
        s->head++;
        /* its first admission's hit is the request's figure; a readmission's
         * counts in the step's */
        if (!q->ever_admitted) s->res[r].num_cached_tokens = cached;
        q->ever_admitted = 1;
        q->admitted = s->admissions++;
        q->computed = cached;
        p->cached_tokens += cached;
        s->running[s->n_running++] = r;
        add_chunk(s, p, r, n, NULL, 0);
        budget -= n;
    }
    return 1;
}

static void push_token(Result *r, const Request *q, int tok, const TokenLogprobs *lp, double now)
{
    result_reserve(r, q->logprobs);
    r->times[r->n] = now;
    if (q->logprobs >= 0) {
        int k = q->logprobs;
        r->lp[r->n] = lp->lp;
        memcpy(r->top_lp + (size_t)r->n * k, lp->top_lp, sizeof(float) * (size_t)k);
        memcpy(r->top_id + (size_t)r->n * k, lp->top_id, sizeof(int) * (size_t)k);
    }
    r->tokens[r->n++] = tok;
}

/* The stop rules after out's newest token tok. */
static void apply_stop_rules(Scheduler *s, const Request *q, Result *out, int tok)
{
    int may_stop = out->n >= q->min_tokens;
    int by_token = may_stop && is_stop_token(s->cfg, q, tok);
    int by_length = out->n >= q->max_tokens || q->n_prompt + out->n >= s->max_model_len;
    if (s->tok) {
        if (!out->text) detok_start(out, q->n_prompt);
        /* a stop token's own text is left out unless include_stop_str_in_output */
        size_t before = detok_update(out, s->tok, q, by_token && !q->include_stop_str ? out->n - 1 : out->n,
                                     s->bos, by_token || by_length);
        int which = 0;
        long at = may_stop && !by_token ? stop_string_find(q, out->text, out->text_len, before, &which) : -1;
        if (at >= 0) {
            out->text_len = (size_t)at + (q->include_stop_str ? strlen(q->stop[which]) : 0);
            out->text[out->text_len] = '\0';
            out->stop_str = xstrdup(q->stop[which]);
            out->finish_reason = "stop";
            return;
        }
    }
    if (by_token) {
        out->finish_reason = "stop";
        out->stop_token = tok;
    } else if (by_length) {
        out->finish_reason = "length";
    }
}

void scheduler_commit(Scheduler *s, StepPlan *p, const int *sampled, double now)
{
    for (int i = 0; i < p->nc; i++) s->seq[p->req[i]].computed += p->chunks[i].n;
    /* drafts' positions count while they are stored */
    long long held = scheduler_kv_positions(s);
    if (held > s->kv_positions_peak) s->kv_positions_peak = held;
    for (int i = 0, t0 = 0; i < p->nc; t0 += p->chunks[i++].n) {
        int r = p->req[i], d = p->drafts[i], accepted = 0;
        if (!p->samples[i]) continue;
        Request *q = &s->rs->r[r];
        Result *out = &s->res[r];
        const int *drafts = p->tokens + t0 + p->chunks[i].n - d;
        /* the rows of the pending token and of the drafts, in order: each
         * row's token is output, and the next row counts while the token
         * equals the draft that row was computed with */
        for (int j = 0, row = p->row_end[i] - 1 - d; j <= d; j++, row++) {
            int tok = sampled[row];
            if (tok == SAMPLE_NONFINITE) {
                request_fail(q, "%s:%d: request \"%s\": %s", s->rs->path, q->line, q->id, NONFINITE_REASON);
                out->finish_reason = "error";
                out->e2e_s = now;
                break;
            }
            push_token(out, q, tok, &p->lp[row], now);
            if (out->n == 1) out->ttft_s = now;
            apply_stop_rules(s, q, out, tok);
            if (out->finish_reason) {
                out->e2e_s = now;
                out->tpot_s = out->n > 1 ? (out->e2e_s - out->ttft_s) / (out->n - 1) : 0.0;
            }
            if (j == d || tok != drafts[j]) break;
            accepted++;
            if (out->finish_reason) break;
        }
        if (!d) continue;
        out->spec_draft_tokens += d;
        out->spec_accepted_tokens += accepted;
        p->spec_accepted += accepted;
        s->spec_steps++;
        for (int j = 0; j < accepted; j++) s->spec_accepted_at[j]++;
        /* the rejected drafts' positions are rolled back: the next step
         * writes over them, and blocks past the kept positions go back to
         * the pool (nothing past them was recorded in the prefix cache) */
        SeqState *sq = &s->seq[r];
        sq->computed -= d - accepted;
        if (!out->finish_reason) table_truncate(s->pool, &sq->table, kv_blocks_for(s->topo, sq->computed, s->pool->block_size));
    }
    if (s->pool->caching)
        for (int i = 0; i < p->nc; i++) record_full_blocks(s, p->req[i]);
    /* finished requests leave at once, freeing their blocks */
    int kept = 0;
    for (int i = 0; i < s->n_running; i++) {
        int r = s->running[i];
        if (s->res[r].finish_reason) {
            table_release(s->pool, &s->seq[r].table);
            mtp_forget(&s->seq[r]);
            s->done++;
        } else {
            s->running[kept++] = r;
        }
    }
    s->n_running = kept;
}

long long scheduler_kv_positions(const Scheduler *s)
{
    long long n = 0;
    for (int i = 0; i < s->n_running; i++)
        n += kv_local_len(s->topo, s->seq[s->running[i]].computed, s->topo->dcp_rank);
    /* a shared block is full and stored once */
    return n - s->pool->shared * s->pool->block_size;
}
