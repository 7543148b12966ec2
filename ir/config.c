/* ir/config.c: the training settings. One table of keys serves the `train` section of a
 * .fsm file and the `--key value` flags of fsc, so both accept the same spellings and
 * give the same messages. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>

#include "ir.h"

static const char *const SHARDS[SHARD_COUNT] = {"none", "ddp", "zero1", "zero2", "fsdp"};
static const char *const PRECS[PREC_COUNT] = {"fp32", "fp16", "bf16"};
static const char *const REDUCES[REDUCE_COUNT] = {"compute", "fp32", "fp16", "bf16"};
static const char *const OPTIMS[OPTIM_COUNT] = {"sgd", "adamw"};
static const char *const OFFLOADS[OFFLOAD_COUNT] = {"none", "optimizer", "params"};
static const char *const SCHEDS[SCHED_COUNT] = {"gpipe", "1f1b", "interleaved", "zb1"};
static const char *const CKPTS[CKPT_COUNT] = {"always", "except_last", "never"};
static const char *const LR_SCHEDS[LR_COUNT] = {"constant", "cosine", "linear", "wsd"};
_Static_assert((int)LR_LINEAR == (int)OPS_LR_LINEAR && (int)LR_WSD == (int)OPS_LR_WSD &&
                   (int)LR_COUNT == (int)OPS_LR_COUNT,
               "lr_at's schedule numbers");
static const char *const DECAY_ON[2] = {"all", "matrices"};

const char *shard_name(ShardKind s) { return (unsigned)s < SHARD_COUNT ? SHARDS[s] : "?"; }
const char *precision_name(Precision p) { return (unsigned)p < PREC_COUNT ? PRECS[p] : "?"; }
DType precision_dtype(Precision p) { return p == PREC_FP16 ? DT_F16 : p == PREC_BF16 ? DT_BF16 : DT_F32; }
const char *reduce_name(ReduceDtype r) { return (unsigned)r < REDUCE_COUNT ? REDUCES[r] : "?"; }
const char *optim_name(OptimKind o) { return (unsigned)o < OPTIM_COUNT ? OPTIMS[o] : "?"; }
const char *offload_name(OffloadKind o) { return (unsigned)o < OFFLOAD_COUNT ? OFFLOADS[o] : "?"; }
const char *sched_name(PipeSchedule s) { return (unsigned)s < SCHED_COUNT ? SCHEDS[s] : "?"; }
const char *checkpoint_name(PipeCheckpoint c) { return (unsigned)c < CKPT_COUNT ? CKPTS[c] : "?"; }

int checkpoint_recomputes(const TrainConfig *t, int m)
{
    return t->checkpoint == CKPT_ALWAYS || (t->checkpoint == CKPT_EXCEPT_LAST && m < t->microbatches - 1);
}
/* The target after an `attention:` prefix (or `attention` alone: every block). */
static const char *item_target(const char *item, size_t *len, int *attention)
{
    static const char prefix[] = "attention:";
    size_t n = sizeof prefix - 1;
    *attention = 0;
    if (*len == n - 1 && !strncmp(item, prefix, n - 1)) {
        *attention = 1, *len = 3;
        return "all";
    }
    if (*len > n && !strncmp(item, prefix, n)) {
        *attention = 1, *len -= n;
        return item + n;
    }
    return item;
}

/* NAME.A-B: the length of NAME. (through the dot), and A, B; 0 when the target is not a range. */
static size_t item_range(const char *t, size_t len, long *lo, long *hi)
{
    const char *dash = memchr(t, '-', len);
    if (!dash) return 0;
    const char *dot = dash;
    while (dot > t && dot[-1] != '.') dot--;
    if (dot == t || dot == dash) return 0;
    char a[24] = "", b[24] = "";
    size_t na = (size_t)(dash - dot), nb = len - (size_t)(dash + 1 - t);
    if (na >= sizeof a || nb >= sizeof b || !nb) return 0;
    memcpy(a, dot, na), memcpy(b, dash + 1, nb);
    if (strspn(a, "0123456789") != na || strspn(b, "0123456789") != nb) return 0;
    *lo = atol(a), *hi = atol(b);
    return (size_t)(dot - t);
}

