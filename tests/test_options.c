/* The command line as getopt reads it decides the GPU: every form of
 * --backend (joined with '=', one dash, abbreviated) gives the backend
 * that main() hands to device_select() before MPI_Init. The GPU choice
 * used to scan argv by hand and missed the abbreviated and '=' forms, so
 * every rank could land on GPU 0. */
#include "options.h"
#include "testutil.h"

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const char *forms[][4] = {{"--backend", "cuda", NULL}, {"--backend=cuda", NULL},
                              {"-backend", "cuda", NULL},  {"-backend=cuda", NULL},
                              {"--back", "cuda", NULL},    {"--ba=cuda", NULL}};
    for (size_t k = 0; k < sizeof forms / sizeof *forms; k++) {
        char *args[8] = {"dcpinfer"};
        int n = 1;
        for (int j = 0; forms[k][j]; j++) args[n++] = (char *)forms[k][j];
        args[n++] = "p.jsonl";
        Options o;
        int rc = options_parse(&o, n, args, 0);
        CHECK(rc == 0 && !strcmp(o.backend, "cuda"), "%s %s: backend %s (%s)", forms[k][0],
              forms[k][1] ? forms[k][1] : "", rc == 0 ? o.backend : "-", rc ? dcp_error() : "");
    }
    Options o;
    char *plain[] = {"dcpinfer", "--model", "m", "p.jsonl"};
    CHECK(options_parse(&o, 4, plain, 0) == 0 && !strcmp(o.backend, "cpu"), "default backend cpu");
    return test_finish("test_options");
}
