/* CORE: the MAC array, as dense host arithmetic over the operands the CNA unpacked.
 *
 * The hardware reduces over the whole K of a CBUF-resident tile in one pass and accumulates
 * fp16 products in a wide float accumulator (FP44/FP48 -> FP32) and int8 products in a wide
 * integer accumulator (INT34 -> INT32) (notes: hardware-overview.md "Accumulators";
 * matmul-as-conv.md "The data flow per tile"). Its summation order is not documented, so
 * any fp32 order is as good as another; we use a cache-blocked order that is fast. The fp16
 * rounding of the result belongs to the DPU output converter, not here. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define RJ_MAC_AVX2 1
#endif

#include "core_mac.h"
#include "rj_sim_debug.h"

/* Register block (MR x NR) and cache blocks: a KC x NR weight panel (16 KB) stays in L1 while
 * an MC x KC feature block (120 KB) sits in L2. */
#define KC 256
#define MC 120

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* Pack A[m0:m0+mc, k0:k0+kc] as panels of `mr` rows, k-major inside a panel (rows past the
 * end of A are zero), the operand order both register kernels stream. */
static void pack_a(const float *A, size_t lda, size_t m0, size_t mc, size_t k0, size_t kc, size_t mr,
                   float *apack)
{
    for (size_t mp = 0; mp < mc; mp += mr) {
        float *dst = apack + mp * kc;
        size_t rows = min_sz(mr, mc - mp);
        for (size_t i = 0; i < mr; i++) {
            if (i >= rows) {
                for (size_t k = 0; k < kc; k++)
                    dst[k * mr + i] = 0.0f;
                continue;
            }
            const float *src = A + (m0 + mp + i) * lda + k0;
            for (size_t k = 0; k < kc; k++)
                dst[k * mr + i] = src[k];
        }
    }
}

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