int recompute_item_names(const char *item, size_t len, const Block *b, int *attention)
{
    const char *t = item_target(item, &len, attention);
    if (len == 3 && !strncmp(t, "all", 3)) return 1;
    if ((strlen(b->layer) == len && !strncmp(t, b->layer, len)) || (strlen(b->name) == len && !strncmp(t, b->name, len)))
        return 1;
    long lo, hi;
    size_t pre = item_range(t, len, &lo, &hi);
    if (!pre || strncmp(b->name, t, pre)) return 0;
    const char *num = b->name + pre;
    if (!*num || strspn(num, "0123456789") != strlen(num)) return 0;
    long i = atol(num);
    return lo <= i && i <= hi;
}

int recompute_item_check(const char *item, size_t len, char *err, size_t errlen)
{
    int attention;
    const char *t = item_target(item, &len, &attention);
    long lo, hi;
    if (!len) {
        snprintf(err, errlen, "an empty item%s", attention ? " after attention:" : "");
        return -1;
    }
    if (memchr(t, '-', len) && (!item_range(t, len, &lo, &hi) || lo > hi)) {
        snprintf(err, errlen, "'%.*s' is not a range of instances: write NAME.A-B with A <= B, as h.0-5 (h.0 to h.5)",
                 (int)len, t);
        return -1;
    }
    return 0;
}

RecomputeMode recompute_mode(const char *list, const Block *b)
{
    RecomputeMode m = RC_NONE;
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        int attention;
        if (!(len == 4 && !strncmp(p, "none", 4)) && recompute_item_names(p, len, b, &attention))
            m = attention ? (m == RC_NONE ? RC_ATTENTION : m) : RC_FULL;
        p += len + (p[len] == ',');
    }
    return m;
}

int config_shard_group(const TrainConfig *c) { return c->shard_group > 0 ? c->shard_group : c->world; }
const char *decay_on_name(int matrices) { return DECAY_ON[matrices != 0]; }
const char *lr_schedule_name(LrSchedule s) { return (unsigned)s < LR_COUNT ? LR_SCHEDS[s] : "?"; }

void config_default(TrainConfig *c)
{
    *c = (TrainConfig){
        .optimizer = OPTIM_ADAMW, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
        .weight_decay = 0.0, .momentum = 0.0, .clip = 0.0, .lr_schedule = LR_CONSTANT,
        .warmup = 0, .min_lr = 0.0, .steps = 1000, .decay_frac = 0.2, .precision = PREC_FP32,
        .reduce_dtype = REDUCE_COMPUTE, .shard = SHARD_NONE, .reshard_after_forward = 1, .world = 1,
        .stages = 1, .microbatches = 1, .schedule = SCHED_1F1B, .checkpoint = CKPT_EXCEPT_LAST, .chunks = 1,
        .offload = OFFLOAD_NONE, .seed = 1234, .fuse_loss = 1, .embed_grad_into = 1, .pack_attention = 1,
        .fuse_gemm = 1, .pad_vocab = 64, .slice_views = 1, .fuse_residual = 1, .cast_in_update = 1,
    };
    strcpy(c->recompute, "none");
    strcpy(c->freeze, "none");
    strcpy(c->balance, "auto");
}

typedef enum { K_F64, K_INT, K_ENUM, K_TEXT, K_SEED } KeyType;

typedef struct {
    ConfigKey key;
    KeyType type;
    size_t offset;                /* into TrainConfig */
    double lo, hi;                /* accepted range, inclusive (K_F64, K_INT) */
    const char *const *names;     /* K_ENUM: accepted spellings, index = enum value */
    int n_names;
} KeyDef;

#define F64(k, field, lo, hi, help) {{k, help}, K_F64, offsetof(TrainConfig, field), lo, hi, NULL, 0}
#define INT(k, field, lo, hi, help) {{k, help}, K_INT, offsetof(TrainConfig, field), lo, hi, NULL, 0}
#define ENUM(k, field, names, help) {{k, help}, K_ENUM, offsetof(TrainConfig, field), 0, 0, names, sizeof names / sizeof *names}

