/* The host-step library: the small O(rows) tails the NPU cannot do or does worse
 * (design.md, "Host steps"), plus gathers and cube-layout pack/unpack, and the strided N-d
 * host ops of rj_host_ops.h (kinds RJ_HOST_COPY..RJ_HOST_IOTA, one row each below).
 *
 * One table entry per kind: a checker (bounds, dtypes, params; runs when the step is added
 * and again before it runs) and a runner that returns the bytes it moved. Adding a kind is
 * one enum value and one row. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "rj_half.h"
#include "runtime/rj_host_ops.h"
#include "runtime/rj_runtime.h"

#if defined(__has_include)
#if __has_include("layout/rj_layout.h")
#include "layout/rj_layout.h"
#define RJ_HAVE_LAYOUT 1
#endif
#endif

typedef struct step_ctx {
    const rj_host_step *s;
    rj_bo *const *bos;
    uint32_t nbos;
    int check_only; /* validate operands and params, touch no data */
    rj_err *err;
} step_ctx;

static uint32_t dt_size(uint32_t dt)
{
    switch (dt) {
    case RJ_DT_F32: case RJ_DT_I32: return 4;
    case RJ_DT_F16: return 2;
    case RJ_DT_I8: case RJ_DT_U8: return 1;
    default: return 0;
    }
}

static const char *dt_name(uint32_t dt)
{
    switch (dt) {
    case RJ_DT_F32: return "f32";
    case RJ_DT_F16: return "f16";
    case RJ_DT_I32: return "i32";
    case RJ_DT_I8: return "i8";
    case RJ_DT_U8: return "u8";
    default: return "?";
    }
}

/* Resolve an operand holding `rows` rows of `row_elems` elements; NULL + error when it does
 * not fit its BO. `dense_stride` is the stride used when the operand leaves it 0. */
static uint8_t *operand(step_ctx *c, const rj_operand *op, const char *what, uint32_t rows,
                        uint64_t row_elems, uint64_t *stride_out)
{
    const char *kname = rj_host_step_name(c->s->kind);
    if (op->bo >= c->nbos || !c->bos[op->bo]) {
        rj_fail(c->err, RJ_EINVAL, "host step %s: %s names BO %u, but the program has %u BOs",
                kname, what, op->bo, c->nbos);
        return NULL;
    }
    uint32_t es = dt_size(op->dtype);
    if (!es) {
        rj_fail(c->err, RJ_EINVAL, "host step %s: %s has unknown dtype %u", kname, what, op->dtype);
        return NULL;
    }
    uint64_t row_bytes = row_elems * es;
    uint64_t stride = op->row_stride ? op->row_stride : row_bytes;
    if (stride < row_bytes) {
        rj_fail(c->err, RJ_EINVAL,
                "host step %s: %s row stride %llu bytes is smaller than a row (%llu bytes)", kname,
                what, (unsigned long long)stride, (unsigned long long)row_bytes);
        return NULL;
    }
    const rj_bo *bo = c->bos[op->bo];
    uint64_t need = rows ? op->offset + (uint64_t)(rows - 1) * stride + row_bytes : op->offset;
    if (need > bo->size || op->offset > bo->size) {
        rj_fail(c->err, RJ_EFAULT,
                "host step %s: %s (%u rows x %llu %s, stride %llu, at offset %llu) needs %llu bytes "
                "but BO %u holds %llu",
                kname, what, rows, (unsigned long long)row_elems, dt_name(op->dtype),
                (unsigned long long)stride, (unsigned long long)op->offset,
                (unsigned long long)need, op->bo, (unsigned long long)bo->size);
        return NULL;
    }
    *stride_out = stride;
    return bo->host + op->offset;
}

static int want_float(step_ctx *c, const rj_operand *op, const char *what)
{
    if (op->dtype == RJ_DT_F32 || op->dtype == RJ_DT_F16)
        return RJ_OK;
    return rj_fail(c->err, RJ_EINVAL, "host step %s: %s must be f32 or f16, not %s",
                   rj_host_step_name(c->s->kind), what, dt_name(op->dtype));
}

static inline float ld(const uint8_t *p, uint32_t dt, uint64_t i)
{
    if (dt == RJ_DT_F16) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return rj_h2f(h);
    }
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
}

static inline void st(uint8_t *p, uint32_t dt, uint64_t i, float v)
{
    if (dt == RJ_DT_F16) {
        uint16_t h = rj_f2h(v);
        memcpy(p + 2 * i, &h, 2);
    } else {
        memcpy(p + 4 * i, &v, 4);
    }
}

/* ---- ROW_MAX ------------------------------------------------------------------------------ */

