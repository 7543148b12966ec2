#!/usr/bin/env bash
# A stage that dies, on the 2 stages x 2 ranks plan of tests/mpi/pipeline.c: a rank of
# the last stage killed with SIGKILL ends every rank within 10 s (mpirun names it); one
# stopped with SIGSTOP (mpirun notices nothing) ends every rank through the watchdog
# (--timeout), whose first diagnosis names the waiting rank with its stage and blames the
# stopped rank alone: as a rank of its own stage that did not reach (or stopped in) the
# collective, or as the other stage's rank that a send, receive or collective over the
# stages waits for. usage: pipeline_kill.sh PLANS_BINARY FSEXEC
set -uo pipefail
BIN=$(realpath "$1") FSEXEC=$(realpath "$2")
source "$(dirname "$0")/lib.sh" "" "$FSEXEC" ""
"$BIN" write "$tmp" || { fail "writing the plans"; finish; }

# start_run NAME [FLAGS...]: 4 ranks training "forever" (lib.sh).
start_run() { start_training "$1" 4 "$tmp/pp2x2.plan" "${@:2}"; }

name=sigkill-stage-1
if start_run "$name"; then
  sleep 0.5
  pid=$(rank_pid 3 $ranks)
  t0=$(now_ms)
  kill -9 "$pid"
  ends_within "$name" 10 "$t0" && {
    grep -Eq "process rank 3 .*signal 9" "$tmp/$name.out" || fail "$name: the output does not name rank 3"
    grep -q "4 ranks (2 stages x 2" "$tmp/$name.out" || fail "$name: the start line does not say the stages"
  }
else
  fail "$name: the ranks did not start training"
  sed 's/^/    /' "$tmp/$name.out" | head -20
fi

name=sigstop-stage-1
if start_run "$name" --timeout 3; then
  sleep 0.5
  pid=$(rank_pid 3 $ranks)
  t0=$(now_ms)
  kill -STOP "$pid"
  if ends_within "$name" 30 "$t0"; then
    out=$tmp/$name.out
    line=$(grep -E '^\[rank [0-2], stage [01]\] fsexec: timeout: step [0-9]+ did not finish within 3 s \(--timeout\): .* did not complete: ' "$out" | head -1)
    if [ -z "$line" ]; then
      fail "$name: no watchdog diagnosis from a waiting rank, naming its stage"
    else
      grep -Eq "rank 3 (did not reach it|started it, then stopped running|has not run for [0-9.]+ s \(stopped, or dead\))" <<<"$line" ||
        fail "$name: the diagnosis does not blame rank 3: $line"
      grep -Eq "rank [0-2] (did not reach it|started it, then stopped|has not run)" <<<"$line" &&
        fail "$name: the diagnosis blames a running rank: $line"
    fi
    grep -Eq '^\[rank [0-2], stage [01]\] note: rank 3 (\(stage 1\) )?.*it has not run for [0-9.]+ s \(stopped, or dead\)' "$out" ||
      fail "$name: no note that rank 3 has stopped running"
  fi
else
  fail "$name: the ranks did not start training"
fi
finish
