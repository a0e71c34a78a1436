#ifndef RJ_HOST_OPS_H
#define RJ_HOST_OPS_H
/* The host-op library: strided N-d element-wise math, copies/converts, selects, reductions,
 * gathers and iota on row-major (or any strided) host memory, for the IR ops the NPU has no
 * form for (design.md, "Host steps").
 *
 * An op is described by an address-free descriptor, `rj_host_op`: an iteration shape and, per
 * operand, a dtype and a strided view (element offset + one stride per iteration dimension;
 * stride 0 broadcasts). Operand memory is supplied separately as (pointer, size) pairs, so
 * the descriptor is fixed at compile time and can be stored as constant bytes (in a program
 * BO, in a bundle) while buffers move. Every view is bounds-checked against its buffer
 * before any byte is touched; nothing aborts.
 *
 * Operand order: bufs[0] / view[0] is the output, bufs[1..ninputs] / view[1..] the inputs.
 * The output may alias an input only with the identical view (in-place element-wise);
 * partial overlaps give unspecified results (the memory planner must not produce them).
 *
 * Value semantics follow rockjit/ir/reference.py (XLA on CPU): f16/bf16 math runs in f32
 * and rounds once; integer math runs in 64 bits and wraps to the operand width; integer
 * division truncates, x/0 = -1 (all ones), INT_MIN/-1 = INT_MIN; float max/min propagate
 * NaN; float->int stores truncate and saturate with NaN -> 0; anything -> bool is `!= 0`;
 * float->f16/bf16 rounds to nearest even. */
#include <stdint.h>

#include "rj_err.h"

#define RJ_HOST_MAX_RANK 8
#define RJ_HOST_MAX_OPERANDS 4 /* the output and up to three inputs */
#define RJ_HOST_OP_MAGIC 0x706f6872u /* "rhop" little-endian: marks a written descriptor */
#define RJ_HOST_OP_VERSION 1u

/* Element types: the one dtype table of the C side (host ops, and host steps with F32..U8). */
enum {
    RJ_DT_F32 = 1,
    RJ_DT_F16 = 2,
    RJ_DT_I32 = 3,
    RJ_DT_I8 = 4,
    RJ_DT_U8 = 5,
    RJ_DT_BF16 = 6,
    RJ_DT_I64 = 7,
    RJ_DT_I16 = 8,
    RJ_DT_U32 = 9,
    RJ_DT_BOOL = 10, /* one byte, 0 or 1 */
    RJ_DT_COUNT = 11,
};

/* Op kinds. They are also the runtime's host-step kinds (host_steps.c has one table entry
 * each), numbered after the runtime's own kinds. */
enum {
    RJ_HOST_COPY = 16,    /* out = in (converting when the dtypes differ): transpose,
                             broadcast, slice, reshape, concat piece, pad fill, convert */
    RJ_HOST_UNARY = 17,   /* out = f(in); code RJ_UN_*; IPOW: iparam[0] = exponent;
                             RECIP_LO: (t - f16(t)) * 2^iparam[0] with t = 1/in (f32), the low
                             part of t split into two f16 */
    RJ_HOST_BINARY = 18,  /* out = f(a, b); code RJ_BIN_*; a and b share one dtype */
    RJ_HOST_COMPARE = 19, /* out = (a op b) as 0/1; code RJ_CMP_* */
    RJ_HOST_SELECT = 20,  /* inputs: which, case c0 [, c1]. iparam[0] = first case number f,
                             iparam[1] = total case count n: where f <= which < f + ncases,
                             out = c[which - f]; elsewhere out is left as it is. Any which
                             outside [0, n) is an error. n cases take ceil(n / 2) ops. */
    RJ_HOST_REDUCE = 21,  /* out = reduce over the axes in axis_mask (code RJ_RED_*); the
                             iteration shape is the input's; out strides are 0 on reduced axes */
    RJ_HOST_TAKE = 22,    /* inputs: x, idx. out[p] = x[xoff(p) + k * iparam[0]] with
                             k = idx[p] (+ iparam[1] when negative), iparam[1] = axis size;
                             an index outside [-size, size) is an error naming it */
    RJ_HOST_IOTA = 23,    /* out[p] = p[iparam[0]] (the coordinate along one dimension) */
    RJ_HOST_FUSED = 24,   /* a runtime host step only, never an op's kind: a list of
                             element-wise ops (COPY, UNARY, BINARY, COMPARE) run in order as
                             one step (rj_host_fused below) */
    RJ_HOST_OPS_FIRST = 16,
    RJ_HOST_OPS_END = 24,
};

