#include "durable.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

__attribute__((weak)) void crash_point(const char *where, const char *path)
{
    (void)where;
    (void)path;
}

/* The folder of path ("." for a bare name), malloc'ed. */
static char *folder_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? xstrdup(path) : xstrdup(".");
    if (slash) dir[slash - path + (slash == path)] = '\0';
    return dir;
}

char *durable_temp_name(const char *path)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    size_t n = strlen(path) + strlen(host) + 32;
    char *tmp = xmalloc(n);
    snprintf(tmp, n, "%s.tmp.%s.%ld", path, host, (long)getpid());
    return tmp;
}

void durable_remove_stale(const char *path)
{
    char *dir = folder_of(path);
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    char host[256] = "", prefix[1024];
    gethostname(host, sizeof host - 1);
    snprintf(prefix, sizeof prefix, "%s.tmp.%s.", base, host);
    DIR *d = opendir(dir);
    struct dirent *ent;
    while (d && (ent = readdir(d))) {
        if (strncmp(ent->d_name, prefix, strlen(prefix))) continue;
        char *end;
        long pid = strtol(ent->d_name + strlen(prefix), &end, 10);
        if (*end || pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* still running: another run's file */
        char *full = xmalloc(strlen(dir) + strlen(ent->d_name) + 2);
        sprintf(full, "%s/%s", dir, ent->d_name);
        if (unlink(full) == 0) fprintf(stderr, "dcpinfer: removed %s, left by an earlier run that stopped while writing\n", full);
        free(full);
    }
    if (d) closedir(d);
    free(dir);
}

int durable_sync_dir(const char *path)
{
    char *dir = folder_of(path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY), rc = 0;
    /* some file systems cannot sync a folder (EINVAL): their renames are
     * as durable as they get */
    if (fd < 0 || (fsync(fd) && errno != EINVAL && errno != EROFS))
        rc = dcp_fail("%s: cannot sync the folder %s: %s", path, dir, strerror(errno));
    if (fd >= 0) close(fd);
    free(dir);
    return rc;
}

int durable_rename(const char *tmp, const char *path)
{
    if (rename(tmp, path)) return dcp_fail("%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
    crash_point("renamed", path);
    return durable_sync_dir(path);
}

int durable_replace(const char *path, const void *data, size_t n)
{
    char *tmp = durable_temp_name(path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644), rc = 0;
    if (fd < 0) rc = dcp_fail("%s: cannot create %s: %s", path, tmp, strerror(errno));
    for (size_t done = 0; !rc && done < n;) {
        ssize_t w = write(fd, (const char *)data + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) rc = dcp_fail("%s: writing %s failed after %zu of %zu bytes: %s", path, tmp, done, n,
                                  w < 0 ? strerror(errno) : "no progress");
        else done += (size_t)w;
    }
    if (!rc && fsync(fd)) rc = dcp_fail("%s: writing %s failed: %s", path, tmp, strerror(errno));
    if (fd >= 0 && close(fd) && !rc) rc = dcp_fail("%s: writing %s failed: %s", path, tmp, strerror(errno));
    if (!rc) crash_point("written", path);
    if (!rc) rc = durable_rename(tmp, path);
    if (rc && fd >= 0) unlink(tmp);
    free(tmp);
    return rc;
}
