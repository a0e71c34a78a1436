/* CORE: the MAC array, as dense host arithmetic over the operands the CNA unpacked.
 *
 * The hardware reduces over the whole K of a CBUF-resident tile in one pass and accumulates
 * fp16 products in a wide float accumulator (FP44/FP48 -> FP32) and int8 products in a wide
 * integer accumulator (INT34 -> INT32) (notes: hardware-overview.md "Accumulators";
 * matmul-as-conv.md "The data flow per tile"). Its summation order is not documented; ours is
 * fixed (core_mac.h: one fused multiply-add per k, increasing k) and every kernel path keeps
 * it, so the simulator's results do not depend on the host CPU or on threading. The fp16
 * rounding of the result belongs to the DPU output converter, not here.
 *
 * Structure (a BLAS-style sgemm): the CNA hands over both operands already packed into
 * contiguous panels (core_mac.h), a register-blocked microkernel keeps an MR x NR' block of C
 * in registers across a KC-long slice of K, and a KC x 32 weight slice stays in L1 while the
 * feature panels stream from L2. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
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

#define MR RJ_MAC_MR
#define NR RJ_MAC_NR

/* K slice: a KC x 32 weight slice (16 KB) plus one KC x 12 feature panel (6 KB) fit the 48 KB
 * L1 with room for the C block and prefetch. The slice boundary only reloads C from memory,
 * where it sits exactly in fp32: it does not change the per-element fma order. */
#define KC 128

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* One product: C[M x N] (row stride ldc) += A . B over the packed operands, on kernel path
 * `which` (MAC_BEST, MAC_AVX2, MAC_PORTABLE). */
struct gemm_args {
    size_t M, N, K, ldc;
    const float *Ap, *Bp;
    float *C;
    int which;
};

size_t rj_mac_packed_a_floats(size_t M, size_t K) { return (M + MR - 1) / MR * MR * K; }

void rj_mac_pack_rows(const float *const src[RJ_MAC_MR], const float fill[RJ_MAC_MR], size_t n, float *dst)
{
    size_t c0 = 0;
#if RJ_MAC_AVX2
    /* 8 channels at a time: rows 0..7 as an 8 x 8 transpose, rows 8..11 as a 4 x 8 one. */
    for (; c0 + 8 <= n; c0 += 8) {
        __m256 r[MR];
        for (int i = 0; i < MR; i++)
            r[i] = src[i] ? _mm256_loadu_ps(src[i] + c0) : _mm256_set1_ps(fill[i]);
        __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
        __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
        __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
        __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
        __m256 t8 = _mm256_unpacklo_ps(r[8], r[9]), t9 = _mm256_unpackhi_ps(r[8], r[9]);
        __m256 ta = _mm256_unpacklo_ps(r[10], r[11]), tb = _mm256_unpackhi_ps(r[10], r[11]);
        /* s[j]: rows 0..3 of channels j and j+4 (low/high lane); u[j] rows 4..7; v[j] rows 8..11 */
        __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
        __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
        __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
        __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
        __m256 u0 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
        __m256 u1 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
        __m256 u2 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
        __m256 u3 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
        __m256 v0 = _mm256_shuffle_ps(t8, ta, _MM_SHUFFLE(1, 0, 1, 0));
        __m256 v1 = _mm256_shuffle_ps(t8, ta, _MM_SHUFFLE(3, 2, 3, 2));
        __m256 v2 = _mm256_shuffle_ps(t9, tb, _MM_SHUFFLE(1, 0, 1, 0));
        __m256 v3 = _mm256_shuffle_ps(t9, tb, _MM_SHUFFLE(3, 2, 3, 2));
        const __m256 s[4] = {s0, s1, s2, s3}, u[4] = {u0, u1, u2, u3}, v[4] = {v0, v1, v2, v3};
        for (int j = 0; j < 4; j++) {
            float *lo = dst + (c0 + (size_t)j) * MR, *hi = dst + (c0 + (size_t)j + 4) * MR;
            _mm256_storeu_ps(lo, _mm256_permute2f128_ps(s[j], u[j], 0x20));
            _mm256_storeu_ps(hi, _mm256_permute2f128_ps(s[j], u[j], 0x31));
            _mm_storeu_ps(lo + 8, _mm256_castps256_ps128(v[j]));
            _mm_storeu_ps(hi + 8, _mm256_extractf128_ps(v[j], 1));
        }
    }
#endif
    for (; c0 < n; c0++)
        for (size_t i = 0; i < MR; i++)
            dst[c0 * MR + i] = src[i] ? src[i][c0] : fill[i];
}

