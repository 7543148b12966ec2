#!/usr/bin/env bash
# Pipeline stages under mpirun, on the plans tests/mpi/pipeline.c builds by hand: the
# library run at 2 stages x 1 and 2 stages x 2 ranks (values against the one-stage plan,
# standard and synchronous sends); fsexec's rank layout on the same plans, trained against
# the one-stage run (to the bit with one rank per stage, --sync-sends alike, --debug-nan
# alike), world mismatches that name stages and ranks, sharded weights out (a file per
# stage and the index) and one file in for every stage, and what a pipeline refuses.
# usage: pipeline.sh PLANS_BINARY FSEXEC
BIN=$(realpath "$1") FSEXEC=$(realpath "$2")
source "$(dirname "$0")/lib.sh" "" "$FSEXEC" ""
cd "$tmp" || exit 1
"$BIN" write "$tmp" || { fail "writing the plans"; finish; }

for n in 2 4; do
  if out=$(timeout 60 mpirun -np "$n" --oversubscribe "$BIN" run 2>&1); then ok "library, world $n"
  else fail "library, world $n:"; fi
  sed 's/^/    /' <<<"$out" | sort | head -20
done

# run NAME RANKS PLAN FLAGS...: fsexec, 5 steps; its log in NAME.log, output in NAME.out.
run() {
  local name=$1 ranks=$2 plan=$3
  shift 3
  local launch=("$FSEXEC")
  [ "$ranks" -gt 1 ] && launch=("$FSEXEC" --nproc "$ranks")
  if ! timeout 60 "${launch[@]}" "$plan" --steps 5 --log "$name.log" "$@" >"$name.out" 2>&1; then
    fail "$name: fsexec failed:"
    sed 's/^/    /' "$name.out" | head -20
    return 1
  fi
}
# losses NAME: step, loss, grad_norm and accuracy of each step of its log.
losses() { /usr/bin/python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l); print(r["step"], repr(r["loss"]), repr(r["grad_norm"]), r.get("accuracy"))' "$1.log"; }
same() { [ "$(losses "$1")" = "$(losses "$2")" ] && ok "$1 trains as $2" || { fail "$1 differs from $2:"; paste <(losses "$1") <(losses "$2") | sed 's/^/    /'; }; }
close() {
  /usr/bin/python3 - "$1.log" "$2.log" <<'PY' && ok "$1 trains as $2 (to rounding)" || fail "$1 differs from $2"
import json, sys
a, b = ([json.loads(l) for l in open(f)] for f in sys.argv[1:])
assert len(a) == len(b) == 5, (len(a), len(b))
for x, y in zip(a, b):
    for k in ("loss", "grad_norm"):
        assert abs(x[k] - y[k]) <= 1e-5 * (1 + abs(y[k])), (x["step"], k, x[k], y[k])
PY
}
run one 1 one.plan && run pp2 2 pp2.plan && same pp2 one
run pp2_sync 2 pp2.plan --sync-sends && same pp2_sync one
run pp2_nan 2 pp2.plan --debug-nan && same pp2_nan one
run pp2x2 4 pp2x2.plan && close pp2x2 one
grep -q "device: cpu (" pp2.out &&
  grep -q "4 ranks (2 stages x 2" pp2x2.out && ok "start line" || fail "start line: $(head -1 pp2x2.out)"
[ "$(grep -c '^fsexec: pipe_mlp' pp2x2.out)" = 1 ] && ok "one rank reports" || fail "start lines: $(grep -c '^fsexec' pp2x2.out)"

# expect NAME WANT_SUBSTRING COMMAND...: a non-zero exit whose output says it.
expect() {
  local name=$1 want=$2 out rc
  shift 2
  out=$(timeout 60 "$@" 2>&1)
  rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || ! grep -qF -- "$want" <<<"$out"; then
    fail "$name: rc=$rc, output lacks '$want':"
    sed 's/^/    /' <<<"$out" | head -12
  else
    ok "$name"
  fi
}
out=$(timeout 60 mpirun -np 3 --oversubscribe "$FSEXEC" pp2x2.plan --steps 1 2>&1)
for r in 0 1 2; do  # every rank says it
  grep -qF "[rank $r] fsexec: pp2x2.plan: the plan has 2 stages x 2 data-parallel ranks = world 4, but 3 ranks started" <<<"$out" &&
    ok "3 ranks for 2x2, rank $r" || { fail "3 ranks for 2x2, rank $r:"; sed 's/^/    /' <<<"$out" | head -8; }
done
expect "--nproc 3 for 2x2" "the plan has 2 stages x 2 data-parallel ranks = world 4, but --nproc asks for 3 ranks; none started (use --nproc 4)" \
  "$FSEXEC" --nproc 3 pp2x2.plan --steps 1
expect "alone for 2x1" "the plan has 2 stages x 1 data-parallel rank = world 2, but 1 rank started (start 2" \
  "$FSEXEC" pp2.plan --steps 1
for flag in "--save-grads g.safetensors" --debug-guard "--debug-overflow-at 1"; do
  expect "refuses $flag" "${flag%% *} runs plans of one pipeline stage only; this one has 2" \
    "$FSEXEC" --nproc 2 pp2.plan --steps 1 $flag
done
# These plans, built by hand, carry no CUDA program: --device cuda says why it cannot run
# (that, or no GPU); pipelines on CUDA ranks are tests/cuda_emu/pipeline.py's.
expect "--device cuda" "--device cuda: " "$FSEXEC" --nproc 2 pp2.plan --steps 1 --device cuda

# Weights: a file per stage and the index; the same params as the one-stage run's; and one
# file of the whole model loads into every stage.
run w1 1 one.plan --save-weights one.safetensors &&
  run w2 2 pp2.plan --save-weights pp.safetensors && run w4 4 pp2x2.plan --save-weights pp4.safetensors &&
  /usr/bin/python3 - <<'PY' && ok "sharded weights and index" || fail "sharded weights"
import json, struct
def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
one = load("one.safetensors")
for base, exact in (("pp", True), ("pp4", False)):
    a, b = load(base + "-00001-of-00002.safetensors"), load(base + "-00002-of-00002.safetensors")
    assert sorted(a) == ["t", "w0"] and sorted(b) == ["t", "w1"], (sorted(a), sorted(b))
    assert a["t"] == b["t"], "the tied param differs between the stages"
    index = json.load(open(base + ".safetensors.index.json"))
    assert index["weight_map"] == {"t": base + "-00001-of-00002.safetensors", "w0": base + "-00001-of-00002.safetensors",
                                   "w1": base + "-00002-of-00002.safetensors"}, index
    assert index["metadata"]["total_size"] == 4 * (24 + 6 + 18), index
    for k, v in list(a.items()) + list(b.items()):
        x, y = struct.unpack("<%df" % (len(v) // 4), v), struct.unpack("<%df" % (len(v) // 4), one[k])
        assert all((p == q) if exact else abs(p - q) <= 1e-5 * (1 + abs(q)) for p, q in zip(x, y)), (base, k)
PY
run l1 1 one.plan --load-weights one.safetensors && run l2 2 pp2.plan --load-weights one.safetensors && same l2 l1
expect "stage file alone" "[rank 1, stage 1] fsexec: pp-00001-of-00002.safetensors: no tensor 'w1', which the model has" \
  "$FSEXEC" --nproc 2 pp2.plan --steps 1 --load-weights pp-00001-of-00002.safetensors
"$FSEXEC" --help | grep -q -- "--sync-sends" && ok "--help documents --sync-sends" || fail "--help lacks --sync-sends"
finish
