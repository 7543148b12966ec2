/* planner/space.c: the space fsc --fit searches, as data. One row per axis: the setting
 * key (as config_set and fsc's --KEY VALUE take it), its values or the generator of
 * them. A candidate is one index per axis; an
 * axis that does not apply to it (a schedule with one stage) is held at index 0 and not
 * set. A new setting to search is a row here (and its validity rule below). */
#include <stdlib.h>
#include <string.h>

#include "planner.h"

typedef void (*Generate)(Space *s, Axis *a);

static void gen_recompute(Space *s, Axis *a);
static void gen_selective(Space *s, Axis *a);
static void gen_shard_group(Space *s, Axis *a);
static void gen_stages(Space *s, Axis *a);
static void gen_microbatches(Space *s, Axis *a);
static void gen_balance(Space *s, Axis *a);

static const struct {
    AxisId id;
    const char *key;
    int time_up;             // along the values' order the modelled time only rises, the other
                             // axes equal: each step adds ops to a stream, takes none away
    const char *values[6];   // a list, or NULL and a generator
    Generate gen;
} AXES[AX_COUNT] = {
    {AX_SHARD, "shard", 0, {"none", "ddp", "zero1", "zero2", "fsdp"}, NULL},
    {AX_SHARD_GROUP, "shard_group", 0, {NULL}, gen_shard_group},
    {AX_RESHARD, "reshard_after_forward", 1, {"0", "1"}, NULL},
    {AX_RESHARD_ROOT, "reshard_root", 1, {"0", "1"}, NULL},
    {AX_PRECISION, "precision", 0, {"bf16", "fp16", "fp32"}, NULL},
    {AX_REDUCE, "reduce_dtype", 0, {"compute", "fp32"}, NULL},
    {AX_OFFLOAD, "offload", 0, {"none", "optimizer", "params"}, NULL},
    {AX_RECOMPUTE, "recompute", 1, {NULL}, gen_recompute},
    {AX_SELECTIVE, "selective", 1, {NULL}, gen_selective},
    {AX_STAGES, "stages", 0, {NULL}, gen_stages},
    {AX_MICROBATCHES, "microbatches", 0, {NULL}, gen_microbatches},
    {AX_SCHEDULE, "schedule", 0, {"1f1b", "gpipe", "interleaved", "zb1"}, NULL},
    {AX_BALANCE, "balance", 0, {NULL}, gen_balance},
};

/* Values that lose to another value of the same axis on time and memory alike, the
 * other axes equal, in this compiler: fp16 has bf16's widths and rates plus a loss
 * scale and its checks; an fp32 reduction moves and holds twice the bytes of a 16-bit
 * one; GPipe holds every micro-batch's activations for the same timeline as 1F1B. */
static const struct {
    AxisId axis;
    const char *loses, *to;
} DOMINATED[] = {
    {AX_PRECISION, "fp16", "bf16"}, {AX_REDUCE, "fp32", "compute"}, {AX_SCHEDULE, "gpipe", "1f1b"},
};

static void add(Axis *a, const char *v, int64_t num)
{
    if (a->n == AX_MAX_VALUES) return;
    snprintf(a->value[a->n], AX_VALUE_LEN, "%s", v);
    a->num[a->n++] = num;
}

const char *space_recompute(const ModelFacts *f, int k, int selective, char *buf, size_t n)
{
    int L = f->n_blocks;
    const char *st = f->stem;
    if (k >= L) snprintf(buf, n, "all");
    else if (k == 0) snprintf(buf, n, "%s", selective ? "attention" : "none");
    else if (k == 1) snprintf(buf, n, "%s0", st);
    else snprintf(buf, n, "%s0-%d", st, k - 1);
    if (selective && k > 0 && k < L) {
        size_t at = strlen(buf);
        if (k == L - 1) snprintf(buf + at, n - at, ",attention:%s%d", st, k);
        else snprintf(buf + at, n - at, ",attention:%s%d-%d", st, k, L - 1);
    }
    return buf;
}

