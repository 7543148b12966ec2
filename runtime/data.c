/* runtime/data.c: the batches a plan's inputs get, one step at a time.
 *
 * Two kinds of model are fed, told apart by their inputs (the "step" input aside):
 *   language model   two i32 [B, T] inputs, tokens then targets: B windows of T + 1
 *                    consecutive tokens from a token file (llm.c's format or raw uint16),
 *                    or without a file from a built-in corpus (the bytes of a text every
 *                    Debian machine has; token = byte, so the vocab must be >= 256);
 *   classifier       f32 [B, D] and i32 [B]: Gaussian blobs, K classes (the last dim of
 *                    the output "logits", else 2), centers ~ N(0, 1) fixed by the seed,
 *                    x = center[y] + 0.5 * N(0, 1).
 * Or, for any number of inputs fsexec can feed (ops/feed.c), from .npy arrays (--data
 * x=feats.npy,y=labels.npy,...; runtime/arrays.c): sample b of step s is row
 * ((s - 1) * B + b) mod N of each (sequential), or Philox-drawn (random), as below.
 * Every number comes from Philox (runtime/init.c) keyed by the seed and counted by
 * (step, row, ...), so a batch is a pure function of (seed, step): any rank can make its
 * own rows of the global batch, and the run is the same whatever the thread count. The
 * plan's inputs hold one rank's B rows; in a world of N, rank r fills rows [r * B,
 * (r + 1) * B) of the global batch of N * B rows (B in the formulas below is N * B), so
 * every world size trains on the same global batches, row for row.
 *
 * Window starts of step s (1-based), row b, with M = N - T - 1 (the last valid start):
 *   random      uniform in [0, M]: Philox(seed ^ RT_DATA_KEY, (s, b, 0)), 64 bits mod (M + 1)
 *   sequential  ((s - 1) * B + b) * T mod M
 * Token files are mapped, not read: a file of any size costs no memory up front. Every
 * token is checked against the vocab once, when the file is opened. A file is llm.c's by
 * its exact magic, raw uint16 when the caller says so or when it can be nothing else: a
 * damaged llm.c header, a .npy file or a text is an error that says what the file is.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ops.h"
#include "runtime.h"

enum { LLMC_MAGIC = 20240520, LLMC_VERSION = 1, LLMC_HEADER = 256 * 4 };

#define BLOB_CENTER_KEY 0xC1A55u

/* Texts tried in order for the built-in corpus. */
static const char *const CORPUS_PATHS[] = {
    "/usr/share/common-licenses/GPL-3",
    "/usr/share/dict/words",
    "/usr/share/common-licenses/GPL-2",
    "/usr/share/common-licenses/Apache-2.0",
};

struct RtData {
    RtDataKind kind;
    RtDataOrder order;
    uint64_t seed;
    int64_t B, T, D, K;        // B: this rank's rows
    int64_t row0, B_global;    // this rank's first row of the global batch, and its rows
    void *x;                   // tokens (i32 [B, T]) or features (f32 [B, D]); NULL: not this stage's
    int32_t *y;                // targets (i32 [B, T]) or labels (i32 [B]); NULL: not this stage's
    int32_t y_id, logits;      // a classifier's labels and logits on this stage, or PLAN_NONE
    int64_t ignore;            // the targets' or labels' ignore_index (rt_input_ignored), else OPS_NO_IGNORE
    const uint16_t *tok;       // the token stream
    int64_t n_tok;
    RtTokenFormat format;      // of the file (token offsets in messages)
    void *map;                 // the mapped file, or NULL
    size_t map_len;
    uint16_t *owned;           // the built-in corpus (plan_alloc), or NULL
    float *centers;            // [K, D] (plan_alloc), classifier only
    RtArrays *arrays;          // --data NAME=FILE.npy,...: every input's array (runtime/arrays.c), or NULL
    char describe[512];
};

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- token files --------------------------------------------------------------------- */

/* A token file is llm.c's when its first int32 is the magic, raw uint16 tokens when it
 * cannot be anything else. In auto mode a file without the exact magic is raw only if it
 * shows none of the signs of something else: a NumPy header, text, a damaged llm.c
 * header (a magic a few bits off, a count that fits the size, llm.c's zeroed header
 * tail), an odd size. Raw files of real tokens show none of them. */

