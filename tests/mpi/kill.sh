#!/usr/bin/env bash
# A rank killed with SIGKILL in the middle of training: every other rank ends too and
# the run exits non-zero, within 10 s (mpirun notices the dead rank and ends the job).
# A frozen rank (SIGSTOP: mpirun notices nothing) ends every rank through the watchdog
# (--timeout). usage: kill.sh FSC FSEXEC SOURCE_DIR
source "$(dirname "$0")/lib.sh"

"$FSC" "$SRC/samples/gpt2.fsm" "${GPT_DIMS[@]}" --world 3 --shard fsdp -o "$tmp/p.plan" >/dev/null 2>&1 ||
  { fail "fsc"; finish; }

launcher= ranks=
cleanup() {
  for p in $ranks $launcher; do kill -9 "$p" 2>/dev/null; done
}
trap cleanup EXIT

# start_run NAME [FLAGS...]: 3 ranks training "forever"; sets launcher (mpirun) and ranks.
start_run() {
  local name=$1
  shift
  rm -f "$tmp/log"
  "$FSEXEC" --nproc 3 "$tmp/p.plan" --steps 100000000 --threads 1 --log "$tmp/log" --log-every 100000000 "$@" \
    >"$tmp/$name.out" 2>&1 &
  launcher=$!
  for _ in $(seq 300); do
    [ -s "$tmp/log" ] && break
    sleep 0.1
  done
  ranks=$(pgrep -P "$launcher" | tr '\n' ' ')
  [ -s "$tmp/log" ] && [ "$(wc -w <<<"$ranks")" -eq 3 ]
}

# ends_within NAME SECONDS T0: every rank and mpirun gone, mpirun's status non-zero.
ends_within() {
  local name=$1 limit_ms=$(($2 * 1000)) t0=$3 p
  while alive "$launcher" && [ $(($(now_ms) - t0)) -lt $((limit_ms + 5000)) ]; do sleep 0.05; done
  local took=$(($(now_ms) - t0))
  for p in $ranks; do alive "$p" && { fail "$name: rank pid $p still running after ${took} ms"; return; }; done
  if alive "$launcher"; then
    fail "$name: mpirun still running after ${took} ms"
    return
  fi
  wait "$launcher"
  local rc=$?
  if [ "$rc" -eq 0 ]; then
    fail "$name: exit status 0"
  elif [ "$took" -gt "$limit_ms" ]; then
    fail "$name: took ${took} ms (limit ${limit_ms} ms)"
  else
    ok "$name: every rank ended in ${took} ms, exit status $rc"
  fi
  sed 's/^/    /' "$tmp/$name.out" | grep -v '^    $' | head -8
}

for victim in 1 0; do  # the second and the first rank mpirun started
  name=sigkill-$((victim + 1))
  if ! start_run "$name"; then
    fail "$name: the ranks did not start training"
    sed 's/^/    /' "$tmp/$name.out" | head -20
    continue
  fi
  sleep 0.5  # well into training: mid-step, or inside a collective
  pid=$(cut -d' ' -f$((victim + 1)) <<<"$ranks")
  t0=$(now_ms)
  kill -9 "$pid"
  ends_within "$name" 10 "$t0"
done

name=sigstop-watchdog
if start_run "$name" --timeout 2; then
  sleep 0.5
  pid=$(cut -d' ' -f3 <<<"$ranks")
  t0=$(now_ms)
  kill -STOP "$pid"
  ends_within "$name" 10 "$t0"
  grep -q "did not finish within 2 s (--timeout)" "$tmp/$name.out" || fail "$name: no watchdog message"
else
  fail "$name: the ranks did not start training"
fi
finish
