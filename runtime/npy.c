/* runtime/npy.c: a NumPy .npy file as an array of f32 or i32, for --data NAME=FILE.npy.
 *
 * The format (numpy.lib.format): "\x93NUMPY", major and minor version bytes, the header's
 * length (u16 little-endian in version 1.0, u32 in 2.0 and 3.0), the header: a Python
 * dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (100, 16), } padded with
 * spaces and ended by a newline, then the data in C order. Read: little-endian (or
 * byte-order '|') float32/float64 as f32 and int32/int64 as i32; float64 values outside
 * f32's range and int64 values outside int32's are errors naming the element, as are a
 * Fortran-order array, any other dtype, a header that does not parse and data that is
 * not the size the header gives. Every message says what the file holds and what to do.
 */
#include <ctype.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "runtime.h"

enum { NPY_MAX_HEADER = 1 << 16 };

typedef struct {
    char descr[16];
    int fortran, has_descr, has_order, has_shape;
    int rank;
    int64_t shape[PLAN_MAX_RANK];
} Header;

static const char *skip(const char *s, const char *e)
{
    while (s < e && isspace((unsigned char)*s)) s++;
    return s;
}

/* A quoted string into out; the position after it, or NULL. */
static const char *quoted(const char *s, const char *e, char *out, size_t n)
{
    if (s >= e || (*s != '\'' && *s != '"')) return NULL;
    char q = *s++;
    size_t k = 0;
    while (s < e && *s != q) {
        if (k + 1 < n) out[k++] = *s;
        s++;
    }
    out[k] = 0;
    return s < e ? s + 1 : NULL;
}

/* A tuple of non-negative ints: "()", "(5,)", "(100, 16)". */
static const char *tuple(const char *s, const char *e, Header *h)
{
    if (s >= e || *s != '(') return NULL;
    s = skip(s + 1, e);
    h->rank = 0;
    while (s < e && *s != ')') {
        if (!isdigit((unsigned char)*s) || h->rank == PLAN_MAX_RANK) return NULL;
        int64_t v = 0;
        while (s < e && isdigit((unsigned char)*s)) {
            if (v > (INT64_MAX - 9) / 10) return NULL;
            v = v * 10 + (*s++ - '0');
        }
        while (s < e && *s == 'L') s++;  // Python 2's longs
        h->shape[h->rank++] = v;
        s = skip(s, e);
        if (s < e && *s == ',') s = skip(s + 1, e);
    }
    return s < e ? s + 1 : NULL;
}

/* The header dict's three keys; 0, or -1 when it does not parse. */
static int parse_dict(const char *s, const char *e, Header *h)
{
    s = skip(s, e);
    if (s >= e || *s++ != '{') return -1;
    for (;;) {
        s = skip(s, e);
        if (s < e && *s == '}') return h->has_descr && h->has_order && h->has_shape ? 0 : -1;
        char key[32];
        if (!(s = quoted(s, e, key, sizeof key))) return -1;
        s = skip(s, e);
        if (s >= e || *s++ != ':') return -1;
        s = skip(s, e);
        if (!strcmp(key, "descr")) {
            s = quoted(s, e, h->descr, sizeof h->descr), h->has_descr = 1;
        } else if (!strcmp(key, "fortran_order")) {
            int t = e - s >= 4 && !memcmp(s, "True", 4), f = e - s >= 5 && !memcmp(s, "False", 5);
            if (!t && !f) return -1;
            h->fortran = t, h->has_order = 1, s += t ? 4 : 5;
        } else if (!strcmp(key, "shape")) {
            s = tuple(s, e, h), h->has_shape = 1;
        } else {
            return -1;
        }
        if (!s) return -1;
        s = skip(s, e);
        if (s < e && *s == ',') s++;
    }
}

/* The element type: 'f' or 'i' and its size, from "<f4", "|i8"; 0 for any other. */
static int elem_of(const char *descr, char *kind)
{
    if ((descr[0] != '<' && descr[0] != '|') || (descr[1] != 'f' && descr[1] != 'i')) return 0;
    if (strcmp(descr + 2, "4") && strcmp(descr + 2, "8")) return 0;
    *kind = descr[1];
    return descr[2] - '0';
}