static int bits_set(uint32_t x)
{
    int n = 0;
    for (; x; x &= x - 1) n++;
    return n;
}

static uint32_t swap32(uint32_t x)
{
    return x >> 24 | (x >> 8 & 0xff00u) | (x << 8 & 0xff0000u) | x << 24;
}

static int parse_llmc(const uint8_t *b, size_t len, RtTokens *out, char *err, size_t errlen)
{
    if (len < LLMC_HEADER)
        return plan_fail(err, errlen, "an llm.c token file cut short: %zu bytes, less than its %d-byte header "
                    "(truncated?)", len, LLMC_HEADER);
    uint32_t version = le32(b + 4), count = le32(b + 8);
    if (version != LLMC_VERSION)
        return plan_fail(err, errlen, "llm.c token file of version %" PRIu32 "; this fsexec reads version %d "
                    "(uint16 tokens)", version, LLMC_VERSION);
    if ((uint64_t)count * 2 != len - LLMC_HEADER)
        return plan_fail(err, errlen, "llm.c token file says %" PRIu32 " tokens (%" PRIu64 " bytes) but holds %zu "
                    "bytes after its header (truncated or damaged)", count, (uint64_t)count * 2, len - LLMC_HEADER);
    *out = (RtTokens){(const uint16_t *)(b + LLMC_HEADER), count, RT_TOKENS_LLMC};
    return 0;
}

/* The value of `'key': ` in a .npy header dict, up to the closing `stop`, into v. */
static void npy_field(const char *dict, const char *key, char stop, char *v, size_t n)
{
    const char *s = strstr(dict, key);
    size_t k = 0;
    if (s)
        for (s += strlen(key); *s && *s != stop && k + 2 < n; s++) v[k++] = *s;
    if (s && *s == stop && stop == ')') v[k++] = ')';
    v[k] = 0;
}

/* "\x93NUMPY", major, minor, header length (u16 in version 1, else u32), a Python dict. */
static int npy_error(const uint8_t *b, size_t len, char *err, size_t errlen)
{
    char dict[512] = "", descr[32], shape[64] = "(";
    size_t at = len >= 10 && b[6] == 1 ? 10 : 12;
    size_t hl = at == 10 ? (size_t)(b[8] | b[9] << 8) : len >= 12 ? le32(b + 8) : 0;
    if (at > len) at = len;
    if (hl > len - at) hl = len - at;
    if (hl >= sizeof dict) hl = sizeof dict - 1;
    memcpy(dict, b + at, hl);
    dict[hl] = 0;
    npy_field(dict, "'descr': '", '\'', descr, sizeof descr);
    npy_field(dict, "'shape': (", ')', shape + 1, sizeof shape - 1);
    char what[128] = "";
    if (descr[0] && shape[1]) snprintf(what, sizeof what, " (dtype '%s', shape %s)", descr, shape);
    return plan_fail(err, errlen, "a NumPy .npy file%s, not a token file: convert it with "
                "np.asarray(np.load(path), np.uint16).tofile(\"tokens.bin\") (raw uint16 tokens)", what);
}

/* Mostly printable ASCII or UTF-8, and no NUL, in the first 4 KiB. Raw tokens below 8224
 * (0x2020) have a high byte that is a control character or NUL, so real tokens fail. */
static int is_text(const uint8_t *b, size_t len)
{
    size_t n = len < 4096 ? len : 4096, good = 0;
    for (size_t i = 0; i < n;) {
        uint8_t c = b[i];
        if (c == 0) return 0;
        if ((c >= 0x20 && c < 0x7f) || c == '\t' || c == '\n' || c == '\r' || c == '\f') {
            good++, i++;
            continue;
        }
        size_t k = c >= 0xc2 && c <= 0xdf ? 1 : c >= 0xe0 && c <= 0xef ? 2 : c >= 0xf0 && c <= 0xf4 ? 3 : 0, j = 1;
        while (j <= k && i + j < n && (b[i + j] & 0xc0) == 0x80) j++;
        if (k && (j == k + 1 || i + j == n)) good += j;  // a whole sequence, or one the sample cuts
        i += j;
    }
    return n && good * 100 >= n * 95;
}

