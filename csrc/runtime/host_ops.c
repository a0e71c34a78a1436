/* The host-op library (rj_host_ops.h): strided N-d kernels for the IR ops that run on the CPU.
 *
 * Structure: a descriptor check (every field, every view against its buffer), an iteration
 * engine that drops size-1 dimensions and merges dimensions that are contiguous in every
 * operand (so a dense op becomes one long row), and per-kind row functions. Element-wise rows
 * are processed in chunks: inputs are loaded into f32 (float dtypes) or i64 (integer dtypes)
 * scratch, the op runs on contiguous scratch where the compiler vectorizes it, and the
 * result is stored with the output's conversion. Dense f32 operands skip the scratch. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "rj_half.h"
#include "runtime/rj_host_fused.h"
#include "runtime/rj_host_ops.h"
#include "runtime/rj_host_pool.h"
#include "runtime/rj_runtime.h"

_Static_assert(sizeof(rj_host_view) == 80, "rj_host_view is shared with Python and bundles");
_Static_assert(sizeof(rj_host_op) == 448, "rj_host_op is shared with Python and bundles");
_Static_assert((int)RJ_DT_F32 == (int)RJ_DT_F32 && (int)RJ_DT_F16 == (int)RJ_DT_F16 &&
                   (int)RJ_DT_I32 == (int)RJ_DT_I32 && (int)RJ_DT_I8 == (int)RJ_DT_I8 &&
                   (int)RJ_DT_U8 == (int)RJ_DT_U8,
               "host-op dtype codes 1..5 must equal the runtime's RJ_DT_* codes");
_Static_assert((int)RJ_HOST_OPS_FIRST >= (int)RJ_HOST_KIND_COUNT,
               "host-op kinds must be numbered after the runtime's own host-step kinds");

#define CHUNK 512 /* elements per scratch chunk: 2 KiB of f32, fits L1 with 4 operands */

/* ---- dtypes ------------------------------------------------------------------------------ */

typedef struct dt_info {
    const char *name;
    uint32_t size;
    uint32_t is_float;
    int64_t min, max; /* integer range (saturation bounds of float -> int stores) */
} dt_info;

static const dt_info DT[RJ_DT_COUNT] = {
    [RJ_DT_F32] = {"f32", 4, 1, 0, 0},
    [RJ_DT_F16] = {"f16", 2, 1, 0, 0},
    [RJ_DT_BF16] = {"bf16", 2, 1, 0, 0},
    [RJ_DT_I64] = {"i64", 8, 0, INT64_MIN, INT64_MAX},
    [RJ_DT_I32] = {"i32", 4, 0, INT32_MIN, INT32_MAX},
    [RJ_DT_I16] = {"i16", 2, 0, INT16_MIN, INT16_MAX},
    [RJ_DT_I8] = {"i8", 1, 0, INT8_MIN, INT8_MAX},
    [RJ_DT_U32] = {"u32", 4, 0, 0, UINT32_MAX},
    [RJ_DT_U8] = {"u8", 1, 0, 0, UINT8_MAX},
    [RJ_DT_BOOL] = {"bool", 1, 0, 0, 1},
};

static int dt_ok(uint32_t dt) { return dt < RJ_DT_COUNT && DT[dt].name; }

uint32_t rj_host_dtype_size(uint32_t dt) { return dt_ok(dt) ? DT[dt].size : 0; }

const char *rj_host_dtype_name(uint32_t dt) { return dt_ok(dt) ? DT[dt].name : "?"; }

static const char *const KIND_NAMES[RJ_HOST_OPS_END - RJ_HOST_OPS_FIRST] = {
    "copy", "unary", "binary", "compare", "select", "reduce", "take", "iota",
};
static const uint32_t KIND_INPUTS_MIN[RJ_HOST_OPS_END - RJ_HOST_OPS_FIRST] = {1, 1, 2, 2, 2, 1, 2, 0};
static const uint32_t KIND_INPUTS_MAX[RJ_HOST_OPS_END - RJ_HOST_OPS_FIRST] = {1, 1, 2, 2, 3, 1, 2, 0};

const char *rj_host_op_kind_name(uint32_t kind)
{
    if (kind >= RJ_HOST_OPS_FIRST && kind < RJ_HOST_OPS_END)
        return KIND_NAMES[kind - RJ_HOST_OPS_FIRST];
    if (kind == RJ_HOST_FUSED)
        return "fused";
    return "unknown";
}

static const char *const UN_NAMES[RJ_UN_COUNT] = {
    NULL, "neg", "abs", "exp", "log", "tanh", "logistic", "erf", "sqrt", "rsqrt", "sin", "cos",
    "integer_pow", "recip_lo",
};
static const char *const BIN_NAMES[RJ_BIN_COUNT] = {NULL, "add", "sub", "mul", "div", "max", "min",
                                                    "pow"};
static const char *const CMP_NAMES[RJ_CMP_COUNT] = {NULL, "eq", "ne", "lt", "le", "gt", "ge"};
static const char *const RED_NAMES[RJ_RED_COUNT] = {NULL, "sum", "max"};

/* The op's name for messages: "binary add", "copy", ... */
static const char *op_name(const rj_host_op *op, char *buf, size_t n)
{
    const char *k = rj_host_op_kind_name(op->kind), *c = NULL;
    switch (op->kind) {
    case RJ_HOST_UNARY: c = op->code < RJ_UN_COUNT ? UN_NAMES[op->code] : NULL; break;
    case RJ_HOST_BINARY: c = op->code < RJ_BIN_COUNT ? BIN_NAMES[op->code] : NULL; break;
    case RJ_HOST_COMPARE: c = op->code < RJ_CMP_COUNT ? CMP_NAMES[op->code] : NULL; break;
    case RJ_HOST_REDUCE: c = op->code < RJ_RED_COUNT ? RED_NAMES[op->code] : NULL; break;
    default: break;
    }
    snprintf(buf, n, "%s%s%s", k, c ? " " : "", c ? c : "");
    return buf;
}

/* ---- scalar conversions -------------------------------------------------------------------- */

/* f32 -> bf16, round to nearest even; NaN stays a (quiet) NaN of the same sign. */
static inline uint16_t f2bf(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float bf2f(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* float -> integer as lax.convert_element_type on CPU: truncate, saturate, NaN -> 0. */
static inline int64_t f2i_sat(float v, int64_t lo, int64_t hi)
{
    if (v != v)
        return 0;
    double t = trunc((double)v);
    if (t <= (double)lo)
        return lo;
    if (t >= (double)hi) /* (double)INT64_MAX rounds up to 2^63, which saturates too */
        return hi;
    return (int64_t)t;
}

/* ---- chunk loads and stores ------------------------------------------------------------------ */

/* Pointers to element `i` of a view row: base + (off + i * st) * esize, with byte arithmetic
 * done in int64 so negative strides work. */
#define AT(base, off, es) ((base) + (off) * (int64_t)(es))

/* Load m float-dtype elements (stride st) as f32. */
static void load_f(uint32_t dt, const uint8_t *p, int64_t st, int64_t m, float *o)
{
    switch (dt) {
    case RJ_DT_F32:
        if (st == 1) {
            memcpy(o, p, (size_t)m * 4);
        } else {
            for (int64_t i = 0; i < m; i++)
                memcpy(&o[i], p + i * st * 4, 4);
        }
        break;
    case RJ_DT_F16: {
        int64_t i = 0;
#if defined(__F16C__)
        if (st == 1)
            for (; i + 8 <= m; i += 8)
                _mm256_storeu_ps(o + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i))));
#endif
        for (; i < m; i++) {
            uint16_t h;
            memcpy(&h, p + i * st * 2, 2);
            o[i] = rj_h2f(h);
        }
        break;
    }
    case RJ_DT_BF16:
        for (int64_t i = 0; i < m; i++) {
            uint16_t h;
            memcpy(&h, p + i * st * 2, 2);
            o[i] = bf2f(h);
        }
        break;
    default: /* the check admits only float dtypes here */
        break;
    }
}

#define LOAD_INT_LOOP(T)                                                                       \
    for (int64_t i = 0; i < m; i++) {                                                          \
        T v;                                                                                   \
        memcpy(&v, p + i * st * (int64_t)sizeof(T), sizeof(T));                               \
        o[i] = (int64_t)v;                                                                     \
    }

/* Load m integer/bool elements as i64 (unsigned types zero-extend; a bool byte is != 0). */
static void load_i(uint32_t dt, const uint8_t *p, int64_t st, int64_t m, int64_t *o)
{
    switch (dt) {
    case RJ_DT_I64: LOAD_INT_LOOP(int64_t); break;
    case RJ_DT_I32: LOAD_INT_LOOP(int32_t); break;
    case RJ_DT_I16: LOAD_INT_LOOP(int16_t); break;
    case RJ_DT_I8: LOAD_INT_LOOP(int8_t); break;
    case RJ_DT_U32: LOAD_INT_LOOP(uint32_t); break;
    case RJ_DT_U8: LOAD_INT_LOOP(uint8_t); break;
    case RJ_DT_BOOL:
        for (int64_t i = 0; i < m; i++)
            o[i] = p[i * st] != 0;
        break;
    default:
        break;
    }
}

/* Store m f32 values with the output dtype's conversion. */
static void store_f(uint32_t dt, uint8_t *p, int64_t st, int64_t m, const float *v)
{
    switch (dt) {
    case RJ_DT_F32:
        if (st == 1) {
            memmove(p, v, (size_t)m * 4);
        } else {
            for (int64_t i = 0; i < m; i++)
                memcpy(p + i * st * 4, &v[i], 4);
        }
        return;
    case RJ_DT_F16: {
        int64_t i = 0;
#if defined(__F16C__)
        if (st == 1)
            for (; i + 8 <= m; i += 8)
                _mm_storeu_si128((__m128i *)(p + 2 * i),
                                 _mm256_cvtps_ph(_mm256_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT));
#endif
        for (; i < m; i++) {
            uint16_t h = rj_f2h(v[i]);
            memcpy(p + i * st * 2, &h, 2);
        }
        return;
    }
    case RJ_DT_BF16:
        for (int64_t i = 0; i < m; i++) {
            uint16_t h = f2bf(v[i]);
            memcpy(p + i * st * 2, &h, 2);
        }
        return;
    case RJ_DT_BOOL:
        for (int64_t i = 0; i < m; i++)
            p[i * st] = v[i] != 0.0f; /* NaN != 0: true, as numpy's astype(bool) */
        return;
    default:
        break;
    }
    const dt_info *d = &DT[dt];
    for (int64_t i = 0; i < m; i++) {
        int64_t x = f2i_sat(v[i], d->min, d->max);
        uint8_t *q = p + i * st * (int64_t)d->size;
        switch (dt) {
        case RJ_DT_I64: memcpy(q, &x, 8); break;
        case RJ_DT_I32: { int32_t y = (int32_t)x; memcpy(q, &y, 4); break; }
        case RJ_DT_U32: { uint32_t y = (uint32_t)x; memcpy(q, &y, 4); break; }
        case RJ_DT_I16: { int16_t y = (int16_t)x; memcpy(q, &y, 2); break; }
        case RJ_DT_I8: { int8_t y = (int8_t)x; memcpy(q, &y, 1); break; }
        case RJ_DT_U8: { uint8_t y = (uint8_t)x; memcpy(q, &y, 1); break; }
        default: break;
        }
    }
}

#define STORE_INT_LOOP(T)                                                                      \
    for (int64_t i = 0; i < m; i++) {                                                          \
        T y = (T)(uint64_t)v[i]; /* wraps to the width: the IR's integer semantics */          \
        memcpy(p + i * st * (int64_t)sizeof(T), &y, sizeof(T));                                \
    }