static int gemm_f32_avx2(size_t M, size_t N, size_t K, const float *A, size_t lda, const float *Bp, float *C,
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
            pack_a(A, lda, m0, mc, k0, kc, RJ_MAC_MR, apack);
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


/* ---- AVX-512 path (runtime-dispatched) ------------------------------------------------------
 * The build targets AVX2, but most x86 hosts we run on have AVX-512; a 12 x 32 register block
 * over two adjacent 16-wide weight panels doubles the MAC rate per core. Same panel layout as
 * the AVX2 path, so the CNA's unpacked weights serve both. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RJ_MAC_HAVE_512 1
#define MR5 12
#define MC5 144

__attribute__((target("avx512f,fma"))) static void kernel512(size_t kc, const float *a, const float *b0,
                                                             const float *b1, float *c, size_t ldc)
{
    __m512 acc[2 * MR5];
#pragma GCC unroll 12
    for (int i = 0; i < MR5; i++) {
        acc[2 * i] = _mm512_loadu_ps(c + (size_t)i * ldc);
        acc[2 * i + 1] = _mm512_loadu_ps(c + (size_t)i * ldc + 16);
    }
    for (size_t k = 0; k < kc; k++) {
        __m512 x0 = _mm512_loadu_ps(b0 + k * RJ_MAC_NR);
        __m512 x1 = _mm512_loadu_ps(b1 + k * RJ_MAC_NR);
        const float *ak = a + k * MR5;
#pragma GCC unroll 12
        for (int i = 0; i < MR5; i++) {
            __m512 av = _mm512_set1_ps(ak[i]);
            acc[2 * i] = _mm512_fmadd_ps(av, x0, acc[2 * i]);
            acc[2 * i + 1] = _mm512_fmadd_ps(av, x1, acc[2 * i + 1]);
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < MR5; i++) {
        _mm512_storeu_ps(c + (size_t)i * ldc, acc[2 * i]);
        _mm512_storeu_ps(c + (size_t)i * ldc + 16, acc[2 * i + 1]);
    }
}

__attribute__((target("avx512f,fma"))) static int gemm_f32_avx512(size_t M, size_t N, size_t K, const float *A,
                                                                  size_t lda, const float *Bp, float *C, size_t ldc)
{
    if (M == 0 || N == 0 || K == 0)
        return 0;
    float *apack = aligned_alloc(64, sizeof(float) * MC5 * KC);
    if (!apack)
        return -1;
    size_t npanels = (N + RJ_MAC_NR - 1) / RJ_MAC_NR;
    for (size_t k0 = 0; k0 < K; k0 += KC) {
        size_t kc = min_sz(KC, K - k0);
        for (size_t m0 = 0; m0 < M; m0 += MC5) {
            size_t mc = min_sz(MC5, M - m0);
            pack_a(A, lda, m0, mc, k0, kc, MR5, apack);
            for (size_t np = 0; np < npanels; np += 2) {
                const float *b0 = Bp + np * K * RJ_MAC_NR + k0 * RJ_MAC_NR;
                int pair = np + 1 < npanels;
                const float *b1 = pair ? b0 + K * RJ_MAC_NR : b0;
                size_t ncols = min_sz(pair ? 2 * RJ_MAC_NR : RJ_MAC_NR, N - np * RJ_MAC_NR);
                for (size_t mp = 0; mp < mc; mp += MR5) {
                    size_t mr = min_sz(MR5, mc - mp);
                    float *c = C + (m0 + mp) * ldc + np * RJ_MAC_NR;
                    if (mr == MR5 && ncols == 2 * RJ_MAC_NR) {
                        kernel512(kc, apack + mp * kc, b0, b1, c, ldc);
                    } else {
                        float tmp[MR5 * 2 * RJ_MAC_NR] __attribute__((aligned(64)));
                        memset(tmp, 0, sizeof tmp);
                        for (size_t i = 0; i < mr; i++)
                            memcpy(tmp + i * 2 * RJ_MAC_NR, c + i * ldc, ncols * sizeof(float));
                        kernel512(kc, apack + mp * kc, b0, b1, tmp, 2 * RJ_MAC_NR);
                        for (size_t i = 0; i < mr; i++)
                            memcpy(c + i * ldc, tmp + i * 2 * RJ_MAC_NR, ncols * sizeof(float));
                    }
                }
            }
        }
    }
    free(apack);
    return 0;
}
#endif

/* Host facts probed once (pthread_once: several simulators may run on several threads, e.g.
 * one per fake rocket fd, so no lazily written static is left to race). */
static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static int host_avx512, host_nthreads;

static void probe_host(void)
{
#if RJ_MAC_HAVE_512
    __builtin_cpu_init();
    host_avx512 = __builtin_cpu_supports("avx512f") ? 1 : 0;
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    host_nthreads = n >= 2 ? 2 : 1;
}

/* Kernel choice: the best the host has, or (self-test) the AVX2/portable one. */
enum { MAC_BEST = 0, MAC_AVX2 = 1 };

static int gemm_f32_one(size_t M, size_t N, size_t K, const float *A, size_t lda, const float *Bp, float *C,
                        size_t ldc, int which)
{
#if RJ_MAC_HAVE_512
    if (which == MAC_BEST && host_avx512)
        return gemm_f32_avx512(M, N, K, A, lda, Bp, C, ldc);
#endif
    (void)which;
    return gemm_f32_avx2(M, N, K, A, lda, Bp, C, ldc);
}

/* Large products are split over two threads by output-channel panels (each thread owns whole
 * 32-column panel pairs, so every element is summed in exactly the order the one-thread path
 * uses: the split never changes a result bit). */
typedef struct gemm_part {
    size_t M, N, K, lda, ldc;
    const float *A, *Bp;
    float *C;
    int which, rc;
} gemm_part;

static void *gemm_part_run(void *arg)
{
    gemm_part *p = arg;
    p->rc = gemm_f32_one(p->M, p->N, p->K, p->A, p->lda, p->Bp, p->C, p->ldc, p->which);
    return NULL;
}

/* threads: 1 = never split, 0 = split when the product is large and the host has 2 cores. The
 * two halves write disjoint column ranges of C and read shared A/B only. */
static int gemm_f32(size_t M, size_t N, size_t K, const float *A, size_t lda, const float *Bp, float *C,
                    size_t ldc, int which, int threads)
{
    pthread_once(&host_once, probe_host);
    size_t npanels = (N + RJ_MAC_NR - 1) / RJ_MAC_NR;
    if (threads == 1 || host_nthreads < 2 || (double)M * N * K < 4.0e6 || npanels < 4)
        return gemm_f32_one(M, N, K, A, lda, Bp, C, ldc, which);
    size_t split = (npanels / 2) & ~(size_t)1; /* an even panel count for the first half */
    gemm_part hi = {M, N - split * RJ_MAC_NR, K, lda, ldc, A, Bp + split * K * RJ_MAC_NR,
                    C + split * RJ_MAC_NR, which, 0};
    pthread_t th;
    if (pthread_create(&th, NULL, gemm_part_run, &hi) != 0)
        return gemm_f32_one(M, N, K, A, lda, Bp, C, ldc, which);
    int rc = gemm_f32_one(M, split * RJ_MAC_NR, K, A, lda, Bp, C, ldc, which);
    pthread_join(th, NULL);
    return rc ? rc : hi.rc;
}

int rj_mac_gemm_f32(size_t M, size_t N, size_t K, const float *A, size_t lda, const float *Bp, float *C,
                    size_t ldc)
{
    return gemm_f32(M, N, K, A, lda, Bp, C, ldc, MAC_BEST, 0);
}

static float lcg_value(uint32_t *seed, int exact)
{
    *seed = *seed * 1664525u + 1013904223u;
    int v = (int)(*seed >> 24) - 128;
    /* exact: multiples of 1/64 below 2, whose products and sums are exact in fp32 here;
     * otherwise values with a full mantissa, whose sums round */
    return exact ? (float)v / 64.0f : (float)v / 61.7f + (float)(*seed & 0xFFFu) * 1.3e-5f;
}

/* Weights in the CNA's panel layout [ceil(N/NR)][K][NR]. */
static float *make_panels(const float *B, size_t N, size_t K)
{
    size_t np = (N + RJ_MAC_NR - 1) / RJ_MAC_NR;
    float *Bp = aligned_alloc(64, sizeof(float) * np * K * RJ_MAC_NR + 64);
    if (!Bp)
        return NULL;
    memset(Bp, 0, sizeof(float) * np * K * RJ_MAC_NR);
    for (size_t n = 0; n < N; n++)
        for (size_t k = 0; k < K; k++)
            Bp[(n / RJ_MAC_NR) * K * RJ_MAC_NR + k * RJ_MAC_NR + n % RJ_MAC_NR] = B[n * K + k];
    return Bp;
}

/* Compare every available kernel with a plain double-precision loop on awkward shapes (edge
 * rows/panels, K across cache blocks), then check determinism on rounding data: the two-thread
 * split and the AVX2 kernel must reproduce the one-thread best kernel bit for bit. Returns 0,
 * the failing exactness shape index + 1, 100 for a determinism failure, or -1 (no memory). */
int rj_sim_mac_selftest(void)
{
    static const size_t shapes[][3] = {{1, 1, 1}, {6, 16, 8}, {13, 33, 300}, {150, 48, 257}, {12, 32, 520},
                                       {7, 17, 31}, {40, 160, 700}, {96, 130, 520}};
    const size_t nshapes = sizeof shapes / sizeof shapes[0];
    uint32_t seed = 12345u;
    for (size_t s = 0; s <= nshapes; s++) {
        int determinism = s == nshapes; /* the last pass reuses the largest shape, inexact data */
        size_t M = shapes[determinism ? nshapes - 1 : s][0], N = shapes[determinism ? nshapes - 1 : s][1],
               K = shapes[determinism ? nshapes - 1 : s][2];
        float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * N * K);
        float *C = malloc(sizeof(float) * M * N), *C2 = malloc(sizeof(float) * M * N);
        float *Bp = NULL;
        int fail = 0;
        if (A && B && C && C2) {
            for (size_t i = 0; i < M * K; i++)
                A[i] = lcg_value(&seed, !determinism);
            for (size_t i = 0; i < N * K; i++)
                B[i] = lcg_value(&seed, !determinism);
            Bp = make_panels(B, N, K);
        }
        if (!Bp) {
            free(A), free(B), free(C), free(C2);
            return -1;
        }
        if (determinism) {
            /* reference: one thread, best kernel */
            for (size_t i = 0; i < M * N; i++)
                C[i] = 0.5f;
            fail = gemm_f32(M, N, K, A, K, Bp, C, N, MAC_BEST, 1) ? -1 : 0;
            static const int variants[2][2] = {{MAC_BEST, 0}, {MAC_AVX2, 1}};
            for (int v = 0; v < 2 && !fail; v++) {
                for (size_t i = 0; i < M * N; i++)
                    C2[i] = 0.5f;
                if (gemm_f32(M, N, K, A, K, Bp, C2, N, variants[v][0], variants[v][1]))
                    fail = -1;
                else if (memcmp(C, C2, sizeof(float) * M * N) != 0)
                    fail = 100;
            }
        } else {
            for (int which = MAC_BEST; which <= MAC_AVX2 && !fail; which++) {
                for (size_t i = 0; i < M * N; i++)
                    C[i] = 1.0f; /* the kernels accumulate onto C */
                if (gemm_f32(M, N, K, A, K, Bp, C, N, which, 0)) {
                    fail = -1;
                    break;
                }
                for (size_t m = 0; m < M && !fail; m++)
                    for (size_t n = 0; n < N; n++) {
                        double ref = 1.0;
                        for (size_t k = 0; k < K; k++)
                            ref += (double)A[m * K + k] * B[n * K + k];
                        if ((double)C[m * N + n] != ref) {
                            fail = (int)s + 1;
                            break;
                        }
                    }
            }
        }
        free(A), free(B), free(Bp), free(C), free(C2);
        if (fail)
            return fail;
    }
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
