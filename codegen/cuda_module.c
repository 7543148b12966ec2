/* codegen/cuda_module.c: the CUDA module being built, and what every emitter shares.
 *
 * A CuModule is the module's text (the fixed prelude, then each distinct kernel once, in
 * first-use order) and the plan the instructions go to. A kernel is named PREFIX_HASH,
 * HASH the low 32 bits of a 64-bit hash (text_hash, FNV-1a-like) of its text as the
 * emitter wrote it (with the KNAME token), so the same op on the same shapes gets the
 * same name in every block and every compilation; equal texts under one prefix are one
 * kernel. Two different texts whose names would collide (a 1 in 2^32 chance) get the
 * next hash in a fixed sequence, so names stay unique and deterministic.
 *
 * Everything lives in the graph's arena; instructions go straight into the plan
 * (plan_cuda_add, in the order the emitters record them: sorted by op, since
 * codegen_cuda walks the nodes in order).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cuda.h"
#include "philox.h"
#include "powc.h"

typedef struct {
    uint64_t hash;       // text_hash(src)
    const char *prefix;
    const char *src;     // as the emitter wrote it, with KNAME
    const char *name;    // PREFIX_HHHHHHHH
} Kernel;

struct CuModule {
    Arena *arena;
    Plan *plan;
    CuText text;          // the module: prelude, then kernels
    Kernel *kernels;
    int n_kernels, cap_kernels;
    int *slots;           // open addressing by hash: kernel index + 1, 0 when empty
    int n_slots;          // a power of two, kept at least twice n_kernels
    uint64_t used;        // bit i: cu_sources[i] is in the text
};

/* ---- the module --------------------------------------------------------------------- */

static int source_index(const char *file)
{
    for (int i = 0; i < cu_n_sources; i++)
        if (!strcmp(cu_sources[i].name, file)) return i;
    return -1;
}

/* The local file a line `#include "FILE"` names, as an index into cu_sources; -1 when the
 * line is no such include. */
static int local_include(const char *line, const char *end)
{
    static const char INC[] = "#include \"";
    if ((size_t)(end - line) <= sizeof INC - 1 || strncmp(line, INC, sizeof INC - 1)) return -1;
    const char *name = line + sizeof INC - 1, *q = memchr(name, '"', (size_t)(end - name));
    if (!q) return -1;
    char buf[64];
    if ((size_t)(q - name) >= sizeof buf) return -1;
    memcpy(buf, name, (size_t)(q - name));
    buf[q - name] = 0;
    return source_index(buf);
}

/* Appends source i once, after the local files it includes; its `#include "..."` and
 * `#pragma once` lines are dropped, so the module stands alone. */
static void use_source(CuModule *m, int i)
{
    FS_ASSERT(i >= 0 && i < cu_n_sources && i < 64);
    if (m->used >> i & 1) return;
    m->used |= (uint64_t)1 << i;
    const char *s = cu_sources[i].text;
    for (const char *line = s, *end; *line; line = *end ? end + 1 : end) {
        end = strchr(line, '\n');
        if (!end) end = line + strlen(line);
        int inc = local_include(line, end);
        if (inc >= 0) use_source(m, inc);
    }
    cu_text_add(&m->text, "\n");
    for (const char *line = s, *end; *line; line = *end ? end + 1 : end) {
        end = strchr(line, '\n');
        if (!end) end = line + strlen(line);
        if (local_include(line, end) >= 0 || !strncmp(line, "#pragma once", 12)) continue;
        cu_text_add(&m->text, "%.*s\n", (int)(end - line), line);
    }
}

char *cu_kernel(CuCtx *c, int bounds, const char *params, const char *call)
{
    const char *lb = bounds > 0 ? cu_fmt(c, "__launch_bounds__(%d) ", bounds) : "";
    return cu_fmt(c, "extern \"C\" __global__ void %sKNAME(%s)\n{\n    %s;\n}\n", lb, params, call);
}

char *cu_pin(CuCtx *c, int i, const char *name) { return cu_fmt(c, "const %s *__restrict__ %s", cu_tin(c, i), name); }
char *cu_pout(CuCtx *c, int i, const char *name) { return cu_fmt(c, "%s *__restrict__ %s", cu_tout(c, i), name); }

void cu_use(CuCtx *c, const char *file)
{
    int i = source_index(file);
    FS_ASSERT(i >= 0);  // a template file every build embeds
    use_source(c->m, i);
}