/* Store m i64 values with the output dtype's conversion (ints wrap, floats round). */
static void store_i(uint32_t dt, uint8_t *p, int64_t st, int64_t m, const int64_t *v)
{
    switch (dt) {
    case RJ_DT_I64: STORE_INT_LOOP(int64_t); return;
    case RJ_DT_I32: STORE_INT_LOOP(int32_t); return;
    case RJ_DT_I16: STORE_INT_LOOP(int16_t); return;
    case RJ_DT_I8: STORE_INT_LOOP(int8_t); return;
    case RJ_DT_U32: STORE_INT_LOOP(uint32_t); return;
    case RJ_DT_U8: STORE_INT_LOOP(uint8_t); return;
    case RJ_DT_BOOL:
        for (int64_t i = 0; i < m; i++)
            p[i * st] = v[i] != 0;
        return;
    default: {
        /* float outputs: i64 -> f32 rounds to nearest (as numpy's astype), then narrows */
        float f[CHUNK];
        for (int64_t s = 0; s < m; s += CHUNK) {
            int64_t n = m - s < CHUNK ? m - s : CHUNK;
            for (int64_t i = 0; i < n; i++)
                f[i] = (float)v[s + i];
            store_f(dt, p + s * st * (int64_t)DT[dt].size, st, n, f);
        }
        return;
    }
    }
}

/* ---- the iteration engine ---------------------------------------------------------------------- */

#define MAXV (RJ_HOST_MAX_OPERANDS + 1) /* operands plus one virtual view (iota's coordinate) */

typedef struct nd {
    int rank;
    int nv;
    int empty; /* some dimension is 0: nothing to do */
    int64_t shape[RJ_HOST_MAX_RANK];
    int64_t st[MAXV][RJ_HOST_MAX_RANK];
    int64_t off[MAXV];
} nd;

/* Advance the multi-index `idx` over dims top..0 of `it` (the last dim of the range moves
 * fastest) and move each of the first nv offsets by its view's stride. Returns 0 once every
 * index has been visited (idx and off are then back at their start). */
static int nd_next(const nd *it, int top, int nv, int64_t *idx, int64_t *off)
{
    for (int d = top; d >= 0; d--) {
        idx[d]++;
        for (int v = 0; v < nv; v++)
            off[v] += it->st[v][d];
        if (idx[d] < it->shape[d])
            return 1;
        for (int v = 0; v < nv; v++)
            off[v] -= it->st[v][d] * it->shape[d];
        idx[d] = 0;
    }
    return 0;
}

/* Build an iteration over `rank` dims of `shape` for nv views (strides st[v][d]): size-1 dims
 * are dropped and neighbours that are contiguous in every view are merged. */
static void nd_build(nd *it, int rank, const int64_t *shape, int nv,
                     int64_t (*st)[RJ_HOST_MAX_RANK], const int64_t *off)
{
    memset(it, 0, sizeof(*it));
    it->nv = nv;
    for (int v = 0; v < nv; v++)
        it->off[v] = off[v];
    for (int d = 0; d < rank; d++) {
        if (shape[d] == 0)
            it->empty = 1;
        if (shape[d] == 1)
            continue;
        int r = it->rank;
        int merge = r > 0;
        for (int v = 0; merge && v < nv; v++)
            merge = it->st[v][r - 1] == st[v][d] * shape[d];
        if (merge) {
            it->shape[r - 1] *= shape[d];
            for (int v = 0; v < nv; v++)
                it->st[v][r - 1] = st[v][d];
        } else {
            it->shape[r] = shape[d];
            for (int v = 0; v < nv; v++)
                it->st[v][r] = st[v][d];
            it->rank++;
        }
    }
    if (it->rank == 0) { /* a scalar: one row of one element */
        it->rank = 1;
        it->shape[0] = 1;
    }
}

struct run_ctx;
/* One row: `n` elements along the innermost dimension; view v starts at element off[v] and
 * steps by st[v]. */
typedef int (*row_fn)(struct run_ctx *c, const int64_t *off, int64_t n, const int64_t *st);

typedef struct run_ctx {
    const rj_host_op *op;
    uint8_t *base[MAXV];
    uint32_t dt[MAXV];
    uint32_t es[MAXV];
    int nin;
    rj_err *err;
    const nd *inner; /* REDUCE: the reduced dimensions, walked per output element */
    int stream;      /* COPY: large enough to stream its stores (copy_bytes) */
    double dacc[CHUNK];
    float ft[RJ_HOST_MAX_OPERANDS][CHUNK];
    int64_t it[RJ_HOST_MAX_OPERANDS][CHUNK];
} run_ctx;

static int nd_walk(run_ctx *c, const nd *it, row_fn fn)
{
    if (it->empty)
        return RJ_OK;
    int64_t idx[RJ_HOST_MAX_RANK] = {0}, off[MAXV], st[MAXV];
    int inner = it->rank - 1;
    for (int v = 0; v < it->nv; v++) {
        off[v] = it->off[v];
        st[v] = it->st[v][inner];
    }
    for (;;) {
        int rc = fn(c, off, it->shape[inner], st);
        if (rc)
            return rc;
        if (!nd_next(it, inner - 1, it->nv, idx, off))
            return RJ_OK;
    }
}

/* ---- element-wise math on contiguous scratch ----------------------------------------------------- */

static void unary_f(uint32_t code, int64_t y, int64_t m, const float *a, float *o)
{
    switch (code) {
    case RJ_UN_NEG: for (int64_t i = 0; i < m; i++) o[i] = -a[i]; break;
    case RJ_UN_ABS: for (int64_t i = 0; i < m; i++) o[i] = fabsf(a[i]); break;
    case RJ_UN_EXP: for (int64_t i = 0; i < m; i++) o[i] = expf(a[i]); break;
    case RJ_UN_LOG: for (int64_t i = 0; i < m; i++) o[i] = logf(a[i]); break;
    case RJ_UN_TANH: for (int64_t i = 0; i < m; i++) o[i] = tanhf(a[i]); break;
    case RJ_UN_LOGISTIC:
        for (int64_t i = 0; i < m; i++)
            o[i] = 1.0f / (1.0f + expf(-a[i]));
        break;
    case RJ_UN_ERF: for (int64_t i = 0; i < m; i++) o[i] = erff(a[i]); break;
    case RJ_UN_SQRT: for (int64_t i = 0; i < m; i++) o[i] = sqrtf(a[i]); break;
    case RJ_UN_RSQRT: for (int64_t i = 0; i < m; i++) o[i] = 1.0f / sqrtf(a[i]); break;
    case RJ_UN_SIN: for (int64_t i = 0; i < m; i++) o[i] = sinf(a[i]); break;
    case RJ_UN_COS: for (int64_t i = 0; i < m; i++) o[i] = cosf(a[i]); break;
    case RJ_UN_IPOW: {
        /* Square-and-multiply in the order of the reference (and XLA's expansion), so each
         * f32 product rounds exactly as there; a negative exponent takes 1/x^|y| */
        uint64_t n0 = y < 0 ? (uint64_t)0 - (uint64_t)y : (uint64_t)y;
        for (int64_t i = 0; i < m; i++) {
            float base = a[i], acc = 1.0f;
            for (uint64_t n = n0; n; n >>= 1) {
                if (n & 1)
                    acc *= base;
                base *= base;
            }
            o[i] = y < 0 ? 1.0f / acc : acc;
        }
        break;
    }
    case RJ_UN_RECIP_LO:
        /* t = 1/a, hi = f16(t) as a store to f16 rounds it; t - hi is exact in f32 (hi is
         * within half an f16 ulp of t) and so is the power-of-two scale: the same bits as the
         * binary div, f16 store, sub and mul it replaces */
        for (int64_t i = 0; i < m; i++) {
            float t = 1.0f / a[i];
            o[i] = ldexpf(t - rj_h2f(rj_f2h(t)), (int)y);
        }
        break;
    default: break;
    }
}

static void unary_i(uint32_t code, int64_t y, int64_t m, const int64_t *a, int64_t *o)
{
    switch (code) {
    case RJ_UN_NEG:
        for (int64_t i = 0; i < m; i++)
            o[i] = (int64_t)((uint64_t)0 - (uint64_t)a[i]);
        break;
    case RJ_UN_ABS:
        for (int64_t i = 0; i < m; i++)
            o[i] = a[i] < 0 ? (int64_t)((uint64_t)0 - (uint64_t)a[i]) : a[i];
        break;
    case RJ_UN_IPOW: /* y >= 0 (checked); wrapping products keep the low bits exact */
        for (int64_t i = 0; i < m; i++) {
            uint64_t base = (uint64_t)a[i], acc = 1;
            for (uint64_t n = (uint64_t)y; n; n >>= 1) {
                if (n & 1)
                    acc *= base;
                base *= base;
            }
            o[i] = (int64_t)acc;
        }
        break;
    default: break;
    }
}

static void binary_f(uint32_t code, int64_t m, const float *a, const float *b, float *o)
{
    switch (code) {
    case RJ_BIN_ADD: for (int64_t i = 0; i < m; i++) o[i] = a[i] + b[i]; break;
    case RJ_BIN_SUB: for (int64_t i = 0; i < m; i++) o[i] = a[i] - b[i]; break;
    case RJ_BIN_MUL: for (int64_t i = 0; i < m; i++) o[i] = a[i] * b[i]; break;
    case RJ_BIN_DIV: for (int64_t i = 0; i < m; i++) o[i] = a[i] / b[i]; break;
    /* max/min propagate NaN (np.maximum / XLA); a + b of a NaN operand is that NaN */
    case RJ_BIN_MAX:
        for (int64_t i = 0; i < m; i++)
            o[i] = (a[i] != a[i] || b[i] != b[i]) ? a[i] + b[i] : (a[i] > b[i] ? a[i] : b[i]);
        break;
    case RJ_BIN_MIN:
        for (int64_t i = 0; i < m; i++)
            o[i] = (a[i] != a[i] || b[i] != b[i]) ? a[i] + b[i] : (a[i] < b[i] ? a[i] : b[i]);
        break;
    case RJ_BIN_POW: for (int64_t i = 0; i < m; i++) o[i] = powf(a[i], b[i]); break;
    default: break;
    }
}

static void binary_i(uint32_t code, int64_t m, const int64_t *a, const int64_t *b, int64_t *o)
{
    switch (code) {
    case RJ_BIN_ADD:
        for (int64_t i = 0; i < m; i++) o[i] = (int64_t)((uint64_t)a[i] + (uint64_t)b[i]);
        break;
    case RJ_BIN_SUB:
        for (int64_t i = 0; i < m; i++) o[i] = (int64_t)((uint64_t)a[i] - (uint64_t)b[i]);
        break;
    case RJ_BIN_MUL:
        for (int64_t i = 0; i < m; i++) o[i] = (int64_t)((uint64_t)a[i] * (uint64_t)b[i]);
        break;
    case RJ_BIN_DIV:
        /* truncating; x/0 = -1 (all ones once stored) and INT_MIN/-1 = INT_MIN, as XLA's
         * CPU emitter and reference.py define them. Narrower types reach INT_MIN/-1 as
         * 2^(w-1) in 64 bits, which wraps back to INT_MIN when stored. */
        for (int64_t i = 0; i < m; i++) {
            if (b[i] == 0)
                o[i] = -1;
            else if (b[i] == -1)
                o[i] = (int64_t)((uint64_t)0 - (uint64_t)a[i]);
            else
                o[i] = a[i] / b[i];
        }
        break;
    case RJ_BIN_MAX: for (int64_t i = 0; i < m; i++) o[i] = a[i] > b[i] ? a[i] : b[i]; break;
    case RJ_BIN_MIN: for (int64_t i = 0; i < m; i++) o[i] = a[i] < b[i] ? a[i] : b[i]; break;
    default: break;
    }
}

/* One comparison body for both chunk element types (f32 and int64). */
#define CMP_LOOP(OP) for (int64_t i = 0; i < m; i++) o[i] = a[i] OP b[i]
#define DEFINE_COMPARE(NAME, T)                                                          \
    static void NAME(uint32_t code, int64_t m, const T *a, const T *b, int64_t *o)       \
    {                                                                                    \
        switch (code) {                                                                  \
        case RJ_CMP_EQ: CMP_LOOP(==); break;                                             \
        case RJ_CMP_NE: CMP_LOOP(!=); break;                                             \
        case RJ_CMP_LT: CMP_LOOP(<); break;                                              \
        case RJ_CMP_LE: CMP_LOOP(<=); break;                                             \
        case RJ_CMP_GT: CMP_LOOP(>); break;                                              \
        case RJ_CMP_GE: CMP_LOOP(>=); break;                                             \
        default: break;                                                                  \
        }                                                                                \
    }
