#!/usr/bin/env bash
# A rank killed with SIGKILL in the middle of training: every other rank ends too, the
# run exits non-zero within 10 s, and the output names the dead rank (mpirun notices it,
# says which, and ends the job). A frozen rank (SIGSTOP: mpirun notices nothing) ends
# every rank through the watchdog (--timeout), whose message names the op the others
# wait in (its plan op id and .fsm line) and the stopped rank as the one holding it up.
# usage: kill.sh FSC FSEXEC SOURCE_DIR
source "$(dirname "$0")/lib.sh"

"$FSC" "$SRC/samples/gpt2.fsm" "${GPT_DIMS[@]}" --world 3 --shard fsdp -o "$tmp/p.plan" >/dev/null 2>&1 ||
  { fail "fsc"; finish; }

launcher= ranks=
cleanup() {
  for p in $ranks $launcher; do kill -9 "$p" 2>/dev/null; done
}
trap cleanup EXIT

# start_run NAME [FLAGS...]: 3 ranks training "forever", under a generous `timeout` so
# that a regression fails rather than hangs; sets launcher (timeout, parent of mpirun)
# and ranks (the rank processes).
start_run() {
  local name=$1
  shift
  rm -f "$tmp/log"
  timeout -k 5 120 "$FSEXEC" --nproc 3 "$tmp/p.plan" --steps 100000000 --threads 1 --log "$tmp/log" \
    --log-every 100000000 "$@" >"$tmp/$name.out" 2>&1 &
  launcher=$!
  for _ in $(seq 300); do
    [ -s "$tmp/log" ] && break
    sleep 0.1
  done
  ranks=$(pgrep -P "$(pgrep -P "$launcher" | head -1)" | tr '\n' ' ')
  [ -s "$tmp/log" ] && [ "$(wc -w <<<"$ranks")" -eq 3 ]
}

# ends_within NAME SECONDS T0: every rank and mpirun gone, the status non-zero (and not
# timeout's 124: mpirun had to be stopped); prints the output; fails (returns 1) if not.
ends_within() {
  local name=$1 limit_ms=$(($2 * 1000)) t0=$3 p bad=0
  while alive "$launcher" && [ $(($(now_ms) - t0)) -lt $((limit_ms + 5000)) ]; do sleep 0.05; done
  local took=$(($(now_ms) - t0))
  for p in $ranks; do alive "$p" && { fail "$name: rank pid $p still running after ${took} ms"; return 1; }; done
  if alive "$launcher"; then
    fail "$name: mpirun still running after ${took} ms"
    return 1
  fi
  wait "$launcher"
  local rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
    fail "$name: exit status $rc" && bad=1
  elif [ "$took" -gt "$limit_ms" ]; then
    fail "$name: took ${took} ms (limit ${limit_ms} ms)" && bad=1
  else
    ok "$name: every rank ended in ${took} ms, exit status $rc"
  fi
  sed 's/^/    /' "$tmp/$name.out" | grep -v -e '^    $' -e '-----' | head -12
  return $bad
}

for victim in 1 0; do
  name=sigkill-rank-$victim
  if ! start_run "$name"; then
    fail "$name: the ranks did not start training"
    sed 's/^/    /' "$tmp/$name.out" | head -20
    continue
  fi
  sleep 0.5  # well into training: mid-step, or inside a collective
  pid=$(rank_pid "$victim" $ranks)
  [ -n "$pid" ] || { fail "$name: no process is rank $victim"; continue; }
  t0=$(now_ms)
  kill -9 "$pid"
  ends_within "$name" 10 "$t0" &&
    { grep -Eq "process rank $victim .*signal 9" "$tmp/$name.out" || fail "$name: the output does not name rank $victim"; }
done

# Rank 2 stopped at a random point of training: ranks 0 and 1 wait in a collective that
# rank 2 either did not reach or started and then stopped in (both happen, depending on
# where it stops); either way the watchdog of a waiting rank must blame rank 2 alone.
name=sigstop-rank-2
if start_run "$name" --timeout 5; then
  sleep 0.5
  pid=$(rank_pid 2 $ranks)
  if [ -z "$pid" ]; then
    fail "$name: no process is rank 2"
  else
    t0=$(now_ms)
    kill -STOP "$pid"
    if ends_within "$name" 60 "$t0"; then
      out=$tmp/$name.out
      # the first full diagnosis of a waiting rank (another may just say that one has said why)
      line=$(grep -E '^\[rank [01]\] fsexec: timeout: step [0-9]+ did not finish within 5 s \(--timeout\): .* did not complete: ' "$out" | head -1)
      loc='op [0-9]+ \((all_gather|reduce_scatter|all_reduce)[^()]* [^ ()]+\.fsm:[0-9]+:[0-9]+[^()]*\)'
      if [ -z "$line" ]; then
        fail "$name: no watchdog message from rank 0 or 1 naming the collective that did not complete"
      else
        grep -Eq "did not complete: (it waits behind $loc: )?rank 2 (did not reach it|started it, then stopped running)" <<<"$line" ||
          fail "$name: the message does not say that rank 2 holds the collective up: $line"
        grep -Eq "$loc did not complete" <<<"$line" ||
          fail "$name: the message names no plan op with its .fsm line: $line"
        grep -Eq 'rank [01] (did not reach it|started it)' <<<"$line" &&
          fail "$name: the message blames a waiting rank: $line"
        grep -Eq 'ranks? [01](, 1)? (is|are) waiting in it' <<<"$line" ||
          fail "$name: the message names no waiting rank: $line"
        grep -Eq '^\[rank [01]\] note: rank 2 .*it has not run for [0-9.]+ s \(stopped, or dead\)' "$out" ||
          fail "$name: no note that rank 2 has stopped running"
      fi
    fi
  fi
else
  fail "$name: the ranks did not start training"
fi
finish
