/* tests/support/tmpdir.h: a fresh temporary directory for each test that asks for one
 * (`.init = make_tmpdir, .fini = remove_tmpdir`), its path in `tmpdir`. Criterion runs
 * every test in a process of its own, so one static buffer per test file serves all. */
#ifndef FS_TEST_TMPDIR_H
#define FS_TEST_TMPDIR_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

static char tmpdir[256];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fs_test.XXXXXX");  // mkdtemp replaces the XXXXXX
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void remove_tmpdir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

#endif