void rj_mac_pack_a(size_t M, size_t K, const float *A, size_t lda, float *Ap)
{
    static const float zero[MR];
    for (size_t m0 = 0; m0 < M; m0 += MR) {
        const float *src[MR];
        for (size_t i = 0; i < MR; i++)
            src[i] = m0 + i < M ? A + (m0 + i) * lda : NULL;
        rj_mac_pack_rows(src, zero, K, Ap + m0 * K); /* panel m0/MR starts at (m0/MR)*K*MR */
    }
}

/* ---- portable kernel: any mr <= MR, nr <= NR; fmaf is the contract's fused op ------------- */

static void kernel_portable(size_t kc, const float *a, const float *b, float *c, size_t ldc, size_t mr, size_t nr)
{
    for (size_t i = 0; i < mr; i++) {
        float acc[NR] = {0};
        for (size_t j = 0; j < nr; j++)
            acc[j] = c[i * ldc + j];
        for (size_t k = 0; k < kc; k++) {
            float x = a[k * MR + i];
            for (size_t j = 0; j < NR; j++)
                acc[j] = fmaf(x, b[k * NR + j], acc[j]);
        }
        for (size_t j = 0; j < nr; j++)
            c[i * ldc + j] = acc[j];
    }
}

/* ---- AVX2 kernel: 6 x 16 block, half of a 12-row feature panel per call --------------------- */

#if RJ_MAC_AVX2
/* c[6 x 16] (row stride ldc) += a[kc x 6 of a 12-wide panel row] . b[kc x 16] */
static void kernel_avx2(size_t kc, const float *a, const float *b, float *c, size_t ldc)
{
    __m256 c00 = _mm256_loadu_ps(c + 0 * ldc), c01 = _mm256_loadu_ps(c + 0 * ldc + 8);
    __m256 c10 = _mm256_loadu_ps(c + 1 * ldc), c11 = _mm256_loadu_ps(c + 1 * ldc + 8);
    __m256 c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
    __m256 c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
    __m256 c40 = _mm256_loadu_ps(c + 4 * ldc), c41 = _mm256_loadu_ps(c + 4 * ldc + 8);
    __m256 c50 = _mm256_loadu_ps(c + 5 * ldc), c51 = _mm256_loadu_ps(c + 5 * ldc + 8);
    for (size_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(b + k * NR);
        __m256 b1 = _mm256_load_ps(b + k * NR + 8);
        const float *ak = a + k * MR;
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
}

/* One 12 x 16 tile (mr, nr may be short) = two 6-row halves; short tiles go through a
 * full-size scratch tile. */
static void tile_avx2(size_t kc, const float *a, const float *b, float *c, size_t ldc, size_t mr, size_t nr)
{
    if (mr == MR && nr == NR) {
        kernel_avx2(kc, a, b, c, ldc);
        kernel_avx2(kc, a + 6, b, c + 6 * ldc, ldc);
        return;
    }
    float tmp[MR * NR];
    memset(tmp, 0, sizeof tmp);
    for (size_t i = 0; i < mr; i++)
        memcpy(tmp + i * NR, c + i * ldc, nr * sizeof(float));
    kernel_avx2(kc, a, b, tmp, NR);
    if (mr > 6)
        kernel_avx2(kc, a + 6, b, tmp + 6 * NR, NR);
    for (size_t i = 0; i < mr; i++)
        memcpy(c + i * ldc, tmp + i * NR, nr * sizeof(float));
}
#endif

/* ---- AVX-512 kernel (runtime-dispatched): 12 x 32 block over two 16-wide weight panels ------- */

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RJ_MAC_HAVE_512 1

/* acc[2i | 2i+1] += a[k][i] * [b0 | b1][k] for k < kc: the inner loop of both kernels below
 * (always inlined, so the accumulators stay in registers). */
__attribute__((target("avx512f,fma"), always_inline)) static inline void rank1_updates512(
    size_t kc, const float *a, const float *b0, const float *b1, __m512 *acc)
{
#pragma GCC unroll 2
    for (size_t k = 0; k < kc; k++) {
        __m512 x0 = _mm512_load_ps(b0 + k * NR);
        __m512 x1 = _mm512_load_ps(b1 + k * NR);
        const float *ak = a + k * MR;
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            __m512 av = _mm512_set1_ps(ak[i]);
            acc[2 * i] = _mm512_fmadd_ps(av, x0, acc[2 * i]);
            acc[2 * i + 1] = _mm512_fmadd_ps(av, x1, acc[2 * i + 1]);
        }
    }
}