static int text_error(const uint8_t *b, size_t len, char *err, size_t errlen)
{
    char start[28];
    size_t k = 0;
    for (; k < len && k + 1 < sizeof start && b[k] >= 0x20 && b[k] < 0x7f; k++) start[k] = (char)b[k];
    start[k] = 0;
    return plan_fail(err, errlen, "a text file%s%s%s, not a token file: tokenize it first, with scripts/tokenize.py "
                "in.txt out.bin (each byte a token, for a model with V >= 256; --vocab gpt2 --encoder encoder.json "
                "--merges vocab.bpe for GPT-2's tokens), then --data out.bin; or drop --data to train on the "
                "built-in byte-level corpus", k ? " (it starts \"" : "", start, k ? "\")" : "");
}

/* 0 unless the first 1024 bytes look like an llm.c header that is damaged; then -1 with
 * a message that lists what looks like llm.c's. */
static int damaged_llmc(const uint8_t *b, size_t len, char *err, size_t errlen)
{
    if (len < 12) return 0;
    uint32_t magic = le32(b), version = le32(b + 4), count = le32(b + 8);
    int flips = bits_set(magic ^ LLMC_MAGIC), same_bytes = 0;
    for (int i = 0; i < 4; i++) same_bytes += b[i] == (uint8_t)((uint32_t)LLMC_MAGIC >> 8 * i);
    int swapped = swap32(magic) == LLMC_MAGIC, near = swapped || flips <= 4 || same_bytes == 3;
    uint64_t body = len > LLMC_HEADER ? len - LLMC_HEADER : 0;
    int fits = count && (body == (uint64_t)count * 2 || body == (uint64_t)count * 4);
    int zero_tail = len >= LLMC_HEADER;
    for (size_t i = 12; i < LLMC_HEADER && zero_tail; i++) zero_tail = b[i] == 0;
    int llmc_version = version == LLMC_VERSION || version == 2;  // 2: llm.c's uint32 tokens (Llama 3)
    if (!near && !fits && !zero_tail && !(magic == 0 && llmc_version)) return 0;
    char why[256];
    size_t at = 0;
    if (swapped)
        at += (size_t)snprintf(why + at, sizeof why - at, "its magic is byte-swapped (written big-endian?)");
    else if (flips <= 4)
        at += (size_t)snprintf(why + at, sizeof why - at, "its magic is %" PRIu32 ", not %d (%d bit%s differ%s)",
                               magic, LLMC_MAGIC, flips, flips == 1 ? "" : "s", flips == 1 ? "s" : "");
    else
        at += (size_t)snprintf(why + at, sizeof why - at, "its magic is %" PRIu32 ", not %d", magic, LLMC_MAGIC);
    if (llmc_version && at < sizeof why)
        at += (size_t)snprintf(why + at, sizeof why - at, "; its version is %" PRIu32, version);
    if (fits && at < sizeof why)
        at += (size_t)snprintf(why + at, sizeof why - at, "; its count, %" PRIu32 " tokens, fits the file's size",
                               count);
    if (zero_tail && at < sizeof why)
        snprintf(why + at, sizeof why - at, "; the rest of its header is zero");
    return plan_fail(err, errlen, "looks like an llm.c token file with a damaged header: %s. Remake the file, or, "
                "if it really holds raw uint16 tokens, pass --data-format raw", why);
}

/* 0 when a file without llm.c's exact magic may be raw uint16 tokens; else -1 with a
 * message that says what it is. */
static int not_raw(const uint8_t *b, size_t len, char *err, size_t errlen)
{
    if (len >= 6 && !memcmp(b, "\x93NUMPY", 6)) return npy_error(b, len, err, errlen);
    if (damaged_llmc(b, len, err, errlen)) return -1;
    if (is_text(b, len)) return text_error(b, len, err, errlen);
    if (len % 2)
        return plan_fail(err, errlen, "not a token file: neither llm.c's format (magic %d) nor raw uint16 tokens "
                    "(odd size, %zu bytes)", LLMC_MAGIC, len);
    return 0;
}

