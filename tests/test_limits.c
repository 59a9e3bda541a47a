/* MPI counts are ints: a step's per-layer messages must stay below 2^31.
 * engine_step_token_limit gives the most tokens a step may hold; at
 * DeepSeek-V3's shapes with tp 8 and dcp 8 ag_rs's first merge exchange
 * (half the group's partials: 4 x 16 heads x 513 floats a token) bounds it
 * at 65,408 tokens, inside the range --max-num-batched-tokens accepts (up
 * to 2^20). */
#include <limits.h>

#include "arch.h"
#include "engine.h"
#include "testutil.h"

static int arch_index(const char *name)
{
    for (int i = 0; i < arch_count; i++)
        if (!strcmp(arch_table[i].name, name)) return i;
    return -1;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    Model v3 = {0};
    Config *c = &v3.cfg;
    c->arch = arch_index("DeepseekV3ForCausalLM");
    c->mla = 1;
    c->dim = 7168, c->n_layers = 61, c->n_heads = 128, c->n_kv_heads = 1, c->vocab_size = 129280;
    c->hidden_dim = 18432;
    c->m = (MlaConfig){.q_lora_rank = 1536, .kv_lora_rank = 512, .qk_nope_head_dim = 128, .qk_rope_head_dim = 64,
                       .v_head_dim = 128, .softmax_scale = 0.07f};
    c->moe = (MoeConfig){.sigmoid = 1, .n_routed_experts = 256, .moe_hidden = 2048, .experts_per_token = 8,
                         .n_group = 8, .topk_group = 4};
    c->head_dim = c->m.kv_lora_rank + c->m.qk_rope_head_dim; /* the latent row: 576 */
    shard_init(&v3.shard, c, 8, 0);
    Topology t = {.world_size = 8, .tp = 8, .dcp = 8, .dp = 1, .interleave = 1};
    long limit = engine_step_token_limit(&v3, &t);
    /* ag_rs's first exchange: 8 / 2 ranks' partials of 16 heads, 512 latent values and the LSE */
    long per_token = 4L * v3.shard.q_heads * (c->m.kv_lora_rank + 1);
    CHECK(limit == 65408, "DeepSeek-V3 at tp 8 dcp 8: %ld tokens a step (want 65408)", limit);
    CHECK(limit * per_token <= INT_MAX && (limit + 1) * per_token > INT_MAX,
          "the limit is the bound: %ld x %ld = %ld, one more %ld", limit, per_token, limit * per_token,
          (limit + 1) * per_token);
    CHECK(limit < 1 << 20, "the bound lies inside --max-num-batched-tokens' range (1 to 2^20)");
    /* without DCP the TP sum (dim floats a token) bounds it */
    t.dcp = 1;
    limit = engine_step_token_limit(&v3, &t);
    CHECK(limit == INT_MAX / 7168, "DeepSeek-V3 at tp 8 dcp 1: %ld (want %d)", limit, INT_MAX / 7168);
    CHECK(comm_count((size_t)INT_MAX) == INT_MAX && comm_count(0) == 0, "comm_count in range");
    MPI_Finalize();
    return test_finish("test_limits");
}
