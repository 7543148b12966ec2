/* runtime/safetensors.c: weights and gradients in and out as safetensors, the format
 * PyTorch, JAX and Hugging Face read (torch: safetensors.torch.load_file).
 *
 *   u64 little-endian N, then N bytes of JSON:
 *     {"__metadata__": {"format": "pt", "step": "12"},
 *      "h.0.w": {"dtype": "F32", "shape": [64, 64], "data_offsets": [0, 16384]}, ...}
 *   padded with spaces so the data starts 8-aligned, then the tensors' bytes,
 *   little-endian, back to back in header order.
 *
 * Names are the model's param names ("h.3.attn.w"); gradients are saved under their
 * param's name. Writing is atomic (a temporary file in the same directory, flushed,
 * fsync'ed, renamed over the target), so a crash or a full disk never leaves half a
 * file. Reading checks the whole header (sizes, JSON, every dtype, shape and offset, the
 * offsets tiling the data exactly, every name against the model, both ways) before it
 * writes a single byte into the arena: a damaged or foreign file is an error, never a
 * crash, and never half-loaded weights. The data is mapped and every float of it (F32,
 * F16, BF16) checked for NaN and Inf before any is copied: damaged weights are named at
 * load, by tensor and element, not blamed on the learning rate a step later.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "runtime.h"

enum { MAX_HEADER = 100 << 20 };  // as the safetensors library

static const char *const ST_DTYPES[PLAN_DT_COUNT] = {"F32", "F16", "BF16", "I32"};

static int little_endian(void)
{
    const uint16_t one = 1;
    return *(const uint8_t *)&one == 1;
}

static int64_t numel(const StEntry *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++) n *= t->shape[d];
    return n;
}

static int64_t nbytes(const StEntry *t) { return numel(t) * plan_dtype_size(t->dtype); }

const char *rt_st_shape_str(PlanDType dt, int rank, const int64_t *shape, char *buf, size_t n)
{
    size_t at = (size_t)snprintf(buf, n, "%s%s[", dt < PLAN_DT_COUNT ? ST_DTYPES[dt] : "", dt < PLAN_DT_COUNT ? " " : "");
    for (int d = 0; d < rank && at < n; d++)
        at += (size_t)snprintf(buf + at, n - at, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (at < n) snprintf(buf + at, n - at, "]");
    return buf;
}

/* ---- writing ------------------------------------------------------------------------ */

/* The header: __metadata__ (format "pt", then the pairs of meta: key, value, ...), and
 * every tensor's dtype, shape and data offsets, back to back in order. */
static json_t *header_json(const StEntry *t, int32_t n, const char *const *meta, int n_meta)
{
    json_t *h = json_object(), *m = json_object();
    int bad = !h || !m || json_object_set_new(m, "format", json_string("pt"));
    for (int i = 0; i + 1 < 2 * n_meta && !bad; i += 2) bad = json_object_set_new(m, meta[i], json_string(meta[i + 1]));
    bad = bad || json_object_set_new(h, "__metadata__", m);
    if (!h || !m) json_decref(m);
    int64_t at = 0;
    for (int32_t i = 0; i < n && !bad; i++) {
        json_t *e = json_object(), *shape = json_array(), *off = json_array();
        for (int d = 0; d < t[i].rank && shape; d++) bad |= json_array_append_new(shape, json_integer(t[i].shape[d]));
        if (off)
            bad |= json_array_append_new(off, json_integer(at)) ||
                   json_array_append_new(off, json_integer(at + nbytes(&t[i])));
        at += nbytes(&t[i]);
        if (!e || !shape || !off) {
            json_decref(e), json_decref(shape), json_decref(off);
            bad = 1;
            break;
        }
        bad |= json_object_set_new(e, "dtype", json_string(ST_DTYPES[t[i].dtype])) ||
               json_object_set_new(e, "shape", shape) || json_object_set_new(e, "data_offsets", off) ||
               json_object_set_new(h, t[i].name, e);
    }
    if (bad) {
        json_decref(h);
        return NULL;
    }
    return h;
}

