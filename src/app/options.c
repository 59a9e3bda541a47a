#include "options.h"

#include "reasoning.h"

#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "kvcache.h"
#include "reasoning.h"
#include "requests.h"
#include "util.h"
#include "version.h"

enum {
    OPT_MODEL = 256, OPT_TOKENIZER, OPT_OUTPUT, OPT_BACKEND, OPT_MAX_TOKENS, OPT_TEMPERATURE, OPT_TOP_P, OPT_SEED,
    OPT_MAX_MODEL_LEN, OPT_MAX_NUM_SEQS, OPT_MAX_BATCHED, OPT_SKIP_INVALID, OPT_PROGRESS, OPT_NO_PROGRESS,
    OPT_QUIET, OPT_HELP, OPT_VERSION, OPT_CPU_GEMM, OPT_TP, OPT_DCP, OPT_DP, OPT_INTERLEAVE, OPT_DCP_BACKEND, OPT_KV_MEMORY, OPT_BLOCK_SIZE, OPT_MPI_DEVICE_BUFFERS, OPT_DTYPE,
    OPT_RESUME, OPT_NO_JOURNAL, OPT_STEP_TIMEOUT, OPT_OUTPUT_FORMAT, OPT_KV_DTYPE, OPT_NVFP4_ACT, OPT_GPU_UTIL, OPT_SERVED_NAME,
    OPT_PROGRESS_INTERVAL, OPT_CPU_ISA, OPT_CHAT_TEMPLATE, OPT_REASONING_PARSER, OPT_TOP_K, OPT_MIN_P,
    OPT_PRESENCE, OPT_FREQUENCY, OPT_REPETITION, OPT_PREFIX_CACHING, OPT_NO_PREFIX_CACHING,
    OPT_EXPERT_PARALLEL, OPT_SPECULATIVE
};

static const struct option long_opts[] = {
    {"model", required_argument, 0, OPT_MODEL},
    {"tokenizer", required_argument, 0, OPT_TOKENIZER},
    {"chat-template", required_argument, 0, OPT_CHAT_TEMPLATE},
    {"reasoning-parser", required_argument, 0, OPT_REASONING_PARSER},
    {"output", required_argument, 0, OPT_OUTPUT},
    {"output-format", required_argument, 0, OPT_OUTPUT_FORMAT},
    {"backend", required_argument, 0, OPT_BACKEND},
    {"cpu-gemm", required_argument, 0, OPT_CPU_GEMM},
    {"cpu-isa", required_argument, 0, OPT_CPU_ISA},
    {"tensor-parallel-size", required_argument, 0, OPT_TP},
    {"tp", required_argument, 0, OPT_TP},
    {"decode-context-parallel-size", required_argument, 0, OPT_DCP},
    {"dcp", required_argument, 0, OPT_DCP},
    {"data-parallel-size", required_argument, 0, OPT_DP},
    {"dp", required_argument, 0, OPT_DP},
    {"cp-kv-cache-interleave-size", required_argument, 0, OPT_INTERLEAVE},
    {"dcp-comm-backend", required_argument, 0, OPT_DCP_BACKEND},
    {"kv-cache-memory", required_argument, 0, OPT_KV_MEMORY},
    {"block-size", required_argument, 0, OPT_BLOCK_SIZE},
    {"enable-prefix-caching", no_argument, 0, OPT_PREFIX_CACHING},
    {"no-enable-prefix-caching", no_argument, 0, OPT_NO_PREFIX_CACHING},
    {"enable-expert-parallel", no_argument, 0, OPT_EXPERT_PARALLEL},
    {"speculative-config", required_argument, 0, OPT_SPECULATIVE},
    {"mpi-device-buffers", required_argument, 0, OPT_MPI_DEVICE_BUFFERS},
    {"dtype", required_argument, 0, OPT_DTYPE},
    {"kv-cache-dtype", required_argument, 0, OPT_KV_DTYPE},
    {"nvfp4-activations", required_argument, 0, OPT_NVFP4_ACT},
    {"gpu-memory-utilization", required_argument, 0, OPT_GPU_UTIL},
    {"served-model-name", required_argument, 0, OPT_SERVED_NAME},
    {"max-tokens", required_argument, 0, OPT_MAX_TOKENS},
    {"temperature", required_argument, 0, OPT_TEMPERATURE},
    {"top-p", required_argument, 0, OPT_TOP_P},
    {"top-k", required_argument, 0, OPT_TOP_K},
    {"min-p", required_argument, 0, OPT_MIN_P},
    {"presence-penalty", required_argument, 0, OPT_PRESENCE},
    {"frequency-penalty", required_argument, 0, OPT_FREQUENCY},
    {"repetition-penalty", required_argument, 0, OPT_REPETITION},
    {"seed", required_argument, 0, OPT_SEED},
    {"max-model-len", required_argument, 0, OPT_MAX_MODEL_LEN},
    {"max-num-seqs", required_argument, 0, OPT_MAX_NUM_SEQS},
    {"max-num-batched-tokens", required_argument, 0, OPT_MAX_BATCHED},
    {"skip-invalid", no_argument, 0, OPT_SKIP_INVALID},
    {"resume", no_argument, 0, OPT_RESUME},
    {"no-journal", no_argument, 0, OPT_NO_JOURNAL},
    {"step-timeout", required_argument, 0, OPT_STEP_TIMEOUT},
    {"progress", no_argument, 0, OPT_PROGRESS},
    {"no-progress", no_argument, 0, OPT_NO_PROGRESS},
    {"progress-interval", required_argument, 0, OPT_PROGRESS_INTERVAL},
    {"quiet", no_argument, 0, OPT_QUIET},
    {"help", no_argument, 0, OPT_HELP},
    {"version", no_argument, 0, OPT_VERSION},
    {0, 0, 0, 0},
};

