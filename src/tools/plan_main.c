/* dcpinfer-plan: what a model gets at a layout, before any hardware. It
 * takes dcpinfer's own options (the same parser) and sizes the KV cache
 * with the very functions a run uses (engine_kv_sizing, report_kv_cache),
 * so that its "KV cache size" and "Maximum concurrency" lines are those
 * dcpinfer prints for the same options. The model is a checkpoint (its
 * config is read, no weights) or a bare config.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "options.h"
#include "report.h"
#include "topology.h"
#include "util.h"

static void usage(FILE *f)
{
    fprintf(f, "Usage: dcpinfer-plan [--model PATH] [-tp N] [-dcp N] [-dp N] [--kv-cache-memory BYTES]\n"
               "                     [--kv-cache-dtype T] [--block-size B] [--max-model-len N]\n"
               "                     [--cp-kv-cache-interleave-size I]\n"
               "Prints the KV cache dcpinfer would have with the same options: blocks and MiB per\n"
               "rank, the tokens the DCP group holds and the concurrency at --max-model-len.\n"
               "PATH: a llama2.c .bin, a Hugging Face folder or its config.json; default: the\n"
               "generated default model. The options mean what they mean to dcpinfer (its --help).\n");
}

/* a config.json by itself, or whatever dcpinfer's --model takes */
static int read_config(const char *path, Config *c)
{
    size_t n = path ? strlen(path) : 0;
    if (n < 5 || strcmp(path + n - 5, ".json") || path_is_dir(path)) return model_read_config(path, c);
    size_t len;
    char *text;
    if (read_file(path, &text, &len)) return -1;
    int rc = config_from_json(path, text, len, c);
    free(text);
    return rc;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-help")) {
            usage(stdout);
            return 0;
        }
    Options o;
    Config cfg;
    int max_model_len;
    if (options_parse(&o, argc, argv, OPTIONS_NO_PROMPTS) || read_config(o.model, &cfg) ||
        topology_check(&cfg, o.tp * (o.dp ? o.dp : 1), o.tp, o.dcp, o.dp, o.interleave, o.block_size) ||
        options_max_model_len(&o, &cfg, &max_model_len)) {
        fprintf(stderr, "dcpinfer-plan: %s\n", dcp_error());
        return 2;
    }
    Model m;
    memset(&m, 0, sizeof m);
    m.cfg = cfg;
    shard_init(&m.shard, &cfg, o.tp, 0);
    EngineOptions eo = {.kv_cache_memory = o.kv_cache_memory, .block_size = o.block_size,
                        .kv_dtype = options_kv_dtype(&o)};
    KvSizing kv;
    engine_kv_sizing(&m, o.dcp, &eo, &kv);
    printf("# layout: tp %d, dcp %d, dp %d\n", o.tp, o.dcp, o.dp ? o.dp : 1);
    report_kv_cache(&kv, o.dcp, max_model_len);
    return 0;
}
