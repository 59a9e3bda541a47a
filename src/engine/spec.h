/* Speculative decoding (docs/design.md, "Speculative decoding"): a
 * running request's pending token and K drafted tokens go through the
 * model as one chunk of K + 1 rows; the target's token at each row is
 * chosen exactly as a plain decode step would choose it (the kernels give
 * a row the same bits in any chunk), and the drafts are kept while they
 * equal it. So the outputs are those of decoding without speculation. */
#ifndef DCP_SPEC_H
#define DCP_SPEC_H

enum { SPEC_NONE = 0, SPEC_NGRAM, SPEC_MTP };

/* The most drafts a verification may carry (vLLM takes any K; past this
 * a step's rows cost more than the drafts can win back). */
#define SPEC_MAX_TOKENS 16

typedef struct {
    int method;     /* SPEC_NONE, SPEC_NGRAM or SPEC_MTP */
    int k;          /* num_speculative_tokens */
    int lookup_min; /* ngram: the shortest suffix that may match */
    int lookup_max; /* ngram: the longest suffix matched */
} SpecConfig;

/* vLLM's --speculative-config JSON: {"method": "ngram",
 * "num_speculative_tokens": K, "prompt_lookup_min": A,
 * "prompt_lookup_max": B} (A and B default to each other, both to 5), or
 * {"method": "mtp" | "deepseek_mtp", "num_speculative_tokens": K}.
 * 0, or -1 with dcp_error() naming the bad field and value. */
int spec_parse(const char *json, SpecConfig *out);

/* vLLM's n-gram drafter: the longest suffix of tokens[0..n) of at least
 * lookup_min and at most lookup_max tokens that also ends earlier in
 * them (the earliest such place among equally long ones) proposes the
 * tokens that followed it there, at most k and never past the end.
 * Returns how many it wrote to out. */
int spec_ngram_propose(const int *tokens, int n, int lookup_min, int lookup_max, int k, int *out);

#endif
