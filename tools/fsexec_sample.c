/* tools/fsexec_sample.c: fsexec PLAN --sample N: the plan's decode program (or, with
 * --no-kv-cache, its sampling program) run on the CPU in one process from --load-weights,
 * --resume's checkpoint or the seed's init, fed the prompt (--prompt's bytes or
 * --prompt-ids), and the prompt and the N tokens after it printed as text or ids.
 * Invariants: one process only (never a rank of several); past the model's context T each
 * token sees the last T, through a window program with its own copy of the weights.
 * Called by main (tools/fsexec.c); the sampler is runtime/sample.c's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "fsexec.h"

/* --prompt-ids 1,2,3 into ids (at most max); the count, or -1 after a message. */
static int64_t parse_ids(const char *s, int32_t *ids, int64_t max)
{
    int64_t n = 0;
    for (const char *at = s;; at++) {
        char *end;
        errno = 0;
        long long v = strtoll(at, &end, 10);
        if (end == at || errno || v < 0 || v > INT32_MAX || (*end && *end != ',') || n == max) {
            fprintf(stderr, "fsexec: --prompt-ids: expected token ids such as 464,3290,318 (at most %" PRId64 "), got "
                    "'%s'\n", max, s);
            return -1;
        }
        ids[n++] = (int32_t)v;
        if (!*end) return n;
        at = end;
    }
}

/* The prompt and the tokens after it: text (bytes, or a tokenizer's) or ids. */
static int print_sample(const Flags *f, const RtTokenizer *tk, int64_t V, const int32_t *ids, int64_t n)
{
    int text = tk || (f->prompt && V == 256), bad = 0;
    for (int64_t i = 0; i < n && !bad; i++) {
        if (tk) bad = rt_tokenizer_print(tk, ids[i], stdout);
        else if (text) bad = putchar(ids[i]) == EOF;
        else bad = printf("%s%d", i ? " " : "", ids[i]) < 0;
    }
    return bad || putchar('\n') == EOF;
}

/* The weights into the sampling program: a file or a checkpoint; 0, or 1 after a message. */
static int sample_weights(const Flags *f, Exec *e, RtCheckpoint *c)
{
    char err[1024];
    RtResumed r;
    if (f->load_weights && rt_load_weights_as(e, f->load_weights, f->load_format, err, sizeof err)) {
        fprintf(stderr, "fsexec: %s\n", err);
        return 1;
    }
    if (c && rt_checkpoint_load(c, e, &r, err, sizeof err)) {
        fprintf(stderr, "fsexec: --resume: %s\n", err);
        return 1;
    }
    return 0;
}

/* fsexec PLAN --sample N: 0, or an exit status after a message. */
int sample(const Flags *f)
{
    char err[1024];
    RtRanks rk;
    if (rt_ranks_from_env(&rk, err, sizeof err) || rk.world != 1) {
        fprintf(stderr, "fsexec: --sample runs in one process, not as rank %d of %d; start it without mpirun\n",
                rk.rank, rk.world);
        return 2;
    }
    Plan *whole = load(f->plan);
    RtCheckpoint *c = whole && f->resume ? rt_checkpoint_open(f->resume, err, sizeof err) : NULL;
    if (whole && f->resume && !c) fprintf(stderr, "fsexec: --resume: %s\n", err);
    uint64_t seed = f->has_seed ? f->seed
                    : c         ? rt_checkpoint_seed(c)
                    : whole     ? (uint64_t)plan_meta_int(whole, "seed", 0)
                                : 0;
    RtSampler *s = whole && (c || !f->resume) ? rt_sampler_new(whole, seed, !f->no_kv_cache, err, sizeof err) : NULL;
    if (whole && (c || !f->resume) && !s) fprintf(stderr, "fsexec: %s: %s\n", f->plan, err);
    RtTokenizer *tk = s && f->tokenizer ? rt_tokenizer_open(f->tokenizer, err, sizeof err) : NULL;
    if (s && f->tokenizer && !tk) fprintf(stderr, "fsexec: --tokenizer %s\n", err);
    int rc = !s || (f->tokenizer && !tk) || sample_weights(f, rt_sampler_exec(s), c);
    int64_t V = s ? rt_sampler_vocab(s) : 0, T = s ? rt_sampler_context(s) : 0, max = 1 << 20, n = 0;
    int32_t *ids = rc ? NULL : malloc(sizeof *ids * (size_t)(max + f->sample));
    if (!rc && !ids) fprintf(stderr, "fsexec: out of memory\n");
    rc = rc || !ids;
    if (!rc && f->prompt && V != 256) {
        fprintf(stderr, "fsexec: --prompt TEXT is a byte-level model's prompt (V = 256); this one's vocab is %" PRId64
                ": give --prompt-ids\n", V);
        rc = 2;
    } else if (!rc && f->prompt) {
        for (const char *b = f->prompt; *b && n < max; b++) ids[n++] = (unsigned char)*b;
    } else if (!rc && (n = parse_ids(f->prompt_ids, ids, max)) < 0) {
        rc = 2;
    }
    Exec *window = NULL;  // the sampling program, past T tokens with a KV cache: weights of its own
    if (!rc && rt_sampler_window(s, n + f->sample, &window, err, sizeof err)) {
        fprintf(stderr, "fsexec: %s\n", err);
        rc = 1;
    }
    if (!rc && window) rc = sample_weights(f, window, c);
    RtSampleOptions so = {.n = f->sample, .temperature = f->temperature, .top_k = f->top_k, .seed = seed};
    if (!rc && n + f->sample > T)
        fprintf(stderr, "fsexec: note: the model's context is T = %" PRId64 " tokens; past it each token sees the "
                "last %" PRId64 " (as nanoGPT crops)\n", T, T);
    if (!rc && rt_sample(s, &so, ids, n, ids + n, err, sizeof err)) {
        fprintf(stderr, "fsexec: %s\n", err);
        rc = 1;
    }
    if (!rc) rc = print_sample(f, tk, V, ids, n + f->sample);
    free(ids);
    rt_tokenizer_free(tk);
    rt_sampler_free(s);
    rt_checkpoint_close(c);
    plan_free(whole);
    return rc;
}
