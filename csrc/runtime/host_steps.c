/* The host-step library: cube-layout pack/unpack and the strided N-d
 * host ops of rj_host_ops.h (kinds RJ_HOST_COPY..RJ_HOST_IOTA, one row each below).
 *
 * One table entry per kind: a checker (bounds, dtypes, params; runs when the step is added
 * and again before it runs) and a runner that returns the bytes it moved. Adding a kind is
 * one enum value and one row. */
#include <stdio.h>
#include <string.h>

#include "runtime/rj_host_ops.h"
#include "runtime/rj_host_pool.h"
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
    uint32_t threads; /* available to a step large enough to split (rj_host_pool.h) */
    uint32_t used;    /* threads it ran on */
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
                   uint64_t dst_size, uint32_t part, uint32_t nparts, rj_err *err);
    uint64_t (*blocks)(const rj_host_step *s); /* the outer blocks a split cuts */
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
                        uint64_t ds, uint32_t part, uint32_t nparts, rj_err *err)
{
    rj_cube_layout l = cube_of(s);
    return rj_cube_convert_part(&l, pack, src, ss, dst, ds, part, nparts, err);
}
static uint64_t cube_blocks(const rj_host_step *s)
{
    rj_cube_layout l = cube_of(s);
    return rj_cube_blocks(&l);
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
                          uint64_t ds, uint32_t part, uint32_t nparts, rj_err *err)
{
    rj_weight_layout l = weight_of(s);
    return rj_weight_convert_part(&l, pack, src, ss, dst, ds, part, nparts, err);
}
static uint64_t weight_blocks(const rj_host_step *s)
{
    rj_weight_layout l = weight_of(s);
    return rj_weight_blocks(&l);
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
                      uint64_t ds, uint32_t part, uint32_t nparts, rj_err *err)
{
    rj_dw_weight_layout l = dw_of(s);
    return rj_dw_weight_convert_part(&l, pack, src, ss, dst, ds, part, nparts, err);
}
static uint64_t dw_blocks(const rj_host_step *s)
{
    rj_dw_weight_layout l = dw_of(s);
    return rj_dw_weight_blocks(&l);
}

static const layout_impl layouts[] = {
    [RJ_LAYOUT_CUBE] = {"cube", cube_dense, cube_bytes, cube_convert, cube_blocks},
    [RJ_LAYOUT_WEIGHT] = {"weight", weight_dense, weight_bytes, weight_convert, weight_blocks},
    [RJ_LAYOUT_DW_WEIGHT] = {"depthwise weight", dw_dense, dw_bytes, dw_convert, dw_blocks},
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

/* A layout copy split into parts of its outer blocks (rj_layout.h: the same bits). */
typedef struct layout_job {
    const layout_impl *L;
    const rj_host_step *s;
    int pack;
    const void *src;
    uint64_t src_size;
    void *dst;
    uint64_t dst_size;
    uint32_t nitems;
} layout_job;

static int layout_item(void *ctx, uint32_t item, rj_err *err)
{
    const layout_job *j = ctx;
    return j->L->convert(j->s, j->pack, j->src, j->src_size, j->dst, j->dst_size, item, j->nitems,
                         err);
}

/* The bytes a layout step moves and its outer blocks, from its params alone (0: invalid). */
static uint32_t layout_plan(const rj_host_step *s, uint32_t threads)
{
    uint32_t kind = s->param[0];
    if (kind >= sizeof(layouts) / sizeof(layouts[0]) || !layouts[kind].name)
        return 0;
    const layout_impl *L = &layouts[kind];
    uint64_t cube = 0;
    rj_err e;
    if (L->bytes(s, &cube, &e))
        return 0;
    return rj_host_split_threads(L->dense_bytes(s) + cube, L->blocks(s), threads);
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
    uint64_t blocks = L->blocks(s);
    uint32_t n = rj_host_split_threads(src_size + dst_size, blocks, c->threads);
    if (n > 1) {
        layout_job j = {L, s, pack, src, src_size, dst, dst_size, rj_host_split_items(blocks, n)};
        rc = rj_host_parallel(j.nitems, n, layout_item, &j, &c->used, c->err);
    } else {
        rc = L->convert(s, pack, src, src_size, dst, dst_size, 0, 1, c->err);
    }
    if (rc)
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
    if (c->check_only)
        return rj_host_op_step_exec(c->s, c->bos, c->nbos, 1, bytes, c->err);
    return rj_host_op_step_run_threads(c->s, c->bos, c->nbos, c->threads, bytes, &c->used, c->err);
}

/* ---- the table ---------------------------------------------------------------------------- */

typedef struct host_step_impl {
    const char *name;
    int (*run)(step_ctx *c, uint64_t *bytes);
} host_step_impl;

/* The runtime's kinds (RJ_HOST_PACK..RJ_HOST_KIND_COUNT-1) and the host-op kinds after them. */
#define HOST_TABLE_SIZE (RJ_HOST_FUSED + 1)

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
    [RJ_HOST_FUSED] = {"fused", host_op_run},
};