int rt_tokens_parse_as(const void *buf, size_t len, RtTokenFormat format, RtTokens *out, char *err, size_t errlen)
{
    const uint8_t *b = buf;
    int magic = len >= 4 && le32(b) == LLMC_MAGIC;
    if (len == 0) return plan_fail(err, errlen, "the token file holds no tokens");
    if (format == RT_TOKENS_RAW) {
        if (len % 2)
            return plan_fail(err, errlen, "raw uint16 tokens (--data-format raw) need an even size; this file has %zu "
                        "bytes", len);
        *out = (RtTokens){(const uint16_t *)b, (int64_t)(len / 2), RT_TOKENS_RAW};
    } else if (magic) {
        if (parse_llmc(b, len, out, err, errlen)) return -1;
    } else if (not_raw(b, len, err, errlen)) {
        return -1;
    } else if (format == RT_TOKENS_LLMC) {
        return plan_fail(err, errlen, "not an llm.c token file (--data-format llmc): it starts with %" PRIu32 ", not "
                    "the magic %d; drop --data-format llmc to read raw uint16 tokens", len >= 4 ? le32(b) : 0,
                    LLMC_MAGIC);
    } else {
        *out = (RtTokens){(const uint16_t *)b, (int64_t)(len / 2), RT_TOKENS_RAW};
    }
    if (out->n == 0) return plan_fail(err, errlen, "the token file holds no tokens");
    return 0;
}

int rt_tokens_parse(const void *buf, size_t len, RtTokens *out, char *err, size_t errlen)
{
    return rt_tokens_parse_as(buf, len, RT_TOKENS_AUTO, out, err, errlen);
}

int rt_tokens_check(const RtTokens *t, int64_t vocab, char *err, size_t errlen)
{
    int64_t bad = -1;
    unsigned top = 0;
    for (int64_t i = 0; i < t->n; i++)
        if (t->tok[i] >= vocab) {
            if (bad < 0) bad = i;
            if (t->tok[i] > top) top = t->tok[i];
        }
    if (bad < 0) return 0;
    int64_t offset = (t->format == RT_TOKENS_LLMC ? LLMC_HEADER : 0) + 2 * bad;
    return plan_fail(err, errlen, "token %" PRId64 " is %u, outside the model's vocab of %" PRId64 " (V): byte offset %"
                PRId64 " of the file; its largest token is %u, so it needs a vocab of at least %u (tokens of another "
                "tokenizer?)", bad, (unsigned)t->tok[bad], vocab, offset, top, top + 1);
}

int64_t rt_lm_window_start(RtDataOrder order, uint64_t seed, int64_t step, int64_t B, int64_t b, int64_t T,
                           int64_t n_tok)
{
    uint64_t m = (uint64_t)(n_tok - T - 1);  // the last valid start; the caller ensures > 0
    if (order == RT_ORDER_SEQUENTIAL)
        return (int64_t)((((uint64_t)step - 1) * (uint64_t)B + (uint64_t)b) * (uint64_t)T % m);
    uint32_t ctr[4] = {(uint32_t)step, (uint32_t)((uint64_t)step >> 32), (uint32_t)b, 0}, w[4];
    rt_philox(seed ^ RT_DATA_KEY, ctr, w);
    return (int64_t)(((uint64_t)w[0] << 32 | w[1]) % (m + 1));
}

void rt_lm_rows(const RtTokens *t, RtDataOrder order, uint64_t seed, int64_t step, int64_t B_global, int64_t row0,
                int64_t rows, int64_t T, int32_t *tokens, int32_t *targets)
{
    for (int64_t b = 0; b < rows; b++) {  // either may be NULL: a stage that reads only the other
        const uint16_t *w = t->tok + rt_lm_window_start(order, seed, step, B_global, row0 + b, T, t->n);
        for (int64_t i = 0; i < T && tokens; i++) tokens[b * T + i] = w[i];
        for (int64_t i = 0; i < T && targets; i++) targets[b * T + i] = w[i + 1];
    }
}

void rt_lm_batch(const RtTokens *t, RtDataOrder order, uint64_t seed, int64_t step, int64_t B, int64_t T,
                 int32_t *tokens, int32_t *targets)
{
    rt_lm_rows(t, order, seed, step, B, 0, B, T, tokens, targets);
}

/* ---- Gaussian blobs ----------------------------------------------------------------- */