int rt_st_header(const StEntry *t, int32_t n, const char *const *meta, int n_meta, uint8_t **out, size_t *len)
{
    *out = NULL, *len = 0;
    if (!little_endian()) return -1;
    json_t *h = header_json(t, n, meta, n_meta);
    char *text = h ? json_dumps(h, JSON_COMPACT) : NULL;
    json_decref(h);
    size_t tl = text ? strlen(text) : 0, padded = (tl + 7) / 8 * 8;
    /* Its padded length (u64 LE), then the JSON padded with spaces. */
    uint8_t *head = text ? plan_alloc(8 + padded) : NULL;
    if (!head) {
        free(text);
        return -1;
    }
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(head + 8, text, tl);
    memset(head + 8 + tl, ' ', padded - tl);
    free(text);
    *out = head, *len = 8 + padded;
    return 0;
}

int rt_st_write_meta(const char *path, const StEntry *t, int32_t n, const char *const *meta, int n_meta, char *err,
                     size_t errlen)
{
    if (!little_endian()) return plan_fail(err, errlen, "%s: safetensors output needs a little-endian host", path);
    uint8_t *head;
    size_t hlen;
    PlanChunk *chunks = NULL;
    if (rt_st_header(t, n, meta, n_meta, &head, &hlen) || !(chunks = plan_alloc(sizeof *chunks * ((size_t)n + 1)))) {
        plan_dealloc(head);
        return plan_fail(err, errlen, "%s: out of memory building the header (or a name that is not UTF-8)", path);
    }
    chunks[0] = (PlanChunk){head, hlen};
    for (int32_t i = 0; i < n; i++) chunks[i + 1] = (PlanChunk){t[i].data, (size_t)nbytes(&t[i])};
    char why[256];
    int rc = plan_write_atomic(path, chunks, n + 1, why, sizeof why);
    plan_dealloc(chunks);
    plan_dealloc(head);
    return rc ? plan_fail(err, errlen, "%s: %s", path, why) : 0;
}

int rt_st_write(const char *path, const StEntry *t, int32_t n, int64_t step, char *err, size_t errlen)
{
    char s[32];
    snprintf(s, sizeof s, "%" PRId64, step);
    const char *meta[] = {"step", s};
    return rt_st_write_meta(path, t, n, meta, 1, err, errlen);
}

/* ---- reading ------------------------------------------------------------------------ */