const char *rt_npy_shape_str(int rank, const int64_t *shape, char *buf, size_t n)
{
    size_t at = (size_t)snprintf(buf, n, "(");
    for (int d = 0; d < rank && at < n; d++)
        at += (size_t)snprintf(buf + at, n - at, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (at < n) snprintf(buf + at, n - at, rank == 1 ? ",)" : ")");
    return buf;
}

/* Converts n elements of the file's kind and size into a's dtype; -1 at one out of range. */
static int convert(const uint8_t *src, char kind, int size, int64_t n, RtArray *a, char *err, size_t errlen)
{
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *b = src + i * size;
        uint64_t u = 0;
        for (int k = size - 1; k >= 0; k--) u = u << 8 | b[k];
        if (kind == 'f') {
            double v;
            float f;
            if (size == 4) memcpy(&f, &(uint32_t){(uint32_t)u}, 4), v = f;
            else memcpy(&v, &u, 8);
            if (isfinite(v) && fabs(v) > FLT_MAX)
                return plan_fail(err, errlen, "element %" PRId64 " is %g, outside float32's range", i, v);
            ((float *)a->data)[i] = (float)v;
        } else {
            int64_t v = size == 4 ? (int64_t)(int32_t)(uint32_t)u : (int64_t)u;
            if (v < INT32_MIN || v > INT32_MAX)
                return plan_fail(err, errlen, "element %" PRId64 " is %" PRId64 ", outside int32's range", i, v);
            ((int32_t *)a->data)[i] = (int32_t)v;
        }
    }
    return 0;
}

static int parse(const uint8_t *b, size_t len, RtArray *a, char *err, size_t errlen)
{
    if (len < 10 || memcmp(b, "\x93NUMPY", 6)) return plan_fail(err, errlen, "not a NumPy .npy file (no \\x93NUMPY magic)");
    int major = b[6];
    if (major < 1 || major > 3)
        return plan_fail(err, errlen, ".npy format version %d.%d; this fsexec reads 1.0, 2.0 and 3.0", major, b[7]);
    size_t at = major == 1 ? 10 : 12;
    if (len < at) return plan_fail(err, errlen, "a .npy file cut short in its preamble");
    size_t hl = major == 1 ? (size_t)(b[8] | b[9] << 8) : (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 |
                                                              (size_t)b[11] << 24;
    if (hl > len - at || hl > NPY_MAX_HEADER)
        return plan_fail(err, errlen, "a .npy header of %zu bytes, longer than the file (truncated?)", hl);
    Header h = {0};
    if (parse_dict((const char *)b + at, (const char *)b + at + hl, &h))
        return plan_fail(err, errlen, "a .npy header that does not parse (expected {'descr': ..., 'fortran_order': "
                         "..., 'shape': (...)})");
    char shape[128], kind = 0;
    rt_npy_shape_str(h.rank, h.shape, shape, sizeof shape);
    int size = elem_of(h.descr, &kind);
    if (!size)
        return plan_fail(err, errlen, "dtype '%s' (shape %s); fsexec reads little-endian float32/float64 ('<f4', "
                         "'<f8') and int32/int64 ('<i4', '<i8'): convert it with a.astype('<f4') or a.astype('<i4')",
                         h.descr, shape);
    if (h.fortran)
        return plan_fail(err, errlen, "a Fortran-order array (shape %s); save it in C order: "
                         "np.save(path, np.ascontiguousarray(a))", shape);
    int64_t numel = 1;
    for (int d = 0; d < h.rank; d++)
        numel = h.shape[d] && numel > INT64_MAX / h.shape[d] ? INT64_MAX : numel * h.shape[d];
    uint64_t want = (uint64_t)numel * (uint64_t)size, body = len - at - hl;
    if (numel > INT64_MAX / 8 || body != want)
        return plan_fail(err, errlen, "shape %s of '%s' needs %" PRIu64 " bytes of data; the file holds %" PRIu64
                         " (truncated or damaged)", shape, h.descr, want, body);
    a->dtype = kind == 'f' ? PLAN_DT_F32 : PLAN_DT_I32;
    a->rank = h.rank;
    memcpy(a->shape, h.shape, sizeof h.shape);
    a->numel = numel;
    a->data = plan_alloc((size_t)(numel ? numel : 1) * 4);
    if (!a->data) return plan_fail(err, errlen, "out of memory for %" PRId64 " elements", numel);
    snprintf(a->descr, sizeof a->descr, "%s", h.descr);
    return convert(b + at + hl, kind, size, numel, a, err, errlen);
}

int rt_npy_parse(const void *buf, size_t len, RtArray *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    if (!parse(buf, len, a, err, errlen)) return 0;
    rt_npy_free(a);
    return -1;
}

int rt_npy_read(const char *path, RtArray *a, char *err, size_t errlen)
{
    int64_t size;
    char why[512];
    memset(a, 0, sizeof *a);
    int fd = plan_open_input(path, &size, why, sizeof why);
    if (fd < 0) return plan_fail(err, errlen, "%s: %s", path, why);
    void *map = size ? mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED) return plan_fail(err, errlen, "%s: %s", path, size ? "cannot map the file" : "empty file");
    int rc = rt_npy_parse(map, (size_t)size, a, why, sizeof why);
    munmap(map, (size_t)size);
    return rc ? plan_fail(err, errlen, "%s: %s", path, why) : 0;
}

void rt_npy_free(RtArray *a)
{
    plan_dealloc(a->data);
    a->data = NULL;
}
