/* What the Jinja engine's files share (jinja.h is its interface): the
 * arena every parse and render allocates from, the values a template
 * computes with (Python's types), the tree the parser builds and the
 * renderer walks, and the functions each file offers the others:
 *   jinja_value.c   the arena, values, Python's string rules, output, json.dumps
 *   jinja_parse.c   the lexer (jinja2's whitespace rules) and the parser
 *   jinja_render.c  the renderer, with the built-in filters, tests and
 *                   functions, each in one table the parser reads too */
#ifndef DCP_JINJA_IMPL_H
#define DCP_JINJA_IMPL_H

#include <setjmp.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "jinja.h"

/* ---- the arena: all memory of a parse or a render, freed at once; an
 * error longjmps to the entry point with its message ------------------ */

typedef struct Block {
    struct Block *next;
    size_t used, cap;
    max_align_t data[];
} Block;

typedef struct {
    Block *head;
    size_t total;
    jmp_buf *fail; /* where an error goes */
    char *err;     /* its message (malloc'ed) */
} Arena;

/* ---- values ------------------------------------------------------------ */

enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_MACRO, V_FUNC, V_LOOP };

typedef struct Node Node;
typedef struct Frame Frame;
typedef struct Val Val;
struct Val {
    int t;
    int tuple; /* a V_LIST that Python would hold as a tuple (printed with parentheses) */
    union {
        int b;
        long long i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        struct {
            Val **v;
            int n, cap;
        } l;
        struct { /* V_DICT and V_NS: keys in insertion order */
            Val **k, **v;
            int n, cap;
        } d;
        struct {
            const Node *def;
            Frame *scope;
            Val *caller; /* a call block's body, for caller() */
        } m;
        struct {
            int id;
            Val *self;
        } fn;
        struct {
            Val *items;
            int i;
        } loop;
    };
    const char *what; /* V_UNDEF: what was looked up, for the error when it is used */
};

/* built-in functions and methods (V_FUNC ids) */
enum {
    F_RANGE, F_NAMESPACE, F_RAISE, F_STRFTIME, F_DICT,                                /* globals */
    F_SPLIT, F_STRIP, F_LSTRIP, F_RSTRIP, F_STARTSWITH, F_ENDSWITH, F_UPPER, F_LOWER, /* str */
    F_REPLACE, F_GET, F_ITEMS, F_KEYS, F_VALUES,                                      /* str, dict */
    F_UNSAFE,                                                                         /* mutators */
    F_UNSUPPORTED /* Python's methods the engine does not implement */
};
static const char *const globals[] = {"range", "namespace", "raise_exception", "strftime_now", "dict", NULL};
static const char *const str_methods[] = {"split",      "strip",    "lstrip", "rstrip", "startswith",
                                          "endswith",   "upper",    "lower",  "replace", NULL};
static const char *const dict_methods[] = {"get", "items", "keys", "values", NULL};
/* methods that change a list or dict: jinja2's immutable sandbox refuses
 * them when called, and so does the engine */
static const char *const unsafe_methods[] = {"append", "pop",  "extend", "insert",     "remove", "update", "clear",
                                             "sort",   "reverse", "setdefault", "popitem", "add", NULL};

/* the rest of Python's str, dict and list methods: jinja2 finds them (so
 * they are defined), the engine refuses to call or print them */
static const char *const py_str_methods[] = {
    "capitalize", "casefold", "center", "count", "encode", "expandtabs", "find", "format", "format_map", "index",
    "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric",
    "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "maketrans", "partition", "removeprefix",
    "removesuffix", "rfind", "rindex", "rjust", "rpartition", "rsplit", "splitlines", "swapcase", "title",
    "translate", "zfill", NULL};
static const char *const py_dict_methods[] = {"copy", "fromkeys", NULL};
static const char *const py_list_methods[] = {"copy", "count", "index", NULL};

static inline int in_list(const char *const *list, const char *s)
{
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], s)) return i;
    return -1;
}

/* a render's state */
typedef struct {
    Arena a;
    time_t now; /* strftime_now's clock */
    Val *none, *yes, *no;
    long steps;
    int line; /* the line being evaluated, for an error that has none (memory, output) */
    int depth;
    char *out; /* the output being written: the template's own on the heap (top), a capture's
                * (a macro call, a set block, a string built) in the arena */
    size_t n, cap;
    int top;      /* out is the template's output */
    char *top_out; /* the template's output buffer, freed by an error wherever it happens */
} Ctx;