static int by_begin(const void *a, const void *b)
{
    const StTensor *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int parse_entry(const char *key, json_t *v, uint64_t data_len, StTensor *fe, char *err, size_t errlen)
{
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(shape) || !json_is_array(off) ||
        json_array_size(off) != 2)
        return plan_fail(err, errlen, "tensor '%s': needs \"dtype\", \"shape\" and \"data_offsets\" [begin, end]", key);
    fe->name = key;
    fe->dtype = PLAN_DT_COUNT;
    for (int d = 0; d < PLAN_DT_COUNT; d++)
        if (!strcmp(json_string_value(dt), ST_DTYPES[d])) fe->dtype = (PlanDType)d;
    if (fe->dtype == PLAN_DT_COUNT)
        return plan_fail(err, errlen, "tensor '%s': dtype %s; this fsexec reads F32, F16, BF16 and I32", key,
                    json_string_value(dt));
    if (json_array_size(shape) > PLAN_MAX_RANK)
        return plan_fail(err, errlen, "tensor '%s': rank %zu; at most %d", key, json_array_size(shape), PLAN_MAX_RANK);
    fe->rank = (int)json_array_size(shape);
    uint64_t bytes = (uint64_t)plan_dtype_size(fe->dtype);
    for (int d = 0; d < fe->rank; d++) {
        json_t *x = json_array_get(shape, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return plan_fail(err, errlen, "tensor '%s': shape must hold non-negative integers", key);
        fe->shape[d] = json_integer_value(x);
        if (fe->shape[d] && bytes > data_len / (uint64_t)fe->shape[d])
            return plan_fail(err, errlen, "tensor '%s': shape larger than the file", key);
        bytes *= (uint64_t)fe->shape[d];
    }
    json_t *b = json_array_get(off, 0), *e = json_array_get(off, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < json_integer_value(b))
        return plan_fail(err, errlen, "tensor '%s': data_offsets must be integers 0 <= begin <= end", key);
    fe->begin = (uint64_t)json_integer_value(b), fe->end = (uint64_t)json_integer_value(e);
    if (fe->end > data_len)
        return plan_fail(err, errlen, "tensor '%s': data_offsets end %" PRIu64 " past the %" PRIu64 " bytes of data "
                    "(truncated?)", key, fe->end, data_len);
    if (fe->end - fe->begin != bytes)
        return plan_fail(err, errlen, "tensor '%s': %" PRIu64 " bytes of data for a shape that needs %" PRIu64, key,
                    fe->end - fe->begin, bytes);
    return 0;
}

/* The header's tensors; they must tile [0, data_len) exactly, as the library demands. */
static int parse_header(json_t *h, uint64_t data_len, StTensor *fe, size_t *n, char *err, size_t errlen)
{
    const char *key;
    json_t *v;
    *n = 0;
    if (!json_is_object(h)) return plan_fail(err, errlen, "the header is not a JSON object");
    json_object_foreach(h, key, v)
    {
        if (!strcmp(key, "__metadata__")) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) return plan_fail(err, errlen, "__metadata__ is not an object");
            json_object_foreach(v, mk, mv) if (!json_is_string(mv))
                return plan_fail(err, errlen, "__metadata__ '%s' is not a string", mk);
            continue;
        }
        if (parse_entry(key, v, data_len, &fe[*n], err, errlen)) return -1;
        ++*n;
    }
    qsort(fe, *n, sizeof *fe, by_begin);
    uint64_t at = 0;
    for (size_t i = 0; i < *n; i++) {
        if (fe[i].begin != at)
            return plan_fail(err, errlen, "tensor '%s': data at %" PRIu64 ", expected %" PRIu64 " (overlapping or gaps)",
                        fe[i].name, fe[i].begin, at);
        at = fe[i].end;
    }
    if (at != data_len)
        return plan_fail(err, errlen, "the tensors cover %" PRIu64 " of the %" PRIu64 " bytes of data", at, data_len);
    return 0;
}

static int named(const char *name, const char *const *names, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        if (!strcmp(names[i], name)) return 1;
    return 0;
}

/* Every wanted tensor in the file with its dtype and shape, and nothing else but the
 * tensors named in `also`. */
static int match(const StEntry *t, int32_t n, const char *const *also, int32_t n_also, const StTensor *fe, size_t nf,
                 size_t *where, char *err, size_t errlen)
{
    char a[128], b[128];
    for (int32_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < nf && strcmp(fe[j].name, t[i].name)) j++;
        if (j == nf) return plan_fail(err, errlen, "no tensor '%s', which the model has", t[i].name);
        int same = fe[j].dtype == t[i].dtype && fe[j].rank == t[i].rank;
        for (int d = 0; same && d < t[i].rank; d++) same = fe[j].shape[d] == t[i].shape[d];
        if (!same)
            return plan_fail(err, errlen, "tensor '%s' is %s in the file but %s in the model", t[i].name,
                        rt_st_shape_str(fe[j].dtype, fe[j].rank, fe[j].shape, a, sizeof a),
                        rt_st_shape_str(t[i].dtype, t[i].rank, t[i].shape, b, sizeof b));
        where[i] = j;
    }
    if (nf > (size_t)n) {
        for (size_t j = 0; j < nf; j++) {
            int32_t i = 0;
            while (i < n && strcmp(fe[j].name, t[i].name)) i++;
            if (i == n && !named(fe[j].name, also, n_also))
                return plan_fail(err, errlen, "tensor '%s' is not in the model", fe[j].name);
        }
    }
    return 0;
}

