/* The scheduler of one DP group: which tokens each step runs. Identical on
 * every rank of the group: it reads only the requests, the sampled tokens
 * (the same on all ranks) and the block pool (changed by the same calls),
 * never anything rank-local.
 *   - FIFO waiting queue; requests are admitted while --max-num-seqs and
 *     the KV blocks allow;
 *   - each step runs, oldest admitted first, every running request's
 *     pending tokens (one when decoding, a chunk when prefilling), then
 *     prefill chunks of newly admitted requests, within
 *     --max-num-batched-tokens;
 *   - when a running request needs a block and none is free, the most
 *     recently admitted request is preempted: its blocks are freed, it goes
 *     back to the front of the queue, and its prompt and output so far are
 *     recomputed when it is admitted again (its sampler state is kept);
 *   - a finished request frees its blocks at once;
 *   - with prefix caching on in the pool, a request starts from the
 *     longest run of cached blocks that hold its first tokens (short of
 *     its last token, which is recomputed for its logits), unless it asks
 *     for prompt_logprobs; each of its blocks is recorded in the cache once
 *     full. The cache is the pool's, so it is the same on every rank of the
 *     group, and a preempted request finds its own blocks again. */
#ifndef DCP_SCHEDULER_H
#define DCP_SCHEDULER_H

#include "engine.h"
#include "kvcache.h"
#include "requests.h"
#include "sampler.h"
#include "spec.h"
#include "tokenizer.h"
#include "topology.h"

typedef struct {
    BlockTable table;
    int computed;   /* positions whose K/V are stored */
    long admitted;  /* admission order; -1 while waiting */
    int ever_admitted;
    Sampler sampler;
    /* prefix caching: its first chain_blocks logical blocks are matched or
     * recorded, the last with this hash and record serial */
    int chain_blocks;
    uint64_t chain_hash, chain_serial;
    /* speculative decoding with "mtp": the MTP layer's draft of the token
     * after the pending one at position mtp_pos (-1: none yet), and its
     * hidden state there (Config.dim floats, allocated by generate.c), the
     * next draft step's input; both kept while the request runs */
    int mtp_draft, mtp_pos;
    float *mtp_hidden;
} SeqState;

typedef struct {
    RequestSet *rs;
    Result *res;
    const Config *cfg;
    const Topology *topo;
    BlockPool *pool;
    int max_num_seqs, max_batched_tokens, max_model_len;
    SeqState *seq;       /* per request */
    int *waiting;        /* request indices; [head, tail) is the queue */
    int head, tail;
    int *running;        /* request indices, in admission order */
    int n_running;
    long admissions;
    int done;            /* requests finished or failed */
    long long preemptions;
    long long kv_positions_peak; /* most positions this rank stored at once */
    const Tokenizer *tok; /* when set, output text is made as tokens arrive and stop strings apply */
    int bos;
    int *match;           /* a request's matched cached blocks, for its admission */
    int *block_buf;       /* one logical block's tokens */
    SpecConfig spec;      /* speculative decoding (spec.h); method SPEC_NONE: off */
    int *context;         /* a request's prompt and output, for the n-gram drafter */
    long long spec_steps; /* verifications run */
    long long spec_accepted_at[SPEC_MAX_TOKENS]; /* verifications whose draft j was accepted */
} Scheduler;

/* A step's chunks. Each chunk has logit rows (its last tokens': one, or
 * every token's where the step scores prompts), row_end[i] past chunk i's
 * last. A chunk that samples chooses a token at its last 1 + drafts[i]
 * rows: the row of its pending token and one per drafted token after it
 * (speculative decoding; drafts[i] 0 otherwise); sampled tokens and their
 * log-probabilities are kept per row. */
typedef struct {
    int nc, T;             /* chunks, tokens */
    Chunk *chunks;
    int *req;              /* per chunk: request index */
    int *samples;          /* per chunk: 1 when its last token yields the next one */
    int *drafts;           /* per chunk: drafted tokens, its last ones */
    int *row_end;          /* per chunk: its logit rows end here (plan_rows) */
    int R;                 /* logit rows */
    int *tokens;           /* T token ids, chunk after chunk */
    TokenLogprobs *lp;     /* per row: the sampled token's log-probabilities, where its request asks */
    int prefill_tokens, decode_tokens, preempted;
    int cached_tokens;     /* positions admitted requests took from the prefix cache */
    int spec_drafted, spec_accepted; /* drafts verified, and kept (scheduler_commit) */
} StepPlan;

/* The limits a scheduler works within (GenOptions in generate.h has the same fields). */
typedef struct {
    int max_model_len;      /* context limit: prompt + output tokens */
    int max_num_seqs;       /* requests decoding together */
    int max_batched_tokens; /* tokens per forward pass */
} SchedulerLimits;

/* EOS of the model (unless ignore_eos) or one of the request's stop_token_ids */
int is_stop_token(const Config *c, const Request *q, int tok);

/* Fails the requests that could never fit the cache, even alone. */
void requests_check_kv(RequestSet *rs, const Topology *topo, const BlockPool *pool, int max_model_len);
/* Requests that could never fit the cache fail here too. */
void scheduler_init(Scheduler *s, RequestSet *rs, Result *res, const Config *cfg, const Topology *topo,
                    BlockPool *pool, const SchedulerLimits *o);
void scheduler_free(Scheduler *s);
void plan_init(StepPlan *p, const SchedulerLimits *o);
/* The logit rows of p's chunks: every token's (all) or the rows that
 * sample (one, or 1 + drafts); fills p->row_end and returns p->R. */
int plan_rows(StepPlan *p, int all);
void plan_free(StepPlan *p);

/* Fills p with the next step; returns 0 when every request is done. */
int scheduler_plan(Scheduler *s, StepPlan *p);
/* After the forward pass: sampled[r] is the token chosen at logit row r
 * of a chunk that samples (and p->lp[r] its log-probabilities, where its
 * request asks); the drafts' rows are read in order while the tokens
 * equal the drafts. Appends, makes the text, applies the stop rules (stop
 * tokens and strings once min_tokens are out, then max_tokens and the
 * context limit) after each token, rolls rejected drafts' positions back,
 * frees finished requests' blocks. now: seconds since the start, for the
 * latency figures. */
void scheduler_commit(Scheduler *s, StepPlan *p, const int *sampled, double now);

/* The token at position pos of request r's prompt and output */
int scheduler_token(const Scheduler *s, int r, int pos);

/* Positions this rank stores now (its shard of every running sequence). */
long long scheduler_kv_positions(const Scheduler *s);

#endif