static int row_max_run(step_ctx *c, uint64_t *bytes)
{
    const rj_host_step *s = c->s;
    uint64_t ss, ds;
    int rc;
    if ((rc = want_float(c, &s->src, "src")) || (rc = want_float(c, &s->dst, "dst")))
        return rc;
    if (s->cols == 0)
        return rj_fail(c->err, RJ_EINVAL, "host step row_max: cols is 0; a row max needs >= 1 column");
    uint8_t *src = operand(c, &s->src, "src", s->rows, s->cols, &ss);
    uint8_t *dst = operand(c, &s->dst, "dst", s->rows, 1, &ds);
    if (!src || !dst)
        return c->err ? c->err->code : RJ_EINVAL;
    if (c->check_only)
        return RJ_OK;
    for (uint32_t r = 0; r < s->rows; r++) {
        const uint8_t *row = src + r * ss;
        float m = ld(row, s->src.dtype, 0);
        for (uint32_t k = 1; k < s->cols; k++) {
            float v = ld(row, s->src.dtype, k);
            m = v > m ? v : m;
        }
        st(dst + r * ds, s->dst.dtype, 0, m);
    }
    *bytes = (uint64_t)s->rows * s->cols * dt_size(s->src.dtype) +
             (uint64_t)s->rows * dt_size(s->dst.dtype);
    return RJ_OK;
}

/* ---- GATHER: embedding rows by index -------------------------------------------------------- */

/* src: table of param[0] rows x cols; aux: rows int32 indices; dst: rows x cols. */
static int gather_run(step_ctx *c, uint64_t *bytes)
{
    const rj_host_step *s = c->s;
    uint32_t table_rows = s->param[0];
    uint64_t ss, ds, is;
    if (s->src.dtype != s->dst.dtype)
        return rj_fail(c->err, RJ_EINVAL, "host step gather: src is %s but dst is %s; a gather copies "
                       "rows unchanged", dt_name(s->src.dtype), dt_name(s->dst.dtype));
    if (s->aux.dtype != RJ_DT_I32)
        return rj_fail(c->err, RJ_EINVAL, "host step gather: indices (aux) must be i32, not %s",
                       dt_name(s->aux.dtype));
    if (table_rows == 0 || s->cols == 0)
        return rj_fail(c->err, RJ_EINVAL, "host step gather: table has %u rows of %u elements; set "
                       "param[0] to the table's row count", table_rows, s->cols);
    uint8_t *src = operand(c, &s->src, "src (table)", table_rows, s->cols, &ss);
    uint8_t *dst = operand(c, &s->dst, "dst", s->rows, s->cols, &ds);
    uint8_t *idx = operand(c, &s->aux, "aux (indices)", s->rows, 1, &is);
    if (!src || !dst || !idx)
        return c->err ? c->err->code : RJ_EINVAL;
    if (c->check_only)
        return RJ_OK;
    uint64_t row_bytes = (uint64_t)s->cols * dt_size(s->src.dtype);
    for (uint32_t r = 0; r < s->rows; r++) {
        int32_t i;
        memcpy(&i, idx + r * is, 4);
        if (i < 0 || (uint32_t)i >= table_rows)
            return rj_fail(c->err, RJ_EINVAL, "host step gather: index %d at position %u is outside "
                           "the table's %u rows", i, r, table_rows);
        memmove(dst + r * ds, src + (uint64_t)i * ss, row_bytes);
    }
    *bytes = (uint64_t)s->rows * (2 * row_bytes + 4);
    return RJ_OK;
}

/* ---- cube-layout pack / unpack (csrc/layout) -------------------------------------------------- */

#ifdef RJ_HAVE_LAYOUT
/* One row per layout kind: how to read it from the step's params and the layout library's
 * calls for it. */
typedef struct layout_impl {
    const char *name;
    uint64_t (*dense_bytes)(const rj_host_step *s); /* row-major side */
    int (*bytes)(const rj_host_step *s, uint64_t *out, rj_err *err);
    int (*convert)(const rj_host_step *s, int pack, const void *src, uint64_t src_size, void *dst,
                   uint64_t dst_size, rj_err *err);
} layout_impl;

