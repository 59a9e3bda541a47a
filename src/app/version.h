/* dcpinfer --version. */
#ifndef DCP_VERSION_H
#define DCP_VERSION_H

#include <stdio.h>

/* The release, how this build was configured, its backends and the
 * libraries it runs with. */
void print_version(FILE *f);

#endif