void options_usage(FILE *f)
{
    fprintf(f,
            "Usage: mpirun -np N dcpinfer [OPTIONS] PROMPTS.jsonl\n"
            "       dcpinfer [OPTIONS] PROMPTS.jsonl\n"
            "\n"
            "Batch inference for decoder-only language models (Llama, Mistral, Qwen2/3, DeepSeek-V2/V3),\n"
            "with tensor and decode context parallelism over MPI. PROMPTS.jsonl holds one JSON request per line:\n"
            "  {\"id\": \"a\", \"prompt\": \"text\", \"max_tokens\": 64, \"temperature\": 0}\n"
            "  {\"id\": \"b\", \"prompt_token_ids\": [1, 403, 407], \"seed\": 7, \"stop_token_ids\": [2]}\n"
            "or OpenAI batch lines ({\"custom_id\": ..., \"body\": {\"prompt\": ..., \"max_tokens\": ...}}).\n"
            "Results and timings go to an HDF5 file, or JSON Lines (docs/output.md).\n"
            "\n"
            "Model:\n"
            "  --model PATH             llama2.c .bin checkpoint, or a local Hugging Face folder with\n"
            "                           config.json and model.safetensors (or a sharded index);\n"
            "                           nothing is downloaded.\n"
            "                           Default: a small generated model (no tokenizer).\n"
            "  --tokenizer PATH         llama2.c tokenizer .bin, a Hugging Face tokenizer.json or Kimi\n"
            "                           K2's tiktoken.model (or its folder), needed for text prompts.\n"
            "                           Default: tokenizer.bin beside a .bin model, tokenizer.json\n"
            "                           (or tiktoken.model) in an HF model folder.\n"
            "  --chat-template FILE     Jinja chat template for \"messages\" requests, instead of the\n"
            "                           tokenizer's (tokenizer_config.json's chat_template, or\n"
            "                           chat_template.jinja beside it)\n"
            "  --reasoning-parser P     deepseek_r1, qwen3 or kimi_k2 (vLLM's parsers): split each\n"
            "                           output into reasoning_content (its think tags' text) and\n"
            "                           content, in the results beside the whole text\n"
            "  --served-model-name NAME  the \"model\" of OpenAI batch responses (default: the model\n"
            "                           folder's name), as vLLM's option\n"
            "  --max-model-len N        context limit, prompt + output tokens (default: the model's)\n"
            "  --backend NAME           cpu (default) or cuda (one GPU per rank, chosen from the\n"
            "                           launcher's local rank)\n"
            "  --dtype T                GEMM weights: auto (bfloat16 for a checkpoint stored so,\n"
            "                           else float32), float32, or bfloat16 (half the bytes per\n"
            "                           token; fp32 activations and accumulation on the CPU; cuda:\n"
            "                           bf16 weights and activations, fp32 accumulation)\n"
            "  --mpi-device-buffers M   cuda: auto (default: ask MPI whether it takes device\n"
            "                           memory), yes, or no (stage through pinned host buffers)\n"
            "  --nvfp4-activations A    a W4A4 NVFP4 checkpoint's activations: auto (default:\n"
            "                           weight-only), weight-only (the compute dtype; the input\n"
            "                           scales read and checked, not applied: the dequantized\n"
            "                           weights' results) or emulate (each activation row quantized\n"
            "                           to FP4 in groups of 16 with the checkpoint's input scale, as\n"
            "                           FP4 tensor cores compute)\n"
            "  --cpu-gemm KIND          invariant (default): a request's results never depend on the\n"
            "                           rest of its batch; openblas: OpenBLAS sgemm, faster for\n"
            "                           large prefills, rounding varies with the batch\n"
            "  --cpu-isa I              CPU kernels: auto (default: the widest this CPU has),\n"
            "                           avx512, avx2 or generic; every choice gives the same bits\n"
            "\n"
            "Sampling defaults (a request's own fields win):\n"
            "  --max-tokens N           tokens to generate per request that does not say (default\n"
            "                           16; an OpenAI chat completion body: to EOS or the context\n"
            "                           limit, as vLLM's chat endpoint, unless this is given)\n"
            "  --temperature T          0 is greedy (default 1.0)\n"
            "  --top-p P                nucleus sampling mass in (0, 1] (default 1.0)\n"
            "  --top-k K                sample among the K most likely tokens (default 0: all)\n"
            "  --min-p P                drop tokens below P x the most likely one's probability\n"
            "                           (default 0)\n"
            "  --presence-penalty A, --frequency-penalty A  OpenAI's penalties in [-2, 2] on tokens\n"
            "                           already generated (default 0)\n"
            "  --repetition-penalty R   over prompt and output tokens, as vLLM (default 1: off)\n"
            "  --seed N                 run seed; a request without \"seed\" derives one from it and\n"
            "                           its line number (default 0)\n"
            "\n"
            "Parallelism (world = dp x tp; DCP splits each TP group's KV cache along the sequence):\n"
            "  -tp, --tensor-parallel-size N      ranks per model replica (default 1)\n"
            "  -dcp, --decode-context-parallel-size N  ranks of a TP group that share a KV head and\n"
            "                           split its cache by position (default 1; at most tp/kv_heads;\n"
            "                           auto: the largest the model allows at this tp)\n"
            "  -dp, --data-parallel-size N        model replicas (default world / tp)\n"
            "  --cp-kv-cache-interleave-size I    consecutive positions per DCP rank (default 1)\n"
            "  --dcp-comm-backend B     ag_rs (default: allgather LSEs + reduce-scatter) or a2a\n"
            "                           (all-to-all of partial outputs)\n"
            "  --enable-expert-parallel  MoE models: each rank of world (tp x dp) holds whole routed\n"
            "                           experts, a contiguous 1/world of them; tokens travel to\n"
            "                           their experts and back (MPI all-to-all); shared experts and\n"
            "                           dense layers stay tensor-parallel\n"
            "\n"
            "KV cache:\n"
            "  --kv-cache-memory BYTES  K/V memory per rank, e.g. 512M or 2G (default: on the CPU\n"
            "                           1G; on a GPU what --gpu-memory-utilization leaves)\n"
            "  --gpu-memory-utilization F  --backend cuda: the share of each GPU's memory for\n"
            "                           weights, activations and KV cache (default 0.9); the KV\n"
            "                           cache takes what the weights and the activation peak of a\n"
            "                           step of --max-num-batched-tokens (measured) leave\n"
            "  --kv-cache-dtype T       auto (the checkpoint's: fp8 with FP8 KV scales, bfloat16\n"
            "                           for a bf16 checkpoint, else float32), float32, bfloat16\n"
            "                           (half the bytes per position,\n"
            "                           twice the positions in the same memory) or fp8 (FP8\n"
            "                           E4M3, a quarter: the checkpoint's per-layer k_scale and\n"
            "                           v_scale where it has them, else 1 as vLLM's default);\n"
            "                           attention still accumulates in fp32\n"
            "  --block-size B           positions per KV block per rank (default 16); a block id\n"
            "                           spans B x dcp positions of the DCP group\n"
            "  --enable-prefix-caching, --no-enable-prefix-caching  reuse the K/V of full blocks\n"
            "                           (B x dcp positions) that an earlier prompt or output\n"
            "                           already computed (default on; outputs are the same bits\n"
            "                           either way; requests with prompt_logprobs compute all)\n"
            "\n"
            "Batching:\n"
            "  --max-num-seqs N         requests decoding together (default 256)\n"
            "  --max-num-batched-tokens N  tokens per forward pass (default 2048)\n"
            "  --speculative-config JSON  speculative decoding, vLLM's form: {\"method\": \"ngram\",\n"
            "                           \"num_speculative_tokens\": K, \"prompt_lookup_min\": A,\n"
            "                           \"prompt_lookup_max\": B}: K tokens drafted from the request's\n"
            "                           own n-grams, checked in one step; outputs unchanged; or\n"
            "                           {\"method\": \"mtp\", \"num_speculative_tokens\": K}: drafted by\n"
            "                           a DeepSeek model's multi-token-prediction layer\n"
            "\n"
            "Input and output:\n"
            "  --output FILE            results file (default dcpinfer.h5): HDF5, or JSON Lines\n"
            "                           when FILE ends in .jsonl\n"
            "  --output-format F        hdf5 or jsonl, whatever FILE's name (one JSON object per\n"
            "                           request; the OpenAI batch output form for OpenAI batch input)\n"
            "  --skip-invalid           record a bad prompt line as a failed request and go on,\n"
            "                           instead of stopping before the model is loaded\n"
            "  --resume                 continue an earlier run of the same --output that stopped\n"
            "                           (crash, kill, time limit): requests in its journal\n"
            "                           (OUTPUT.journal*) are not run again; the inputs must match\n"
            "  --no-journal             do not record finished requests (no --resume possible)\n"
            "  --step-timeout S         end the job when no step completes in S seconds (a\n"
            "                           stopped or hung rank); default 0: never\n"
            "  --progress, --no-progress  progress on stderr: requests done, tokens/s, KV use, ETA\n"
            "                           (default: on when stderr is a terminal, where one line is\n"
            "                           rewritten in place, or under mpirun/srun; off with --quiet)\n"
            "  --progress-interval S    seconds between progress updates (default: 1 on a\n"
            "                           terminal, 10 for plain lines into a pipe or a Slurm log)\n"
            "  --quiet                  only the closing summary on stdout: no start-up header\n"
            "                           (model, layout, KV cache), per-request lines or progress\n"
            "  --help, --version\n"
            "\n"
            "Threads per rank default to the node's cores divided by the ranks on the node;\n"
            "OMP_NUM_THREADS overrides.\n");
}