static rj_cube_layout cube_of(const rj_host_step *s)
{
    return (rj_cube_layout){.height = s->param[1], .width = s->param[2], .channels = s->param[3],
                            .c2 = s->param[4], .esize = s->param[5], .reserved = 0,
                            .line_stride = s->param64[0], .surf_stride = s->param64[1]};
}
static uint64_t cube_dense(const rj_host_step *s)
{
    return (uint64_t)s->param[1] * s->param[2] * s->param[3] * s->param[5];
}
static int cube_bytes(const rj_host_step *s, uint64_t *out, rj_err *err)
{
    rj_cube_layout l = cube_of(s);
    return rj_cube_bytes(&l, out, err);
}
static int cube_convert(const rj_host_step *s, int pack, const void *src, uint64_t ss, void *dst,
                        uint64_t ds, rj_err *err)
{
    rj_cube_layout l = cube_of(s);
    return pack ? rj_cube_pack(&l, src, ss, dst, ds, err) : rj_cube_unpack(&l, src, ss, dst, ds, err);
}

static rj_weight_layout weight_of(const rj_host_step *s)
{
    return (rj_weight_layout){.kernels = s->param[1], .channels = s->param[2], .kh = s->param[3],
                              .kw = s->param[4], .n_group = s->param[5], .k_group = s->param[6],
                              .esize = s->param[7], .reserved = 0};
}
static uint64_t weight_dense(const rj_host_step *s)
{
    return (uint64_t)s->param[1] * s->param[2] * s->param[3] * s->param[4] * s->param[7];
}
static int weight_bytes(const rj_host_step *s, uint64_t *out, rj_err *err)
{
    rj_weight_layout l = weight_of(s);
    return rj_weight_bytes(&l, out, err);
}
static int weight_convert(const rj_host_step *s, int pack, const void *src, uint64_t ss, void *dst,
                          uint64_t ds, rj_err *err)
{
    rj_weight_layout l = weight_of(s);
    return pack ? rj_weight_pack(&l, src, ss, dst, ds, err) : rj_weight_unpack(&l, src, ss, dst, ds, err);
}

static rj_dw_weight_layout dw_of(const rj_host_step *s)
{
    return (rj_dw_weight_layout){.channels = s->param[1], .kh = s->param[2], .kw = s->param[3],
                                 .group = s->param[4], .esize = s->param[5], .reserved = 0};
}
static uint64_t dw_dense(const rj_host_step *s)
{
    return (uint64_t)s->param[1] * s->param[2] * s->param[3] * s->param[5];
}
static int dw_bytes(const rj_host_step *s, uint64_t *out, rj_err *err)
{
    rj_dw_weight_layout l = dw_of(s);
    return rj_dw_weight_bytes(&l, out, err);
}
static int dw_convert(const rj_host_step *s, int pack, const void *src, uint64_t ss, void *dst,
                      uint64_t ds, rj_err *err)
{
    rj_dw_weight_layout l = dw_of(s);
    return pack ? rj_dw_weight_pack(&l, src, ss, dst, ds, err) : rj_dw_weight_unpack(&l, src, ss, dst, ds, err);
}

static const layout_impl layouts[] = {
    [RJ_LAYOUT_CUBE] = {"cube", cube_dense, cube_bytes, cube_convert},
    [RJ_LAYOUT_WEIGHT] = {"weight", weight_dense, weight_bytes, weight_convert},
    [RJ_LAYOUT_DW_WEIGHT] = {"depthwise weight", dw_dense, dw_bytes, dw_convert},
};

static uint8_t *byte_range(step_ctx *c, const rj_operand *op, const char *what, uint64_t size)
{
    const char *kname = rj_host_step_name(c->s->kind);
    if (op->bo >= c->nbos || !c->bos[op->bo]) {
        rj_fail(c->err, RJ_EINVAL, "host step %s: %s names BO %u, but the program has %u BOs",
                kname, what, op->bo, c->nbos);
        return NULL;
    }
    const rj_bo *bo = c->bos[op->bo];
    if (size > bo->size || op->offset > bo->size - size) {
        rj_fail(c->err, RJ_EFAULT, "host step %s: %s needs bytes [%llu, %llu) but BO %u holds %llu",
                kname, what, (unsigned long long)op->offset,
                (unsigned long long)(op->offset + size), op->bo, (unsigned long long)bo->size);
        return NULL;
    }
    return bo->host + op->offset;
}