CuModule *cu_module_new(Arena *a, Plan *p)
{
    CuModule *m = arena_alloc(a, sizeof *m);
    m->arena = a, m->plan = p;
    m->text.arena = a;
    cu_text_add(&m->text, "%s",
                "/* A CUDA module made by fsc (codegen/cuda.h): the prelude, the templates its kernels use\n"
                " * (codegen/kernels/), then every kernel of the plan once, named PREFIX_HASH. Compile with\n"
                " * NVRTC (-std=c++17, the CUDA include dir).\n"
                " */\n");
    use_source(m, source_index("prelude.cuh"));
    cu_text_add(&m->text, "%s", FS_PHILOX_CUDA);  // dropout's RNG (ops/philox.h)
    cu_text_add(&m->text, "%s", FS_POWC_CUDA);    // pow's fs_pow (ops/powc.h)
    return m;
}

const char *cu_module_text(const CuModule *m) { return m->text.s; }

/* The hash of a kernel's text: FNV-1a's shape over 8-byte little-endian words (every
 * launch's text is hashed, so a multiply per byte would show in fsc's time), with a shift
 * after each multiply so every byte reaches the low bits, and murmur3's finalizer. */
static uint64_t text_hash(const char *s)
{
    size_t n = strlen(s), i = 0;
    uint64_t h = 0xcbf29ce484222325u;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = 0;
        for (int b = 7; b >= 0; b--) w = w << 8 | (unsigned char)s[i + (size_t)b];
        h = (h ^ w) * 0x9e3779b97f4a7c15u;
        h ^= h >> 32;
    }
    for (; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3u;
    h ^= h >> 33, h *= 0xff51afd7ed558ccdu, h ^= h >> 33, h *= 0xc4ceb9fe1a85ec53u, h ^= h >> 33;
    return h;
}

static int name_taken(const CuModule *m, const char *name)
{
    for (int i = 0; i < m->n_kernels; i++)
        if (!strcmp(m->kernels[i].name, name)) return 1;
    return 0;
}

static void rehash(CuModule *m)
{
    m->n_slots = m->n_slots ? m->n_slots * 2 : 256;
    m->slots = arena_alloc(m->arena, sizeof(int) * (size_t)m->n_slots);
    for (int k = 0; k < m->n_kernels; k++) {
        unsigned s = (unsigned)m->kernels[k].hash & (unsigned)(m->n_slots - 1);
        while (m->slots[s]) s = (s + 1) & (unsigned)(m->n_slots - 1);
        m->slots[s] = k + 1;
    }
}

/* src with every KNAME replaced by name, appended to the module. */
static void append_kernel(CuModule *m, const char *src, const char *name)
{
    cu_text_add(&m->text, "\n");
    for (const char *at; (at = strstr(src, "KNAME")); src = at + 5) cu_text_add(&m->text, "%.*s%s", (int)(at - src), src, name);
    cu_text_add(&m->text, "%s", src);
}

/* The name of the kernel with this text, added to the module on first use. */
static const char *kernel_name(CuModule *m, const char *prefix, const char *src)
{
    uint64_t h = text_hash(src);
    if (2 * (m->n_kernels + 1) > m->n_slots) rehash(m);
    unsigned s = (unsigned)h & (unsigned)(m->n_slots - 1);
    for (; m->slots[s]; s = (s + 1) & (unsigned)(m->n_slots - 1)) {
        const Kernel *k = &m->kernels[m->slots[s] - 1];
        if (k->hash == h && !strcmp(k->prefix, prefix) && !strcmp(k->src, src)) return k->name;
    }
    uint64_t nh = h;
    char *name = arena_printf(m->arena, "%s_%08x", prefix, (unsigned)(nh & 0xffffffffu));
    while (name_taken(m, name)) {  // a different text, the same name: the next in sequence
        nh = nh * 0x100000001b3u + 1;
        name = arena_printf(m->arena, "%s_%08x", prefix, (unsigned)(nh & 0xffffffffu));
    }
    m->kernels = arena_grow(m->arena, m->kernels, &m->cap_kernels, m->n_kernels + 1, sizeof *m->kernels);
    m->kernels[m->n_kernels] = (Kernel){h, arena_strdup(m->arena, prefix), arena_strdup(m->arena, src), name};
    m->slots[s] = ++m->n_kernels;
    append_kernel(m, src, name);
    return name;
}

/* ---- instructions ------------------------------------------------------------------- */

static int add_args(CuCtx *c, const int *args, int n, int32_t *at)
{
    *at = c->m->plan->n_ids;
    for (int i = 0; i < n; i++)
        if (plan_id_add(c->m->plan, args[i]) < 0) return cu_fail(c, "out of memory");
    return 0;
}

