/* The journal of finished requests, so that a run stopped by a crash, a
 * kill or a job time limit can be resumed (--resume) without redoing the
 * requests it finished.
 *
 * Files beside the results file OUT, found by their exact names and read
 * only when they are regular files: OUT.journal holds what earlier runs
 * finished (consolidated at the start of a resumed run), OUT.journal.dpG
 * what DP group G of this run finishes, appended by the group's TP rank 0
 * as requests finish. Each file starts with a header line holding the run
 * identity (identity.h), then one JSON line per finished request: its
 * index and line in the prompt file, id, tokens, token times, finish reason,
 * latencies and what else the request asked for, under a checksum of the
 * line. A resumed run takes a record only when its checksum holds and it
 * fits the request it names (ids within the vocabulary, at most max_tokens
 * tokens, the fields the request asked for); any other is dropped and its
 * request redone. The files are removed once the results file is written.
 *
 * OUT.lock, held by rank 0 for the whole run (flock), makes a second job
 * on the same output refuse at its start. */
#ifndef DCP_JOURNAL_H
#define DCP_JOURNAL_H

#include <pthread.h>
#include <stdint.h>

#include "hparams.h"
#include "identity.h"
#include "requests.h"

/* What a journal record must fit, besides its request. */
typedef struct {
    const Config *cfg;  /* the vocabulary, and the EOS ids a stop token may be */
    int max_model_len;
    int has_text;       /* the run has a tokenizer: records carry their text */
} JournalCheck;

/* What journal_load found. */
typedef struct {
    int files;           /* journal files read */
    int taken;           /* requests taken (each once) */
    int dropped;         /* records that failed a check: their requests run again */
    int duplicates;      /* records equal to one taken already (a consolidation cut short) */
    char first_drop[320]; /* why the first was dropped: FILE:LINE: reason */
} JournalLoad;

/* The finished requests of earlier runs for output path out, from every
 * journal file of it; each file's identity must be id (else -1, with
 * dcp_error() naming the file and the first difference, nothing changed).
 * res (rs->n entries) receives each finished request's result and done[i]
 * is set for it. */
int journal_load(const char *out, const RunIdentity *id, const RequestSet *rs, const JournalCheck *chk, Result *res,
                 char *done, JournalLoad *st);
/* Rewrites the finished results (done[i]) as OUT.journal, then removes the
 * per-group files, so that this run's groups start their own. A crash at
 * any point leaves every finished request in some journal file. */
int journal_consolidate(const char *out, const RunIdentity *id, const RequestSet *rs, const Result *res,
                        const char *done);

typedef struct {
    int fd;
    char *path;
    double interval;      /* seconds: a line is on the disk this long after it was written, at most */
    uint64_t id_sum;      /* where its records' sums start: the run's identity */
    int dirty, stop;
    long syncs;           /* fdatasyncs made by the syncer */
    pthread_t syncer;
    pthread_mutex_t lock;
    pthread_cond_t wake;
} Journal;

/* Opens OUT.journal.dpG for this group's finished requests; a thread syncs
 * what was written every interval seconds (10 in dcpinfer). */
int journal_open(Journal *j, const char *out, int dp_group, const RunIdentity *id, double interval);
/* Appends request i (index in the prompt file): one write, in the kernel at
 * once (a killed process loses nothing), on the disk within the interval
 * (a lost node loses at most that). */
void journal_append(Journal *j, int i, const Request *q, const Result *r);
void journal_close(Journal *j);
/* Removes every journal file of out (after the results file is written,
 * or when a run starts afresh); returns how many there were. */
int journal_remove(const char *out);

typedef struct {
    int fd;
    char *path;
} OutputLock;
/* Takes OUT.lock for this run: fails, naming the holder, when another
 * job holds it. Where the file system has no locks, says so and goes on. */
int output_lock(OutputLock *l, const char *out);
void output_unlock(OutputLock *l);

#endif
