/* The Jinja engine's lexer and parser (jinja_impl.h): the template's text
 * into tokens with jinja2's whitespace rules (trim_blocks, lstrip_blocks,
 * the - markers), then a recursive-descent parse into the tree the renderer
 * walks. What the engine does not support is refused here, by name and
 * line: a tag, a filter, a test, a method or a function. */
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

#include "util.h"

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
    int soft;  /* inside an if or a conditional expression (jinja2's soft frame, which a for loop,
                * a macro, a call block and a set block leave): an unknown filter or test there is
                * refused when evaluated, elsewhere now */
    Node **pending; /* unknown filters and tests outside a soft frame, refused (settle) unless the
                     * expression they are in turns out to be a conditional one */
    int n_pending, cap_pending;
    int names; /* USES_VARARGS, USES_KWARGS: the macro body being parsed names them */
    /* names the template calls as functions, checked against its macros at the end */
    struct Call **calls; /* the names called, checked against the macros when the parse ends */
    int n_calls;
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
    arena_fail(&P->a, "%s:%d: %s", P->name, line, buf);
}

static Tok *push_tok(Parser *P, int k, int line, const char *p, size_t n)
{
    if (P->n == P->cap) {
        int cap = P->cap ? 2 * P->cap : 256;
        Tok *t = arena_alloc(&P->a, sizeof(Tok) * (size_t)cap);
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
    char *o = arena_alloc(&P->a, n + 1);
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
            push_tok(P, K_NAME, *line, arena_dup(&P->a, s + i, j - i), j - i);
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
    char *s = arena_alloc(&P->a, len + 1);
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
/* One more level of the tree (an operand chain like a.b.c or x|f|g nests
 * as deeply as brackets do, and is bounded the same way); the caller puts
 * P->depth back when its expression is done. */
static void nest(Parser *P, int line)
{
    if (++P->depth > JINJA_MAX_DEPTH) perr(P, line, "expressions nest more than %d deep", JINJA_MAX_DEPTH);
}

static Node *node(Parser *P, int k, int line)
{
    Node *n = arena_alloc(&P->a, sizeof *n);
    n->k = k, n->line = line;
    return n;
}

/* An array of n pointers in the arena, room for one more: it doubles when
 * n reaches a power of two, so a long list costs twice its size, not its
 * square (the arena frees nothing before the end). */
static void *grow(Parser *P, void *v, int n)
{
    if (n & (n - 1)) return v; /* room left */
    void *w = arena_alloc(&P->a, sizeof(void *) * (size_t)(n ? 2 * n : 1));
    if (n) memcpy(w, v, sizeof(void *) * (size_t)n);
    return w;
}
static void add_kid(Parser *P, Node *n, Node *kid)
{
    n->v = grow(P, n->v, n->nv);
    n->v[n->nv++] = kid;
}
static void add_name(Parser *P, const char ***list, int *n, const char *name)
{
    *list = grow(P, (void *)*list, *n);
    (*list)[(*n)++] = name;
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

/* (args, name=value ...) after the '(' is consumed, into n's v and kw */
static void parse_args(Parser *P, Node *n)
{
    while (!is_op(P, ")")) {
        if (n->nv) expect_op(P, ",");
        if (is_op(P, ")")) break; /* a trailing comma */
        if (cur(P)->k == K_NAME && P->t[P->at + 1].k == K_OP && !strcmp(P->t[P->at + 1].p, "=")) {
            const char *kw = next(P)->p;
            for (int i = 0; i < n->nkw; i++)
                if (!strcmp(n->kw[i], kw)) perr(P, cur(P)->line, "keyword argument repeated: %s", kw);
            add_name(P, &n->kw, &n->nkw, kw);
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
            n->val = arena_alloc(&P->a, sizeof(Val));
            n->val->t = c % 3 == 2 ? V_NONE : V_BOOL;
            n->val->b = c % 3 == 0;
            return n;
        }
        n = node(P, E_NAME, t->line);
        n->name = t->p;
        if (!strcmp(t->p, "varargs")) P->names |= USES_VARARGS;
        if (!strcmp(t->p, "kwargs")) P->names |= USES_KWARGS;
        return n;
    }
    if (t->k == K_STR) { /* adjacent literals join */
        n = node(P, E_CONST, t->line);
        n->val = arena_alloc(&P->a, sizeof(Val));
        n->val->t = V_STR;
        size_t len = 0;
        for (int i = P->at; P->t[i].k == K_STR; i++) len += P->t[i].n;
        char *s = arena_alloc(&P->a, len + 1);
        size_t k = 0;
        while (cur(P)->k == K_STR) memcpy(s + k, cur(P)->p, cur(P)->n), k += cur(P)->n, next(P);
        n->val->s.p = s, n->val->s.n = k;
        return n;
    }
    if (t->k == K_INT || t->k == K_FLOAT) {
        next(P);
        n = node(P, E_CONST, t->line);
        n->val = arena_alloc(&P->a, sizeof(Val));
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

/* a call by name, checked when the parse ends (macros may come later) */
typedef struct Call {
    const char *name;
    int line, soft; /* soft: in a soft frame, where it fails only when called (undefined) */
} Call;

static void note_call(Parser *P, const char *name, int line)
{
    P->calls = grow(P, P->calls, P->n_calls);
    Call *c = arena_alloc(&P->a, sizeof *c);
    c->name = name, c->line = line, c->soft = P->soft;
    P->calls[P->n_calls++] = c;
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
                a->b->val = arena_alloc(&P->a, sizeof(Val));
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
            else if (n->k != E_ATTR) perr(P, line, "only names and methods can be called");
            n = a;
        } else {
            P->depth = depth;
            return n;
        }
    }
}

/* A filter or test the engine lacks: refused when evaluated inside a soft
 * frame, at parse time elsewhere (settle), as jinja2 does */
static void unknown(Parser *P, Node *n)
{
    n->flags |= UNKNOWN;
    if (P->soft) return;
    if (P->n_pending == P->cap_pending) {
        int cap = P->cap_pending ? 2 * P->cap_pending : 8;
        Node **v = arena_alloc(&P->a, sizeof(Node *) * (size_t)cap);
        if (P->n_pending) memcpy(v, P->pending, sizeof(Node *) * (size_t)P->n_pending);
        P->pending = v, P->cap_pending = cap;
    }
    P->pending[P->n_pending++] = n;
}

static void settle(Parser *P)
{
    if (!P->n_pending) return;
    const Node *n = P->pending[0];
    perr(P, n->line, "the %s '%s' is not supported", n->k == E_FILTER ? "filter" : "test", n->name);
}

static Node *parse_filter(Parser *P, Node *n)
{
    int line = cur(P)->line;
    next(P); /* | */
    Node *f = node(P, E_FILTER, line);
    f->a = n, f->name = expect_name(P);
    if (!find_filter(f->name)) unknown(P, f);
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
    if (!find_test(t->name)) unknown(P, t);
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
    int pending = P->n_pending, calls = P->n_calls;
    Node *n = parse_or(P);
    while (is_name(P, "if")) { /* a if cond else b: a soft frame, as an if statement's */
        next(P);
        P->n_pending = pending; /* the value part is in it too */
        for (int i = calls; i < P->n_calls; i++) P->calls[i]->soft = 1;
        int soft = P->soft;
        P->soft = 1;
        Node *c = node(P, E_COND, line);
        c->a = n, c->b = parse_or(P);
        if (is_name(P, "else")) {
            next(P);
            c->c = parse_expr(P);
        }
        P->soft = soft;
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
    int soft = P->soft;
    if (!strcmp(name, "if")) {
        P->soft = 1;
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
        P->soft = soft;
        return n;
    }
    if (!strcmp(name, "for")) {
        n = node(P, N_FOR, line);
        do {
            if (n->nkw) next(P);
            const char *target = expect_name(P);
            if (!strcmp(target, "loop")) perr(P, line, "can't assign to the special loop variable in a for loop's target");
            add_name(P, &n->kw, &n->nkw, target);
        } while (is_op(P, ","));
        if (!is_name(P, "in")) perr(P, cur(P)->line, "expected 'in' in a for loop");
        next(P);
        n->a = parse_or(P); /* the iterable: no conditional expression, its 'if' filters */
        settle(P);
        P->soft = 0; /* the loop's own frame */
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
        P->soft = soft;
        return n;
    }
    if (!strcmp(name, "set")) {
        const char *target = expect_name(P);
        if (P->loops && !strcmp(target, "loop")) perr(P, line, "can't assign to the special loop variable inside a for loop");
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
            P->soft = 0;
            n->b = parse_body(P, end);
            P->soft = soft;
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
        P->soft = 0; /* the macro's own frame */
        if (is_macro || is_op(P, "(")) { /* parameters, with defaults */
            expect_op(P, "(");
            while (!is_op(P, ")")) {
                if (n->nkw) expect_op(P, ",");
                const char *param = expect_name(P);
                for (int i = 0; i < n->nkw; i++)
                    if (!strcmp(n->kw[i], param)) perr(P, line, "duplicate argument '%s' in a macro's definition", param);
                add_name(P, &n->kw, &n->nkw, param);
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
            P->soft = soft; /* the call itself is in the enclosing frame */
            n->a = parse_expr(P);
            P->soft = 0;
            if (n->a->k != E_CALL) perr(P, line, "call needs a macro call");
        }
        expect_kind(P, K_BEND);
        const char *const end[] = {is_macro ? "endmacro" : "endcall", NULL};
        int names = P->names;
        P->names = 0;
        n->b = parse_body(P, end);
        n->flags = P->names;
        P->names |= names; /* a nested macro's names count for the one around it too, as in jinja2 */
        P->soft = soft;
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
        settle(P);
    }
    P->depth--;
    return body;
}

JinjaTemplate *jinja_parse(const char *name, const char *src, size_t len, char **err)
{
    Parser *P = xcalloc(1, sizeof *P); /* on the heap: longjmp leaves it intact */
    jmp_buf jb;
    P->a.fail = &jb;
    P->name = name;
    *err = NULL;
    if (setjmp(jb)) {
        *err = at_line(P->a.err, name, P->n ? P->t[P->at < P->n ? P->at : P->n - 1].line : 1);
        arena_free(&P->a);
        free(P);
        return NULL;
    }
    lex(P, src, len);
    Node *root = parse_body(P, NULL);
    for (int i = 0; i < P->n_calls; i++) {
        const Call *c = P->calls[i];
        int known = in_list(globals, c->name) >= 0 || !strcmp(c->name, "caller");
        for (int m = 0; m < P->n_macros && !known; m++) known = !strcmp(P->macros[m], c->name);
        if (!known && !c->soft) perr(P, c->line, "the function '%s' is not supported", c->name);
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