/* The first k blocks recomputed in full: every k up to 8 blocks, else 8 even steps (the
 * memory falls and the time rises with k); with blocks not named in a row, none and all. */
static void gen_recompute(Space *s, Axis *a)
{
    int L = s->facts.n_blocks, steps = L <= 8 ? L : 8, last = -1;
    for (int i = 0; i <= steps && L; i++) {
        int k = (int)((int64_t)L * i / steps);
        if (k == last || (!s->facts.stem[0] && k && k < L)) continue;
        add(a, "", k);
        last = k;
    }
    if (!L) add(a, "none", 0);
    for (int i = 0; i < a->n; i++) {
        space_recompute(&s->facts, (int)a->num[i], 0, a->value[i], AX_VALUE_LEN);
        for (int j = 0; j < 2; j++) space_recompute(&s->facts, (int)a->num[i], j, s->recompute[i][j], AX_VALUE_LEN);
    }
}

/* The blocks recompute does not rerun in full: kept ("none"), or their attention core
 * rerun ("attention", Megatron's selective recompute: less memory, more time). */
static void gen_selective(Space *s, Axis *a)
{
    add(a, "none", 0);
    if (s->facts.attention) add(a, "attention", 1);
}

/* Hybrid sharding's group: the node's GPUs and each power of two below it that divides
 * the world, then 0 (every data-parallel rank of a stage: no replicas), in the order the
 * memory falls. */
static void gen_shard_group(Space *s, Axis *a)
{
    for (int g = 2; g < s->world && g <= s->facts.gpus_per_node; g *= 2)
        if (s->world % g == 0) {
            char v[16];
            snprintf(v, sizeof v, "%d", g);
            add(a, v, g);
        }
    add(a, "0", 0);
}

/* Stage counts that divide the world, at most one block per stage. */
static void gen_stages(Space *s, Axis *a)
{
    for (int k = 1; k <= s->world; k++)
        if (s->world % k == 0 && (k == 1 || k <= s->facts.n_blocks)) add(a, "", k);
    for (int i = 0; i < a->n; i++) snprintf(a->value[i], AX_VALUE_LEN, "%lld", (long long)a->num[i]);
}

/* Micro-batch counts that divide the global batch (space_valid keeps those that divide a
 * rank's rows). */
static void gen_microbatches(Space *s, Axis *a)
{
    for (int64_t k = 1; k <= s->facts.batch; k++)
        if (s->facts.batch % k == 0) {
            char v[32];
            snprintf(v, sizeof v, "%lld", (long long)k);
            add(a, v, k);
        }
}

/* The pipeline pass's own balance (by its cost model), and blocks split evenly (the
 * first stages one more), for each stage count: Space.even. */
static void gen_balance(Space *s, Axis *a)
{
    add(a, "auto", 0);
    add(a, "even", 1);
    const Axis *st = &s->axes[AX_STAGES];
    for (int i = 0; i < st->n; i++) {
        int S = (int)st->num[i], L = s->facts.n_blocks;
        char *p = s->even[i];
        p[0] = 0;
        for (int k = 0; k < S && L; k++)
            snprintf(p + strlen(p), AX_VALUE_LEN - strlen(p), "%s%d", k ? "," : "", L / S + (k < L % S));
    }
}

static const char *pinned_value(const char *key, const Setting *pinned, int n)
{
    const char *v = NULL;
    for (int i = 0; i < n; i++)
        if (!strcmp(pinned[i].key, key)) v = pinned[i].value;  // the last one wins, as in fe_compile
    return v;
}