int cu_launch(CuCtx *c, const char *prefix, const char *src, CuDim grid, CuDim block, int smem, const int *args,
              int n_args)
{
    Plan *p = c->m->plan;
    int32_t kernel = plan_intern(p, kernel_name(c->m, prefix, src)), at;
    if (kernel < 0) return cu_fail(c, "out of memory");
    if (add_args(c, args, n_args, &at)) return -1;
    PlanCuda ins = {.op = c->node, .kind = PLAN_CU_LAUNCH, .kernel = kernel, .args = at, .n_args = n_args,
                    .grid = {grid.x, grid.y, grid.z}, .block = {block.x, block.y, block.z}, .smem = smem};
    if (plan_cuda_add(p, &ins) < 0) return cu_fail(c, "out of memory");
    return 0;
}

int cu_gemm(CuCtx *c, const CuGemm *gm)
{
    int32_t at;
    int e = plan_epilogue_args(gm->epi), n = 3 + e + (gm->beta != 0);
    int args[6] = {gm->A, gm->B, gm->C, gm->bias, gm->aux};
    args[3 + e] = gm->beta ? gm->r : args[3 + e];
    if (add_args(c, args, n, &at)) return -1;
    PlanCuda ins = {.op = c->node, .kind = PLAN_CU_GEMM, .kernel = PLAN_NONE, .args = at, .n_args = n,
                    .epilogue = gm->epi, .beta = gm->beta, .ta = gm->ta, .tb = gm->tb, .m = gm->m, .n = gm->n, .k = gm->k,
                    .lda = gm->lda, .ldb = gm->ldb,
                    .ldc = gm->ldc, .stride_a = gm->stride_a, .stride_b = gm->stride_b, .stride_c = gm->stride_c,
                    .batch = gm->batch, .a_off = gm->a_off, .b_off = gm->b_off, .c_off = gm->c_off};
    if (plan_cuda_add(c->m->plan, &ins) < 0) return cu_fail(c, "out of memory");
    return 0;
}

