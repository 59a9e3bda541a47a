/* One error check for every status type dcpinfer meets: MPI return codes
 * here, cudaError_t in cuda/check.cuh (an overload of the
 * same function). A failure prints file, line, the statement, the error
 * and the MPI rank, then stops the job. */
#ifndef DCP_CHECK_H
#define DCP_CHECK_H

#ifdef __cplusplus
extern "C" {
#endif

/* Prints "dcpinfer: rank R: FILE:LINE: STMT: WHAT" and aborts the job. */
void dcp_check_failed(const char *file, int line, const char *stmt, const char *what);
/* The rank from the launcher's environment (usable before MPI_Init). */
int dcp_env_rank(void);
/* MPI return codes (MPI_SUCCESS is 0). */
void dcp_check_mpi(int rc, const char *file, int line, const char *stmt);

#ifdef __cplusplus
}
#endif

#ifndef __cplusplus
#define DCP_CHECK(stmt) dcp_check_mpi((stmt), __FILE__, __LINE__, #stmt)
#else
#define DCP_CHECK(stmt) dcp_check((stmt), __FILE__, __LINE__, #stmt)
#endif

#endif