enum {
    RJ_UN_NEG = 1, RJ_UN_ABS = 2, RJ_UN_EXP = 3, RJ_UN_LOG = 4, RJ_UN_TANH = 5,
    RJ_UN_LOGISTIC = 6, RJ_UN_ERF = 7, RJ_UN_SQRT = 8, RJ_UN_RSQRT = 9, RJ_UN_SIN = 10,
    RJ_UN_COS = 11, RJ_UN_IPOW = 12, RJ_UN_RECIP_LO = 13, RJ_UN_COUNT = 14,
};
enum {
    RJ_BIN_ADD = 1, RJ_BIN_SUB = 2, RJ_BIN_MUL = 3, RJ_BIN_DIV = 4, RJ_BIN_MAX = 5,
    RJ_BIN_MIN = 6, RJ_BIN_POW = 7, RJ_BIN_COUNT = 8,
};
enum {
    RJ_CMP_EQ = 1, RJ_CMP_NE = 2, RJ_CMP_LT = 3, RJ_CMP_LE = 4, RJ_CMP_GT = 5, RJ_CMP_GE = 6,
    RJ_CMP_COUNT = 7,
};
enum { RJ_RED_SUM = 1, RJ_RED_MAX = 2, RJ_RED_COUNT = 3 };

/* One operand's strided view over the op's iteration shape. Strides count elements and may
 * be 0 (broadcast) or negative; unused stride entries (>= rank) must be 0. */
typedef struct rj_host_view {
    uint32_t dtype;    /* RJ_DT_* */
    uint32_t reserved; /* must be zero */
    int64_t offset;    /* elements from the operand's base pointer to the view's origin */
    int64_t stride[RJ_HOST_MAX_RANK];
} rj_host_view;

/* The descriptor, shared with Python and stored as constant bytes in programs and bundles
 * (fixed-width, naturally aligned, little-endian: 448 bytes). */
typedef struct rj_host_op {
    uint32_t magic;     /* RJ_HOST_OP_MAGIC */
    uint32_t version;   /* RJ_HOST_OP_VERSION */
    uint32_t kind;      /* RJ_HOST_COPY .. RJ_HOST_IOTA */
    uint32_t code;      /* RJ_UN_* / RJ_BIN_* / RJ_CMP_* / RJ_RED_*; 0 for other kinds */
    uint32_t rank;      /* iteration rank, 0..RJ_HOST_MAX_RANK */
    uint32_t ninputs;   /* inputs after the output */
    uint32_t axis_mask; /* REDUCE: bit i set = iteration axis i is reduced; else 0 */
    uint32_t reserved;  /* must be zero */
    int64_t shape[RJ_HOST_MAX_RANK]; /* iteration shape; entries >= rank must be 0 */
    rj_host_view view[RJ_HOST_MAX_OPERANDS]; /* [0] output, [1..ninputs] inputs, rest zero */
    int64_t iparam[4];  /* kind-specific (see the kinds); unused entries must be 0 */
} rj_host_op;

/* Where one operand's bytes are: its base pointer and how many bytes are valid from it. */
typedef struct rj_host_buf {
    void *data;
    uint64_t size;
} rj_host_buf;

/* Validate the descriptor against the buffers (nbufs must be 1 + ninputs) without touching
 * data. */
int rj_host_op_check(const rj_host_op *op, const rj_host_buf *bufs, uint32_t nbufs, rj_err *err);
/* Check, then run. *bytes (may be NULL) gets the bytes read + written (each operand's
 * footprint, broadcast inputs counted once per distinct element). */
int rj_host_op_run(const rj_host_op *op, const rj_host_buf *bufs, uint32_t nbufs,
                   uint64_t *bytes, rj_err *err);

