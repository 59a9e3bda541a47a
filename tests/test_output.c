/* A whole run (run_job) on the generated default model, read back from its
 * HDF5 file: layout, offsets, tokens equal to a direct generate(), failed
 * requests kept with their reasons, and no temporary file left behind. */
#include <dirent.h>
#include <hdf5.h>

#include "backend.h"
#include "engine.h"
#include "generate.h"
#include "job.h"
#include "model.h"
#include "options.h"
#include "testutil.h"

static long read_len(hid_t f, const char *name)
{
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    if (d < 0) return -1;
    hid_t s = H5Dget_space(d);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(s, &n, NULL);
    H5Sclose(s);
    H5Dclose(d);
    return (long)n;
}

static void *read_all(hid_t f, const char *name, hid_t type, size_t elem)
{
    long n = read_len(f, name);
    CHECK(n >= 0, "dataset %s missing", name);
    if (n < 0) return NULL;
    void *buf = xcalloc((size_t)n + 1, elem);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    if (n) H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
    H5Dclose(d);
    return buf;
}

static char **read_strings(hid_t f, const char *name)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    char **s = read_all(f, name, t, sizeof(char *));
    H5Tclose(t);
    return s;
}

static double read_attr_double(hid_t f, const char *name)
{
    double v = -1;
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    if (a >= 0) {
        H5Aread(a, H5T_NATIVE_DOUBLE, &v);
        H5Aclose(a);
    }
    return v;
}

