#!/usr/bin/env bash
# Runs tests/mpi/collectives.c's binary at world 2, 3 and 4. usage: collectives.sh BINARY
set -uo pipefail
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIP: mpirun not found (apt install openmpi-bin)"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Under AddressSanitizer (scripts/test.sh --sanitize) Open MPI keeps allocations to the
# end of the process: full stacks let lsan.supp find them, so only our leaks are reported.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lsan.supp:print_suppressions=0:use_tls=0"  # use_tls=0: tests/py/mpienv.py says why
failures=0
for n in 2 3 4; do
  if out=$(timeout 60 mpirun -np "$n" --oversubscribe "$1" 2>&1); then
    echo "ok   world $n"
  else
    echo "FAIL world $n:"
    failures=$((failures + 1))
  fi
  sed 's/^/    /' <<<"$out" | sort
done
echo "$failures failure(s)"
[ "$failures" -eq 0 ]