int cu_fail(CuCtx *c, const char *fmt, ...)
{
    int n = snprintf(c->err, c->errlen, "op %d (%s): ", c->node, op_name(ir_node(c->g, c->node)->op));
    if (n >= 0 && (size_t)n < c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* ---- text --------------------------------------------------------------------------- */

/* Formats into a buffer on the stack, then appends: one vsnprintf for every piece but
 * the rare long one (most of codegen's time is spent here). */
static void text_vadd(CuText *t, const char *fmt, va_list ap)
{
    char buf[1024];
    va_list aq;
    va_copy(aq, ap);
    int n = vsnprintf(buf, sizeof buf, fmt, aq);
    va_end(aq);
    FS_ASSERT(n >= 0);
    t->s = arena_grow(t->arena, t->s, &t->cap, t->len + n + 1, 1);
    if (n < (int)sizeof buf) memcpy(t->s + t->len, buf, (size_t)n + 1);
    else vsnprintf(t->s + t->len, (size_t)n + 1, fmt, ap);
    t->len += n;
}

void cu_text_add(CuText *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    text_vadd(t, fmt, ap);
    va_end(ap);
}

CuText cu_text(CuCtx *c) { return (CuText){.arena = c->m->arena}; }

char *cu_fmt(CuCtx *c, const char *fmt, ...)
{
    CuText t = cu_text(c);
    va_list ap;
    va_start(ap, fmt);
    text_vadd(&t, fmt, ap);
    va_end(ap);
    return t.s ? t.s : arena_strdup(c->m->arena, "");
}

const char *cu_type(DType t)
{
    switch (t) {
    case DT_F32: return "float";
    case DT_F16: return "__half";
    case DT_BF16: return "__nv_bfloat16";
    case DT_I32: return "int";
    case DT_COUNT: break;
    }
    FS_ASSERT(!"unknown dtype");
}

const char *cu_rn(DType t)
{
    return t == DT_F16 ? "fs_rn_f16" : t == DT_BF16 ? "fs_rn_bf16" : "";
}

/* ---- loops, indices, literals -------------------------------------------------------- */

CuDim cu_grid(int64_t n)
{
    int64_t blocks = (n + CU_BLOCK - 1) / CU_BLOCK;
    return (CuDim){(int)(blocks < 1 ? 1 : blocks > CU_MAX_BLOCKS ? CU_MAX_BLOCKS : blocks), 1, 1};
}

const char *cu_index(int64_t span)
{
    return span <= INT32_MAX - (int64_t)CU_BLOCK * CU_MAX_BLOCKS ? "int" : "long long";
}

char *cu_loop(CuCtx *c, const char *idx, int64_t n)
{
    return cu_fmt(c, "for (%s i = (%s)blockIdx.x * blockDim.x + threadIdx.x; i < %lld%s; i += (%s)gridDim.x * blockDim.x)",
                  idx, idx, (long long)n, strcmp(idx, "int") ? "LL" : "", idx);
}

/* An offset's terms, i / os % sz * st each: the dims without their unit ones, innermost
 * first, each merged into the one inside it when the tensor walks both as one (stride
 * continues, or both broadcast). The last (outermost) term is never wrapped. */
typedef struct {
    int64_t os, sz, st;
} Term;

static int index_terms(int rank, const int64_t *size, const int64_t *stride, Term *t)
{
    int n = 0;
    int64_t span = 1;
    for (int d = rank - 1; d >= 0; d--) {
        if (size[d] == 1) continue;
        if (n > 0 && stride[d] == t[n - 1].st * t[n - 1].sz) t[n - 1].sz *= size[d];
        else t[n++] = (Term){span, size[d], stride[d]};
        span *= size[d];
    }
    return n;
}

char *cu_index_expr(CuCtx *c, int rank, const int64_t *size, const int64_t *stride, const char *i)
{
    Term tm[IR_MAX_RANK + 1];
    int n = index_terms(rank, size, stride, tm);
    CuText t = cu_text(c);
    for (int k = 0; k < n; k++) {
        int64_t os = tm[k].os, sz = tm[k].sz, st = tm[k].st;
        if (!st) continue;
        cu_text_add(&t, "%s", t.len ? " + " : "");
        if (os == 1 && k == n - 1) cu_text_add(&t, "%s", i);          // the one dim: i itself
        else if (os == 1) cu_text_add(&t, "%s %% %lld", i, (long long)sz);
        else if (k == n - 1) cu_text_add(&t, "%s / %lld", i, (long long)os);  // outermost: no wrap
        else cu_text_add(&t, "%s / %lld %% %lld", i, (long long)os, (long long)sz);
        if (st != 1) cu_text_add(&t, " * %lld", (long long)st);
    }
    return t.len ? t.s : cu_fmt(c, "0");
}

char *cu_index_at(CuCtx *c, int rank, const int64_t *size, const int64_t *stride)
{
    Term tm[IR_MAX_RANK + 1];
    int n = index_terms(rank, size, stride, tm);
    CuText t = cu_text(c);
    cu_use(c, "index.cuh");
    cu_text_add(&t, "FsIndex<");
    for (int k = 0, first = 1; k < n; k++) {
        if (!tm[k].st) continue;
        cu_text_add(&t, "%sFsTerm<%lldLL, %lldLL, %lldLL>", first ? "" : ", ", (long long)tm[k].os,
                    (long long)(k == n - 1 ? 0 : tm[k].sz), (long long)tm[k].st);
        first = 0;
    }
    cu_text_add(&t, ">");
    return t.s;
}

/* in's strides along out's dims when in broadcasts to out (numpy rules): 0 where it does. */
static void bcast_strides(const Value *out, const Value *in, int64_t *stride)
{
    int64_t s = 1;
    FS_ASSERT(in->rank <= out->rank);
    for (int k = 1; k <= out->rank; k++) {
        int d = in->rank - k;
        stride[out->rank - k] = d >= 0 && in->shape[d] != 1 ? s : 0;
        if (d >= 0) s *= in->shape[d];
    }
}

char *cu_bcast_index(CuCtx *c, const Value *out, const Value *in, const char *i)
{
    int64_t stride[IR_MAX_RANK];
    bcast_strides(out, in, stride);
    return cu_index_expr(c, out->rank, out->shape, stride, i);
}

char *cu_bcast_at(CuCtx *c, const Value *out, const Value *in)
{
    int64_t stride[IR_MAX_RANK];
    bcast_strides(out, in, stride);
    return cu_index_at(c, out->rank, out->shape, stride);
}

char *cu_float(CuCtx *c, float v)
{
    if (!isfinite(v)) {
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        return cu_fmt(c, "__int_as_float(0x%08x)", u);
    }
    char *s = cu_fmt(c, "%.9g", (double)v);
    return strpbrk(s, ".e") ? cu_fmt(c, "%sf", s) : cu_fmt(c, "%s.0f", s);
}

char *cu_double(CuCtx *c, double v)
{
    if (!isfinite(v)) {
        uint64_t u;
        memcpy(&u, &v, sizeof u);
        return cu_fmt(c, "__longlong_as_double(0x%016llxLL)", (unsigned long long)u);
    }
    char *s = cu_fmt(c, "%.17g", v);
    return strpbrk(s, ".e") ? s : cu_fmt(c, "%s.0", s);
}