/* c[12 x 32] += a[kc x 12] . [b0 | b1][kc x 32]: 24 zmm accumulators, 2 weight loads and 12
 * broadcasts per k. */
__attribute__((target("avx512f,fma"))) static void kernel512(size_t kc, const float *a, const float *b0,
                                                             const float *b1, float *c, size_t ldc)
{
    __m512 acc[2 * MR];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        acc[2 * i] = _mm512_loadu_ps(c + (size_t)i * ldc);
        acc[2 * i + 1] = _mm512_loadu_ps(c + (size_t)i * ldc + 16);
    }
    rank1_updates512(kc, a, b0, b1, acc);
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        _mm512_storeu_ps(c + (size_t)i * ldc, acc[2 * i]);
        _mm512_storeu_ps(c + (size_t)i * ldc + 16, acc[2 * i + 1]);
    }
}

/* Edge tile: mr < 12 rows and/or ncols < 32 columns (b1 may equal b0 when there is one panel).
 * Masked loads/stores touch only the mr x ncols block of C; rows past mr compute on the zero
 * rows of the packed panel and are dropped. */
__attribute__((target("avx512f,fma"))) static void kernel512_edge(size_t kc, const float *a, const float *b0,
                                                                  const float *b1, float *c, size_t ldc,
                                                                  size_t mr, size_t ncols)
{
    __mmask16 m0 = (__mmask16)(ncols >= 16 ? 0xFFFFu : (1u << ncols) - 1u);
    __mmask16 m1 = (__mmask16)(ncols >= 32 ? 0xFFFFu : ncols <= 16 ? 0u : (1u << (ncols - 16)) - 1u);
    __m512 acc[2 * MR];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        __mmask16 r0 = (size_t)i < mr ? m0 : 0, r1 = (size_t)i < mr ? m1 : 0;
        acc[2 * i] = _mm512_maskz_loadu_ps(r0, c + (size_t)i * ldc);
        acc[2 * i + 1] = _mm512_maskz_loadu_ps(r1, c + (size_t)i * ldc + 16);
    }
    rank1_updates512(kc, a, b0, b1, acc);
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        __mmask16 r0 = (size_t)i < mr ? m0 : 0, r1 = (size_t)i < mr ? m1 : 0;
        _mm512_mask_storeu_ps(c + (size_t)i * ldc, r0, acc[2 * i]);
        _mm512_mask_storeu_ps(c + (size_t)i * ldc + 16, r1, acc[2 * i + 1]);
    }
}

/* Row panels [mp0, mp1) x column panels [np0, np1) (np0 even: panels pair up as in the
 * one-call case, though pairing does not affect a result bit either). */
__attribute__((target("avx512f,fma"))) static void block_avx512(const struct gemm_args *g, size_t mp0,
                                                                size_t mp1, size_t np0, size_t np1)
{
    for (size_t k0 = 0; k0 < g->K; k0 += KC) {
        size_t kc = min_sz(KC, g->K - k0);
        for (size_t np = np0; np < np1; np += 2) {
            const float *b0 = g->Bp + np * g->K * NR + k0 * NR;
            int pair = np + 1 < np1;
            const float *b1 = pair ? b0 + g->K * NR : b0;
            size_t ncols = min_sz(pair ? 2 * NR : NR, g->N - np * NR);
            for (size_t mp = mp0; mp < mp1; mp++) {
                size_t mr = min_sz(MR, g->M - mp * MR);
                const float *a = g->Ap + mp * g->K * MR + k0 * MR;
                float *c = g->C + mp * MR * g->ldc + np * NR;
                if (mr == MR && ncols == 2 * NR)
                    kernel512(kc, a, b0, b1, c, g->ldc);
                else
                    kernel512_edge(kc, a, b0, b1, c, g->ldc, mr, ncols);
            }
        }
    }
}
#endif

