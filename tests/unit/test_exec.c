/* tests/unit/test_exec.c: the runtime's executor and what feeds it: parameter init
 * (Philox, slices, statistics), safetensors (round trip, damaged files), token files and
 * batches, small plans built by hand and run on the CPU kernels (attribute binding,
 * views, effect ops, NaN-fill debug mode, training that lowers the loss), samples
 * compiled in-process (frontend, passes, codegen, the plan file) and trained, and a
 * pipeline stage's program run alone (its layout, its share of the data, what binding
 * its sends and collectives checks; tests/mpi/pipeline.c runs stages on MPI).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen.h"
#include "frontend.h"
#include "passes.h"
#include "runtime.h"
#include "sample.h"
#include "tmpdir.h"

/* ---- helpers ---------------------------------------------------------------------- */

static const char *tmp_path(const char *name)
{
    static char buf[4][512];
    static int at;
    char *b = buf[at++ % 4];
    snprintf(b, 512, "%s/%s", tmpdir, name);
    return b;
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

static uint8_t *read_whole(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*len + 1);
    cr_assert_eq(fread(b, 1, *len, f), *len);
    fclose(f);
    return b;
}

/* ---- init: Philox and parameter init ---------------------------------------------- */

Test(init, philox_known_answers)
{
    /* Random123's kat_vectors for philox4x32_10. */
    static const struct {
        uint32_t ctr[4];
        uint64_t key;
        uint32_t out[4];
    } kat[] = {
        {{0, 0, 0, 0}, 0, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, 0xffffffffffffffffull,
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, 0x299f31d0a4093822ull,
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof *kat; i++) {
        uint32_t out[4];
        rt_philox(kat[i].key, kat[i].ctr, out);
        for (int j = 0; j < 4; j++) cr_assert_eq(out[j], kat[i].out[j], "vector %zu word %d: %08x", i, j, out[j]);
    }
}

Test(init, fnv1a_known_values)
{
    cr_assert_eq(rt_fnv1a(""), 0xcbf29ce484222325ull);
    cr_assert_eq(rt_fnv1a("a"), 0xaf63dc4c8601ec8cull);
    cr_assert_eq(rt_fnv1a("foobar"), 0x85944171f73967e8ull);
}

Test(init, slices_equal_the_whole)
{
    enum { N = 10007 };
    static float whole[N], part[N];
    PlanInit kinds[] = {PLAN_INIT_NORMAL, PLAN_INIT_UNIFORM};
    for (int k = 0; k < 2; k++) {
        rt_init_param("h.3.attn.w", 1337, kinds[k], 0.02, 0.5, 0, N, whole);
        int64_t cuts[] = {0, 1, 100, 4999, 5000, 9000, N};
        for (int c = 0; c + 1 < 7; c++)
            rt_init_param("h.3.attn.w", 1337, kinds[k], 0.02, 0.5, cuts[c], cuts[c + 1] - cuts[c], part + cuts[c]);
        cr_assert_eq(memcmp(whole, part, sizeof whole), 0, "kind %d", kinds[k]);
    }
}

Test(init, same_values_whatever_the_thread_count)
{
    enum { N = 200000 };  // above the parallel threshold
    float *a = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N);
    int before = rt_threads();
    rt_set_threads(1);
    rt_init_param("wte", 7, PLAN_INIT_NORMAL, 0.02, 0, 0, N, a);
    rt_set_threads(4);
    rt_init_param("wte", 7, PLAN_INIT_NORMAL, 0.02, 0, 0, N, b);
    rt_set_threads(before);
    cr_assert_eq(memcmp(a, b, sizeof(float) * N), 0);
    free(a);
    free(b);
}

Test(init, known_first_values_are_stable)
{
    /* Pinned: a change here changes every model's initial weights. */
    float n[4], u[4];
    rt_init_param("wte", 1337, PLAN_INIT_NORMAL, 0.02, 0, 0, 4, n);
    rt_init_param("w_in", 1337, PLAN_INIT_UNIFORM, -0.25, 0.25, 0, 4, u);
    static const float want_n[4] = {-0.0262642112f, -0.00525789708f, 0.0121277859f, 0.0163012184f};
    static const float want_u[4] = {0.17411603f, -0.173741892f, -0.0501994826f, 0.0153646711f};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(n[i], want_n[i], "normal[%d] = %.9g", i, n[i]);
        cr_assert_eq(u[i], want_u[i], "uniform[%d] = %.9g", i, u[i]);
    }
}

Test(init, normal_statistics)
{
    enum { N = 100000 };
    float *x = malloc(sizeof(float) * N);
    rt_init_param("h.0.mlp.fc.w", 42, PLAN_INIT_NORMAL, 0.02, 0, 0, N, x);
    double s = 0, ss = 0;
    for (int i = 0; i < N; i++) s += x[i], ss += (double)x[i] * x[i];
    double mean = s / N, std = sqrt(ss / N - mean * mean);
    cr_assert_lt(fabs(mean), 3e-4, "mean %g", mean);  // 5 standard errors (0.02 / sqrt(1e5))
    cr_assert_lt(fabs(std - 0.02), 0.02 * 0.015, "std %g", std);
    free(x);
}

Test(init, uniform_range_and_mean)
{
    enum { N = 100000 };
    float *x = malloc(sizeof(float) * N);
    rt_init_param("w_in", 3, PLAN_INIT_UNIFORM, -0.25, 0.25, 0, N, x);
    double s = 0, lo = 1, hi = -1;
    for (int i = 0; i < N; i++) {
        s += x[i];
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    cr_assert(lo >= -0.25 && hi <= 0.25 && lo < -0.249 && hi > 0.249, "range [%g, %g]", lo, hi);
    cr_assert_lt(fabs(s / N), 0.003);
    free(x);
}

Test(init, names_seeds_and_constants)
{
    float a[8], b[8], c[8], z[8], o[8];
    rt_init_param("h.0.w", 1, PLAN_INIT_NORMAL, 1, 0, 0, 8, a);
    rt_init_param("h.1.w", 1, PLAN_INIT_NORMAL, 1, 0, 0, 8, b);
    rt_init_param("h.0.w", 2, PLAN_INIT_NORMAL, 1, 0, 0, 8, c);
    rt_init_param("z", 1, PLAN_INIT_ZEROS, 0, 0, 0, 8, z);
    rt_init_param("o", 1, PLAN_INIT_ONES, 0, 0, 0, 8, o);
    cr_assert_neq(memcmp(a, b, sizeof a), 0);
    cr_assert_neq(memcmp(a, c, sizeof a), 0);
    for (int i = 0; i < 8; i++) cr_assert(z[i] == 0 && o[i] == 1);
}

/* ---- safetensors --------------------------------------------------------------------- */

static float st_a[6] = {1, 2, 3, 4, 5, 6};
static int32_t st_b[4] = {-1, 0, 7, 1 << 30};
static float st_c[1] = {3.5f};
static const int64_t shape_a[] = {2, 3}, shape_b[] = {4};

static void entries(StEntry *t, float *a, int32_t *b, float *c)
{
    t[0] = (StEntry){"h.0.attn.w", PLAN_DT_F32, 2, shape_a, a};
    t[1] = (StEntry){"idx", PLAN_DT_I32, 1, shape_b, b};
    t[2] = (StEntry){"scale", PLAN_DT_F32, 0, NULL, c};
}

Test(safetensors, round_trip_and_layout, .init = make_tmpdir, .fini = remove_tmpdir)
{
    StEntry t[3];
    char err[512];
    entries(t, st_a, st_b, st_c);
    const char *path = tmp_path("w.safetensors");
    cr_assert_eq(rt_st_write(path, t, 3, 7, err, sizeof err), 0, "%s", err);

    size_t len;
    uint8_t *b = read_whole(path, &len);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)b[i] << (8 * i);
    cr_assert_eq(n % 8, 0, "header length %llu", (unsigned long long)n);
    cr_assert_eq(len, 8 + n + 24 + 16 + 4);
    cr_assert_eq(b[8], '{');
    char *hdr = strndup((char *)b + 8, n);
    cr_assert_not_null(strstr(hdr, "\"__metadata__\":{\"format\":\"pt\",\"step\":\"7\"}"), "%s", hdr);
    cr_assert_not_null(strstr(hdr, "\"h.0.attn.w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}"), "%s",
                       hdr);
    cr_assert_not_null(strstr(hdr, "\"scale\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[40,44]}"), "%s", hdr);
    cr_assert_eq(memcmp(b + 8 + n, st_a, 24), 0);
    free(hdr);
    free(b);

    float a[6] = {0}, c[1] = {0};
    int32_t ib[4] = {0};
    entries(t, a, ib, c);
    cr_assert_eq(rt_st_read(path, t, 3, err, sizeof err), 0, "%s", err);
    cr_assert_eq(memcmp(a, st_a, sizeof a), 0);
    cr_assert_eq(memcmp(ib, st_b, sizeof ib), 0);
    cr_assert_eq(c[0], 3.5f);

    /* Overwriting replaces the file and leaves no temporary behind. */
    cr_assert_eq(rt_st_write(path, t, 3, 8, err, sizeof err), 0, "%s", err);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "test $(ls '%s' | grep -c '[.]tmp[.]') -eq 0", tmpdir);
    cr_assert_eq(system(cmd), 0, "a temporary file was left behind");
}