int space_build(Space *s, const ModelFacts *f, int world, const Setting *pinned, int n_pinned, char *err,
                size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->world = world;
    s->facts = *f;
    s->chunks_pinned = pinned_value("chunks", pinned, n_pinned) != NULL;
    for (int i = 0; i < AX_COUNT; i++) {  // stages before balance: the table's order
        Axis *a = &s->axes[i];
        a->key = AXES[i].key;
        const char *v = pinned_value(a->key, pinned, n_pinned);
        TrainConfig t;
        char canon[AX_VALUE_LEN];
        config_default(&t);
        if (v && config_set(&t, a->key, v, err, errlen)) return -1;
        if (v && !config_format(&t, a->key, canon, sizeof canon)) v = canon;  // the table's spelling: zero3 is fsdp
        if (i == AX_SELECTIVE && a->pinned) {  // recompute is the user's
            add(a, "none", 0);
            continue;
        }
        if (AXES[i].gen) AXES[i].gen(s, a);
        for (int k = 0; !AXES[i].gen && k < 6 && AXES[i].values[k]; k++) add(a, AXES[i].values[k], 0);
        if (!v) continue;
        int64_t num = 0;
        for (int k = 0; k < a->n; k++)
            if (!strcmp(a->value[k], v)) num = a->num[k];
        if (i == AX_STAGES || i == AX_MICROBATCHES) num = atoll(v);
        if (i == AX_RECOMPUTE) num = strcmp(v, "none") ? f->n_blocks : 0;
        if (i == AX_SHARD_GROUP) num = atoll(v);
        a->n = 0, a->pinned = 1;
        add(a, v, num);
        if (i == AX_RECOMPUTE) {  // the user's setting as it is: no selective variants of it
            snprintf(s->recompute[0][0], AX_VALUE_LEN, "%s", v);
            Axis *sel = &s->axes[AX_SELECTIVE];
            sel->n = 0, sel->pinned = 1;
        }
    }
    if (world < 1) {
        snprintf(err, errlen, "--fit needs --world N (N >= 1)");
        return -1;
    }
    return 0;
}

int space_time_up(AxisId a) { return AXES[a].time_up; }
const char *space_value(const Space *s, const Cand *c, AxisId a) { return s->axes[a].value[c->v[a]]; }
int64_t space_num(const Space *s, const Cand *c, AxisId a) { return s->axes[a].num[c->v[a]]; }

static int is(const Space *s, const Cand *c, AxisId a, const char *v) { return !strcmp(space_value(s, c, a), v); }

int space_applies(const Space *s, const Cand *c, AxisId a)
{
    switch (a) {
    case AX_RESHARD: return is(s, c, AX_SHARD, "fsdp");
    case AX_RESHARD_ROOT: return is(s, c, AX_SHARD, "fsdp") && is(s, c, AX_RESHARD, "1");
    case AX_SHARD_GROUP: return is(s, c, AX_SHARD, "zero1") || is(s, c, AX_SHARD, "zero2") || is(s, c, AX_SHARD, "fsdp");
    case AX_SELECTIVE: return space_num(s, c, AX_RECOMPUTE) < s->facts.n_blocks;
    case AX_REDUCE: return !is(s, c, AX_PRECISION, "fp32");
    case AX_SCHEDULE:
    case AX_BALANCE: return space_num(s, c, AX_STAGES) > 1;
    default: return 1;
    }
}

