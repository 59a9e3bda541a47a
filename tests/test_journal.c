/* The journal proves its records: a changed byte fails the checksum, and a
 * record with a valid checksum that does not fit its request (ids outside
 * the vocabulary, more tokens than max_tokens, log-probabilities nobody
 * asked for, another request's id) is dropped, and so is one written by a
 * run of another identity; duplicates count once,
 * conflicting ones not at all. Journal files are taken by exact name and
 * only as regular files; the syncer puts a line on the disk without a
 * later append; the output's lock keeps a second job out. */
#include <fcntl.h>
#include <sys/stat.h>

#include "identity.h"
#include "journal.h"
#include "testutil.h"

static Config cfg = {.vocab_size = 100, .n_eos = 1, .eos_ids = {2}};

/* a finished result of n tokens t0, t0+1, ... (all below the vocabulary) */
static Result result_of(int n, int t0)
{
    Result r = {0};
    r.n = r.cap = n;
    r.tokens = xmalloc(sizeof(int) * (size_t)n);
    r.times = xmalloc(sizeof(double) * (size_t)n);
    for (int k = 0; k < n; k++) r.tokens[k] = t0 + k, r.times[k] = 0.01 * k;
    r.finish_reason = "length";
    r.stop_token = -1;
    r.ttft_s = 0.01, r.tpot_s = 0.01, r.e2e_s = 0.05;
    return r;
}