void rt_blob_centers(uint64_t seed, int64_t K, int64_t D, float *centers)
{
    for (int64_t k = 0; k < K; k++)
        for (int64_t d = 0; d < D; d++) {
            uint32_t ctr[4] = {(uint32_t)k, (uint32_t)d, 0, 0}, w[4];
            rt_philox(seed ^ BLOB_CENTER_KEY, ctr, w);
            centers[k * D + d] = (float)rt_normal(w);
        }
}

void rt_blobs_rows(const float *centers, uint64_t seed, int64_t step, int64_t row0, int64_t rows, int64_t D,
                   int64_t K, float *x, int32_t *y)
{
    uint32_t s0 = (uint32_t)step, s1 = (uint32_t)((uint64_t)step >> 32), w[4];
    for (int64_t b = 0; b < rows; b++) {
        uint32_t row = (uint32_t)(row0 + b);
        rt_philox(seed ^ RT_DATA_KEY, (uint32_t[4]){s0, s1, row, 0}, w);
        int64_t c = (int64_t)(((uint64_t)w[0] << 32 | w[1]) % (uint64_t)K);
        if (y) y[b] = (int32_t)c;  // either may be NULL, as above
        for (int64_t d = 0; d < D && x; d++) {
            rt_philox(seed ^ RT_DATA_KEY, (uint32_t[4]){s0, s1, row, (uint32_t)d + 1}, w);
            x[b * D + d] = centers[c * D + d] + 0.5f * (float)rt_normal(w);
        }
    }
}

void rt_blobs_batch(const float *centers, uint64_t seed, int64_t step, int64_t B, int64_t D, int64_t K, float *x,
                    int32_t *y)
{
    rt_blobs_rows(centers, seed, step, 0, B, D, K, x, y);
}

static int open_file(RtData *d, const char *path, RtTokenFormat format, char *err, size_t errlen)
{
    int64_t size;
    char why[512];
    int fd = plan_open_input(path, &size, why, sizeof why);
    if (fd < 0) return plan_fail(err, errlen, "%s: %s", path, why);
    if (size == 0) {
        close(fd);
        return plan_fail(err, errlen, "%s: empty file", path);
    }
    d->map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (d->map == MAP_FAILED) {
        d->map = NULL;
        return plan_fail(err, errlen, "%s: cannot map the file: %s", path, strerror(e));
    }
    d->map_len = (size_t)size;
    RtTokens t;
    if (rt_tokens_parse_as(d->map, d->map_len, format, &t, why, sizeof why))
        return plan_fail(err, errlen, "%s: %s", path, why);
    d->tok = t.tok, d->n_tok = t.n, d->format = t.format;
    snprintf(d->describe, sizeof d->describe, "%s (%" PRId64 " tokens, %s)", path, t.n,
             t.format == RT_TOKENS_LLMC ? "llm.c format" : "raw uint16");
    return 0;
}

/* The bytes of a regular file of 1 KiB to 256 MiB into d->owned, one token each; 0, or
 * -1 when the file is unusable (err set only when out of memory). */
static int load_text(RtData *d, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (len < 1024 || len > (1L << 28) || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return -1;
    }
    uint8_t *bytes = plan_alloc((size_t)len);
    uint16_t *tok = plan_alloc(sizeof *tok * (size_t)len);
    size_t got = bytes && tok ? fread(bytes, 1, (size_t)len, f) : 0;
    fclose(f);
    if (!bytes || !tok) {
        plan_dealloc(bytes);
        plan_dealloc(tok);
        return plan_fail(err, errlen, "out of memory reading the built-in corpus");
    }
    for (size_t j = 0; j < got; j++) tok[j] = bytes[j];
    plan_dealloc(bytes);
    if (got != (size_t)len) {
        plan_dealloc(tok);
        return -1;
    }
    d->owned = tok, d->tok = tok, d->n_tok = len, d->format = RT_TOKENS_RAW;
    snprintf(d->describe, sizeof d->describe, "built-in corpus: the bytes of %s (%ld tokens)", path, len);
    return 0;
}

/* Any package's copyright file: every Debian package has one. The largest is taken, so
 * the choice does not depend on the order readdir lists them in. */