int space_valid(const Space *s, const Cand *c)
{
    for (int a = 0; a < AX_COUNT; a++)
        if (!space_applies(s, c, a) && c->v[a]) return 0;
    int64_t S = space_num(s, c, AX_STAGES), m = space_num(s, c, AX_MICROBATCHES);
    if (S < 1 || s->world % S) return 0;
    int64_t dp = s->world / S;
    if (s->facts.batch % dp || (s->facts.batch / dp) % m) return 0;
    if (!s->axes[AX_SHARD].pinned && (dp == 1) != is(s, c, AX_SHARD, "none")) return 0;
    if (!s->axes[AX_OFFLOAD].pinned && is(s, c, AX_OFFLOAD, "params") && !is(s, c, AX_SHARD, "fsdp")) return 0;
    if (!s->axes[AX_SCHEDULE].pinned && is(s, c, AX_SCHEDULE, "interleaved") && S > 1 &&
        2 * S > s->facts.n_blocks)
        return 0;
    if (!s->axes[AX_BALANCE].pinned && S > 1 && is(s, c, AX_SCHEDULE, "interleaved") && c->v[AX_BALANCE])
        return 0;  // its balance counts blocks per model chunk, not per stage
    /* 1F1B and its kin start a stage's first backward after S forwards; with stages the
     * pipeline's checkpoint setting decides recompute unless it is `never`. */
    if (!s->axes[AX_MICROBATCHES].pinned && S > 1 && m < S && !is(s, c, AX_SCHEDULE, "gpipe")) return 0;
    if (!s->axes[AX_RECOMPUTE].pinned && S > 1 && s->facts.checkpoint != CKPT_NEVER &&
        (c->v[AX_RECOMPUTE] || c->v[AX_SELECTIVE]))
        return 0;
    /* A shard group divides the stage's data-parallel ranks and is smaller than them (0:
     * all of them); 1 would be ddp, which the shard axis has. */
    int64_t g = space_applies(s, c, AX_SHARD_GROUP) ? space_num(s, c, AX_SHARD_GROUP) : 0;
    if (!s->axes[AX_SHARD_GROUP].pinned && g && (g >= dp || dp % g)) return 0;
    return 1;
}

int space_dominated(const Space *s, const Cand *c)
{
    for (size_t i = 0; i < sizeof DOMINATED / sizeof *DOMINATED; i++) {
        const Axis *a = &s->axes[DOMINATED[i].axis];
        if (!space_applies(s, c, DOMINATED[i].axis) || strcmp(a->value[c->v[DOMINATED[i].axis]], DOMINATED[i].loses))
            continue;
        for (int k = 0; k < a->n; k++) {
            Cand d = *c;
            d.v[DOMINATED[i].axis] = (uint8_t)k;
            if (!strcmp(a->value[k], DOMINATED[i].to) && space_valid(s, &d)) return 1;
        }
    }
    return 0;
}

int space_settings(const Space *s, const Cand *c, Setting *out)
{
    int n = 0;
    for (int a = 0; a < AX_COUNT; a++) {
        if (s->axes[a].pinned || !space_applies(s, c, a)) continue;
        const char *v = space_value(s, c, a);
        if (a == AX_BALANCE && !strcmp(v, "even")) v = s->even[c->v[AX_STAGES]];
        if (a == AX_SELECTIVE) continue;  // in the recompute setting
        if (a == AX_RECOMPUTE) v = s->recompute[c->v[AX_RECOMPUTE]][space_applies(s, c, AX_SELECTIVE) ? c->v[AX_SELECTIVE] : 0];
        out[n++] = (Setting){s->axes[a].key, v};
    }
    if (!s->chunks_pinned && space_num(s, c, AX_STAGES) > 1 && is(s, c, AX_SCHEDULE, "interleaved"))
        out[n++] = (Setting){"chunks", "2"};
    return n;
}

int64_t space_enumerate(const Space *s, Cand **out)
{
    int64_t total = 1;
    for (int a = 0; a < AX_COUNT; a++) total *= s->axes[a].n ? s->axes[a].n : 1;
    Cand *all = malloc(sizeof *all * (size_t)(total ? total : 1));
    if (!all) return -1;
    int64_t n = 0;
    for (int64_t i = 0; i < total; i++) {
        Cand c;
        int64_t x = i;
        for (int a = AX_COUNT - 1; a >= 0; a--) {
            int k = s->axes[a].n ? s->axes[a].n : 1;
            c.v[a] = (uint8_t)(x % k);
            x /= k;
        }
        if (space_valid(s, &c)) all[n++] = c;
    }
    *out = all;
    return n;
}
