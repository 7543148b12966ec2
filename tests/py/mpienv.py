"""The environment multi-rank test runs need: under AddressSanitizer, Open MPI keeps
allocations to the end of the process, so tests/mpi/lsan.supp names its libraries and
full stacks let LeakSanitizer match them (as tests/mpi/lib.sh does for shell tests).

LeakSanitizer does not scan thread-local storage here (use_tls=0): its tracer crashes
at exit on a garbage dynamic-TLS record ("DTLS 9 at 0x3b60-0x400004c62", "Tracer caught
signal 11") in some 3-rank runs (zero2, world 3, 2 micro-batches, even with --steps 0;
not under --device cpu at world 2, not with leak checks off), a record of a library Open
MPI loads and unloads. Without the TLS scan, libgomp's thread pool, which only TLS points
to, is suppressed by name (lsan.supp)."""
import os

SUPP = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mpi", "lsan.supp"))


def quiet_mpi_leaks():
    opts = os.environ.get("LSAN_OPTIONS", "")
    os.environ["LSAN_OPTIONS"] = (opts + ":" if opts else "") + "suppressions=%s:print_suppressions=0:use_tls=0" % SUPP
    asan = os.environ.get("ASAN_OPTIONS", "")
    os.environ["ASAN_OPTIONS"] = (asan + ":" if asan else "") + "fast_unwind_on_malloc=0"
