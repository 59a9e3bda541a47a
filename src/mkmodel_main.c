/* dcpinfer-mkmodel: writes a deterministic test model of any shape. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mkmodel.h"
#include "util.h"

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: dcpinfer-mkmodel --out PATH [options]\n"
            "Writes a deterministic Llama-architecture model with uniform random weights.\n"
            "  --out PATH        directory (Hugging Face layout) or file (--format llama2c)\n"
            "  --format F        hf (config.json + safetensors, default) or llama2c (.bin)\n"
            "  --layers N        decoder layers (default 4)\n"
            "  --dim N           hidden size (default 128)\n"
            "  --heads N         query heads (default 8)\n"
            "  --kv-heads N      key/value heads, dividing --heads (default 2)\n"
            "  --hidden N        feed-forward size (default 344)\n"
            "  --vocab N         vocabulary size (default 512)\n"
            "  --max-len N       maximum positions (default 2048)\n"
            "  --seed N          weight seed (default 1234)\n"
            "  --dtype T         f32 (default) or bf16 (hf only)\n"
            "  --shards N        split the safetensors into N files with an index (hf only)\n"
            "  --tied            share the token embedding with the LM head\n"
            "  --eos N           end-of-sequence token id (default: none)\n"
            "Defaults are the model dcpinfer runs when no --model is given.\n");
}

int main(int argc, char **argv)
{
    ModelSpec s;
    mkmodel_default_spec(&s);
    const char *out = NULL, *format = "hf", *dtype = "f32";
    int shards = 1;
    static const struct option opts[] = {
        {"out", 1, 0, 'o'},    {"format", 1, 0, 'f'}, {"layers", 1, 0, 'l'}, {"dim", 1, 0, 'd'},
        {"heads", 1, 0, 'H'},  {"kv-heads", 1, 0, 'k'}, {"hidden", 1, 0, 'h'}, {"vocab", 1, 0, 'v'},
        {"max-len", 1, 0, 'm'}, {"seed", 1, 0, 's'},   {"dtype", 1, 0, 't'},  {"shards", 1, 0, 'S'},
        {"tied", 0, 0, 'T'},   {"eos", 1, 0, 'e'},    {"help", 0, 0, '?'},   {0, 0, 0, 0}};
    int c, li = 0;
    while ((c = getopt_long(argc, argv, "", opts, &li)) != -1) {
        char *end = NULL;
        long v = optarg ? strtol(optarg, &end, 10) : 0;
        int numeric = strchr("ldHkhvmsSe", c) != NULL;
        if (numeric && (!optarg[0] || *end)) {
            fprintf(stderr, "dcpinfer-mkmodel: --%s: '%s' is not an integer\n", opts[li].name, optarg);
            return 2;
        }
        switch (c) {
        case 'o': out = optarg; break;
        case 'f': format = optarg; break;
        case 'l': s.layers = (int)v; break;
        case 'd': s.dim = (int)v; break;
        case 'H': s.heads = (int)v; break;
        case 'k': s.kv_heads = (int)v; break;
        case 'h': s.hidden = (int)v; break;
        case 'v': s.vocab = (int)v; break;
        case 'm': s.max_len = (int)v; break;
        case 's': s.seed = strtoull(optarg, NULL, 10); break;
        case 't': dtype = optarg; break;
        case 'S': shards = (int)v; break;
        case 'T': s.tied = 1; break;
        case 'e': s.eos = (int)v; break;
        case '?':
            if (optopt == 0 && !strcmp(argv[optind - 1], "--help")) {
                usage(stdout);
                return 0;
            }
            usage(stderr);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "dcpinfer-mkmodel: --out is required\n");
        return 2;
    }
    int bf16 = !strcmp(dtype, "bf16");
    if (!bf16 && strcmp(dtype, "f32")) {
        fprintf(stderr, "dcpinfer-mkmodel: --dtype %s: choose f32 or bf16\n", dtype);
        return 2;
    }
    int rc;
    if (!strcmp(format, "hf")) {
        rc = mkmodel_write_hf(&s, out, bf16, shards);
    } else if (!strcmp(format, "llama2c")) {
        if (bf16) {
            fprintf(stderr, "dcpinfer-mkmodel: the llama2.c format holds f32 only\n");
            return 2;
        }
        rc = mkmodel_write_llama2c(&s, out);
    } else {
        fprintf(stderr, "dcpinfer-mkmodel: --format %s: choose hf or llama2c\n", format);
        return 2;
    }
    if (rc) {
        fprintf(stderr, "dcpinfer-mkmodel: %s\n", dcp_error());
        return 1;
    }
    return 0;
}