/* The first element of n that is NaN or Inf (its exponent all ones), or -1. Blocks are
 * tested branch-free, so the common case (none) runs at memory speed. */
int64_t rt_st_first_nonfinite(const uint8_t *p, int64_t n, PlanDType dt)
{
    enum { BLOCK = 4096 };
    int wide = dt == PLAN_DT_F32;
    uint32_t inf = dt == PLAN_DT_F32 ? 0x7f800000u : dt == PLAN_DT_F16 ? 0x7c00u : 0x7f80u;
    for (int64_t at = 0; at < n; at += BLOCK) {
        int64_t m = n - at < BLOCK ? n - at : BLOCK;
        int bad = 0;
        if (wide) {
            for (int64_t i = 0; i < m; i++) {
                uint32_t u;
                memcpy(&u, p + 4 * (at + i), 4);
                bad |= (u & 0x7fffffffu) >= inf;
            }
        } else {
            for (int64_t i = 0; i < m; i++) {
                uint16_t h;
                memcpy(&h, p + 2 * (at + i), 2);
                bad |= (uint32_t)(h & 0x7fffu) >= inf;
            }
        }
        if (!bad) continue;
        for (int64_t i = at; i < at + m; i++) {
            uint32_t u = 0;
            memcpy(&u, p + (wide ? 4 : 2) * i, wide ? 4 : 2);
            if ((u & (wide ? 0x7fffffffu : 0x7fffu)) >= inf) return i;
        }
    }
    return -1;
}

/* 0 when tensor fe (its bytes at p) holds only finite floats; else -1 naming the first
 * element that is not, by flat index and by position. */
static int check_finite(const StTensor *fe, const uint8_t *p, char *err, size_t errlen)
{
    if (fe->dtype == PLAN_DT_I32) return 0;
    int64_t n = 1;
    for (int d = 0; d < fe->rank; d++) n *= fe->shape[d];
    int64_t i = rt_st_first_nonfinite(p, n, fe->dtype);
    if (i < 0) return 0;
    uint32_t u = 0;
    int wide = fe->dtype == PLAN_DT_F32;
    memcpy(&u, p + (wide ? 4 : 2) * i, wide ? 4 : 2);
    uint32_t mant = u & (fe->dtype == PLAN_DT_F32 ? 0x7fffffu : fe->dtype == PLAN_DT_F16 ? 0x3ffu : 0x7fu);
    int neg = (u >> (wide ? 31 : 15)) & 1;
    char where[160] = "";
    if (fe->rank == 2) {
        snprintf(where, sizeof where, " (row %" PRId64 ", column %" PRId64 ")", i / fe->shape[1], i % fe->shape[1]);
    } else if (fe->rank > 2) {
        int64_t idx[PLAN_MAX_RANK], rest = i;
        for (int d = fe->rank - 1; d >= 0; d--) idx[d] = rest % fe->shape[d], rest /= fe->shape[d];
        size_t at = (size_t)snprintf(where, sizeof where, " (at [");
        for (int d = 0; d < fe->rank && at < sizeof where; d++)
            at += (size_t)snprintf(where + at, sizeof where - at, "%s%" PRId64, d ? ", " : "", idx[d]);
        if (at < sizeof where) snprintf(where + at, sizeof where - at, "])");
    }
    return plan_fail(err, errlen, "tensor '%s' has %s at index %" PRId64 "%s; the weights are damaged (a file from "
                   "a run that diverged, or a corrupted one)", fe->name, mant ? "NaN" : neg ? "-Inf" : "+Inf", i,
                   where);
}

static int read_at(int fd, void *buf, uint64_t len, uint64_t off)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t got = pread(fd, p, len > (1u << 30) ? (1u << 30) : (size_t)len, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        p += got, len -= (uint64_t)got, off += (uint64_t)got;
    }
    return 0;
}