DEFINE_COMPARE(compare_f, float)
DEFINE_COMPARE(compare_i, int64_t)

/* Input v's chunk as f32: the operand itself when it is dense, aligned f32, else scratch. */
static const float *src_f(run_ctx *c, int v, int64_t off, int64_t st, int64_t m)
{
    const uint8_t *p = AT(c->base[v], off, c->es[v]);
    if (c->dt[v] == RJ_DT_F32 && st == 1 && ((uintptr_t)p & 3u) == 0)
        return (const float *)(const void *)p;
    load_f(c->dt[v], p, st, m, c->ft[v]);
    return c->ft[v];
}

static const int64_t *src_i(run_ctx *c, int v, int64_t off, int64_t st, int64_t m)
{
    const uint8_t *p = AT(c->base[v], off, c->es[v]);
    if (c->dt[v] == RJ_DT_I64 && st == 1 && ((uintptr_t)p & 7u) == 0)
        return (const int64_t *)(const void *)p;
    load_i(c->dt[v], p, st, m, c->it[v]);
    return c->it[v];
}

/* Output chunk destination for f32 results: the output itself when dense aligned f32. */
static float *dst_f(run_ctx *c, int64_t off, int64_t st)
{
    uint8_t *p = AT(c->base[0], off, c->es[0]);
    if (c->dt[0] == RJ_DT_F32 && st == 1 && ((uintptr_t)p & 3u) == 0)
        return (float *)(void *)p;
    return c->ft[0];
}

/* UNARY / BINARY / COMPARE and converting COPY rows. */
static int ew_row(run_ctx *c, const int64_t *off, int64_t n, const int64_t *st)
{
    const rj_host_op *op = c->op;
    int fdom = DT[c->dt[1]].is_float;
    for (int64_t s = 0; s < n; s += CHUNK) {
        int64_t m = n - s < CHUNK ? n - s : CHUNK;
        int64_t o0 = off[0] + s * st[0];
        uint8_t *out = AT(c->base[0], o0, c->es[0]);
        if (fdom) {
            const float *a = src_f(c, 1, off[1] + s * st[1], st[1], m);
            const float *b = c->nin > 1 ? src_f(c, 2, off[2] + s * st[2], st[2], m) : NULL;
            if (op->kind == RJ_HOST_COMPARE) {
                compare_f(op->code, m, a, b, c->it[0]);
                store_i(c->dt[0], out, st[0], m, c->it[0]);
                continue;
            }
            float *o = dst_f(c, o0, st[0]);
            if (op->kind == RJ_HOST_UNARY)
                unary_f(op->code, op->iparam[0], m, a, o);
            else if (op->kind == RJ_HOST_BINARY)
                binary_f(op->code, m, a, b, o);
            else /* COPY with a conversion */
                o = (float *)a;
            if ((uint8_t *)o != out)
                store_f(c->dt[0], out, st[0], m, o);
        } else {
            const int64_t *a = src_i(c, 1, off[1] + s * st[1], st[1], m);
            const int64_t *b = c->nin > 1 ? src_i(c, 2, off[2] + s * st[2], st[2], m) : NULL;
            int64_t *o = c->it[0];
            if (op->kind == RJ_HOST_COMPARE)
                compare_i(op->code, m, a, b, o);
            else if (op->kind == RJ_HOST_UNARY)
                unary_i(op->code, op->iparam[0], m, a, o);
            else if (op->kind == RJ_HOST_BINARY)
                binary_i(op->code, m, a, b, o);
            else
                o = (int64_t *)a;
            store_i(c->dt[0], out, st[0], m, o);
        }
    }
    return RJ_OK;
}

/* Move one element of `es` bytes. */
static inline void move_elem(uint8_t *d, const uint8_t *s, uint32_t es)
{
    switch (es) {
    case 1: *d = *s; break;
    case 2: memcpy(d, s, 2); break;
    case 4: memcpy(d, s, 4); break;
    default: memcpy(d, s, 8); break;
    }
}

/* A copy writing at least this many bytes streams its stores past the cache (x86 AVX2
 * builds), row by row for rows of STREAM_MIN_ROW bytes or more: the data is bound for
 * another context's arena, which the NPU reads, not this CPU, and skipping each line's
 * read-for-ownership saves a third of the memory traffic of a copy far larger than the
 * caches (cross-context copies of attention scores, 2-9 MB). */
#define STREAM_MIN_BYTES (1u << 20)
#define STREAM_MIN_ROW 512u

static void copy_bytes(uint8_t *d, const uint8_t *s, size_t n, int stream)
{
#if defined(__AVX2__)
    if (stream && n >= STREAM_MIN_ROW && (d + n <= s || s + n <= d)) {
        size_t head = (32 - ((uintptr_t)d & 31u)) & 31u, i = 0;
        memcpy(d, s, head);
        d += head, s += head, n -= head;
        for (; i + 128 <= n; i += 128) {
            __m256i a0 = _mm256_loadu_si256((const __m256i *)(s + i));
            __m256i a1 = _mm256_loadu_si256((const __m256i *)(s + i + 32));
            __m256i a2 = _mm256_loadu_si256((const __m256i *)(s + i + 64));
            __m256i a3 = _mm256_loadu_si256((const __m256i *)(s + i + 96));
            _mm256_stream_si256((__m256i *)(d + i), a0);
            _mm256_stream_si256((__m256i *)(d + i + 32), a1);
            _mm256_stream_si256((__m256i *)(d + i + 64), a2);
            _mm256_stream_si256((__m256i *)(d + i + 96), a3);
        }
        memcpy(d + i, s + i, n - i);
        _mm_sfence(); /* streaming stores are weakly ordered: fence before anything reads */
        return;
    }
#endif
    (void)stream;
    memmove(d, s, n);
}

/* Same-dtype COPY rows: raw element moves (bit-exact, NaN payloads kept). */
static int copy_row(run_ctx *c, const int64_t *off, int64_t n, const int64_t *st)
{
    uint32_t es = c->es[0];
    uint8_t *d = AT(c->base[0], off[0], es);
    const uint8_t *s = AT(c->base[1], off[1], es);
    if (st[0] == 1 && st[1] == 1) {
        copy_bytes(d, s, (size_t)n * es, c->stream);
    } else if (st[1] == 0 && st[0] == 1 && es == 4) { /* broadcast fill */
        uint32_t v;
        memcpy(&v, s, 4);
        for (int64_t i = 0; i < n; i++)
            memcpy(d + 4 * i, &v, 4);
    } else if (st[1] == 0 && st[0] == 1 && es == 2) { /* f16 pad fill */
        uint16_t v;
        memcpy(&v, s, 2);
        for (int64_t i = 0; i < n; i++)
            memcpy(d + 2 * i, &v, 2);
    } else if (st[1] == 0 && st[0] == 1 && es == 1) {
        memset(d, *s, (size_t)n);
    } else {
        for (int64_t i = 0; i < n; i++)
            move_elem(d + i * st[0] * es, s + i * st[1] * es, es);
    }
    return RJ_OK;
}

/* A same-dtype copy whose innermost rows are short and contiguous on both sides (a cube's
 * atoms: 8 fp16 lanes, 16 bytes, moving to another layout): the second-innermost dim is walked
 * here, so the per-row callback and the odometer step happen once per block of rows, not once
 * per 16 bytes. The caller checked rank >= 2 and unit inner strides. */
static void copy_short_rows(run_ctx *c, const nd *it)
{
    int r = it->rank;
    uint32_t es = c->es[0];
    int64_t n1 = it->shape[r - 2];
    int64_t sd = it->st[0][r - 2] * es, ss = it->st[1][r - 2] * es;
    size_t row = (size_t)it->shape[r - 1] * es;
    int64_t idx[RJ_HOST_MAX_RANK] = {0}, off[MAXV] = {it->off[0], it->off[1]};
    do {
        uint8_t *d = AT(c->base[0], off[0], es);
        const uint8_t *s = AT(c->base[1], off[1], es);
        if (row == 16) { /* a constant size: the compiler moves it inline */
            for (int64_t i = 0; i < n1; i++)
                memmove(d + i * sd, s + i * ss, 16);
        } else {
            for (int64_t i = 0; i < n1; i++)
                memmove(d + i * sd, s + i * ss, row);
        }
    } while (nd_next(it, r - 3, 2, idx, off));
}

/* Move the widest of dims 0..rank-2 to rank-2, the dim a block walker walks itself, so the
 * odometer steps once per widest run instead of once per narrowest (a copy's element order is
 * free: the output aliases an input only with the identical view). */
static void nd_widest_to_block(nd *it)
{
    int r = it->rank, k = r - 2;
    for (int d = 0; d < r - 2; d++)
        if (it->shape[d] > it->shape[k])
            k = d;
    if (k == r - 2)
        return;
    int64_t t = it->shape[k];
    it->shape[k] = it->shape[r - 2];
    it->shape[r - 2] = t;
    for (int v = 0; v < it->nv; v++) {
        t = it->st[v][k];
        it->st[v][k] = it->st[v][r - 2];
        it->st[v][r - 2] = t;
    }
}

/* Move dims a and b of 0..rank-2 to rank-3 and rank-2 (a outer), the rest keeping their order. */
static void nd_pair_to_tile(nd *it, int a, int b)
{
    int r = it->rank, order[RJ_HOST_MAX_RANK], n = 0;
    for (int d = 0; d < r - 1; d++)
        if (d != a && d != b)
            order[n++] = d;
    order[n++] = a;
    order[n++] = b;
    order[n++] = r - 1;
    nd t = *it;
    for (int d = 0; d < r; d++) {
        it->shape[d] = t.shape[order[d]];
        for (int v = 0; v < it->nv; v++)
            it->st[v][d] = t.st[v][order[d]];
    }
}

static int64_t iabs64(int64_t x) { return x < 0 ? -x : x; }

/* A same-dtype copy of short rows (a cube's 16-byte atoms) between two layouts that order
 * them differently (a re-tiling of attention heads): the atoms that fill one output line come
 * from the dim with the smallest output stride, those that fill one input line from the dim
 * with the smallest input stride. Walking that pair as a 2-D tile uses every line it touches
 * whole on both sides; walking only the widest dim (copy_short_rows) wrote 16 bytes per
 * line 2 KiB apart. Chosen when each of the two dims is short of a whole line on its side
 * and the tile has at least 16 rows to amortize the odometer step. */
static int short_rows_tile(nd *it, uint32_t es)
{
    int r = it->rank;
    if (r < 3)
        return 0;
    int64_t row = it->shape[r - 1];
    int b = 0, a = -1;
    for (int d = 1; d < r - 1; d++)
        if (iabs64(it->st[0][d]) < iabs64(it->st[0][b]))
            b = d;
    for (int d = 0; d < r - 1; d++)
        if (d != b && (a < 0 || iabs64(it->st[1][d]) < iabs64(it->st[1][a])))
            a = d;
    /* the pair must be each side's contiguous neighbour of the row, and not both the same
     * side's (then the widest-dim walk reads and writes whole runs already) */
    if (iabs64(it->st[0][b]) != row || iabs64(it->st[1][a]) != row ||
        iabs64(it->st[1][b]) == row || it->shape[a] * it->shape[b] < 16 ||
        (uint64_t)(row * es) >= 64)
        return 0;
    nd_pair_to_tile(it, a, b);
    return 1;
}

/* copy_short_rows over a 2-D tile of rows (short_rows_tile arranged dims rank-3, rank-2). */
static void copy_short_rows_tile(run_ctx *c, const nd *it)
{
    int r = it->rank;
    uint32_t es = c->es[0];
    int64_t na = it->shape[r - 3], nb = it->shape[r - 2];
    int64_t da = it->st[0][r - 3] * es, db = it->st[0][r - 2] * es;
    int64_t sa = it->st[1][r - 3] * es, sb = it->st[1][r - 2] * es;
    size_t row = (size_t)it->shape[r - 1] * es;
    int64_t idx[RJ_HOST_MAX_RANK] = {0}, off[MAXV] = {it->off[0], it->off[1]};
    do {
        uint8_t *d = AT(c->base[0], off[0], es);
        const uint8_t *s = AT(c->base[1], off[1], es);
        if (row == 16) {
            for (int64_t i = 0; i < na; i++)
                for (int64_t j = 0; j < nb; j++)
                    memmove(d + i * da + j * db, s + i * sa + j * sb, 16);
        } else {
            for (int64_t i = 0; i < na; i++)
                for (int64_t j = 0; j < nb; j++)
                    memmove(d + i * da + j * db, s + i * sa + j * sb, row);
        }
    } while (nd_next(it, r - 4, 2, idx, off));
}

