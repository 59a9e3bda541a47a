/* dcpinfer that kills itself at a chosen point of writing its files: linked
 * into a test build of the program (tests/dcpinfer-crash), this definition
 * takes the place of the library's no-op crash_point (base/durable.h).
 * DCP_CRASH_AT names the point ("written", "renamed", "removed",
 * "appended"), DCP_CRASH_PATH, if set, the end of the file's path, and
 * DCP_CRASH_COUNT, if set, which time the point is met (1: the first); the
 * process then dies by SIGKILL, as a crash or a lost node would end it;
 * with DCP_CRASH_SIGNAL=STOP it stops instead (SIGSTOP), holding what it
 * holds, until a SIGCONT. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void crash_point(const char *where, const char *path);

void crash_point(const char *where, const char *path)
{
    const char *at = getenv("DCP_CRASH_AT"), *file = getenv("DCP_CRASH_PATH");
    if (!at || strcmp(at, where)) return;
    size_t n = strlen(path), m = file ? strlen(file) : 0;
    if (file && (m > n || strcmp(path + n - m, file))) return;
    static int met;
    const char *count = getenv("DCP_CRASH_COUNT");
    if (++met != (count ? atoi(count) : 1)) return; /* that time only (a stopped process goes on after) */
    const char *sig = getenv("DCP_CRASH_SIGNAL");
    kill(getpid(), sig && !strcmp(sig, "STOP") ? SIGSTOP : SIGKILL);
}
