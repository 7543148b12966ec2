/* planner/machine.c: the machine the cost model (and fsc --kernels) prices a plan
 * against, by default an H100 SXM node (8 GPUs, NVLink 4, one 400 Gb/s NIC per GPU,
 * PCIe 5); by name the same node of H200s (HBM3e); or one described by a JSON file that
 * gives every key of the default (jansson) but flops_tf32, which is half of flops_16bit
 * when absent (as on A100, H100 and H200). */
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "plan.h"
#include "planner.h"

typedef struct {
    const char *key;
    size_t offset;
    double lo, hi;
} Key;

#define NUM(field, lo, hi) {#field, offsetof(Machine, field), lo, hi}

static const Key KEYS[] = {
    NUM(flops_fp32, 1e6, 1e18), NUM(flops_16bit, 1e6, 1e18), NUM(flops_tf32, 1e6, 1e18), NUM(hbm_bw, 1e6, 1e15),
    NUM(nvlink_bw, 1e6, 1e15),
    NUM(ib_bw, 1e6, 1e15), NUM(pcie_bw, 1e6, 1e15), NUM(host_flops, 1e6, 1e18), NUM(host_bw, 1e6, 1e15),
    NUM(collective_latency, 0, 1),
};
enum { N_KEYS = sizeof KEYS / sizeof *KEYS };

void machine_default(Machine *m)
{
    *m = (Machine){
        .gpus_per_node = 8,
        .flops_fp32 = 67e12,        // H100 SXM: fp32 without tensor cores
        .flops_16bit = 989e12,      // bf16 / fp16 dense tensor cores
        .flops_tf32 = 495e12,       // tf32 dense tensor cores (half the 16-bit rate)
        .hbm_bw = 3.35e12,          // HBM3
        .nvlink_bw = 450e9,         // NVLink 4: 900 GB/s both ways
        .ib_bw = 50e9,              // one 400 Gb/s NIC per GPU
        .pcie_bw = 55e9,            // PCIe 5 x16, pinned
        .host_flops = 1e12,         // an eighth of a two-socket host
        .host_bw = 50e9,            // an eighth of its memory bandwidth
        .collective_latency = 10e-6,
    };
    strcpy(m->name, "H100-SXM-8");
}

/* The H200 SXM is an H100 SXM with faster and larger memory: the same tensor cores and
 * NVLink, HBM3e at 4.8 TB/s. */
static void machine_h200(Machine *m)
{
    machine_default(m);
    m->hbm_bw = 4.8e12;
    strcpy(m->name, "H200-SXM-8");
}

static int fail(char *err, size_t errlen, const char *path, const char *key, const char *what)
{
    snprintf(err, errlen, "--machine %s: %s%s%s", path, key ? key : "", key ? ": " : "", what);
    return -1;
}

static int set_key(Machine *m, const char *path, const char *key, json_t *v, char *err, size_t errlen)
{
    if (!strcmp(key, "name")) {
        if (!json_is_string(v)) return fail(err, errlen, path, key, "expected a string");
        snprintf(m->name, sizeof m->name, "%s", json_string_value(v));
        return 0;
    }
    if (!strcmp(key, "gpus_per_node")) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1024)
            return fail(err, errlen, path, key, "expected an integer from 1 to 1024");
        m->gpus_per_node = (int)json_integer_value(v);
        return 0;
    }
    for (int i = 0; i < N_KEYS; i++) {
        if (strcmp(key, KEYS[i].key)) continue;
        double x = json_number_value(v);
        if (!json_is_number(v) || !isfinite(x) || x < KEYS[i].lo || x > KEYS[i].hi) {
            char why[128];
            snprintf(why, sizeof why, "expected a number from %g to %g", KEYS[i].lo, KEYS[i].hi);
            return fail(err, errlen, path, key, why);
        }
        *(double *)((char *)m + KEYS[i].offset) = x;
        return 0;
    }
    char why[600] = "unknown key (the keys: name, gpus_per_node";
    for (int i = 0; i < N_KEYS; i++) snprintf(why + strlen(why), sizeof why - strlen(why), ", %s", KEYS[i].key);
    snprintf(why + strlen(why), sizeof why - strlen(why), ")");
    return fail(err, errlen, path, key, why);
}

int machine_load(Machine *m, const char *path, char *err, size_t errlen)
{
    json_error_t je;
    char why[300], text[JSON_ERROR_TEXT_LENGTH];
    int64_t size;
    int fd = plan_open_input(path, &size, why, sizeof why);  // a regular file, never a wait on a FIFO
    if (fd < 0) return fail(err, errlen, path, NULL, why);
    json_t *root = json_loadfd(fd, 0, &je);
    close(fd);
    if (!root) {
        snprintf(why, sizeof why, "line %d, column %d: %s", je.line, je.column,
                 plan_json_why(je.text, text, sizeof text));
        return fail(err, errlen, path, NULL, why);
    }
    int rc = 0;
    machine_default(m);
    if (!json_is_object(root)) rc = fail(err, errlen, path, NULL, "expected a JSON object of machine keys");
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (rc) break;
        rc = set_key(m, path, key, v, err, errlen);
    }
    if (!rc && !json_object_get(root, "gpus_per_node")) rc = fail(err, errlen, path, "gpus_per_node", "missing");
    for (int i = 0; i < N_KEYS && !rc; i++)
        if (!json_object_get(root, KEYS[i].key) && strcmp(KEYS[i].key, "flops_tf32"))
            rc = fail(err, errlen, path, KEYS[i].key, "missing");
    if (!json_object_get(root, "flops_tf32")) m->flops_tf32 = m->flops_16bit / 2;
    json_decref(root);
    return rc;
}

int machine_select(Machine *m, const char *what, char *err, size_t errlen)
{
    machine_default(m);
    if (!what || !strcasecmp(what, "h100")) return 0;
    if (!strcasecmp(what, "h200")) {
        machine_h200(m);
        return 0;
    }
    return machine_load(m, what, err, errlen);
}

void machine_print(const Machine *m, FILE *out)
{
    fprintf(out, "machine %s: %d GPUs per node; %.0f TFLOP/s fp32, %.0f TFLOP/s bf16/fp16, %.0f TFLOP/s tf32; HBM "
            "%.0f GB/s, NVLink %.0f GB/s, IB %.0f GB/s, PCIe %.0f GB/s; host %.2f TFLOP/s, %.0f GB/s; %.0f us per "
            "collective\n",
            m->name, m->gpus_per_node, m->flops_fp32 / 1e12, m->flops_16bit / 1e12, m->flops_tf32 / 1e12,
            m->hbm_bw / 1e9, m->nvlink_bw / 1e9,
            m->ib_bw / 1e9, m->pcie_bw / 1e9, m->host_flops / 1e12, m->host_bw / 1e9, m->collective_latency * 1e6);
}