/* A same-dtype copy whose two innermost dims are swapped between input and output (a true
 * transpose, e.g. a cube's 8 lanes to a row-major row): walk tiles so both sides stay in cache
 * lines, with one walker per element size so every move is one fixed-size load and store.
 * Dims 0..rank-3 are walked by an odometer; the caller checked rank >= 2. */
#define TILE 32
#define DEF_TRANSPOSE(NAME, ES)                                                                   \
    static void NAME(uint8_t *D, const uint8_t *S, int64_t n1, int64_t n0, int64_t o1,           \
                     int64_t o0, int64_t i1, int64_t i0)                                          \
    {                                                                                             \
        for (int64_t a = 0; a < n1; a += TILE)                                                    \
            for (int64_t b = 0; b < n0; b += TILE) {                                              \
                int64_t ae = a + TILE < n1 ? a + TILE : n1, be = b + TILE < n0 ? b + TILE : n0;   \
                for (int64_t y = a; y < ae; y++) {                                                \
                    uint8_t *d = D + y * o1 * ES;                                                 \
                    const uint8_t *s = S + y * i1 * ES;                                           \
                    for (int64_t x = b; x < be; x++)                                              \
                        memcpy(d + x * o0 * ES, s + x * i0 * ES, ES);                             \
                }                                                                                 \
            }                                                                                     \
    }
DEF_TRANSPOSE(transpose_es1, 1)
DEF_TRANSPOSE(transpose_es2, 2)
DEF_TRANSPOSE(transpose_es4, 4)
DEF_TRANSPOSE(transpose_es8, 8)

#if defined(__SSE2__)
/* 16-bit elements with unit strides along the input's lanes (y) and the output's rows (x),
 * a cube's 8 fp16 lanes to row-major rows: 8 x 8 blocks move by an in-register transpose
 * (8 loads, 24 unpacks, 8 stores), the edges element by element. */
static void transpose_lanes_es2(uint8_t *D, const uint8_t *S, int64_t n1, int64_t n0, int64_t o1,
                                int64_t i0)
{
    int64_t y8 = n1 & ~(int64_t)7, x8 = n0 & ~(int64_t)7;
    for (int64_t y = 0; y < y8; y += 8)
        for (int64_t x = 0; x < x8; x += 8) {
            __m128i a[8], t[8], u[8];
            for (int k = 0; k < 8; k++)
                a[k] = _mm_loadu_si128((const __m128i *)(S + ((x + k) * i0 + y) * 2));
            for (int k = 0; k < 4; k++) {
                t[2 * k] = _mm_unpacklo_epi16(a[2 * k], a[2 * k + 1]);
                t[2 * k + 1] = _mm_unpackhi_epi16(a[2 * k], a[2 * k + 1]);
            }
            for (int k = 0; k < 2; k++) {
                u[4 * k] = _mm_unpacklo_epi32(t[4 * k], t[4 * k + 2]);
                u[4 * k + 1] = _mm_unpackhi_epi32(t[4 * k], t[4 * k + 2]);
                u[4 * k + 2] = _mm_unpacklo_epi32(t[4 * k + 1], t[4 * k + 3]);
                u[4 * k + 3] = _mm_unpackhi_epi32(t[4 * k + 1], t[4 * k + 3]);
            }
            for (int k = 0; k < 4; k++) {
                _mm_storeu_si128((__m128i *)(D + ((y + 2 * k) * o1 + x) * 2),
                                 _mm_unpacklo_epi64(u[k], u[k + 4]));
                _mm_storeu_si128((__m128i *)(D + ((y + 2 * k + 1) * o1 + x) * 2),
                                 _mm_unpackhi_epi64(u[k], u[k + 4]));
            }
        }
    for (int64_t y = 0; y < n1; y++)
        for (int64_t x = y < y8 ? x8 : 0; x < n0; x++)
            memcpy(D + (y * o1 + x) * 2, S + (x * i0 + y) * 2, 2);
}
#endif

static void copy_transposed(run_ctx *c, const nd *it)
{
    int r = it->rank;
    uint32_t es = c->es[0];
    void (*walk)(uint8_t *, const uint8_t *, int64_t, int64_t, int64_t, int64_t, int64_t,
                 int64_t) = es == 1 ? transpose_es1 : es == 2 ? transpose_es2
                           : es == 4 ? transpose_es4 : transpose_es8;
    int64_t n1 = it->shape[r - 2], n0 = it->shape[r - 1];
    int64_t o1 = it->st[0][r - 2], o0 = it->st[0][r - 1], i1 = it->st[1][r - 2], i0 = it->st[1][r - 1];
    int64_t idx[RJ_HOST_MAX_RANK] = {0}, off[2] = {it->off[0], it->off[1]};
#if defined(__SSE2__)
    if (es == 2 && o0 == 1 && i1 == 1) {
        do {
            transpose_lanes_es2(AT(c->base[0], off[0], es), AT(c->base[1], off[1], es), n1, n0,
                                o1, i0);
        } while (nd_next(it, r - 3, 2, idx, off));
        return;
    }
#endif
    do {
        walk(AT(c->base[0], off[0], es), AT(c->base[1], off[1], es), n1, n0, o1, o0, i1, i0);
    } while (nd_next(it, r - 3, 2, idx, off));
}

/* One contiguous row of n elements f32 -> f16 or f16 -> f32, rounding as store_f does
 * (nearest even: the same F16C instruction for 8 lanes, rj_f2h for the rest). */
static void convert_row(uint8_t *d, const uint8_t *s, int64_t n, int to_half)
{
    int64_t i = 0;
    if (to_half) {
#if defined(__F16C__)
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(d + 2 * i),
                             _mm256_cvtps_ph(_mm256_loadu_ps((const float *)(s + 4 * i)),
                                             _MM_FROUND_TO_NEAREST_INT));
#endif
        for (; i < n; i++) {
            float f;
            memcpy(&f, s + 4 * i, 4);
            uint16_t h = rj_f2h(f);
            memcpy(d + 2 * i, &h, 2);
        }
    } else {
#if defined(__F16C__)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps((float *)(d + 4 * i),
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 2 * i))));
#endif
        for (; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            float f = rj_h2f(h);
            memcpy(d + 4 * i, &f, 4);
        }
    }
}

/* An f32 <-> f16 copy whose innermost rows are short and contiguous on both sides (a cube's
 * 8 lanes to or from float32 rows): as copy_short_rows, converting each row in place of the
 * per-row scratch round trip. The caller checked rank >= 2 and unit inner strides. */
static void convert_short_rows(run_ctx *c, const nd *it)
{
    int r = it->rank;
    uint32_t ed = c->es[0], es = c->es[1];
    int to_half = c->dt[0] == RJ_DT_F16;
    int64_t n1 = it->shape[r - 2], n = it->shape[r - 1];
    int64_t sd = it->st[0][r - 2] * ed, ss = it->st[1][r - 2] * es;
    int64_t idx[RJ_HOST_MAX_RANK] = {0}, off[MAXV] = {it->off[0], it->off[1]};
    do {
        uint8_t *d = AT(c->base[0], off[0], ed);
        const uint8_t *s = AT(c->base[1], off[1], es);
        for (int64_t i = 0; i < n1; i++)
            convert_row(d + i * sd, s + i * ss, n, to_half);
    } while (nd_next(it, r - 3, 2, idx, off));
}

/* ---- SELECT --------------------------------------------------------------------------------------- */

static int select_row(run_ctx *c, const int64_t *off, int64_t n, const int64_t *st)
{
    const rj_host_op *op = c->op;
    int64_t first = op->iparam[0], total = op->iparam[1], ncases = c->nin - 1;
    uint32_t es = c->es[0];
    for (int64_t s = 0; s < n; s += CHUNK) {
        int64_t m = n - s < CHUNK ? n - s : CHUNK;
        const int64_t *w = src_i(c, 1, off[1] + s * st[1], st[1], m);
        for (int64_t i = 0; i < m; i++) {
            int64_t k = w[i];
            if (k < 0 || k >= total) {
                char nm[32];
                return rj_fail(c->err, RJ_EINVAL,
                               "host op %s: selector value %lld at selector element %lld is "
                               "outside the %lld cases (valid: 0..%lld)",
                               op_name(op, nm, sizeof nm), (long long)k,
                               (long long)(off[1] + (s + i) * st[1]), (long long)total,
                               (long long)(total - 1));
            }
            k -= first;
            if (k < 0 || k >= ncases)
                continue;
            int v = 2 + (int)k;
            move_elem(AT(c->base[0], off[0] + (s + i) * st[0], es),
                      AT(c->base[v], off[v] + (s + i) * st[v], es), es);
        }
    }
    return RJ_OK;
}

/* ---- TAKE ----------------------------------------------------------------------------------------- */

static int take_row(run_ctx *c, const int64_t *off, int64_t n, const int64_t *st)
{
    const rj_host_op *op = c->op;
    int64_t astride = op->iparam[0], size = op->iparam[1];
    uint32_t es = c->es[0];
    for (int64_t s = 0; s < n; s += CHUNK) {
        int64_t m = n - s < CHUNK ? n - s : CHUNK;
        /* one index for the whole chunk (a row gather): load and check it once, move a
         * block */
        int64_t count = st[2] == 0 ? 1 : m;
        const int64_t *ix = src_i(c, 2, off[2] + s * st[2], st[2], count);
        for (int64_t i = 0; i < count; i++) {
            int64_t k = ix[i];
            if (k < -size || k >= size) {
                char nm[32];
                return rj_fail(c->err, RJ_EINVAL,
                               "host op %s: index %lld (indices element %lld) is out of range "
                               "for an axis of size %lld (valid: %lld..%lld)",
                               op_name(op, nm, sizeof nm), (long long)k,
                               (long long)(off[2] + (s + i) * st[2]), (long long)size,
                               (long long)-size, (long long)(size - 1));
            }
            if (k < 0)
                k += size;
            int64_t xo = off[1] + k * astride, oo = off[0];
            if (count == 1) {
                if (st[0] == 1 && st[1] == 1) {
                    memmove(AT(c->base[0], oo + s, es), AT(c->base[1], xo + s, es),
                            (size_t)m * es);
                } else {
                    for (int64_t j = 0; j < m; j++)
                        move_elem(AT(c->base[0], oo + (s + j) * st[0], es),
                                  AT(c->base[1], xo + (s + j) * st[1], es), es);
                }
            } else {
                move_elem(AT(c->base[0], oo + (s + i) * st[0], es),
                          AT(c->base[1], xo + (s + i) * st[1], es), es);
            }
        }
    }
    return RJ_OK;
}

/* A row gather (an embedding lookup): one index per output row of rows dense on both sides.
 * A block of indices is loaded and checked first, then each row moves with the rows a few
 * ahead already requested, so the table's rows (anywhere in a large weights buffer, cold in the
 * cache) arrive while earlier ones are copied instead of one memory latency per row. The same
 * bytes move as take_row moves them, and the first bad index fails with take_row's message. */