/* Every wanted tensor's bytes (from file offset begin) into t[i].data, once every
 * float of every one is finite: the file is mapped, checked, then copied, so its data
 * comes from disk once and nothing is written when a check fails. */
static int read_data(int fd, uint64_t size, const StEntry *t, int32_t n, const StTensor *fe,
                     const size_t *where, char *err, size_t errlen)
{
    uint8_t *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) return plan_fail(err, errlen, "cannot map the file: %s", strerror(errno));
    int rc = 0;
    for (int32_t i = 0; i < n && !rc; i++)
        rc = check_finite(&fe[where[i]], map + fe[where[i]].begin, err, errlen);
    for (int32_t i = 0; i < n && !rc; i++)
        memcpy(t[i].data, map + fe[where[i]].begin, (size_t)(fe[where[i]].end - fe[where[i]].begin));
    munmap(map, (size_t)size);
    return rc;
}

struct StFile {
    int fd;
    uint64_t size, base;  // the file's bytes; where its data starts (8 + the header)
    uint32_t header_crc;  // CRC-32 of the first `base` bytes
    json_t *h;            // the header (its keys are the tensors' names)
    StTensor *t;          // by data offset
    size_t n;
};

/* What torch.save writes (.pt, .bin, HF's pytorch_model.bin): a zip (its local header
 * "PK\3\4"; torch >= 1.6) or a bare pickle (protocol 2 to 5: 0x80 and the protocol).
 * Asked only of a file whose first 8 bytes cannot be a safetensors header length. */
static int torch_file(const uint8_t b[8])
{
    return (b[0] == 'P' && b[1] == 'K' && b[2] == 3 && b[3] == 4) || (b[0] == 0x80 && b[1] >= 2 && b[1] <= 5);
}

static const char TORCH_FILE[] =
    "a PyTorch pickle/zip checkpoint (torch.save: .pt, .bin), not safetensors: convert it to safetensors, e.g. "
    "python3 -c \"import torch, safetensors.torch as st; st.save_file(torch.load('pytorch_model.bin'), "
    "'model.safetensors')\" (a Hugging Face model: save_pretrained(dir, safe_serialization=True))";

/* The header of the open file fd (size bytes), checked whole. */
static int open_file(int fd, uint64_t size, StFile *f, char *err, size_t errlen)
{
    uint8_t n8[8];
    if (size < 8 || read_at(fd, n8, 8, 0)) return plan_fail(err, errlen, "too short for a safetensors file");
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)n8[i] << (8 * i);
    /* The length is the file's bytes: said by what it should be, never quoted. */
    if (hlen > size - 8 && torch_file(n8)) return plan_fail(err, errlen, "%s", TORCH_FILE);
    if (hlen > size - 8)
        return plan_fail(err, errlen, "bytes 0-7 should hold the header's length, at most the %" PRIu64 " bytes after "
                         "them; they hold more (truncated, or not a safetensors file)", size - 8);
    if (hlen > MAX_HEADER) return plan_fail(err, errlen, "bytes 0-7 give a header longer than %d bytes", MAX_HEADER);
    char *text = plan_alloc((size_t)hlen + 1);
    if (!text) return plan_fail(err, errlen, "out of memory");
    if (read_at(fd, text, hlen, 8)) {
        plan_dealloc(text);
        return plan_fail(err, errlen, "cannot read the header: %s", strerror(errno));
    }
    f->header_crc = plan_crc32(plan_crc32(0, n8, 8), text, (size_t)hlen);
    json_error_t je;
    f->h = json_loadb(text, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    plan_dealloc(text);
    char why[JSON_ERROR_TEXT_LENGTH];
    if (!f->h) return plan_fail(err, errlen, "header is not valid JSON: %s (at byte %d)",
                                plan_json_why(je.text, why, sizeof why), 8 + je.position);
    size_t nkeys = json_is_object(f->h) ? json_object_size(f->h) : 0;
    if (!(f->t = plan_alloc(sizeof *f->t * (nkeys + 1)))) return plan_fail(err, errlen, "out of memory");
    f->fd = fd, f->size = size, f->base = 8 + hlen;
    if (parse_header(f->h, size - f->base, f->t, &f->n, err, errlen)) return -1;
    for (size_t i = 0; i < f->n; i++) f->t[i].begin += f->base, f->t[i].end += f->base;
    return 0;
}

