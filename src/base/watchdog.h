/* --step-timeout: a thread that ends the process when the run has made no
 * progress for the given time. A rank that is stopped (SIGSTOP, a hung
 * node) leaves the others blocked in a collective forever; with the
 * watchdog they end within the timeout, and the launcher then ends the
 * job. Progress is a heartbeat after every step. */
#ifndef DCP_WATCHDOG_H
#define DCP_WATCHDOG_H

/* Starts watching (seconds > 0); rank names the process in the message,
 * which exits with status when the time passes. */
void watchdog_start(double seconds, int rank, int status);
/* Progress was made: the clock starts again. */
void watchdog_beat(void);
/* Stops watching (before work that is not a step, such as writing the
 * results on rank 0 while the others wait). */
void watchdog_stop(void);

#endif
