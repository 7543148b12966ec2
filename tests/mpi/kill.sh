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

# start_run NAME [FLAGS...]: 3 ranks training "forever" (lib.sh).
start_run() { start_training "$1" 3 "$tmp/p.plan" "${@:2}"; }

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
      # or, when rank 2 stopped after its part of the step's last collective, the step's end
      end="the step's end, where every rank agrees whether a signal stops training \\(MPI_Allreduce\\)"
      if [ -z "$line" ]; then
        fail "$name: no watchdog message from rank 0 or 1 naming the collective that did not complete"
      else
        grep -Eq "did not complete: (it waits behind $loc: )?rank 2 (did not reach it|started it, then stopped running)" <<<"$line" ||
          fail "$name: the message does not say that rank 2 holds the collective up: $line"
        grep -Eq "($loc|$end) did not complete" <<<"$line" ||
          fail "$name: the message names neither a plan op with its .fsm line nor the step's end: $line"
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
