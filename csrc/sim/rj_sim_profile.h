#ifndef RJ_SIM_PROFILE_H
#define RJ_SIM_PROFILE_H
/* Where a simulator's CNA/CORE/DPU time went (bench/sim_matmul.py prints it). Always on: a
 * handful of clock reads per conv task, negligible next to the task's work. */
#include <stdint.h>

#include "sim/rj_sim.h"

/* Wall-clock nanoseconds summed over every conv task the simulator ran. */
typedef struct rj_sim_phase_ns {
    uint64_t conv_tasks;   /* conv tasks timed */
    uint64_t feature;      /* feature cube fetch + fp16/bf16 -> fp32 (skipped under DATA_REUSE) */
    uint64_t weights;      /* weight fetch into fp32 panels (skipped under WEIGHT_REUSE) */
    uint64_t columns;      /* im2col and feature panel packing (reused while the CBUF tile is) */
    uint64_t mac;          /* the MAC array (fp32 / int32 GEMM or depthwise) */
    uint64_t dpu;          /* DPU post-processing and the output write */
} rj_sim_phase_ns;

/* Copy the totals into `out`; all zero when no conv task has run. */
void rj_sim_get_phase_ns(const rj_sim *sim, rj_sim_phase_ns *out);

#endif /* RJ_SIM_PROFILE_H */
