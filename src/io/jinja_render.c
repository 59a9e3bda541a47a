/* The Jinja engine's renderer (jinja_impl.h): a tree walk over Python-like
 * values with jinja2's semantics (its sandbox, Undefined, loop variables,
 * macros and call blocks), bounded in depth, steps, memory and output; the
 * built-in filters, tests and functions. */
#define _GNU_SOURCE /* memmem */
#include "jinja_impl.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util.h"

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
    arena_fail(&C->a, "%s:%d: %s", ((Render *)C)->name, line, buf);
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
    return arena_dup(&C->a, buf, strlen(buf));
}

static void __attribute__((noreturn)) undefined_error(Ctx *C, const Val *v, int line)
{
    rfail(C, line, "UndefinedError: %s", v->what ? v->what : "a value is undefined");
}

static void step(Ctx *C, int line)
{
    C->line = line;
    if (++C->steps > JINJA_MAX_STEPS) rfail(C, line, "the template runs more than %ld steps", JINJA_MAX_STEPS);
}

static Frame *new_frame(Ctx *C, Frame *up)
{
    Frame *f = arena_alloc(&C->a, sizeof *f);
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
        const char **n = arena_alloc(&C->a, sizeof(char *) * (size_t)cap);
        Val **v2 = arena_alloc(&C->a, sizeof(Val *) * (size_t)cap);
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
        v->fn.id = g, v->what = globals[g];
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
int val_eq(Ctx *C, const Val *a, const Val *b)
{
    if (++C->depth > JINJA_MAX_DEPTH) arena_fail(&C->a, "a value nests more than %d deep", JINJA_MAX_DEPTH);
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
    if (C->depth > JINJA_MAX_DEPTH) arena_fail(&C->a, "a value nests more than %d deep", JINJA_MAX_DEPTH);
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
        if (in_list(py_dict_methods, name) >= 0) return method(C, obj, F_UNSUPPORTED, name);
        if ((m = dict_find_str(obj, name)) >= 0) return obj->d.v[m];
        return mk_undef(C, afmt(C, "'dict object' has no attribute '%s'", name));
    case V_NS:
        if ((m = dict_find_str(obj, name)) >= 0) return obj->d.v[m];
        return mk_undef(C, afmt(C, "'Namespace object' has no attribute '%s'", name));
    case V_STR:
        if ((m = in_list(str_methods, name)) >= 0) return method(C, obj, F_SPLIT + m, name);
        if (in_list(py_str_methods, name) >= 0) return method(C, obj, F_UNSUPPORTED, name);
        break;
    case V_LIST:
        if (in_list(unsafe_methods, name) >= 0) return method(C, obj, F_UNSAFE, name);
        if (in_list(py_list_methods, name) >= 0) return method(C, obj, F_UNSUPPORTED, name);
        break;
    case V_MACRO:
        if (!strcmp(name, "name")) return obj->m.def->name ? mk_str(C, obj->m.def->name, strlen(obj->m.def->name)) : C->none;
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
        if (!strcmp(name, "cycle") || !strcmp(name, "changed")) return method(C, obj, F_UNSUPPORTED, name);
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
    char *s = arena_alloc(&C->a, len + 1);
    size_t k = 0;
    for (int i = 0; i < out->l.n; i++) memcpy(s + k, out->l.v[i]->s.p, out->l.v[i]->s.n), k += out->l.v[i]->s.n;
    Val *r = mk(C, V_STR);
    r->s.p = s, r->s.n = len;
    return r;
}

static Val *concat_str(Ctx *C, const char *a, size_t an, const char *b, size_t bn)
{
    if (an + bn > JINJA_MAX_OUTPUT) arena_fail(&C->a, "a string grows past %u MiB", JINJA_MAX_OUTPUT >> 20);
    Val *v = mk(C, V_STR);
    char *s = arena_alloc(&C->a, an + bn + 1);
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
            if (p == 0 && q < 0) rfail(C, line, "ZeroDivisionError: 0.0 cannot be raised to a negative power");
            if (p < 0 && q != floor(q)) rfail(C, line, "a negative number to a fractional power (a complex number) is not supported");
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
        if (a->t == V_STR) { /* one string of k copies */
            if (k <= 0 || !a->s.n) return mk_str(C, "", 0);
            if ((unsigned long long)k > JINJA_MAX_OUTPUT / a->s.n)
                rfail(C, line, "a string grows past %u MiB", JINJA_MAX_OUTPUT >> 20);
            char *s = arena_alloc(&C->a, a->s.n * (size_t)k + 1);
            for (long long i = 0; i < k; i++) memcpy(s + a->s.n * (size_t)i, a->s.p, a->s.n);
            Val *r = mk(C, V_STR);
            r->s.p = s, r->s.n = a->s.n * (size_t)k;
            return r;
        }
        Val *r = mk(C, V_LIST);
        r->tuple = a->tuple;
        for (long long i = 0; i < k; i++) {
            step(C, line);
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
    Capture s;
    capture_begin(C, &s);
    exec(C, f, body);
    return capture_end(C, &s);
}

typedef struct {
    Val **v;
    int n;
    const char **kw; /* the last nkw of v are named */
    int nkw;
} Args;

static Args eval_args(Ctx *C, Frame *f, const Node *n)
{
    Args a = {arena_alloc(&C->a, sizeof(Val *) * (size_t)(n->nv + 1)), n->nv, n->kw, n->nkw};
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
    const char *name = def->name ? def->name : "caller";
    if (++C->depth > JINJA_MAX_DEPTH) rfail(C, line, "macro calls nest more than %d deep", JINJA_MAX_DEPTH);
    Frame *fr = new_frame(C, m->m.scope);
    int npos = a->n - a->nkw;
    /* extra arguments: into varargs and kwargs where the body names them
     * (jinja2 decides by the same test), refused otherwise */
    Val *varargs = mk(C, V_LIST), *kwargs = mk(C, V_DICT);
    varargs->tuple = 1;
    if (npos > def->nkw && !(def->flags & USES_VARARGS))
        rfail(C, line, "TypeError: macro '%s' takes not more than %d argument(s)", name, def->nkw);
    for (int i = def->nkw; i < npos; i++) list_push(C, varargs, a->v[i]);
    for (int i = 0; i < a->nkw; i++) {
        int k;
        for (k = 0; k < def->nkw && strcmp(def->kw[k], a->kw[i]); k++) {}
        if (k == def->nkw) {
            if (!(def->flags & USES_KWARGS))
                rfail(C, line, "TypeError: macro '%s' takes no keyword argument '%s'", name, a->kw[i]);
            dict_set(C, kwargs, mk_str(C, a->kw[i], strlen(a->kw[i])), a->v[npos + i]);
        } else if (k < npos) rfail(C, line, "TypeError: macro '%s' got multiple values for argument '%s'", name, a->kw[i]);
    }
    for (int k = 0; k < def->nkw; k++) {
        Val *v = k < npos ? a->v[k] : NULL;
        for (int i = 0; i < a->nkw && !v; i++)
            if (!strcmp(def->kw[k], a->kw[i])) v = a->v[npos + i];
        if (!v && k < def->nv && def->v[k]) v = eval(C, fr, def->v[k]);
        if (!v) v = mk_undef(C, afmt(C, "parameter '%s' was not provided", def->kw[k]));
        bind(C, fr, def->kw[k], v);
    }
    if (def->flags & USES_VARARGS) bind(C, fr, "varargs", varargs);
    if (def->flags & USES_KWARGS) bind(C, fr, "kwargs", kwargs);
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
    if (!sep->s.n) arena_fail(&C->a, "ValueError: empty separator");
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
    Capture save;
    capture_begin(C, &save);
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
    return capture_end(C, &save);
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
        C->line = -1; /* as written: no place in front */
        arena_fail(&C->a, "%s", m->s.p);
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
    case F_UNSUPPORTED: rfail(C, line, "the method '%s' of a %s is not supported", fn->what, type_name(self));
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

const Test *find_test(const char *name)
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
    Capture s;
    capture_begin(C, &s);
    fn(C, arg);
    return capture_end(C, &s);
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
            long long k = indent->i < 0 ? 0 : indent->i; /* json.dumps: a negative indent is none */
            if (k > JINJA_MAX_OUTPUT) rfail(C, line, "tojson's indent %lld is longer than the output may be (%u MiB)", k, JINJA_MAX_OUTPUT >> 20);
            char *sp = arena_alloc(&C->a, (size_t)k + 1);
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

const Filter *find_filter(const char *name)
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
    case E_FILTER:
    case E_TEST:
        if (n->flags & UNKNOWN) /* one inside an if, which jinja2 refuses only when it runs */
            rfail(C, n->line, "the %s '%s' is not supported", n->k == E_FILTER ? "filter" : "test", n->name);
        if (n->k == E_FILTER) return apply_filter(C, f, n);
        Val *v = eval(C, f, n->a);
        Args a = eval_args(C, f, n);
        return mk_bool(C, apply_test(C, n->name, v, &a, n->line) != n->negate);
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
    case N_OUTPUT: {
        Val *v = eval(C, f, n->a);
        if (v->t == V_FUNC) /* Python prints a function with its address: no template can depend on it */
            rfail(C, n->line, "printing the %s '%s' is not supported", v->fn.self ? "method" : "function", v->what);
        str_of(C, v);
        return DONE;
    }
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
        *err = at_line(C->a.err, t->name, C->line);
        free(C->top_out);
        arena_free(&C->a);
        free(R);
        return NULL;
    }
    C->none = mk(C, V_NONE), C->yes = mk(C, V_BOOL), C->no = mk(C, V_BOOL);
    C->yes->b = 1;
    Frame *g = new_frame(C, NULL);
    const char *key;
    json_t *v;
    json_object_foreach(vars, key, v) bind(C, g, arena_dup(&C->a, key, strlen(key)), from_json(C, v));
    C->top = 1;
    emit(C, "", 0);
    exec(C, g, t->root);
    char *out = C->out; /* the heap buffer emit grew */
    *len = C->n;
    arena_free(&C->a);
    free(R);
    return out;
}