#define TAKE_AHEAD 8
static int take_rows(run_ctx *c, const nd *it)
{
    const rj_host_op *op = c->op;
    int64_t astride = op->iparam[0], size = op->iparam[1];
    uint32_t es = c->es[0];
    int64_t n0 = it->shape[0];
    size_t row = (size_t)it->shape[1] * es;
    int64_t *k = c->it[0];
    for (int64_t r0 = 0; r0 < n0; r0 += CHUNK) {
        int64_t m = n0 - r0 < CHUNK ? n0 - r0 : CHUNK;
        int64_t ioff = it->off[2] + r0 * it->st[2][0];
        load_i(c->dt[2], AT(c->base[2], ioff, c->es[2]), it->st[2][0], m, k);
        for (int64_t i = 0; i < m; i++) {
            if (k[i] < -size || k[i] >= size) {
                char nm[32];
                return rj_fail(c->err, RJ_EINVAL,
                               "host op %s: index %lld (indices element %lld) is out of range "
                               "for an axis of size %lld (valid: %lld..%lld)",
                               op_name(op, nm, sizeof nm), (long long)k[i],
                               (long long)(ioff + i * it->st[2][0]), (long long)size,
                               (long long)-size, (long long)(size - 1));
            }
            k[i] = it->off[1] + (r0 + i) * it->st[1][0] + (k[i] < 0 ? k[i] + size : k[i]) * astride;
        }
        for (int64_t i = 0; i < m; i++) {
            if (i + TAKE_AHEAD < m) {
                const uint8_t *q = AT(c->base[1], k[i + TAKE_AHEAD], es);
                for (size_t b = 0; b < row; b += 64)
                    __builtin_prefetch(q + b, 0, 0);
            }
            memmove(AT(c->base[0], it->off[0] + (r0 + i) * it->st[0][0], es),
                    AT(c->base[1], k[i], es), row);
        }
    }
    return RJ_OK;
}

/* ---- IOTA ----------------------------------------------------------------------------------------- */

/* View 1 is virtual: its "element offset" is the coordinate along the iota dimension. */
static int iota_row(run_ctx *c, const int64_t *off, int64_t n, const int64_t *st)
{
    for (int64_t s = 0; s < n; s += CHUNK) {
        int64_t m = n - s < CHUNK ? n - s : CHUNK;
        for (int64_t i = 0; i < m; i++)
            c->it[0][i] = off[1] + (s + i) * st[1];
        store_i(c->dt[0], AT(c->base[0], off[0] + s * st[0], c->es[0]), st[0], m, c->it[0]);
    }
    return RJ_OK;
}

/* ---- REDUCE --------------------------------------------------------------------------------------- */

typedef struct red_acc {
    double fsum;
    float fmax; /* NaN once any element was NaN */
    uint64_t isum;
    int64_t imax;
} red_acc;

/* max that propagates NaN without a branch: once m is NaN, neither test replaces it */
#define NAN_MAX(m, v) ((((v) > (m)) | ((v) != (v))) ? (v) : (m))

/* Fold one strided row of the input into the accumulator. Lane-wise partial results keep
 * the loops vectorizable; f32 sums accumulate in f64 and round once at the end. */
static void red_fold(run_ctx *c, int64_t off, int64_t n, int64_t st, red_acc *acc)
{
    int fdom = DT[c->dt[1]].is_float;
    int sum = c->op->code == RJ_RED_SUM;
    for (int64_t s = 0; s < n; s += CHUNK) {
        int64_t m = n - s < CHUNK ? n - s : CHUNK;
        if (fdom) {
            const float *a = src_f(c, 1, off + s * st, st, m);
            if (sum) {
                double lane[8] = {0};
                int64_t i = 0;
                for (; i + 8 <= m; i += 8)
                    for (int l = 0; l < 8; l++)
                        lane[l] += (double)a[i + l];
                for (; i < m; i++)
                    lane[0] += (double)a[i];
                acc->fsum += ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                             ((lane[4] + lane[5]) + (lane[6] + lane[7]));
            } else {
                float lane[8];
                for (int l = 0; l < 8; l++)
                    lane[l] = acc->fmax;
                int64_t i = 0;
                for (; i + 8 <= m; i += 8)
                    for (int l = 0; l < 8; l++)
                        lane[l] = NAN_MAX(lane[l], a[i + l]);
                for (; i < m; i++)
                    lane[0] = NAN_MAX(lane[0], a[i]);
                float mx = lane[0];
                for (int l = 1; l < 8; l++)
                    mx = NAN_MAX(mx, lane[l]);
                acc->fmax = mx;
            }
        } else {
            const int64_t *a = src_i(c, 1, off + s * st, st, m);
            if (sum) {
                uint64_t t = 0;
                for (int64_t i = 0; i < m; i++)
                    t += (uint64_t)a[i];
                acc->isum += t;
            } else {
                int64_t mx = acc->imax;
                for (int64_t i = 0; i < m; i++)
                    mx = a[i] > mx ? a[i] : mx;
                acc->imax = mx;
            }
        }
    }
}

/* Reduced axes more contiguous than the kept row: each output element folds its own
 * (contiguous) run of inputs. */
static int reduce_row_inner(run_ctx *c, const int64_t *off, int64_t n, const int64_t *st)
{
    const nd *in = c->inner;
    int fdom = DT[c->dt[1]].is_float;
    int inner = in->rank - 1;
    for (int64_t j = 0; j < n; j++) {
        red_acc acc = {0.0, -INFINITY, 0, DT[c->dt[1]].min};
        if (!in->empty) {
            int64_t idx[RJ_HOST_MAX_RANK] = {0};
            int64_t o = off[1] + j * st[1] + in->off[0];
            for (;;) {
                red_fold(c, o, in->shape[inner], in->st[0][inner], &acc);
                if (!nd_next(in, inner - 1, 1, idx, &o))
                    break;
            }
        }
        uint8_t *out = AT(c->base[0], off[0] + j * st[0], c->es[0]);
        if (fdom) {
            float v = c->op->code == RJ_RED_SUM ? (float)acc.fsum : acc.fmax;
            store_f(c->dt[0], out, 1, 1, &v);
        } else {
            int64_t v = c->op->code == RJ_RED_SUM ? (int64_t)acc.isum : acc.imax;
            store_i(c->dt[0], out, 1, 1, &v);
        }
    }
    return RJ_OK;
}

/* The kept row is the more contiguous one (e.g. a column sum): accumulate whole chunks of
 * the kept row, one reduced position at a time, element-wise into per-output accumulators. */
static int reduce_row_outer(run_ctx *c, const int64_t *off, int64_t n, const int64_t *st)
{
    const nd *in = c->inner;
    int fdom = DT[c->dt[1]].is_float;
    int sum = c->op->code == RJ_RED_SUM;
    for (int64_t j0 = 0; j0 < n; j0 += CHUNK) {
        int64_t m = n - j0 < CHUNK ? n - j0 : CHUNK;
        double *dacc = c->dacc;
        float *facc = c->ft[0];
        uint64_t *uacc = (uint64_t *)c->it[0];
        int64_t *iacc = c->it[0];
        for (int64_t i = 0; i < m; i++) {
            dacc[i] = 0.0;
            facc[i] = -INFINITY;
            iacc[i] = sum ? 0 : DT[c->dt[1]].min;
        }
        if (!in->empty) {
            int64_t idx[RJ_HOST_MAX_RANK] = {0};
            int64_t o = off[1] + j0 * st[1] + in->off[0];
            for (;;) {
                if (fdom) {
                    const float *a = src_f(c, 1, o, st[1], m);
                    if (sum)
                        for (int64_t i = 0; i < m; i++)
                            dacc[i] += (double)a[i];
                    else
                        for (int64_t i = 0; i < m; i++)
                            facc[i] = NAN_MAX(facc[i], a[i]);
                } else {
                    const int64_t *a = src_i(c, 1, o, st[1], m);
                    if (sum)
                        for (int64_t i = 0; i < m; i++)
                            uacc[i] += (uint64_t)a[i];
                    else
                        for (int64_t i = 0; i < m; i++)
                            iacc[i] = a[i] > iacc[i] ? a[i] : iacc[i];
                }
                if (!nd_next(in, in->rank - 1, 1, idx, &o))
                    break;
            }
        }
        uint8_t *out = AT(c->base[0], off[0] + j0 * st[0], c->es[0]);
        if (fdom) {
            if (sum)
                for (int64_t i = 0; i < m; i++)
                    facc[i] = (float)dacc[i];
            store_f(c->dt[0], out, st[0], m, facc);
        } else {
            store_i(c->dt[0], out, st[0], m, iacc);
        }
    }
    return RJ_OK;
}

/* A float max whose kept row and innermost reduced dim interleave: the kept positions are
 * S >= L elements apart and each one's reduced run of L starts there (a cube's row max: rows 8
 * lanes apart, the 8 lanes of an atom reduced, or the first 4 of them). Each outer reduced
 * position is then one contiguous load of (m - 1) x S + L elements for m outputs, not one call
 * per short run. Each output folds its elements in the row walk's order, from -inf, so the
 * result is the same bits (signed zeros and NaN included). */
static int reduce_max_interleaved(run_ctx *c, const int64_t *off, int64_t n, const int64_t *st)
{
    const nd *in = c->inner;
    int r = in->rank;
    int64_t L = in->shape[r - 1], S = st[1];
    int64_t per = (CHUNK - L) / S + 1;
    float *facc = c->ft[0];
    for (int64_t j0 = 0; j0 < n; j0 += per) {
        int64_t m = n - j0 < per ? n - j0 : per;
        for (int64_t i = 0; i < m; i++)
            facc[i] = -INFINITY;
        int64_t idx[RJ_HOST_MAX_RANK] = {0};
        int64_t o = off[1] + j0 * st[1] + in->off[0];
        do {
            const float *a = src_f(c, 1, o, 1, (m - 1) * S + L);
            for (int64_t i = 0; i < m; i++)
                for (int64_t l = 0; l < L; l++)
                    facc[i] = NAN_MAX(facc[i], a[i * S + l]);
        } while (nd_next(in, r - 2, 1, idx, &o));
        store_f(c->dt[0], AT(c->base[0], off[0] + j0 * st[0], c->es[0]), st[0], m, facc);
    }
    return RJ_OK;
}

/* ---- the check ------------------------------------------------------------------------------------ */

static int is_zero(const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return 0;
    return 1;
}

static const char *fmt_dims(char *buf, size_t n, const int64_t *v, uint32_t rank)
{
    size_t at = 0;
    at += (size_t)snprintf(buf, n, "[");
    for (uint32_t i = 0; i < rank && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, i ? ", %lld" : "%lld", (long long)v[i]);
    if (at < n)
        snprintf(buf + at, n - at, "]");
    return buf;
}

static const char *operand_name(uint32_t v, char *buf, size_t n)
{
    if (v == 0)
        snprintf(buf, n, "output");
    else
        snprintf(buf, n, "input %u", v);
    return buf;
}

/* Lowest and highest element offsets a view reaches over `shape` (plus an optional extra
 * dimension: take's gathered axis). Returns 0 when the view reaches nothing. */
static int view_range(const rj_host_view *vw, const int64_t *shape, uint32_t rank, int64_t xn,
                      int64_t xs, int64_t *lo, int64_t *hi, int *overflow)
{
    int64_t l = vw->offset, h = vw->offset;
    *overflow = 0;
    for (uint32_t d = 0; d <= rank; d++) {
        int64_t n = d < rank ? shape[d] : xn, s = d < rank ? vw->stride[d] : xs;
        if (n == 0)
            return 0;
        int64_t span;
        if (__builtin_mul_overflow(n - 1, s, &span)) {
            *overflow = 1;
            return 1;
        }
        if (span < 0 ? __builtin_add_overflow(l, span, &l) : __builtin_add_overflow(h, span, &h)) {
            *overflow = 1;
            return 1;
        }
    }
    *lo = l;
    *hi = h;
    return 1;
}

/* Sufficient condition for a view to name each element at most once: sorted by |stride|,
 * each stride exceeds the span of all smaller ones. `skip` masks dims not checked. */
static int view_injective(const rj_host_view *vw, const int64_t *shape, uint32_t rank,
                          uint32_t skip)
{
    int64_t s[RJ_HOST_MAX_RANK], n[RJ_HOST_MAX_RANK];
    int k = 0;
    for (uint32_t d = 0; d < rank; d++) {
        if ((skip >> d) & 1u || shape[d] <= 1)
            continue;
        int64_t a = vw->stride[d] < 0 ? -vw->stride[d] : vw->stride[d];
        int j = k++;
        while (j > 0 && s[j - 1] > a) {
            s[j] = s[j - 1];
            n[j] = n[j - 1];
            j--;
        }
        s[j] = a;
        n[j] = shape[d];
    }
    int64_t span = 0; /* max offset reachable by the smaller dims */
    for (int i = 0; i < k; i++) {
        if (s[i] <= span)
            return 0;
        if (__builtin_mul_overflow(s[i], n[i] - 1, &s[i]) || __builtin_add_overflow(span, s[i], &span))
            return 0;
    }
    return 1;
}

