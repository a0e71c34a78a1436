/* CORE: the MAC array, as dense host arithmetic over the operands the CNA unpacked.
 *
 * The hardware reduces over the whole K of a CBUF-resident tile in one pass and accumulates
 * fp16 products in a wide float accumulator (FP44/FP48 -> FP32) and int8 products in a wide
 * integer accumulator (INT34 -> INT32) (notes: hardware-overview.md "Accumulators";
 * matmul-as-conv.md "The data flow per tile"). Its summation order is not documented, so
 * any fp32 order is as good as another; we use a cache-blocked order that is fast. The fp16
 * rounding of the result belongs to the DPU output converter, not here. */
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RJ_MAC_AVX2 1
#endif

#include "core_mac.h"

/* Register block (MR x NR) and cache blocks: a KC x NR weight panel (16 KB) stays in L1 while
 * an MC x KC feature block (120 KB) sits in L2. */
#define KC 256
#define MC 120

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* c[MR x NR] (row stride ldc) += a[kc x MR] . b[kc x NR] */
static void kernel_full(size_t kc, const float *a, const float *b, float *c, size_t ldc)
{
#if RJ_MAC_AVX2
    __m256 c00 = _mm256_loadu_ps(c + 0 * ldc), c01 = _mm256_loadu_ps(c + 0 * ldc + 8);
    __m256 c10 = _mm256_loadu_ps(c + 1 * ldc), c11 = _mm256_loadu_ps(c + 1 * ldc + 8);
    __m256 c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
    __m256 c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
    __m256 c40 = _mm256_loadu_ps(c + 4 * ldc), c41 = _mm256_loadu_ps(c + 4 * ldc + 8);
    __m256 c50 = _mm256_loadu_ps(c + 5 * ldc), c51 = _mm256_loadu_ps(c + 5 * ldc + 8);
    for (size_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(b + k * RJ_MAC_NR);
        __m256 b1 = _mm256_load_ps(b + k * RJ_MAC_NR + 8);
        const float *ak = a + k * RJ_MAC_MR;
        __m256 x;
        x = _mm256_broadcast_ss(ak + 0); c00 = _mm256_fmadd_ps(x, b0, c00); c01 = _mm256_fmadd_ps(x, b1, c01);
        x = _mm256_broadcast_ss(ak + 1); c10 = _mm256_fmadd_ps(x, b0, c10); c11 = _mm256_fmadd_ps(x, b1, c11);
        x = _mm256_broadcast_ss(ak + 2); c20 = _mm256_fmadd_ps(x, b0, c20); c21 = _mm256_fmadd_ps(x, b1, c21);
        x = _mm256_broadcast_ss(ak + 3); c30 = _mm256_fmadd_ps(x, b0, c30); c31 = _mm256_fmadd_ps(x, b1, c31);
        x = _mm256_broadcast_ss(ak + 4); c40 = _mm256_fmadd_ps(x, b0, c40); c41 = _mm256_fmadd_ps(x, b1, c41);
        x = _mm256_broadcast_ss(ak + 5); c50 = _mm256_fmadd_ps(x, b0, c50); c51 = _mm256_fmadd_ps(x, b1, c51);
    }
    _mm256_storeu_ps(c + 0 * ldc, c00); _mm256_storeu_ps(c + 0 * ldc + 8, c01);
    _mm256_storeu_ps(c + 1 * ldc, c10); _mm256_storeu_ps(c + 1 * ldc + 8, c11);
    _mm256_storeu_ps(c + 2 * ldc, c20); _mm256_storeu_ps(c + 2 * ldc + 8, c21);
    _mm256_storeu_ps(c + 3 * ldc, c30); _mm256_storeu_ps(c + 3 * ldc + 8, c31);
    _mm256_storeu_ps(c + 4 * ldc, c40); _mm256_storeu_ps(c + 4 * ldc + 8, c41);
    _mm256_storeu_ps(c + 5 * ldc, c50); _mm256_storeu_ps(c + 5 * ldc + 8, c51);
#else
    /* Portable form: gcc -O3 vectorizes the j loop. */
    for (size_t i = 0; i < RJ_MAC_MR; i++) {
        float acc[RJ_MAC_NR];
        memcpy(acc, c + i * ldc, sizeof acc);
        for (size_t k = 0; k < kc; k++) {
            float x = a[k * RJ_MAC_MR + i];
            for (size_t j = 0; j < RJ_MAC_NR; j++)
                acc[j] += x * b[k * RJ_MAC_NR + j];
        }
        memcpy(c + i * ldc, acc, sizeof acc);
    }
#endif
}