static long long read_attr_int(hid_t f, const char *name)
{
    long long v = -1;
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    if (a >= 0) {
        H5Aread(a, H5T_NATIVE_LLONG, &v);
        H5Aclose(a);
    }
    return v;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    char *dir = scratch_dir();
    char prompts[4200], out[4200];
    snprintf(prompts, sizeof prompts, "%s/p.jsonl", dir);
    snprintf(out, sizeof out, "%s/out.h5", dir);
    FILE *fp = fopen(prompts, "w");
    fprintf(fp, "{\"id\": \"a\", \"prompt_token_ids\": [5, 6, 7, 8], \"max_tokens\": 9, \"temperature\": 0}\n");
    fprintf(fp, "{\"id\": \"b\", \"prompt_token_ids\": [300], \"max_tokens\": 4, \"seed\": 3}\n");
    fprintf(fp, "this line is broken\n");
    fprintf(fp, "{\"id\": \"long\", \"prompt_token_ids\": [1,2,3,4,5,6,7,8,9,10,11,12,13], \"max_tokens\": 2}\n");
    fprintf(fp, "{\"id\": \"text\", \"prompt\": \"needs a tokenizer\"}\n");
    fprintf(fp, "{\"id\": \"c\", \"prompt_token_ids\": [9, 9, 9, 9, 9, 9, 9, 9, 9, 9], \"max_tokens\": 50, "
                "\"temperature\": 0}\n");
    fclose(fp);

    char *args[] = {"dcpinfer", "--quiet", "--skip-invalid", "--max-model-len", "12", "--output", out, prompts, NULL};
    Options o;
    CHECK(options_parse(&o, 8, args, 0) == 0, "options: %s", dcp_error());
    /* three requests fail: results written, exit status 4 */
    CHECK(run_job(&o, MPI_COMM_WORLD, -1) == EXIT_SOME_FAILED, "run_job did not report failed requests");

    /* the same requests through generate() directly */
    Model m;
    model_load(&m, NULL, 1, 0);
    RequestSet rs = {0};
    int a[] = {5, 6, 7, 8}, b[] = {300}, c[] = {9, 9, 9, 9, 9, 9, 9, 9, 9, 9};
    add_request(&rs, a, 4, 9, 0.0f, 1.0f, 0);
    add_request(&rs, b, 1, 4, 1.0f, 1.0f, 3);
    add_request(&rs, c, 10, 50, 0.0f, 1.0f, 0);
    Timings tm = {0};
    Engine e;
    engine_init(&e, &m, backend_cpu(), NULL, NULL, &tm, NULL);
    GenOptions go = {.max_model_len = 12, .max_num_seqs = 8, .max_batched_tokens = 64};
    Result want[3];
    generate(&e, &rs, want, &go, NULL);
    engine_free(&e);

    DIR *d = opendir(dir);
    struct dirent *de;
    int files = 0;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') files++;
    closedir(d);
    CHECK(files == 2, "only p.jsonl and out.h5 in the folder (found %d entries)", files);

    hid_t f = H5Fopen(out, H5F_ACC_RDONLY, H5P_DEFAULT);
    CHECK(f >= 0, "open %s", out);
    if (f >= 0) {
        CHECK(read_attr_int(f, "world_size") == 1 && read_attr_int(f, "tp") == 1 && read_attr_int(f, "dcp") == 1 &&
                  read_attr_int(f, "dp") == 1 && read_attr_int(f, "n_kv_heads") == 2 &&
                  read_attr_int(f, "max_model_len") == 12,
              "root attributes");
        char **ids = read_strings(f, "/requests/id"), **fin = read_strings(f, "/requests/finish_reason"),
             **err = read_strings(f, "/requests/error");
        int64_t *ooff = read_all(f, "/requests/output_offsets", H5T_NATIVE_INT64, 8);
        int64_t *poff = read_all(f, "/requests/prompt_offsets", H5T_NATIVE_INT64, 8);
        int *otok = read_all(f, "/requests/output_tokens", H5T_NATIVE_INT, 4);
        int *ptok = read_all(f, "/requests/prompt_tokens", H5T_NATIVE_INT, 4);
        double *e2e = read_all(f, "/requests/e2e_s", H5T_NATIVE_DOUBLE, 8);
        double *ttft = read_all(f, "/requests/ttft_s", H5T_NATIVE_DOUBLE, 8);
        int64_t *ioff = read_all(f, "/requests/itl_offsets", H5T_NATIVE_INT64, 8);
        double *itl = read_all(f, "/requests/itl_s", H5T_NATIVE_DOUBLE, 8);
        double gen_s = read_attr_double(f, "generation_s");
        CHECK(read_len(f, "/requests/id") == 6 && read_len(f, "/requests/output_offsets") == 7 &&
                  read_len(f, "/requests/text") == 6 && read_len(f, "/requests/ttft_s") == 6,
              "six requests");
        CHECK(!strcmp(ids[0], "a") && !strcmp(ids[2], "line-3") && !strcmp(ids[5], "c"), "ids");
        CHECK(!strcmp(fin[0], "length") && !strcmp(fin[2], "error") && !strcmp(fin[3], "error") &&
                  !strcmp(fin[4], "error") && !strcmp(fin[5], "length"),
              "finish reasons %s %s %s %s %s", fin[0], fin[2], fin[3], fin[4], fin[5]);
        CHECK(strstr(err[2], "p.jsonl:3: invalid JSON") != NULL, "error of line 3: %s", err[2]);
        CHECK(strstr(err[3], "prompt has 13 tokens, above the context limit of 12") != NULL, "error: %s", err[3]);
        CHECK(strstr(err[4], "no tokenizer") != NULL, "error: %s", err[4]);
        CHECK(err[0][0] == '\0', "no error for a");
        int idx[3] = {0, 1, 5};
        for (int i = 0; i < 3; i++) {
            int r = idx[i];
            long n = (long)(ooff[r + 1] - ooff[r]);
            CHECK(n == want[i].n && !memcmp(otok + ooff[r], want[i].tokens, sizeof(int) * (size_t)n),
                  "tokens of %s", ids[r]);
            /* the first token comes at ttft, the last at e2e, and the gaps
             * between them are the request's inter-token latencies; all
             * of it inside the generation time */
            double gaps = 0;
            for (int64_t j = ioff[r]; j < ioff[r + 1]; j++) gaps += itl[j];
            CHECK(ttft[r] > 0 && ttft[r] <= e2e[r] && e2e[r] <= gen_s && fabs(e2e[r] - ttft[r] - gaps) < 1e-9,
                  "latencies of %s: ttft %g, e2e %g, sum of ITL %g, generation %g s", ids[r], ttft[r], e2e[r], gaps,
                  gen_s);
        }
        CHECK(ooff[6] - ooff[5] == 2, "c stops at the context limit: 10 + 2 = 12");
        CHECK(poff[1] == 4 && ptok[0] == 5 && poff[6] == 4 + 1 + 0 + 13 + 0 + 10, "prompt offsets");
        CHECK(read_len(f, "/timings/decode") == 1 && read_len(f, "/timings/load") == 1, "timings per rank");
        /* steps: every prompt token prefilled once, every later token decoded once (no preemption here) */
        long n_steps = read_len(f, "/steps/seconds");
        int *pre = read_all(f, "/steps/prefill_tokens", H5T_NATIVE_INT, 4);
        int *dec = read_all(f, "/steps/decode_tokens", H5T_NATIVE_INT, 4);
        int *used = read_all(f, "/steps/kv_blocks_used", H5T_NATIVE_INT, 4);
        long sum_pre = 0, sum_dec = 0, max_used = 0;
        for (long i = 0; i < n_steps; i++) {
            sum_pre += pre[i];
            sum_dec += dec[i];
            max_used = used[i] > max_used ? used[i] : max_used;
        }
        /* a: 8 tokens (4 + 8 reaches the context limit of 12), b: 4, c: 2 */
        CHECK(n_steps > 0 && sum_pre == 4 + 1 + 10 && sum_dec == (8 - 1) + (4 - 1) + (2 - 1) && max_used > 0,
              "steps: %ld, prefill tokens %ld (15), decode tokens %ld (11), blocks %ld", n_steps, sum_pre, sum_dec,
              max_used);
        CHECK(read_len(f, "/requests/itl_offsets") == 7 && ioff[6] == 11 && ioff[1] - ioff[0] == 7 && itl[0] >= 0,
              "inter-token latencies: one fewer than the tokens of each request");
        free(pre);
        free(dec);
        free(used);
        free(ioff);
        free(itl);
        H5Fclose(f);
        for (int i = 0; i < 6; i++) {
            free(ids[i]);
            free(fin[i]);
            free(err[i]);
        }
        free(ids);
        free(fin);
        free(err);
        free(ooff);
        free(poff);
        free(otok);
        free(ptok);
        free(e2e);
        free(ttft);
    }
    /* stop_token_ids: the first occurrence of a stop token ends the request,
     * kept in its tokens, finish reason "stop" */
    RequestSet rs2 = {0};
    Request *q = add_request(&rs2, c, 10, 20, 0.0f, 1.0f, 0);
    Result free_run, got;
    go.max_model_len = m.cfg.max_seq_len;
    engine_init(&e, &m, backend_cpu(), NULL, NULL, &tm, NULL);
    generate(&e, &rs2, &free_run, &go, NULL);
    int stop = free_run.tokens[5], first = 0;
    while (free_run.tokens[first] != stop) first++;
    q->stop_ids = xmalloc(sizeof(int));
    q->stop_ids[0] = stop;
    q->n_stop = 1;
    generate(&e, &rs2, &got, &go, NULL);
    engine_free(&e);
    CHECK(free_run.n == 20 && got.n == first + 1 && !memcmp(got.tokens, free_run.tokens, sizeof(int) * (size_t)got.n) &&
              !strcmp(got.finish_reason, "stop"),
          "stop token %d: %d tokens, finish %s", stop, got.n, got.finish_reason);
    results_free(&free_run, 1);
    results_free(&got, 1);
    requests_free(&rs2);
    results_free(want, 3);
    requests_free(&rs);
    model_free(&m);
    remove_tree(dir);
    free(dir);
    MPI_Finalize();
    return test_finish("test_output");
}