#define FAIL(code, ...) rj_fail(err, code, __VA_ARGS__)

/* A check runs before every host step of every run: the names and shapes its messages
 * print are formatted inside a failing FAIL's arguments only. */
#define NM op_name(op, nm, sizeof nm)
#define ON(v_) operand_name((v_), on, sizeof on)
#define DIMS fmt_dims(dims, sizeof dims, op->shape, op->rank)
#define STS(vw_) fmt_dims(sts, sizeof sts, (vw_)->stride, op->rank)

static int check_kind(const rj_host_op *op, rj_err *err)
{
    char nm[32];
    const rj_host_view *out = &op->view[0], *a = &op->view[1], *b = &op->view[2];
    uint32_t ki = op->kind - RJ_HOST_OPS_FIRST;
    int uses_code = op->kind == RJ_HOST_UNARY || op->kind == RJ_HOST_BINARY ||
                    op->kind == RJ_HOST_COMPARE || op->kind == RJ_HOST_REDUCE;
    if (op->ninputs < KIND_INPUTS_MIN[ki] || op->ninputs > KIND_INPUTS_MAX[ki])
        return FAIL(RJ_EINVAL, "host op %s: has %u inputs, needs %u..%u", NM, op->ninputs,
                    KIND_INPUTS_MIN[ki], KIND_INPUTS_MAX[ki]);
    if (!uses_code && op->code)
        return FAIL(RJ_EINVAL, "host op %s: code is %u, must be 0 for this kind", NM, op->code);
    if (op->kind != RJ_HOST_REDUCE && op->axis_mask)
        return FAIL(RJ_EINVAL, "host op %s: axis_mask 0x%x is only meaningful for reduce; set 0",
                    NM, op->axis_mask);
    /* iparams each kind reads; the rest must be zero */
    uint32_t used = op->kind == RJ_HOST_UNARY && (op->code == RJ_UN_IPOW ||
                                                  op->code == RJ_UN_RECIP_LO) ? 1u
                    : op->kind == RJ_HOST_SELECT || op->kind == RJ_HOST_TAKE ? 3u
                    : op->kind == RJ_HOST_IOTA ? 1u : 0u;
    for (int i = 0; i < 4; i++)
        if (!((used >> i) & 1u) && op->iparam[i])
            return FAIL(RJ_EINVAL, "host op %s: iparam[%d] = %lld is unused by this kind and must "
                        "be 0", NM, i, (long long)op->iparam[i]);
    int afloat = op->ninputs ? DT[a->dtype].is_float : 0;
    switch (op->kind) {
    case RJ_HOST_UNARY:
        if (op->code == 0 || op->code >= RJ_UN_COUNT)
            return FAIL(RJ_EINVAL, "host op unary: unknown code %u (RJ_UN_NEG 1 .. RJ_UN_RECIP_LO %u)",
                        op->code, RJ_UN_COUNT - 1);
        if (a->dtype == RJ_DT_BOOL)
            return FAIL(RJ_EINVAL, "host op %s: needs a numeric input, got bool", NM);
        if (!afloat && op->code != RJ_UN_NEG && op->code != RJ_UN_ABS && op->code != RJ_UN_IPOW)
            return FAIL(RJ_EINVAL, "host op %s: needs a float input (f32, f16, bf16), got %s", NM,
                        DT[a->dtype].name);
        if (!afloat && op->code == RJ_UN_IPOW && op->iparam[0] < 0)
            return FAIL(RJ_EINVAL, "host op %s: negative exponent %lld needs a float input, got %s",
                        NM, (long long)op->iparam[0], DT[a->dtype].name);
        break;
    case RJ_HOST_BINARY:
    case RJ_HOST_COMPARE: {
        uint32_t cnt = op->kind == RJ_HOST_BINARY ? RJ_BIN_COUNT : RJ_CMP_COUNT;
        if (op->code == 0 || op->code >= cnt)
            return FAIL(RJ_EINVAL, "host op %s: unknown code %u (valid 1..%u)",
                        rj_host_op_kind_name(op->kind), op->code, cnt - 1);
        if (a->dtype != b->dtype)
            return FAIL(RJ_EINVAL, "host op %s: inputs must share one dtype, got %s and %s "
                        "(convert one first)", NM, DT[a->dtype].name, DT[b->dtype].name);
        if (op->kind == RJ_HOST_BINARY && op->code == RJ_BIN_POW && !afloat)
            return FAIL(RJ_EINVAL, "host op %s: needs float inputs, got %s", NM, DT[a->dtype].name);
        if (op->kind == RJ_HOST_BINARY && a->dtype == RJ_DT_BOOL && op->code != RJ_BIN_MAX &&
            op->code != RJ_BIN_MIN)
            return FAIL(RJ_EINVAL, "host op %s: needs numeric inputs, got bool", NM);
        break;
    }
    case RJ_HOST_REDUCE:
        if (op->code == 0 || op->code >= RJ_RED_COUNT)
            return FAIL(RJ_EINVAL, "host op reduce: unknown code %u (RJ_RED_SUM 1, RJ_RED_MAX 2)",
                        op->code);
        if (op->rank < 32 && (op->axis_mask >> op->rank))
            return FAIL(RJ_EINVAL, "host op %s: axis_mask 0x%x names axes beyond rank %u", NM,
                        op->axis_mask, op->rank);
        if (op->code == RJ_RED_SUM && a->dtype == RJ_DT_BOOL)
            return FAIL(RJ_EINVAL, "host op %s: needs a numeric input, got bool", NM);
        if (afloat != (int)DT[out->dtype].is_float)
            return FAIL(RJ_EINVAL, "host op %s: input %s and output %s must both be float or both "
                        "integer", NM, DT[a->dtype].name, DT[out->dtype].name);
        for (uint32_t d = 0; d < op->rank; d++)
            if ((op->axis_mask >> d) & 1u && out->stride[d] != 0)
                return FAIL(RJ_EINVAL, "host op %s: output stride on reduced axis %u is %lld, must "
                            "be 0", NM, d, (long long)out->stride[d]);
        break;
    case RJ_HOST_SELECT: {
        int64_t ncases = (int64_t)op->ninputs - 1;
        if (DT[a->dtype].is_float)
            return FAIL(RJ_EINVAL, "host op select: the selector must be bool or an integer, got %s",
                        DT[a->dtype].name);
        for (uint32_t v = 2; v <= op->ninputs; v++)
            if (op->view[v].dtype != out->dtype)
                return FAIL(RJ_EINVAL, "host op select: case %u is %s but the output is %s", v - 2,
                            DT[op->view[v].dtype].name, DT[out->dtype].name);
        if (op->iparam[0] < 0 || op->iparam[1] < op->iparam[0] + ncases)
            return FAIL(RJ_EINVAL, "host op select: cases %lld..%lld of %lld total do not fit "
                        "(iparam[0] = first case, iparam[1] = total cases)",
                        (long long)op->iparam[0], (long long)(op->iparam[0] + ncases - 1),
                        (long long)op->iparam[1]);
        break;
    }
    case RJ_HOST_TAKE:
        if (a->dtype != out->dtype)
            return FAIL(RJ_EINVAL, "host op take: the table is %s but the output is %s",
                        DT[a->dtype].name, DT[out->dtype].name);
        if (DT[b->dtype].is_float || b->dtype == RJ_DT_BOOL)
            return FAIL(RJ_EINVAL, "host op take: indices must be integers, got %s",
                        DT[b->dtype].name);
        if (op->iparam[1] < 0)
            return FAIL(RJ_EINVAL, "host op take: axis size iparam[1] = %lld is negative",
                        (long long)op->iparam[1]);
        break;
    case RJ_HOST_IOTA:
        if (op->iparam[0] < 0 || op->iparam[0] >= (int64_t)op->rank)
            return FAIL(RJ_EINVAL, "host op iota: dimension iparam[0] = %lld is outside rank %u",
                        (long long)op->iparam[0], op->rank);
        break;
    default:
        break;
    }
    return RJ_OK;
}

int rj_host_op_check(const rj_host_op *op, const rj_host_buf *bufs, uint32_t nbufs, rj_err *err)
{
    char nm[32], on[16], dims[200], sts[200];
    if (!op)
        return FAIL(RJ_EINVAL, "host op: NULL descriptor");
    if (op->magic != RJ_HOST_OP_MAGIC)
        return FAIL(RJ_EINVAL, "host op: descriptor magic is 0x%08x, not 0x%08x: these bytes are "
                    "not a host-op descriptor (or it was never written)", op->magic, RJ_HOST_OP_MAGIC);
    if (op->version != RJ_HOST_OP_VERSION)
        return FAIL(RJ_EINVAL, "host op: descriptor version %u, this runtime reads version %u: "
                    "recompile the program", op->version, RJ_HOST_OP_VERSION);
    if (op->kind < RJ_HOST_OPS_FIRST || op->kind >= RJ_HOST_OPS_END)
        return FAIL(RJ_EINVAL, "host op: unknown kind %u (valid %u..%u)", op->kind,
                    RJ_HOST_OPS_FIRST, RJ_HOST_OPS_END - 1);
    if (op->reserved)
        return FAIL(RJ_EINVAL, "host op %s: reserved field is %u, must be zero", NM, op->reserved);
    if (op->rank > RJ_HOST_MAX_RANK)
        return FAIL(RJ_EINVAL, "host op %s: rank %u exceeds the maximum %d", NM, op->rank,
                    RJ_HOST_MAX_RANK);
    if (op->ninputs + 1 > RJ_HOST_MAX_OPERANDS)
        return FAIL(RJ_EINVAL, "host op %s: %u inputs exceed the maximum %d", NM, op->ninputs,
                    RJ_HOST_MAX_OPERANDS - 1);
    for (uint32_t d = 0; d < RJ_HOST_MAX_RANK; d++) {
        if (d < op->rank && op->shape[d] < 0)
            return FAIL(RJ_EINVAL, "host op %s: shape[%u] = %lld is negative", NM, d,
                        (long long)op->shape[d]);
        if (d >= op->rank && op->shape[d])
            return FAIL(RJ_EINVAL, "host op %s: shape[%u] = %lld beyond rank %u must be 0", NM, d,
                        (long long)op->shape[d], op->rank);
    }
    if (nbufs != op->ninputs + 1 || (!bufs && nbufs))
        return FAIL(RJ_EINVAL, "host op %s: got %u buffers, needs %u (the output and %u inputs)",
                    NM, nbufs, op->ninputs + 1, op->ninputs);
    uint32_t nv = op->ninputs + 1;
    for (uint32_t v = 0; v < RJ_HOST_MAX_OPERANDS; v++) {
        const rj_host_view *vw = &op->view[v];
        if (v >= nv) {
            if (!is_zero(vw, sizeof(*vw)))
                return FAIL(RJ_EINVAL, "host op %s: view %u is unused (%u inputs) and must be all "
                            "zero", NM, v, op->ninputs);
            continue;
        }
        if (!dt_ok(vw->dtype))
            return FAIL(RJ_EINVAL, "host op %s: %s has unknown dtype %u", NM, ON(v), vw->dtype);
        if (vw->reserved)
            return FAIL(RJ_EINVAL, "host op %s: %s view reserved field is %u, must be zero", NM,
                        ON(v), vw->reserved);
        for (uint32_t d = op->rank; d < RJ_HOST_MAX_RANK; d++)
            if (vw->stride[d])
                return FAIL(RJ_EINVAL, "host op %s: %s stride[%u] beyond rank %u must be 0", NM,
                            ON(v), d, op->rank);
    }
    int rc = check_kind(op, err);
    if (rc)
        return rc;
    /* the output names each element once (reduce: once per kept position) */
    uint32_t skip = op->kind == RJ_HOST_REDUCE ? op->axis_mask : 0;
    if (!view_injective(&op->view[0], op->shape, op->rank, skip)) {
        return FAIL(RJ_EINVAL, "host op %s: output strides %s over shape %s write some element "
                    "more than once", NM, STS(&op->view[0]), DIMS);
    }
    /* bounds: every element each view can reach lies inside its buffer */
    for (uint32_t v = 0; v < nv; v++) {
        const rj_host_view *vw = &op->view[v];
        int take_x = op->kind == RJ_HOST_TAKE && v == 1;
        int64_t lo = 0, hi = 0, xn = take_x && op->iparam[1] ? op->iparam[1] : 1;
        int64_t xs = take_x ? op->iparam[0] : 0;
        int ovf;
        /* a reduce writes its output even when a reduced axis is empty: check the output
         * over the kept axes only */
        int64_t kshape[RJ_HOST_MAX_RANK];
        for (uint32_t d = 0; d < op->rank; d++)
            kshape[d] = op->kind == RJ_HOST_REDUCE && v == 0 && ((op->axis_mask >> d) & 1u)
                            ? 1 : op->shape[d];
        if (!view_range(vw, kshape, op->rank, xn, xs, &lo, &hi, &ovf))
            continue; /* empty: reaches nothing */
        if (ovf)
            return FAIL(RJ_EINVAL, "host op %s: %s strides %s over shape %s overflow 64-bit "
                        "offsets", NM, ON(v), STS(vw), DIMS);
        uint64_t es = DT[vw->dtype].size;
        if (lo < 0)
            return FAIL(RJ_EFAULT, "host op %s: %s (offset %lld, strides %s over shape %s) reaches "
                        "element %lld, before the start of its buffer", NM, ON(v),
                        (long long)vw->offset, STS(vw), DIMS, (long long)lo);
        if ((uint64_t)hi >= bufs[v].size / es)
            return FAIL(RJ_EFAULT, "host op %s: %s (%s, offset %lld, strides %s over shape %s) "
                        "reaches element %lld (bytes up to %llu) but its buffer holds %llu bytes",
                        NM, ON(v), DT[vw->dtype].name, (long long)vw->offset, STS(vw), DIMS,
                        (long long)hi, (unsigned long long)(((uint64_t)hi + 1) * es),
                        (unsigned long long)bufs[v].size);
        if (!bufs[v].data)
            return FAIL(RJ_EINVAL, "host op %s: %s buffer pointer is NULL", NM, ON(v));
    }
    return RJ_OK;
}

