/* The host-step library: cube-layout pack/unpack and the strided N-d
 * host ops of rj_host_ops.h (kinds RJ_HOST_COPY..RJ_HOST_IOTA, one row each below).
 *
 * One table entry per kind: a checker (bounds, dtypes, params; runs when the step is added
 * and again before it runs) and a runner that returns the bytes it moved. Adding a kind is
 * one enum value and one row. */
#include <stdio.h>
#include <string.h>

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

/* The runtime's kinds (RJ_HOST_PACK..RJ_HOST_KIND_COUNT-1) and the host-op kinds after them. */
#define HOST_TABLE_SIZE RJ_HOST_OPS_END

static const host_step_impl table[HOST_TABLE_SIZE] = {
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
        return rj_fail(err, RJ_EINVAL, "host step: unknown kind %u (known: %u..%u and %u..%u)",
                       step->kind, RJ_HOST_PACK, RJ_HOST_KIND_COUNT - 1, RJ_HOST_OPS_FIRST, RJ_HOST_OPS_END - 1);
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