static int largest_doc(char *path, size_t n)
{
    DIR *dir = opendir("/usr/share/doc");
    if (!dir) return -1;
    off_t best = 0;
    struct dirent *ent;
    while ((ent = readdir(dir))) {
        char p[600];
        struct stat st;
        if (ent->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "/usr/share/doc/%s/copyright", ent->d_name);
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > best && st.st_size <= (1L << 28))
            best = st.st_size, snprintf(path, n, "%s", p);
    }
    closedir(dir);
    return best ? 0 : -1;
}

/* The built-in corpus: the first usable text of CORPUS_PATHS, else a copyright file. */
static int open_builtin(RtData *d, int64_t vocab, char *err, size_t errlen)
{
    if (vocab < 256)
        return plan_fail(err, errlen, "without --data the tokens are bytes (0-255), but this model's vocab V is %" PRId64
                    "; give a token file with --data", vocab);
    err[0] = 0;
    for (size_t i = 0; i < sizeof CORPUS_PATHS / sizeof *CORPUS_PATHS; i++)
        if (!load_text(d, CORPUS_PATHS[i], err, errlen)) return 0;
    char doc[600];
    if (!err[0] && !largest_doc(doc, sizeof doc) && !load_text(d, doc, err, errlen)) return 0;
    if (err[0]) return -1;
    return plan_fail(err, errlen, "no --data file given and no text for the built-in corpus found (tried %s, "
                "/usr/share/dict/words and /usr/share/doc); give a token file with --data", CORPUS_PATHS[0]);
}

/* The vocab a token file's tokens must stay below: rt_plan_vocab, and below every bound
 * an op that tokens or targets reach indexes with (both come from the one stream). */
static int64_t lm_vocab(const Plan *p)
{
    int64_t vocab = rt_plan_vocab(p);
    int32_t in[2], by;
    rt_data_inputs(p, &in[0], &in[1]);
    for (int k = 0; k < 2; k++) {
        int64_t bound = rt_input_bound(p, in[k], &by);
        if (bound > 0 && bound < vocab) vocab = bound;
    }
    return vocab;
}

static int open_lm(RtData *d, const Plan *p, const char *path, RtTokenFormat format, char *err, size_t errlen)
{
    int64_t vocab = lm_vocab(p);
    if (path ? open_file(d, path, format, err, errlen) : open_builtin(d, vocab, err, errlen)) return -1;
    if (d->n_tok < d->T + 2)
        return plan_fail(err, errlen, "%s: %" PRId64 " tokens; a window needs T + 1 = %" PRId64 " and there must be more "
                    "than one", path ? path : "the corpus", d->n_tok, d->T + 1);
    RtTokens t = {d->tok, d->n_tok, d->format};
    char why[512];
    if (rt_tokens_check(&t, vocab, why, sizeof why))
        return plan_fail(err, errlen, "%s: %s", path ? path : "the corpus", why);
    return 0;
}

/* The first data input fsexec cannot feed (ops/feed.c's rule, which fsc warns by), in
 * declaration order: -1 with why; 0 when it can feed them. Inputs with a step role (the
 * step, dropout's rng, a decode position) are the runtime's to write, never the data's. */
static int unfed(const Plan *p, char *err, size_t errlen)
{
    int32_t n = rt_data_input_list(p, NULL, 0);
    for (int32_t i = 0; i < p->n_tensors && n; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (t->role != PLAN_ROLE_INPUT || t->step_role != PLAN_SR_NONE) continue;
        OpType in = {.dtype = (DType)t->dtype, .rank = t->rank};
        for (int32_t k = 0; k < t->rank && k < OPS_MAX_RANK; k++) in.shape[k] = t->shape[k];
        char why[256];
        if (op_input_unfed(&in, why, sizeof why))
            return plan_fail(err, errlen, "input '%s': %s", plan_str(p, t->name), why);
    }
    return 0;
}

