/* ir/arena.c: bump allocation in chained blocks; everything is freed by arena_free.
 * The compiler never frees piecemeal, so it never tracks ownership. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

enum { ARENA_BLOCK = 64 * 1024 };

typedef struct Chunk {
    struct Chunk *next;
    size_t used, size;
    max_align_t data[];
} Chunk;

struct Arena {
    Chunk *head;
};

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "fsc: out of memory (asked for %zu bytes)\n", n);
        exit(1);
    }
    return p;
}

Arena *arena_new(void)
{
    Arena *a = xmalloc(sizeof *a);
    a->head = NULL;
    return a;
}

void arena_free(Arena *a)
{
    if (!a) return;
    for (Chunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(a);
}

void *arena_alloc(Arena *a, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    Chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > ARENA_BLOCK ? n : ARENA_BLOCK;
        c = xmalloc(sizeof *c + size);
        c->size = size;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    return memset(p, 0, n);
}

char *arena_strndup(Arena *a, const char *s, size_t n)
{
    char *p = arena_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

char *arena_strdup(Arena *a, const char *s) { return arena_strndup(a, s, strlen(s)); }

char *arena_printf(Arena *a, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *p = arena_alloc(a, (size_t)n + 1);
    vsnprintf(p, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return p;
}

void *arena_grow(Arena *a, void *p, int *cap, int need, size_t size)
{
    if (need <= *cap) return p;
    int ncap = *cap ? *cap : 16;
    while (ncap < need) ncap *= 2;
    void *q = arena_alloc(a, (size_t)ncap * size);
    if (p) memcpy(q, p, (size_t)*cap * size);
    *cap = ncap;
    return q;
}