Test(safetensors, write_errors_leave_nothing, .init = make_tmpdir, .fini = remove_tmpdir)
{
    StEntry t[3];
    char err[512];
    entries(t, st_a, st_b, st_c);
    cr_assert_eq(rt_st_write(tmp_path("no/such/dir/w.safetensors"), t, 3, 1, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "No such file or directory"), "%s", err);
}

/* A file from a header text and `data` bytes of data (0, 1, 2, ...). */
static void write_st(const char *path, const char *header, size_t data)
{
    size_t hl = strlen(header), len = 8 + hl + data;
    uint8_t *b = calloc(1, len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    for (size_t i = 0; i < data; i++) b[8 + hl + i] = (uint8_t)i;
    write_file(path, b, len);
    free(b);
}

static void expect_read_error(const char *file_header, size_t data, const char *want)
{
    const char *path = tmp_path("bad.safetensors");
    write_st(path, file_header, data);
    float a[6] = {9, 9, 9, 9, 9, 9}, c[1] = {9};
    int32_t b[4] = {9, 9, 9, 9};
    StEntry t[3];
    char err[512] = "";
    entries(t, a, b, c);
    cr_assert_eq(rt_st_read(path, t, 3, err, sizeof err), -1, "no error for: %s", file_header);
    cr_assert_not_null(strstr(err, want), "for %s: got '%s', want '%s'", file_header, err, want);
    for (int i = 0; i < 6; i++) cr_assert_eq(a[i], 9, "the arena was written before the checks passed");
    cr_assert_eq(b[0], 9);
}

/* The tensor "h.0.attn.w" with these header fields, and the two others as written. */
#define A_(dtype, shape, offsets) "\"h.0.attn.w\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":" offsets "}"
#define A_OK A_("F32", "[2,3]", "[0,24]")
#define B_OK "\"idx\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[24,40]}"
#define C_OK "\"scale\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[40,44]}"
#define BC "," B_OK "," C_OK "}"

Test(safetensors, damaged_files, .init = make_tmpdir, .fini = remove_tmpdir)
{
    char err[512];
    StEntry t[3];
    entries(t, st_a, st_b, st_c);
    /* The good file reads. */
    write_st(tmp_path("good.safetensors"), "{" A_OK BC, 44);
    cr_assert_eq(rt_st_read(tmp_path("good.safetensors"), t, 3, err, sizeof err), 0, "%s", err);

    expect_read_error("{" A_OK BC, 40, "past the 40 bytes of data");
    expect_read_error("{" A_OK BC, 48, "cover 44 of the 48 bytes");
    expect_read_error("{" A_OK "," B_OK "," C_OK, 44, "not valid JSON");
    expect_read_error("[1, 2]", 44, "not a JSON object");
    expect_read_error("{" A_OK "," B_OK "}", 40, "no tensor 'scale'");
    expect_read_error("{" A_OK "," B_OK "," C_OK ",\"extra\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[44,48]}}", 48,
                      "'extra' is not in the model");
    expect_read_error("{" A_("F32", "[3,2]", "[0,24]") BC, 44, "is F32 [3, 2] in the file but F32 [2, 3] in the model");
    expect_read_error("{" A_("F64", "[3]", "[0,24]") BC, 44, "dtype F64");
    expect_read_error("{" A_("F32", "[2,-3]", "[0,24]") BC, 44, "non-negative");
    expect_read_error("{" A_("F32", "[2,3]", "[0,20]") BC, 44, "20 bytes of data for a shape that needs 24");
    expect_read_error("{" A_("F32", "[2,3]", "[4,28]") BC, 44, "expected 0");
    expect_read_error("{" A_("F32", "[2,3]", "[0]") BC, 44, "data_offsets");
    expect_read_error("{" A_("F32", "[2,3]", "[24,0]") BC, 44, "begin <= end");
    expect_read_error("{" A_("F32", "\"2x3\"", "[0,24]") BC, 44, "needs \"dtype\"");
    expect_read_error("{\"h.0.attn.w\":{\"dtype\":\"F32\",\"shape\":[2,3]}" BC, 44, "data_offsets");
    expect_read_error("{" A_("F32", "[4611686018427387904,4]", "[0,24]") BC, 44, "larger than the file");
    expect_read_error("{" A_OK "," A_OK BC, 44, "duplicate");
    expect_read_error("{\"__metadata__\":[1]," A_OK BC, 44, "__metadata__");
    expect_read_error("{\"__metadata__\":{\"step\":1}," A_OK BC, 44, "__metadata__ 'step' is not a string");

    /* Sizes that do not add up. */
    uint8_t small[5] = {1, 2, 3, 4, 5};
    write_file(tmp_path("tiny"), small, sizeof small);
    cr_assert_eq(rt_st_read(tmp_path("tiny"), t, 3, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "too short"), "%s", err);
    uint8_t big[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    write_file(tmp_path("big"), big, sizeof big);
    cr_assert_eq(rt_st_read(tmp_path("big"), t, 3, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "truncated, or not a safetensors file"), "%s", err);
    cr_assert_eq(rt_st_read(tmp_path("missing"), t, 3, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "No such file"), "%s", err);
}

/* Every prefix of a good file is an error, never a crash. */
Test(safetensors, every_truncation_is_an_error, .init = make_tmpdir, .fini = remove_tmpdir)
{
    StEntry t[3];
    char err[512];
    float a[6], c[1];
    int32_t b[4];
    entries(t, st_a, st_b, st_c);
    const char *path = tmp_path("w.safetensors"), *cut = tmp_path("cut.safetensors");
    cr_assert_eq(rt_st_write(path, t, 3, 1, err, sizeof err), 0);
    size_t len;
    uint8_t *whole = read_whole(path, &len);
    entries(t, a, b, c);
    for (size_t n = 0; n < len; n++) {
        write_file(cut, whole, n);
        cr_assert_eq(rt_st_read(cut, t, 3, err, sizeof err), -1, "prefix of %zu bytes", n);
    }
    free(whole);
}

/* ---- token files and batches ----------------------------------------------------------- */

static size_t llmc_file(uint8_t *buf, int32_t magic, int32_t version, int32_t count, const uint16_t *tok, int n)
{
    memset(buf, 0, 1024);
    int32_t h[3] = {magic, version, count};
    memcpy(buf, h, sizeof h);
    memcpy(buf + 1024, tok, sizeof *tok * (size_t)n);
    return 1024 + 2 * (size_t)n;
}

Test(data, token_file_formats)
{
    static uint8_t buf[1024 + 64];
    uint16_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 65535};
    RtTokens t;
    char err[512];
    size_t len = llmc_file(buf, 20240520, 1, 8, tok, 8);
    cr_assert_eq(rt_tokens_parse(buf, len, &t, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.n, 8);
    cr_assert_eq(t.format, RT_TOKENS_LLMC);
    cr_assert_eq(t.tok[7], 65535);

    llmc_file(buf, 20240520, 2, 8, tok, 8);
    cr_assert_eq(rt_tokens_parse(buf, len, &t, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "version 2"), "%s", err);
    llmc_file(buf, 20240520, 1, 9, tok, 8);
    cr_assert_eq(rt_tokens_parse(buf, len, &t, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "says 9 tokens"), "%s", err);
    llmc_file(buf, 20240520, 1, 8, tok, 8);
    cr_assert_eq(rt_tokens_parse(buf, len - 2, &t, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "truncated"), "%s", err);

    /* Another magic, with llm.c's version, count and zeroed header: a damaged llm.c file,
     * raw uint16 tokens (the header included) only when asked for. */
    llmc_file(buf, 12345, 1, 8, tok, 8);
    cr_assert_eq(rt_tokens_parse(buf, len, &t, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "damaged header"), "%s", err);
    cr_assert_eq(rt_tokens_parse_as(buf, len, RT_TOKENS_RAW, &t, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.format, RT_TOKENS_RAW);
    cr_assert_eq(t.n, (int64_t)len / 2);
    cr_assert_eq(rt_tokens_parse(tok, 8 * 2, &t, err, sizeof err), 0);
    cr_assert_eq(t.n, 8);
    cr_assert_eq(rt_tokens_parse(tok, 15, &t, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "odd size"), "%s", err);
    cr_assert_eq(rt_tokens_parse(tok, 0, &t, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "no tokens"), "%s", err);

    RtTokens v = {tok, 8, RT_TOKENS_RAW};
    cr_assert_eq(rt_tokens_check(&v, 65536, err, sizeof err), 0);
    cr_assert_eq(rt_tokens_check(&v, 50257, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "token 7 is 65535, outside the model's vocab of 50257"), "%s", err);
}

Test(data, sequential_windows)
{
    enum { N = 1000, B = 3, T = 16 };
    uint16_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)(i * 7 % 1000);
    RtTokens t = {tok, N, RT_TOKENS_RAW};
    int32_t x[B * T], y[B * T];
    for (int64_t s = 1; s <= 40; s++) {
        rt_lm_batch(&t, RT_ORDER_SEQUENTIAL, 5, s, B, T, x, y);
        for (int b = 0; b < B; b++) {
            int64_t start = ((s - 1) * B + b) * T % (N - T - 1);
            for (int i = 0; i < T; i++) {
                cr_assert_eq(x[b * T + i], tok[start + i]);
                cr_assert_eq(y[b * T + i], tok[start + i + 1]);
            }
        }
    }
}

Test(data, random_windows_are_deterministic)
{
    enum { N = 500, B = 4, T = 8 };
    uint16_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)i;
    RtTokens t = {tok, N, RT_TOKENS_RAW};
    int32_t x1[B * T], y1[B * T], x2[B * T], y2[B * T];
    int64_t lo = N, hi = -1;
    for (int64_t s = 1; s <= 200; s++) {
        rt_lm_batch(&t, RT_ORDER_RANDOM, 9, s, B, T, x1, y1);
        rt_lm_batch(&t, RT_ORDER_RANDOM, 9, s, B, T, x2, y2);
        cr_assert_eq(memcmp(x1, x2, sizeof x1), 0);
        for (int b = 0; b < B; b++) {
            int64_t start = x1[b * T];  // tok[i] == i
            lo = start < lo ? start : lo;
            hi = start > hi ? start : hi;
            cr_assert(start >= 0 && start <= N - T - 1);
            for (int i = 0; i < T; i++) cr_assert_eq(y1[b * T + i], x1[b * T + i] + 1);
        }
    }
    cr_assert_lt(lo, 20);
    cr_assert_gt(hi, N - T - 30);
    rt_lm_batch(&t, RT_ORDER_RANDOM, 10, 1, B, T, x2, y2);
    rt_lm_batch(&t, RT_ORDER_RANDOM, 9, 1, B, T, x1, y1);
    cr_assert_neq(memcmp(x1, x2, sizeof x1), 0, "the seed changes the windows");
}

Test(data, blobs_are_deterministic_and_separable)
{
    enum { B = 64, D = 16, K = 4 };
    float c1[K * D], c2[K * D], x[B * D], x2[B * D];
    int32_t y[B], y2[B];
    rt_blob_centers(3, K, D, c1);
    rt_blob_centers(3, K, D, c2);
    cr_assert_eq(memcmp(c1, c2, sizeof c1), 0);
    rt_blobs_batch(c1, 3, 5, B, D, K, x, y);
    rt_blobs_batch(c1, 3, 5, B, D, K, x2, y2);
    cr_assert_eq(memcmp(x, x2, sizeof x), 0);
    int seen[K] = {0}, nearest_right = 0;
    for (int b = 0; b < B; b++) {
        cr_assert(y[b] >= 0 && y[b] < K);
        seen[y[b]] = 1;
        int best = 0;
        double bd = INFINITY;
        for (int k = 0; k < K; k++) {
            double d = 0;
            for (int j = 0; j < D; j++) d += (x[b * D + j] - c1[k * D + j]) * (x[b * D + j] - c1[k * D + j]);
            if (d < bd) bd = d, best = k;
        }
        nearest_right += best == y[b];
    }
    for (int k = 0; k < K; k++) cr_assert(seen[k], "class %d never drawn", k);
    cr_assert_geq(nearest_right, B - 2);
    rt_blobs_batch(c1, 3, 6, B, D, K, x2, y2);
    cr_assert_neq(memcmp(x, x2, sizeof x), 0);
}

/* ---- plans built by hand ------------------------------------------------------------- */

static int32_t add_tensor(Plan *p, const char *name, PlanDType dt, PlanRole role, int rank, const int64_t *shape,
                          PlanInit init, double a, double b)
{
    PlanTensor t = {.name = name ? plan_intern(p, name) : PLAN_NONE, .dtype = dt, .role = role, .init = init,
                    .rank = rank, .block = PLAN_NONE, .producer = PLAN_NONE, .tied_to = PLAN_NONE,
                    .init_a = a, .init_b = b, .alias = PLAN_NONE};
    for (int d = 0; d < rank; d++) t.shape[d] = shape[d];
    int32_t id = plan_tensor_add(p, &t);
    cr_assert_geq(id, 0);
    return id;
}

static int32_t act(Plan *p, const char *name, PlanDType dt, int rank, const int64_t *shape)
{
    return add_tensor(p, name, dt, PLAN_ROLE_ACT, rank, shape, PLAN_INIT_NONE, 0, 0);
}

typedef struct {
    const char *key;
    PlanAttrKind kind;
    double v;
    const int64_t *list;
    int n_list;
} A;

static int32_t add_op(Plan *p, const char *name, PlanPhase ph, const int32_t *in, int n_in, const int32_t *out,
                      int n_out, const A *attrs, int n_attr)
{
    PlanOp op = {.op = plan_intern(p, name), .block = PLAN_NONE, .phase = ph, .in = p->n_ids, .n_in = n_in};
    for (int i = 0; i < n_in; i++) plan_id_add(p, in[i]);
    op.out = p->n_ids, op.n_out = n_out;
    for (int i = 0; i < n_out; i++) plan_id_add(p, out[i]);
    op.attr = p->n_attrs, op.n_attr = n_attr;
    for (int i = 0; i < n_attr; i++) {
        PlanAttr a = {.key = plan_intern(p, attrs[i].key), .kind = attrs[i].kind};
        if (a.kind == PLAN_ATTR_INT) a.i = (int64_t)attrs[i].v;
        if (a.kind == PLAN_ATTR_FLOAT) a.f = attrs[i].v;
        if (a.kind == PLAN_ATTR_INTS) {
            a.list = p->n_ints, a.n_list = attrs[i].n_list;
            for (int j = 0; j < attrs[i].n_list; j++) plan_int_add(p, attrs[i].list[j]);
        }
        plan_attr_add(p, &a);
    }
    int32_t id = plan_op_add(p, &op);
    cr_assert_geq(id, 0);
    for (int i = 0; i < n_out; i++) p->tensors[out[i]].producer = id;
    return id;
}

static int persistent_role(PlanRole r)
{
    return r == PLAN_ROLE_PARAM || r == PLAN_ROLE_OPT_STATE || r == PLAN_ROLE_MASTER || r == PLAN_ROLE_INPUT;
}

/* A simple memory plan: every root its own 64-aligned bytes (views share their input's),
 * live ranges as memplan computes them. */
static void memplan(Plan *p)
{
    int32_t n = p->n_tensors;
    int32_t *start = calloc((size_t)n, sizeof *start), *end = calloc((size_t)n, sizeof *end);
    for (int32_t k = 0; k < p->n_ops; k++) {
        const PlanOp *op = &p->ops[k];
        if (strcmp(plan_str(p, op->op), "reshape")) continue;
        int32_t root = p->ids[op->in];
        while (p->tensors[root].alias != PLAN_NONE) root = p->tensors[root].alias;
        p->tensors[p->ids[op->out]].alias = root;
    }
    for (int32_t i = 0; i < n; i++) start[i] = end[i] = p->tensors[i].producer >= 0 ? p->tensors[i].producer : 0;
    for (int32_t k = 0; k < p->n_ops; k++)
        for (int32_t j = 0; j < p->ops[k].n_in; j++) end[p->ids[p->ops[k].in + j]] = k;
    for (int32_t i = 0; i < p->n_outputs; i++) end[p->outputs[i]] = p->n_ops;
    for (int32_t i = 0; i < n; i++)
        if (persistent_role(p->tensors[i].role)) start[i] = 0, end[i] = p->n_ops;
    for (int32_t i = 0; i < n; i++) {
        int32_t r = p->tensors[i].alias;
        if (r == PLAN_NONE) continue;
        if (start[i] < start[r]) start[r] = start[i];
        if (end[i] > end[r]) end[r] = end[i];
    }
    int64_t top = 0;
    for (int32_t i = 0; i < n; i++) {
        PlanTensor *t = &p->tensors[i];
        if (t->alias != PLAN_NONE) continue;
        t->offset = top, t->live_start = start[i], t->live_end = end[i];
        top += (plan_tensor_nbytes(t) + 63) / 64 * 64;
    }
    for (int32_t i = 0; i < n; i++) {
        PlanTensor *t = &p->tensors[i];
        if (t->alias == PLAN_NONE) continue;
        t->offset = p->tensors[t->alias].offset;
        t->live_start = p->tensors[t->alias].live_start, t->live_end = p->tensors[t->alias].live_end;
    }
    plan_set_one_program(p, (int32_t)plan_meta_int(p, "world", 1), top, 0);
    free(start);
    free(end);
}

/* A linear classifier trained by SGD: logits = x @ w + b, loss = cross_entropy(logits, y).
 * B = 32, D = 8, K = 3. */
enum { LB = 32, LD = 8, LK = 3 };

static Plan *classifier_plan(double lr)
{
    Plan *p = plan_new();
    plan_meta_set_str(p, "model", "linear");
    int64_t sx[] = {LB, LD}, sy[] = {LB}, sw[] = {LD, LK}, sb[] = {LK}, sl[] = {LB, LK}, flat[] = {LB * LK};
    int32_t x = add_tensor(p, "x", PLAN_DT_F32, PLAN_ROLE_INPUT, 2, sx, PLAN_INIT_NONE, 0, 0);
    int32_t y = add_tensor(p, "y", PLAN_DT_I32, PLAN_ROLE_INPUT, 1, sy, PLAN_INIT_NONE, 0, 0);
    int32_t w = add_tensor(p, "w", PLAN_DT_F32, PLAN_ROLE_PARAM, 2, sw, PLAN_INIT_NORMAL, 0.1, 0);
    int32_t b = add_tensor(p, "b", PLAN_DT_F32, PLAN_ROLE_PARAM, 1, sb, PLAN_INIT_UNIFORM, -0.1, 0.1);
    int32_t step = add_tensor(p, "step", PLAN_DT_I32, PLAN_ROLE_INPUT, 0, NULL, PLAN_INIT_NONE, 0, 0);
    int32_t bufw = add_tensor(p, "w.momentum_buffer", PLAN_DT_F32, PLAN_ROLE_OPT_STATE, 2, sw, PLAN_INIT_ZEROS, 0, 0);
    int32_t bufb = add_tensor(p, "b.momentum_buffer", PLAN_DT_F32, PLAN_ROLE_OPT_STATE, 1, sb, PLAN_INIT_ZEROS, 0, 0);
    /* forward */
    int32_t xw = act(p, NULL, PLAN_DT_F32, 2, sl), logits = act(p, "logits", PLAN_DT_F32, 2, sl);
    int32_t loss = act(p, "loss", PLAN_DT_F32, 0, NULL);
    add_op(p, "matmul", PLAN_PHASE_FORWARD, (int32_t[]){x, w}, 2, &xw, 1, NULL, 0);
    add_op(p, "add", PLAN_PHASE_FORWARD, (int32_t[]){xw, b}, 2, &logits, 1, NULL, 0);
    int32_t terms = act(p, NULL, PLAN_DT_F32, 2, (int64_t[]){sl[0], 2});
    add_op(p, "cross_entropy", PLAN_PHASE_FORWARD, (int32_t[]){logits, y}, 2, (int32_t[]){loss, terms}, 2, NULL, 0);
    /* backward: dlogits, then a reshape view and back, to exercise views */
    int32_t one = add_tensor(p, NULL, PLAN_DT_F32, PLAN_ROLE_CONST, 0, NULL, PLAN_INIT_NONE, 0, 0);
    int32_t dl = act(p, NULL, PLAN_DT_F32, 2, sl), dflat = act(p, NULL, PLAN_DT_F32, 1, flat);
    int32_t dl2 = act(p, NULL, PLAN_DT_F32, 2, sl);
    int32_t gw = add_tensor(p, "w.grad", PLAN_DT_F32, PLAN_ROLE_GRAD, 2, sw, PLAN_INIT_NONE, 0, 0);
    int32_t gb = add_tensor(p, "b.grad", PLAN_DT_F32, PLAN_ROLE_GRAD, 1, sb, PLAN_INIT_NONE, 0, 0);
    add_op(p, "scalar", PLAN_PHASE_BACKWARD, NULL, 0, &one, 1, (A[]){{"value", PLAN_ATTR_FLOAT, 1.0, NULL, 0}}, 1);
    add_op(p, "cross_entropy_bwd", PLAN_PHASE_BACKWARD, (int32_t[]){logits, y, one}, 3, &dl, 1, NULL, 0);
    add_op(p, "reshape", PLAN_PHASE_BACKWARD, &dl, 1, &dflat, 1, (A[]){{"shape", PLAN_ATTR_INTS, 0, flat, 1}}, 1);
    add_op(p, "reshape", PLAN_PHASE_BACKWARD, &dflat, 1, &dl2, 1, (A[]){{"shape", PLAN_ATTR_INTS, 0, sl, 2}}, 1);
    add_op(p, "matmul", PLAN_PHASE_BACKWARD, (int32_t[]){x, dl2}, 2, &gw, 1, (A[]){{"ta", PLAN_ATTR_INT, 1, NULL, 0}},
           1);
    add_op(p, "sum_to", PLAN_PHASE_BACKWARD, &dl2, 1, &gb, 1, (A[]){{"shape", PLAN_ATTR_INTS, 0, sb, 1}}, 1);
    /* optimizer */
    /* The norm as the optimizer pass makes it: a sumsq_parts per gradient (one part each,
     * both under OPS_SUMSQ_CHUNK elements), then one sum_parts over the parts in order. */
    int32_t lrt = act(p, "lr", PLAN_DT_F32, 0, NULL), s1 = act(p, NULL, PLAN_DT_F32, 1, (int64_t[]){1});
    int32_t s2 = act(p, NULL, PLAN_DT_F32, 1, (int64_t[]){1}), ss = act(p, NULL, PLAN_DT_F32, 0, NULL);
    int32_t norm = act(p, "grad_norm", PLAN_DT_F32, 0, NULL), coef = act(p, NULL, PLAN_DT_F32, 0, NULL);
    add_op(p, "lr_at", PLAN_PHASE_OPTIMIZER, &step, 1, &lrt, 1,
           (A[]){{"lr", PLAN_ATTR_FLOAT, lr, NULL, 0}, {"schedule", PLAN_ATTR_INT, 0, NULL, 0},
                 {"warmup", PLAN_ATTR_INT, 0, NULL, 0}, {"steps", PLAN_ATTR_INT, 100, NULL, 0},
                 {"min_lr", PLAN_ATTR_FLOAT, 0, NULL, 0}},
           5);
    add_op(p, "sumsq_parts", PLAN_PHASE_OPTIMIZER, &gw, 1, &s1, 1, NULL, 0);
    add_op(p, "sumsq_parts", PLAN_PHASE_OPTIMIZER, &gb, 1, &s2, 1, NULL, 0);
    add_op(p, "sum_parts", PLAN_PHASE_OPTIMIZER, (int32_t[]){s1, s2}, 2, &ss, 1, NULL, 0);
    add_op(p, "sqrt", PLAN_PHASE_OPTIMIZER, &ss, 1, &norm, 1, NULL, 0);
    add_op(p, "clip_coef", PLAN_PHASE_OPTIMIZER, &norm, 1, &coef, 1, (A[]){{"max_norm", PLAN_ATTR_FLOAT, 0, NULL, 0}},
           1);
    A sgd_attrs[] = {{"momentum", PLAN_ATTR_FLOAT, 0.9, NULL, 0}, {"weight_decay", PLAN_ATTR_FLOAT, 0, NULL, 0}};
    add_op(p, "sgd", PLAN_PHASE_OPTIMIZER, (int32_t[]){w, gw, bufw, lrt, coef, step}, 6, NULL, 0, sgd_attrs, 2);
    add_op(p, "sgd", PLAN_PHASE_OPTIMIZER, (int32_t[]){b, gb, bufb, lrt, coef, step}, 6, NULL, 0, sgd_attrs, 2);
    plan_output_add(p, loss);
    plan_output_add(p, logits);
    plan_output_add(p, lrt);
    plan_output_add(p, norm);
    p->tensors[step].step_role = PLAN_SR_STEP, p->tensors[loss].step_role = PLAN_SR_LOSS;
    p->tensors[lrt].step_role = PLAN_SR_LR, p->tensors[norm].step_role = PLAN_SR_GRAD_NORM;
    memplan(p);
    return p;
}

static float scalar(Exec *e, const char *name)
{
    RtTensor t;
    cr_assert_eq(rt_exec_tensor(e, name, &t), 0, "no tensor %s", name);
    return *(float *)t.data;
}

/* Losses of `steps` steps on blobs; accuracy of the last one in *acc. */
static void train(Plan *p, int nan_fill, int steps, float *losses, double *acc)
{
    char err[512];
    Exec *e = rt_exec_new(p, &(ExecOptions){.seed = 11, .nan_fill = nan_fill}, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    RtData *d = rt_data_open(e, NULL, RT_ORDER_RANDOM, 11, err, sizeof err);
    cr_assert_not_null(d, "%s", err);
    cr_assert_eq(rt_data_get_kind(d), RT_DATA_CLASSES);
    cr_assert_not_null(strstr(rt_data_describe(d), "3 classes"), "%s", rt_data_describe(d));
    RtTensor lt, yt;
    rt_exec_tensor(e, "logits", &lt);
    rt_exec_tensor(e, "y", &yt);
    for (int s = 1; s <= steps; s++) {
        rt_data_fill(d, s);
        cr_assert_eq(rt_exec_run(e, s, RT_PHASES_ALL), 0);
        losses[s - 1] = scalar(e, "loss");
        if (acc) *acc = rt_accuracy(lt.data, yt.data, LB, LK);
    }
    rt_data_close(d);
    rt_exec_free(e);
}

Test(exec, trains_a_hand_built_classifier)
{
    Plan *p = classifier_plan(0.1);
    float losses[60];
    double acc;
    train(p, 0, 60, losses, &acc);
    for (int s = 0; s < 60; s++) cr_assert(isfinite(losses[s]), "step %d: %g", s + 1, losses[s]);
    cr_assert_lt(losses[59], losses[0] * 0.5, "loss %g -> %g", losses[0], losses[59]);
    cr_assert_geq(acc, 0.9, "accuracy %g", acc);
    plan_free(p);
}

Test(exec, nan_fill_changes_nothing_in_a_correct_plan)
{
    Plan *p = classifier_plan(0.1);
    float a[20], b[20];
    train(p, 0, 20, a, NULL);
    train(p, 1, 20, b, NULL);
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
    plan_free(p);
}

Test(exec, nan_fill_exposes_a_buffer_freed_too_early)
{
    Plan *p = classifier_plan(0.1);
    /* dl's last reader is the gradient matmul (through two views); claim it dies at its
     * producer instead. */
    int32_t dl = -1;
    for (int32_t k = 0; k < p->n_ops; k++)
        if (!strcmp(plan_str(p, p->ops[k].op), "cross_entropy_bwd")) dl = p->ids[p->ops[k].out];
    p->tensors[dl].live_end = p->tensors[dl].live_start;
    float ok[3], bad[3];
    train(p, 0, 3, ok, NULL);
    cr_assert(isfinite(ok[2]));
    train(p, 1, 3, bad, NULL);
    cr_assert(isfinite(bad[0]), "step 1's forward is before the bug");
    cr_assert(isnan(bad[1]), "step 2 sees weights updated with NaN: %g", bad[1]);
    plan_free(p);
}

Test(exec, split_run_and_save_grads, .init = make_tmpdir, .fini = remove_tmpdir)
{
    Plan *p = classifier_plan(0.1);
    char err[512];
    Exec *e = rt_exec_new(p, &(ExecOptions){.seed = 1}, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    RtData *d = rt_data_open(e, NULL, RT_ORDER_RANDOM, 1, err, sizeof err);
    cr_assert_not_null(d, "%s", err);
    rt_data_fill(d, 1);
    int32_t split = rt_exec_first_op(e, PLAN_PHASE_OPTIMIZER);
    cr_assert_eq(strcmp(plan_str(p, p->ops[split].op), "lr_at"), 0);
    rt_exec_run_ops(e, 1, 0, split, RT_PHASES_ALL);
    cr_assert_eq(rt_save_grads(e, tmp_path("g.safetensors"), 1, err, sizeof err), 0, "%s", err);
    RtTensor gw, w;
    rt_exec_tensor(e, "w.grad", &gw);
    rt_exec_tensor(e, "w", &w);
    float want[LD * LK], before[LD * LK], got[LD * LK];
    memcpy(want, gw.data, sizeof want);
    memcpy(before, w.data, sizeof before);
    rt_exec_run_ops(e, 1, split, p->n_ops, RT_PHASES_ALL);
    cr_assert_neq(memcmp(before, w.data, sizeof before), 0, "the optimizer ran");
    /* Saved under the param's name. */
    float gb[LK];
    StEntry t[2] = {{"w", PLAN_DT_F32, 2, (int64_t[]){LD, LK}, got}, {"b", PLAN_DT_F32, 1, (int64_t[]){LK}, gb}};
    cr_assert_eq(rt_st_read(tmp_path("g.safetensors"), t, 2, err, sizeof err), 0, "%s", err);
    cr_assert_eq(memcmp(got, want, sizeof got), 0);
    rt_data_close(d);
    rt_exec_free(e);
    plan_free(p);
}

Test(exec, weights_round_trip, .init = make_tmpdir, .fini = remove_tmpdir)
{
    Plan *p = classifier_plan(0.1);
    char err[512];
    Exec *a = rt_exec_new(p, &(ExecOptions){.seed = 1}, err, sizeof err);
    Exec *b = rt_exec_new(p, &(ExecOptions){.seed = 2}, err, sizeof err);
    cr_assert(a && b, "%s", err);
    RtTensor wa, wb;
    rt_exec_tensor(a, "w", &wa);
    rt_exec_tensor(b, "w", &wb);
    cr_assert_neq(memcmp(wa.data, wb.data, 4 * (size_t)wa.numel), 0, "seeds differ");
    cr_assert_eq(rt_save_weights(a, tmp_path("w.safetensors"), 0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rt_load_weights(b, tmp_path("w.safetensors"), err, sizeof err), 0, "%s", err);
    cr_assert_eq(memcmp(wa.data, wb.data, 4 * (size_t)wa.numel), 0);
    /* Only params are saved: optimizer state is not in the file. */
    StEntry t[1] = {{"w", PLAN_DT_F32, 2, (int64_t[]){LD, LK}, wb.data}};
    cr_assert_eq(rt_st_read(tmp_path("w.safetensors"), t, 1, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "'b' is not in the model"), "%s", err);
    rt_exec_free(a);
    rt_exec_free(b);
    plan_free(p);
}

Test(exec, init_is_keyed_by_name_and_seed)
{
    Plan *p = classifier_plan(0.1);
    char err[512];
    Exec *e = rt_exec_new(p, &(ExecOptions){.seed = 5}, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    RtTensor w, m;
    rt_exec_tensor(e, "w", &w);
    rt_exec_tensor(e, "w.momentum_buffer", &m);
    float want[LD * LK];
    rt_init_param("w", 5, PLAN_INIT_NORMAL, 0.1, 0, 0, LD * LK, want);
    cr_assert_eq(memcmp(w.data, want, sizeof want), 0);
    for (int i = 0; i < LD * LK; i++) cr_assert_eq(((float *)m.data)[i], 0);
    cr_assert_eq((uintptr_t)rt_exec_arena(e) % 64, 0);
    cr_assert_eq(rt_exec_arena_bytes(e), plan_space_bytes(p, PLAN_PLACE_DEVICE));
    rt_exec_free(e);
    plan_free(p);
}

static void expect_new_error(Plan *p, const char *want)
{
    char err[512] = "";
    Exec *e = rt_exec_new(p, &(ExecOptions){0}, err, sizeof err);
    cr_assert_null(e, "no error; wanted '%s'", want);
    cr_assert_not_null(strstr(err, want), "got '%s', want '%s'", err, want);
}

Test(exec, plan_errors)
{
    Plan *p = classifier_plan(0.1);
    int32_t op = p->ops[0].op;
    p->ops[0].op = plan_intern(p, "frobnicate");
    expect_new_error(p, "plan uses op 'frobnicate' that this fsexec does not know; rebuild fsexec");
    p->ops[0].op = op;

    int64_t bytes = plan_space_bytes(p, PLAN_PLACE_DEVICE);
    p->programs[0].space_bytes[PLAN_PLACE_DEVICE] = bytes - 64;
    expect_new_error(p, "outside the");
    p->programs[0].space_bytes[PLAN_PLACE_DEVICE] = bytes;

    p->tensors[3].offset += 4;
    expect_new_error(p, "not 64-aligned");
    p->tensors[3].offset -= 4;

    /* lr_at without its lr: a required attribute. */
    for (int32_t k = 0; k < p->n_ops; k++)
        if (!strcmp(plan_str(p, p->ops[k].op), "lr_at")) p->attrs[p->ops[k].attr].key = plan_intern(p, "rate");
    expect_new_error(p, "attribute 'rate' is not in this fsexec's signature");
    plan_free(p);

    Plan *q = plan_new();
    expect_new_error(q, "no memory plan");
    plan_free(q);
}

Test(exec, attribute_defaults_apply)
{
    /* matmul's ta/tb default to 0, sum's axis to -1: y = sum(x @ w) over the last dim. */
    Plan *p = plan_new();
    int64_t sx[] = {2, 3}, sw[] = {3, 4}, sh[] = {2, 4}, ss[] = {2};
    int32_t x = add_tensor(p, "x", PLAN_DT_F32, PLAN_ROLE_PARAM, 2, sx, PLAN_INIT_ONES, 0, 0);
    int32_t w = add_tensor(p, "w", PLAN_DT_F32, PLAN_ROLE_PARAM, 2, sw, PLAN_INIT_UNIFORM, 0, 1);
    int32_t h = act(p, "h", PLAN_DT_F32, 2, sh), s = act(p, "s", PLAN_DT_F32, 1, ss);
    add_op(p, "matmul", PLAN_PHASE_FORWARD, (int32_t[]){x, w}, 2, &h, 1, NULL, 0);
    add_op(p, "sum", PLAN_PHASE_FORWARD, &h, 1, &s, 1, NULL, 0);
    plan_output_add(p, s);
    memplan(p);
    char err[512];
    Exec *e = rt_exec_new(p, &(ExecOptions){.seed = 3}, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    cr_assert_eq(rt_exec_run(e, 1, RT_PHASES_ALL), 0);
    RtTensor wt, st;
    rt_exec_tensor(e, "w", &wt);
    rt_exec_tensor(e, "s", &st);
    double want = 0;
    for (int i = 0; i < 12; i++) want += ((float *)wt.data)[i];
    cr_assert_float_eq(((float *)st.data)[0], want, 1e-5);
    cr_assert_float_eq(((float *)st.data)[1], want, 1e-5);
    cr_assert_eq(rt_exec_run(e, 0, RT_PHASES_ALL), -1, "steps are 1-based");
    rt_exec_free(e);
    plan_free(p);
}

/* A small language model: logits = embedding(wte, tokens) @ wout; V classes. */
static Plan *lm_plan(int64_t V)
{
    Plan *p = plan_new();
    int64_t st[] = {2, 8}, swte[] = {V, 4}, se[] = {2, 8, 4}, sw[] = {4, V}, sl[] = {2, 8, V};
    int32_t tok = add_tensor(p, "tokens", PLAN_DT_I32, PLAN_ROLE_INPUT, 2, st, PLAN_INIT_NONE, 0, 0);
    int32_t tgt = add_tensor(p, "targets", PLAN_DT_I32, PLAN_ROLE_INPUT, 2, st, PLAN_INIT_NONE, 0, 0);
    int32_t wte = add_tensor(p, "wte", PLAN_DT_F32, PLAN_ROLE_PARAM, 2, swte, PLAN_INIT_NORMAL, 0.02, 0);
    int32_t wout = add_tensor(p, "wout", PLAN_DT_F32, PLAN_ROLE_PARAM, 2, sw, PLAN_INIT_NORMAL, 0.02, 0);
    int32_t emb = act(p, NULL, PLAN_DT_F32, 3, se), logits = act(p, NULL, PLAN_DT_F32, 3, sl);
    int32_t loss = act(p, "loss", PLAN_DT_F32, 0, NULL);
    add_op(p, "embedding", PLAN_PHASE_FORWARD, (int32_t[]){wte, tok}, 2, &emb, 1, NULL, 0);
    add_op(p, "matmul", PLAN_PHASE_FORWARD, (int32_t[]){emb, wout}, 2, &logits, 1, NULL, 0);
    int32_t terms = act(p, NULL, PLAN_DT_F32, 3, (int64_t[]){sl[0], sl[1], 2});
    add_op(p, "cross_entropy", PLAN_PHASE_FORWARD, (int32_t[]){logits, tgt}, 2, (int32_t[]){loss, terms}, 2, NULL, 0);
    plan_output_add(p, loss);
    memplan(p);
    return p;
}

Test(data, language_model_inputs, .init = make_tmpdir, .fini = remove_tmpdir)
{
    char err[512];
    Plan *p = lm_plan(300);
    cr_assert_eq(rt_plan_vocab(p), 300);
    cr_assert_eq(rt_data_kind(p), RT_DATA_LM);
    Exec *e = rt_exec_new(p, &(ExecOptions){.seed = 1}, err, sizeof err);
    cr_assert_not_null(e, "%s", err);

    /* The built-in corpus: bytes of a system text. */
    RtData *d = rt_data_open(e, NULL, RT_ORDER_SEQUENTIAL, 1, err, sizeof err);
    cr_assert_not_null(d, "%s", err);
    cr_assert_not_null(strstr(rt_data_describe(d), "built-in corpus"), "%s", rt_data_describe(d));
    cr_assert_eq(rt_data_items(d), 16);
    rt_data_fill(d, 1);
    rt_exec_run(e, 1, RT_PHASES_ALL);
    float loss = scalar(e, "loss");
    cr_assert(fabsf(loss - logf(300)) < 0.05f, "loss %g, want about log(300)", loss);
    rt_data_close(d);

    /* A token file: llm.c format, then one with a token outside the vocab. */
    static uint8_t buf[1024 + 2 * 100];
    uint16_t tok[100];
    for (int i = 0; i < 100; i++) tok[i] = (uint16_t)(i * 3);
    write_file(tmp_path("good.bin"), buf, llmc_file(buf, 20240520, 1, 100, tok, 100));
    d = rt_data_open(e, tmp_path("good.bin"), RT_ORDER_SEQUENTIAL, 1, err, sizeof err);
    cr_assert_not_null(d, "%s", err);
    cr_assert_not_null(strstr(rt_data_describe(d), "100 tokens, llm.c format"), "%s", rt_data_describe(d));
    rt_data_fill(d, 2);
    RtTensor x;
    rt_exec_tensor(e, "tokens", &x);
    cr_assert_eq(((int32_t *)x.data)[0], tok[16]);  // step 2, row 0 starts at (1 * 2 + 0) * 8
    rt_data_close(d);
    tok[5] = 300;
    write_file(tmp_path("bad.bin"), tok, sizeof tok);
    cr_assert_null(rt_data_open(e, tmp_path("bad.bin"), RT_ORDER_RANDOM, 1, err, sizeof err));
    cr_assert_not_null(strstr(err, "token 5 is 300, outside the model's vocab of 300"), "%s", err);
    write_file(tmp_path("short.bin"), tok, 18);
    cr_assert_null(rt_data_open(e, tmp_path("short.bin"), RT_ORDER_RANDOM, 1, err, sizeof err));
    cr_assert_not_null(strstr(err, "a window needs T + 1 = 9"), "%s", err);
    cr_assert_null(rt_data_open(e, tmp_path("none.bin"), RT_ORDER_RANDOM, 1, err, sizeof err));
    cr_assert_not_null(strstr(err, "No such file"), "%s", err);
    rt_exec_free(e);
    plan_free(p);

    /* Byte tokens need V >= 256. */
    p = lm_plan(200);
    e = rt_exec_new(p, &(ExecOptions){.seed = 1}, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    cr_assert_null(rt_data_open(e, NULL, RT_ORDER_RANDOM, 1, err, sizeof err));
    cr_assert_not_null(strstr(err, "vocab V is 200"), "%s", err);
    rt_exec_free(e);
    plan_free(p);
}

Test(data, classifier_takes_no_file)
{
    char err[512];
    Plan *p = classifier_plan(0.1);
    Exec *e = rt_exec_new(p, &(ExecOptions){.seed = 1}, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    cr_assert_null(rt_data_open(e, "tokens.bin", RT_ORDER_RANDOM, 1, err, sizeof err));
    cr_assert_not_null(strstr(err, "synthetic Gaussian blobs"), "%s", err);
    rt_exec_free(e);
    plan_free(p);
}

/* ---- progress ---------------------------------------------------------------------- */

Test(progress, log_lines_and_accuracy, .init = make_tmpdir, .fini = remove_tmpdir)
{
    float logits[6] = {1, 2, 0, 5, 1, 1};
    int32_t y[2] = {1, 1};
    cr_assert_float_eq(rt_accuracy(logits, y, 2, 3), 0.5, 1e-12);
    int64_t counted;  // a label that is the loss's ignore_index counts for nothing
    int32_t yi[3] = {1, 0, 1};
    float li[9] = {1, 2, 0, 5, 1, 1, 0, 3, 1};
    cr_assert_eq(rt_correct(li, yi, 3, 3, 0, &counted), 2);
    cr_assert_eq(counted, 2);
    cr_assert_eq(rt_correct(li, (int32_t[]){0, 0, 0}, 3, 3, 0, &counted), 0);
    cr_assert_eq(counted, 0);

    char err[512], *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    ProgressOptions o = {.steps = 25, .log_path = tmp_path("log.jsonl"), .unit = "tok", .tty = 0, .out = out};
    Progress *p = rt_progress_new(&o, err, sizeof err);
    cr_assert_not_null(p, "%s", err);
    for (int s = 1; s <= 25; s++) {
        StepStats st = {.step = s, .loss = 1.0 / s, .lr = 1e-3, .grad_norm = 0.5, .ms = 2, .items = 100,
                        .accuracy = s == 25 ? 0.75 : NAN};
        if (s == 3) st.loss = NAN;
        cr_assert_eq(rt_progress_step(p, &st, err, sizeof err), 0, "%s", err);
    }
    cr_assert_eq(rt_progress_end(p, err, sizeof err), 0, "%s", err);
    fclose(out);
    cr_assert_not_null(strstr(text, "step 25/25 | loss 0.040000 | acc 0.750"), "%s", text);
    free(text);

    size_t n;
    char *log = (char *)read_whole(tmp_path("log.jsonl"), &n);
    log[n] = 0;
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += log[i] == '\n';
    cr_assert_eq(lines, 25);
    cr_assert_not_null(strstr(log, "{\"step\": 1, \"loss\": 1, \"lr\": 0.001, \"grad_norm\": 0.5, "
                                   "\"tokens_per_s\": 50000, \"ms\": 2}\n"), "%s", log);
    cr_assert_not_null(strstr(log, "{\"step\": 2, \"loss\": 0.5,"), "%s", log);
    cr_assert_not_null(strstr(log, "{\"step\": 3, \"loss\": null,"), "%s", log);
    cr_assert_not_null(strstr(log, "\"accuracy\": 0.75}"), "%s", log);
    free(log);
}

Test(progress, plain_lines_every_n_steps)
{
    char err[512], *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    ProgressOptions o = {.steps = 205, .tty = 0, .out = out};
    Progress *p = rt_progress_new(&o, err, sizeof err);
    for (int s = 1; s <= 205; s++) {
        StepStats st = {.step = s, .loss = 1, .ms = 1, .items = 1, .accuracy = NAN};
        rt_progress_step(p, &st, err, sizeof err);
    }
    rt_progress_end(p, err, sizeof err);
    fclose(out);
    int lines = 0;
    for (char *c = text; *c; c++) lines += *c == '\n';
    cr_assert_eq(lines, 20 + 1 + 1, "every 10th, the last, the summary:\n%s", text);
    cr_assert_not_null(strstr(text, "step 205/205"), "%s", text);
    free(text);
}

/* ---- end to end: samples compiled in-process, then run ----------------------------- */

static Plan *compile_sample(const char *file, const Define *defs, int n_defs, const Setting *set, int n_set)
{
    char path[512];
    snprintf(path, sizeof path, "%s/samples/%s", FS_SOURCE_DIR, file);
    size_t len;
    char *src = (char *)read_whole(path, &len);
    src[len] = 0;
    Diag d;
    diag_init(&d, path, src, len, stderr);
    FrontendOptions fo = {defs, n_defs, set, n_set};
    Options o = {.print_out = stdout, .verify = 1};
    Graph *g = fe_compile(src, len, &fo, &o.train, &d);
    cr_assert_not_null(g, "%s does not compile", file);
    cr_assert_eq(passes_run(g, &o, &d), 0, "%s: passes failed", file);
    char err[512];
    Plan *p = codegen_plan(g, &o.train, err, sizeof err);
    cr_assert_not_null(p, "%s", err);
    ir_graph_free(g);
    free(src);
    /* Through the file format too: what fsexec reads is what was planned. */
    void *buf;
    size_t n;
    cr_assert_eq(plan_write_mem(p, &buf, &n, err, sizeof err), 0, "%s", err);
    Plan *q = plan_read_mem(buf, n, err, sizeof err);
    cr_assert_not_null(q, "%s", err);
    plan_dealloc(buf);
    plan_free(p);
    return q;
}

/* Losses of `steps` steps from the built-in data of the plan's kind. */
static void run_plan(const Plan *p, int nan_fill, int steps, float *losses)
{
    char err[512];
    Exec *e = rt_exec_new(p, &(ExecOptions){.seed = 1337, .nan_fill = nan_fill}, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    RtData *d = rt_data_open(e, NULL, RT_ORDER_SEQUENTIAL, 1337, err, sizeof err);
    cr_assert_not_null(d, "%s", err);
    RtTensor loss;
    rt_exec_tensor_id(e, p->outputs[0], &loss);
    for (int s = 1; s <= steps; s++) {
        rt_data_fill(d, s);
        cr_assert_eq(rt_exec_run(e, s, RT_PHASES_ALL), 0);
        losses[s - 1] = *(float *)loss.data;
    }
    rt_data_close(d);
    rt_exec_free(e);
}

static void expect_training(const Plan *p, int steps)
{
    float a[64], b[64];
    cr_assert_leq(steps, 64);
    run_plan(p, 0, steps, a);
    for (int s = 0; s < steps; s++) cr_assert(isfinite(a[s]), "step %d: loss %g", s + 1, a[s]);
    double first = 0, last = 0;
    for (int s = 0; s < 3; s++) first += a[s], last += a[steps - 1 - s];
    cr_assert_lt(last, first * 0.9, "loss did not go down: %g ... %g", a[0], a[steps - 1]);
    run_plan(p, 1, steps, b);
    for (int s = 0; s < steps; s++) cr_assert_eq(a[s], b[s], "step %d: %g without NaN fill, %g with", s + 1, a[s], b[s]);
}

Test(e2e, mlp_sample_trains)
{
    Plan *p = compile_sample("mlp.fsm", NULL, 0, NULL, 0);
    cr_assert_eq(rt_data_kind(p), RT_DATA_CLASSES);
    int32_t logits = rt_plan_logits(p);
    cr_assert_neq(logits, PLAN_NONE, "the logits output is found, named or not");
    cr_assert_eq(p->tensors[logits].shape[1], 4, "K = 4 classes");
    expect_training(p, 30);
    plan_free(p);
}

Test(e2e, small_gpt2_trains)
{
    Define defs[] = {{"L", 2}, {"C", 32}, {"NH", 2}, {"T", 16}, {"V", 256}, {"B", 4}};
    Setting set[] = {{"lr", "0.003"}, {"warmup", "0"}};
    Plan *p = compile_sample("gpt2.fsm", defs, 6, set, 2);
    expect_training(p, 25);
    plan_free(p);
}

/* LoRA: only the adapters train, from B = 0, so at lr 0 every step's loss is the frozen
 * (random) base model's: on the same batches the trained adapters' losses must fall
 * below it (the batches' own spread is larger than what 25 steps learn on a random base,
 * so a loss curve alone would not tell). */
Test(e2e, lora_sample_trains)
{
    Define defs[] = {{"L", 2}, {"C", 32}, {"NH", 2}, {"T", 16}, {"V", 256}, {"B", 4}, {"R", 4}};
    Setting set[] = {{"lr", "0.003"}, {"warmup", "0"}}, base[] = {{"lr", "0"}, {"warmup", "0"}};
    Plan *p = compile_sample("lora.fsm", defs, 7, set, 2), *q = compile_sample("lora.fsm", defs, 7, base, 2);
    enum { STEPS = 25 };
    float a[STEPS], b[STEPS];
    run_plan(p, 0, STEPS, a);
    run_plan(q, 0, STEPS, b);
    cr_assert_eq(a[0], b[0], "step 1 runs the base model in both: %g vs %g", a[0], b[0]);
    double trained = 0, frozen = 0;
    for (int s = STEPS - 5; s < STEPS; s++) trained += a[s], frozen += b[s];
    cr_assert_lt(trained, frozen * 0.99, "the last 5 steps' loss %g, the base model's %g", trained / 5, frozen / 5);
    plan_free(p);
    plan_free(q);
}

/* A 16-bit plan gets the kernels' workspace (at most 32 MiB: its calls are small) and
 * trains, NaN fill or not; an f32 plan gets none. */
Test(e2e, bf16_gpt2_trains_with_a_workspace)
{
    Define defs[] = {{"L", 2}, {"C", 32}, {"NH", 2}, {"T", 16}, {"V", 256}, {"B", 4}};
    Setting set[] = {{"lr", "0.003"}, {"warmup", "0"}, {"precision", "bf16"}};
    char err[512];
    for (int bf16 = 0; bf16 < 2; bf16++) {
        Plan *p = compile_sample("gpt2.fsm", defs, 6, set, bf16 ? 3 : 2);
        Exec *e = rt_exec_new(p, &(ExecOptions){.seed = 1337}, err, sizeof err);
        cr_assert_not_null(e, "%s", err);
        int64_t w = rt_exec_work_bytes(e);
        if (bf16) cr_expect(w > 0 && w <= (32 << 20), "workspace %lld bytes", (long long)w);
        else cr_expect_eq(w, 0, "an f32 plan needs no workspace");
        rt_exec_free(e);
        if (bf16) expect_training(p, 25);
        plan_free(p);
    }
}

/* A device's host mirror holds the persistent prefix of the arena and the outputs apart:
 * the same initial params as the whole arena, a fraction of its bytes, and no run. */
Test(exec, host_mirror_holds_the_persistent_state_and_the_outputs)
{
    Setting set[] = {{"shard", "zero1"}, {"world", "1"}};
    Plan *p = sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, set, 2, NULL);
    char err[512];
    Exec *whole = rt_exec_new(p, &(ExecOptions){.seed = 9}, err, sizeof err);
    cr_assert_not_null(whole, "%s", err);
    Exec *mirror = rt_exec_new(p, &(ExecOptions){.seed = 9, .mirror = 1}, err, sizeof err);
    cr_assert_not_null(mirror, "%s", err);
    cr_assert_lt(rt_exec_host_bytes(mirror), rt_exec_arena_bytes(whole) / 2, "%lld of %lld bytes",
                 (long long)rt_exec_host_bytes(mirror), (long long)rt_exec_arena_bytes(whole));
    cr_assert_eq(rt_exec_arena_bytes(mirror), rt_exec_arena_bytes(whole), "the device's arena is the plan's");
    int64_t held = rt_exec_held_bytes(mirror, PLAN_PLACE_DEVICE);
    cr_assert_eq(memcmp(rt_exec_arena(mirror), rt_exec_arena(whole), (size_t)held), 0, "the same initial state");
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (plan_tensor_is_persistent(t)) cr_assert_not_null(rt_exec_data(mirror, i), "%s", plan_tensor_label(p, i));
    }
    for (int32_t k = 0; k < p->n_outputs; k++) {
        void *d = rt_exec_data(mirror, p->outputs[k]);
        cr_assert_not_null(d, "output %s", plan_tensor_label(p, p->outputs[k]));
        int64_t at = (const uint8_t *)d - (const uint8_t *)rt_exec_arena(mirror);
        cr_assert(at < 0 || at >= held || at + plan_tensor_nbytes(&p->tensors[p->outputs[k]]) <= held);
    }
    cr_assert_eq(rt_exec_run(mirror, 1, RT_PHASES_ALL), -1);
    cr_assert(strstr(rt_exec_error(mirror), "a host mirror runs no ops"), "%s", rt_exec_error(mirror));
    rt_exec_free(mirror);
    rt_exec_free(whole);
    plan_free(p);
}

/* ---- pipeline stages: a stage's program alone (no MPI) --------------------------------- */

/* Two programs of one data-parallel rank each, whole: stage 0 reads the features x and
 * sends f = relu(x) (peer: `peer`, 1 to be right), stage 1 reads the labels y and its own
 * features g (a param): logits = g @ w, loss = cross_entropy(logits, y), and with
 * pipe_world > 0 a collective of the loss over the stages of pipe_world ranks. */
static Plan *two_stages(int peer, int pipe_world)
{
    enum { B = 4, F = 3, C = 2 };
    int64_t sx[] = {B, F}, sy[] = {B}, sw[] = {F, C}, sl[] = {B, C};
    Plan *s[2] = {plan_new(), plan_new()}, *whole = plan_new();
    int32_t x = add_tensor(s[0], "x", PLAN_DT_F32, PLAN_ROLE_INPUT, 2, sx, PLAN_INIT_NONE, 0, 0);
    int32_t f = act(s[0], "f", PLAN_DT_F32, 2, sx);
    add_op(s[0], "relu", PLAN_PHASE_FORWARD, &x, 1, &f, 1, NULL, 0);
    add_op(s[0], "send", PLAN_PHASE_FORWARD, &f, 1, NULL, 0, (A[]){{"peer", PLAN_ATTR_INT, peer, NULL, 0}}, 1);
    s[0]->ops[1].stream = PLAN_STREAM_COLLECTIVE;
    int32_t y = add_tensor(s[1], "y", PLAN_DT_I32, PLAN_ROLE_INPUT, 1, sy, PLAN_INIT_NONE, 0, 0);
    int32_t g = add_tensor(s[1], "g", PLAN_DT_F32, PLAN_ROLE_PARAM, 2, sx, PLAN_INIT_NORMAL, 1, 0);
    int32_t w = add_tensor(s[1], "w", PLAN_DT_F32, PLAN_ROLE_PARAM, 2, sw, PLAN_INIT_NORMAL, 1, 0);
    int32_t logits = act(s[1], "logits", PLAN_DT_F32, 2, sl), loss = act(s[1], "loss", PLAN_DT_F32, 0, NULL);
    int32_t all = pipe_world ? act(s[1], "loss.all", PLAN_DT_F32, 0, NULL) : loss;
    add_op(s[1], "matmul", PLAN_PHASE_FORWARD, (int32_t[]){g, w}, 2, &logits, 1, NULL, 0);
    int32_t terms = act(s[1], NULL, PLAN_DT_F32, 2, (int64_t[]){sl[0], 2});
    add_op(s[1], "cross_entropy", PLAN_PHASE_FORWARD, (int32_t[]){logits, y}, 2, (int32_t[]){loss, terms}, 2, NULL, 0);
    A over[] = {{"world", PLAN_ATTR_INT, pipe_world, NULL, 0}, {"group", PLAN_ATTR_INT, 1, NULL, 0}};
    if (pipe_world) add_op(s[1], "all_reduce", PLAN_PHASE_COMM, &loss, 1, &all, 1, over, 2);
    if (pipe_world) s[1]->ops[2].stream = PLAN_STREAM_COLLECTIVE;
    plan_output_add(s[1], all);
    plan_output_add(s[1], logits);
    s[1]->tensors[all].step_role = PLAN_SR_LOSS;
    char err[512];
    for (int k = 0; k < 2; k++) {
        memplan(s[k]);  // one data-parallel rank: then the world of both stages
        plan_meta_set_int(s[k], "world", 2);
        plan_meta_set_int(s[k], "stages", 2);
        for (int32_t i = 0; i < s[k]->n_tensors; i++) s[k]->tensors[i].live_end = s[k]->n_ops;  // past the comm ops
        cr_assert_eq(plan_append_program(whole, s[k], err, sizeof err), 0, "%s", err);
        plan_free(s[k]);
    }
    return whole;
}

static Exec *stage_exec(const Plan *whole, int stage, Plan **one, char *err, size_t errlen)
{
    *one = plan_extract_program(whole, stage, err, errlen);
    cr_assert_not_null(*one, "%s", err);
    return rt_exec_new(*one, &(ExecOptions){.seed = 5, .world = 1, .whole = whole, .stage = stage}, err, errlen);
}

Test(pipeline, layout_names_stages_and_ranks)
{
    Plan *whole = two_stages(1, 2);
    RtLayout l;
    char err[512], buf[96];
    cr_assert_eq(rt_plan_layout(whole, &l, err, sizeof err), 0, "%s", err);
    cr_assert(l.stages == 2 && l.dp == 1 && l.world == 2);
    cr_assert_str_eq(rt_layout_str(&l, buf, sizeof buf), "2 stages x 1 data-parallel rank = world 2");
    whole->programs[1].dp_world = 3;
    cr_assert_eq(rt_plan_layout(whole, &l, err, sizeof err), -1);
    cr_assert(strstr(err, "stage 1 has 3 data-parallel ranks, but stage 0 has 1"), "%s", err);
    plan_free(whole);
    Plan *one = classifier_plan(0.1);
    cr_assert_eq(rt_plan_layout(one, &l, err, sizeof err), 0);
    cr_assert_str_eq(rt_layout_str(&l, buf, sizeof buf), "world 1");
    plan_free(one);
}

/* Each stage fills only the data inputs it reads, the rows the one-program plan would;
 * the labels and logits (for the accuracy) are the last stage's. */
Test(pipeline, each_stage_takes_its_own_data)
{
    Plan *whole = two_stages(1, 0), *one[2];
    char err[512];
    cr_assert_eq(rt_plan_check_ops(whole, err, sizeof err), 0, "%s", err);
    Exec *last = stage_exec(whole, 1, &one[1], err, sizeof err);
    cr_assert_not_null(last, "%s", err);
    cr_assert(rt_exec_stage(last) == 1 && rt_exec_stages(last) == 2 && rt_exec_whole(last) == whole);
    RtData *d = rt_data_open(last, NULL, RT_ORDER_RANDOM, 5, err, sizeof err);
    cr_assert_not_null(d, "%s", err);
    cr_assert_eq(rt_data_get_kind(d), RT_DATA_CLASSES);
    RtTensor y, lt;
    rt_exec_tensor(last, "y", &y);
    rt_exec_tensor(last, "logits", &lt);
    cr_assert(rt_data_labels(d) == y.id && rt_data_logits(d) == lt.id);
    rt_data_fill(d, 3);
    float cx[4 * 3], centers[2 * 3];
    int32_t cy[4];
    rt_blob_centers(5, 2, 3, centers);
    rt_blobs_rows(centers, 5, 3, 0, 4, 3, 2, cx, cy);
    cr_assert_eq(memcmp(y.data, cy, sizeof cy), 0, "the last stage's labels");
    rt_data_close(d);
    int32_t a, b;  // stage 0 (whose send needs MPI to bind) reads the features alone
    one[0] = plan_extract_program(whole, 0, err, sizeof err);
    rt_stage_inputs(whole, one[0], &a, &b);
    cr_assert(a != PLAN_NONE && !strcmp(plan_str(one[0], one[0]->tensors[a].name), "x") && b == PLAN_NONE);
    rt_stage_inputs(whole, one[1], &a, &b);
    cr_assert(a == PLAN_NONE && b == y.id);
    plan_free(one[0]);
    rt_exec_free(last);
    plan_free(one[1]);
    plan_free(whole);
}

Test(pipeline, bind_checks_peers_and_groups)
{
    char err[512];
    Plan *one;
    struct { int peer, pipe_world, stage; const char *want; } bad[] = {
        {0, 2, 0, "op 1 (send): peer stage 0 is not another stage of this 2-stage plan (this is stage 0)"},
        {2, 2, 0, "op 1 (send): peer stage 2 is not another stage of this 2-stage plan (this is stage 0)"},
        {1, 3, 1, "a collective over the pipeline group for 3 stages, but the plan has 2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        Plan *whole = two_stages(bad[i].peer, bad[i].pipe_world);
        cr_assert_null(stage_exec(whole, bad[i].stage, &one, err, sizeof err), "%s", bad[i].want);
        cr_assert(strstr(err, bad[i].want), "got '%s', want '%s'", err, bad[i].want);
        /* Alone (a plan of one stage), a send has no peer at all. */
        if (i == 0) {
            cr_assert_null(rt_exec_new(one, &(ExecOptions){.seed = 1}, err, sizeof err));
            cr_assert(strstr(err, "peer stage 0 is not another stage of this 1-stage plan"), "%s", err);
        }
        plan_free(one);
        plan_free(whole);
    }
    /* The guard cannot wait for a send as each op ends. */
    Plan *whole = two_stages(1, 2);
    one = plan_extract_program(whole, 0, err, sizeof err);
    cr_assert_null(rt_exec_new(one, &(ExecOptions){.seed = 1, .world = 1, .whole = whole, .guard = 1}, err, sizeof err));
    cr_assert(strstr(err, "--debug-guard waits for every op"), "%s", err);
    plan_free(one);
    plan_free(whole);
}