StFile *rt_st_open(const char *path, char *err, size_t errlen)
{
    int64_t size;
    int fd = plan_open_input(path, &size, err, errlen);
    return fd < 0 ? NULL : rt_st_open_fd(fd, size, err, errlen);
}

StFile *rt_st_open_fd(int fd, int64_t size, char *err, size_t errlen)
{
    if (!little_endian()) {
        close(fd);
        plan_fail(err, errlen, "safetensors input needs a little-endian host");
        return NULL;
    }
    StFile *f = plan_alloc(sizeof *f);
    if (!f) {
        close(fd);
        plan_fail(err, errlen, "out of memory");
        return NULL;
    }
    memset(f, 0, sizeof *f);
    f->fd = fd;
    if (open_file(fd, (uint64_t)size, f, err, errlen)) {
        rt_st_close(f);
        return NULL;
    }
    return f;
}

void rt_st_close(StFile *f)
{
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    json_decref(f->h);
    plan_dealloc(f->t);
    plan_dealloc(f);
}

size_t rt_st_count(const StFile *f) { return f->n; }
const StTensor *rt_st_tensor(const StFile *f, size_t i) { return &f->t[i]; }
uint64_t rt_st_size(const StFile *f) { return f->size; }
uint32_t rt_st_header_crc(const StFile *f) { return f->header_crc; }

const char *rt_st_meta(const StFile *f, const char *key)
{
    return json_string_value(json_object_get(json_object_get(f->h, "__metadata__"), key));
}

const uint8_t *rt_st_map(const StFile *f, char *err, size_t errlen)
{
    void *map = mmap(NULL, (size_t)f->size, PROT_READ, MAP_PRIVATE, f->fd, 0);
    if (map != MAP_FAILED) return map;
    plan_fail(err, errlen, "cannot map the file: %s", strerror(errno));
    return NULL;
}

void rt_st_unmap(const StFile *f, const uint8_t *map)
{
    if (map) munmap((void *)map, (size_t)f->size);
}

int rt_st_check_finite(const StTensor *t, const uint8_t *data, char *err, size_t errlen)
{
    return check_finite(t, data, err, errlen);
}

int rt_st_pread(const StFile *f, void *buf, uint64_t len, uint64_t at)
{
    if (at > f->size || len > f->size - at) return -1;
    return read_at(f->fd, buf, len, at);
}

static int read_file(StFile *f, const StEntry *t, int32_t n, const char *const *also, int32_t n_also, char *err,
                     size_t errlen)
{
    size_t *where = plan_alloc(sizeof *where * ((size_t)n + 1));
    int rc = !where ? plan_fail(err, errlen, "out of memory") : match(t, n, also, n_also, f->t, f->n, where, err, errlen);
    if (!rc) rc = read_data(f->fd, f->size, t, n, f->t, where, err, errlen);
    plan_dealloc(where);
    return rc;
}

int rt_st_read_part(const char *path, const StEntry *t, int32_t n, const char *const *also, int32_t n_also,
                    char *err, size_t errlen)
{
    char why[512];
    StFile *f = rt_st_open(path, why, sizeof why);
    int rc = f ? read_file(f, t, n, also, n_also, why, sizeof why) : -1;
    rt_st_close(f);
    if (rc) plan_fail(err, errlen, "%s: %s", path, why);
    return rc;
}

int rt_st_read(const char *path, const StEntry *t, int32_t n, char *err, size_t errlen)
{
    return rt_st_read_part(path, t, n, NULL, 0, err, errlen);
}