static const KeyDef KEYS[] = {
    ENUM("optimizer", optimizer, OPTIMS, "adamw or sgd"),
    F64("lr", lr, 0, 1e3, "peak learning rate"),
    F64("beta1", beta1, 0, 0.999999, "AdamW beta1"),
    F64("beta2", beta2, 0, 0.999999999, "AdamW beta2"),
    F64("eps", eps, 0, 1, "AdamW epsilon (outside the square root)"),
    F64("weight_decay", weight_decay, 0, 10, "decoupled weight decay (AdamW), L2 (SGD)"),
    ENUM("weight_decay_on", decay_matrices, DECAY_ON, "all (default: every param decays, as AdamW(model.parameters())) or "
         "matrices (only params of 2 or more dims: no decay on biases and norm gains, nanoGPT's groups)"),
    F64("momentum", momentum, 0, 0.999999, "SGD momentum"),
    F64("clip", clip, 0, 1e9, "clip gradients to this global norm; 0: off"),
    ENUM("lr_schedule", lr_schedule, LR_SCHEDS, "after warmup: constant, cosine or linear (decay to min_lr at step "
         "`steps`), or wsd (warmup-stable-decay: constant, then linear to min_lr over the last decay_frac of the "
         "steps)"),
    INT("warmup", warmup, 0, 1e9, "steps of linear learning-rate warmup: lr * step / warmup up to step warmup"),
    F64("min_lr", min_lr, 0, 1e3, "learning rate at the end of the decay (cosine, linear, wsd)"),
    INT("steps", steps, 1, 1e9, "the step at which the decay reaches min_lr (not fsexec --steps)"),
    F64("decay_frac", decay_frac, 0, 1,
        "wsd: the fraction of the steps that decays (the last round(decay_frac * steps))"),
    ENUM("precision", precision, PRECS, "fp32, fp16 or bf16"),
    ENUM("reduce_dtype", reduce_dtype, REDUCES, "dtype of gradient reductions: compute (the precision's) or fp32"),
    ENUM("shard", shard, SHARDS, "none, ddp, zero1 (oss), zero2 (sdp), fsdp (zero3)"),
    INT("reshard_after_forward", reshard_after_forward, 0, 1, "fsdp: free gathered params after forward (1) or keep them (0)"),
    INT("reshard_root", reshard_root, 0, 1,
        "fsdp: gather the params outside blocks for each use between blocks and free them after it (1), or keep "
        "them gathered from forward to backward (0)"),
    INT("shard_group", shard_group, 0, 1 << 20, "zero1, zero2, fsdp: shard within groups of this many consecutive "
        "data-parallel ranks, replicate across the groups (FSDP's HYBRID_SHARD); 0: all of them"),
    INT("world", world, 1, 1 << 20, "number of ranks"),
    {{"recompute", "none, all, layers, instances (h.3) or ranges (h.0-5); attention: before any for the attention core alone"}, K_TEXT, offsetof(TrainConfig, recompute), 0, 0, NULL, 0},
    {{"freeze", "none, or params, layer instances (h.0) and layers (Block) to freeze (A,B): no gradient, "
      "no optimizer state"}, K_TEXT, offsetof(TrainConfig, freeze), 0, 0, NULL, 0},
    INT("stages", stages, 1, 1024, "pipeline stages (world = stages x data-parallel ranks)"),
    INT("microbatches", microbatches, 1, 1 << 16, "micro-batches per step (one stage: gradient accumulation)"),
    ENUM("schedule", schedule, SCHEDS, "pipeline schedule: gpipe, 1f1b, interleaved (with chunks) or zb1 (ZB-H1)"),
    ENUM("checkpoint", checkpoint, CKPTS, "pipeline: micro-batches that recompute their stage's forward: always, "
         "except_last or never"),
    INT("chunks", chunks, 1, 64, "interleaved schedule: model chunks per stage (2 or more)"),
    INT("fuse_loss", fuse_loss, 0, 1, "training: the loss and its gradient in one pass over the logits, the "
        "gradient written over them (1, default), or as two ops with a buffer of their own for the gradient (0)"),
    INT("embed_grad_into", embed_grad_into, 0, 1, "training: an embedding's gradient rows added in place into the "
        "gradient they sum with (a tied embedding's: the LM head's), 1, default; or a dense table of their own and an "
        "add (0)"),
    INT("pack_attention", pack_attention, 0, 1, "training: attention reads q, k, v from the QKV projection's output "
        "and writes the heads side by side, with no split, heads or merge_heads copies (1, default); or through them "
        "(0)"),
    INT("fuse_gemm", fuse_gemm, 0, 1, "training: a matmul's bias, GELU, the GELU's gradient and the bias gradient "
        "in the GEMM's epilogue, one op (1, default; cuBLASLt's epilogues on CUDA), or separate ops (0)"),
    INT("fuse_residual", fuse_residual, 0, 1, "training, with fuse_gemm: a residual add in its producer, one op (1, "
        "default): x + (h @ w + b) in the GEMM (cuBLASLt's C, beta 1), a residual stream's gradient added in its "
        "norm's backward; or an add of its own (0)"),
    INT("cast_in_update", cast_in_update, 0, 1, "mixed precision: the optimizer's update also writes the 16-bit "
        "params, kept between steps (1, default; with offload on the host, then sent); or each unit's master is cast "
        "to them before its first use in each step (0)"),
    INT("pad_vocab", pad_vocab, 0, 1 << 16, "the LM head's vocabulary padded to a multiple of this many rows "
        "(aligned GEMMs; the padding masked in the loss and sampling, held at zero), 64 by default; 0: off"),
    INT("slice_views", slice_views, 0, 1, "a slice that is one run of its input's bytes (every dim before its "
        "axis 1 long: a micro-batch's rows, x[i] of a param) lies in the input's buffer, no copy (1, default); or a "
        "copy (0)"),
    INT("tf32", tf32, 0, 1, "CUDA: f32 attention and f32 GEMMs on TF32 tensor cores (inputs rounded to a 10-bit "
        "mantissa, f32 sums: no longer bit-equal to the CPU), 1; or in full f32 (0, default)"),
    {{"balance", "pipeline: auto (by the cost model) or blocks per stage, e.g. 3,3,2"}, K_TEXT,
     offsetof(TrainConfig, balance), 0, 0, NULL, 0},
    ENUM("offload", offload, OFFLOADS, "none; optimizer: fp32 master weights, optimizer state and the update on the host (ZeRO-Offload); params: fsdp's param shards there too"),
    INT("delayed_update", delayed_update, 0, 1, "offload: 1 runs each step's host update during the next step's "
        "forward and backward (ZeRO-Offload's delayed parameter update), so step t computes its gradient on the "
        "params of update t-2 (one step staler than 0, the default: exact); needs offload"),
    {{"seed", "seed of parameter init and data order"}, K_SEED, offsetof(TrainConfig, seed), 0, 0, NULL, 0},
};
enum { N_KEYS = sizeof KEYS / sizeof *KEYS };

