#ifndef RJ_API_H
#define RJ_API_H
/* Everything the cffi module exposes; rj_api.cdef (+ each area's *.cdef) is the cffi-parsable
 * mirror of it. */
#include <stdint.h>

#include "rj_err.h"
#include "sim/rj_sim.h"

/* Bumped whenever a struct shared with Python or written to disk changes. */
#define RJ_ABI_VERSION 2u

uint32_t rj_abi_version(void);

#endif /* RJ_API_H */
