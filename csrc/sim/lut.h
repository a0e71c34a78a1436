#ifndef RJ_SIM_LUT_H
#define RJ_SIM_LUT_H
/* DPU LUT internals shared by lut.c and dpu.c (not part of the cross-part contract). */
#include <stdint.h>

#include "sim_internal.h"

/* RK3588 tables hold 513 entries each (notes: encodings/dpu-lut-activation.md, "RK3588 uses
 * 513 each", and conformance 05 uploads 513 words per table). LUT_ADDR is 10 bits wide. */
#define RJ_LUT_ENTRIES 513u

enum { RJ_LUT_LE = 0, RJ_LUT_LO = 1 };

/* Where one lookup landed: which table, which segment, and whether it extrapolated. */
typedef struct rj_lut_hit {
    int table;    /* RJ_LUT_LE or RJ_LUT_LO */
    int region;   /* -1 underflow (below START), 0 inside the table, +1 overflow (above END) */
    int32_t seg;  /* segment index inside the table when region == 0 */
    int zero_read; /* region == 0 and an entry of exactly 0 carries interpolation weight */
} rj_lut_hit;

/* Check the LUT_* configuration of the current task before any lookup: refuses settings the
 * model does not cover (RJ_EUNSUPP) and tables never uploaded (RJ_EINVAL). */
int rj_sim_lut_validate(rj_sim_task *t);

/* One lookup: `index` is the table address in index units, the value after the whole BN stage
 * (MUL then ALU). Both tables look it up and DPU_LUT_CFG's priorities choose (lut.c). Returns
 * the interpolated table value in table units (Q0.15 for the tables the notes build). */
float rj_sim_lut_eval(const rj_sim *sim, float index, rj_lut_hit *hit);

/* Length of the run of identical entries around segment `seg` of `table` (>= 1). */
uint32_t rj_sim_lut_flat_run(const rj_sim *sim, int table, int32_t seg, int16_t *value);

#endif /* RJ_SIM_LUT_H */
