#!/usr/bin/env python3
"""tests/mpi/compare.py REF.safetensors REF.jsonl RUN.safetensors RUN.jsonl: the same
training? Every param equal within atol 1e-6 + rtol 1e-5 (elementwise, fp32 rounding
amplified a little by Adam), every logged loss and grad_norm within rtol 1e-5 + 1e-6.
Prints the worst differences; exit 1 when out of tolerance. No numpy needed."""
import array, json, struct, sys

def weights(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    head, base, out = json.loads(b[8:8 + n]), 8 + n, {}
    for k, v in head.items():
        if k == '__metadata__':
            continue
        lo, hi = v['data_offsets']
        a = array.array('f')
        a.frombytes(b[base + lo:base + hi])
        out[k] = (v['dtype'], v['shape'], a)
    return out

def log(path):
    return [json.loads(line) for line in open(path)]

ref_w, ref_l, run_w, run_l = sys.argv[1:5]
a, b, bad = weights(ref_w), weights(run_w), []
if sorted(a) != sorted(b):
    bad.append('param names differ: %s vs %s' % (sorted(a), sorted(b)))
worst = (0.0, '')
for k in sorted(set(a) & set(b)):
    if a[k][:2] != b[k][:2]:
        bad.append('%s: %s %s vs %s %s' % (k, a[k][0], a[k][1], b[k][0], b[k][1]))
        continue
    for x, y in zip(a[k][2], b[k][2]):
        excess = abs(x - y) / (1e-6 + 1e-5 * abs(x))
        if excess > worst[0]:
            worst = (excess, '%s: %.9g vs %.9g' % (k, x, y))
if worst[0] > 1:
    bad.append('param out of tolerance: ' + worst[1])
la, lb = log(ref_l), log(run_l)
if len(la) != len(lb):
    bad.append('%d vs %d log lines' % (len(la), len(lb)))
for x, y in zip(la, lb):
    for key in ('loss', 'grad_norm', 'lr'):
        if key in x and abs(x[key] - y[key]) > 1e-6 + 1e-5 * abs(x[key]):
            bad.append('step %d %s: %.9g vs %.9g' % (x['step'], key, x[key], y[key]))
print('%d params, worst param %.2f of tolerance (%s)' % (len(a), worst[0], worst[1] or '-'))
for m in bad[:10]:
    print('  ' + m)
sys.exit(1 if bad else 0)
