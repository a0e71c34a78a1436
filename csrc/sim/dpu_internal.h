#ifndef RJ_SIM_DPU_INTERNAL_H
#define RJ_SIM_DPU_INTERNAL_H
/* Shared between dpu.c (the SDP pipeline) and dpu_write.c (the output writer). */
#include <stdint.h>

#include "sim_internal.h"

/* DPU/CNA precision field values (notes: encodings/precision-field.md). */
enum {
    RJ_PREC_INT8 = 0,
    RJ_PREC_INT16 = 1,
    RJ_PREC_FP16 = 2,
    RJ_PREC_BF16 = 3,
    RJ_PREC_INT32 = 4,
    RJ_PREC_FP32 = 5,
    RJ_PREC_INT4 = 6,
};

/* The output cube the DPU's write DMA produces. */
typedef struct rj_dpu_out {
    uint32_t width, height, channels;
    uint32_t prec;        /* DPU_DATA_FORMAT.OUT_PRECISION */
    uint32_t esize;       /* bytes per element */
    uint64_t base;        /* DPU_DST_BASE_ADDR */
    uint64_t surf_stride; /* DPU_DST_SURF_STRIDE, bytes */
} rj_dpu_out;

/* Element (h, w, c) of a value array is at [(h*width + w)*channels + c]. Float outputs read
 * `vf`, integer outputs read `vi` (already saturated to the output type). */
int rj_sim_dpu_write(rj_sim_task *t, const rj_dpu_out *o, const float *vf, const int64_t *vi);

/* Bytes per element and name of an output precision; 0 / NULL when not a DPU output type. */
uint32_t rj_sim_dpu_out_esize(uint32_t prec);

#endif /* RJ_SIM_DPU_INTERNAL_H */