/* An edge tile (mr < MR or nr < NR) goes through a full-size scratch tile. */
static void kernel_edge(size_t kc, const float *a, const float *b, float *c, size_t ldc, size_t mr, size_t nr)
{
    float tmp[RJ_MAC_MR * RJ_MAC_NR];
    memset(tmp, 0, sizeof tmp);
    for (size_t i = 0; i < mr; i++)
        memcpy(tmp + i * RJ_MAC_NR, c + i * ldc, nr * sizeof(float));
    kernel_full(kc, a, b, tmp, RJ_MAC_NR);
    for (size_t i = 0; i < mr; i++)
        memcpy(c + i * ldc, tmp + i * RJ_MAC_NR, nr * sizeof(float));
}

int rj_mac_gemm_f32(size_t M, size_t N, size_t K, const float *A, size_t lda, const float *Bp, float *C,
                    size_t ldc)
{
    if (M == 0 || N == 0 || K == 0)
        return 0;
    float *apack = aligned_alloc(64, sizeof(float) * MC * KC);
    if (!apack)
        return -1;
    size_t npanels = (N + RJ_MAC_NR - 1) / RJ_MAC_NR;
    for (size_t k0 = 0; k0 < K; k0 += KC) {
        size_t kc = min_sz(KC, K - k0);
        for (size_t m0 = 0; m0 < M; m0 += MC) {
            size_t mc = min_sz(MC, M - m0);
            /* pack A[m0:m0+mc, k0:k0+kc] as MR-row panels, k-major inside a panel */
            for (size_t mp = 0; mp < mc; mp += RJ_MAC_MR) {
                float *dst = apack + mp * kc;
                size_t mr = min_sz(RJ_MAC_MR, mc - mp);
                for (size_t i = 0; i < RJ_MAC_MR; i++) {
                    if (i < mr) {
                        const float *src = A + (m0 + mp + i) * lda + k0;
                        for (size_t k = 0; k < kc; k++)
                            dst[k * RJ_MAC_MR + i] = src[k];
                    } else {
                        for (size_t k = 0; k < kc; k++)
                            dst[k * RJ_MAC_MR + i] = 0.0f;
                    }
                }
            }
            for (size_t np = 0; np < npanels; np++) {
                const float *bp = Bp + np * K * RJ_MAC_NR + k0 * RJ_MAC_NR;
                size_t nr = min_sz(RJ_MAC_NR, N - np * RJ_MAC_NR);
                for (size_t mp = 0; mp < mc; mp += RJ_MAC_MR) {
                    size_t mr = min_sz(RJ_MAC_MR, mc - mp);
                    float *c = C + (m0 + mp) * ldc + np * RJ_MAC_NR;
                    if (mr == RJ_MAC_MR && nr == RJ_MAC_NR)
                        kernel_full(kc, apack + mp * kc, bp, c, ldc);
                    else
                        kernel_edge(kc, apack + mp * kc, bp, c, ldc, mr, nr);
                }
            }
        }
    }
    free(apack);
    return 0;
}

void rj_mac_gemm_i32(size_t M, size_t N, size_t K, const int32_t *A, size_t lda, const int32_t *B, int32_t *C,
                     size_t ldc)
{
    /* B is [K][N]; the n loop is contiguous and vectorizes (vpmulld/vpaddd). Callers guarantee
     * no int32 overflow (see rj_mac_i32_safe). */
    for (size_t m = 0; m < M; m++) {
        int32_t *restrict c = C + m * ldc;
        const int32_t *a = A + m * lda;
        for (size_t k = 0; k < K; k++) {
            int32_t x = a[k];
            if (x == 0)
                continue;
            const int32_t *restrict b = B + k * N;
            for (size_t n = 0; n < N; n++)
                c[n] += x * b[n];
        }
    }
}
