/* runtime/sample.c: text generation (fsexec --sample N), with the plan's decode program
 * (Plan.decode: fsc's forward of one token at a position, with a KV cache per attention:
 * passes/decode.c) or, where there is none (a model that cannot decode one token at a
 * time: fsc's note says why) or under --no-kv-cache, its sampling program (Plan.sample:
 * the forward of one sequence of the model's T tokens, its logits [1, T, V] an output).
 *
 * The context of each new token is the window of nanoGPT's sample.py: the last T tokens
 * of the prompt and what was generated so far, at positions 0..n-1.
 *  - The decode program runs once per position: the prompt's tokens fill the caches at
 *    positions 0..n-1 (the prefill), then each new token is one run at the next position,
 *    its keys and values appended, its logits the next draw's.
 *  - The window program runs once per token on the window, zeros after it. The attention
 *    is causal, so the logits at position n-1 depend on the window alone, not on the
 *    padding.
 * Past T positions (the caches' length) the window slides by one each token, and every
 * position of it moves: the caches would have to be filled again with the window's
 * T - 1 earlier tokens at positions 0..T-2, then the newest at T-1, for each token. That
 * is the window program's forward done one position at a time (measured 3.2x slower on
 * a small GPT-2, and a GEMV per position reads every weight T times), so from there on
 * each token is one run of the window program instead: the same logits, at its cost.
 * The window program then has its own Exec (a second copy of the params, loaded by the
 * caller through rt_sampler_window), made only when the text passes T + 1 tokens.
 *
 * The choice of a token is nanoGPT's: logits / temperature, the top-k kept (the rest
 * -inf), softmax, one draw; temperature 0 is the argmax (the first of equal maxima, as
 * torch.argmax); a padded vocabulary's columns (passes/pad_vocab.c) are never drawn:
 * only the model's own V are candidates. Draw i uses Philox(key = seed, counter = (i, "sample")), so the same
 * seed gives the same text.
 *
 * Text: a byte-level model (V = 256) prints its tokens' bytes; another prints ids, or
 * with a tokenizer file (llm.c's gpt2_tokenizer.bin: 256 u32 header of magic 20240328,
 * version 1 or 2, vocab size, v2's end-of-text token; then per token a u8 length and
 * its bytes) their bytes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

#define TOKENIZER_MAGIC 20240328

typedef struct {
    Exec *e;
    int32_t tokens, logits;  // tensor ids: the input [1, T], the logits [1, T, V] (decode: [1, 1], [1, 1, V])
    int32_t pos;             // the decode program's position (i32 [1]); PLAN_NONE: the window program
} Prog;

struct RtSampler {
    const Plan *whole;
    uint64_t seed;
    Prog run;                // the decode program, or (none, or --no-kv-cache) the window program
    Prog win;                // the decode program's window program past T (rt_sampler_window), or none
    int64_t T, V;
    int64_t W;               // the first W of the V logits are tokens' (passes/pad_vocab.c pads the rest): drawn from
};

struct RtTokenizer {
    uint32_t n;        // tokens
    char **text;       // each token's bytes
    uint8_t *len;
};

/* The decode program's token, position and logits, or -1 (a plan that is not fsc's). */
static int decode_tensors(const Plan *p, Prog *s, int64_t V)
{
    s->pos = plan_role_tensor(p, PLAN_SR_POS), s->tokens = PLAN_NONE;
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].role == PLAN_ROLE_INPUT && p->tensors[i].step_role == PLAN_SR_NONE) s->tokens = i;
    s->logits = p->n_outputs ? p->outputs[0] : PLAN_NONE;
    const PlanTensor *tk = s->tokens == PLAN_NONE ? NULL : &p->tensors[s->tokens];
    const PlanTensor *lt = s->logits == PLAN_NONE ? NULL : &p->tensors[s->logits];
    if (s->pos == PLAN_NONE || !tk || !lt || tk->dtype != PLAN_DT_I32 || plan_tensor_numel(tk) != 1 ||
        lt->dtype != PLAN_DT_F32 || lt->rank != 3 || lt->shape[0] != 1 || lt->shape[1] != 1 || lt->shape[2] != V)
        return -1;
    return 0;
}

