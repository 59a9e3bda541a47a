/* The journal of finished requests, so that a run stopped by a crash, a
 * kill or a job time limit can be resumed (--resume) without redoing the
 * requests it finished.
 *
 * Files beside the results file OUT: OUT.journal holds what earlier runs
 * finished (consolidated at the start of a resumed run), OUT.journal.dpG
 * what DP group G of this run finishes, appended by the group's TP rank 0
 * as requests finish. Each file starts with a header line naming what the
 * results depend on (model, prompt file, sampling options), then one JSON
 * line per finished request: its index in the prompt file, id, tokens,
 * token times, finish reason and latencies. A line cut short by a kill is
 * ignored. The files are removed once the results file is written. */
#ifndef DCP_JOURNAL_H
#define DCP_JOURNAL_H

#include <stdint.h>
#include <stdio.h>

#include "generate.h"
#include "requests.h"

/* What the results depend on, as hex digests: the model (its path and
 * shapes), the prompt file's bytes, and the options that change tokens. */
typedef struct {
    char model[17], prompts[17], sampling[17];
} Fingerprint;

void fingerprint_hex(uint64_t h, char out[17]);

typedef struct {
    FILE *f;
    char *path;
    double last_sync;
} Journal;

/* The finished requests of earlier runs for output path out: every
 * journal file of it, checked against fp. res (rs->n entries) receives
 * each finished request's result and done[i] is set for it; returns how
 * many, or -1 (dcp_error) when a journal was written for other inputs. */
int journal_load(const char *out, const Fingerprint *fp, const RequestSet *rs, Result *res, char *done);
/* Rewrites the finished results (done[i]) as OUT.journal and removes the
 * per-group files, so that this run's groups start their own. */
int journal_consolidate(const char *out, const Fingerprint *fp, const RequestSet *rs, const Result *res,
                        const char *done);
/* Opens OUT.journal.dpG for appending this group's finished requests. */
int journal_open(Journal *j, const char *out, int dp_group, const Fingerprint *fp);
/* Appends request i (index in the prompt file); the line reaches the
 * kernel at once and the disk at most every 10 s. */
void journal_append(Journal *j, int i, const Request *q, const Result *r);
void journal_close(Journal *j);
/* Removes every journal file of out (after the results file is written,
 * or when a run starts afresh); returns how many there were. */
int journal_remove(const char *out);

/* The fingerprint stored in a complete results file (its root attribute
 * "resume_fingerprint"), or "" when there is none. */
void fingerprint_line(const Fingerprint *fp, char *buf, size_t n);

#endif