static int open_classes(RtData *d, const Plan *p, const char *path, char *err, size_t errlen)
{
    if (path)
        return plan_fail(err, errlen, "--data %s: this model's inputs are f32 [B, D] features and i32 [B] labels: give "
                    "each a .npy file (--data NAME=FILE.npy,NAME=FILE.npy, by the inputs' names), or drop --data to "
                    "train on synthetic Gaussian blobs", path);
    d->K = rt_plan_classes(p);
    if (d->K < 1 || d->K > INT32_MAX) return plan_fail(err, errlen, "the logits have %" PRId64 " classes", d->K);
    d->centers = plan_alloc(sizeof *d->centers * (size_t)(d->K * d->D));
    if (!d->centers) return plan_fail(err, errlen, "out of memory");
    rt_blob_centers(d->seed, d->K, d->D, d->centers);
    snprintf(d->describe, sizeof d->describe, "synthetic Gaussian blobs (%" PRId64 " classes, %" PRId64 " features)",
             d->K, d->D);
    return 0;
}

/* Two data inputs, f32 features [B, ...] of rank 3 or more and i32 labels [B]: a classifier
 * that only .npy files feed (rank 2 features are RT_DATA_CLASSES). */
static int labeled_features(const Plan *p)
{
    int32_t a, b;
    if (rt_data_inputs(p, &a, &b)) return 0;
    const PlanTensor *x = &p->tensors[a], *y = &p->tensors[b];
    return x->dtype == PLAN_DT_F32 && x->rank >= 3 && y->dtype == PLAN_DT_I32 && y->rank == 1 &&
           x->shape[0] == y->shape[0];
}

/* The kind of data, its shapes, vocab and classes come from the whole plan; the buffers
 * from this stage's program, which may read one of the inputs, both, or neither. */
static int setup(RtData *d, const Plan *p, Exec *e, const char *path, RtTokenFormat format, const uint8_t *optional,
                 char *err, size_t errlen)
{
    int32_t a, b, sa, sb;
    d->kind = rt_data_kind(p);
    int arrays = rt_data_names_inputs(p, path);
    if (arrays && unfed(p, err, errlen)) return -1;
    if (d->kind == RT_DATA_NONE && arrays) d->kind = RT_DATA_ARRAYS;
    if (d->kind == RT_DATA_NONE) {
        char shapes[256] = "";
        size_t at = 0;
        for (int32_t i = 0; i < p->n_tensors && at < sizeof shapes; i++) {
            const PlanTensor *t = &p->tensors[i];
            if (t->role != PLAN_ROLE_INPUT || t->step_role != PLAN_SR_NONE) continue;
            at += (size_t)snprintf(shapes + at, sizeof shapes - at, "%s%s %s rank %d", at ? ", " : "",
                                   plan_str(p, t->name), plan_dtype_name(t->dtype), t->rank);
        }
        if (unfed(p, err, errlen)) return -1;
        return plan_fail(err, errlen, "without .npy files this fsexec feeds two kinds of inputs: tokens and targets (i32 [B, "
                    "T] each) or features and labels (f32 [B, D], i32 [B]); this plan's are: %s. Give each input a "
                    ".npy file: --data NAME=FILE.npy,NAME=FILE.npy,... (or --data DIR of NAME.npy files)",
                    at ? shapes : "none");
    }
    int32_t first;
    rt_data_input_list(p, &first, 1);
    const Plan *stage = rt_exec_plan(e);
    const PlanTensor *x = &p->tensors[first];
    d->B = x->shape[0];
    d->row0 = (int64_t)rt_exec_rank(e) * d->B;
    d->B_global = (int64_t)rt_exec_world(e) * d->B;
    d->y_id = d->logits = PLAN_NONE, d->ignore = OPS_NO_IGNORE;
    if (d->kind == RT_DATA_LM) d->T = x->shape[1];  // tokens per sample: the rate counts them
    if (d->kind != RT_DATA_ARRAYS) {
        rt_data_inputs(p, &a, &b);
        rt_stage_inputs(p, stage, &sa, &sb);
        d->x = sa == PLAN_NONE ? NULL : rt_exec_data(e, sa);
        d->y = sb == PLAN_NONE ? NULL : rt_exec_data(e, sb);
        if (!rt_input_ignored(p, b, &d->ignore)) d->ignore = OPS_NO_IGNORE;
    }
    if (d->kind == RT_DATA_CLASSES) {
        d->K = rt_plan_classes(p);
        d->D = x->shape[1];
        d->y_id = sb;
        d->logits = sb == PLAN_NONE ? PLAN_NONE : rt_plan_logits_for(stage, sb);
    } else if (d->kind == RT_DATA_ARRAYS && labeled_features(p)) {
        /* A classifier on .npy features of any rank (images [B, H, W, 3]): the step line's
         * and the evaluation's accuracy read its logits and labels as for [B, D] features. */
        rt_data_inputs(p, &a, &b);
        rt_stage_inputs(p, stage, &sa, &sb);
        if (!rt_input_ignored(p, b, &d->ignore)) d->ignore = OPS_NO_IGNORE;
        d->y_id = sb;
        d->logits = sb == PLAN_NONE ? PLAN_NONE : rt_plan_logits_for(stage, sb);
    }
    if (arrays)
        return (d->arrays = rt_arrays_open(e, path, optional, d->describe, sizeof d->describe, err, errlen)) ? 0 : -1;
    if (d->kind == RT_DATA_LM) return open_lm(d, p, path, format, err, errlen);
    return open_classes(d, p, path, err, errlen);
}