const char *rj_host_op_kind_name(uint32_t kind);
const char *rj_host_dtype_name(uint32_t dtype);
uint32_t rj_host_dtype_size(uint32_t dtype); /* 0 for an unknown code */

/* ---- fused steps ---------------------------------------------------------------------------
 * A host step of kind RJ_HOST_FUSED runs `nops` element-wise ops (kinds COPY, UNARY, BINARY,
 * COMPARE) one after the other, exactly as the same ops as separate steps in that order would
 * (same kernels, same operation order per element, so the same bits): one step's dispatch
 * instead of one per op, for the chains of small per-row vectors between NPU steps (a norm's
 * statistics) ending in the converting copy that writes the NPU's form. Its buffers are up to
 * RJ_HOST_FUSED_SLOTS slots:
 *   slot 0 = dst, slot 1 = src, slot 2 = param[0]/param64[0], slot 3 = param[1]/param64[1]
 *   (BO and byte offset; an unused slot is RJ_NO_BO with offset 0)
 *   aux = the descriptor: an rj_host_fused header, then `nops` rj_host_fused_op records.
 * Record k's view v reads (v > 0) or writes (v = 0) slot `slot[v]`, its element offset counted
 * from the slot's base; every op writes slot 0 (the one BO the step marks written), unused
 * slot entries (v > ninputs) are 0, and each op passes rj_host_op_check against its slots.
 * Ops run on one thread (they are small; a large op stays a step of its own). */
#define RJ_HOST_FUSED_MAGIC 0x73666872u /* "rhfs" little-endian */
#define RJ_HOST_FUSED_VERSION 1u
#define RJ_HOST_FUSED_MAX_OPS 64
#define RJ_HOST_FUSED_SLOTS 4

typedef struct rj_host_fused {
    uint32_t magic;    /* RJ_HOST_FUSED_MAGIC */
    uint32_t version;  /* RJ_HOST_FUSED_VERSION */
    uint32_t nops;     /* 1..RJ_HOST_FUSED_MAX_OPS records follow */
    uint32_t reserved; /* must be zero */
} rj_host_fused;

typedef struct rj_host_fused_op {
    uint32_t slot[RJ_HOST_MAX_OPERANDS]; /* the slot of view v (0..RJ_HOST_FUSED_SLOTS-1) */
    rj_host_op op;
} rj_host_fused_op;

/* ---- as runtime host steps ----------------------------------------------------------------
 * A host step of kind RJ_HOST_COPY..RJ_HOST_IOTA names its operands by (program BO, byte
 * offset) and its descriptor through `aux`:
 *   dst        = output base          src = input 1 base (absent for IOTA)
 *   aux        = the rj_host_op descriptor (must be written before the step is added)
 *   param[0], param64[0] = BO and byte offset of input 2 (RJ_NO_BO when absent)
 *   param[1], param64[1] = BO and byte offset of input 3
 * The operands' dtype and row_stride fields are not used (the descriptor has the dtypes and
 * strides) and row_stride must be 0; rows, cols, eps and param[2..7] must be 0. */
struct rj_host_step;
struct rj_bo;
int rj_host_op_step_exec(const struct rj_host_step *step, struct rj_bo *const *bos, uint32_t nbos,
                         int check_only, uint64_t *bytes, rj_err *err);

/* A host-op step resolved once (descriptor copied out of its BO, operands' pointers, checks,
 * the walk plan), for a program that runs its step list many times: the run then only walks.
 * The descriptor bytes are those of the prepare; a program re-prepares after any write to a
 * BO holding a descriptor, and a BO's memory never moves while the program lives. */
typedef struct rj_host_prepared rj_host_prepared;
int rj_host_op_step_prepare(const struct rj_host_step *step, struct rj_bo *const *bos,
                            uint32_t nbos, rj_host_prepared **out, rj_err *err);
int rj_host_prepared_run(const rj_host_prepared *p, uint32_t threads, uint64_t *bytes,
                         uint32_t *used, rj_err *err);
void rj_host_prepared_free(rj_host_prepared *p);

#endif /* RJ_HOST_OPS_H */
