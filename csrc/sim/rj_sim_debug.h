#ifndef RJ_SIM_DEBUG_H
#define RJ_SIM_DEBUG_H
/* Simulator self-checks and debug views, exposed to Python for tests (sim.cdef). */
#include <stdint.h>

#include "sim/rj_sim.h"

/* Cross-checks the F16C and portable fp16 conversions over every half (0 = agree). */
int rj_sim_f16_selftest(void);

/* The accumulator cube of the most recent CNA/CORE task, before the DPU: dims = width,
 * height, channels, is_int; element (h, w, c) at [(h*width + w)*channels + c], fp32 or int32.
 * Copies into buf when it is large enough. Returns the element count, or -1. */
int64_t rj_sim_last_acc(const rj_sim *sim, uint32_t dims[4], void *buf, uint64_t buf_bytes);

/* Cross-checks every MAC kernel (AVX-512 when the host has it, AVX2/portable) against a plain
 * loop on edge-heavy shapes (0 = all exact). */
int rj_sim_mac_selftest(void);

#endif /* RJ_SIM_DEBUG_H */
