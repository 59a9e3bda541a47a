/* The chat-template subset of Jinja (jinja.h): a lexer with jinja2's
 * whitespace rules, a recursive-descent parser into a small tree, and a
 * tree-walking renderer over Python-like values. All memory of a parse or
 * a render lives in one arena, and errors unwind to the entry point with
 * longjmp, so a failure anywhere frees everything at once. */
#define _GNU_SOURCE /* memmem */
#include "jinja.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util.h"

/* ---- arena and errors --------------------------------------------------- */

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

static void arena_free(Arena *a)
{
    for (Block *b = a->head, *n; b; b = n) n = b->next, free(b);
    a->head = NULL;
}

static void __attribute__((noreturn, format(printf, 2, 3))) fail(Arena *a, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (!a->err) a->err = xstrdup(buf);
    longjmp(*a->fail, 1);
}

static void *alloc(Arena *a, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (n > JINJA_MAX_MEMORY || a->total + n > JINJA_MAX_MEMORY)
        fail(a, "the template needs more than %u MiB of memory", JINJA_MAX_MEMORY >> 20);
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > (64u << 10) ? n : (64u << 10);
        Block *b = xmalloc(sizeof *b + cap);
        b->next = a->head, b->used = 0, b->cap = cap;
        a->head = b;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    a->total += n;
    memset(p, 0, n);
    return p;
}

static char *adup(Arena *a, const char *s, size_t n)
{
    char *p = alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* ---- values ------------------------------------------------------------- */

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
    F_UNSAFE                                                                          /* mutators */
};
static const char *const globals[] = {"range", "namespace", "raise_exception", "strftime_now", "dict", NULL};
static const char *const str_methods[] = {"split",      "strip",    "lstrip", "rstrip", "startswith",
                                          "endswith",   "upper",    "lower",  "replace", NULL};
static const char *const dict_methods[] = {"get", "items", "keys", "values", NULL};
/* methods that change a list or dict: jinja2's immutable sandbox refuses
 * them when called, and so does the engine */
static const char *const unsafe_methods[] = {"append", "pop",  "extend", "insert",     "remove", "update", "clear",
                                             "sort",   "reverse", "setdefault", "popitem", "add", NULL};

static int in_list(const char *const *list, const char *s)
{
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], s)) return i;
    return -1;
}

typedef struct {
    Arena a;
    time_t now; /* strftime_now's clock */
    Val *none, *yes, *no;
    long steps;
    int depth;
    char *out; /* the output being written (arena) */
    size_t n, cap;
} Ctx;

static Val *mk(Ctx *C, int t)
{
    Val *v = alloc(&C->a, sizeof *v);
    v->t = t;
    return v;
}
static Val *mk_int(Ctx *C, long long i)
{
    Val *v = mk(C, V_INT);
    v->i = i;
    return v;
}
static Val *mk_float(Ctx *C, double f)
{
    Val *v = mk(C, V_FLOAT);
    v->f = f;
    return v;
}
static Val *mk_str(Ctx *C, const char *p, size_t n)
{
    Val *v = mk(C, V_STR);
    v->s.p = adup(&C->a, p, n), v->s.n = n;
    return v;
}
static Val *mk_bool(Ctx *C, int b) { return b ? C->yes : C->no; }
static Val *mk_undef(Ctx *C, const char *what)
{
    Val *v = mk(C, V_UNDEF);
    v->what = what;
    return v;
}

static void list_push(Ctx *C, Val *l, Val *x)
{
    if (l->l.n == l->l.cap) {
        int cap = l->l.cap ? 2 * l->l.cap : 8;
        Val **v = alloc(&C->a, sizeof(Val *) * (size_t)cap);
        if (l->l.n) memcpy(v, l->l.v, sizeof(Val *) * (size_t)l->l.n);
        l->l.v = v, l->l.cap = cap;
    }
    l->l.v[l->l.n++] = x;
}

static int val_eq(Ctx *C, const Val *a, const Val *b);

static int dict_find(Ctx *C, const Val *d, const Val *key)
{
    for (int i = 0; i < d->d.n; i++)
        if (val_eq(C, d->d.k[i], key)) return i;
    return -1;
}
static int dict_find_str(const Val *d, const char *key)
{
    size_t n = strlen(key);
    for (int i = 0; i < d->d.n; i++)
        if (d->d.k[i]->t == V_STR && d->d.k[i]->s.n == n && !memcmp(d->d.k[i]->s.p, key, n)) return i;
    return -1;
}
static void dict_set(Ctx *C, Val *d, Val *key, Val *x)
{
    int i = dict_find(C, d, key);
    if (i >= 0) {
        d->d.v[i] = x;
        return;
    }
    if (d->d.n == d->d.cap) {
        int cap = d->d.cap ? 2 * d->d.cap : 8;
        Val **k = alloc(&C->a, sizeof(Val *) * (size_t)cap), **v = alloc(&C->a, sizeof(Val *) * (size_t)cap);
        if (d->d.n) memcpy(k, d->d.k, sizeof(Val *) * (size_t)d->d.n), memcpy(v, d->d.v, sizeof(Val *) * (size_t)d->d.n);
        d->d.k = k, d->d.v = v, d->d.cap = cap;
    }
    d->d.k[d->d.n] = key, d->d.v[d->d.n++] = x;
}

static Val *from_json(Ctx *C, json_t *j)
{
    if (++C->depth > JINJA_MAX_DEPTH) fail(&C->a, "the template's variables nest more than %d deep", JINJA_MAX_DEPTH);
    Val *v;
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        v = mk(C, V_DICT);
        const char *k;
        json_t *x;
        json_object_foreach(j, k, x) dict_set(C, v, mk_str(C, k, strlen(k)), from_json(C, x));
        break;
    }
    case JSON_ARRAY: {
        v = mk(C, V_LIST);
        size_t i;
        json_t *x;
        json_array_foreach(j, i, x) list_push(C, v, from_json(C, x));
        break;
    }
    case JSON_STRING: v = mk_str(C, json_string_value(j), json_string_length(j)); break;
    case JSON_INTEGER: v = mk_int(C, json_integer_value(j)); break;
    case JSON_REAL: v = mk_float(C, json_real_value(j)); break;
    case JSON_TRUE: v = C->yes; break;
    case JSON_FALSE: v = C->no; break;
    default: v = C->none;
    }
    C->depth--;
    return v;
}

/* ---- UTF-8 and Python's string rules ------------------------------------- */

