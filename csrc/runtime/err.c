#include <stdarg.h>
#include <stdio.h>

#include "rj_err.h"

int rj_fail(rj_err *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        err->reserved = 0;
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return code;
}