static int layout_run(step_ctx *c, uint64_t *bytes, int pack)
{
    const rj_host_step *s = c->s;
    uint32_t kind = s->param[0];
    const char *kname = rj_host_step_name(s->kind);
    if (kind >= sizeof(layouts) / sizeof(layouts[0]) || !layouts[kind].name)
        return rj_fail(c->err, RJ_EINVAL, "host step %s: param[0] = %u is not a layout kind "
                       "(RJ_LAYOUT_CUBE 1, RJ_LAYOUT_WEIGHT 2, RJ_LAYOUT_DW_WEIGHT 3)", kname, kind);
    const layout_impl *L = &layouts[kind];
    uint64_t cube = 0, dense = L->dense_bytes(s);
    int rc = L->bytes(s, &cube, c->err);
    if (rc)
        return rc;
    uint64_t src_size = pack ? dense : cube, dst_size = pack ? cube : dense;
    uint8_t *src = byte_range(c, &s->src, pack ? "src (row-major)" : "src (cube)", src_size);
    uint8_t *dst = src ? byte_range(c, &s->dst, pack ? "dst (cube)" : "dst (row-major)", dst_size) : NULL;
    if (!src || !dst)
        return c->err->code;
    if (c->check_only)
        return RJ_OK;
    if ((rc = L->convert(s, pack, src, src_size, dst, dst_size, c->err)))
        return rc;
    *bytes = src_size + dst_size;
    return RJ_OK;
}

static int pack_run(step_ctx *c, uint64_t *bytes) { return layout_run(c, bytes, 1); }
static int unpack_run(step_ctx *c, uint64_t *bytes) { return layout_run(c, bytes, 0); }
#else
static int layout_missing(step_ctx *c, uint64_t *bytes)
{
    return rj_fail(c->err, RJ_EUNSUPP,
                   "host step %s: the cube-layout library (csrc/layout/rj_layout.h) is not part of "
                   "this build", rj_host_step_name(c->s->kind));
}
#define pack_run layout_missing
#define unpack_run layout_missing
#endif

/* ---- host ops (rj_host_ops.h): operands and descriptor resolved from the step's BOs ------- */

static int host_op_run(step_ctx *c, uint64_t *bytes)
{
    return rj_host_op_step_exec(c->s, c->bos, c->nbos, c->check_only, bytes, c->err);
}

/* ---- the table ---------------------------------------------------------------------------- */

typedef struct host_step_impl {
    const char *name;
    int (*run)(step_ctx *c, uint64_t *bytes);
} host_step_impl;

/* The runtime's kinds (1..RJ_HOST_KIND_COUNT-1) and the host-op kinds after them. */
#define HOST_TABLE_SIZE RJ_HOST_OPS_END

static const host_step_impl table[HOST_TABLE_SIZE] = {
    [RJ_HOST_ROW_MAX] = {"row_max", row_max_run},
    [RJ_HOST_GATHER] = {"gather", gather_run},
    [RJ_HOST_PACK] = {"pack", pack_run},
    [RJ_HOST_UNPACK] = {"unpack", unpack_run},
    [RJ_HOST_COPY] = {"copy", host_op_run},
    [RJ_HOST_UNARY] = {"unary", host_op_run},
    [RJ_HOST_BINARY] = {"binary", host_op_run},
    [RJ_HOST_COMPARE] = {"compare", host_op_run},
    [RJ_HOST_SELECT] = {"select", host_op_run},
    [RJ_HOST_REDUCE] = {"reduce", host_op_run},
    [RJ_HOST_TAKE] = {"take", host_op_run},
    [RJ_HOST_IOTA] = {"iota", host_op_run},
};

const char *rj_host_step_name(uint32_t kind)
{
    if (kind < HOST_TABLE_SIZE && table[kind].name)
        return table[kind].name;
    return "unknown";
}

static int exec_step(const rj_host_step *step, rj_bo *const *bos, uint32_t nbos, int check_only,
                     uint64_t *bytes, rj_err *err)
{
    if (!step)
        return rj_fail(err, RJ_EINVAL, "host step: NULL step");
    if (step->kind >= HOST_TABLE_SIZE || !table[step->kind].run)
        return rj_fail(err, RJ_EINVAL, "host step: unknown kind %u (known: 1..%u and %u..%u)",
                       step->kind, RJ_HOST_KIND_COUNT - 1, RJ_HOST_OPS_FIRST, RJ_HOST_OPS_END - 1);
    if (step->reserved)
        return rj_fail(err, RJ_EINVAL, "host step %s: reserved field is %u, must be zero",
                       table[step->kind].name, step->reserved);
    rj_err local;
    uint64_t moved = 0;
    step_ctx c = {step, bos, nbos, check_only, err ? err : &local};
    int rc = table[step->kind].run(&c, &moved);
    if (bytes)
        *bytes = rc ? 0 : moved;
    return rc;
}

int rj_host_step_check(const rj_host_step *step, rj_bo *const *bos, uint32_t nbos, rj_err *err)
{
    return exec_step(step, bos, nbos, 1, NULL, err);
}

int rj_host_step_run(const rj_host_step *step, rj_bo *const *bos, uint32_t nbos,
                     uint64_t *bytes, rj_err *err)
{
    return exec_step(step, bos, nbos, 0, bytes, err);
}
