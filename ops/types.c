/* ops/types.c: names and sizes of the dtypes every layer shares. */
#include <string.h>

#include "ops.h"

static const char *const DTYPES[DT_COUNT] = {"f32", "f16", "bf16", "i32"};
static const int DTYPE_SIZES[DT_COUNT] = {4, 2, 2, 4};

const char *dtype_name(DType t) { return (unsigned)t < DT_COUNT ? DTYPES[t] : "?"; }
int dtype_size(DType t) { return (unsigned)t < DT_COUNT ? DTYPE_SIZES[t] : 0; }
int dtype_is_float(DType t) { return t == DT_F32 || t == DT_F16 || t == DT_BF16; }

int dtype_parse(const char *s, DType *out)
{
    for (int i = 0; i < DT_COUNT; i++)
        if (!strcmp(s, DTYPES[i])) {
            *out = (DType)i;
            return 0;
        }
    return -1;
}
