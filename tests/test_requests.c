/* Prompt-file parsing: both line formats, defaults, and each kind of bad
 * line reported as FILE:LINE: reason. */
#include "requests.h"
#include "testutil.h"

static char *write_tmp(const char *dir, const char *name, const char *text)
{
    char *p = xmalloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
    return p;
}

static const RequestDefaults defaults = {16, 1.0f, 1.0f, 5};

/* expects reading to fail with a message that contains want */
static void expect_error(const char *dir, const char *text, const char *want)
{
    char *p = write_tmp(dir, "bad.jsonl", text);
    RequestSet rs;
    int rc = requests_read(p, &defaults, 0, &rs);
    CHECK(rc == -1, "accepted: %s", text);
    CHECK(rc == -1 && strstr(dcp_error(), want), "message '%s' lacks '%s'", dcp_error(), want);
    CHECK(rc == -1 && !strchr(dcp_error(), '\n'), "message is one line");
    if (rc == 0) requests_free(&rs);
    free(p);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    char *dir = scratch_dir();
    char *p = write_tmp(dir, "good.jsonl",
                        "{\"id\": \"a\", \"prompt\": \"Hello\", \"max_tokens\": 5, \"temperature\": 0}\n"
                        "\n"
                        "{\"id\": 7, \"prompt_token_ids\": [1, 2, 3], \"seed\": 11, \"top_p\": 0.5, "
                        "\"stop_token_ids\": [9]}\n"
                        "{\"custom_id\": \"oa\", \"method\": \"POST\", \"url\": \"/v1/completions\", "
                        "\"body\": {\"model\": \"x\", \"prompt\": [4, 5], \"max_tokens\": 3}}\n"
                        "{\"prompt\": \"no id\"}\n");
    RequestSet rs;
    CHECK(requests_read(p, &defaults, 0, &rs) == 0, "good file: %s", dcp_error());
    CHECK(rs.n == 4, "4 requests, got %d", rs.n);
    if (rs.n == 4) {
        CHECK(!strcmp(rs.r[0].id, "a") && !strcmp(rs.r[0].prompt, "Hello") && rs.r[0].max_tokens == 5 &&
                  rs.r[0].temperature == 0.0f && rs.r[0].top_p == 1.0f && rs.r[0].line == 1,
              "request a");
        CHECK(!strcmp(rs.r[1].id, "7") && rs.r[1].n_prompt == 3 && rs.r[1].prompt_tokens[2] == 3 &&
                  rs.r[1].seed == 11 && rs.r[1].top_p == 0.5f && rs.r[1].n_stop == 1 && rs.r[1].stop_ids[0] == 9 &&
                  rs.r[1].max_tokens == 16 && rs.r[1].temperature == 1.0f && rs.r[1].line == 3,
              "request 7");
        CHECK(!strcmp(rs.r[2].id, "oa") && rs.r[2].n_prompt == 2 && rs.r[2].prompt_tokens[1] == 5 &&
                  rs.r[2].max_tokens == 3,
              "OpenAI batch line");
        CHECK(!strcmp(rs.r[3].id, "line-5"), "default id is the line: %s", rs.r[3].id);
        CHECK(rs.r[0].seed != rs.r[3].seed, "derived seeds differ per line");
        requests_free(&rs);
    }
    free(p);

    expect_error(dir, "{\"prompt\": \"a\"}\n{\"id\": \"b\", \"prompt_token_ids\": [1, 2\n", "bad.jsonl:2: invalid JSON");
    expect_error(dir, "{\"id\": \"a\", \"prompt_token_ids\": \"1 2 3\"}\n", "bad.jsonl:1: wrong field type");
    expect_error(dir, "{\"id\": \"a\", \"prompt\": 17}\n", "bad.jsonl:1: wrong field type: \"prompt\"");
    expect_error(dir, "{\"id\": \"a\", \"prompt\": \"x\", \"max_tokens\": 0}\n", ":1: \"max_tokens\" must be");
    expect_error(dir, "{\"id\": \"a\", \"prompt\": \"x\", \"temperature\": -1}\n", ":1: \"temperature\"");
    expect_error(dir, "{\"id\": \"a\", \"prompt\": \"x\", \"top_p\": 1.5}\n", ":1: \"top_p\"");
    expect_error(dir, "{\"id\": \"a\", \"prompt\": \"x\", \"max_token\": 3}\n",
                 ":1: unknown field \"max_token\" (did you mean \"max_tokens\"?)");
    expect_error(dir, "{\"id\": \"a\", \"prompt\": \"x\", \"temprature\": 0}\n", "(did you mean \"temperature\"?)");
    expect_error(dir, "{\"id\": \"a\", \"prompt\": \"x\", \"best_of\": 2}\n", ":1: unknown field \"best_of\"");
    expect_error(dir, "{\"id\": \"a\", \"prompt\": \"x\", \"n\": 0}\n", ":1: \"n\" must be an integer in [1, 128]");
    expect_error(dir, "{\"id\": \"a\", \"prompt\": \"x\", \"n\": 129}\n", ":1: \"n\" must be an integer in [1, 128]");
    expect_error(dir, "{\"id\": \"a\", \"prompt\": \"x\", \"stream\": true}\n", ":1: \"stream\" must be false");
    expect_error(dir, "{\"id\": \"a\", \"prompt\": \"x\", \"max_tokens\": 3, \"max_completion_tokens\": 4}\n",
                 "\"max_tokens\" and \"max_completion_tokens\" differ");
    /* what OpenAI client files carry and change nothing: n 1, stream
     * false, user; max_completion_tokens is max_tokens */
    p = write_tmp(dir, "client.jsonl",
                  "{\"id\": \"a\", \"prompt\": \"x\", \"n\": 1, \"stream\": false, \"user\": \"u1\", \"max_completion_tokens\": 7}\n"
                  "{\"custom_id\": \"b\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"model\": \"m\", "
                  "\"prompt\": \"y\", \"n\": 1, \"user\": \"u2\", \"max_completion_tokens\": 9, \"max_tokens\": 9}}\n");
    CHECK(requests_read(p, &defaults, 0, &rs) == 0 && rs.n == 2 && rs.r[0].max_tokens == 7 && rs.r[1].max_tokens == 9,
          "client fields: %s", dcp_error());
    if (rs.n) requests_free(&rs);
    free(p);
    expect_error(dir, "{\"id\": \"a\"}\n", ":1: missing \"prompt\"");
    expect_error(dir, "{\"id\": \"a\", \"prompt_token_ids\": []}\n", ":1: empty token id list");
    expect_error(dir, "[1, 2]\n", ":1: a request must be a JSON object");
    expect_error(dir, "{\"id\": \"a\", \"prompt\": \"x\"}\n{\"id\": \"a\", \"prompt\": \"y\"}\n",
                 ":2: duplicate id \"a\" (first on line 1)");
    expect_error(dir, "", "no requests (the prompt file is empty)");
    expect_error(dir, "\n  \n", "no requests");

    /* --skip-invalid keeps the bad line as a failed request */
    p = write_tmp(dir, "mixed.jsonl", "{\"id\": \"a\", \"prompt_token_ids\": [1]}\nnot json\n{\"id\": \"c\", "
                                      "\"prompt_token_ids\": [1, 600]}\n");
    CHECK(requests_read(p, &defaults, 1, &rs) == 0, "skip-invalid read");
    CHECK(rs.n == 3 && !rs.r[0].error && rs.r[1].error && strstr(rs.r[1].error, "mixed.jsonl:2: invalid JSON"),
          "line 2 kept as failed");
    CHECK(requests_check_vocab(&rs, 512, 1) == 0 && rs.r[2].error &&
              strstr(rs.r[2].error, "mixed.jsonl:3: token id 600 at position 1 is outside the vocabulary [0, 512)"),
          "vocabulary check: %s", rs.r[2].error ? rs.r[2].error : "(none)");
    requests_free(&rs);
    CHECK(requests_read(p, &defaults, 0, &rs) == -1 && strstr(dcp_error(), "mixed.jsonl:2:"), "strict read stops");
    free(p);
    p = write_tmp(dir, "vocab.jsonl", "{\"id\": \"a\", \"prompt_token_ids\": [1, -3]}\n");
    CHECK(requests_read(p, &defaults, 0, &rs) == 0, "vocab file parses");
    CHECK(requests_check_vocab(&rs, 512, 0) == -1 && strstr(dcp_error(), "vocab.jsonl:1: token id -3"),
          "negative token id");
    requests_free(&rs);
    free(p);
    remove_tree(dir);
    free(dir);
    MPI_Finalize();
    return test_finish("test_requests");
}