/* Every integer option has an upper bound far above real use, so that the
 * sizes derived from it stay inside their types. */
static int parse_int(const char *opt, const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*end && end != s && (errno == ERANGE || v < lo || v > hi))
        return dcp_fail("%s: %s is out of range: it takes %d to %d", opt, s, lo, hi);
    if (errno || *end || end == s) return dcp_fail("%s: '%s' is not an integer from %d to %d", opt, s, lo, hi);
    *out = (int)v;
    return 0;
}

static int parse_float(const char *opt, const char *s, float lo, float hi, int lo_open, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || v < lo || v > hi || (lo_open && v == lo))
        return dcp_fail("%s: '%s' is not a number in %s%g, %g]", opt, s, lo_open ? "(" : "[", lo, hi);
    *out = (float)v;
    return 0;
}

const char *options_nvfp4_activations(const Options *o)
{
    return strcmp(o->nvfp4_activations, "emulate") ? "weight-only" : "emulate";
}

DType options_kv_dtype(const Options *o, const Config *c)
{
    const char *name = o->kv_cache_dtype;
    if (!strcmp(name, "auto")) return c->quant.kv_fp8 ? DTYPE_F8_E4M3 : c->stored_bf16 ? DTYPE_BF16 : DTYPE_F32;
    return !strcmp(name, "bfloat16") ? DTYPE_BF16 : !strncmp(name, "fp8", 3) ? DTYPE_F8_E4M3 : DTYPE_F32;
}