#undef NM
#undef ON
#undef DIMS
#undef STS

/* Bytes an operand's view touches: its distinct elements (broadcast dims count once). */
static uint64_t footprint(const rj_host_view *vw, const int64_t *shape, uint32_t rank, int all)
{
    uint64_t n = DT[vw->dtype].size;
    for (uint32_t d = 0; d < rank; d++)
        if (all || vw->stride[d])
            n *= (uint64_t)shape[d];
    return n;
}

/* How one op runs, from its descriptor (and the buffers' bases, NULL when only planning):
 * the outer iteration, the walker, the bytes it moves. Building it touches no data. */
enum { W_ROWS, W_TRANSPOSED, W_SHORT_ROWS, W_SHORT_ROWS_TILE, W_CONVERT_SHORT_ROWS, W_TAKE_ROWS };

typedef struct op_plan {
    const rj_host_op *op;
    uint8_t *base[MAXV];
    uint32_t dt[MAXV], es[MAXV];
    int nin, stream, has_inner, walk;
    row_fn fn;
    nd it, red; /* red: REDUCE's reduced dimensions */
    uint64_t moved;
} op_plan;

static void op_plan_build(op_plan *p, const rj_host_op *op, const rj_host_buf *bufs)
{
    memset(p, 0, sizeof(*p));
    p->op = op;
    p->nin = (int)op->ninputs;
    int nv = (int)op->ninputs + 1;
    int64_t st[MAXV][RJ_HOST_MAX_RANK], off[MAXV];
    for (int v = 0; v < nv; v++) {
        p->base[v] = bufs ? bufs[v].data : NULL;
        p->dt[v] = op->view[v].dtype;
        p->es[v] = DT[p->dt[v]].size;
        memcpy(st[v], op->view[v].stride, sizeof(st[v]));
        off[v] = op->view[v].offset;
    }
    uint64_t moved = footprint(&op->view[0], op->shape, op->rank, op->kind != RJ_HOST_REDUCE);
    p->stream = op->kind == RJ_HOST_COPY && moved >= STREAM_MIN_BYTES;
    for (int v = 1; v < nv; v++)
        moved += footprint(&op->view[v], op->shape, op->rank,
                           op->kind == RJ_HOST_REDUCE || (op->kind == RJ_HOST_TAKE && v == 1));
    p->moved = moved;
    p->walk = W_ROWS;
    nd *it = &p->it;
    switch (op->kind) {
    case RJ_HOST_COPY:
    case RJ_HOST_UNARY:
    case RJ_HOST_BINARY:
    case RJ_HOST_COMPARE: {
        int same = op->kind == RJ_HOST_COPY && p->dt[0] == p->dt[1];
        int f16_f32 = op->kind == RJ_HOST_COPY &&
                      ((p->dt[0] == RJ_DT_F16 && p->dt[1] == RJ_DT_F32) ||
                       (p->dt[0] == RJ_DT_F32 && p->dt[1] == RJ_DT_F16));
        nd_build(it, (int)op->rank, op->shape, nv, st, off);
        int r = it->rank;
        /* rows up to 256 bytes: below that a row's move costs less than the per-row
         * callback and odometer step the block walkers save */
        int short_rows = !it->empty && r >= 2 && it->st[0][r - 1] == 1 && it->st[1][r - 1] == 1 &&
                         it->shape[r - 1] <= 256 / p->es[0];
        int tiled = short_rows && same && short_rows_tile(it, p->es[0]);
        if (short_rows && (same || f16_f32) && !tiled)
            nd_widest_to_block(it);
        if (tiled)
            p->walk = W_SHORT_ROWS_TILE;
        else if (same && !it->empty && r >= 2 && it->st[0][r - 1] == 1 && it->st[1][r - 2] == 1 &&
            it->st[1][r - 1] != 1 && it->shape[r - 1] >= 8 && it->shape[r - 2] >= 4)
            p->walk = W_TRANSPOSED;
        else if (same && short_rows && it->shape[r - 2] >= 4)
            p->walk = W_SHORT_ROWS;
        else if (f16_f32 && short_rows && it->shape[r - 2] >= 4)
            p->walk = W_CONVERT_SHORT_ROWS;
        else
            p->fn = same ? copy_row : ew_row;
        break;
    }
    case RJ_HOST_SELECT:
        nd_build(it, (int)op->rank, op->shape, nv, st, off);
        p->fn = select_row;
        break;
    case RJ_HOST_TAKE:
        nd_build(it, (int)op->rank, op->shape, nv, st, off);
        p->fn = take_row;
        /* rows of one index each, dense in the table and the output: a row gather */
        if (!it->empty && it->rank == 2 && it->st[2][1] == 0 && it->st[0][1] == 1 &&
            it->st[1][1] == 1)
            p->walk = W_TAKE_ROWS;
        break;
    case RJ_HOST_IOTA:
        /* a virtual view 1 whose offset is the coordinate along the iota dimension */
        p->base[1] = NULL;
        memset(st[1], 0, sizeof(st[1]));
        st[1][op->iparam[0]] = 1;
        off[1] = 0;
        nd_build(it, (int)op->rank, op->shape, 2, st, off);
        p->fn = iota_row;
        break;
    case RJ_HOST_REDUCE: {
        /* outer iteration over the kept axes (output and input), inner over the reduced
         * axes (input only) */
        int64_t ks[RJ_HOST_MAX_RANK], rs[RJ_HOST_MAX_RANK];
        int64_t kst[MAXV][RJ_HOST_MAX_RANK], rst[MAXV][RJ_HOST_MAX_RANK];
        int nk = 0, nr = 0;
        for (uint32_t d = 0; d < op->rank; d++) {
            if ((op->axis_mask >> d) & 1u) {
                rs[nr] = op->shape[d];
                rst[0][nr++] = st[1][d];
            } else {
                ks[nk] = op->shape[d];
                kst[0][nk] = st[0][d];
                kst[1][nk++] = st[1][d];
            }
        }
        nd *red = &p->red;
        int64_t zero = 0;
        nd_build(red, nr, rs, 1, rst, &zero);
        p->has_inner = 1;
        nd_build(it, nk, ks, 2, kst, off);
        int64_t rin = red->st[0][red->rank - 1], kin = it->st[1][it->rank - 1];
        rin = rin < 0 ? -rin : rin;
        kin = kin < 0 ? -kin : kin;
        /* walk along whichever of the two is more contiguous in the input, or both at once
         * where a float max's kept rows are its short contiguous reduced runs apart */
        int outer = it->shape[it->rank - 1] > 1 && kin < rin;
        int64_t L = red->shape[red->rank - 1];
        int interleaved = !red->empty && DT[p->dt[1]].is_float && op->code == RJ_RED_MAX &&
                          red->st[0][red->rank - 1] == 1 && it->st[1][it->rank - 1] >= L &&
                          it->st[1][it->rank - 1] <= 64 && it->shape[it->rank - 1] > 1 &&
                          L <= 64;
        p->fn = interleaved ? reduce_max_interleaved : outer ? reduce_row_outer : reduce_row_inner;
        break;
    }
    default:
        break;
    }
}

/* The calling thread's context for a plan (~24 KiB of scratch: off the stack, one per
 * thread, so split ranges on several threads never share scratch). */
static run_ctx *ctx_for(const op_plan *p, rj_err *err)
{
    static _Thread_local run_ctx ctx;
    run_ctx *c = &ctx;
    c->op = p->op;
    c->err = err;
    c->nin = p->nin;
    c->inner = p->has_inner ? &p->red : NULL;
    c->stream = p->stream;
    memcpy(c->base, p->base, sizeof(c->base));
    memcpy(c->dt, p->dt, sizeof(c->dt));
    memcpy(c->es, p->es, sizeof(c->es));
    return c;
}

static int walk_plan(const op_plan *p, const nd *it, rj_err *err)
{
    run_ctx *c = ctx_for(p, err);
    switch (p->walk) {
    case W_TRANSPOSED: copy_transposed(c, it); return RJ_OK;
    case W_SHORT_ROWS: copy_short_rows(c, it); return RJ_OK;
    case W_SHORT_ROWS_TILE: copy_short_rows_tile(c, it); return RJ_OK;
    case W_CONVERT_SHORT_ROWS: convert_short_rows(c, it); return RJ_OK;
    case W_TAKE_ROWS: return take_rows(c, it);
    default: return nd_walk(c, it, p->fn);
    }
}

/* Where a plan splits: the outermost dimension of its iteration with a range per thread, else
 * the innermost (a row) in whole ROW_UNITs when it has one per thread, else the widest outer
 * one. Every element of every kind is computed on its own (a reduce's sums run over reduced
 * positions, never along the kept row), and the 8-lane fp16 conversions are the scalar ones'
 * instruction (rj_half.h: _cvtss_sh), so where a row's chunks start changes no bit. A row's
 * ranges start at multiples of ROW_UNIT elements: whole cache lines of an f32 output. */
#define ROW_UNIT 16
typedef struct op_split {
    int dim;
    int64_t unit;   /* elements per range unit: ROW_UNIT on a row, 1 elsewhere */
    uint64_t units; /* ranges available */
} op_split;

static op_split split_of(const nd *it, uint32_t threads)
{
    op_split s = {0, 1, 1};
    if (it->empty)
        return s;
    int r = it->rank, best = -1;
    for (int d = 0; d < r - 1; d++) {
        if ((uint64_t)it->shape[d] >= threads) {
            s.dim = d;
            s.units = (uint64_t)it->shape[d];
            return s;
        }
        if (best < 0 || it->shape[d] > it->shape[best])
            best = d;
    }
    uint64_t row_units = (uint64_t)((it->shape[r - 1] + ROW_UNIT - 1) / ROW_UNIT);
    if (row_units >= threads || best < 0 || (uint64_t)it->shape[best] < row_units) {
        s.dim = r - 1;
        s.unit = ROW_UNIT;
        s.units = row_units;
        return s;
    }
    s.dim = best;
    s.units = (uint64_t)it->shape[best];
    return s;
}