static char *path_in(const char *dir, const char *name)
{
    char *p = xmalloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

/* the cached prompt positions of each request the last load took */
static int loaded_cached[8];

/* journal_load of out into fresh results; returns taken, fills st */
static int load(const char *out, const RunIdentity *id, const RequestSet *rs, JournalLoad *st, int *rc)
{
    JournalCheck chk = {&cfg, 1000, 0};
    Result *res = xcalloc((size_t)rs->n, sizeof(Result));
    char *done = xcalloc((size_t)rs->n, 1);
    *rc = journal_load(out, id, rs, &chk, res, done, st);
    for (int i = 0; i < rs->n && i < 8; i++) loaded_cached[i] = res[i].num_cached_tokens;
    results_free(res, rs->n);
    free(res);
    free(done);
    return st->taken;
}

/* replaces the first occurrence of from by to in file path */
static void edit(const char *path, const char *from, const char *to)
{
    char *data;
    size_t n;
    if (read_file(path, &data, &n)) return;
    char *at = strstr(data, from);
    CHECK(at != NULL, "'%s' not in %s", from, path);
    FILE *f = fopen(path, "w");
    if (at) {
        fwrite(data, 1, (size_t)(at - data), f);
        fputs(to, f);
        fputs(at + strlen(from), f);
    }
    fclose(f);
    free(data);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    char *dir = scratch_dir(), *out = path_in(dir, "out.h5");
    RequestSet rs = {0};
    int ids[] = {5, 6, 7};
    for (int i = 0; i < 6; i++) add_request(&rs, ids, 3, 8, 0.0f, 1.0f, 1);
    RunIdentity id;
    memset(&id, 0, sizeof id);
    for (int k = 0; k < ID_N; k++) identity_set(&id, k, "v%d", k);

    /* requests 0-2 good; 3: an id outside the vocabulary; 4: log-
     * probabilities its request does not ask for; 5: 2,000,000 tokens for
     * max_tokens 8 */
    Journal j;
    CHECK(journal_open(&j, out, 0, &id, 10.0) == 0, "journal_open: %s", dcp_error());
    for (int i = 0; i < 3; i++) {
        Result r = result_of(8, 10 * i);
        r.num_cached_tokens = i; /* prompt positions from the prefix cache: fewer than the prompt's 3 */
        journal_append(&j, i, &rs.r[i], &r);
        results_free(&r, 1);
    }
    Result bad = result_of(8, 95); /* 95 .. 102: past the vocabulary of 100 */
    journal_append(&j, 3, &rs.r[3], &bad);
    results_free(&bad, 1);
    Result lp = result_of(8, 0);
    rs.r[4].logprobs = 2; /* as a request that asked for them would have them */
    lp.lp = xcalloc(8, sizeof(float)), lp.top_lp = xcalloc(16, sizeof(float)), lp.top_id = xcalloc(16, sizeof(int));
    journal_append(&j, 4, &rs.r[4], &lp);
    rs.r[4].logprobs = -1;
    results_free(&lp, 1);
    Result huge = result_of(2000000, 0);
    for (int k = 0; k < huge.n; k++) huge.tokens[k] = k % 50;
    journal_append(&j, 5, &rs.r[5], &huge);
    results_free(&huge, 1);
    journal_close(&j);
    JournalLoad st;
    int rc, taken = load(out, &id, &rs, &st, &rc);
    CHECK(rc == 0 && taken == 3 && st.dropped == 3, "taken %d (want 3), dropped %d (want 3): %s", taken, st.dropped,
          rc ? dcp_error() : st.first_drop);
    CHECK(strstr(st.first_drop, "out.h5.journal.dp0:5: a token id outside the vocabulary"), "first drop: %s",
          st.first_drop);
    CHECK(loaded_cached[0] == 0 && loaded_cached[1] == 1 && loaded_cached[2] == 2, "cached positions kept: %d %d %d",
          loaded_cached[0], loaded_cached[1], loaded_cached[2]);

    /* the record of request 4 fits a request that asks for 2 */
    rs.r[4].logprobs = 2;
    taken = load(out, &id, &rs, &st, &rc);
    CHECK(rc == 0 && taken == 4 && st.dropped == 2, "request 4 with logprobs 2: taken %d, dropped %d", taken, st.dropped);
    rs.r[4].logprobs = -1;
    char *dp0 = path_in(dir, "out.h5.journal.dp0");

    /* records are bound to their run: under another identity (other
     * inputs or options, with this journal's header spliced on) every one
     * fails its sum and runs again */
    RunIdentity foreign = id;
    identity_set(&foreign, ID_prompts, "another prompt file");
    char *dp0_other = path_in(dir, "other.h5.journal.dp0"), *other_out = path_in(dir, "other.h5");
    Journal jo;
    CHECK(journal_open(&jo, other_out, 0, &foreign, 10.0) == 0, "journal_open: %s", dcp_error());
    for (int i = 0; i < 3; i++) {
        Result r = result_of(8, 10 * i + 1);
        journal_append(&jo, i, &rs.r[i], &r);
        results_free(&r, 1);
    }
    journal_close(&jo);
    {
        char *a, *b;
        size_t na, nb;
        char *dp0a = path_in(dir, "out.h5.journal.dp0");
        CHECK(read_file(dp0a, &a, &na) == 0 && read_file(dp0_other, &b, &nb) == 0, "reading the journals");
        FILE *f = fopen(dp0_other, "w"); /* this run's header, the other run's records */
        fwrite(a, 1, (size_t)(strchr(a, '\n') + 1 - a), f);
        fputs(strchr(b, '\n') + 1, f);
        fclose(f);
        free(a), free(b), free(dp0a);
    }
    taken = load(other_out, &id, &rs, &st, &rc);
    CHECK(rc == 0 && taken == 0 && st.dropped == 3 && strstr(st.first_drop, "checksum"),
          "another run's records under this run's header: taken %d, dropped %d: %s", taken, st.dropped,
          rc ? dcp_error() : st.first_drop);
    taken = load(other_out, &foreign, &rs, &st, &rc); /* its own header refuses the file as a whole */
    CHECK(rc != 0, "the spliced journal under the other run's identity: accepted (%d taken)", taken);
    free(dp0_other), free(other_out);

    /* a changed digit fails the checksum */
    edit(dp0, "\"tokens\":[10,11", "\"tokens\":[10,13");
    taken = load(out, &id, &rs, &st, &rc);
    CHECK(rc == 0 && taken == 2 && strstr(st.first_drop, "checksum"), "flipped digit: taken %d, %s", taken, st.first_drop);

    /* a duplicate counts once; a conflicting record drops its request */
    CHECK(journal_open(&j, out, 1, &id, 10.0) == 0, "journal_open dp1");
    Result r0 = result_of(8, 0), r2 = result_of(8, 21);
    journal_append(&j, 0, &rs.r[0], &r0);
    journal_append(&j, 2, &rs.r[2], &r2);
    results_free(&r0, 1);
    results_free(&r2, 1);
    journal_close(&j);
    taken = load(out, &id, &rs, &st, &rc);
    CHECK(rc == 0 && taken == 1 && st.duplicates == 1, "duplicate and conflict: taken %d (want 1: request 0), dups %d",
          taken, st.duplicates);

    /* another identity is refused, naming the field */
    RunIdentity other = id;
    identity_set(&other, ID_dtype, "bfloat16");
    taken = load(out, &other, &rs, &st, &rc);
    CHECK(rc == -1 && strstr(dcp_error(), "another --dtype (resolved): \"v4\" there, \"bfloat16\" in this run"),
          "identity: %s", dcp_error());

    /* exact names: a FIFO named like a journal is refused, not read
     * (which would block); a link to /dev/zero too; other names ignored */
    char *fifo = path_in(dir, "out.h5.journal.dp7"), *link = path_in(dir, "out.h5.journal.dp8"),
         *other_name = path_in(dir, "out.h5.journal.dp1.bak");
    CHECK(mkfifo(fifo, 0644) == 0, "mkfifo");
    taken = load(out, &id, &rs, &st, &rc);
    CHECK(rc == -1 && strstr(dcp_error(), "out.h5.journal.dp7: not a regular file (a FIFO)"), "fifo: %s", dcp_error());
    unlink(fifo);
    CHECK(symlink("/dev/zero", link) == 0, "symlink");
    taken = load(out, &id, &rs, &st, &rc);
    CHECK(rc == -1 && strstr(dcp_error(), "a symbolic link"), "link: %s", dcp_error());
    unlink(link);
    FILE *f = fopen(other_name, "w");
    fputs("garbage\n", f);
    fclose(f);
    taken = load(out, &id, &rs, &st, &rc);
    CHECK(rc == 0 && st.files == 2, "a .bak beside the journals is not one: %d files, %s", st.files, dcp_error());

    /* the syncer puts an appended line on the disk with no later append */
    CHECK(journal_open(&j, out, 2, &id, 0.05) == 0, "journal_open dp2");
    Result r1 = result_of(8, 10);
    journal_append(&j, 1, &rs.r[1], &r1);
    results_free(&r1, 1);
    usleep(400000);
    pthread_mutex_lock(&j.lock);
    long syncs = j.syncs;
    pthread_mutex_unlock(&j.lock);
    CHECK(syncs >= 1, "the line was not synced within 0.4 s (interval 0.05 s): %ld syncs", syncs);
    journal_close(&j);

    /* consolidation keeps every finished request and leaves one file */
    Result *res = xcalloc((size_t)rs.n, sizeof(Result));
    char *done = xcalloc((size_t)rs.n, 1);
    JournalCheck chk = {&cfg, 1000, 0};
    CHECK(journal_load(out, &id, &rs, &chk, res, done, &st) == 0, "load");
    int before = st.taken;
    CHECK(journal_consolidate(out, &id, &rs, res, done) == 0, "consolidate: %s", dcp_error());
    taken = load(out, &id, &rs, &st, &rc);
    CHECK(taken == before && st.files == 1 && st.dropped == 0, "after consolidation: %d taken of %d, %d files", taken,
          before, st.files);
    results_free(res, rs.n);
    free(res);
    free(done);

    /* a second holder of the output's lock is refused, naming the first */
    OutputLock a, b;
    CHECK(output_lock(&a, out) == 0, "first lock: %s", dcp_error());
    CHECK(output_lock(&b, out) == -1 && strstr(dcp_error(), "another dcpinfer job is writing this output (host "),
          "second lock: %s", dcp_error());
    output_unlock(&a);
    CHECK(output_lock(&b, out) == 0, "lock after release: %s", dcp_error());
    output_unlock(&b);
    char *lock = path_in(dir, "out.h5.lock");
    CHECK(access(lock, F_OK) != 0, "the lock file is removed with the lock");

    free(fifo), free(link), free(other_name), free(dp0), free(lock);
    requests_free(&rs);
    remove_tree(dir);
    free(dir);
    free(out);
    int status = test_finish("test_journal");
    MPI_Finalize();
    return status;
}
