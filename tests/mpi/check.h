/* tests/mpi/check.h: CHECK for the programs mpirun runs in tests/mpi/: a failed condition
 * is counted in `fails` and printed with this process's rank (`me`, set by the program)
 * and the line, and the run goes on, so every rank reports every mismatch. */
#ifndef FS_TESTS_MPI_CHECK_H
#define FS_TESTS_MPI_CHECK_H

#include <stdio.h>
#include <string.h>

static int fails, me;

#define CHECK(cond, ...)                                                                        \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fails++;                                                                            \
            printf("[rank %d] %s:%d: ", me, strrchr("/" __FILE__, '/') + 1, __LINE__);          \
            printf(__VA_ARGS__);                                                                \
            printf("\n");                                                                       \
        }                                                                                       \
    } while (0)

#endif
