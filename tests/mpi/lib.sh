# tests/mpi/lib.sh: shared by the multi-rank tests (sourced). Every test takes
# FSC FSEXEC SOURCE_DIR, skips (exit 77) without mpirun, and works in a temporary folder.
set -uo pipefail
FSC=$1 FSEXEC=$2 SRC=$3
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIP: mpirun not found (apt install openmpi-bin)"
  exit 77
fi
tmp=$(mktemp -d)
failures=0
# Open MPI refuses root unless told; fsexec --nproc says so itself, plain mpirun needs these.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Under AddressSanitizer (scripts/test.sh --sanitize) Open MPI keeps allocations to the
# end of the process: full stacks let lsan.supp find them, so only our leaks are reported.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lsan.supp:print_suppressions=0:use_tls=0"  # use_tls=0: tests/py/mpienv.py says why
# A tiny GPT-2 that runs a step in a few milliseconds.
GPT_DIMS=(-D L=2 -D C=64 -D NH=2 -D T=32 -D V=256 -D B=12)

fail() {
  echo "FAIL $*"
  failures=$((failures + 1))
}

ok() { echo "ok   $*"; }

# alive PID: the process exists and is not a zombie.
alive() {
  local s
  s=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ $s != Z* ]]
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# rank_pid RANK PID...: which of the PIDs is MPI rank RANK (Open MPI's mpirun tells each
# process in OMPI_COMM_WORLD_RANK); nothing if none.
rank_pid() {
  local want=$1 p
  shift
  for p in "$@"; do
    [ "$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')" = "$want" ] &&
      { echo "$p"; return; }
  done
}

# Training "forever" on several ranks, for the tests that kill or stop one: the launcher
# (timeout, above fsexec --nproc and its mpirun) and the rank processes, killed at exit.
launcher= ranks=
trap 'for p in $ranks $launcher; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT

# start_training NAME NPROC PLAN [FLAGS...]: NPROC ranks training "forever", under a
# generous `timeout` so that a regression fails rather than hangs; output in $tmp/NAME.out;
# true once they train (the log has a line, within $START_TRIES tenths of a second: 300 by
# default) and all NPROC ranks are seen.
start_training() {
  local name=$1 n=$2 plan=$3
  shift 3
  rm -f "$tmp/log"
  timeout -k 5 120 "$FSEXEC" --nproc "$n" "$plan" --steps 100000000 --threads 1 --log "$tmp/log" \
    --log-every 100000000 "$@" >"$tmp/$name.out" 2>&1 &
  launcher=$!
  for _ in $(seq "${START_TRIES:-300}"); do
    [ -s "$tmp/log" ] && break
    sleep 0.1
  done
  # timeout -> fsexec --nproc (the launcher) -> mpirun -> the ranks
  ranks=$(pgrep -P "$(pgrep -P "$(pgrep -P "$launcher" | head -1)" | head -1)" | tr '\n' ' ')
  [ -s "$tmp/log" ] && [ "$(wc -w <<<"$ranks")" -eq "$n" ]
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

finish() {
  echo "$failures failure(s)"
  [ "$failures" -eq 0 ]
  exit
}