RtData *rt_data_open_for(Exec *e, const char *path, RtTokenFormat format, RtDataOrder order, uint64_t seed,
                         const uint8_t *optional, char *err, size_t errlen)
{
    RtData *d = plan_alloc(sizeof *d);
    if (!d) {
        plan_fail(err, errlen, "out of memory");
        return NULL;
    }
    memset(d, 0, sizeof *d);
    d->order = order, d->seed = seed;
    if (setup(d, rt_exec_whole(e), e, path, format, optional, err, errlen)) {
        rt_data_close(d);
        return NULL;
    }
    return d;
}

RtData *rt_data_open_as(Exec *e, const char *path, RtTokenFormat format, RtDataOrder order, uint64_t seed, char *err,
                        size_t errlen)
{
    return rt_data_open_for(e, path, format, order, seed, NULL, err, errlen);
}

RtData *rt_data_open(Exec *e, const char *path, RtDataOrder order, uint64_t seed, char *err, size_t errlen)
{
    return rt_data_open_as(e, path, RT_TOKENS_AUTO, order, seed, err, errlen);
}

RtData *rt_data_idle(char *err, size_t errlen)
{
    RtData *d = plan_alloc(sizeof *d);
    if (!d) {
        plan_fail(err, errlen, "out of memory");
        return NULL;
    }
    memset(d, 0, sizeof *d);
    d->kind = RT_DATA_NONE, d->y_id = d->logits = PLAN_NONE, d->ignore = OPS_NO_IGNORE;
    snprintf(d->describe, sizeof d->describe, "none (no step runs)");
    return d;
}

void rt_data_fill(RtData *d, int64_t step)
{
    if (d->arrays) {
        rt_arrays_fill(d->arrays, d->order, d->seed, step, d->B_global, d->row0, d->B);
    } else if (!d->x && !d->y) {
        return;  // a stage in the middle of a pipeline
    } else if (d->kind == RT_DATA_LM) {
        RtTokens t = {d->tok, d->n_tok, d->format};
        rt_lm_rows(&t, d->order, d->seed, step, d->B_global, d->row0, d->B, d->T, d->x, d->y);
    } else {
        rt_blobs_rows(d->centers, d->seed, step, d->row0, d->B, d->D, d->K, d->x, d->y);
    }
}

RtDataKind rt_data_get_kind(const RtData *d) { return d->kind; }
const char *rt_data_describe(const RtData *d) { return d->describe; }
int64_t rt_data_items(const RtData *d) { return d->kind == RT_DATA_LM ? d->B_global * d->T : d->B_global; }
int64_t rt_data_rows(const RtData *d) { return d->B_global; }
int64_t rt_data_samples(const RtData *d) { return d->arrays ? rt_arrays_samples(d->arrays) : 0; }
int32_t rt_data_labels(const RtData *d) { return d->y_id; }
int32_t rt_data_logits(const RtData *d) { return d->logits; }
int64_t rt_data_ignore(const RtData *d) { return d->ignore; }

void rt_data_close(RtData *d)
{
    if (!d) return;
    if (d->map) munmap(d->map, d->map_len);
    plan_dealloc(d->owned);
    plan_dealloc(d->centers);
    rt_arrays_free(d->arrays);
    plan_dealloc(d);
}
