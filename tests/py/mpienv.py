"""The environment multi-rank test runs need: under AddressSanitizer, Open MPI keeps
allocations to the end of the process, so tests/mpi/lsan.supp names its libraries and
full stacks let LeakSanitizer match them (as tests/mpi/lib.sh does for shell tests)."""
import os

SUPP = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mpi", "lsan.supp"))


def quiet_mpi_leaks():
    opts = os.environ.get("LSAN_OPTIONS", "")
    os.environ["LSAN_OPTIONS"] = (opts + ":" if opts else "") + "suppressions=%s:print_suppressions=0" % SUPP
    asan = os.environ.get("ASAN_OPTIONS", "")
    os.environ["ASAN_OPTIONS"] = (asan + ":" if asan else "") + "fast_unwind_on_malloc=0"