static uint32_t plan_threads(const op_plan *p, uint32_t threads)
{
    if (p->moved < RJ_HOST_SPLIT_MIN_BYTES || threads <= 1)
        return 1;
    return rj_host_split_threads(p->moved, split_of(&p->it, threads).units, threads);
}

typedef struct split_job {
    const op_plan *p;
    op_split s;
    uint32_t nitems;
} split_job;

static int split_item(void *ctx, uint32_t item, rj_err *err)
{
    const split_job *j = ctx;
    const nd *it = &j->p->it;
    uint64_t u0 = j->s.units * item / j->nitems, u1 = j->s.units * (item + 1) / j->nitems;
    int64_t a = (int64_t)u0 * j->s.unit, b = (int64_t)u1 * j->s.unit;
    if (b > it->shape[j->s.dim])
        b = it->shape[j->s.dim];
    if (b <= a)
        return RJ_OK;
    nd sub = *it;
    sub.shape[j->s.dim] = b - a;
    for (int v = 0; v < sub.nv; v++)
        sub.off[v] += a * it->st[v][j->s.dim];
    return walk_plan(j->p, &sub, err);
}

/* Run a built plan on up to `threads` threads (the plan is only read: split ranges share it). */
static int plan_run(const op_plan *p, uint32_t threads, uint64_t *bytes, uint32_t *used,
                    rj_err *err)
{
    int rc;
    uint32_t n = plan_threads(p, threads);
    if (n > 1) {
        split_job j = {p, split_of(&p->it, n), 0};
        j.nitems = rj_host_split_items(j.s.units, n);
        rc = rj_host_parallel(j.nitems, n, split_item, &j, used, err);
    } else {
        rc = walk_plan(p, &p->it, err);
    }
    if (!rc && bytes)
        *bytes = p->moved;
    return rc;
}

int rj_host_op_run_threads(const rj_host_op *op, const rj_host_buf *bufs, uint32_t nbufs,
                           uint32_t threads, uint64_t *bytes, uint32_t *used, rj_err *err)
{
    if (bytes)
        *bytes = 0;
    if (used)
        *used = 1;
    int rc = rj_host_op_check(op, bufs, nbufs, err);
    if (rc)
        return rc;
    op_plan p;
    op_plan_build(&p, op, bufs);
    return plan_run(&p, threads, bytes, used, err);
}

int rj_host_op_run(const rj_host_op *op, const rj_host_buf *bufs, uint32_t nbufs,
                   uint64_t *bytes, rj_err *err)
{
    return rj_host_op_run_threads(op, bufs, nbufs, 1, bytes, NULL, err);
}

uint32_t rj_host_op_plan_threads(const rj_host_op *op, uint32_t threads)
{
    /* the full descriptor check against buffers that hold anything: a valid descriptor
     * passes, garbage is refused before the plan reads it */
    rj_host_buf any[RJ_HOST_MAX_OPERANDS];
    for (int v = 0; v < RJ_HOST_MAX_OPERANDS; v++)
        any[v] = (rj_host_buf){(void *)any, UINT64_MAX};
    rj_err e;
    if (!op || op->ninputs + 1 > RJ_HOST_MAX_OPERANDS ||
        rj_host_op_check(op, any, op->ninputs + 1, &e))
        return 0;
    op_plan p;
    op_plan_build(&p, op, NULL);
    return plan_threads(&p, threads);
}

/* ---- as runtime host steps ------------------------------------------------------------------------ */

static int step_operand(const rj_host_step *s, rj_bo *const *bos, uint32_t nbos, uint32_t bo,
                        uint64_t offset, const char *what, rj_host_buf *out, rj_err *err)
{
    const char *kname = rj_host_op_kind_name(s->kind);
    if (bo >= nbos || !bos[bo])
        return FAIL(RJ_EINVAL, "host step %s: %s names BO %u, but the program has %u BOs", kname,
                    what, bo, nbos);
    if (offset > bos[bo]->size)
        return FAIL(RJ_EFAULT, "host step %s: %s offset %llu is past the end of BO %u (%llu bytes)",
                    kname, what, (unsigned long long)offset, bo,
                    (unsigned long long)bos[bo]->size);
    out->data = bos[bo]->host + offset;
    out->size = bos[bo]->size - offset;
    return RJ_OK;
}

/* The step's descriptor (copied out of its BO into *op) and its operands' buffers. */
static int step_resolve(const rj_host_step *s, rj_bo *const *bos, uint32_t nbos, rj_host_op *out,
                        rj_host_buf *bufs, uint32_t *nbufs, rj_err *err)
{
    if (!s)
        return FAIL(RJ_EINVAL, "host step: NULL step");
    const char *kname = rj_host_op_kind_name(s->kind);
    if (s->rows || s->cols || s->eps != 0.0f)
        return FAIL(RJ_EINVAL, "host step %s: rows, cols and eps are unused and must be 0 (the "
                    "descriptor carries the shape)", kname);
    for (int i = 2; i < 8; i++)
        if (s->param[i])
            return FAIL(RJ_EINVAL, "host step %s: param[%d] = %u is unused and must be 0", kname,
                        i, s->param[i]);
    if (s->src.row_stride || s->dst.row_stride || s->aux.row_stride)
        return FAIL(RJ_EINVAL, "host step %s: operand row strides must be 0 (the descriptor "
                    "carries the strides)", kname);
    rj_host_buf db = {NULL, 0};
    int rc = step_operand(s, bos, nbos, s->aux.bo, s->aux.offset, "aux (descriptor)", &db, err);
    if (rc)
        return rc;
    rj_host_op op;
    memset(bufs, 0, RJ_HOST_MAX_OPERANDS * sizeof(*bufs));
    if (db.size < sizeof op)
        return FAIL(RJ_EFAULT, "host step %s: the descriptor at BO %u offset %llu needs %zu bytes, "
                    "the BO has %llu left", kname, s->aux.bo, (unsigned long long)s->aux.offset,
                    sizeof op, (unsigned long long)db.size);
    memcpy(&op, db.data, sizeof op);
    if (op.magic != RJ_HOST_OP_MAGIC)
        return FAIL(RJ_EINVAL, "host step %s: no host-op descriptor at BO %u offset %llu (magic "
                    "0x%08x): write the op's descriptor bytes (its const buffer) before adding "
                    "the step", kname, s->aux.bo, (unsigned long long)s->aux.offset, op.magic);
    if (op.kind != s->kind)
        return FAIL(RJ_EINVAL, "host step %s: its descriptor describes a %s op", kname,
                    rj_host_op_kind_name(op.kind));
    uint32_t nin = op.ninputs < RJ_HOST_MAX_OPERANDS ? op.ninputs : RJ_HOST_MAX_OPERANDS - 1;
    const uint32_t in_bo[3] = {s->src.bo, s->param[0], s->param[1]};
    const uint64_t in_off[3] = {s->src.offset, s->param64[0], s->param64[1]};
    static const char *const in_name[3] = {"src (input 1)", "param[0] (input 2)",
                                           "param[1] (input 3)"};
    if ((rc = step_operand(s, bos, nbos, s->dst.bo, s->dst.offset, "dst (output)", &bufs[0], err)))
        return rc;
    for (uint32_t i = 0; i < 3; i++) {
        if (i < nin) {
            if ((rc = step_operand(s, bos, nbos, in_bo[i], in_off[i], in_name[i], &bufs[i + 1], err)))
                return rc;
        } else if (in_bo[i] != RJ_NO_BO || in_off[i]) {
            return FAIL(RJ_EINVAL, "host step %s: %s is set but the op has %u inputs; leave it "
                        "RJ_NO_BO with offset 0", kname, in_name[i], op.ninputs);
        }
    }
    *out = op;
    *nbufs = nin + 1;
    return RJ_OK;
}

static int step_exec(const rj_host_step *s, rj_bo *const *bos, uint32_t nbos, int check_only,
                     uint32_t threads, uint64_t *bytes, uint32_t *used, rj_err *err)
{
    if (bytes)
        *bytes = 0;
    if (used)
        *used = 1;
    if (s && s->kind == RJ_HOST_FUSED)
        return rj_host_fused_exec(s, bos, nbos, check_only, bytes, err);
    rj_host_op op;
    rj_host_buf bufs[RJ_HOST_MAX_OPERANDS];
    uint32_t nbufs = 0;
    int rc = step_resolve(s, bos, nbos, &op, bufs, &nbufs, err);
    if (rc)
        return rc;
    if (check_only)
        return rj_host_op_check(&op, bufs, nbufs, err);
    return rj_host_op_run_threads(&op, bufs, nbufs, threads, bytes, used, err);
}

int rj_host_op_step_exec(const rj_host_step *s, rj_bo *const *bos, uint32_t nbos, int check_only,
                         uint64_t *bytes, rj_err *err)
{
    return step_exec(s, bos, nbos, check_only, 1, bytes, NULL, err);
}

int rj_host_op_step_run_threads(const rj_host_step *s, rj_bo *const *bos, uint32_t nbos,
                                uint32_t threads, uint64_t *bytes, uint32_t *used, rj_err *err)
{
    return step_exec(s, bos, nbos, 0, threads, bytes, used, err);
}

/* ---- prepared steps: resolved, checked and planned once (at program load) ------------------ */

struct rj_host_prepared {
    rj_host_op op; /* the descriptor as checked; plan.op points here */
    op_plan plan;
    rj_host_prepared *next; /* a fused step's next op (rj_host_fused.h) */
    int single;             /* a fused step's chain: every op on one thread */
};

int rj_host_prepare_op(const rj_host_op *op, const rj_host_buf *bufs, uint32_t nbufs,
                       rj_host_prepared **out, rj_err *err)
{
    *out = NULL;
    int rc = rj_host_op_check(op, bufs, nbufs, err);
    if (rc)
        return rc;
    rj_host_prepared *p = calloc(1, sizeof(*p));
    if (!p)
        return FAIL(RJ_ENOMEM, "host step: out of memory preparing an op");
    p->op = *op;
    op_plan_build(&p->plan, &p->op, bufs);
    *out = p;
    return RJ_OK;
}

void rj_host_prepared_chain(rj_host_prepared *p, rj_host_prepared *next)
{
    p->single = 1;
    while (next && p->next)
        p = p->next;
    if (next)
        p->next = next;
}

int rj_host_op_step_prepare(const rj_host_step *s, rj_bo *const *bos, uint32_t nbos,
                            rj_host_prepared **out, rj_err *err)
{
    *out = NULL;
    if (s && s->kind == RJ_HOST_FUSED) {
        int rc = rj_host_fused_prepare(s, bos, nbos, out, err);
        if (!rc)
            rj_host_prepared_chain(*out, NULL);
        return rc;
    }
    rj_host_prepared *p = calloc(1, sizeof(*p));
    if (!p)
        return FAIL(RJ_ENOMEM, "host step: out of memory preparing a step");
    rj_host_buf bufs[RJ_HOST_MAX_OPERANDS];
    uint32_t nbufs = 0;
    int rc = step_resolve(s, bos, nbos, &p->op, bufs, &nbufs, err);
    if (!rc)
        rc = rj_host_op_check(&p->op, bufs, nbufs, err);
    if (rc) {
        free(p);
        return rc;
    }
    op_plan_build(&p->plan, &p->op, bufs);
    *out = p;
    return RJ_OK;
}

int rj_host_prepared_run(const rj_host_prepared *p, uint32_t threads, uint64_t *bytes,
                         uint32_t *used, rj_err *err)
{
    if (bytes)
        *bytes = 0;
    if (used)
        *used = 1;
    if (!p->single)
        return plan_run(&p->plan, threads, bytes, used, err);
    uint64_t total = 0;
    for (; p; p = p->next) {
        uint64_t moved = 0;
        int rc = plan_run(&p->plan, 1, &moved, NULL, err);
        if (rc)
            return rc;
        total += moved;
    }
    if (bytes)
        *bytes = total;
    return RJ_OK;
}

void rj_host_prepared_free(rj_host_prepared *p)
{
    while (p) {
        rj_host_prepared *next = p->next;
        free(p);
        p = next;
    }
}
