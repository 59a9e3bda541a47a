/* Fuzz target: a Hugging Face config.json. */
#include <stdint.h>
#include <stdlib.h>

#include "model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Config c;
    if (config_from_json("config.json", (const char *)data, size, &c) == 0) {
        /* an accepted config has shapes the rest of the program can size */
        if (c.dim <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.vocab_size <= 0 || c.head_dim <= 0 ||
            c.n_layers <= 0 || c.hidden_dim <= 0 || c.max_seq_len <= 0 || c.n_heads % c.n_kv_heads)
            abort();
        Shard s;
        shard_init(&s, &c, 1, 0);
        (void)model_param_count(&c);
    }
    return 0;
}