EngineOptions options_engine(const Options *o, const Config *c)
{
    /* a step's block tables: a table of the longest sequence for each
     * request it holds (at most --max-num-seqs, and at most a token each
     * of --max-num-batched-tokens), held from the first step so that no
     * later one allocates */
    size_t len = (size_t)(o->max_model_len ? o->max_model_len : c->max_seq_len), bs = (size_t)o->block_size,
           seqs = (size_t)(o->max_num_seqs < o->max_batched_tokens ? o->max_num_seqs : o->max_batched_tokens);
    return (EngineOptions){.merge = strcmp(o->dcp_comm_backend, "a2a") ? MERGE_AG_RS : MERGE_A2A,
                           .kv_cache_memory = o->kv_cache_memory, .block_size = o->block_size,
                           .kv_dtype = options_kv_dtype(o, c),
                           .nvfp4_act = !strcmp(options_nvfp4_activations(o), "emulate"),
                           .table_blocks = seqs * (len / (bs ? bs : 16) + 2)};
}

int options_max_model_len(const Options *o, const Config *c, int *out)
{
    *out = o->max_model_len ? o->max_model_len : c->max_seq_len;
    if (*out > c->max_seq_len)
        return dcp_fail("--max-model-len %d exceeds the model's maximum of %d positions", *out, c->max_seq_len);
    return 0;
}