/* ---- drivers ---------------------------------------------------------------------------------- */

/* Kernel choice: the best the host has, or (self-test) a specific lower path. */
enum { MAC_BEST = 0, MAC_AVX2 = 1, MAC_PORTABLE = 2 };

/* The AVX2 and portable drivers walk the same blocks as the AVX-512 one, 16 columns at a time. */
static void block_panels(const struct gemm_args *g, size_t mp0, size_t mp1, size_t np0, size_t np1)
{
    for (size_t k0 = 0; k0 < g->K; k0 += KC) {
        size_t kc = min_sz(KC, g->K - k0);
        for (size_t np = np0; np < np1; np++) {
            const float *b = g->Bp + np * g->K * NR + k0 * NR;
            size_t nr = min_sz(NR, g->N - np * NR);
            for (size_t mp = mp0; mp < mp1; mp++) {
                size_t mr = min_sz(MR, g->M - mp * MR);
                const float *a = g->Ap + mp * g->K * MR + k0 * MR;
                float *c = g->C + mp * MR * g->ldc + np * NR;
#if RJ_MAC_AVX2
                if (g->which != MAC_PORTABLE) {
                    tile_avx2(kc, a, b, c, g->ldc, mr, nr);
                    continue;
                }
#endif
                kernel_portable(kc, a, b, c, g->ldc, mr, nr);
            }
        }
    }
}

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

static void gemm_block(const struct gemm_args *g, size_t mp0, size_t mp1, size_t np0, size_t np1)
{
#if RJ_MAC_HAVE_512
    if (g->which == MAC_BEST && host_avx512) {
        block_avx512(g, mp0, mp1, np0, np1);
        return;
    }
#endif
    block_panels(g, mp0, mp1, np0, np1);
}

/* ---- the helper thread -------------------------------------------------------------------------
 * One process-wide helper thread joins the caller on independent work items, handed out by an
 * atomic counter: whichever thread is free takes the next item, so a helper that wakes late (a
 * loaded host) costs nothing but its share. Which thread computes an item never changes a
 * result bit: each item owns whole output elements and sums them in the contract's order. While
 * one caller uses the helper, another (a second simulator on another thread) runs its items
 * alone. */

typedef struct par_job {
    rj_mac_item_fn fn;
    void *ctx;
    size_t nitems;
    atomic_size_t next;
    uint64_t gen;
    int helper_in; /* the helper is running items of this job (guarded by pool.mu) */
} par_job;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    par_job *cur;  /* the job on offer, NULL when none */
    uint64_t gen;  /* jobs offered so far */
    int state;     /* 0 no helper yet, 1 running, -1 could not start (run alone) */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0};

static void run_items(par_job *j)
{
    for (;;) {
        size_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->nitems)
            return;
        j->fn(j->ctx, i);
    }
}

static void *helper_main(void *arg)
{
    (void)arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        while (!pool.cur || pool.cur->gen == seen)
            pthread_cond_wait(&pool.wake, &pool.mu);
        par_job *j = pool.cur;
        seen = j->gen;
        j->helper_in = 1;
        pthread_mutex_unlock(&pool.mu);
        run_items(j);
        pthread_mutex_lock(&pool.mu);
        j->helper_in = 0;
        pthread_cond_broadcast(&pool.done);
    }
    return NULL;
}