/* the code point at s (n bytes left), its length in *len (1 for a bad byte) */
static unsigned utf8_at(const char *s, size_t n, int *len)
{
    const unsigned char *u = (const unsigned char *)s;
    int l = u[0] < 0x80 ? 1 : (u[0] & 0xE0) == 0xC0 ? 2 : (u[0] & 0xF0) == 0xE0 ? 3 : (u[0] & 0xF8) == 0xF0 ? 4 : 1;
    if ((size_t)l > n) l = 1;
    unsigned c = l == 1 ? u[0] : l == 2 ? u[0] & 0x1F : l == 3 ? u[0] & 0x0F : u[0] & 0x07;
    for (int i = 1; i < l; i++) c = c << 6 | (u[i] & 0x3F);
    *len = l;
    return c;
}
static size_t utf8_put(char *o, unsigned c)
{
    if (c < 0x80) return o[0] = (char)c, 1;
    if (c < 0x800) return o[0] = (char)(0xC0 | c >> 6), o[1] = (char)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000)
        return o[0] = (char)(0xE0 | c >> 12), o[1] = (char)(0x80 | (c >> 6 & 0x3F)), o[2] = (char)(0x80 | (c & 0x3F)), 3;
    o[0] = (char)(0xF0 | c >> 18), o[1] = (char)(0x80 | (c >> 12 & 0x3F)), o[2] = (char)(0x80 | (c >> 6 & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}
static size_t utf8_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* Python's str.isspace(), which strip() and split() use */
static int py_space(unsigned c)
{
    return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* whether strip() takes c: one of chars (cn bytes), or whitespace without them */
static int stripped(unsigned c, const char *chars, size_t cn)
{
    if (!chars) return py_space(c);
    for (size_t i = 0; i < cn;) {
        int l;
        if (utf8_at(chars + i, cn - i, &l) == c) return 1;
        i += (size_t)l;
    }
    return 0;
}

/* the length of s's whitespace-stripped span: from the left (*from), the right (n - *to) or both */
static void py_strip(const char *s, size_t n, const char *chars, size_t cn, int left, int right, size_t *from,
                     size_t *to)
{
    size_t a = 0, b = n;
    int l;
    while (left && a < b) {
        unsigned c = utf8_at(s + a, b - a, &l);
        if (!stripped(c, chars, cn)) break;
        a += (size_t)l;
    }
    while (right && b > a) {
        size_t p = b - 1;
        while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
        if (!stripped(utf8_at(s + p, b - p, &l), chars, cn)) break;
        b = p;
    }
    *from = a, *to = b;
}

void jinja_strip_span(const char *s, size_t n, int left, int right, size_t *from, size_t *to)
{
    py_strip(s, n, NULL, 0, left, right, from, to);
}

/* ---- output buffers --------------------------------------------------- */

static void emit(Ctx *C, const char *s, size_t n)
{
    if (C->n + n > JINJA_MAX_OUTPUT) fail(&C->a, "the template's output exceeds %u MiB", JINJA_MAX_OUTPUT >> 20);
    if (C->n + n + 1 > C->cap) {
        size_t cap = 2 * (C->n + n + 1) > 256 ? 2 * (C->n + n + 1) : 256;
        char *o = alloc(&C->a, cap);
        if (C->n) memcpy(o, C->out, C->n);
        C->out = o, C->cap = cap;
    }
    memcpy(C->out + C->n, s, n);
    C->n += n;
    C->out[C->n] = '\0';
}
static void emits(Ctx *C, const char *s) { emit(C, s, strlen(s)); }

/* Python's repr() of a float (the shortest text that reads back), as str() and json.dumps write it */
static void float_repr(double f, char *buf, size_t size)
{
    if (isnan(f)) {
        snprintf(buf, size, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, size, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    /* e: [-]d.ddde[+-]XX; digits and decimal exponent */
    char digits[24];
    int nd = 0, neg = e[0] == '-';
    const char *q = e + neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    char *o = buf;
    if (neg) *o++ = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            o += sprintf(o, "0.");
            for (int i = 0; i < -exp - 1; i++) *o++ = '0';
            o += sprintf(o, "%s", digits);
        } else {
            for (int i = 0; i <= exp; i++) *o++ = i < nd ? digits[i] : '0';
            *o++ = '.';
            if (nd > exp + 1) o += sprintf(o, "%s", digits + exp + 1);
            else *o++ = '0';
            *o = '\0';
        }
    } else {
        *o++ = digits[0];
        if (nd > 1) o += sprintf(o, ".%s", digits + 1);
        sprintf(o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

static void repr(Ctx *C, const Val *v);

/* Python's repr() of a string */
static void str_repr(Ctx *C, const char *s, size_t n)
{
    int dq = memchr(s, '\'', n) && !memchr(s, '"', n);
    char q = dq ? '"' : '\'';
    emit(C, &q, 1);
    for (size_t i = 0; i < n;) {
        int l;
        unsigned c = utf8_at(s + i, n - i, &l);
        char b[16];
        if (c == '\\' || c == (unsigned)q) b[0] = '\\', b[1] = (char)c, emit(C, b, 2);
        else if (c == '\n') emits(C, "\\n");
        else if (c == '\r') emits(C, "\\r");
        else if (c == '\t') emits(C, "\\t");
        else if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) snprintf(b, sizeof b, "\\x%02x", c), emits(C, b);
        else if (c == 0x2028 || c == 0x2029 || (c >= 0x200B && c <= 0x200F) || c == 0xFEFF)
            snprintf(b, sizeof b, "\\u%04x", c), emits(C, b);
        else emit(C, s + i, (size_t)l);
        i += (size_t)l;
    }
    emit(C, &q, 1);
}

/* Python's str() of v, appended to the output (jinja2's soft_str: Undefined is "") */
static void str_of(Ctx *C, const Val *v)
{
    char b[64];
    if (++C->depth > JINJA_MAX_DEPTH) fail(&C->a, "a value nests more than %d deep", JINJA_MAX_DEPTH);
    switch (v->t) {
    case V_UNDEF: break;
    case V_NONE: emits(C, "None"); break;
    case V_BOOL: emits(C, v->b ? "True" : "False"); break;
    case V_INT: snprintf(b, sizeof b, "%lld", v->i), emits(C, b); break;
    case V_FLOAT: float_repr(v->f, b, sizeof b), emits(C, b); break;
    case V_STR: emit(C, v->s.p, v->s.n); break;
    case V_MACRO: emits(C, "<Macro>"); break;
    case V_FUNC: emits(C, "<built-in function>"); break;
    case V_LOOP: emits(C, "<LoopContext>"); break;
    default: repr(C, v);
    }
    C->depth--;
}

static void repr(Ctx *C, const Val *v)
{
    if (++C->depth > JINJA_MAX_DEPTH) fail(&C->a, "a value nests more than %d deep", JINJA_MAX_DEPTH);
    switch (v->t) {
    case V_STR: str_repr(C, v->s.p, v->s.n); break;
    case V_UNDEF: emits(C, "Undefined"); break;
    case V_LIST:
        emits(C, v->tuple ? "(" : "[");
        for (int i = 0; i < v->l.n; i++) {
            if (i) emits(C, ", ");
            repr(C, v->l.v[i]);
        }
        emits(C, v->tuple ? (v->l.n == 1 ? ",)" : ")") : "]");
        break;
    case V_DICT:
    case V_NS:
        emits(C, v->t == V_NS ? "<Namespace {" : "{");
        for (int i = 0; i < v->d.n; i++) {
            if (i) emits(C, ", ");
            repr(C, v->d.k[i]);
            emits(C, ": ");
            repr(C, v->d.v[i]);
        }
        emits(C, v->t == V_NS ? "}>" : "}");
        break;
    default: str_of(C, v);
    }
    C->depth--;
}

/* str(v) as a value: output written into a fresh buffer */
static Val *to_str(Ctx *C, Val *v)
{
    if (v->t == V_STR) return v;
    char *o = C->out;
    size_t n = C->n, cap = C->cap;
    C->out = NULL, C->n = C->cap = 0;
    str_of(C, v);
    Val *s = mk(C, V_STR);
    s->s.p = C->out ? C->out : "", s->s.n = C->n;
    C->out = o, C->n = n, C->cap = cap;
    return s;
}

/* ---- json.dumps, as transformers' tojson calls it --------------------------- */

typedef struct {
    int ascii, sort;
    const char *indent; /* NULL: one line */
    const char *item_sep, *key_sep;
} JsonOpts;

static void json_str(Ctx *C, const char *s, size_t n, int ascii)
{
    emit(C, "\"", 1);
    for (size_t i = 0; i < n;) {
        int l;
        unsigned c = utf8_at(s + i, n - i, &l);
        char b[16];
        if (c == '"') emits(C, "\\\"");
        else if (c == '\\') emits(C, "\\\\");
        else if (c == '\n') emits(C, "\\n");
        else if (c == '\r') emits(C, "\\r");
        else if (c == '\t') emits(C, "\\t");
        else if (c == '\b') emits(C, "\\b");
        else if (c == '\f') emits(C, "\\f");
        else if (c < 0x20 || (ascii && c >= 0x7F)) {
            if (c >= 0x10000) {
                unsigned u = c - 0x10000;
                snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xD800 + (u >> 10), 0xDC00 + (u & 0x3FF));
            } else snprintf(b, sizeof b, "\\u%04x", c);
            emits(C, b);
        } else emit(C, s + i, (size_t)l);
        i += (size_t)l;
    }
    emit(C, "\"", 1);
}

static void json_newline(Ctx *C, const JsonOpts *o, int level)
{
    emit(C, "\n", 1);
    for (int i = 0; i < level; i++) emits(C, o->indent);
}

static const Val *sort_keys_of; /* qsort's context (one render at a time per thread is all it needs) */

static int cmp_key(const void *a, const void *b)
{
    const Val *x = sort_keys_of->d.k[*(const int *)a], *y = sort_keys_of->d.k[*(const int *)b];
    size_t n = x->s.n < y->s.n ? x->s.n : y->s.n;
    int c = memcmp(x->s.p, y->s.p, n);
    return c ? c : (x->s.n > y->s.n) - (x->s.n < y->s.n);
}

static void json_dump(Ctx *C, const Val *v, const JsonOpts *o, int level)
{
    char b[64];
    if (++C->depth > JINJA_MAX_DEPTH) fail(&C->a, "tojson: a value nests more than %d deep", JINJA_MAX_DEPTH);
    switch (v->t) {
    case V_NONE: emits(C, "null"); break;
    case V_BOOL: emits(C, v->b ? "true" : "false"); break;
    case V_INT: snprintf(b, sizeof b, "%lld", v->i), emits(C, b); break;
    case V_FLOAT:
        if (isnan(v->f)) emits(C, "NaN");
        else if (isinf(v->f)) emits(C, v->f < 0 ? "-Infinity" : "Infinity");
        else float_repr(v->f, b, sizeof b), emits(C, b);
        break;
    case V_STR: json_str(C, v->s.p, v->s.n, o->ascii); break;
    case V_LIST:
        if (!v->l.n) {
            emits(C, "[]");
            break;
        }
        emits(C, "[");
        for (int i = 0; i < v->l.n; i++) {
            if (i) emits(C, o->item_sep);
            if (o->indent) json_newline(C, o, level + 1);
            json_dump(C, v->l.v[i], o, level + 1);
        }
        if (o->indent) json_newline(C, o, level);
        emits(C, "]");
        break;
    case V_DICT: {
        if (!v->d.n) {
            emits(C, "{}");
            break;
        }
        int *order = alloc(&C->a, sizeof(int) * (size_t)v->d.n);
        for (int i = 0; i < v->d.n; i++) order[i] = i;
        if (o->sort) {
            for (int i = 0; i < v->d.n; i++)
                if (v->d.k[i]->t != V_STR) fail(&C->a, "tojson: sort_keys needs string keys");
            sort_keys_of = v;
            qsort(order, (size_t)v->d.n, sizeof(int), cmp_key);
        }
        emits(C, "{");
        for (int j = 0; j < v->d.n; j++) {
            const Val *k = v->d.k[order[j]];
            if (j) emits(C, o->item_sep);
            if (o->indent) json_newline(C, o, level + 1);
            if (k->t == V_STR) json_str(C, k->s.p, k->s.n, o->ascii);
            else if (k->t == V_NONE) emits(C, "\"null\"");
            else if (k->t == V_BOOL) emits(C, k->b ? "\"true\"" : "\"false\"");
            else if (k->t == V_INT || k->t == V_FLOAT) emits(C, "\""), json_dump(C, k, o, level), emits(C, "\"");
            else fail(&C->a, "tojson: keys must be str, int, float, bool or None");
            emits(C, o->key_sep);
            json_dump(C, v->d.v[order[j]], o, level + 1);
        }
        if (o->indent) json_newline(C, o, level);
        emits(C, "}");
        break;
    }
    default:
        fail(&C->a, "tojson: Object of type %s is not JSON serializable",
             v->t == V_UNDEF ? "Undefined" : v->t == V_NS ? "Namespace" : "function");
    }
    C->depth--;
}

/* ---- the template lexer ---------------------------------------------------- */

enum { K_EOF, K_TEXT, K_VBEGIN, K_VEND, K_BBEGIN, K_BEND, K_NAME, K_STR, K_INT, K_FLOAT, K_OP };

typedef struct {
    int k, line;
    const char *p; /* K_TEXT, K_STR: the (unescaped) text; K_NAME, K_OP: the name */
    size_t n;
    long long i;
    double f;
} Tok;

typedef struct {
    Arena a;
    const char *name;
    Tok *t;
    int n, cap, at;
    int depth;
    int loops; /* for loops around the statement being parsed */
    /* names the template calls as functions, checked against its macros at the end */
    const char **calls;
    int *call_lines, n_calls;
    const char **macros;
    int n_macros;
} Parser;

static void __attribute__((noreturn, format(printf, 3, 4))) perr(Parser *P, int line, const char *fmt, ...)
{
    char buf[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fail(&P->a, "%s:%d: %s", P->name, line, buf);
}

static Tok *push_tok(Parser *P, int k, int line, const char *p, size_t n)
{
    if (P->n == P->cap) {
        int cap = P->cap ? 2 * P->cap : 256;
        Tok *t = alloc(&P->a, sizeof(Tok) * (size_t)cap);
        if (P->n) memcpy(t, P->t, sizeof(Tok) * (size_t)P->n);
        P->t = t, P->cap = cap;
    }
    Tok *t = &P->t[P->n++];
    memset(t, 0, sizeof *t);
    t->k = k, t->line = line, t->p = p, t->n = n;
    return t;
}

static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n) {
        int l;
        unsigned c = utf8_at(s + i, n - i, &l);
        if (!py_space(c)) break;
        i += (size_t)l;
    }
    return i;
}

/* a string literal's value: Python escapes, as jinja2 reads them */
static const char *unescape(Parser *P, const char *s, size_t n, size_t *out_n, int line)
{
    char *o = alloc(&P->a, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) {
            o[k++] = s[i];
            continue;
        }
        char c = s[++i];
        const char *simple = strchr("\\'\"abfnrtv", c);
        if (c && simple) {
            static const char from[] = "\\'\"abfnrtv", to[] = "\\'\"\a\b\f\n\r\t\v";
            o[k++] = to[strchr(from, c) - from];
        } else if (c == '\n') {
        } else if (c >= '0' && c <= '7') {
            unsigned v = 0;
            for (int d = 0; d < 3 && i < n && s[i] >= '0' && s[i] <= '7'; d++) v = v * 8 + (unsigned)(s[i++] - '0');
            i--;
            k += utf8_put(o + k, v);
        } else if (c == 'x' || c == 'u' || c == 'U') {
            int w = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            unsigned v = 0;
            for (int d = 0; d < w; d++) {
                char h = i + 1 + (size_t)d < n ? s[i + 1 + (size_t)d] : 0;
                int x = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                                       : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (x < 0) perr(P, line, "a string literal has a truncated \\%c escape", c);
                v = v * 16 + (unsigned)x;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
                perr(P, line, "a string literal's \\%c escape is not a character", c);
            i += (size_t)w;
            k += utf8_put(o + k, v);
        } else {
            o[k++] = '\\', o[k++] = c; /* Python keeps an unknown escape as written */
        }
    }
    o[k] = '\0';
    *out_n = k;
    return o;
}

/* the tokens of one tag's inside, up to its end; returns the position after it */
static size_t lex_tag(Parser *P, const char *s, size_t n, size_t i, int block, int *line, int *line_starting)
{
    int open = 0; /* brackets open: as jinja2, the tag cannot end inside them */
    static const char *const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                      ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|", NULL};
    for (;;) {
        while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) *line += s[i++] == '\n';
        if (i >= n) perr(P, *line, "a %s tag is not closed", block ? "{%" : "{{");
        const char *end = block ? "%}" : "}}";
        /* the end, with its whitespace control */
        if (!open && (s[i] == '-' || (s[i] == '+' && block)) && i + 2 < n && !strncmp(s + i + 1, end, 2)) {
            int minus = s[i] == '-';
            i += 3;
            push_tok(P, block ? K_BEND : K_VEND, *line, NULL, 0);
            if (minus) {
                size_t j = skip_ws(s, n, i);
                for (size_t q = i; q < j; q++) *line += s[q] == '\n';
                *line_starting = j > i ? s[j - 1] == '\n' : 0;
                return j;
            }
            *line_starting = 0;
            return i;
        }
        if (!open && !strncmp(s + i, end, 2)) {
            i += 2;
            push_tok(P, block ? K_BEND : K_VEND, *line, NULL, 0);
            *line_starting = 0;
            if (block && i < n && s[i] == '\n') i++, (*line)++, *line_starting = 1; /* trim_blocks */
            return i;
        }
        char c = s[i];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t j = i;
            while (j < n && ((s[j] >= 'a' && s[j] <= 'z') || (s[j] >= 'A' && s[j] <= 'Z') || s[j] == '_' ||
                             (s[j] >= '0' && s[j] <= '9')))
                j++;
            push_tok(P, K_NAME, *line, adup(&P->a, s + i, j - i), j - i);
            i = j;
        } else if (c >= '0' && c <= '9') {
            size_t j = i;
            int is_float = 0;
            while (j < n && ((s[j] >= '0' && s[j] <= '9') || s[j] == '_')) j++;
            if (j + 1 < n && s[j] == '.' && s[j + 1] >= '0' && s[j + 1] <= '9') {
                is_float = 1, j++;
                while (j < n && ((s[j] >= '0' && s[j] <= '9') || s[j] == '_')) j++;
            }
            if (j < n && (s[j] == 'e' || s[j] == 'E')) {
                size_t k = j + 1;
                if (k < n && (s[k] == '+' || s[k] == '-')) k++;
                if (k < n && s[k] >= '0' && s[k] <= '9') {
                    is_float = 1, j = k;
                    while (j < n && s[j] >= '0' && s[j] <= '9') j++;
                }
            }
            char num[64];
            size_t k = 0;
            for (size_t q = i; q < j && k < sizeof num - 1; q++)
                if (s[q] != '_') num[k++] = s[q];
            num[k] = '\0';
            Tok *t = push_tok(P, is_float ? K_FLOAT : K_INT, *line, NULL, 0);
            if (is_float) t->f = strtod(num, NULL);
            else {
                errno = 0;
                t->i = strtoll(num, NULL, 10);
                if (errno || j - i > 18) perr(P, *line, "the integer %s is too large", num);
            }
            i = j;
        } else if (c == '\'' || c == '"') {
            size_t j = i + 1;
            int start_line = *line;
            while (j < n && s[j] != c) {
                if (s[j] == '\\' && j + 1 < n) j++;
                *line += s[j] == '\n';
                j++;
            }
            if (j >= n) perr(P, start_line, "a string literal is not closed");
            size_t len;
            const char *v = unescape(P, s + i + 1, j - i - 1, &len, start_line);
            push_tok(P, K_STR, start_line, v, len);
            i = j + 1;
        } else {
            int k;
            for (k = 0; ops[k]; k++)
                if (!strncmp(s + i, ops[k], strlen(ops[k]))) break;
            if (!ops[k]) perr(P, *line, "unexpected character '%c' in a tag", c);
            push_tok(P, K_OP, *line, ops[k], strlen(ops[k]));
            i += strlen(ops[k]);
            if (strchr("([{", c)) open++;
            else if (strchr(")]}", c) && open > 0) open--;
        }
    }
}

