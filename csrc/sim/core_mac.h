#ifndef RJ_CORE_MAC_H
#define RJ_CORE_MAC_H
/* CORE MAC kernels used by cna.c (internal to the simulator).
 *
 * Result contract shared by every kernel path (AVX-512, AVX2, portable) and by the two-thread
 * split: each fp32 output is C0 followed by one fused multiply-add per k, in increasing k order
 * (acc = fmaf(a[m][k], b[k][n], acc)). Blocking, packing, dispatch and threads never change
 * that order, so they never change a result bit; rj_sim_mac_selftest checks it. */
#include <stddef.h>
#include <stdint.h>

/* Operand layouts, both 64-byte aligned:
 *  - features (A) as panels of RJ_MAC_MR rows, [ceil(M/MR)][K][MR], rows past M zero
 *    (rj_mac_pack_a, or rj_mac_pack_rows panel by panel, writes it);
 *  - weights (B) as panels of RJ_MAC_NR output channels, [ceil(N/NR)][K][NR], zero past N. */
#define RJ_MAC_MR 12
#define RJ_MAC_NR 16

/* Floats of the packed-feature layout for an M x K operand. */
size_t rj_mac_packed_a_floats(size_t M, size_t K);

/* One panel's worth of packing: dst[c*MR + i] = src[i] ? src[i][c] : fill[i] for c < n (a row
 * of the panel is a source row or a constant: padding, or zero past M). */
void rj_mac_pack_rows(const float *const src[RJ_MAC_MR], const float fill[RJ_MAC_MR], size_t n, float *dst);

/* Pack row-major A[M x K] (row stride lda) into the panel layout above. */
void rj_mac_pack_a(size_t M, size_t K, const float *A, size_t lda, float *Ap);

/* C[M x N] (row stride ldc) += A . B over the packed operands. Large products are shared with
 * the helper thread (rj_mac_parallel_for) in blocks of whole output elements. Returns 0; the
 * int return keeps the caller's error path for future scratch needs. */
int rj_mac_gemm_f32(size_t M, size_t N, size_t K, const float *Ap, const float *Bp, float *C, size_t ldc);

/* Run fn(ctx, i) for every i in [0, nitems), on the calling thread and, when `parallel` is set
 * and the host has two cores, one process-wide helper thread that takes items as it becomes
 * free. Items must be independent (disjoint outputs), so which thread runs one cannot change a
 * result. Returns when every item is done. */
typedef void (*rj_mac_item_fn)(void *ctx, size_t item);
void rj_mac_parallel_for(size_t nitems, rj_mac_item_fn fn, void *ctx, int parallel);

/* C[M x N] += A[M x K] . B[K x N] in int32 (caller proves the sum cannot overflow). */
void rj_mac_gemm_i32(size_t M, size_t N, size_t K, const int32_t *A, size_t lda, const int32_t *B, int32_t *C,
                     size_t ldc);

#endif /* RJ_CORE_MAC_H */
