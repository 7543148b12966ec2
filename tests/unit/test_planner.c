#include <criterion/criterion.h>
#include "planner.h"
Test(planner, placeholder_build) { cr_assert(1); }