/* FairScale's and DeepSpeed's names for the same strategies. */
static const struct { const char *alias, *name; } ALIASES[] = {
    {"oss", "zero1"}, {"sdp", "zero2"}, {"zero3", "fsdp"}, {"float32", "fp32"},
    {"float16", "fp16"}, {"bfloat16", "bf16"}, {"1F1B", "1f1b"},
};

static ConfigKey keys[N_KEYS];
static once_flag keys_made = ONCE_FLAG_INIT;

static void make_keys(void)
{
    for (int i = 0; i < N_KEYS; i++) keys[i] = KEYS[i].key;
}

/* Filled once (fsc --fit compiles on two threads). */
const ConfigKey *config_keys(int *n)
{
    call_once(&keys_made, make_keys);
    *n = N_KEYS;
    return keys;
}

static int set_enum(const KeyDef *k, int *field, const char *value, char *err, size_t errlen)
{
    for (size_t i = 0; i < sizeof ALIASES / sizeof *ALIASES; i++)
        if (!strcmp(value, ALIASES[i].alias)) value = ALIASES[i].name;
    for (int i = 0; i < k->n_names; i++)
        if (!strcmp(value, k->names[i])) {
            *field = i;
            return 0;
        }
    char list[160] = "";
    for (int i = 0; i < k->n_names; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", k->names[i]);
    const char *near = diag_closest(value, k->names, k->n_names);
    snprintf(err, errlen, "%s: unknown value '%s'%s%s%s (expected one of: %s)", k->key.key, value,
             near ? "; did you mean '" : "", near ? near : "", near ? "'?" : "", list);
    return -1;
}

static int set_number(const KeyDef *k, TrainConfig *c, const char *value, char *err, size_t errlen)
{
    char *end;
    errno = 0;
    double x = strtod(value, &end);
    if (end == value || *end || errno || !isfinite(x)) {
        snprintf(err, errlen, "%s: expected a number, got '%s'", k->key.key, value);
        return -1;
    }
    if (k->type == K_INT && x != floor(x)) {
        snprintf(err, errlen, "%s: expected an integer, got '%s'", k->key.key, value);
        return -1;
    }
    if (x < k->lo || x > k->hi) {
        if (k->type == K_INT)
            snprintf(err, errlen, "%s: %s is out of range [%.0f, %.0f]", k->key.key, value, k->lo, k->hi);
        else
            snprintf(err, errlen, "%s: %s is out of range [%g, %g]", k->key.key, value, k->lo, k->hi);
        return -1;
    }
    void *field = (char *)c + k->offset;
    if (k->type == K_INT)
        *(int *)field = (int)x;
    else
        *(double *)field = x;
    return 0;
}

int config_set(TrainConfig *c, const char *key, const char *value, char *err, size_t errlen)
{
    const KeyDef *k = NULL;
    for (int i = 0; i < N_KEYS; i++)
        if (!strcmp(key, KEYS[i].key.key)) k = &KEYS[i];
    if (!k) {
        const char *names[N_KEYS];
        for (int i = 0; i < N_KEYS; i++) names[i] = KEYS[i].key.key;
        const char *near = diag_closest(key, names, N_KEYS);
        snprintf(err, errlen, "unknown setting '%s'%s%s%s", key, near ? "; did you mean '" : "",
                 near ? near : "", near ? "'?" : "");
        return -1;
    }
    void *field = (char *)c + k->offset;
    switch (k->type) {
    case K_ENUM:
        return set_enum(k, field, value, err, errlen);
    case K_F64:
    case K_INT:
        return set_number(k, c, value, err, errlen);
    case K_SEED: {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(value, &end, 10);
        if (end == value || *end || errno || value[0] == '-') {
            snprintf(err, errlen, "seed: expected a non-negative integer, got '%s'", value);
            return -1;
        }
        c->seed = s;
        return 0;
    }
    case K_TEXT:
        if (strlen(value) >= sizeof c->recompute || !*value) {
            snprintf(err, errlen, "%s: value must be 1 to %zu characters", key, sizeof c->recompute - 1);
            return -1;
        }
        strcpy(field, value);
        return 0;
    }
    return -1;
}

int config_format(const TrainConfig *c, const char *key, char *buf, size_t len)
{
    for (int i = 0; i < N_KEYS; i++) {
        const KeyDef *k = &KEYS[i];
        if (strcmp(key, k->key.key)) continue;
        const void *field = (const char *)c + k->offset;
        switch (k->type) {
        case K_F64: snprintf(buf, len, "%g", *(const double *)field); return 0;
        case K_INT: snprintf(buf, len, "%d", *(const int *)field); return 0;
        case K_ENUM: snprintf(buf, len, "%s", k->names[*(const int *)field]); return 0;
        case K_TEXT: snprintf(buf, len, "%s", (const char *)field); return 0;
        case K_SEED: snprintf(buf, len, "%llu", (unsigned long long)c->seed); return 0;
        }
    }
    return -1;
}
