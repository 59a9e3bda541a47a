#include "watchdog.h"

#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "util.h"

static double timeout_s, last_beat;
static int watch_rank, exit_status, running;
static pthread_t thread;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void *watch(void *arg)
{
    (void)arg;
    for (;;) {
        usleep(100000);
        pthread_mutex_lock(&lock);
        int on = running;
        double idle = now_s() - last_beat;
        pthread_mutex_unlock(&lock);
        if (!on) return NULL;
        if (idle >= timeout_s) {
            fprintf(stderr,
                    "dcpinfer: rank %d: no step completed in %.0f s (--step-timeout); another rank is stopped or "
                    "hung, or a step is slower than the timeout: ending the job (rerun with --resume to continue)\n",
                    watch_rank, idle);
            fflush(stderr);
            _exit(exit_status);
        }
    }
}

void watchdog_start(double seconds, int rank, int status)
{
    if (seconds <= 0 || running) return;
    timeout_s = seconds;
    watch_rank = rank;
    exit_status = status;
    last_beat = now_s();
    running = 1;
    pthread_create(&thread, NULL, watch, NULL);
}

void watchdog_beat(void)
{
    pthread_mutex_lock(&lock);
    last_beat = now_s();
    pthread_mutex_unlock(&lock);
}

void watchdog_stop(void)
{
    if (!running) return;
    pthread_mutex_lock(&lock);
    running = 0;
    pthread_mutex_unlock(&lock);
    pthread_join(thread, NULL);
}