/* a capture: output redirected into a fresh string, then restored */
typedef struct {
    char *out;
    size_t n, cap;
    int top;
} Capture;

/* json.dumps's options */
typedef struct {
    int ascii, sort;
    const char *indent; /* NULL: one line */
    const char *item_sep, *key_sep;
} JsonOpts;

/* ---- the tree ------------------------------------------------------------ */
enum {
    /* statements */
    N_BODY, N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SET_ATTR, N_SET_BLOCK, N_MACRO, N_CALL_BLOCK, N_BREAK,
    N_CONTINUE,
    /* expressions */
    E_CONST, E_NAME, E_LIST, E_TUPLE, E_DICT, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NEG, E_POS,
    E_BINARY, E_CONCAT, E_AND, E_OR, E_NOT, E_COND, E_COMPARE
};

/* Node.flags */
enum {
    USES_VARARGS = 1, /* a macro whose body names varargs: extra positional arguments go there */
    USES_KWARGS = 2,  /* ... names kwargs: extra keyword arguments go there */
    UNKNOWN = 4       /* a filter or test the engine lacks, inside an if: refused when evaluated, as jinja2 does */
};

struct Node {
    int k, line;
    const char *name; /* E_NAME, E_ATTR, E_FILTER, E_TEST, N_SET*, N_MACRO; E_BINARY, E_COMPARE: operators */
    Node *a, *b, *c, *d;
    Node **v; /* N_BODY: statements; E_LIST/E_TUPLE/E_DICT: items (dict: key, value); E_CALL/E_FILTER/E_TEST,
               * N_MACRO, N_CALL_BLOCK: arguments (defaults), the last nkw named by kw */
    int nv;
    const char **kw; /* keyword arguments' names; N_FOR: the loop's targets; N_MACRO/N_CALL_BLOCK: parameters */
    int nkw;
    int negate;        /* E_TEST: "is not" */
    int flags;         /* N_MACRO: USES_VARARGS, USES_KWARGS; E_FILTER, E_TEST: UNKNOWN */
    const char **ops;  /* E_COMPARE: the operators between v[0], v[1], ... */
    Val *val;          /* E_CONST */
};

/* a parsed template: its tree in its arena */
struct JinjaTemplate {
    Arena a;
    Node *root;
    char *name;
};

/* the built-in filters and tests (jinja_render.c's tables) */
typedef struct Filter Filter;
typedef struct Test Test;

/* jinja_value.c */
void __attribute__((noreturn, format(printf, 2, 3))) arena_fail(Arena *a, const char *fmt, ...);
void *arena_alloc(Arena *a, size_t n);
char *at_line(char *err, const char *name, int line);
char *arena_dup(Arena *a, const char *s, size_t n);
void arena_free(Arena *a);
int dict_find(Ctx *C, const Val *d, const Val *key);
int dict_find_str(const Val *d, const char *key);
void dict_set(Ctx *C, Val *d, Val *key, Val *x);
void emit(Ctx *C, const char *s, size_t n);
void capture_begin(Ctx *C, Capture *s);
Val *capture_end(Ctx *C, const Capture *s);
Val *from_json(Ctx *C, json_t *j);
void json_dump(Ctx *C, const Val *v, const JsonOpts *o, int level);
void list_push(Ctx *C, Val *l, Val *x);
Val *mk(Ctx *C, int t);
Val *mk_bool(Ctx *C, int b);
Val *mk_float(Ctx *C, double f);
Val *mk_int(Ctx *C, long long i);
Val *mk_str(Ctx *C, const char *p, size_t n);
Val *mk_undef(Ctx *C, const char *what);
int py_space(unsigned c);
void py_strip(const char *s, size_t n, const char *chars, size_t cn, int left, int right, size_t *from,
              size_t *to);
void str_of(Ctx *C, const Val *v);
Val *to_str(Ctx *C, Val *v);
unsigned utf8_at(const char *s, size_t n, int *len);
size_t utf8_count(const char *s, size_t n);
size_t utf8_put(char *o, unsigned c);

/* jinja_render.c */
const Filter *find_filter(const char *name);
const Test *find_test(const char *name);
int val_eq(Ctx *C, const Val *a, const Val *b);

#endif