/* The window program's tokens and logits; its f32 logits [1, T, V] checked. */
static int window_tensors(const Plan *p, Prog *w)
{
    int32_t targets;
    w->logits = rt_plan_logits(p), w->pos = PLAN_NONE;
    const PlanTensor *lt = w->logits == PLAN_NONE ? NULL : &p->tensors[w->logits];
    return rt_data_inputs(p, &w->tokens, &targets) || !lt || lt->rank != 3 || lt->shape[0] != 1 || lt->dtype != PLAN_DT_F32
               ? -1 : 0;
}

RtSampler *rt_sampler_new(const Plan *whole, uint64_t seed, int kv_cache, char *err, size_t errlen)
{
    const Plan *p = whole->sample;
    if (!p) {
        plan_fail(err, errlen, "--sample: the plan has no sampling program: fsc plans one for a language model (a "
                  "cross-entropy over logits [B, T, V] of a tokens input), and this one is %s",
                  whole->eval ? "not one" : "from an older fsc or a pipeline; recompile it with one stage");
        return NULL;
    }
    RtSampler *s = plan_alloc(sizeof *s);
    if (!s) {
        plan_fail(err, errlen, "out of memory");
        return NULL;
    }
    memset(s, 0, sizeof *s);
    s->whole = whole, s->seed = seed;
    if (window_tensors(p, &s->run)) {
        const char *prec = plan_meta_str(p, "precision", "fp32");
        if (strcmp(prec, "fp32"))
            plan_fail(err, errlen, "--sample: this plan's sampling program computes in %s (an older fsc planned it so), "
                      "and sampling takes f32 logits; recompile the plan: fsc plans the sampling program in fp32", prec);
        else
            plan_fail(err, errlen, "--sample: the sampling program has no f32 logits [1, T, V] of one tokens input");
        plan_dealloc(s);
        return NULL;
    }
    const PlanTensor *lt = &p->tensors[s->run.logits];
    s->T = lt->shape[1], s->V = lt->shape[2], s->W = rt_plan_valid_columns(p, s->V);
    if (kv_cache && whole->decode) {
        p = whole->decode;
        if (decode_tensors(p, &s->run, s->V)) {
            plan_fail(err, errlen, "--sample: the decode program has no token [1, 1], position and f32 logits [1, 1, %lld]; "
                      "recompile the plan", (long long)s->V);
            plan_dealloc(s);
            return NULL;
        }
    }
    char why[512];
    ExecOptions eo = {.seed = seed};
    if (!(s->run.e = rt_exec_new(p, &eo, why, sizeof why))) {
        plan_fail(err, errlen, "the %s program: %s", s->run.pos == PLAN_NONE ? "sampling" : "decode", why);
        plan_dealloc(s);
        return NULL;
    }
    return s;
}

int rt_sampler_window(RtSampler *s, int64_t n_total, Exec **w, char *err, size_t errlen)
{
    *w = NULL;
    if (s->run.pos == PLAN_NONE || n_total <= s->T + 1 || s->win.e) return 0;
    char why[512];
    ExecOptions eo = {.seed = s->seed};
    if (window_tensors(s->whole->sample, &s->win))
        return plan_fail(err, errlen, "the sampling program (past T tokens) has no f32 logits [1, T, V]");
    if (!(s->win.e = rt_exec_new(s->whole->sample, &eo, why, sizeof why)))
        return plan_fail(err, errlen, "the sampling program (past T tokens): %s", why);
    *w = s->win.e;
    return 0;
}

void rt_sampler_free(RtSampler *s)
{
    if (!s) return;
    rt_exec_free(s->run.e);
    rt_exec_free(s->win.e);
    plan_dealloc(s);
}

