/* The Jinja engine's values (jinja_impl.h): the arena, Python's types and
 * their string rules, str() and repr(), the output buffer, json.dumps. */
#include "jinja_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* ---- arena and errors --------------------------------------------------- */

void arena_free(Arena *a)
{
    for (Block *b = a->head, *n; b; b = n) n = b->next, free(b);
    a->head = NULL;
}

void __attribute__((noreturn, format(printf, 2, 3))) arena_fail(Arena *a, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (!a->err) a->err = xstrdup(buf);
    longjmp(*a->fail, 1);
}

/* err (malloc'ed, taken) with "name:line: " in front, where it has no
 * place of its own; a line < 0 leaves it as it is */
char *at_line(char *err, const char *name, int line)
{
    size_t n = strlen(name);
    if (!err || line < 0 || (!strncmp(err, name, n) && err[n] == ':')) return err;
    size_t len = n + strlen(err) + 16;
    char *r = xmalloc(len);
    snprintf(r, len, "%s:%d: %s", name, line, err);
    free(err);
    return r;
}

void *arena_alloc(Arena *a, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (n > JINJA_MAX_MEMORY || a->total + n > JINJA_MAX_MEMORY)
        arena_fail(a, "the template needs more than %u MiB of memory", JINJA_MAX_MEMORY >> 20);
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

char *arena_dup(Arena *a, const char *s, size_t n)
{
    char *p = arena_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* ---- values ------------------------------------------------------------- */

Val *mk(Ctx *C, int t)
{
    Val *v = arena_alloc(&C->a, sizeof *v);
    v->t = t;
    return v;
}
Val *mk_int(Ctx *C, long long i)
{
    Val *v = mk(C, V_INT);
    v->i = i;
    return v;
}
Val *mk_float(Ctx *C, double f)
{
    Val *v = mk(C, V_FLOAT);
    v->f = f;
    return v;
}
Val *mk_str(Ctx *C, const char *p, size_t n)
{
    Val *v = mk(C, V_STR);
    v->s.p = arena_dup(&C->a, p, n), v->s.n = n;
    return v;
}
Val *mk_bool(Ctx *C, int b) { return b ? C->yes : C->no; }
Val *mk_undef(Ctx *C, const char *what)
{
    Val *v = mk(C, V_UNDEF);
    v->what = what;
    return v;
}

void list_push(Ctx *C, Val *l, Val *x)
{
    if (l->l.n == l->l.cap) {
        int cap = l->l.cap ? 2 * l->l.cap : 8;
        Val **v = arena_alloc(&C->a, sizeof(Val *) * (size_t)cap);
        if (l->l.n) memcpy(v, l->l.v, sizeof(Val *) * (size_t)l->l.n);
        l->l.v = v, l->l.cap = cap;
    }
    l->l.v[l->l.n++] = x;
}


int dict_find(Ctx *C, const Val *d, const Val *key)
{
    for (int i = 0; i < d->d.n; i++)
        if (val_eq(C, d->d.k[i], key)) return i;
    return -1;
}
int dict_find_str(const Val *d, const char *key)
{
    size_t n = strlen(key);
    for (int i = 0; i < d->d.n; i++)
        if (d->d.k[i]->t == V_STR && d->d.k[i]->s.n == n && !memcmp(d->d.k[i]->s.p, key, n)) return i;
    return -1;
}
void dict_set(Ctx *C, Val *d, Val *key, Val *x)
{
    int i = dict_find(C, d, key);
    if (i >= 0) {
        d->d.v[i] = x;
        return;
    }
    if (d->d.n == d->d.cap) {
        int cap = d->d.cap ? 2 * d->d.cap : 8;
        Val **k = arena_alloc(&C->a, sizeof(Val *) * (size_t)cap), **v = arena_alloc(&C->a, sizeof(Val *) * (size_t)cap);
        if (d->d.n) memcpy(k, d->d.k, sizeof(Val *) * (size_t)d->d.n), memcpy(v, d->d.v, sizeof(Val *) * (size_t)d->d.n);
        d->d.k = k, d->d.v = v, d->d.cap = cap;
    }
    d->d.k[d->d.n] = key, d->d.v[d->d.n++] = x;
}

Val *from_json(Ctx *C, json_t *j)
{
    if (++C->depth > JINJA_MAX_DEPTH) arena_fail(&C->a, "the template's variables nest more than %d deep", JINJA_MAX_DEPTH);
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
unsigned utf8_at(const char *s, size_t n, int *len)
{
    const unsigned char *u = (const unsigned char *)s;
    int l = u[0] < 0x80 ? 1 : (u[0] & 0xE0) == 0xC0 ? 2 : (u[0] & 0xF0) == 0xE0 ? 3 : (u[0] & 0xF8) == 0xF0 ? 4 : 1;
    if ((size_t)l > n) l = 1;
    unsigned c = l == 1 ? u[0] : l == 2 ? u[0] & 0x1F : l == 3 ? u[0] & 0x0F : u[0] & 0x07;
    for (int i = 1; i < l; i++) c = c << 6 | (u[i] & 0x3F);
    *len = l;
    return c;
}
size_t utf8_put(char *o, unsigned c)
{
    if (c < 0x80) return o[0] = (char)c, 1;
    if (c < 0x800) return o[0] = (char)(0xC0 | c >> 6), o[1] = (char)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000)
        return o[0] = (char)(0xE0 | c >> 12), o[1] = (char)(0x80 | (c >> 6 & 0x3F)), o[2] = (char)(0x80 | (c & 0x3F)), 3;
    o[0] = (char)(0xF0 | c >> 18), o[1] = (char)(0x80 | (c >> 12 & 0x3F)), o[2] = (char)(0x80 | (c >> 6 & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}
size_t utf8_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* Python's str.isspace(), which strip() and split() use */
int py_space(unsigned c)
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
void py_strip(const char *s, size_t n, const char *chars, size_t cn, int left, int right, size_t *from,
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

void emit(Ctx *C, const char *s, size_t n)
{
    if (C->n + n > JINJA_MAX_OUTPUT) arena_fail(&C->a, "the template's output exceeds %u MiB", JINJA_MAX_OUTPUT >> 20);
    if (C->n + n + 1 > C->cap) {
        size_t cap = 2 * (C->n + n + 1) > 256 ? 2 * (C->n + n + 1) : 256;
        if (C->top) { /* the template's output: its bound is the output limit, not the values' memory */
            C->top_out = C->out = xrealloc(C->out, cap);
        } else {
            char *o = arena_alloc(&C->a, cap);
            if (C->n) memcpy(o, C->out, C->n);
            C->out = o;
        }
        C->cap = cap;
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
void str_of(Ctx *C, const Val *v)
{
    char b[64];
    if (++C->depth > JINJA_MAX_DEPTH) arena_fail(&C->a, "a value nests more than %d deep", JINJA_MAX_DEPTH);
    switch (v->t) {
    case V_UNDEF: break;
    case V_NONE: emits(C, "None"); break;
    case V_BOOL: emits(C, v->b ? "True" : "False"); break;
    case V_INT: snprintf(b, sizeof b, "%lld", v->i), emits(C, b); break;
    case V_FLOAT: float_repr(v->f, b, sizeof b), emits(C, b); break;
    case V_STR: emit(C, v->s.p, v->s.n); break;
    case V_MACRO: /* jinja2's repr: a call block's body is anonymous */
        if (v->m.def->name) emits(C, "<Macro '"), emits(C, v->m.def->name), emits(C, "'>");
        else emits(C, "<Macro anonymous>");
        break;
    case V_FUNC: /* one inside a value; N_OUTPUT names the line of one printed alone */
        arena_fail(&C->a, "printing the %s '%s' is not supported", v->fn.self ? "method" : "function", v->what);
    case V_LOOP: emits(C, "<LoopContext>"); break;
    default: repr(C, v);
    }
    C->depth--;
}

static void repr(Ctx *C, const Val *v)
{
    if (++C->depth > JINJA_MAX_DEPTH) arena_fail(&C->a, "a value nests more than %d deep", JINJA_MAX_DEPTH);
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

void capture_begin(Ctx *C, Capture *s)
{
    s->out = C->out, s->n = C->n, s->cap = C->cap, s->top = C->top;
    C->out = NULL, C->n = C->cap = 0, C->top = 0;
}

/* what was written since capture_begin, as a string */
Val *capture_end(Ctx *C, const Capture *s)
{
    Val *r = mk(C, V_STR);
    r->s.p = C->out ? C->out : "", r->s.n = C->n;
    C->out = s->out, C->n = s->n, C->cap = s->cap, C->top = s->top;
    return r;
}

/* str(v) as a value: output written into a fresh buffer */
Val *to_str(Ctx *C, Val *v)
{
    if (v->t == V_STR) return v;
    Capture s;
    capture_begin(C, &s);
    str_of(C, v);
    return capture_end(C, &s);
}

/* ---- json.dumps, as transformers' tojson calls it --------------------------- */

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

void json_dump(Ctx *C, const Val *v, const JsonOpts *o, int level)
{
    char b[64];
    if (++C->depth > JINJA_MAX_DEPTH) arena_fail(&C->a, "tojson: a value nests more than %d deep", JINJA_MAX_DEPTH);
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
        int *order = arena_alloc(&C->a, sizeof(int) * (size_t)v->d.n);
        for (int i = 0; i < v->d.n; i++) order[i] = i;
        if (o->sort) {
            for (int i = 0; i < v->d.n; i++)
                if (v->d.k[i]->t != V_STR) arena_fail(&C->a, "tojson: sort_keys needs string keys");
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
            else arena_fail(&C->a, "tojson: keys must be str, int, float, bool or None");
            emits(C, o->key_sep);
            json_dump(C, v->d.v[order[j]], o, level + 1);
        }
        if (o->indent) json_newline(C, o, level);
        emits(C, "}");
        break;
    }
    default:
        arena_fail(&C->a, "tojson: Object of type %s is not JSON serializable",
             v->t == V_UNDEF ? "Undefined" : v->t == V_NS ? "Namespace" : "function");
    }
    C->depth--;
}
