/* Bulk transfers between ranks outside the forward pass: the prompt file
 * from rank 0 to every rank, results and step records to rank 0. MPI takes
 * int counts, and a big run's token arrays can pass 2^31 elements, so
 * every transfer here moves at most xfer_chunk bytes or elements per call.
 * Every MPI call is checked (DCP_CHECK). */
#ifndef DCP_TRANSFER_H
#define DCP_TRANSFER_H

#include <mpi.h>
#include <stddef.h>

/* bytes per call: 2^30; tests lower it to
 * check the chunking */
extern size_t xfer_chunk;

/* buf (bytes) from root to every rank. */
void xfer_bcast(void *buf, size_t bytes, int root, MPI_Comm comm);
/* Every rank's send (its own byte count) to root, concatenated in rank
 * order: root gets a malloc'ed buffer and, in counts (size ranks), each
 * rank's byte count; other ranks get NULL. */
void *xfer_gather(const void *send, size_t bytes, size_t *counts, int root, MPI_Comm comm);

#endif