Exec *rt_sampler_exec(RtSampler *s) { return s->run.e; }
int64_t rt_sampler_context(const RtSampler *s) { return s->T; }
int64_t rt_sampler_vocab(const RtSampler *s) { return s->W; }

/* The token drawn from one row of logits. */
static int32_t choose(const float *row, int64_t V, const RtSampleOptions *o, int64_t draw, float *work)
{
    if (o->temperature == 0 || o->top_k == 1) {
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (row[v] > row[best]) best = v;
        return (int32_t)best;
    }
    /* The k-th largest logit: those below it are dropped (ties at it stay, as torch.topk's
     * threshold in nanoGPT keeps them). */
    float cut = -INFINITY;
    if (o->top_k > 0 && o->top_k < V) {
        memcpy(work, row, sizeof *work * (size_t)V);
        for (int64_t j = 0; j < o->top_k; j++) {  // partial selection: k passes, k small
            int64_t at = j;
            for (int64_t v = j + 1; v < V; v++)
                if (work[v] > work[at]) at = v;
            float t = work[j];
            work[j] = work[at], work[at] = t;
        }
        cut = work[o->top_k - 1];
    }
    double top = -INFINITY, sum = 0;
    for (int64_t v = 0; v < V; v++)
        if (row[v] >= cut && row[v] > top) top = row[v];
    for (int64_t v = 0; v < V; v++) sum += row[v] >= cut ? exp((row[v] - top) / o->temperature) : 0;
    uint32_t ctr[4] = {(uint32_t)draw, (uint32_t)((uint64_t)draw >> 32), 0x73616d70u /* "samp" */, 0}, w[4];
    rt_philox(o->seed, ctr, w);
    double u = rt_unit(w[0], w[1]) * sum, acc = 0;
    int64_t last = 0;
    for (int64_t v = 0; v < V; v++) {
        if (row[v] < cut) continue;
        acc += exp((row[v] - top) / o->temperature);
        last = v;
        if (u < acc) return (int32_t)v;
    }
    return (int32_t)last;  // u rounded up to the sum
}

int rt_sample(RtSampler *s, const RtSampleOptions *o, const int32_t *prompt, int64_t n_prompt, int32_t *out,
              char *err, size_t errlen)
{
    if (n_prompt < 1) return plan_fail(err, errlen, "--sample needs a prompt of at least one token");
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= s->W)
            return plan_fail(err, errlen, "prompt token %lld is %d, outside the model's vocab [0, %lld)", (long long)i,
                             prompt[i], (long long)s->W);
    if (!(o->temperature >= 0) || !isfinite(o->temperature))
        return plan_fail(err, errlen, "--temperature %g: expected a finite number >= 0", o->temperature);
    int64_t n = n_prompt + o->n;
    int32_t *seq = plan_alloc(sizeof *seq * (size_t)n);
    float *work = plan_alloc(sizeof *work * (size_t)s->V);
    if (!seq || !work) {
        plan_dealloc(seq);
        plan_dealloc(work);
        return plan_fail(err, errlen, "out of memory for %lld tokens", (long long)n);
    }
    memcpy(seq, prompt, sizeof *seq * (size_t)n_prompt);
    int rc = 0;
    int64_t runs = 0, filled = 0;  // decode: the caches hold seq[0 .. filled) at their positions
    for (int64_t have = n_prompt; have < n && !rc; have++) {
        int64_t w = have < s->T ? have : s->T;  // the window: the last T tokens
        const Prog *g = s->run.pos != PLAN_NONE && have > s->T ? &s->win : &s->run;
        if (!g->e) {
            rc = plan_fail(err, errlen, "%lld tokens pass the context of %lld: call rt_sampler_window first",
                           (long long)n, (long long)s->T);
            break;
        }
        int32_t *tok = rt_exec_data(g->e, g->tokens);
        const float *logits = rt_exec_data(g->e, g->logits);
        if (g->pos != PLAN_NONE) {
            int32_t *pos = rt_exec_data(g->e, g->pos);
            for (; filled < have && !rc; filled++) {
                *tok = seq[filled], *pos = (int32_t)filled;
                if (rt_exec_run(g->e, ++runs, RT_PHASES_ALL))
                    rc = plan_fail(err, errlen, "the decode program, position %lld: %s", (long long)filled,
                                   rt_exec_error(g->e));
            }
            if (!rc) seq[have] = out[have - n_prompt] = choose(logits, s->W, o, have - n_prompt, work);
            continue;
        }
        memset(tok, 0, sizeof *tok * (size_t)s->T);
        memcpy(tok, seq + have - w, sizeof *tok * (size_t)w);
        if (rt_exec_run(g->e, have - n_prompt + 1, RT_PHASES_ALL))
            rc = plan_fail(err, errlen, "the sampling program: %s", rt_exec_error(g->e));
        else
            seq[have] = out[have - n_prompt] = choose(logits + (w - 1) * s->V, s->W, o, have - n_prompt, work);
    }
    plan_dealloc(seq);
    plan_dealloc(work);
    return rc;
}

