/* DPU write DMA: lays the post-processed cube out in memory.
 *
 * Layout (notes: encodings/tile-layouts.md "Output cube"): channels are cut into atoms of
 * C2 = 16 / element-bytes; atom s of every position forms surface s, surfaces are
 * DPU_DST_SURF_STRIDE bytes apart, and inside a surface position (h, w) sits at
 * (h*width + w)*16 bytes (conformance 01/03/04 case.md give the same byte formulas for fp16,
 * int32 and a 2-D cube). */
#include <string.h>

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define RJ_DPU_F16C 1
#endif

#include "dpu_internal.h"

uint32_t rj_sim_dpu_out_esize(uint32_t prec)
{
    switch (prec) {
    case RJ_PREC_INT8: return 1;
    case RJ_PREC_INT16:
    case RJ_PREC_FP16: return 2;
    case RJ_PREC_INT32:
    case RJ_PREC_FP32: return 4;
    default: return 0;
    }
}

int rj_sim_dpu_write(rj_sim_task *t, const rj_dpu_out *o, const float *vf, const int64_t *vi)
{
    const uint32_t c2 = 16u / o->esize;
    const uint32_t nsurf = (o->channels + c2 - 1u) / c2;
    const uint64_t positions = (uint64_t)o->width * o->height;
    const uint64_t surf_bytes = positions * 16u;
    for (uint32_t s = 0; s < nsurf; s++) {
        uint8_t *dst = rj_sim_mem(t, o->base + (uint64_t)s * o->surf_stride, surf_bytes,
                                  "DPU_DST_BASE_ADDR");
        if (!dst)
            return t->err ? t->err->code : RJ_EFAULT;
        uint32_t c_end = (s + 1u) * c2 < o->channels ? (s + 1u) * c2 : o->channels;
        if (c_end - s * c2 == c2 && (o->prec == RJ_PREC_FP16 || o->prec == RJ_PREC_FP32)) {
            /* Whole float atoms: one 16-byte store per position. */
            const float *src = vf + (size_t)s * c2;
            if (o->prec == RJ_PREC_FP32) {
                for (uint64_t p = 0; p < positions; p++)
                    memcpy(dst + p * 16u, src + p * o->channels, 16);
            } else {
#if RJ_DPU_F16C
                /* The vector form of rj_f32_to_f16: the same F16C round-half-to-even. */
                for (uint64_t p = 0; p < positions; p++) {
                    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + p * o->channels),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                    _mm_storeu_si128((__m128i *)(void *)(dst + p * 16u), h);
                }
#else
                for (uint64_t p = 0; p < positions; p++) {
                    uint16_t h[8];
                    rj_f32_to_f16_n(src + p * o->channels, h, 8);
                    memcpy(dst + p * 16u, h, 16);
                }
#endif
            }
            t->sim->stats.bytes_written += surf_bytes;
            continue;
        }
        for (uint64_t p = 0; p < positions; p++) {
            uint8_t *atom = dst + p * 16u;
            const uint64_t row = p * o->channels;
            /* Lanes past the last channel of a partial atom are left untouched (inference: the
             * notes do not say what the write DMA puts there). */
            for (uint32_t c = s * c2; c < c_end; c++) {
                uint8_t *e = atom + (c - s * c2) * o->esize;
                switch (o->prec) {
                case RJ_PREC_FP16: {
                    uint16_t h = rj_f32_to_f16(vf[row + c]); /* round-half-to-even: fp16.c */
                    memcpy(e, &h, 2);
                    break;
                }
                case RJ_PREC_FP32: {
                    float f = vf[row + c];
                    memcpy(e, &f, 4);
                    break;
                }
                case RJ_PREC_INT32: {
                    int32_t i = (int32_t)vi[row + c];
                    memcpy(e, &i, 4);
                    break;
                }
                case RJ_PREC_INT16: {
                    int16_t i = (int16_t)vi[row + c];
                    memcpy(e, &i, 2);
                    break;
                }
                case RJ_PREC_INT8: {
                    int8_t i = (int8_t)vi[row + c];
                    memcpy(e, &i, 1);
                    break;
                }
                default:
                    return rj_fail(t->err, RJ_EUNSUPP,
                                   "job %u task %u: DPU_DATA_FORMAT: output precision %u has no "
                                   "modelled writer", t->job_index, t->task_index, o->prec);
                }
            }
        }
        /* The write DMA moves whole 16-byte atoms. */
        t->sim->stats.bytes_written += surf_bytes;
    }
    return 0;
}