int options_parse(Options *o, int argc, char **argv, int flags)
{
    int print = flags & OPTIONS_PRINT;
    *o = (Options){.output = "dcpinfer.h5", .backend = "cpu", .cpu_gemm = "invariant", .cpu_isa = "auto", .tp = 1, .dcp = 1,
                   .interleave = 1, .dcp_comm_backend = "ag_rs", .kv_cache_memory = (size_t)1 << 30, .gpu_memory_utilization = 0.9,
                   .block_size = 16, .mpi_device_buffers = "auto",
                   .dtype = "auto", .kv_cache_dtype = "auto", .nvfp4_activations = "auto", .max_tokens = 16, .temperature = 1.0f,
                   .top_p = 1.0f, .sampling = {.repetition_penalty = 1.0f}, .max_num_seqs = 256, .max_batched_tokens = 2048, .progress = -1,
                   .journal = 1, .prefix_caching = 1};
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long_only(argc, argv, "", long_opts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case OPT_MODEL: o->model = optarg; break;
        case OPT_TOKENIZER: o->tokenizer = optarg; break;
        case OPT_CHAT_TEMPLATE: o->chat_template = optarg; break;
        case OPT_TOP_K:
            rc = parse_int("--top-k", optarg, -1, INT32_MAX, &o->sampling.top_k);
            if (o->sampling.top_k < 0) o->sampling.top_k = 0;
            break;
        case OPT_MIN_P: rc = parse_float("--min-p", optarg, 0, 1, 0, &o->sampling.min_p); break;
        case OPT_PRESENCE: rc = parse_float("--presence-penalty", optarg, -2, 2, 0, &o->sampling.presence_penalty); break;
        case OPT_FREQUENCY:
            rc = parse_float("--frequency-penalty", optarg, -2, 2, 0, &o->sampling.frequency_penalty);
            break;
        case OPT_REPETITION:
            rc = parse_float("--repetition-penalty", optarg, 0, 2e9f, 1, &o->sampling.repetition_penalty);
            break;
        case OPT_REASONING_PARSER:
            o->reasoning_parser = reasoning_parser(optarg);
            if (o->reasoning_parser < 0) rc = dcp_fail("--reasoning-parser %s: choose deepseek_r1, qwen3 or kimi_k2", optarg);
            break;
        case OPT_SERVED_NAME:
            if (!*optarg) rc = dcp_fail("--served-model-name: an empty name");
            o->served_model_name = optarg;
            break;
        case OPT_OUTPUT: o->output = optarg; break;
        case OPT_OUTPUT_FORMAT:
            if (strcmp(optarg, "hdf5") && strcmp(optarg, "jsonl"))
                rc = dcp_fail("--output-format %s: choose hdf5 or jsonl", optarg);
            o->output_format = optarg;
            break;
        case OPT_BACKEND: o->backend = optarg; break;
        case OPT_CPU_GEMM: o->cpu_gemm = optarg; break;
        case OPT_CPU_ISA: o->cpu_isa = optarg; break;
        case OPT_TP: rc = parse_int("-tp", optarg, 1, 1 << 16, &o->tp); break;
        case OPT_DCP: /* auto: 0 here, the largest the model allows (topology_max_dcp) once it is read */
            if (!strcmp(optarg, "auto")) o->dcp = 0;
            else rc = parse_int("-dcp", optarg, 1, 1 << 16, &o->dcp);
            break;
        case OPT_DP: rc = parse_int("-dp", optarg, 1, 1 << 16, &o->dp); break;
        case OPT_INTERLEAVE: rc = parse_int("--cp-kv-cache-interleave-size", optarg, 0, 1 << 16, &o->interleave); break;
        case OPT_KV_MEMORY:
            if (parse_bytes(optarg, &o->kv_cache_memory))
                rc = dcp_fail("--kv-cache-memory: '%s' is not a size from 1K to 1P (e.g. 536870912, 512M, 2G)",
                              optarg);
            o->kv_cache_memory_given = 1;
            break;
        case OPT_GPU_UTIL: {
            char *end;
            double f = strtod(optarg, &end);
            if (end == optarg || *end || !(f > 0 && f <= 1))
                rc = dcp_fail("--gpu-memory-utilization: '%s' is not a share of the GPU's memory in (0, 1]", optarg);
            else o->gpu_memory_utilization = f;
            break;
        }
        case OPT_BLOCK_SIZE: rc = parse_int("--block-size", optarg, 1, 1 << 16, &o->block_size); break;
        case OPT_PREFIX_CACHING: o->prefix_caching = 1; break;
        case OPT_NO_PREFIX_CACHING: o->prefix_caching = 0; break;
        case OPT_EXPERT_PARALLEL: o->expert_parallel = 1; break;
        case OPT_SPECULATIVE:
            rc = spec_parse(optarg, &o->spec);
            o->spec_json = optarg;
            break;
        case OPT_DTYPE:
            o->dtype = optarg;
            if (strcmp(optarg, "auto") && strcmp(optarg, "float32") && strcmp(optarg, "bfloat16"))
                rc = dcp_fail("--dtype %s: choose auto, float32 or bfloat16", optarg);
            break;
        case OPT_KV_DTYPE:
            o->kv_cache_dtype = optarg;
            if (strcmp(optarg, "auto") && strcmp(optarg, "float32") && strcmp(optarg, "bfloat16") &&
                strcmp(optarg, "fp8") && strcmp(optarg, "fp8_e4m3"))
                rc = dcp_fail("--kv-cache-dtype %s: choose auto, float32, bfloat16 or fp8 (fp8_e4m3)", optarg);
            break;
        case OPT_NVFP4_ACT:
            o->nvfp4_activations = optarg;
            if (strcmp(optarg, "auto") && strcmp(optarg, "weight-only") && strcmp(optarg, "emulate"))
                rc = dcp_fail("--nvfp4-activations %s: choose auto, weight-only or emulate", optarg);
            break;
        case OPT_MPI_DEVICE_BUFFERS:
            o->mpi_device_buffers = optarg;
            if (strcmp(optarg, "auto") && strcmp(optarg, "yes") && strcmp(optarg, "no"))
                rc = dcp_fail("--mpi-device-buffers %s: choose auto, yes or no", optarg);
            break;
        case OPT_DCP_BACKEND:
            o->dcp_comm_backend = optarg;
            if (strcmp(optarg, "ag_rs") && strcmp(optarg, "a2a"))
                rc = dcp_fail("--dcp-comm-backend %s: choose ag_rs or a2a", optarg);
            break;
        case OPT_MAX_TOKENS:
            rc = parse_int("--max-tokens", optarg, 1, 1 << 30, &o->max_tokens);
            o->max_tokens_given = 1;
            break;
        case OPT_TEMPERATURE:
            rc = parse_float("--temperature", optarg, 0, 1e6f, 0, &o->temperature);
            o->temperature = request_temperature(o->temperature);
            break;
        case OPT_TOP_P:
            rc = parse_float("--top-p", optarg, 0, 1, 1, &o->top_p);
            o->top_p = fmaxf(o->top_p, FLT_MIN); /* tiny but positive: the most likely token only */
            break;
        case OPT_SEED: {
            char *end;
            errno = 0;
            o->seed = strtoull(optarg, &end, 10);
            if (errno || *end || end == optarg || optarg[0] == '-')
                rc = dcp_fail("--seed: '%s' is not a non-negative integer", optarg);
            break;
        }
        case OPT_MAX_MODEL_LEN: rc = parse_int("--max-model-len", optarg, 2, 1 << 24, &o->max_model_len); break;
        case OPT_MAX_NUM_SEQS: rc = parse_int("--max-num-seqs", optarg, 1, 1 << 20, &o->max_num_seqs); break;
        case OPT_MAX_BATCHED: rc = parse_int("--max-num-batched-tokens", optarg, 1, 1 << 20, &o->max_batched_tokens); break;
        case OPT_SKIP_INVALID: o->skip_invalid = 1; break;
        case OPT_RESUME: o->resume = 1; break;
        case OPT_NO_JOURNAL: o->journal = 0; break;
        case OPT_STEP_TIMEOUT: {
            float t;
            rc = parse_float("--step-timeout", optarg, 0, 1e7f, 0, &t);
            o->step_timeout = t;
            break;
        }
        case OPT_PROGRESS: o->progress = 1; break;
        case OPT_NO_PROGRESS: o->progress = 0; break;
        case OPT_PROGRESS_INTERVAL: {
            float t;
            rc = parse_float("--progress-interval", optarg, 0, 1e7f, 1, &t);
            o->progress_interval = t;
            break;
        }
        case OPT_QUIET: o->quiet = 1; break;
        case OPT_HELP:
            if (print) options_usage(stdout);
            return 1;
        case OPT_VERSION:
            if (print) print_version(stdout);
            return 1;
        default:
            if (optopt >= OPT_MODEL) return dcp_fail("%s needs a value (see --help)", argv[optind - 1]);
            return dcp_fail("unknown option '%s' (see --help)", argv[optind - 1]);
        }
        if (rc) return -1;
    }
    if (!o->output_format) {
        size_t n = strlen(o->output);
        o->output_format = n > 6 && !strcmp(o->output + n - 6, ".jsonl") ? "jsonl" : "hdf5";
    }
    if (flags & OPTIONS_NO_PROMPTS) {
        if (optind < argc) return dcp_fail("unexpected argument '%s' (see --help)", argv[optind]);
    } else {
        if (optind >= argc) return dcp_fail("no prompt file given (usage: dcpinfer [OPTIONS] PROMPTS.jsonl)");
        if (optind + 1 < argc)
            return dcp_fail("one prompt file expected, got '%s' and '%s'", argv[optind], argv[optind + 1]);
        o->prompts = argv[optind];
    }

    if (o->resume && !o->journal)
        return dcp_fail("--resume and --no-journal: a resumed run records its own finished requests too");
    if (o->max_num_seqs > o->max_batched_tokens)
        return dcp_fail("--max-num-seqs %d exceeds --max-num-batched-tokens %d: every running request needs "
                        "a token in each step",
                        o->max_num_seqs, o->max_batched_tokens);
    return 0;
}
