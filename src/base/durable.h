/* Files that survive a crash or a power loss whole: written under a
 * temporary name, synced, renamed into place, and the folder synced, so
 * that the name points at either the old file or the complete new one. */
#ifndef DCP_DURABLE_H
#define DCP_DURABLE_H

#include <stddef.h>

/* PATH.tmp.HOST.PID: the temporary name of one process's replacement of
 * path (malloc'ed); durable_remove_stale removes those of this host whose
 * process no longer runs. */
char *durable_temp_name(const char *path);
void durable_remove_stale(const char *path);

/* Writes n bytes as path's new content: temporary, fsync, rename, fsync of
 * the folder. A failure (a full disk) leaves any earlier file at path as
 * it was and removes the temporary. */
int durable_replace(const char *path, const void *data, size_t n);
/* Renames the synced file tmp to path and syncs the folder. */
int durable_rename(const char *tmp, const char *path);
/* Syncs the folder holding path (its entries: renames, removals). */
int durable_sync_dir(const char *path);

/* A named point in the writing of the file at path: "written" (the
 * temporary synced), "renamed" (in place), "removed" (deleted), and the
 * journal's. A no-op in dcpinfer; the test build tests/dcpinfer-crash
 * replaces it to kill the process at a chosen point (tests/crash_points.c). */
void crash_point(const char *where, const char *path);

#endif