/* ---- tokenizer files ------------------------------------------------------------------ */

void rt_tokenizer_free(RtTokenizer *t)
{
    if (!t) return;
    for (uint32_t i = 0; t->text && i < t->n; i++) plan_dealloc(t->text[i]);
    plan_dealloc(t->text);
    plan_dealloc(t->len);
    plan_dealloc(t);
}

static uint32_t le32(const uint8_t *b) { return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24; }

RtTokenizer *rt_tokenizer_open(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    uint8_t head[1024];
    if (!f) {
        plan_fail(err, errlen, "%s: cannot open it", path);
        return NULL;
    }
    RtTokenizer *t = NULL;
    if (fread(head, 1, sizeof head, f) != sizeof head) {
        plan_fail(err, errlen, "%s: shorter than a tokenizer's 1024-byte header", path);
    } else if (le32(head) != TOKENIZER_MAGIC || (le32(head + 4) != 1 && le32(head + 4) != 2)) {
        plan_fail(err, errlen, "%s: not an llm.c tokenizer file (magic %u, version %u; expected %d, 1 or 2)", path,
                  le32(head), le32(head + 4), TOKENIZER_MAGIC);
    } else if (le32(head + 8) == 0 || le32(head + 8) > (1u << 24)) {
        plan_fail(err, errlen, "%s: a vocab of %u tokens", path, le32(head + 8));
    } else if ((t = plan_alloc(sizeof *t))) {
        memset(t, 0, sizeof *t);
        t->n = le32(head + 8);
        t->text = plan_alloc(sizeof *t->text * t->n);
        t->len = plan_alloc(t->n);
        if (t->text) memset(t->text, 0, sizeof *t->text * t->n);
        for (uint32_t i = 0; t->text && t->len && i < t->n; i++) {
            int c = fgetc(f);
            if (c == EOF || c == 0 || !(t->text[i] = plan_alloc((size_t)c)) ||
                fread(t->text[i], 1, (size_t)c, f) != (size_t)c) {
                plan_fail(err, errlen, "%s: token %u of %u is %s", path, i, t->n, c == 0 ? "empty" : "cut short");
                rt_tokenizer_free(t);
                t = NULL;
                break;
            }
            t->len[i] = (uint8_t)c;
        }
        if (t && (!t->text || !t->len)) {
            plan_fail(err, errlen, "out of memory reading %s", path);
            rt_tokenizer_free(t);
            t = NULL;
        }
    } else {
        plan_fail(err, errlen, "out of memory");
    }
    fclose(f);
    return t;
}

uint32_t rt_tokenizer_vocab(const RtTokenizer *t) { return t->n; }

int rt_tokenizer_print(const RtTokenizer *t, int32_t id, FILE *out)
{
    if (id < 0 || (uint32_t)id >= t->n) return fprintf(out, "<%d>", id) < 0 ? -1 : 0;
    return fwrite(t->text[id], 1, t->len[id], out) == t->len[id] ? 0 : -1;
}