const char *rj_host_step_name(uint32_t kind)
{
    if (kind < HOST_TABLE_SIZE && table[kind].name)
        return table[kind].name;
    return "unknown";
}

static int exec_step(const rj_host_step *step, rj_bo *const *bos, uint32_t nbos, int check_only,
                     uint32_t threads, uint64_t *bytes, uint32_t *used, rj_err *err)
{
    if (used)
        *used = 1;
    if (!step)
        return rj_fail(err, RJ_EINVAL, "host step: NULL step");
    if (step->kind >= HOST_TABLE_SIZE || !table[step->kind].run)
        return rj_fail(err, RJ_EINVAL, "host step: unknown kind %u (known: %u..%u and %u..%u)",
                       step->kind, RJ_HOST_PACK, RJ_HOST_KIND_COUNT - 1, RJ_HOST_OPS_FIRST, RJ_HOST_FUSED);
    if (step->reserved)
        return rj_fail(err, RJ_EINVAL, "host step %s: reserved field is %u, must be zero",
                       table[step->kind].name, step->reserved);
    rj_err local;
    uint64_t moved = 0;
    step_ctx c = {step, bos, nbos, check_only, threads, 1, err ? err : &local};
    int rc = table[step->kind].run(&c, &moved);
    if (bytes)
        *bytes = rc ? 0 : moved;
    if (used)
        *used = c.used;
    return rc;
}

int rj_host_step_check(const rj_host_step *step, rj_bo *const *bos, uint32_t nbos, rj_err *err)
{
    return exec_step(step, bos, nbos, 1, 1, NULL, NULL, err);
}

int rj_host_step_run(const rj_host_step *step, rj_bo *const *bos, uint32_t nbos,
                     uint64_t *bytes, rj_err *err)
{
    uint32_t threads = 1;
    int rc = rj_host_threads_get(&threads, err);
    if (rc)
        return rc;
    return exec_step(step, bos, nbos, 0, threads, bytes, NULL, err);
}

int rj_host_step_run_threads(const rj_host_step *step, rj_bo *const *bos, uint32_t nbos,
                             uint32_t threads, uint64_t *bytes, uint32_t *used, rj_err *err)
{
    return exec_step(step, bos, nbos, 0, threads, bytes, used, err);
}

uint32_t rj_host_step_plan_threads(const rj_host_step *step, const rj_host_op *desc,
                                   uint32_t threads)
{
    if (!step)
        return 0;
    if (step->kind == RJ_HOST_PACK || step->kind == RJ_HOST_UNPACK) {
#ifdef RJ_HAVE_LAYOUT
        return layout_plan(step, threads);
#else
        return 0;
#endif
    }
    if (step->kind == RJ_HOST_FUSED)
        return 1; /* small ops, one thread (rj_host_ops.h) */
    if (step->kind >= RJ_HOST_OPS_FIRST && step->kind < RJ_HOST_OPS_END && desc &&
        desc->kind == step->kind)
        return rj_host_op_plan_threads(desc, threads);
    return 0;
}
