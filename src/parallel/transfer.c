#include "transfer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "util.h"

size_t xfer_chunk = (size_t)1 << 30;

void xfer_bcast(void *buf, size_t bytes, int root, MPI_Comm comm)
{
    for (size_t off = 0; off < bytes; off += xfer_chunk) {
        size_t n = bytes - off < xfer_chunk ? bytes - off : xfer_chunk;
        DCP_CHECK(MPI_Bcast((char *)buf + off, (int)n, MPI_BYTE, root, comm));
    }
}

void *xfer_gather(const void *send, size_t bytes, size_t *counts, int root, MPI_Comm comm)
{
    int rank, size;
    DCP_CHECK(MPI_Comm_rank(comm, &rank));
    DCP_CHECK(MPI_Comm_size(comm, &size));
    uint64_t mine = bytes, *all = rank == root ? xmalloc(sizeof(uint64_t) * (size_t)size) : NULL;
    DCP_CHECK(MPI_Gather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, root, comm));
    if (rank != root) {
        for (size_t off = 0; off < bytes; off += xfer_chunk) {
            size_t n = bytes - off < xfer_chunk ? bytes - off : xfer_chunk;
            DCP_CHECK(MPI_Send((const char *)send + off, (int)n, MPI_BYTE, root, 0, comm));
        }
        return NULL;
    }
    size_t total = 0;
    for (int r = 0; r < size; r++) total += counts[r] = (size_t)all[r];
    char *out = xmalloc(total ? total : 1), *at = out;
    for (int r = 0; r < size; r++) {
        if (r == root) {
            if (bytes) memcpy(at, send, bytes);
        } else {
            for (size_t off = 0; off < counts[r]; off += xfer_chunk) {
                size_t n = counts[r] - off < xfer_chunk ? counts[r] - off : xfer_chunk;
                DCP_CHECK(MPI_Recv(at + off, (int)n, MPI_BYTE, r, 0, comm, MPI_STATUS_IGNORE));
            }
        }
        at += counts[r];
    }
    free(all);
    return out;
}
