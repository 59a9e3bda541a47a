#include "identity.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static const char *const keys[ID_N] = {
#define IDENTITY_KEY(name, what) #name,
    IDENTITY_FIELDS(IDENTITY_KEY)
#undef IDENTITY_KEY
};
static const char *const what[ID_N] = {
#define IDENTITY_WHAT(name, w) w,
    IDENTITY_FIELDS(IDENTITY_WHAT)
#undef IDENTITY_WHAT
};

void identity_set(RunIdentity *id, int field, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(id->v[field], sizeof id->v[field], fmt, ap);
    va_end(ap);
}

char *identity_json(const RunIdentity *id)
{
    json_t *o = json_object();
    for (int k = 0; k < ID_N; k++) json_object_set_new(o, keys[k], json_string(id->v[k]));
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    char *out = xstrdup(s);
    free(s);
    return out;
}

int identity_check(const RunIdentity *id, const char *stored, const char *where)
{
    static const char *advice = "rerun with the inputs and options of the run it belongs to, or without --resume to "
                                "start afresh (which replaces it)";
    json_t *o = stored ? json_loads(stored, 0, NULL) : NULL;
    int rc = 0;
    if (!json_is_object(o)) {
        rc = dcp_fail("--resume: %s holds no run identity (written by another program or an older dcpinfer); %s",
                      where, advice);
    }
    for (int k = 0; k < ID_N && !rc; k++) {
        const char *got = json_string_value(json_object_get(o, keys[k]));
        if (!got) rc = dcp_fail("--resume: %s: its run identity lacks \"%s\"; %s", where, keys[k], advice);
        else if (strcmp(got, id->v[k]))
            rc = dcp_fail("--resume: %s was written with another %s: \"%s\" there, \"%s\" in this run; %s", where,
                          what[k], got, id->v[k], advice);
    }
    json_decref(o);
    return rc;
}
