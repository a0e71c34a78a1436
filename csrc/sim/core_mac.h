#ifndef RJ_CORE_MAC_H
#define RJ_CORE_MAC_H
/* CORE MAC kernels used by cna.c (internal to the simulator). */
#include <stddef.h>
#include <stdint.h>

/* Register block of the fp32 kernel: weights are stored as panels of RJ_MAC_NR output
 * channels, [ceil(N/NR)][K][NR] (zero-padded), 32-byte aligned. */
#define RJ_MAC_MR 6
#define RJ_MAC_NR 16

/* C[M x N] (row stride ldc) += A[M x K] (row stride lda) . B, B in the panel layout above.
 * Returns -1 when scratch memory cannot be allocated. */
int rj_mac_gemm_f32(size_t M, size_t N, size_t K, const float *A, size_t lda, const float *Bp, float *C,
                    size_t ldc);

/* C[M x N] += A[M x K] . B[K x N] in int32 (caller proves the sum cannot overflow). */
void rj_mac_gemm_i32(size_t M, size_t N, size_t K, const int32_t *A, size_t lda, const int32_t *B, int32_t *C,
                     size_t ldc);

#endif /* RJ_CORE_MAC_H */
