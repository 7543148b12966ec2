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
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lsan.supp:print_suppressions=0"
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

finish() {
  rm -rf "$tmp"
  echo "$failures failure(s)"
  [ "$failures" -eq 0 ]
  exit
}
