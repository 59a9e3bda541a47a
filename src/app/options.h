/* Command-line options of dcpinfer; names follow vLLM where it has one. */
#ifndef DCP_OPTIONS_H
#define DCP_OPTIONS_H

#include <stdint.h>
#include <stdio.h>

#include "engine.h"
#include "model.h"
#include "requests.h"
#include "spec.h"

typedef struct {
    const char *prompts;
    const char *model;     /* NULL: generated default model */
    const char *tokenizer;
    const char *chat_template; /* a file overriding the tokenizer's chat template */
    int reasoning_parser;      /* reasoning.h: how the output splits into reasoning and content */
    const char *output;
    const char *output_format; /* hdf5 | jsonl, from --output-format or the output's extension */
    const char *backend;
    const char *cpu_gemm;  /* invariant | openblas */
    const char *cpu_isa;   /* auto | avx512 | avx2 | generic: the CPU kernels */
    int max_tokens;
    int max_tokens_given;          /* --max-tokens on the command line (else an OpenAI chat body runs to the context) */
    const char *served_model_name; /* OpenAI responses' "model"; NULL: the model folder's name */
    float temperature;
    float top_p;
    uint64_t seed;
    SamplingExtra sampling; /* --top-k, --min-p and the penalties: defaults for requests */
    int max_model_len;     /* 0: the model's */
    int max_num_seqs;
    int max_batched_tokens;
    int skip_invalid;
    int progress;          /* -1: when stderr is a terminal or a launcher started the run */
    double progress_interval; /* seconds between progress updates; 0: 1 on a terminal, else 10 */
    int quiet;
    int tp, dcp, dp;       /* dp 0: world / tp */
    int interleave;        /* --cp-kv-cache-interleave-size */
    const char *dcp_comm_backend; /* ag_rs | a2a */
    int expert_parallel;   /* --enable-expert-parallel: routed experts whole over world */
    size_t kv_cache_memory;  /* bytes of K/V per rank */
    int kv_cache_memory_given;     /* --kv-cache-memory: on a GPU, instead of what the budget leaves */
    double gpu_memory_utilization; /* GPU backends: the share of the device's memory dcpinfer takes */
    int block_size;          /* positions per KV block per rank */
    int prefix_caching;      /* reuse cached full KV blocks (default on) */
    const char *mpi_device_buffers; /* auto | yes | no */
    const char *dtype;               /* auto | float32 | bfloat16: GEMM weights */
    const char *kv_cache_dtype;      /* auto | float32 | bfloat16 | fp8 | fp8_e4m3 (options_kv_dtype) */
    const char *nvfp4_activations;   /* auto | weight-only | emulate: a W4A4 checkpoint's activations */
    int resume;            /* reuse the journal of an earlier run of the same output */
    int journal;           /* record finished requests as they finish (default on) */
    double step_timeout;   /* seconds without a finished step before the job ends; 0: off */
    SpecConfig spec;       /* --speculative-config */
    const char *spec_json; /* its text; NULL: none */
} Options;

/* flags: OPTIONS_PRINT prints --help and --version; OPTIONS_NO_PROMPTS
 * takes no prompt file (dcpinfer-plan). 0: run; 1: --help or --version
 * printed, exit 0; -1: error in dcp_error(). */
enum { OPTIONS_PRINT = 1, OPTIONS_NO_PROMPTS = 2 };
int options_parse(Options *o, int argc, char **argv, int flags);
/* What --nvfp4-activations resolves to: "emulate" when asked for, else
 * "weight-only" (auto: no backend here has FP4 math to run them on) */
const char *options_nvfp4_activations(const Options *o);
/* The KV cache's element type --kv-cache-dtype names for the model c:
 * auto is the checkpoint's, as vLLM's: FP8 for one with FP8 KV scales
 * (QuantConfig.kv_fp8), bf16 for one whose torch_dtype is bfloat16
 * (quantized ones too), else float32 */
DType options_kv_dtype(const Options *o, const Config *c);
/* The engine's options these say for the model c: the DCP merge, the KV
 * cache's memory, block size and type, the W4A4 activations (a run adds
 * how MPI takes device buffers). */
EngineOptions options_engine(const Options *o, const Config *c);
/* The context limit: --max-model-len, else the model's; -1 when it
 * exceeds the model's (dcp_error() says so). */
int options_max_model_len(const Options *o, const Config *c, int *out);
void options_usage(FILE *f);

#endif
