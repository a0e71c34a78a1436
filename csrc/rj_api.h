#ifndef RJ_API_H
#define RJ_API_H
#include <stdint.h>

/* Bumped whenever a struct shared with Python or written to disk changes. */
#define RJ_ABI_VERSION 1u

uint32_t rj_abi_version(void);

#endif /* RJ_API_H */