/* fork() keeps only the calling thread: the child starts without a helper. */
static void pool_prefork(void) { pthread_mutex_lock(&pool.mu); }
static void pool_postfork_parent(void) { pthread_mutex_unlock(&pool.mu); }
static void pool_postfork_child(void)
{
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.cur = NULL;
    pool.state = 0;
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void register_atfork(void) { pthread_atfork(pool_prefork, pool_postfork_parent, pool_postfork_child); }

/* pool.mu held. */
static void start_helper(void)
{
    pthread_attr_t attr;
    pthread_t th;
    sigset_t all, old;
    pool.state = -1;
    if (pthread_attr_init(&attr) != 0)
        return;
    /* The helper inherits a fully blocked mask: process signals (Ctrl-C in Python) stay with
     * the threads that handle them. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    if (pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0 &&
        pthread_create(&th, &attr, helper_main, NULL) == 0)
        pool.state = 1;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
}

void rj_mac_parallel_for(size_t nitems, rj_mac_item_fn fn, void *ctx, int parallel)
{
    pthread_once(&host_once, probe_host);
    par_job j = {fn, ctx, nitems, 0, 0, 0};
    if (!parallel || nitems < 2 || host_nthreads < 2) {
        run_items(&j);
        return;
    }
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&pool.mu);
    if (pool.state == 0)
        start_helper();
    if (pool.state != 1 || pool.cur) { /* no helper, or another caller has it */
        pthread_mutex_unlock(&pool.mu);
        run_items(&j);
        return;
    }
    j.gen = ++pool.gen;
    pool.cur = &j;
    pthread_cond_signal(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    run_items(&j);
    pthread_mutex_lock(&pool.mu);
    pool.cur = NULL; /* withdraw the offer, then wait for the items the helper took */
    while (j.helper_in)
        pthread_cond_wait(&pool.done, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
}

/* ---- the GEMM over work items --------------------------------------------------------------------
 * An item is a run of row panels times a run of 32-column panel pairs. The row run's packed
 * features are kept to about 512 KB so they stay in the L2 while the item walks its pairs;
 * items are numbered row-run-major, so both threads work on the same features at a time. At
 * least 8 items where the shape allows, so two threads balance even on a loaded host. */

#define ITEM_A_BYTES (512u * 1024u)
#define MIN_ITEMS 8u

typedef struct gemm_items {
    const struct gemm_args *g;
    size_t mchunk, nchunks_m; /* row panels per item, row runs */
    size_t pchunk, nchunks_n; /* panel pairs per item, pair runs */
    size_t mpanels, npanels;
} gemm_items;

static void gemm_item(void *ctx, size_t item)
{
    const gemm_items *it = ctx;
    size_t mc = item / it->nchunks_n, nc = item % it->nchunks_n;
    size_t mp0 = mc * it->mchunk, mp1 = min_sz(mp0 + it->mchunk, it->mpanels);
    size_t np0 = 2 * nc * it->pchunk, np1 = min_sz(np0 + 2 * it->pchunk, it->npanels);
    gemm_block(it->g, mp0, mp1, np0, np1);
}

static size_t div_up(size_t a, size_t b) { return (a + b - 1) / b; }

/* threads: 1 = the calling thread only, 0 = share with the helper when the product is large. */
static void gemm_f32(const struct gemm_args *g, int threads)
{
    pthread_once(&host_once, probe_host);
    if (g->M == 0 || g->N == 0 || g->K == 0)
        return;
    size_t mpanels = div_up(g->M, MR), npanels = div_up(g->N, NR);
    if (threads == 1 || host_nthreads < 2 || (double)g->M * g->N * g->K < 2.0e6) {
        gemm_block(g, 0, mpanels, 0, npanels);
        return;
    }
    size_t npairs = div_up(npanels, 2);
    size_t mchunk = ITEM_A_BYTES / (MR * g->K * sizeof(float));
    mchunk = mchunk < 1 ? 1 : min_sz(mchunk, mpanels);
    size_t nchunks_m = div_up(mpanels, mchunk);
    size_t ngroups = nchunks_m >= MIN_ITEMS ? 1 : min_sz(npairs, div_up(MIN_ITEMS, nchunks_m));
    if (nchunks_m * ngroups < MIN_ITEMS) { /* few pairs: cut the rows finer */
        nchunks_m = min_sz(mpanels, div_up(MIN_ITEMS, ngroups));
        mchunk = div_up(mpanels, nchunks_m);
        nchunks_m = div_up(mpanels, mchunk);
    }
    size_t pchunk = div_up(npairs, ngroups);
    gemm_items it = {g, mchunk, nchunks_m, pchunk, div_up(npairs, pchunk), mpanels, npanels};
    rj_mac_parallel_for(it.nchunks_m * it.nchunks_n, gemm_item, &it, 1);
}

int rj_mac_gemm_f32(size_t M, size_t N, size_t K, const float *Ap, const float *Bp, float *C, size_t ldc)
{
    struct gemm_args g = {M, N, K, ldc, Ap, Bp, C, MAC_BEST};
    gemm_f32(&g, 0);
    return 0;
}

/* ---- self-test ----------------------------------------------------------------------------------- */

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
    size_t np = (N + NR - 1) / NR;
    float *Bp = aligned_alloc(64, sizeof(float) * np * K * NR + 64);
    if (!Bp)
        return NULL;
    memset(Bp, 0, sizeof(float) * np * K * NR);
    for (size_t n = 0; n < N; n++)
        for (size_t k = 0; k < K; k++)
            Bp[(n / NR) * K * NR + k * NR + n % NR] = B[n * K + k];
    return Bp;
}

static float *make_packed_a(const float *A, size_t M, size_t K)
{
    size_t bytes = (sizeof(float) * rj_mac_packed_a_floats(M, K) + 127u) & ~(size_t)63u; /* C11: a multiple */
    float *Ap = aligned_alloc(64, bytes);
    if (Ap)
        rj_mac_pack_a(M, K, A, K, Ap);
    return Ap;
}

/* Every path against an independent plain loop on awkward shapes (edge rows/panels, odd panel
 * counts, K across KC slices, a K so long that each two-thread work item is one row panel):
 *  - exact data (products and sums exact in fp32): every kernel must equal a double-precision
 *    sum, so the kernels compute the right thing;
 *  - rounding data: every kernel, the two-thread split included, must equal the contract's
 *    order bit for bit (a plain fmaf chain over k), so no path can drift from another.
 * Returns 0, the failing exact shape index + 1, 100 + shape index for an order/determinism
 * failure, or -1 (no memory). */
int rj_sim_mac_selftest(void)
{
    static const size_t shapes[][3] = {{1, 1, 1},     {6, 16, 8},    {13, 33, 300}, {150, 48, 257},
                                       {12, 32, 520}, {7, 17, 31},   {40, 160, 700}, {96, 130, 520},
                                       {128, 128, 768}, {25, 80, 129}, {12, 16, 128}, {100, 17, 6000}};
    const size_t nshapes = sizeof shapes / sizeof shapes[0];
    /* path variants: {kernel, threads} */
    static const int variants[][2] = {{MAC_BEST, 1}, {MAC_BEST, 0}, {MAC_AVX2, 1}, {MAC_AVX2, 0},
                                      {MAC_PORTABLE, 1}};
    const size_t nvar = sizeof variants / sizeof variants[0];
    uint32_t seed = 12345u;
    for (int exact = 1; exact >= 0; exact--) {
        for (size_t s = 0; s < nshapes; s++) {
            size_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            if (exact && K > 1000)
                continue; /* |sum| could pass 2^24 ulps of 1/4096: no longer exact in fp32 */
            float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * N * K);
            float *C = malloc(sizeof(float) * M * N), *R = malloc(sizeof(float) * M * N);
            float *Ap = NULL, *Bp = NULL;
            int fail = 0;
            if (A && B && C && R) {
                for (size_t i = 0; i < M * K; i++)
                    A[i] = lcg_value(&seed, exact);
                for (size_t i = 0; i < N * K; i++)
                    B[i] = lcg_value(&seed, exact);
                Ap = make_packed_a(A, M, K);
                Bp = make_panels(B, N, K);
            }
            if (!Ap || !Bp) {
                free(A), free(B), free(C), free(R), free(Ap), free(Bp);
                return -1;
            }
            /* the reference, with a nonzero start value (the kernels accumulate onto C) */
            for (size_t m = 0; m < M; m++)
                for (size_t n = 0; n < N; n++) {
                    if (exact) {
                        double ref = 1.0;
                        for (size_t k = 0; k < K; k++)
                            ref += (double)A[m * K + k] * B[n * K + k];
                        R[m * N + n] = (float)ref;
                    } else {
                        float acc = 0.5f;
                        for (size_t k = 0; k < K; k++)
                            acc = fmaf(A[m * K + k], B[n * K + k], acc);
                        R[m * N + n] = acc;
                    }
                }
            for (size_t v = 0; v < nvar && !fail; v++) {
                for (size_t i = 0; i < M * N; i++)
                    C[i] = exact ? 1.0f : 0.5f;
                struct gemm_args g = {M, N, K, N, Ap, Bp, C, variants[v][0]};
                gemm_f32(&g, variants[v][1]);
                if (memcmp(C, R, sizeof(float) * M * N) != 0)
                    fail = exact ? (int)s + 1 : 100 + (int)s;
            }
            free(A), free(B), free(C), free(R), free(Ap), free(Bp);
            if (fail)
                return fail;
        }
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