static void lex(Parser *P, const char *src, size_t len)
{
    /* jinja2 reads \r\n and \r as \n and drops one newline at the end */
    char *s = alloc(&P->a, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else s[n++] = src[i];
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = '\0';
    int line = 1, line_starting = 1;
    size_t i = 0;
    while (i < n) {
        /* the text up to the next tag */
        size_t j = i;
        while (j + 1 < n && !(s[j] == '{' && (s[j + 1] == '{' || s[j + 1] == '%' || s[j + 1] == '#'))) j++;
        if (j + 1 >= n) j = n;
        size_t text_end = j;
        char kind = j < n ? s[j + 1] : 0, sign = j + 2 < n ? s[j + 2] : 0;
        if (sign != '-' && sign != '+') sign = 0;
        if (kind && sign == '-') { /* strip all whitespace before the tag */
            while (text_end > i) {
                size_t p = text_end - 1;
                while (p > i && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
                int l;
                if (!py_space(utf8_at(s + p, text_end - p, &l))) break;
                text_end = p;
            }
        } else if (kind && kind != '{' && sign != '+') { /* lstrip_blocks */
            size_t l_pos = i;
            for (size_t q = i; q < j; q++)
                if (s[q] == '\n') l_pos = q + 1;
            if (l_pos > i || line_starting) {
                size_t q = l_pos;
                while (q < j && (s[q] == ' ' || s[q] == '\t' || s[q] == '\f' || s[q] == '\v')) q++;
                if (q == j && j > l_pos) text_end = l_pos;
            }
        }
        if (text_end > i) push_tok(P, K_TEXT, line, s + i, text_end - i);
        for (size_t q = i; q < j; q++) line += s[q] == '\n';
        if (j >= n) break;
        i = j + 2 + (sign ? 1 : 0);
        if (kind == '#') { /* a comment: up to #}, with its own whitespace control */
            size_t e = i;
            while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}')) line += s[e++] == '\n';
            if (e + 1 >= n) perr(P, line, "a comment is not closed");
            int minus = e > i && s[e - 1] == '-', plus = e > i && s[e - 1] == '+';
            i = e + 2;
            line_starting = 0;
            if (minus) {
                size_t k = skip_ws(s, n, i);
                for (size_t q = i; q < k; q++) line += s[q] == '\n';
                line_starting = k > i && s[k - 1] == '\n';
                i = k;
            } else if (!plus && i < n && s[i] == '\n') i++, line++, line_starting = 1;
            continue;
        }
        push_tok(P, kind == '{' ? K_VBEGIN : K_BBEGIN, line, NULL, 0);
        i = lex_tag(P, s, n, i, kind == '%', &line, &line_starting);
    }
    push_tok(P, K_EOF, line, NULL, 0);
}

/* ---- the tree ------------------------------------------------------------ */

enum {
    /* statements */
    N_BODY, N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SET_ATTR, N_SET_BLOCK, N_MACRO, N_CALL_BLOCK, N_BREAK,
    N_CONTINUE,
    /* expressions */
    E_CONST, E_NAME, E_LIST, E_TUPLE, E_DICT, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NEG, E_POS,
    E_BINARY, E_CONCAT, E_AND, E_OR, E_NOT, E_COND, E_COMPARE
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
    const char **ops;  /* E_COMPARE: the operators between v[0], v[1], ... */
    Val *val;          /* E_CONST */
};

/* One more level of the tree (an operand chain like a.b.c or x|f|g nests
 * as deeply as brackets do, and is bounded the same way); the caller puts
 * P->depth back when its expression is done. */
static void nest(Parser *P, int line)
{
    if (++P->depth > JINJA_MAX_DEPTH) perr(P, line, "expressions nest more than %d deep", JINJA_MAX_DEPTH);
}

static Node *node(Parser *P, int k, int line)
{
    Node *n = alloc(&P->a, sizeof *n);
    n->k = k, n->line = line;
    return n;
}

static void add_kid(Parser *P, Node *n, Node *kid)
{
    Node **v = alloc(&P->a, sizeof(Node *) * (size_t)(n->nv + 1));
    if (n->nv) memcpy(v, n->v, sizeof(Node *) * (size_t)n->nv);
    v[n->nv++] = kid;
    n->v = v;
}
static void add_name(Parser *P, const char ***list, int *n, const char *name)
{
    const char **v = alloc(&P->a, sizeof(char *) * (size_t)(*n + 1));
    if (*n) memcpy(v, *list, sizeof(char *) * (size_t)*n);
    v[(*n)++] = name;
    *list = v;
}

static Tok *cur(Parser *P) { return &P->t[P->at]; }
static int is_op(Parser *P, const char *op) { return cur(P)->k == K_OP && !strcmp(cur(P)->p, op); }
static int is_name(Parser *P, const char *name) { return cur(P)->k == K_NAME && !strcmp(cur(P)->p, name); }
static Tok *next(Parser *P)
{
    Tok *t = cur(P);
    if (t->k != K_EOF) P->at++;
    return t;
}
static const char *tok_text(const Tok *t)
{
    switch (t->k) {
    case K_EOF: return "the end of the template";
    case K_TEXT: return "text";
    case K_VBEGIN: return "'{{'";
    case K_VEND: return "'}}'";
    case K_BBEGIN: return "'{%'";
    case K_BEND: return "'%}'";
    case K_STR: return "a string";
    case K_INT:
    case K_FLOAT: return "a number";
    default: return t->p;
    }
}
static void expect_op(Parser *P, const char *op)
{
    if (!is_op(P, op)) perr(P, cur(P)->line, "expected '%s', found %s", op, tok_text(cur(P)));
    next(P);
}
static const char *expect_name(Parser *P)
{
    if (cur(P)->k != K_NAME) perr(P, cur(P)->line, "expected a name, found %s", tok_text(cur(P)));
    return next(P)->p;
}
static void expect_kind(Parser *P, int k)
{
    if (cur(P)->k != k) {
        Tok want = {.k = k};
        perr(P, cur(P)->line, "expected %s, found %s", tok_text(&want), tok_text(cur(P)));
    }
    next(P);
}

static Node *parse_expr(Parser *P);
static Node *parse_or(Parser *P);
static Node *parse_unary(Parser *P, int with_filter);

/* the built-in filters and tests, found in the renderer's tables */
typedef struct Filter Filter;
typedef struct Test Test;
static const Filter *find_filter(const char *name);
static const Test *find_test(const char *name);

/* (args, name=value ...) after the '(' is consumed, into n's v and kw */
static void parse_args(Parser *P, Node *n)
{
    while (!is_op(P, ")")) {
        if (n->nv) expect_op(P, ",");
        if (is_op(P, ")")) break; /* a trailing comma */
        if (cur(P)->k == K_NAME && P->t[P->at + 1].k == K_OP && !strcmp(P->t[P->at + 1].p, "=")) {
            add_name(P, &n->kw, &n->nkw, next(P)->p);
            next(P);
        } else if (n->nkw) perr(P, cur(P)->line, "a positional argument follows a keyword argument");
        add_kid(P, n, parse_expr(P));
    }
    next(P);
}

static Node *parse_primary(Parser *P)
{
    Tok *t = cur(P);
    Node *n;
    if (t->k == K_NAME) {
        next(P);
        static const char *const consts[] = {"true", "false", "none", "True", "False", "None", NULL};
        int c = in_list(consts, t->p);
        if (c >= 0) {
            n = node(P, E_CONST, t->line);
            n->val = alloc(&P->a, sizeof(Val));
            n->val->t = c % 3 == 2 ? V_NONE : V_BOOL;
            n->val->b = c % 3 == 0;
            return n;
        }
        n = node(P, E_NAME, t->line);
        n->name = t->p;
        return n;
    }
    if (t->k == K_STR) { /* adjacent literals join */
        n = node(P, E_CONST, t->line);
        n->val = alloc(&P->a, sizeof(Val));
        n->val->t = V_STR;
        size_t len = 0;
        for (int i = P->at; P->t[i].k == K_STR; i++) len += P->t[i].n;
        char *s = alloc(&P->a, len + 1);
        size_t k = 0;
        while (cur(P)->k == K_STR) memcpy(s + k, cur(P)->p, cur(P)->n), k += cur(P)->n, next(P);
        n->val->s.p = s, n->val->s.n = k;
        return n;
    }
    if (t->k == K_INT || t->k == K_FLOAT) {
        next(P);
        n = node(P, E_CONST, t->line);
        n->val = alloc(&P->a, sizeof(Val));
        n->val->t = t->k == K_INT ? V_INT : V_FLOAT;
        if (t->k == K_INT) n->val->i = t->i;
        else n->val->f = t->f;
        return n;
    }
    if (is_op(P, "(")) { /* a parenthesized expression or a tuple */
        next(P);
        if (is_op(P, ")")) {
            next(P);
            return node(P, E_TUPLE, t->line);
        }
        Node *e = parse_expr(P);
        if (!is_op(P, ",")) {
            expect_op(P, ")");
            return e;
        }
        n = node(P, E_TUPLE, t->line);
        add_kid(P, n, e);
        while (is_op(P, ",")) {
            next(P);
            if (is_op(P, ")")) break;
            add_kid(P, n, parse_expr(P));
        }
        expect_op(P, ")");
        return n;
    }
    if (is_op(P, "[")) {
        next(P);
        n = node(P, E_LIST, t->line);
        while (!is_op(P, "]")) {
            if (n->nv) expect_op(P, ",");
            if (is_op(P, "]")) break;
            add_kid(P, n, parse_expr(P));
        }
        next(P);
        return n;
    }
    if (is_op(P, "{")) {
        next(P);
        n = node(P, E_DICT, t->line);
        while (!is_op(P, "}")) {
            if (n->nv) expect_op(P, ",");
            if (is_op(P, "}")) break;
            add_kid(P, n, parse_expr(P));
            expect_op(P, ":");
            add_kid(P, n, parse_expr(P));
        }
        next(P);
        return n;
    }
    perr(P, t->line, "unexpected %s in an expression", tok_text(t));
}

static void note_call(Parser *P, const char *name, int line)
{
    int n = P->n_calls;
    add_name(P, &P->calls, &P->n_calls, name);
    int *l = alloc(&P->a, sizeof(int) * (size_t)(n + 1));
    if (n) memcpy(l, P->call_lines, sizeof(int) * (size_t)n);
    l[n] = line;
    P->call_lines = l;
}

static Node *parse_postfix(Parser *P, Node *n)
{
    int depth = P->depth;
    for (;;) {
        int line = cur(P)->line;
        nest(P, line);
        if (is_op(P, ".")) {
            next(P);
            Node *a;
            if (cur(P)->k == K_INT) { /* foo.0: an item */
                a = node(P, E_ITEM, line);
                a->a = n;
                a->b = node(P, E_CONST, line);
                a->b->val = alloc(&P->a, sizeof(Val));
                a->b->val->t = V_INT, a->b->val->i = next(P)->i;
            } else {
                a = node(P, E_ATTR, line);
                a->a = n, a->name = expect_name(P);
            }
            n = a;
        } else if (is_op(P, "[")) {
            next(P);
            Node *parts[3] = {NULL, NULL, NULL};
            int k = 0, colons = 0;
            while (!is_op(P, "]")) {
                if (is_op(P, ":")) {
                    if (++colons > 2) perr(P, line, "a slice has more than three parts");
                    k++;
                    next(P);
                    continue;
                }
                if (parts[k]) perr(P, line, "expected ']' or ':' in a subscript");
                parts[k] = parse_expr(P);
            }
            next(P);
            Node *a = node(P, colons ? E_SLICE : E_ITEM, line);
            a->a = n;
            if (!colons && !parts[0]) perr(P, line, "an empty subscript");
            a->b = parts[0], a->c = parts[1], a->d = parts[2];
            n = a;
        } else if (is_op(P, "(")) {
            next(P);
            Node *a = node(P, E_CALL, line);
            a->a = n;
            parse_args(P, a);
            /* what may be called: the engine's globals, the template's
             * macros, the methods it knows */
            if (n->k == E_NAME) note_call(P, n->name, line);
            else if (n->k == E_ATTR) {
                if (in_list(str_methods, n->name) < 0 && in_list(dict_methods, n->name) < 0 &&
                    in_list(unsafe_methods, n->name) < 0)
                    perr(P, line, "the method '%s' is not supported", n->name);
            } else perr(P, line, "only names and methods can be called");
            n = a;
        } else {
            P->depth = depth;
            return n;
        }
    }
}

static Node *parse_filter(Parser *P, Node *n)
{
    int line = cur(P)->line;
    next(P); /* | */
    Node *f = node(P, E_FILTER, line);
    f->a = n, f->name = expect_name(P);
    if (!find_filter(f->name)) perr(P, line, "the filter '%s' is not supported", f->name);
    if (is_op(P, "(")) {
        next(P);
        parse_args(P, f);
    }
    if (!strcmp(f->name, "map") && (f->nv != 1 || f->nkw != 1 || strcmp(f->kw[0], "attribute")))
        perr(P, line, "map is supported with attribute= only");
    if ((!strcmp(f->name, "select") || !strcmp(f->name, "reject")) && f->nv &&
        (f->v[0]->k != E_CONST || f->v[0]->val->t != V_STR || !find_test(f->v[0]->val->s.p)))
        perr(P, line, "%s needs the name of a supported test", f->name);
    if ((!strcmp(f->name, "selectattr") || !strcmp(f->name, "rejectattr")) && f->nv > 1 &&
        (f->v[1]->k != E_CONST || f->v[1]->val->t != V_STR || !find_test(f->v[1]->val->s.p)))
        perr(P, line, "%s needs the name of a supported test", f->name);
    return f;
}

static Node *parse_test(Parser *P, Node *n)
{
    int line = cur(P)->line;
    next(P); /* is */
    Node *t = node(P, E_TEST, line);
    t->a = n;
    if (is_name(P, "not")) next(P), t->negate = 1;
    if (cur(P)->k == K_OP && (is_op(P, "==") || is_op(P, "!="))) t->name = next(P)->p;
    else t->name = expect_name(P);
    if (!find_test(t->name)) perr(P, line, "the test '%s' is not supported", t->name);
    if (is_op(P, "(")) {
        next(P);
        parse_args(P, t);
    } else {
        Tok *c = cur(P);
        int arg = (c->k == K_NAME && strcmp(c->p, "else") && strcmp(c->p, "or") && strcmp(c->p, "and") &&
                   strcmp(c->p, "if") && strcmp(c->p, "in") && strcmp(c->p, "not") && strcmp(c->p, "is")) ||
                  c->k == K_STR || c->k == K_INT || c->k == K_FLOAT || is_op(P, "[") || is_op(P, "{");
        if (arg) add_kid(P, t, parse_postfix(P, parse_primary(P)));
    }
    return t;
}

static Node *parse_unary(Parser *P, int with_filter)
{
    int line = cur(P)->line;
    Node *n;
    if (++P->depth > JINJA_MAX_DEPTH) perr(P, line, "expressions nest more than %d deep", JINJA_MAX_DEPTH);
    if (is_op(P, "-") || is_op(P, "+")) {
        n = node(P, is_op(P, "-") ? E_NEG : E_POS, line);
        next(P);
        n->a = parse_unary(P, 0);
    } else n = parse_postfix(P, parse_primary(P));
    int depth = P->depth;
    while (with_filter) {
        nest(P, line);
        if (is_op(P, "|")) n = parse_filter(P, n);
        else if (is_name(P, "is")) n = parse_test(P, n);
        else if (is_op(P, "(")) perr(P, cur(P)->line, "only names and methods can be called");
        else break;
    }
    P->depth = depth - 1;
    return n;
}

static Node *binary(Parser *P, int k, const char *op, Node *a, Node *b, int line)
{
    Node *n = node(P, k, line);
    n->name = op, n->a = a, n->b = b;
    return n;
}

/* One level of left-associative binary operators (a op b op c ...), its
 * operands parsed by the next level; chains nest as brackets do. */
typedef struct {
    const char *const *ops;
    int names; /* the operators are words (and, or), not symbols */
    int kind;
    Node *(*operand)(Parser *P);
} Level;

static Node *binary_chain(Parser *P, const Level *L)
{
    Node *n = L->operand(P);
    int depth = P->depth;
    for (;;) {
        const char *op = NULL;
        for (int k = 0; L->ops[k] && !op; k++)
            if (L->names ? is_name(P, L->ops[k]) : is_op(P, L->ops[k])) op = L->ops[k];
        if (!op) break;
        int line = next(P)->line;
        nest(P, line);
        n = binary(P, L->kind, op, n, L->operand(P), line);
    }
    P->depth = depth;
    return n;
}

static Node *filtered_unary(Parser *P) { return parse_unary(P, 1); }
static Node *parse_pow(Parser *P)
{
    static const char *const ops[] = {"**", NULL};
    static const Level L = {ops, 0, E_BINARY, filtered_unary};
    return binary_chain(P, &L);
}
static Node *parse_math2(Parser *P)
{
    static const char *const ops[] = {"*", "/", "//", "%", NULL};
    static const Level L = {ops, 0, E_BINARY, parse_pow};
    return binary_chain(P, &L);
}
static Node *parse_concat(Parser *P)
{
    static const char *const ops[] = {"~", NULL};
    static const Level L = {ops, 0, E_CONCAT, parse_math2};
    return binary_chain(P, &L);
}
static Node *parse_math1(Parser *P)
{
    static const char *const ops[] = {"+", "-", NULL};
    static const Level L = {ops, 0, E_BINARY, parse_concat};
    return binary_chain(P, &L);
}
static Node *parse_compare(Parser *P)
{
    int line = cur(P)->line;
    Node *first = parse_math1(P), *n = NULL;
    for (;;) {
        const char *op;
        if (is_op(P, "==") || is_op(P, "!=") || is_op(P, "<") || is_op(P, ">") || is_op(P, "<=") || is_op(P, ">="))
            op = next(P)->p;
        else if (is_name(P, "in")) next(P), op = "in";
        else if (is_name(P, "not") && P->t[P->at + 1].k == K_NAME && !strcmp(P->t[P->at + 1].p, "in"))
            next(P), next(P), op = "not in";
        else break;
        if (!n) {
            n = node(P, E_COMPARE, line);
            add_kid(P, n, first);
        }
        add_name(P, &n->ops, &n->nkw, op);
        add_kid(P, n, parse_math1(P));
    }
    return n ? n : first;
}
static Node *parse_not(Parser *P)
{
    if (is_name(P, "not")) {
        int line = next(P)->line;
        if (++P->depth > JINJA_MAX_DEPTH) perr(P, line, "expressions nest more than %d deep", JINJA_MAX_DEPTH);
        Node *n = node(P, E_NOT, line);
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}
static Node *parse_and(Parser *P)
{
    static const char *const ops[] = {"and", NULL};
    static const Level L = {ops, 1, E_AND, parse_not};
    return binary_chain(P, &L);
}
static Node *parse_or(Parser *P)
{
    static const char *const ops[] = {"or", NULL};
    static const Level L = {ops, 1, E_OR, parse_and};
    return binary_chain(P, &L);
}
static Node *parse_expr(Parser *P)
{
    int line = cur(P)->line;
    if (++P->depth > JINJA_MAX_DEPTH) perr(P, line, "expressions nest more than %d deep", JINJA_MAX_DEPTH);
    Node *n = parse_or(P);
    while (is_name(P, "if")) { /* a if cond else b */
        next(P);
        Node *c = node(P, E_COND, line);
        c->a = n, c->b = parse_or(P);
        if (is_name(P, "else")) {
            next(P);
            c->c = parse_expr(P);
        }
        n = c;
    }
    P->depth--;
    return n;
}

/* ---- statements ------------------------------------------------------------ */

static Node *parse_body(Parser *P, const char *const *stops);

/* the block tag's name after '{%', without consuming it */
static const char *tag_name(Parser *P) { return P->t[P->at + 1].k == K_NAME ? P->t[P->at + 1].p : NULL; }

static void end_tag(Parser *P, const char *name)
{
    expect_kind(P, K_BBEGIN);
    if (!is_name(P, name)) perr(P, cur(P)->line, "expected '%s'", name);
    next(P);
    expect_kind(P, K_BEND);
}

static Node *parse_statement(Parser *P)
{
    int line = next(P)->line; /* {% */
    const char *name = expect_name(P);
    Node *n;
    if (!strcmp(name, "if")) {
        n = node(P, N_IF, line);
        n->a = parse_expr(P);
        expect_kind(P, K_BEND);
        static const char *const stops[] = {"elif", "else", "endif", NULL};
        n->b = parse_body(P, stops);
        Node *tail = n;
        for (;;) {
            const char *t = tag_name(P);
            next(P), next(P);
            if (!strcmp(t, "elif")) {
                Node *e = node(P, N_IF, cur(P)->line);
                e->a = parse_expr(P);
                expect_kind(P, K_BEND);
                e->b = parse_body(P, stops);
                tail->c = e, tail = e;
            } else if (!strcmp(t, "else")) {
                expect_kind(P, K_BEND);
                static const char *const end[] = {"endif", NULL};
                tail->c = parse_body(P, end);
                end_tag(P, "endif");
                break;
            } else {
                expect_kind(P, K_BEND);
                break;
            }
        }
        return n;
    }
    if (!strcmp(name, "for")) {
        n = node(P, N_FOR, line);
        add_name(P, &n->kw, &n->nkw, expect_name(P));
        while (is_op(P, ",")) next(P), add_name(P, &n->kw, &n->nkw, expect_name(P));
        if (!is_name(P, "in")) perr(P, cur(P)->line, "expected 'in' in a for loop");
        next(P);
        n->a = parse_or(P); /* the iterable: no conditional expression, its 'if' filters */
        if (is_name(P, "if")) next(P), n->d = parse_expr(P);
        if (is_name(P, "recursive")) perr(P, line, "recursive for loops are not supported");
        expect_kind(P, K_BEND);
        static const char *const stops[] = {"else", "endfor", NULL};
        P->loops++;
        n->b = parse_body(P, stops);
        P->loops--;
        if (!strcmp(tag_name(P), "else")) {
            next(P), next(P);
            expect_kind(P, K_BEND);
            static const char *const end[] = {"endfor", NULL};
            n->c = parse_body(P, end);
        }
        end_tag(P, "endfor");
        return n;
    }
    if (!strcmp(name, "set")) {
        const char *target = expect_name(P);
        if (is_op(P, ".")) {
            next(P);
            n = node(P, N_SET_ATTR, line);
            n->name = target;
            add_name(P, &n->kw, &n->nkw, expect_name(P));
            expect_op(P, "=");
            n->a = parse_expr(P);
        } else if (is_op(P, "=")) {
            next(P);
            n = node(P, N_SET, line);
            n->name = target, n->a = parse_expr(P);
        } else if (cur(P)->k == K_BEND) {
            next(P);
            n = node(P, N_SET_BLOCK, line);
            n->name = target;
            static const char *const end[] = {"endset", NULL};
            n->b = parse_body(P, end);
            end_tag(P, "endset");
            return n;
        } else perr(P, line, "this form of set is not supported (one name, name.attribute, or a block)");
        expect_kind(P, K_BEND);
        return n;
    }
    if (!strcmp(name, "macro") || !strcmp(name, "call")) {
        int is_macro = name[0] == 'm';
        n = node(P, is_macro ? N_MACRO : N_CALL_BLOCK, line);
        if (is_macro) n->name = expect_name(P);
        if (is_macro || is_op(P, "(")) { /* parameters, with defaults */
            expect_op(P, "(");
            while (!is_op(P, ")")) {
                if (n->nkw) expect_op(P, ",");
                add_name(P, &n->kw, &n->nkw, expect_name(P));
                Node *def = NULL;
                if (is_op(P, "=")) next(P), def = parse_expr(P);
                else if (n->nv) perr(P, line, "a parameter without a default follows one with a default");
                if (def || n->nv) {
                    while (n->nv < n->nkw - 1) add_kid(P, n, NULL);
                    add_kid(P, n, def);
                }
            }
            next(P);
        }
        if (is_macro) add_name(P, &P->macros, &P->n_macros, n->name);
        else {
            n->a = parse_expr(P);
            if (n->a->k != E_CALL) perr(P, line, "call needs a macro call");
        }
        expect_kind(P, K_BEND);
        const char *const end[] = {is_macro ? "endmacro" : "endcall", NULL};
        n->b = parse_body(P, end);
        end_tag(P, end[0]);
        return n;
    }
    if (!strcmp(name, "break") || !strcmp(name, "continue")) {
        if (!P->loops) perr(P, line, "'%s' outside a for loop", name);
        expect_kind(P, K_BEND);
        return node(P, name[0] == 'b' ? N_BREAK : N_CONTINUE, line);
    }
    if (!strcmp(name, "generation")) { /* transformers' assistant-mask tag: its body as written */
        expect_kind(P, K_BEND);
        static const char *const end[] = {"endgeneration", NULL};
        n = parse_body(P, end);
        end_tag(P, "endgeneration");
        return n;
    }
    perr(P, line, "the tag '%s' is not supported", name);
}

static Node *parse_body(Parser *P, const char *const *stops)
{
    Node *body = node(P, N_BODY, cur(P)->line);
    if (++P->depth > JINJA_MAX_DEPTH) perr(P, cur(P)->line, "blocks nest more than %d deep", JINJA_MAX_DEPTH);
    for (;;) {
        Tok *t = cur(P);
        if (t->k == K_EOF) {
            if (stops) {
                int last = 0;
                while (stops[last + 1]) last++;
                perr(P, t->line, "'%s' is missing", stops[last]);
            }
            break;
        }
        if (t->k == K_TEXT) {
            Node *n = node(P, N_TEXT, t->line);
            n->name = t->p, n->nkw = (int)t->n;
            n->val = NULL;
            next(P);
            add_kid(P, body, n);
        } else if (t->k == K_VBEGIN) {
            next(P);
            Node *n = node(P, N_OUTPUT, t->line);
            n->a = parse_expr(P);
            expect_kind(P, K_VEND);
            add_kid(P, body, n);
        } else if (t->k == K_BBEGIN) {
            const char *name = tag_name(P);
            if (name && stops && in_list(stops, name) >= 0) break;
            if (name && (!strncmp(name, "end", 3) || !strcmp(name, "elif") || !strcmp(name, "else")))
                perr(P, t->line, "unexpected '%s'", name);
            add_kid(P, body, parse_statement(P));
        } else perr(P, t->line, "unexpected %s", tok_text(t));
    }
    P->depth--;
    return body;
}

struct JinjaTemplate {
    Arena a;
    Node *root;
    char *name;
};

JinjaTemplate *jinja_parse(const char *name, const char *src, size_t len, char **err)
{
    Parser *P = xcalloc(1, sizeof *P); /* on the heap: longjmp leaves it intact */
    jmp_buf jb;
    P->a.fail = &jb;
    P->name = name;
    *err = NULL;
    if (setjmp(jb)) {
        *err = P->a.err;
        arena_free(&P->a);
        free(P);
        return NULL;
    }
    lex(P, src, len);
    Node *root = parse_body(P, NULL);
    for (int i = 0; i < P->n_calls; i++) {
        int known = in_list(globals, P->calls[i]) >= 0 || !strcmp(P->calls[i], "caller");
        for (int m = 0; m < P->n_macros && !known; m++) known = !strcmp(P->macros[m], P->calls[i]);
        if (!known) perr(P, P->call_lines[i], "the function '%s' is not supported", P->calls[i]);
    }
    JinjaTemplate *t = xcalloc(1, sizeof *t);
    t->a = P->a, t->root = root, t->name = xstrdup(name);
    t->a.fail = NULL;
    free(P);
    return t;
}

void jinja_free(JinjaTemplate *t)
{
    if (!t) return;
    arena_free(&t->a);
    free(t->name);
    free(t);
}

/* ---- rendering ------------------------------------------------------------ */

struct Frame {
    Frame *up;
    const char **names;
    Val **vals;
    int n, cap;
};

typedef struct {
    Ctx c; /* first: a Ctx * is a Render * */
    const char *name;
} Render;

enum { DONE, BREAK, CONTINUE };

static void __attribute__((noreturn, format(printf, 3, 4))) rfail(Ctx *C, int line, const char *fmt, ...)
{
    char buf[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fail(&C->a, "%s:%d: %s", ((Render *)C)->name, line, buf);
}

static const char *type_name(const Val *v)
{
    static const char *const names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list", "dict",
                                        "Namespace", "Macro", "builtin_function_or_method", "LoopContext"};
    return v->t == V_LIST && v->tuple ? "tuple" : names[v->t];
}

static char *afmt(Ctx *C, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *afmt(Ctx *C, const char *fmt, ...)
{
    char buf[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return adup(&C->a, buf, strlen(buf));
}

static void __attribute__((noreturn)) undefined_error(Ctx *C, const Val *v, int line)
{
    rfail(C, line, "UndefinedError: %s", v->what ? v->what : "a value is undefined");
}

static void step(Ctx *C, int line)
{
    if (++C->steps > JINJA_MAX_STEPS) rfail(C, line, "the template runs more than %ld steps", JINJA_MAX_STEPS);
}

static Frame *new_frame(Ctx *C, Frame *up)
{
    Frame *f = alloc(&C->a, sizeof *f);
    f->up = up;
    return f;
}
static void bind(Ctx *C, Frame *f, const char *name, Val *v)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            f->vals[i] = v;
            return;
        }
    if (f->n == f->cap) {
        int cap = f->cap ? 2 * f->cap : 8;
        const char **n = alloc(&C->a, sizeof(char *) * (size_t)cap);
        Val **v2 = alloc(&C->a, sizeof(Val *) * (size_t)cap);
        if (f->n) memcpy(n, f->names, sizeof(char *) * (size_t)f->n), memcpy(v2, f->vals, sizeof(Val *) * (size_t)f->n);
        f->names = n, f->vals = v2, f->cap = cap;
    }
    f->names[f->n] = name, f->vals[f->n++] = v;
}
static Val *lookup(Ctx *C, Frame *f, const char *name)
{
    for (; f; f = f->up)
        for (int i = f->n - 1; i >= 0; i--)
            if (!strcmp(f->names[i], name)) return f->vals[i];
    int g = in_list(globals, name);
    if (g >= 0) {
        Val *v = mk(C, V_FUNC);
        v->fn.id = g;
        return v;
    }
    return mk_undef(C, afmt(C, "'%s' is undefined", name));
}

static int truthy(const Val *v)
{
    switch (v->t) {
    case V_UNDEF:
    case V_NONE: return 0;
    case V_BOOL: return v->b;
    case V_INT: return v->i != 0;
    case V_FLOAT: return v->f != 0;
    case V_STR: return v->s.n != 0;
    case V_LIST: return v->l.n != 0;
    case V_DICT: return v->d.n != 0;
    default: return 1;
    }
}

static int is_num(const Val *v) { return v->t == V_INT || v->t == V_FLOAT || v->t == V_BOOL; }
static double num(const Val *v) { return v->t == V_FLOAT ? v->f : v->t == V_INT ? (double)v->i : v->b; }
static long long inum(const Val *v) { return v->t == V_INT ? v->i : v->b; }

static int val_eq_at(Ctx *C, const Val *a, const Val *b);

/* a value's comparison recursion is bounded like its printing */
static int val_eq(Ctx *C, const Val *a, const Val *b)
{
    if (++C->depth > JINJA_MAX_DEPTH) fail(&C->a, "a value nests more than %d deep", JINJA_MAX_DEPTH);
    int r = val_eq_at(C, a, b);
    C->depth--;
    return r;
}

static int val_eq_at(Ctx *C, const Val *a, const Val *b)
{
    if (a == b) return 1;
    if (is_num(a) && is_num(b)) {
        if (a->t != V_FLOAT && b->t != V_FLOAT) return inum(a) == inum(b);
        return num(a) == num(b);
    }
    if (a->t != b->t) return 0;
    switch (a->t) {
    case V_UNDEF:
    case V_NONE: return 1;
    case V_STR: return a->s.n == b->s.n && !memcmp(a->s.p, b->s.p, a->s.n);
    case V_LIST:
        if (a->tuple != b->tuple || a->l.n != b->l.n) return 0;
        for (int i = 0; i < a->l.n; i++)
            if (!val_eq(C, a->l.v[i], b->l.v[i])) return 0;
        return 1;
    case V_DICT:
        if (a->d.n != b->d.n) return 0;
        for (int i = 0; i < a->d.n; i++) {
            int j = dict_find(C, b, a->d.k[i]);
            if (j < 0 || !val_eq(C, a->d.v[i], b->d.v[j])) return 0;
        }
        return 1;
    default: return 0;
    }
}

/* Python's ordering: <0, 0, >0 */
static int val_cmp(Ctx *C, const Val *a, const Val *b, const char *op, int line)
{
    if (C->depth > JINJA_MAX_DEPTH) fail(&C->a, "a value nests more than %d deep", JINJA_MAX_DEPTH);
    if (a->t == V_UNDEF) undefined_error(C, a, line);
    if (b->t == V_UNDEF) undefined_error(C, b, line);
    if (is_num(a) && is_num(b)) {
        if (a->t != V_FLOAT && b->t != V_FLOAT) return (inum(a) > inum(b)) - (inum(a) < inum(b));
        return (num(a) > num(b)) - (num(a) < num(b));
    }
    if (a->t == V_STR && b->t == V_STR) {
        size_t n = a->s.n < b->s.n ? a->s.n : b->s.n;
        int c = memcmp(a->s.p, b->s.p, n);
        return c ? (c > 0) - (c < 0) : (a->s.n > b->s.n) - (a->s.n < b->s.n);
    }
    if (a->t == V_LIST && b->t == V_LIST && a->tuple == b->tuple) {
        for (int i = 0; i < a->l.n && i < b->l.n; i++)
            if (!val_eq(C, a->l.v[i], b->l.v[i])) {
                C->depth++;
                int c = val_cmp(C, a->l.v[i], b->l.v[i], op, line);
                C->depth--;
                return c;
            }
        return (a->l.n > b->l.n) - (a->l.n < b->l.n);
    }
    rfail(C, line, "TypeError: '%s' not supported between instances of '%s' and '%s'", op, type_name(a),
          type_name(b));
}

/* the code points of a string as values (iteration, list()) */
static Val *chars_of(Ctx *C, const Val *s)
{
    Val *l = mk(C, V_LIST);
    for (size_t i = 0; i < s->s.n;) {
        int n;
        utf8_at(s->s.p + i, s->s.n - i, &n);
        list_push(C, l, mk_str(C, s->s.p + i, (size_t)n));
        i += (size_t)n;
    }
    return l;
}

/* what a for loop, list() or a filter iterates over */
static Val *iter_of(Ctx *C, Val *v, int line)
{
    switch (v->t) {
    case V_LIST: return v;
    case V_UNDEF: return mk(C, V_LIST);
    case V_STR: return chars_of(C, v);
    case V_DICT: {
        Val *l = mk(C, V_LIST);
        for (int i = 0; i < v->d.n; i++) list_push(C, l, v->d.k[i]);
        return l;
    }
    default: rfail(C, line, "TypeError: '%s' object is not iterable", type_name(v));
    }
}

static int contains(Ctx *C, const Val *box, const Val *x, int line)
{
    switch (box->t) {
    case V_STR:
        if (x->t != V_STR) rfail(C, line, "TypeError: 'in <string>' requires string as left operand, not %s", type_name(x));
        return !x->s.n || memmem(box->s.p, box->s.n, x->s.p, x->s.n);
    case V_LIST:
        for (int i = 0; i < box->l.n; i++)
            if (val_eq(C, box->l.v[i], x)) return 1;
        return 0;
    case V_DICT: return dict_find(C, box, x) >= 0;
    case V_UNDEF: return 0;
    default: rfail(C, line, "TypeError: argument of type '%s' is not iterable", type_name(box));
    }
}

static Val *method(Ctx *C, Val *self, int id, const char *name)
{
    Val *f = mk(C, V_FUNC);
    f->fn.id = id, f->fn.self = self, f->what = name;
    return f;
}

static Val *get_attr(Ctx *C, Val *obj, const char *name, int line)
{
    int m;
    switch (obj->t) {
    case V_UNDEF: undefined_error(C, obj, line);
    case V_DICT:
        if ((m = in_list(dict_methods, name)) >= 0) return method(C, obj, F_GET + m, name);
        if (in_list(unsafe_methods, name) >= 0) return method(C, obj, F_UNSAFE, name);
        if ((m = dict_find_str(obj, name)) >= 0) return obj->d.v[m];
        return mk_undef(C, afmt(C, "'dict object' has no attribute '%s'", name));
    case V_NS:
        if ((m = dict_find_str(obj, name)) >= 0) return obj->d.v[m];
        return mk_undef(C, afmt(C, "'Namespace object' has no attribute '%s'", name));
    case V_STR:
        if ((m = in_list(str_methods, name)) >= 0) return method(C, obj, F_SPLIT + m, name);
        break;
    case V_LIST:
        if (in_list(unsafe_methods, name) >= 0) return method(C, obj, F_UNSAFE, name);
        break;
    case V_LOOP: {
        const Val *l = obj->loop.items;
        int i = obj->loop.i, n = l->l.n;
        if (!strcmp(name, "index")) return mk_int(C, i + 1);
        if (!strcmp(name, "index0")) return mk_int(C, i);
        if (!strcmp(name, "revindex")) return mk_int(C, n - i);
        if (!strcmp(name, "revindex0")) return mk_int(C, n - i - 1);
        if (!strcmp(name, "first")) return mk_bool(C, i == 0);
        if (!strcmp(name, "last")) return mk_bool(C, i == n - 1);
        if (!strcmp(name, "length")) return mk_int(C, n);
        if (!strcmp(name, "depth")) return mk_int(C, 1);
        if (!strcmp(name, "depth0")) return mk_int(C, 0);
        if (!strcmp(name, "previtem") && i > 0) return l->l.v[i - 1];
        if (!strcmp(name, "nextitem") && i + 1 < n) return l->l.v[i + 1];
        break;
    }
    default: break;
    }
    return mk_undef(C, afmt(C, "'%s object' has no attribute '%s'", type_name(obj), name));
}

static Val *get_item(Ctx *C, Val *obj, Val *key, int line)
{
    switch (obj->t) {
    case V_UNDEF: undefined_error(C, obj, line);
    case V_DICT: {
        int i = dict_find(C, obj, key);
        if (i >= 0) return obj->d.v[i];
        break;
    }
    case V_LIST:
        if (key->t == V_INT || key->t == V_BOOL) {
            long long i = inum(key);
            if (i < 0) i += obj->l.n;
            if (i >= 0 && i < obj->l.n) return obj->l.v[i];
            return mk_undef(C, afmt(C, "'%s object' has no element %lld", type_name(obj), inum(key)));
        }
        break;
    case V_STR:
        if (key->t == V_INT || key->t == V_BOOL) {
            Val *cs = chars_of(C, obj);
            return get_item(C, cs, key, line);
        }
        break;
    default: break;
    }
    if (key->t == V_STR) return get_attr(C, obj, key->s.p, line);
    return mk_undef(C, afmt(C, "'%s object' has no element", type_name(obj)));
}

/* Python's slice of a list or a string (by code points) */
static Val *slice(Ctx *C, Val *obj, Val *lo, Val *hi, Val *st, int line)
{
    if (obj->t == V_UNDEF) undefined_error(C, obj, line);
    Val *seq = obj->t == V_STR ? chars_of(C, obj) : obj;
    if (seq->t != V_LIST) rfail(C, line, "TypeError: '%s' object is not subscriptable", type_name(obj));
    long long n = seq->l.n, step = 1, a, b;
    for (int k = 0; k < 3; k++) {
        Val *x = k == 0 ? lo : k == 1 ? hi : st;
        if (x && x->t != V_NONE && x->t != V_INT && x->t != V_BOOL)
            rfail(C, line, "TypeError: slice indices must be integers or None");
    }
    if (st && st->t != V_NONE) step = inum(st);
    if (!step) rfail(C, line, "ValueError: slice step cannot be zero");
    if (!lo || lo->t == V_NONE) a = step > 0 ? 0 : n - 1;
    else {
        a = inum(lo);
        if (a < 0) a += n;
        if (a < 0) a = step > 0 ? 0 : -1;
        if (a >= n) a = step > 0 ? n : n - 1;
    }
    if (!hi || hi->t == V_NONE) b = step > 0 ? n : -1;
    else {
        b = inum(hi);
        if (b < 0) b += n;
        if (b < 0) b = step > 0 ? 0 : -1;
        if (b >= n) b = step > 0 ? n : n - 1;
    }
    Val *out = mk(C, V_LIST);
    out->tuple = seq->tuple;
    for (long long i = a; step > 0 ? i < b : i > b; i += step) list_push(C, out, seq->l.v[i]);
    if (obj->t != V_STR) return out;
    size_t len = 0;
    for (int i = 0; i < out->l.n; i++) len += out->l.v[i]->s.n;
    char *s = alloc(&C->a, len + 1);
    size_t k = 0;
    for (int i = 0; i < out->l.n; i++) memcpy(s + k, out->l.v[i]->s.p, out->l.v[i]->s.n), k += out->l.v[i]->s.n;
    Val *r = mk(C, V_STR);
    r->s.p = s, r->s.n = len;
    return r;
}

static Val *concat_str(Ctx *C, const char *a, size_t an, const char *b, size_t bn)
{
    if (an + bn > JINJA_MAX_OUTPUT) fail(&C->a, "a string grows past %u MiB", JINJA_MAX_OUTPUT >> 20);
    Val *v = mk(C, V_STR);
    char *s = alloc(&C->a, an + bn + 1);
    memcpy(s, a, an), memcpy(s + an, b, bn);
    v->s.p = s, v->s.n = an + bn;
    return v;
}

static Val *arith(Ctx *C, const char *op, Val *a, Val *b, int line)
{
    if (a->t == V_UNDEF) undefined_error(C, a, line);
    if (b->t == V_UNDEF) undefined_error(C, b, line);
    char o = op[0];
    int two = op[1] != '\0';
    if (is_num(a) && is_num(b)) {
        int ints = a->t != V_FLOAT && b->t != V_FLOAT;
        long long x = inum(a), y = inum(b), r;
        double p = num(a), q = num(b);
        if (o == '+' && ints) {
            if (__builtin_add_overflow(x, y, &r)) rfail(C, line, "OverflowError: an integer is too large");
            return mk_int(C, r);
        }
        if (o == '-' && ints) {
            if (__builtin_sub_overflow(x, y, &r)) rfail(C, line, "OverflowError: an integer is too large");
            return mk_int(C, r);
        }
        if (o == '*' && !two && ints) {
            if (__builtin_mul_overflow(x, y, &r)) rfail(C, line, "OverflowError: an integer is too large");
            return mk_int(C, r);
        }
        if (o == '+') return mk_float(C, p + q);
        if (o == '-') return mk_float(C, p - q);
        if (o == '*' && !two) return mk_float(C, p * q);
        if (o == '*') { /* ** */
            if (ints && y >= 0) {
                long long base = x, acc = 1;
                for (long long e = y; e; e >>= 1) {
                    if ((e & 1) && __builtin_mul_overflow(acc, base, &acc))
                        rfail(C, line, "OverflowError: an integer is too large");
                    if (e > 1 && __builtin_mul_overflow(base, base, &base))
                        rfail(C, line, "OverflowError: an integer is too large");
                }
                return mk_int(C, acc);
            }
            return mk_float(C, pow(p, q));
        }
        if (q == 0) rfail(C, line, "ZeroDivisionError: division by zero");
        if (o == '/' && !two) return mk_float(C, p / q);
        if (o == '/') { /* // */
            if (ints) {
                long long d = x / y;
                if ((x % y) && ((x < 0) != (y < 0))) d--;
                return mk_int(C, d);
            }
            return mk_float(C, floor(p / q));
        }
        if (o == '%') {
            if (ints) {
                long long m = x % y;
                if (m && ((m < 0) != (y < 0))) m += y;
                return mk_int(C, m);
            }
            double m = fmod(p, q);
            if (m != 0 && ((m < 0) != (q < 0))) m += q;
            return mk_float(C, m);
        }
    }
    if (o == '+' && a->t == V_STR && b->t == V_STR) return concat_str(C, a->s.p, a->s.n, b->s.p, b->s.n);
    if (o == '+' && a->t == V_LIST && b->t == V_LIST && a->tuple == b->tuple) {
        Val *l = mk(C, V_LIST);
        l->tuple = a->tuple;
        for (int i = 0; i < a->l.n; i++) list_push(C, l, a->l.v[i]);
        for (int i = 0; i < b->l.n; i++) list_push(C, l, b->l.v[i]);
        return l;
    }
    if (o == '*' && !two && ((a->t == V_STR || a->t == V_LIST) && (b->t == V_INT || b->t == V_BOOL))) {
        long long k = inum(b);
        Val *r = a->t == V_STR ? mk_str(C, "", 0) : mk(C, V_LIST);
        r->tuple = a->tuple;
        for (long long i = 0; i < k; i++) {
            step(C, line);
            if (a->t == V_STR) r = concat_str(C, r->s.p, r->s.n, a->s.p, a->s.n);
            else
                for (int j = 0; j < a->l.n; j++) list_push(C, r, a->l.v[j]);
        }
        return r;
    }
    if (o == '*' && !two && (b->t == V_STR || b->t == V_LIST) && (a->t == V_INT || a->t == V_BOOL))
        return arith(C, op, b, a, line);
    if (o == '%' && a->t == V_STR) rfail(C, line, "string formatting with %% is not supported");
    rfail(C, line, "TypeError: unsupported operand type(s) for %s: '%s' and '%s'", op, type_name(a), type_name(b));
}

static Val *eval(Ctx *C, Frame *f, const Node *n);
static int exec(Ctx *C, Frame *f, const Node *n);

/* the output of a body (a macro's, a block set's) as a string */
static Val *capture(Ctx *C, Frame *f, const Node *body)
{
    char *o = C->out;
    size_t n = C->n, cap = C->cap;
    C->out = NULL, C->n = C->cap = 0;
    exec(C, f, body);
    Val *s = mk(C, V_STR);
    s->s.p = C->out ? C->out : "", s->s.n = C->n;
    C->out = o, C->n = n, C->cap = cap;
    return s;
}

typedef struct {
    Val **v;
    int n;
    const char **kw; /* the last nkw of v are named */
    int nkw;
} Args;

static Args eval_args(Ctx *C, Frame *f, const Node *n)
{
    Args a = {alloc(&C->a, sizeof(Val *) * (size_t)(n->nv + 1)), n->nv, n->kw, n->nkw};
    for (int i = 0; i < n->nv; i++) a.v[i] = eval(C, f, n->v[i]);
    return a;
}
/* argument pos (positional) or name (keyword) of a builtin; NULL if not given */
static Val *arg(const Args *a, int pos, const char *name)
{
    int npos = a->n - a->nkw;
    if (pos >= 0 && pos < npos) return a->v[pos];
    for (int i = 0; i < a->nkw; i++)
        if (!strcmp(a->kw[i], name)) return a->v[npos + i];
    return NULL;
}
static void check_args(Ctx *C, const Args *a, int max_pos, const char *const *names, const char *what, int line)
{
    if (a->n - a->nkw > max_pos) rfail(C, line, "TypeError: %s takes at most %d positional argument(s)", what, max_pos);
    for (int i = 0; i < a->nkw; i++)
        if (!names || in_list(names, a->kw[i]) < 0)
            rfail(C, line, "TypeError: %s got an unexpected keyword argument '%s'", what, a->kw[i]);
}
static const Val *want_str(Ctx *C, const Val *v, const char *what, int line)
{
    if (!v || v->t != V_STR) rfail(C, line, "TypeError: %s needs a string, not %s", what, v ? type_name(v) : "nothing");
    return v;
}

static Val *call_macro(Ctx *C, Val *m, const Args *a, Val *caller, int line)
{
    const Node *def = m->m.def;
    if (++C->depth > JINJA_MAX_DEPTH) rfail(C, line, "macro calls nest more than %d deep", JINJA_MAX_DEPTH);
    Frame *fr = new_frame(C, m->m.scope);
    int npos = a->n - a->nkw;
    if (npos > def->nkw) rfail(C, line, "TypeError: macro '%s' takes not more than %d argument(s)", def->name ? def->name : "caller", def->nkw);
    for (int i = 0; i < a->nkw; i++) {
        int k;
        for (k = 0; k < def->nkw && strcmp(def->kw[k], a->kw[i]); k++) {}
        if (k == def->nkw) rfail(C, line, "TypeError: macro '%s' takes no keyword argument '%s'", def->name ? def->name : "caller", a->kw[i]);
        if (k < npos) rfail(C, line, "TypeError: macro '%s' got multiple values for argument '%s'", def->name ? def->name : "caller", a->kw[i]);
    }
    for (int k = 0; k < def->nkw; k++) {
        Val *v = k < npos ? a->v[k] : NULL;
        for (int i = 0; i < a->nkw && !v; i++)
            if (!strcmp(def->kw[k], a->kw[i])) v = a->v[npos + i];
        if (!v && k < def->nv && def->v[k]) v = eval(C, fr, def->v[k]);
        if (!v) v = mk_undef(C, afmt(C, "parameter '%s' was not provided", def->kw[k]));
        bind(C, fr, def->kw[k], v);
    }
    if (caller) bind(C, fr, "caller", caller);
    Val *out = capture(C, fr, def->b);
    C->depth--;
    return out;
}

static Val *split(Ctx *C, const Val *s, const Val *sep, long long max)
{
    Val *l = mk(C, V_LIST);
    const char *p = s->s.p;
    size_t n = s->s.n, i = 0;
    if (!sep || sep->t == V_NONE) { /* runs of whitespace, no empty pieces */
        for (;;) {
            int len;
            while (i < n && py_space(utf8_at(p + i, n - i, &len))) i += (size_t)len;
            if (i >= n) break;
            if (max >= 0 && l->l.n == max) { /* the rest as it is, trailing whitespace included */
                list_push(C, l, mk_str(C, p + i, n - i));
                break;
            }
            size_t j = i;
            while (j < n && !py_space(utf8_at(p + j, n - j, &len))) j += (size_t)len;
            list_push(C, l, mk_str(C, p + i, j - i));
            i = j;
        }
        return l;
    }
    if (!sep->s.n) fail(&C->a, "ValueError: empty separator");
    for (;;) {
        const char *hit = NULL;
        if (max < 0 || l->l.n < max)
            for (size_t j = i; j + sep->s.n <= n; j++)
                if (!memcmp(p + j, sep->s.p, sep->s.n)) {
                    hit = p + j;
                    break;
                }
        if (!hit) {
            list_push(C, l, mk_str(C, p + i, n - i));
            return l;
        }
        list_push(C, l, mk_str(C, p + i, (size_t)(hit - (p + i))));
        i = (size_t)(hit - p) + sep->s.n;
    }
}

static Val *replace(Ctx *C, const Val *s, const Val *old, const Val *new, long long count)
{
    char *o = C->out;
    size_t on = C->n, ocap = C->cap;
    C->out = NULL, C->n = C->cap = 0;
    emit(C, "", 0);
    long long done = 0;
    if (!old->s.n) { /* between every character */
        for (size_t i = 0;;) {
            if (count < 0 || done < count) emit(C, new->s.p, new->s.n), done++;
            if (i >= s->s.n) break;
            int l;
            utf8_at(s->s.p + i, s->s.n - i, &l);
            emit(C, s->s.p + i, (size_t)l);
            i += (size_t)l;
        }
    } else
        for (size_t i = 0; i < s->s.n;) {
            if ((count < 0 || done < count) && i + old->s.n <= s->s.n && !memcmp(s->s.p + i, old->s.p, old->s.n)) {
                emit(C, new->s.p, new->s.n);
                i += old->s.n, done++;
            } else emit(C, s->s.p + i++, 1);
        }
    Val *r = mk(C, V_STR);
    r->s.p = C->out, r->s.n = C->n;
    C->out = o, C->n = on, C->cap = ocap;
    return r;
}

static Val *case_map(Ctx *C, const Val *s, int upper)
{
    Val *r = mk_str(C, s->s.p, s->s.n);
    char *p = (char *)r->s.p;
    for (size_t i = 0; i < r->s.n; i++)
        if (upper && p[i] >= 'a' && p[i] <= 'z') p[i] = (char)(p[i] - 32);
        else if (!upper && p[i] >= 'A' && p[i] <= 'Z') p[i] = (char)(p[i] + 32);
    return r;
}

static Val *strip(Ctx *C, const Val *s, const Val *chars, int left, int right, int line)
{
    if (chars && chars->t != V_NONE) want_str(C, chars, "strip", line);
    int given = chars && chars->t == V_STR;
    size_t a, b;
    py_strip(s->s.p, s->s.n, given ? chars->s.p : NULL, given ? chars->s.n : 0, left, right, &a, &b);
    return mk_str(C, s->s.p + a, b - a);
}

static int affix(Ctx *C, const Val *s, const Val *x, int end, int line)
{
    if (x && x->t == V_LIST && x->tuple) {
        for (int i = 0; i < x->l.n; i++)
            if (affix(C, s, x->l.v[i], end, line)) return 1;
        return 0;
    }
    want_str(C, x, end ? "endswith" : "startswith", line);
    return x->s.n <= s->s.n && !memcmp(s->s.p + (end ? s->s.n - x->s.n : 0), x->s.p, x->s.n);
}

static Val *call_func(Ctx *C, Val *fn, const Args *a, int line)
{
    Val *self = fn->fn.self;
    static const char *const none[] = {NULL};
    switch (fn->fn.id) {
    case F_RANGE: {
        check_args(C, a, 3, none, "range", line);
        long long v[3] = {0, 0, 1};
        int n = a->n;
        if (!n) rfail(C, line, "TypeError: range expected at least 1 argument");
        for (int i = 0; i < n; i++) {
            if (a->v[i]->t != V_INT && a->v[i]->t != V_BOOL) rfail(C, line, "TypeError: range needs integers");
            v[n == 1 ? 1 : i] = inum(a->v[i]);
        }
        if (!v[2]) rfail(C, line, "ValueError: range() arg 3 must not be zero");
        long long count = v[2] > 0 ? (v[1] > v[0] ? (v[1] - v[0] + v[2] - 1) / v[2] : 0)
                                   : (v[0] > v[1] ? (v[0] - v[1] - v[2] - 1) / -v[2] : 0);
        if (count > 100000) /* jinja2's sandbox refuses larger ranges (MAX_RANGE) */
            rfail(C, line, "OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        Val *l = mk(C, V_LIST);
        for (long long i = 0; i < count; i++) list_push(C, l, mk_int(C, v[0] + i * v[2]));
        return l;
    }
    case F_NAMESPACE:
    case F_DICT: {
        Val *d = mk(C, fn->fn.id == F_NAMESPACE ? V_NS : V_DICT);
        int npos = a->n - a->nkw;
        if (npos > 1) rfail(C, line, "TypeError: %s takes at most one positional argument", fn->fn.id == F_DICT ? "dict" : "namespace");
        if (npos) {
            Val *src = a->v[0];
            if (src->t != V_DICT) rfail(C, line, "TypeError: %s needs a mapping", fn->fn.id == F_DICT ? "dict" : "namespace");
            for (int i = 0; i < src->d.n; i++) dict_set(C, d, src->d.k[i], src->d.v[i]);
        }
        for (int i = 0; i < a->nkw; i++) dict_set(C, d, mk_str(C, a->kw[i], strlen(a->kw[i])), a->v[npos + i]);
        if (d->t == V_NS)
            for (int i = 0; i < d->d.n; i++)
                if (d->d.k[i]->t == V_STR && d->d.k[i]->s.p[0] == '_')
                    rfail(C, line, "SecurityError: a namespace cannot hold underscore-prefixed attributes ('%s')", d->d.k[i]->s.p);
        return d;
    }
    case F_RAISE: { /* the template's own message, as the request's error */
        Val *m = a->n ? to_str(C, a->v[0]) : mk_str(C, "", 0);
        fail(&C->a, "%s", m->s.p);
    }
    case F_STRFTIME: {
        check_args(C, a, 1, none, "strftime_now", line);
        const Val *f = want_str(C, a->n ? a->v[0] : NULL, "strftime_now", line);
        struct tm tm;
        localtime_r(&C->now, &tm);
        char buf[512];
        size_t n = strftime(buf, sizeof buf, f->s.p, &tm);
        return mk_str(C, buf, n);
    }
    case F_SPLIT: {
        static const char *const kw[] = {"sep", "maxsplit", NULL};
        check_args(C, a, 2, kw, "split", line);
        Val *sep = arg(a, 0, "sep"), *max = arg(a, 1, "maxsplit");
        if (sep && sep->t != V_NONE) want_str(C, sep, "split", line);
        if (max && max->t != V_INT) rfail(C, line, "TypeError: split's maxsplit must be an integer");
        return split(C, self, sep, max ? max->i : -1);
    }
    case F_STRIP:
    case F_LSTRIP:
    case F_RSTRIP: {
        check_args(C, a, 1, none, fn->what, line);
        int id = fn->fn.id;
        return strip(C, self, a->n ? a->v[0] : NULL, id != F_RSTRIP, id != F_LSTRIP, line);
    }
    case F_STARTSWITH:
    case F_ENDSWITH:
        check_args(C, a, 1, none, fn->what, line);
        return mk_bool(C, affix(C, self, a->n ? a->v[0] : NULL, fn->fn.id == F_ENDSWITH, line));
    case F_UPPER:
    case F_LOWER: check_args(C, a, 0, none, fn->what, line); return case_map(C, self, fn->fn.id == F_UPPER);
    case F_REPLACE: {
        check_args(C, a, 3, none, "replace", line);
        if (a->n < 2) rfail(C, line, "TypeError: replace needs two arguments");
        want_str(C, a->v[0], "replace", line), want_str(C, a->v[1], "replace", line);
        if (a->n > 2 && a->v[2]->t != V_INT) rfail(C, line, "TypeError: replace's count must be an integer");
        return replace(C, self, a->v[0], a->v[1], a->n > 2 ? a->v[2]->i : -1);
    }
    case F_GET: {
        check_args(C, a, 2, none, "get", line);
        if (!a->n) rfail(C, line, "TypeError: get expected at least 1 argument");
        int i = dict_find(C, self, a->v[0]);
        return i >= 0 ? self->d.v[i] : a->n > 1 ? a->v[1] : C->none;
    }
    case F_ITEMS:
    case F_KEYS:
    case F_VALUES: {
        check_args(C, a, 0, none, fn->what, line);
        Val *l = mk(C, V_LIST);
        for (int i = 0; i < self->d.n; i++) {
            if (fn->fn.id == F_KEYS) list_push(C, l, self->d.k[i]);
            else if (fn->fn.id == F_VALUES) list_push(C, l, self->d.v[i]);
            else {
                Val *t = mk(C, V_LIST);
                t->tuple = 1;
                list_push(C, t, self->d.k[i]), list_push(C, t, self->d.v[i]);
                list_push(C, l, t);
            }
        }
        return l;
    }
    default:
        rfail(C, line, "SecurityError: access to attribute '%s' of '%s' object is unsafe.", fn->what,
              type_name(self));
    }
}

static Val *call(Ctx *C, Val *callee, const Args *a, Val *caller, int line)
{
    if (callee->t == V_MACRO) return call_macro(C, callee, a, caller, line);
    if (caller) rfail(C, line, "call needs a macro");
    if (callee->t == V_FUNC) return call_func(C, callee, a, line);
    if (callee->t == V_UNDEF) undefined_error(C, callee, line);
    rfail(C, line, "TypeError: '%s' object is not callable", type_name(callee));
}

static Val *eval_call(Ctx *C, Frame *f, const Node *n, Val *caller)
{
    Val *callee;
    if (n->a->k == E_ATTR) callee = get_attr(C, eval(C, f, n->a->a), n->a->name, n->line);
    else callee = eval(C, f, n->a);
    Args a = eval_args(C, f, n);
    return call(C, callee, &a, caller, n->line);
}

/* ---- the built-in tests and filters: one table each, whose names the
 * parser accepts and whose functions the renderer calls ---------------- */

/* A test: v is the value tested, x its argument (NULL when none). */
typedef int (*TestFn)(Ctx *C, const char *name, const Val *v, const Val *x, int line);
struct Test {
    const char *name;
    TestFn fn;
    int needs_arg; /* without one, a TypeError */
};

static int t_defined(Ctx *C, const char *name, const Val *v, const Val *x, int line)
{
    (void)C, (void)x, (void)line;
    return (v->t != V_UNDEF) == !strcmp(name, "defined");
}
/* the tests of a value's type, one function each */
#define TYPE_TEST(fn, cond)                                                       \
    static int fn(Ctx *C, const char *name, const Val *v, const Val *x, int line) \
    {                                                                             \
        (void)C, (void)name, (void)x, (void)line;                                 \
        return cond;                                                              \
    }
TYPE_TEST(t_none, v->t == V_NONE)
TYPE_TEST(t_string, v->t == V_STR)
TYPE_TEST(t_number, is_num(v))
TYPE_TEST(t_integer, v->t == V_INT)
TYPE_TEST(t_float, v->t == V_FLOAT)
TYPE_TEST(t_boolean, v->t == V_BOOL)
TYPE_TEST(t_true, v->t == V_BOOL && v->b)
TYPE_TEST(t_false, v->t == V_BOOL && !v->b)
TYPE_TEST(t_mapping, v->t == V_DICT)
TYPE_TEST(t_iterable, v->t == V_STR || v->t == V_LIST || v->t == V_DICT || v->t == V_UNDEF)
#undef TYPE_TEST
static int t_parity(Ctx *C, const char *name, const Val *v, const Val *x, int line)
{
    (void)x;
    if (v->t != V_INT && v->t != V_BOOL) rfail(C, line, "TypeError: the test '%s' needs an integer", name);
    return (inum(v) & 1) == (name[0] == 'o');
}
/* equalto, eq, ==; ne, != */
static int t_equal(Ctx *C, const char *name, const Val *v, const Val *x, int line)
{
    (void)line;
    return val_eq(C, v, x) == (name[0] == 'e' || name[0] == '=');
}
static int t_in(Ctx *C, const char *name, const Val *v, const Val *x, int line)
{
    (void)name;
    return contains(C, x, v, line);
}
static int t_divisibleby(Ctx *C, const char *name, const Val *v, const Val *x, int line)
{
    if (v->t != V_INT && v->t != V_BOOL) rfail(C, line, "TypeError: the test '%s' needs an integer", name);
    if ((x->t != V_INT && x->t != V_BOOL) || !inum(x)) rfail(C, line, "divisibleby needs a nonzero integer");
    return inum(v) % inum(x) == 0;
}

static const Test tests[] = {
    {"defined", t_defined, 0},   {"undefined", t_defined, 0}, {"none", t_none, 0},   {"string", t_string, 0},
    {"number", t_number, 0},     {"integer", t_integer, 0},   {"float", t_float, 0}, {"mapping", t_mapping, 0},
    {"iterable", t_iterable, 0}, {"sequence", t_iterable, 0}, {"true", t_true, 0},   {"false", t_false, 0},
    {"boolean", t_boolean, 0},   {"odd", t_parity, 0},        {"even", t_parity, 0}, {"equalto", t_equal, 1},
    {"eq", t_equal, 1},          {"==", t_equal, 1},          {"ne", t_equal, 1},    {"!=", t_equal, 1},
    {"in", t_in, 1},             {"divisibleby", t_divisibleby, 1},
};

static const Test *find_test(const char *name)
{
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++)
        if (!strcmp(tests[i].name, name)) return &tests[i];
    return NULL;
}

static int apply_test(Ctx *C, const char *name, Val *v, const Args *a, int line)
{
    const Test *t = find_test(name); /* the parser lets only these through */
    const Val *x = a->n ? a->v[0] : NULL;
    if (t->needs_arg && !x) rfail(C, line, "TypeError: the test '%s' needs an argument", name);
    return t->fn(C, name, v, x, line);
}

static long long length_of(Ctx *C, const Val *v, int line)
{
    switch (v->t) {
    case V_STR: return (long long)utf8_count(v->s.p, v->s.n);
    case V_LIST: return v->l.n;
    case V_DICT: return v->d.n;
    case V_UNDEF: return 0;
    default: rfail(C, line, "TypeError: object of type '%s' has no len()", type_name(v));
    }
}

/* an attribute path ("a.b", parts that are digits are indices), as jinja2's attribute getters read it */
static Val *attr_path(Ctx *C, Val *v, const Val *path, int line)
{
    const char *p = path->s.p;
    while (*p) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        Val *key = mk_str(C, p, n);
        int digits = n > 0;
        for (size_t i = 0; i < n; i++) digits &= p[i] >= '0' && p[i] <= '9';
        if (digits) key = mk_int(C, atoll(key->s.p));
        v = get_item(C, v, key, line);
        p += n + (dot != NULL);
    }
    return v;
}

/* A filter: v its input, a its arguments. */
typedef Val *(*FilterFn)(Ctx *C, const char *name, Val *v, Args *a, int line);
struct Filter {
    const char *name;
    FilterFn fn;
};

static const char *const no_kw[] = {NULL};

/* what fn(C, arg) writes to the output, as a string */
static Val *rendered(Ctx *C, void (*fn)(Ctx *C, const void *arg), const void *arg)
{
    char *out = C->out;
    size_t on = C->n, ocap = C->cap;
    C->out = NULL, C->n = C->cap = 0;
    emit(C, "", 0);
    fn(C, arg);
    Val *r = mk(C, V_STR);
    r->s.p = C->out, r->s.n = C->n;
    C->out = out, C->n = on, C->cap = ocap;
    return r;
}

static Val *f_length(Ctx *C, const char *name, Val *v, Args *a, int line)
{
    (void)name, (void)a;
    return mk_int(C, length_of(C, v, line));
}
static Val *f_string(Ctx *C, const char *name, Val *v, Args *a, int line)
{
    (void)name, (void)a, (void)line;
    return to_str(C, v);
}
static Val *f_safe(Ctx *C, const char *name, Val *v, Args *a, int line)
{
    (void)C, (void)name, (void)a, (void)line;
    return v;
}
static Val *f_trim(Ctx *C, const char *name, Val *v, Args *a, int line)
{
    check_args(C, a, 1, no_kw, name, line);
    return strip(C, to_str(C, v), a->n ? a->v[0] : NULL, 1, 1, line);
}
/* lower, upper */
static Val *f_case(Ctx *C, const char *name, Val *v, Args *a, int line)
{
    (void)a, (void)line;
    return case_map(C, to_str(C, v), name[0] == 'u');
}
static Val *f_replace(Ctx *C, const char *name, Val *v, Args *a, int line)
{
    static const char *const kw[] = {"old", "new", "count", NULL};
    check_args(C, a, 3, kw, name, line);
    Val *old = arg(a, 0, "old"), *new = arg(a, 1, "new"), *count = arg(a, 2, "count");
    if (!old || !new) rfail(C, line, "TypeError: replace needs two arguments");
    if (count && count->t != V_INT && count->t != V_NONE) rfail(C, line, "TypeError: replace's count must be an integer");
    return replace(C, to_str(C, v), to_str(C, old), to_str(C, new), count && count->t == V_INT ? count->i : -1);
}

typedef struct {
    const Val *v;
    JsonOpts o;
} JsonArg;
static void dump_json(Ctx *C, const void *arg)
{
    const JsonArg *j = arg;
    json_dump(C, j->v, &j->o, 0);
}
static Val *f_tojson(Ctx *C, const char *name, Val *v, Args *a, int line)
{
    static const char *const kw[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    check_args(C, a, 4, kw, name, line);
    Val *ascii = arg(a, 0, "ensure_ascii"), *indent = arg(a, 1, "indent"), *seps = arg(a, 2, "separators"),
        *sort = arg(a, 3, "sort_keys");
    JsonArg j = {v, {ascii && truthy(ascii), sort && truthy(sort), NULL, ", ", ": "}};
    if (indent && indent->t != V_NONE) {
        if (indent->t == V_STR) j.o.indent = indent->s.p;
        else if (indent->t == V_INT) {
            long long k = indent->i < 0 ? 0 : indent->i > 64 ? 64 : indent->i;
            char *sp = alloc(&C->a, (size_t)k + 1);
            memset(sp, ' ', (size_t)k);
            j.o.indent = sp;
        } else rfail(C, line, "TypeError: tojson's indent must be an integer or a string");
        j.o.item_sep = ",";
    }
    if (seps && seps->t != V_NONE) {
        if (seps->t != V_LIST || seps->l.n != 2 || seps->l.v[0]->t != V_STR || seps->l.v[1]->t != V_STR)
            rfail(C, line, "TypeError: tojson's separators must be two strings");
        j.o.item_sep = seps->l.v[0]->s.p, j.o.key_sep = seps->l.v[1]->s.p;
    }
    return rendered(C, dump_json, &j);
}
/* default, d */
static Val *f_default(Ctx *C, const char *name, Val *v, Args *a, int line)
{
    static const char *const kw[] = {"default_value", "boolean", NULL};
    (void)name;
    check_args(C, a, 2, kw, "default", line);
    Val *dv = arg(a, 0, "default_value"), *boolean = arg(a, 1, "boolean");
    if (v->t == V_UNDEF || (boolean && truthy(boolean) && !truthy(v))) return dv ? dv : mk_str(C, "", 0);
    return v;
}
static Val *f_items(Ctx *C, const char *name, Val *v, Args *a, int line)
{
    (void)name, (void)a;
    if (v->t == V_UNDEF) return mk(C, V_LIST);
    if (v->t != V_DICT) rfail(C, line, "TypeError: Can only get item pairs from a mapping.");
    Val *fn = method(C, v, F_ITEMS, "items");
    Args none_args = {NULL, 0, NULL, 0};
    return call_func(C, fn, &none_args, line);
}
static Val *f_list(Ctx *C, const char *name, Val *v, Args *a, int line)
{
    (void)name, (void)a;
    Val *items = iter_of(C, v, line), *l = mk(C, V_LIST);
    for (int i = 0; i < items->l.n; i++) list_push(C, l, items->l.v[i]);
    return l;
}
static Val *f_first(Ctx *C, const char *name, Val *v, Args *a, int line)
{
    (void)name, (void)a;
    Val *items = iter_of(C, v, line);
    return items->l.n ? items->l.v[0] : mk_undef(C, "No first item, sequence was empty.");
}
static Val *f_last(Ctx *C, const char *name, Val *v, Args *a, int line)
{
    (void)name, (void)a;
    if (v->t == V_UNDEF) return mk_undef(C, "No last item, sequence was empty.");
    if (v->t != V_LIST && v->t != V_STR) rfail(C, line, "TypeError: '%s' object is not reversible", type_name(v));
    Val *items = iter_of(C, v, line);
    return items->l.n ? items->l.v[items->l.n - 1] : mk_undef(C, "No last item, sequence was empty.");
}

typedef struct {
    Val *items, *sep, *attr;
    int line;
} JoinArg;
static void join_items(Ctx *C, const void *arg)
{
    const JoinArg *j = arg;
    for (int i = 0; i < j->items->l.n; i++) {
        if (i) emit(C, j->sep->s.p, j->sep->s.n);
        Val *x = j->items->l.v[i];
        if (j->attr) x = attr_path(C, x, to_str(C, j->attr), j->line);
        str_of(C, x);
    }
}
static Val *f_join(Ctx *C, const char *name, Val *v, Args *a, int line)
{
    static const char *const kw[] = {"d", "attribute", NULL};
    Val *items = iter_of(C, v, line);
    check_args(C, a, 2, kw, name, line);
    Val *sep = arg(a, 0, "d"), *attr = arg(a, 1, "attribute");
    JoinArg j = {items, sep ? to_str(C, sep) : mk_str(C, "", 0), attr, line};
    return rendered(C, join_items, &j);
}
static Val *f_map(Ctx *C, const char *name, Val *v, Args *a, int line)
{
    (void)name;
    Val *items = iter_of(C, v, line), *path = to_str(C, a->v[0]), *l = mk(C, V_LIST);
    for (int i = 0; i < items->l.n; i++) list_push(C, l, attr_path(C, items->l.v[i], path, line));
    return l;
}
/* select, reject, selectattr, rejectattr */
static Val *f_select(Ctx *C, const char *name, Val *v, Args *a, int line)
{
    Val *items = iter_of(C, v, line);
    int by_attr = !strcmp(name, "selectattr") || !strcmp(name, "rejectattr"), keep = name[0] == 's';
    check_args(C, a, 64, no_kw, name, line);
    if (by_attr && !a->n) rfail(C, line, "TypeError: %s needs an attribute", name);
    Val *path = by_attr ? to_str(C, a->v[0]) : NULL;
    int t = by_attr ? 1 : 0;
    const char *test = a->n > t ? want_str(C, a->v[t], name, line)->s.p : NULL;
    Args rest = {a->v + t + 1, a->n > t + 1 ? a->n - t - 1 : 0, NULL, 0};
    Val *l = mk(C, V_LIST);
    for (int i = 0; i < items->l.n; i++) {
        step(C, line);
        Val *x = by_attr ? attr_path(C, items->l.v[i], path, line) : items->l.v[i];
        int ok = test ? apply_test(C, test, x, &rest, line) : truthy(x);
        if (ok == keep) list_push(C, l, items->l.v[i]);
    }
    return l;
}

static const Filter filters[] = {
    {"length", f_length}, {"count", f_length}, {"string", f_string},     {"safe", f_safe},       {"trim", f_trim},
    {"lower", f_case},    {"upper", f_case},   {"replace", f_replace},   {"tojson", f_tojson},   {"default", f_default},
    {"d", f_default},     {"items", f_items},  {"list", f_list},         {"first", f_first},     {"last", f_last},
    {"join", f_join},     {"map", f_map},      {"select", f_select},     {"reject", f_select},   {"selectattr", f_select},
    {"rejectattr", f_select},
};

static const Filter *find_filter(const char *name)
{
    for (size_t i = 0; i < sizeof filters / sizeof *filters; i++)
        if (!strcmp(filters[i].name, name)) return &filters[i];
    return NULL;
}

static Val *apply_filter(Ctx *C, Frame *f, const Node *n)
{
    Val *v = eval(C, f, n->a);
    Args a = eval_args(C, f, n);
    return find_filter(n->name)->fn(C, n->name, v, &a, n->line); /* the parser lets only these through */
}

static Val *eval(Ctx *C, Frame *f, const Node *n)
{
    step(C, n->line);
    switch (n->k) {
    case E_CONST: return n->val;
    case E_NAME: return lookup(C, f, n->name);
    case E_LIST:
    case E_TUPLE: {
        Val *l = mk(C, V_LIST);
        l->tuple = n->k == E_TUPLE;
        for (int i = 0; i < n->nv; i++) list_push(C, l, eval(C, f, n->v[i]));
        return l;
    }
    case E_DICT: {
        Val *d = mk(C, V_DICT);
        for (int i = 0; i + 1 < n->nv; i += 2) dict_set(C, d, eval(C, f, n->v[i]), eval(C, f, n->v[i + 1]));
        return d;
    }
    case E_ATTR: return get_attr(C, eval(C, f, n->a), n->name, n->line);
    case E_ITEM: return get_item(C, eval(C, f, n->a), eval(C, f, n->b), n->line);
    case E_SLICE: {
        Val *obj = eval(C, f, n->a);
        return slice(C, obj, n->b ? eval(C, f, n->b) : NULL, n->c ? eval(C, f, n->c) : NULL,
                     n->d ? eval(C, f, n->d) : NULL, n->line);
    }
    case E_CALL: return eval_call(C, f, n, NULL);
    case E_FILTER: return apply_filter(C, f, n);
    case E_TEST: {
        Val *v = eval(C, f, n->a);
        Args a = eval_args(C, f, n);
        return mk_bool(C, apply_test(C, n->name, v, &a, n->line) != n->negate);
    }
    case E_NEG:
    case E_POS: {
        Val *v = eval(C, f, n->a);
        if (v->t == V_UNDEF) undefined_error(C, v, n->line);
        if (!is_num(v)) rfail(C, n->line, "TypeError: bad operand type for unary %c: '%s'", n->k == E_NEG ? '-' : '+', type_name(v));
        if (n->k == E_POS) return v->t == V_BOOL ? mk_int(C, v->b) : v;
        if (v->t == V_FLOAT) return mk_float(C, -v->f);
        if (inum(v) == LLONG_MIN) rfail(C, n->line, "OverflowError: an integer is too large");
        return mk_int(C, -inum(v));
    }
    case E_BINARY: return arith(C, n->name, eval(C, f, n->a), eval(C, f, n->b), n->line);
    case E_CONCAT: {
        Val *a = to_str(C, eval(C, f, n->a)), *b = to_str(C, eval(C, f, n->b));
        return concat_str(C, a->s.p, a->s.n, b->s.p, b->s.n);
    }
    case E_AND: {
        Val *a = eval(C, f, n->a);
        return truthy(a) ? eval(C, f, n->b) : a;
    }
    case E_OR: {
        Val *a = eval(C, f, n->a);
        return truthy(a) ? a : eval(C, f, n->b);
    }
    case E_NOT: return mk_bool(C, !truthy(eval(C, f, n->a)));
    case E_COND:
        if (truthy(eval(C, f, n->b))) return eval(C, f, n->a);
        return n->c ? eval(C, f, n->c) : mk_undef(C, "the conditional expression's else part is missing");
    case E_COMPARE: {
        Val *left = eval(C, f, n->v[0]);
        for (int i = 0; i < n->nkw; i++) {
            Val *right = eval(C, f, n->v[i + 1]);
            const char *op = n->ops[i];
            int ok;
            if (!strcmp(op, "==")) ok = val_eq(C, left, right);
            else if (!strcmp(op, "!=")) ok = !val_eq(C, left, right);
            else if (!strcmp(op, "in")) ok = contains(C, right, left, n->line);
            else if (!strcmp(op, "not in")) ok = !contains(C, right, left, n->line);
            else {
                int c = val_cmp(C, left, right, op, n->line);
                ok = op[0] == '<' ? (op[1] ? c <= 0 : c < 0) : (op[1] ? c >= 0 : c > 0);
            }
            if (!ok) return C->no;
            left = right;
        }
        return C->yes;
    }
    default: rfail(C, n->line, "internal: an expression of kind %d", n->k);
    }
}

static int exec(Ctx *C, Frame *f, const Node *n)
{
    step(C, n->line);
    switch (n->k) {
    case N_BODY:
        for (int i = 0; i < n->nv; i++) {
            int r = exec(C, f, n->v[i]);
            if (r != DONE) return r;
        }
        return DONE;
    case N_TEXT: emit(C, n->name, (size_t)n->nkw); return DONE;
    case N_OUTPUT: str_of(C, eval(C, f, n->a)); return DONE;
    case N_IF:
        if (truthy(eval(C, f, n->a))) return exec(C, f, n->b);
        return n->c ? exec(C, f, n->c) : DONE;
    case N_FOR: {
        Val *all = iter_of(C, eval(C, f, n->a), n->line), *items = all;
        Frame *lf = new_frame(C, f);
        if (n->d) { /* for x in xs if cond: the loop sees only those that pass */
            items = mk(C, V_LIST);
            for (int i = 0; i < all->l.n; i++) {
                Frame *cf = new_frame(C, f);
                bind(C, cf, n->kw[0], all->l.v[i]); /* (one target: unpacking below binds the rest) */
                if (n->nkw > 1) {
                    Val *t = all->l.v[i];
                    if (t->t != V_LIST || t->l.n != n->nkw) rfail(C, n->line, "ValueError: cannot unpack %s into %d names", type_name(t), n->nkw);
                    for (int k = 0; k < n->nkw; k++) bind(C, cf, n->kw[k], t->l.v[k]);
                }
                if (truthy(eval(C, cf, n->d))) list_push(C, items, all->l.v[i]);
            }
        }
        Val *loop = mk(C, V_LOOP); /* one object, advanced each iteration, as jinja2's LoopContext */
        loop->loop.items = items;
        bind(C, lf, "loop", loop);
        for (int i = 0; i < items->l.n; i++) {
            Val *x = items->l.v[i];
            if (n->nkw == 1) bind(C, lf, n->kw[0], x);
            else {
                if ((x->t != V_LIST) || x->l.n != n->nkw)
                    rfail(C, n->line, "ValueError: cannot unpack %s into %d names", type_name(x), n->nkw);
                for (int k = 0; k < n->nkw; k++) bind(C, lf, n->kw[k], x->l.v[k]);
            }
            loop->loop.i = i;
            if (exec(C, lf, n->b) == BREAK) break;
        }
        if (!items->l.n && n->c) return exec(C, f, n->c);
        return DONE;
    }
    case N_SET: bind(C, f, n->name, eval(C, f, n->a)); return DONE;
    case N_SET_ATTR: {
        Val *ns = lookup(C, f, n->name), *v = eval(C, f, n->a);
        if (ns->t != V_NS) rfail(C, n->line, "TemplateRuntimeError: cannot assign attribute on non-namespace object");
        if (n->kw[0][0] == '_') rfail(C, n->line, "SecurityError: a namespace cannot hold underscore-prefixed attributes ('%s')", n->kw[0]);
        dict_set(C, ns, mk_str(C, n->kw[0], strlen(n->kw[0])), v);
        return DONE;
    }
    case N_SET_BLOCK: bind(C, f, n->name, capture(C, f, n->b)); return DONE;
    case N_MACRO: {
        Val *m = mk(C, V_MACRO);
        m->m.def = n, m->m.scope = f;
        bind(C, f, n->name, m);
        return DONE;
    }
    case N_CALL_BLOCK: {
        Val *caller = mk(C, V_MACRO);
        caller->m.def = n, caller->m.scope = f;
        str_of(C, eval_call(C, f, n->a, caller));
        return DONE;
    }
    case N_BREAK: return BREAK;
    case N_CONTINUE: return CONTINUE;
    default: rfail(C, n->line, "internal: a statement of kind %d", n->k);
    }
}

char *jinja_render(const JinjaTemplate *t, json_t *vars, long long now, size_t *len, char **err)
{
    Render *R = xcalloc(1, sizeof *R);
    Ctx *C = &R->c;
    C->now = (time_t)now;
    jmp_buf jb;
    C->a.fail = &jb;
    R->name = t->name;
    *err = NULL;
    if (setjmp(jb)) {
        *err = C->a.err;
        arena_free(&C->a);
        free(R);
        return NULL;
    }
    C->none = mk(C, V_NONE), C->yes = mk(C, V_BOOL), C->no = mk(C, V_BOOL);
    C->yes->b = 1;
    Frame *g = new_frame(C, NULL);
    const char *key;
    json_t *v;
    json_object_foreach(vars, key, v) bind(C, g, adup(&C->a, key, strlen(key)), from_json(C, v));
    emit(C, "", 0);
    exec(C, g, t->root);
    char *out = xmalloc(C->n + 1);
    memcpy(out, C->out, C->n + 1);
    *len = C->n;
    arena_free(&C->a);
    free(R);
    return out;
}
