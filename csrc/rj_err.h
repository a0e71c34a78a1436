#ifndef RJ_ERR_H
#define RJ_ERR_H
/* Every rj_ call that can fail returns 0 or a negative RJ_E* code and fills an rj_err with a
 * message meant for the user: what went wrong, where, and what to do. Nothing aborts. */
#include <stdint.h>

enum {
    RJ_OK = 0,
    RJ_EINVAL = -1,   /* bad argument or malformed program */
    RJ_ENOMEM = -2,
    RJ_EFAULT = -3,   /* an address outside every buffer */
    RJ_EHAZARD = -4,  /* strict mode: a register program the hardware is known to mishandle */
    RJ_EUNSUPP = -5,  /* a register setting the simulator does not model */
    RJ_EIO = -6,      /* a device ioctl failed */
    RJ_ETIMEDOUT = -7,
};

typedef struct rj_err {
    int32_t code;
    uint32_t reserved; /* must be zero */
    char msg[1024];
} rj_err;

/* Sets err (when non-NULL) and returns code; printf-style. */
int rj_fail(rj_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif /* RJ_ERR_H */
