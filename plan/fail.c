/* plan/fail.c: the one error formatter of every layer that carries the plan (plan/,
 * the runtime, the CUDA backend library, test backends): a message into the caller's
 * buffer, and -1, so a check reads `return plan_fail(err, errlen, "...", ...)`. */
#include <stdarg.h>
#include <stdio.h>

#include "plan.h"

int plan_vfail(char *err, size_t errlen, const char *fmt, va_list ap)
{
    if (err && errlen) vsnprintf(err, errlen, fmt, ap);
    return -1;
}

int plan_fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    plan_vfail(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}
