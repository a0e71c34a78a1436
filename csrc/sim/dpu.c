/* DPU + DPU_RDMA: the SDP post-processing pipeline between the CORE accumulator (or a cube
 * read from memory in flying mode) and the output writer.
 *
 *   source -> BS (ALU, MUL, ReLU) -> BN (MUL, ALU, ReLU) -> EW (operand op, ReLU, LUT)
 *          -> OUT_CVT -> write DMA (dpu_write.c)
 *
 * Each behaviour cites a notes page (gregordinary/rockchip-npu-notes, /work/notes) or a
 * register field of rk3588-registers.xml. Settings the notes do not document are refused with
 * RJ_EUNSUPP naming the register and value; documented hardware misbehaviour is refused with
 * RJ_EHAZARD in strict mode. Behaviours modelled by inference say so in their comment. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define RJ_DPU_F16C 1
#endif

#include "dpu_internal.h"
#include "lut.h"

/* ---- small helpers ----------------------------------------------------------------------- */

#define UNSUPP(t, ...) rj_sim_fail((t), RJ_EUNSUPP, __VA_ARGS__)

static int strict(const rj_sim_task *t) { return (t->sim->flags & RJ_SIM_STRICT) != 0; }

static float f32_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* x / 2^s rounded to nearest; ties to even, or away from zero when `away` (the OUT_CVT tie rule,
 * notes: encodings/out-cvt-converter.md "The CVT_ROUND tie rule", HW sweep on RK3588). */
static int64_t round_shift(int64_t x, uint32_t s, int away)
{
    if (s == 0)
        return x;
    const int neg = x < 0;
    const uint64_t m = neg ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
    uint64_t q = m >> s;
    const uint64_t rem = m & ((1ull << s) - 1u), half = 1ull << (s - 1u);
    if (rem > half || (rem == half && (away || (q & 1u))))
        q++;
    return neg ? -(int64_t)q : (int64_t)q;
}

static int64_t sat(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

/* ---- BS / BN stage configuration -------------------------------------------------------- */

typedef struct sdp_stage {
    const char *name;        /* "BS" or "BN" */
    int active, alu, mul, relu;
    int mul_src;             /* MUL_SRC = 1: the multiplier comes from the BRDMA group */
    int alu_src;             /* ALU_SRC = 1: the ALU operand comes from BRDMA */
    uint32_t alu_algo;       /* 0 max, 1 min, 2 sum */
    float alu_f, mul_f;      /* float path register operands */
    int64_t alu_i, mul_i;    /* integer path register operands */
    uint32_t mul_shift;      /* integer path: shift of a non-negative product */
    uint32_t mul_shift_neg;  /* integer path: shift of a negative product (DATA_FORMAT *_NEG) */
    int32_t *alu_vec;        /* integer path per-channel ALU operand read by BRDMA (owned) */
    int16_t *mul_vec;        /* integer BS: per-channel multiplier C (BRDMA DATA_USE 7; owned) */
    int16_t *ow_vec;         /* integer BS: per-channel CPEND operand B (BRDMA DATA_USE 7; owned) */
} sdp_stage;

/* Register views of one stage; BS and BN share the field layout (rk3588-registers.xml). */
typedef struct stage_regs {
    uint32_t cfg, alu_cfg, mul_cfg, rdma_cfg, rdma_base;
    const char *cfg_name, *alu_name, *mul_name, *rdma_cfg_name, *rdma_base_name;
} stage_regs;

static const stage_regs BS_REGS = {
    RJ_REG_DPU_BS_CFG, RJ_REG_DPU_BS_ALU_CFG, RJ_REG_DPU_BS_MUL_CFG,
    RJ_REG_DPU_RDMA_RDMA_BRDMA_CFG, RJ_REG_DPU_RDMA_RDMA_BS_BASE_ADDR,
    "DPU_BS_CFG", "DPU_BS_ALU_CFG", "DPU_BS_MUL_CFG",
    "DPU_RDMA_RDMA_BRDMA_CFG", "DPU_RDMA_RDMA_BS_BASE_ADDR"};
static const stage_regs BN_REGS = {
    RJ_REG_DPU_BN_CFG, RJ_REG_DPU_BN_ALU_CFG, RJ_REG_DPU_BN_MUL_CFG,
    RJ_REG_DPU_RDMA_RDMA_NRDMA_CFG, RJ_REG_DPU_RDMA_RDMA_BN_BASE_ADDR,
    "DPU_BN_CFG", "DPU_BN_ALU_CFG", "DPU_BN_MUL_CFG",
    "DPU_RDMA_RDMA_NRDMA_CFG", "DPU_RDMA_RDMA_BN_BASE_ADDR"};

/* The integer BS stage's per-channel operands, read by BRDMA from BS_BASE_ADDR (notes:
 * encodings/sdp-stage-precision.md, out-cvt-converter.md "Per-channel (per-axis) requant on the
 * BS multiplier", HW sweeps on RK3588 int8-out depthwise and direct programs):
 *   DATA_USE 1: a dense int32 [C] vector, the ALU operand;
 *   DATA_USE 7: a 64-byte group per 8 output channels, int32 A[8] at 0 (ALU), int16 B[8] at 32
 *               (CPEND, read when DPU_BS_OW_CFG.OW_SRC = 1), int16 C[8] at 48 (MUL_SRC = 1).
 * The measured program reads A and C together (BS_CFG 0x20140, MUL_CFG (s << 8) | 1); other
 * DATA_USE values and other combinations are undocumented and refused. */
static int read_brdma(rj_sim_task *t, const stage_regs *r, uint32_t cfg, uint32_t channels, sdp_stage *st)
{
    uint32_t use, base;
    int rc;
    if (!(t->enable_mask & RJ_SIM_EN_DPU_RDMA))
        return UNSUPP(t, "%s = 0x%x reads a per-channel operand through DPU_RDMA, but the enable mask "
                      "0x%x lacks bit 4 (DPU_RDMA)", r->cfg_name, cfg, t->enable_mask);
    if ((rc = rj_sim_need(t, r->rdma_cfg, r->rdma_cfg_name, &use)) ||
        (rc = rj_sim_need(t, r->rdma_base, r->rdma_base_name, &base)))
        return rc;
    const uint32_t data_use = RJ_GET(use, DPU_RDMA_RDMA_BRDMA_CFG, BRDMA_DATA_USE);
    if (data_use == 1 && st->alu_src && !st->mul_src) {
        const uint8_t *src = rj_sim_mem(t, base, (uint64_t)channels * 4u, r->rdma_base_name);
        if (!src)
            return t->err ? t->err->code : RJ_EFAULT;
        st->alu_vec = malloc((size_t)channels * sizeof(int32_t));
        if (!st->alu_vec)
            return rj_sim_fail(t, RJ_ENOMEM, "DPU %s: out of memory", st->name);
        memcpy(st->alu_vec, src, (size_t)channels * 4u);
        t->sim->stats.bytes_read += (uint64_t)channels * 4u;
        return 0;
    }
    if (data_use != 7 || !st->alu_src || !st->mul_src)
        return UNSUPP(t, "%s = 0x%x with %s_ALU_SRC = %d, %s_MUL_SRC = %d: modelled are DATA_USE 1 with the "
                      "ALU operand alone (an int32 [C] vector) and DATA_USE 7 with both ALU_SRC and "
                      "MUL_SRC (the 64-byte per-8-channel group); other combinations are undocumented "
                      "(notes: encodings/out-cvt-converter.md)", r->rdma_cfg_name, use, st->name,
                      st->alu_src, st->name, st->mul_src);
    const uint32_t groups = (channels + 7u) / 8u;
    const uint8_t *src = rj_sim_mem(t, base, (uint64_t)groups * 64u, r->rdma_base_name);
    if (!src)
        return t->err ? t->err->code : RJ_EFAULT;
    st->alu_vec = malloc((size_t)channels * sizeof(int32_t));
    st->ow_vec = malloc((size_t)channels * sizeof(int16_t));
    st->mul_vec = malloc((size_t)channels * sizeof(int16_t));
    if (!st->alu_vec || !st->ow_vec || !st->mul_vec)
        return rj_sim_fail(t, RJ_ENOMEM, "DPU %s: out of memory", st->name);
    for (uint32_t c = 0; c < channels; c++) {
        const uint8_t *g = src + (c / 8u) * 64u;
        memcpy(&st->alu_vec[c], g + (c % 8u) * 4u, 4);
        memcpy(&st->ow_vec[c], g + 32u + (c % 8u) * 2u, 2);
        memcpy(&st->mul_vec[c], g + 48u + (c % 8u) * 2u, 2);
        /* Every measured multiplier is positive (the planner puts a task's largest at 32767); how a
         * negative C multiplies is undocumented. */
        if (st->mul_vec[c] < 0)
            return UNSUPP(t, "%s: the per-channel multiplier C of channel %u is %d; only C >= 0 is "
                          "documented (notes: encodings/out-cvt-converter.md)", r->rdma_base_name, c,
                          (int)st->mul_vec[c]);
    }
    t->sim->stats.bytes_read += (uint64_t)groups * 64u;
    return 0;
}

static int parse_stage(rj_sim_task *t, const stage_regs *r, const char *name, int int_path,
                       uint32_t channels, sdp_stage *st)
{
    memset(st, 0, sizeof *st);
    st->name = name;
    uint32_t cfg;
    int rc = rj_sim_need(t, r->cfg, r->cfg_name, &cfg);
    if (rc)
        return rc;
    /* BS_CFG and BN_CFG share bit positions: BYPASS 0, ALU_BYPASS 1, MUL_BYPASS 4, MUL_PRELU 5,
     * RELU_BYPASS 6, RELUX_EN 7, ALU_SRC 8, ALU_ALGO 16..19 (rk3588-registers.xml). */
    if (cfg & 1u)
        return 0;
    st->active = 1;
    st->alu = !(cfg & (1u << 1));
    st->mul = !(cfg & (1u << 4));
    st->relu = !(cfg & (1u << 6));
    if (cfg & (1u << 5))
        return UNSUPP(t, "%s = 0x%x: %s_MUL_PRELU is not modelled", r->cfg_name, cfg, name);
    if (cfg & (1u << 7))
        return UNSUPP(t, "%s = 0x%x: %s_RELUX_EN (clamped ReLU) is not modelled; the notes document "
                      "only the plain ReLU", r->cfg_name, cfg, name);
    if (st->mul) {
        uint32_t m;
        if ((rc = rj_sim_need(t, r->mul_cfg, r->mul_name, &m)))
            return rc;
        /* MUL_CFG: MUL_SRC bit 0, TRUNCATE_SRC bit 1, MUL_SHIFT_VALUE 8..13, MUL_OPERAND 16..31. */
        if (m & 1u) {
            if (!int_path)
                return UNSUPP(t, "%s = 0x%x: %s_MUL_SRC=1 (a per-channel multiplier read from memory) on the "
                              "float path is not modelled: the notes document the per-channel operand group "
                              "of the integer BS stage only (out-cvt-converter.md \"Per-channel (per-axis) "
                              "requant on the BS multiplier\"); its fp16/fp32 form, layout and rounding are "
                              "undocumented. For a per-channel scale on the float path use the EW stage's "
                              "per-pixel operand (EW_DATA_MODE = ERDMA_DATA_MODE = 1) with the scale "
                              "broadcast into a full cube (notes: k-accumulation.md, dpu-lut-activation.md "
                              "\"Two-operand EW\")", r->mul_name, m, name);
            if (r != &BS_REGS) {
                /* "BN_MUL_SRC, NRDMA_DATA_USE 7 over the same 64-byte layout ...: all 8 tasks over
                 * two shapes ran to the 500 ms watchdog and wrote nothing" (notes:
                 * out-cvt-converter.md "BN stage per-channel multiplier"). */
                if (strict(t))
                    return rj_sim_hazard(t, r->mul_name, "per-channel BN multiplier",
                                         "BN_MUL_SRC = 1: the one configuration measured hung every task "
                                         "(no output, watchdog); put a per-channel multiplier on the BS stage "
                                         "(BRDMA_DATA_USE 7) (notes: encodings/out-cvt-converter.md \"BN stage "
                                         "per-channel multiplier\")");
                return UNSUPP(t, "%s = 0x%x: BN_MUL_SRC = 1 is not established on hardware (notes: "
                              "out-cvt-converter.md \"BN stage per-channel multiplier\")", r->mul_name, m);
            }
            st->mul_src = 1;
        }
        if (m & 2u)
            return UNSUPP(t, "%s = 0x%x: %s_TRUNCATE_SRC is not modelled", r->mul_name, m, name);
        uint32_t operand = m >> 16, shift = (m >> 8) & 0x3fu;
        if (int_path) {
            /* Integer path: the MUL operand is an integer read as uint16 (notes:
             * encodings/out-cvt-converter.md, "0x3800 -> x14336"); the shift is applied after
             * the product (inference, the NVDLA multiplier form). */
            st->mul_i = operand;
            st->mul_shift = shift;
            /* The shift splits by the product's sign: MUL_CFG[13:8] for p >= 0, DATA_FORMAT's
             * *_MUL_SHIFT_VALUE_NEG for p < 0 (notes: out-cvt-converter.md "Per-channel requant
             * on the BS multiplier", HW sweep on BS; the BN twin is an inference). */
            uint32_t fmt = rj_sim_reg(t->sim, RJ_REG_DPU_DATA_FORMAT);
            st->mul_shift_neg = r == &BS_REGS ? RJ_GET(fmt, DPU_DATA_FORMAT, BS_MUL_SHIFT_VALUE_NEG)
                                              : RJ_GET(fmt, DPU_DATA_FORMAT, BN_MUL_SHIFT_VALUE_NEG);
        } else {
            /* Float path: the operand is an fp16 bit pattern (notes: dpu-lut-activation.md,
             * BN_MUL_OPERAND 0x6912 = fp16(2596)); the same reading for BS is an inference. */
            if (shift)
                return UNSUPP(t, "%s = 0x%x: %s_MUL_SHIFT_VALUE = %u on the float path is not "
                              "modelled", r->mul_name, m, name, shift);
            st->mul_f = rj_f16_to_f32((uint16_t)operand);
        }
    }
    if (st->alu) {
        st->alu_algo = (cfg >> 16) & 0xfu;
        /* ALU algorithms 0 = max, 1 = min, 2 = sum: the NVDLA SDP encoding the notes confirm for
         * the EW ALU (dpu-lut-activation.md, "Max / Min") and use for BN (ALU_ALGO 2 = add). */
        if (st->alu_algo > 2)
            return UNSUPP(t, "%s = 0x%x: %s_ALU_ALGO = %u is not modelled (0 max, 1 min, 2 sum)",
                          r->cfg_name, cfg, name, st->alu_algo);
        if (cfg & (1u << 8)) {
            if (!int_path)
                return UNSUPP(t, "%s = 0x%x: %s_ALU_SRC=1 (a per-channel operand from memory) on the float "
                              "path is not modelled: the notes document only the integer path's operands "
                              "(BRDMA_DATA_USE 1: an int32 [C] vector; 7: a 64-byte group per 8 channels; "
                              "encodings/sdp-stage-precision.md, out-cvt-converter.md); no public program "
                              "reads an fp16/fp32 BS/BN vector (rocket-userspace's RK3576 float BS arrangement "
                              "is undecoded). For a per-channel bias on the float path use the EW stage's "
                              "per-pixel operand (EW_DATA_MODE = ERDMA_DATA_MODE = 1) with the bias broadcast "
                              "into a full cube (notes: k-accumulation.md, dpu-lut-activation.md \"Two-operand "
                              "EW\")", r->cfg_name, cfg, name);
            if (r != &BS_REGS)
                return UNSUPP(t, "%s = 0x%x: BN_ALU_SRC=1 (a per-channel BN operand through NRDMA) is not "
                              "established on hardware: no public program enables NRDMA and the one measured "
                              "NRDMA configuration hung (notes: out-cvt-converter.md \"BN stage per-channel "
                              "multiplier\"); put the per-channel operand on the BS stage", r->cfg_name, cfg);
            st->alu_src = 1;
        } else {
            uint32_t a;
            if ((rc = rj_sim_need(t, r->alu_cfg, r->alu_name, &a)))
                return rc;
            /* Register operand: an fp32 bit pattern on the float path (notes:
             * dpu-lut-activation.md, "BN_ALU an fp32 bias", 0x46000000 = 8192.0; the BS reading
             * is an inference), an int32 on the integer path (inference). */
            st->alu_f = f32_of_bits(a);
            st->alu_i = (int32_t)a;
        }
    }
    if (st->alu_src || st->mul_src) {
        if ((rc = read_brdma(t, r, cfg, channels, st)))
            return rc;
    }
    /* BN runs MUL then ALU (dpu-lut-activation.md, "index = x*BN_MUL + BN_ALU (MUL then ALU)");
     * the integer BS runs ALU then MUL (out-cvt-converter.md, "The add comes before the
     * multiply", HW sweep). A float BS with both is undocumented. */
    if (r == &BS_REGS && st->alu && st->mul && !int_path)
        return UNSUPP(t, "%s = 0x%x: the float BS stage with both ALU and MUL active is not modelled: "
                      "the order is documented for BN (MUL then ALU) and the integer BS (ALU then MUL)",
                      r->cfg_name, cfg);
    return 0;
}

static inline float alu_f(uint32_t algo, float a, float b)
{
    return algo == 0 ? fmaxf(a, b) : algo == 1 ? fminf(a, b) : a + b;
}

static inline int64_t alu_i(uint32_t algo, int64_t a, int64_t b)
{
    return algo == 0 ? (a > b ? a : b) : algo == 1 ? (a < b ? a : b) : a + b;
}

/* ---- EW stage configuration ---------------------------------------------------------------- */

typedef struct ew_stage {
    int active, op, relu, lut;
    int op_mul;          /* EW_OP_TYPE = 1: multiply; else the ALU */
    uint32_t alu_algo;
    float *operand;      /* per-element operand (owned), NULL when no operand op */
} ew_stage;

/* P positions of one flying 8-channel fp16 surface (16-byte atoms, C <= 8 used) at `base`, the
 * value of register `reg`, into dst[p * C + c] as f32. */
static int read_fp16_surface(rj_sim_task *t, uint32_t base, const char *reg, uint64_t P, uint32_t C,
                             float *dst)
{
    const uint8_t *s = rj_sim_mem(t, base, P * 16u, reg);
    if (!s)
        return t->err ? t->err->code : RJ_EFAULT;
    for (uint64_t p = 0; p < P; p++)
        for (uint32_t c = 0; c < C; c++) {
            uint16_t h;
            memcpy(&h, s + p * 16u + c * 2u, 2);
            dst[p * C + c] = rj_f16_to_f32(h);
        }
    t->sim->stats.bytes_read += P * 16u;
    return 0;
}

/* Reads the EW operand cube through ERDMA (float path). Geometry: the one the notes report as
 * hardware-verified for fp16 K-accumulation and EW multiply (encodings/k-accumulation.md,
 * dpu-lut-activation.md "Two-operand EW"): MRDMA SRC_BASE = operand, ERDMA EW_BASE = operand +
 * one surface (W*H*16), SURF_NOTCH = EW_SURF_STRIDE = MAX(W*H, 12)*16, COMB_USE = 5. The operand
 * is a cube in the output layout (16-byte atoms, surfaces EW_SURF_STRIDE apart), element size
 * from ERDMA_DATA_SIZE (2 = 16-bit fp16, 3 = 32-bit fp32; sdp-stage-precision.md). */
static int read_ew_operand(rj_sim_task *t, uint32_t W, uint32_t H, uint32_t C, int flying,
                           uint32_t edata_size, float *dst)
{
    if (flying) {
        /* DPU-only two-buffer EW: the main cube from MRDMA (SRC_BASE), the operand from ERDMA
         * (EW_BASE), both one 8-channel fp16 surface in the 16-byte atom layout (notes:
         * encodings/sdp-stage-precision.md "A two-buffer EW op needs no conv main feed", HW sweep on
         * RK3588, tests/ew_int_probe.c; the program checked by parse_ew). The earlier note that a
         * flying ERDMA operand "reads 0" (dpu-lut-activation.md "Two-operand EW") is superseded:
         * ORIG_CHANNEL, COMB_USE and the converter bypass explain that failure. */
        uint32_t base;
        RJ_SIM_REQUIRE(t, DPU_RDMA_RDMA_EW_BASE_ADDR, &base);
        if (edata_size != 2 || C > 8)
            return UNSUPP(t, "a DPU-only EW operand is measured as one 8-channel fp16 surface (EDATA_SIZE 2); "
                          "EDATA_SIZE %u with %u channels is not documented (notes: "
                          "encodings/sdp-stage-precision.md)", edata_size, C);
        return read_fp16_surface(t, base, "DPU_RDMA_RDMA_EW_BASE_ADDR", (uint64_t)W * H, C, dst);
    }
    uint32_t src, ew_base, ew_stride, notch, ew_notch, fm;
    RJ_SIM_REQUIRE(t, DPU_RDMA_RDMA_SRC_BASE_ADDR, &src);
    RJ_SIM_REQUIRE(t, DPU_RDMA_RDMA_EW_BASE_ADDR, &ew_base);
    RJ_SIM_REQUIRE(t, DPU_RDMA_RDMA_EW_SURF_STRIDE, &ew_stride);
    RJ_SIM_REQUIRE(t, DPU_RDMA_RDMA_SURF_NOTCH, &notch);
    RJ_SIM_REQUIRE(t, DPU_RDMA_RDMA_FEATURE_MODE_CFG, &fm);
    ew_notch = rj_sim_reg(t->sim, RJ_REG_DPU_RDMA_RDMA_EW_SURF_NOTCH);
    (void)ew_notch; /* written equal to SURF_NOTCH by every documented program; not read here */
    ew_stride &= ~0xfu;
    notch &= ~0xfu;
    const uint32_t esize = edata_size == 3 ? 4u : 2u;
    const uint32_t c2 = 16u / esize;
    const uint32_t nsurf = (C + c2 - 1u) / c2;
    const uint64_t P = (uint64_t)W * H;
    const uint64_t surf_bytes = P * 16u;

    uint32_t comb = RJ_GET(fm, DPU_RDMA_RDMA_FEATURE_MODE_CFG, COMB_USE);
    if (RJ_GET(fm, DPU_RDMA_RDMA_FEATURE_MODE_CFG, MRDMA_DISABLE) || comb != 5) {
        /* ERDMA armed while MRDMA is not combining the conv data with the operand stream: the
         * job times out with the output untouched (notes: encodings/mrdma-trap.md, "The corollary
         * trap (eltwise path)"). */
        if (strict(t))
            return rj_sim_hazard(t, "DPU_RDMA_RDMA_FEATURE_MODE_CFG", "MRDMA trap (eltwise)",
                                 "value 0x%x: an EW operand needs MRDMA enabled with COMB_USE=5 "
                                 "(0x17d40 in the verified program); otherwise the job times out "
                                 "(notes: encodings/mrdma-trap.md, encodings/k-accumulation.md)", fm);
        return UNSUPP(t, "DPU_RDMA_RDMA_FEATURE_MODE_CFG = 0x%x with an EW operand: only COMB_USE=5 "
                      "with MRDMA enabled is modelled (the hardware hangs otherwise)", fm);
    }
    if (ew_stride == 0 || notch == 0) {
        /* With the planar pointer-advance left 0 the ERDMA never advances: it reads the offset-0
         * atom and broadcasts it to every position and surface (notes: k-accumulation.md). */
        if (strict(t))
            return rj_sim_hazard(t, ew_stride == 0 ? "DPU_RDMA_RDMA_EW_SURF_STRIDE" : "DPU_RDMA_RDMA_SURF_NOTCH",
                                 "EW operand never advances",
                                 "EW_SURF_STRIDE = 0x%x, SURF_NOTCH = 0x%x: with either 0 the ERDMA reads "
                                 "the first atom and broadcasts it; set both to MAX(W*H, 12)*16 "
                                 "(notes: encodings/k-accumulation.md)", ew_stride, notch);
        const uint8_t *a = rj_sim_mem(t, src, 16, "DPU_RDMA_RDMA_SRC_BASE_ADDR");
        if (!a)
            return t->err ? t->err->code : RJ_EFAULT;
        for (uint64_t p = 0; p < P; p++)
            for (uint32_t c = 0; c < C; c++) {
                uint32_t lane = c % c2;
                if (esize == 2) {
                    uint16_t h;
                    memcpy(&h, a + lane * 2u, 2);
                    dst[p * C + c] = rj_f16_to_f32(h);
                } else {
                    memcpy(&dst[p * C + c], a + lane * 4u, 4);
                }
            }
        t->sim->stats.bytes_read += 16u;
        return 0;
    }
    if (nsurf > 1 && P < 12) {
        /* The MAX(W*H, 12) floor over-states the surface stride below 12 positions and the upper
         * surfaces mis-stride (notes: k-accumulation.md, dpu-lut-activation.md "keep M >= 12"). */
        if (strict(t))
            return rj_sim_hazard(t, "DPU_RDMA_RDMA_EW_SURF_STRIDE", "EW operand under 12 positions",
                                 "the cube has %llu positions (< 12) and %u operand surfaces; the upper "
                                 "surfaces mis-stride on hardware (notes: encodings/k-accumulation.md); "
                                 "pad the cube to at least 12 positions", (unsigned long long)P, nsurf);
        return UNSUPP(t, "EW operand with %llu (< 12) positions and %u surfaces: the hardware's "
                      "mis-strided read is not modelled", (unsigned long long)P, nsurf);
    }
    if (ew_base != (uint64_t)src + surf_bytes || (nsurf > 1 && (ew_stride != surf_bytes || notch != ew_stride)))
        return UNSUPP(t, "EW operand geometry SRC_BASE 0x%x, EW_BASE 0x%x, EW_SURF_STRIDE 0x%x, "
                      "SURF_NOTCH 0x%x is not modelled: the hardware-verified transport has "
                      "EW_BASE = SRC_BASE + W*H*16 (0x%llx) and EW_SURF_STRIDE = SURF_NOTCH = W*H*16 "
                      "(0x%llx) (notes: encodings/k-accumulation.md)", src, ew_base, ew_stride, notch,
                      (unsigned long long)((uint64_t)src + surf_bytes), (unsigned long long)surf_bytes);
    for (uint32_t s = 0; s < nsurf; s++) {
        const uint8_t *sp = rj_sim_mem(t, (uint64_t)src + (uint64_t)s * ew_stride, surf_bytes,
                                       "DPU_RDMA_RDMA_SRC_BASE_ADDR");
        if (!sp)
            return t->err ? t->err->code : RJ_EFAULT;
        uint32_t c_end = (s + 1u) * c2 < C ? (s + 1u) * c2 : C;
#if RJ_DPU_F16C
        if (esize == 2 && c_end - s * c2 == 8u) {
            /* Whole fp16 atoms: F16C widening is exact, as rj_f16_to_f32 per element. */
            for (uint64_t p = 0; p < P; p++)
                _mm256_storeu_ps(dst + p * C + s * c2,
                                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(sp + p * 16u))));
            t->sim->stats.bytes_read += surf_bytes;
            continue;
        }
#endif
        for (uint64_t p = 0; p < P; p++)
            for (uint32_t c = s * c2; c < c_end; c++) {
                const uint8_t *e = sp + p * 16u + (c - s * c2) * esize;
                if (esize == 2) {
                    uint16_t h;
                    memcpy(&h, e, 2);
                    dst[p * C + c] = rj_f16_to_f32(h);
                } else {
                    memcpy(&dst[p * C + c], e, 4);
                }
            }
        t->sim->stats.bytes_read += surf_bytes;
    }
    return 0;
}

static int parse_ew(rj_sim_task *t, int int_path, int flying, uint32_t W, uint32_t H, uint32_t C,
                    ew_stage *ew)
{
    memset(ew, 0, sizeof *ew);
    uint32_t cfg, erdma = 1u; /* ERDMA counts as disabled when DPU_RDMA does not run */
    RJ_SIM_REQUIRE(t, DPU_EW_CFG, &cfg);
    const int rdma_on = (t->enable_mask & RJ_SIM_EN_DPU_RDMA) != 0;
    if (rdma_on)
        RJ_SIM_REQUIRE(t, DPU_RDMA_RDMA_ERDMA_CFG, &erdma);
    const int erdma_on = !RJ_GET(erdma, DPU_RDMA_RDMA_ERDMA_CFG, ERDMA_DISABLE);

    if (RJ_GET(cfg, DPU_EW_CFG, EW_BYPASS)) {
        /* EW_BYPASS skips the whole stage, LUT included (NVDLA SDP Y-stage bypass; conformance
         * 01 sets it with every sub-bypass too). */
        if (erdma_on)
            return UNSUPP(t, "DPU_RDMA_RDMA_ERDMA_CFG = 0x%x arms ERDMA while DPU_EW_CFG = 0x%x "
                          "bypasses the EW stage: not modelled", erdma, cfg);
        return 0;
    }
    ew->active = 1;
    if (RJ_GET(cfg, DPU_EW_CFG, EW_BINARY_EN) || RJ_GET(cfg, DPU_EW_CFG, EW_EQUAL_EN) ||
        RJ_GET(cfg, DPU_EW_CFG, EW_MUL_PRELU) || RJ_GET(cfg, DPU_EW_CFG, EW_RELUX_EN))
        return UNSUPP(t, "DPU_EW_CFG = 0x%x: EW_BINARY_EN / EW_EQUAL_EN / EW_MUL_PRELU / EW_RELUX_EN "
                      "are not modelled", cfg);
    ew->relu = !RJ_GET(cfg, DPU_EW_CFG, EW_RELU_BYPASS);
    ew->lut = !RJ_GET(cfg, DPU_EW_CFG, EW_LUT_BYPASS);
    int op = !RJ_GET(cfg, DPU_EW_CFG, EW_OP_BYPASS);

    if (op && !RJ_GET(cfg, DPU_EW_CFG, EW_OP_SRC)) {
        /* EW_OP_SRC = 0 selects the register operands EW_OP_VALUE_0..7. Conformance 05 (hardware-
         * validated sigmoid) runs with the op unbypassed, EW_OP_SRC = 0, EW_ALU_ALGO = 0, ERDMA
         * disabled and the values unwritten, and the result shows no max(x, 0): the stage is
         * modelled as inert there (inference). A nonzero register operand is refused. */
        if (erdma_on)
            return UNSUPP(t, "DPU_EW_CFG = 0x%x selects register operands (EW_OP_SRC=0) while ERDMA is "
                          "armed: not modelled", cfg);
        for (uint32_t i = 0; i < 8; i++)
            if (rj_sim_reg(t->sim, RJ_REG_DPU_EW_OP_VALUE_0 + 4u * i) != 0)
                return UNSUPP(t, "DPU_EW_OP_VALUE_%u = 0x%x: register-operand EW ops (EW_OP_SRC=0) are "
                              "not modelled; the notes document only the ERDMA operand", i,
                              rj_sim_reg(t->sim, RJ_REG_DPU_EW_OP_VALUE_0 + 4u * i));
        op = 0;
    }
    if (!op) {
        if (erdma_on)
            return UNSUPP(t, "DPU_RDMA_RDMA_ERDMA_CFG = 0x%x arms ERDMA but DPU_EW_CFG = 0x%x consumes no "
                          "memory operand: not modelled", erdma, cfg);
        return 0;
    }
    if (int_path) {
        /* An EW operand on the int32 accumulator: with the DPU / DPU_RDMA precision fields left at
         * fp16 the EW adds the int32 patterns as floats, garbage (notes: k-accumulation.md "Integer
         * EW K-accumulation", measured on the conv-main K-accumulation program; sdp-stage-precision.md:
         * "int32 element sizes with the precision triple left at fp16 match none of the six models").
         * With every precision field at the integer code the EW ALU is exact, but that is measured
         * DPU-only; a conv's CACC as the main feed at an integer proc_precision is not
         * (sdp-stage-precision.md "The EW stage in integer mode"). Neither is modelled. */
        const uint32_t fm = rj_sim_reg(t->sim, RJ_REG_DPU_RDMA_RDMA_FEATURE_MODE_CFG);
        const uint32_t fproc = RJ_GET(fm, DPU_RDMA_RDMA_FEATURE_MODE_CFG, PROC_PRECISION);
        const uint32_t fin = RJ_GET(fm, DPU_RDMA_RDMA_FEATURE_MODE_CFG, IN_PRECISION);
        const int float_code = fproc == RJ_PREC_FP16 || fproc == RJ_PREC_BF16 || fproc == RJ_PREC_FP32 ||
                               fin == RJ_PREC_FP16 || fin == RJ_PREC_BF16 || fin == RJ_PREC_FP32;
        if (float_code) {
            if (strict(t))
                return rj_sim_hazard(t, "DPU_EW_CFG", "integer EW with float precision fields",
                                     "value 0x%x runs an EW operand op on the int32 accumulator while "
                                     "DPU_RDMA_RDMA_FEATURE_MODE_CFG (0x%x) keeps a non-integer precision: the "
                                     "EW ALU adds the int32 patterns as floats, garbage. Sum integer "
                                     "K-partials on the host (notes: encodings/k-accumulation.md, "
                                     "sdp-stage-precision.md)", cfg, fm);
            return UNSUPP(t, "DPU_EW_CFG = 0x%x: an EW operand op on the integer path with float precision "
                          "fields gives garbage on hardware and is not modelled", cfg);
        }
        return UNSUPP(t, "DPU_EW_CFG = 0x%x: an EW operand op on a conv's int32 accumulator with integer "
                      "precision fields is unmeasured (the integer EW ALU is measured DPU-only, every "
                      "precision field at one integer code; notes: encodings/sdp-stage-precision.md \"The EW "
                      "stage in integer mode\"). Sum integer K-partials on the host", cfg);
    }
    if (!rdma_on)
        return UNSUPP(t, "DPU_EW_CFG = 0x%x reads its operand through DPU_RDMA (EW_OP_SRC=1), but the "
                      "enable mask 0x%x lacks bit 4 (DPU_RDMA)", cfg, t->enable_mask);
    if (!erdma_on)
        return UNSUPP(t, "DPU_EW_CFG = 0x%x reads its operand from memory (EW_OP_SRC=1) but "
                      "DPU_RDMA_RDMA_ERDMA_CFG = 0x%x disables ERDMA", cfg, erdma);
    /* Per-pixel operand (EW_DATA_MODE = ERDMA_DATA_MODE = 1) of 16 or 32 bits, the sizes of the
     * two registers agreeing (notes: k-accumulation.md, sdp-stage-precision.md). */
    uint32_t edata = RJ_GET(cfg, DPU_EW_CFG, EDATA_SIZE);
    if (RJ_GET(cfg, DPU_EW_CFG, EW_DATA_MODE) != 1 || RJ_GET(erdma, DPU_RDMA_RDMA_ERDMA_CFG, ERDMA_DATA_MODE) != 1 ||
        RJ_GET(erdma, DPU_RDMA_RDMA_ERDMA_CFG, ERDMA_DATA_SIZE) != edata || (edata != 2 && edata != 3) ||
        RJ_GET(erdma, DPU_RDMA_RDMA_ERDMA_CFG, ERDMA_SURF_MODE) || RJ_GET(erdma, DPU_RDMA_RDMA_ERDMA_CFG, ERDMA_NONALIGN))
        return UNSUPP(t, "DPU_EW_CFG = 0x%x / DPU_RDMA_RDMA_ERDMA_CFG = 0x%x: only the per-pixel operand "
                      "(EW_DATA_MODE = ERDMA_DATA_MODE = 1) with matching 16-bit (2) or 32-bit (3) "
                      "data size is modelled (notes: encodings/k-accumulation.md). The per-channel (0) and "
                      "per-channel x pixel (2) data modes exist (RK3588 TRM 36.4.3, ERDMA_DATA_MODE) but what "
                      "they read is unmeasured (notes: sdp-stage-precision.md \"does not show ... the "
                      "broadcast operand modes\"); broadcast a per-channel operand into a full cube and read "
                      "it per pixel", cfg, erdma);
    if (RJ_GET(cfg, DPU_EW_CFG, EW_CVT_TYPE) || RJ_GET(cfg, DPU_EW_CFG, EW_CVT_ROUND))
        return UNSUPP(t, "DPU_EW_CFG = 0x%x: EW_CVT_TYPE / EW_CVT_ROUND (the int8 operand converter) "
                      "are not modelled on the float path", cfg);
    if (!RJ_GET(cfg, DPU_EW_CFG, EW_OP_CVT_BYPASS)) {
        /* The operand converter runs in conformance 02 with scale 1, shift 0, offset 0: the
         * identity. Any other setting is not modelled. */
        uint32_t sc = rj_sim_reg(t->sim, RJ_REG_DPU_EW_CVT_SCALE_VALUE);
        uint32_t of = rj_sim_reg(t->sim, RJ_REG_DPU_EW_CVT_OFFSET_VALUE);
        if (sc != 1u || of != 0u)
            return UNSUPP(t, "DPU_EW_CVT_SCALE_VALUE = 0x%x, DPU_EW_CVT_OFFSET_VALUE = 0x%x: only the "
                          "identity operand conversion (scale 1, shift 0, offset 0) is modelled", sc, of);
    }
    ew->op_mul = RJ_GET(cfg, DPU_EW_CFG, EW_OP_TYPE) == 1;
    ew->alu_algo = RJ_GET(cfg, DPU_EW_CFG, EW_ALU_ALGO);
    /* EW_OP_TYPE 1 = multiply (0x108003C4), else the ALU with 0 = MAX, 1 = MIN, 2 = SUM
     * (notes: dpu-lut-activation.md, "Two-operand EW" and "Max / Min"). */
    if (!ew->op_mul && ew->alu_algo > 2)
        return UNSUPP(t, "DPU_EW_CFG = 0x%x: EW_ALU_ALGO = %u is not modelled (0 max, 1 min, 2 sum)",
                      cfg, ew->alu_algo);
    if (ew->lut)
        return UNSUPP(t, "DPU_EW_CFG = 0x%x runs an EW operand op and the LUT in one pass: their order "
                      "and the LUT mux input are not documented", cfg);
    if (flying) {
        /* The three fields that separate the measured DPU-only program from failing ones, each moved
         * alone on it (notes: encodings/sdp-stage-precision.md "A two-buffer EW op needs no conv main
         * feed", HW sweep on RK3588). */
        const uint32_t fm = rj_sim_reg(t->sim, RJ_REG_DPU_RDMA_RDMA_FEATURE_MODE_CFG);
        const uint32_t comb = RJ_GET(fm, DPU_RDMA_RDMA_FEATURE_MODE_CFG, COMB_USE);
        const uint32_t ch = rj_sim_reg(t->sim, RJ_REG_DPU_DATA_CUBE_CHANNEL);
        const int bypass = (int)RJ_GET(cfg, DPU_EW_CFG, EW_OP_CVT_BYPASS);
        const char *bad = NULL;
        if (comb & 1u)
            bad = "COMB_USE bit 0 set (1 or 5): the program never completes";
        else if (RJ_GET(ch, DPU_DATA_CUBE_CHANNEL, ORIG_CHANNEL) != RJ_GET(ch, DPU_DATA_CUBE_CHANNEL, CHANNEL))
            bad = "DPU_DATA_CUBE_CHANNEL.ORIG_CHANNEL != CHANNEL: only lane 0 of each atom is right";
        else if (ew->op_mul && !bypass)
            bad = "MUL with the EW input converter live (DPU_EW_CFG[8] = 0): the program times out";
        else if (!ew->op_mul && ew->alu_algo == 2 && bypass)
            bad = "ADD with the EW input converter bypassed (DPU_EW_CFG[8] = 1): about half the elements "
                  "pass the main operand through";
        if (bad) {
            if (strict(t))
                return rj_sim_hazard(t, "DPU_EW_CFG", "DPU-only two-operand EW",
                                     "%s. The measured program: COMB_USE 4, ORIG_CHANNEL = CHANNEL, ADD/MAX/MIN "
                                     "with the converter live, MUL with it bypassed (notes: "
                                     "encodings/sdp-stage-precision.md)", bad);
            return UNSUPP(t, "DPU-only two-operand EW: %s (notes: encodings/sdp-stage-precision.md)", bad);
        }
        if (comb != 4 || (!ew->op_mul && ew->alu_algo != 2 && bypass))
            return UNSUPP(t, "DPU-only two-operand EW with COMB_USE %u, DPU_EW_CFG = 0x%x: only the measured "
                          "program is modelled (COMB_USE 4; ADD, MAX, MIN with the EW input converter live, "
                          "MUL with it bypassed; notes: encodings/sdp-stage-precision.md)", comb, cfg);
    }
    ew->op = 1;
    ew->operand = malloc((size_t)W * H * C * sizeof(float));
    if (!ew->operand)
        return rj_sim_fail(t, RJ_ENOMEM, "DPU EW: out of memory for the operand cube");
    return read_ew_operand(t, W, H, C, flying, edata, ew->operand);
}

/* ---- the flying source ------------------------------------------------------------------- */

/* DPU-only ("flying") mode: DPU_FEATURE_MODE_CFG.FLYING_MODE = 1 and DPU_RDMA's MRDMA reads the
 * source cube from SRC_BASE_ADDR, fp16 converted to fp32 by MRDMA_FP16TOFP32_EN (notes:
 * encodings/dpu-lut-activation.md "Pipeline"; conformance 05: DPU_RDMA FEATURE_MODE_CFG 0x17849).
 * The cube is the fp16 8-channel atom layout (16 bytes per position). A source of more than one
 * surface is refused: no documented program has one, so the MRDMA surface stride is unknown. */
static int read_flying_source(rj_sim_task *t, uint32_t W, uint32_t H, uint32_t C, float *dst)
{
    uint32_t fm, src;
    RJ_SIM_REQUIRE(t, DPU_RDMA_RDMA_FEATURE_MODE_CFG, &fm);
    RJ_SIM_REQUIRE(t, DPU_RDMA_RDMA_SRC_BASE_ADDR, &src);
    if (!RJ_GET(fm, DPU_RDMA_RDMA_FEATURE_MODE_CFG, FLYING_MODE) ||
        RJ_GET(fm, DPU_RDMA_RDMA_FEATURE_MODE_CFG, MRDMA_DISABLE))
        return UNSUPP(t, "DPU_RDMA_RDMA_FEATURE_MODE_CFG = 0x%x: the DPU runs without CNA/CORE, so its "
                      "source must come from MRDMA (FLYING_MODE=1, MRDMA_DISABLE=0)", fm);
    if (RJ_GET(fm, DPU_RDMA_RDMA_FEATURE_MODE_CFG, IN_PRECISION) != RJ_PREC_FP16 ||
        !RJ_GET(fm, DPU_RDMA_RDMA_FEATURE_MODE_CFG, MRDMA_FP16TOFP32_EN))
        return UNSUPP(t, "DPU_RDMA_RDMA_FEATURE_MODE_CFG = 0x%x: only an fp16 flying source "
                      "(IN_PRECISION=2, MRDMA_FP16TOFP32_EN=1) is modelled", fm);
    if (C > 8)
        return UNSUPP(t, "DPU_RDMA_RDMA_DATA_CUBE_CHANNEL: a flying source of %u channels spans more than "
                      "one 8-channel surface; the MRDMA source surface stride is undocumented. Lay the "
                      "data out as one surface (width = n/8, height 1, 8 channels).", C);
    return read_fp16_surface(t, src, "DPU_RDMA_RDMA_SRC_BASE_ADDR", (uint64_t)W * H, C, dst);
}

/* ---- OUT_CVT ------------------------------------------------------------------------------ */

typedef struct out_cvt {
    int affine;          /* CVT_TYPE = 1 */
    int32_t offset;
    uint32_t scale, shift, minus_exp, fp16_en;
    int32_t scale_i;     /* integer path: SCALE as a signed 16-bit multiplier */
    int round_away;      /* integer path: CVT_ROUND = 1, ties away from zero (0: ties to even) */
} out_cvt;

static int parse_out_cvt(rj_sim_task *t, int int_path, uint32_t out_prec, out_cvt *o)
{
    uint32_t off, sc, sh;
    RJ_SIM_REQUIRE(t, DPU_OUT_CVT_OFFSET, &off);
    RJ_SIM_REQUIRE(t, DPU_OUT_CVT_SCALE, &sc);
    RJ_SIM_REQUIRE(t, DPU_OUT_CVT_SHIFT, &sh);
    o->offset = (int32_t)off;
    o->scale = RJ_GET(sc, DPU_OUT_CVT_SCALE, OUT_CVT_SCALE);
    o->fp16_en = RJ_GET(sc, DPU_OUT_CVT_SCALE, FP32TOFP16_EN);
    o->shift = RJ_GET(sh, DPU_OUT_CVT_SHIFT, OUT_CVT_SHIFT);
    o->minus_exp = RJ_GET(sh, DPU_OUT_CVT_SHIFT, MINUS_EXP);
    o->affine = RJ_GET(sh, DPU_OUT_CVT_SHIFT, CVT_TYPE);
    o->round_away = (int)RJ_GET(sh, DPU_OUT_CVT_SHIFT, CVT_ROUND);
    o->scale_i = (int16_t)(o->scale & 0xffffu);
    if (int_path) {
        /* Integer path (notes: out-cvt-converter.md "Integer convert", HW sweeps
         * requant_edge_probe / requant_round_probe): out = sat(round((acc * SCALE) >> SHIFT) +
         * OFFSET), SCALE a signed 16-bit multiplier, the shift rounding to nearest with ties to
         * even (CVT_ROUND = 0) or away from zero (CVT_ROUND = 1), OFFSET (signed 32) added after
         * the rounding, saturation last; minus_exp and cvt_type are no-ops here. FP32TOFP16_EN
         * with an fp16 output narrows that integer to fp16 (out-cvt-converter.md, the fp16 row of
         * "Output datatype and cube on the int8 datapath"). */
        if (o->fp16_en != (out_prec == RJ_PREC_FP16))
            return UNSUPP(t, "DPU_OUT_CVT_SCALE.FP32TOFP16_EN = %u with DPU_DATA_FORMAT.OUT_PRECISION = %u on "
                          "the integer path: an fp16 output needs FP32TOFP16_EN=1, other outputs 0",
                          o->fp16_en, out_prec);
        if (o->shift > 62)
            return UNSUPP(t, "DPU_OUT_CVT_SHIFT = 0x%x: OUT_CVT_SHIFT = %u past 62 is not modelled", sh, o->shift);
        return 0;
    }
    if (o->round_away)
        return UNSUPP(t, "DPU_OUT_CVT_SHIFT = 0x%x: CVT_ROUND on the float path is not modelled (its tie "
                      "rule is documented for the integer shift only)", sh);
    /* Float path: FP32TOFP16_EN narrows to fp16 exactly when the output precision is fp16. */
    if ((out_prec == RJ_PREC_FP16) != (o->fp16_en != 0))
        return UNSUPP(t, "DPU_OUT_CVT_SCALE.FP32TOFP16_EN = %u with DPU_DATA_FORMAT.OUT_PRECISION = %u: an "
                      "fp16 output needs FP32TOFP16_EN=1 and an fp32 output FP32TOFP16_EN=0",
                      o->fp16_en, out_prec);
    if (o->affine) {
        /* CVT_TYPE = 1: out = (v + OFFSET) * 2^-MINUS_EXP * SCALE (notes: dpu-lut-activation.md,
         * "Signed / wide output -- the affine OUT_CVT"). */
        if (o->shift != 0)
            return UNSUPP(t, "DPU_OUT_CVT_SHIFT = 0x%x: OUT_CVT_SHIFT with CVT_TYPE=1 is not modelled", sh);
        return 0;
    }
    if (o->scale != 1 || o->shift != 0 || o->minus_exp != 0 || o->offset != 0)
        return UNSUPP(t, "OUT_CVT (offset %d, scale %u, shift %u, minus_exp %u) with CVT_TYPE=0 on the "
                      "float path: only the identity (offset 0, scale 1, shift 0) is modelled; the integer "
                      "form (acc*SCALE)>>SHIFT is documented for the int32 accumulator only",
                      o->offset, o->scale, o->shift, o->minus_exp);
    return 0;
}

/* ---- the run ------------------------------------------------------------------------------ */

typedef struct dpu_run {
    sdp_stage bs, bn;
    ew_stage ew;
    float *vf;
    int64_t *vi;
} dpu_run;

static void run_free(dpu_run *r)
{
    free(r->bs.alu_vec);
    free(r->bs.mul_vec);
    free(r->bs.ow_vec);
    free(r->bn.alu_vec);
    free(r->ew.operand);
    free(r->vf);
    free(r->vi);
}

/* What a lookup's quirks do to its output in faithful mode (lut_hazards). */
enum { LUT_QUIRK_NONE = 0, LUT_QUIRK2_SPIKE = 1, LUT_QUIRK4_DECODE = 2 };

/* QUIRK 2's band in faithful mode: the ELU/SELU probe of the notes (dpu-lut-activation.md,
 * "Affected kinds": 97 of 4001 inputs spiked on [-0.02, 0.02] at step 1e-5, i.e. |x| <~ 4.85e-4)
 * ran at BN_MUL = 1024 (rocket-userspace: the symmetric shifted table over [-8, 8], scale
 * 16384/16), which is |x * BN_MUL| < ~0.5 index units: the pre-bias product rounding to index 0.
 * Expressing the band in index units is an inference from that one measurement. */
#define QUIRK2_BAND_INDEX 0.5f
/* The spike's size: "a discrete garbage spike (+128)" (LeakyReLU scan) and "~64-128" (probe);
 * +128 is reproduced (the one value the notes give exactly). */
#define QUIRK2_SPIKE 128.0f
/* QUIRK 4's decode: "it emits a constant ~4.0, not 0" (dpu-lut-activation.md "QUIRK 4"). */
#define QUIRK4_VALUE 4.0f

/* QUIRK 1/2/4 for one LUT lookup. Strict mode refuses; faithful mode (RJ_SIM_FAITHFUL) reproduces
 * the quirks that have a documented effect (2 and 4) and returns which one in *quirk. `x_in` is
 * the value entering the BN stage, `pre_bias` the BN-MUL product before the BN ALU, `biased` says
 * the BN ALU moves the index (a nonzero bias). */
static int lut_hazards(rj_sim_task *t, const out_cvt *cvt, uint64_t e, float x_in, float pre_bias,
                       int biased, const rj_lut_hit *hit, int *quirk)
{
    const int faithful = (t->sim->flags & RJ_SIM_FAITHFUL) != 0;
    *quirk = LUT_QUIRK_NONE;
    /* QUIRK 2: with a signed output decode (OUT_CVT_OFFSET < 0) an input within ~0.0015 of 0
     * emits a discrete spike; unsigned decodes are clean even where x straddles 0 (notes:
     * dpu-lut-activation.md, "QUIRK 2", "Affected kinds", both the natural LE/LO split and the
     * symmetric shifted table of ELU/SELU). It follows x = 0, not a table index ("re-mapping x=0
     * to a different index moves the spike"), so it is tested on the value before the bias.
     * Conflicting evidence, noted: rocket-userspace's shifted tanh (BN_ALU 8192) records 0 spikes;
     * the notes' later probe table is followed. */
    if (cvt->affine && cvt->offset < 0) {
        if (faithful) {
            if (fabsf(pre_bias) < QUIRK2_BAND_INDEX)
                *quirk = LUT_QUIRK2_SPIKE;
        } else if (strict(t) && fabsf(x_in) <= 0.0015f) {
            return rj_sim_hazard(t, "DPU_LUT_CFG", "QUIRK 2 (x~0 mux spike)",
                                 "element %llu enters the LUT with x = %g, within ~0.0015 of 0, and the output "
                                 "decode is signed (DPU_OUT_CVT_OFFSET = %d); the hardware emits a garbage "
                                 "spike there. Use a non-negative offset framing or repair the band on the "
                                 "host; a foreign program that tolerates it runs with RJ_SIM_FAITHFUL=1 "
                                 "(notes: encodings/dpu-lut-activation.md)",
                                 (unsigned long long)e, (double)x_in, cvt->offset);
        }
    }
    /* QUIRK 4: a table entry of exactly 0 decodes as ~4.0. The hardware evidence is the shifted
     * single-table arrangement (BN-ALU-biased index): EXP over [-16, 0] reads ~4 wherever its
     * entries quantise to q = 0 (notes: dpu-lut-activation.md "QUIRK 4"; seed 000 "EXP").
     * Unbiased hybrid tables with read zero entries run correctly on silicon (HardSigmoid's
     * and the GELU gate's LE tails, LeakyReLU's LE[0]: notes "The geometry constants", "GELU",
     * "Mitigation"), so only a read of a q = 0 entry through a biased index is the quirk. */
    if (biased && hit->zero_read) {
        if (faithful)
            *quirk = LUT_QUIRK4_DECODE;
        else if (strict(t))
            return rj_sim_hazard(t, "DPU_LUT_ACCESS_DATA", "QUIRK 4 (q=0 LUT entry)",
                                 "element %llu reads %s entry %d or %d, which is exactly 0, through a "
                                 "BN-ALU-biased index (the shifted single-table arrangement); the hardware "
                                 "decodes it as ~4.0. Floor every entry to q >= 1; a foreign program runs "
                                 "with RJ_SIM_FAITHFUL=1 (notes: encodings/dpu-lut-activation.md)",
                                 (unsigned long long)e, hit->table == RJ_LUT_LE ? "LE" : "LO",
                                 (int)hit->seg, (int)hit->seg + 1);
    }
    /* QUIRK 1: an exactly-flat in-table run mis-toggles the mux (notes: dpu-lut-activation.md,
     * "in flat / asymptotic regions ... a config-independent garbage spike"). The notes give no
     * threshold; a run of >= 64 identical entries (1/8 of a table) counts as flat here -- a
     * heuristic, not a documented bound -- except runs at the Q0.15 rails 1 and 32767 (where
     * quantised smooth tails such as tanh's saturate) and runs of 0 shorter than the whole
     * table: HardSigmoid's unfloored table (about 270 LE entries of 0 for x <= -3, 32767 for
     * x >= 3) runs on silicon to max_abs 0.00049 (notes "The geometry constants"), while
     * LeakyReLU with alpha = 0, a whole LE table of 0, trips the quirk (notes "Mitigation").
     * A lookup whose outcome QUIRK 4 documents (faithful mode) is not checked again. Its output
     * is not documented, so it is refused in strict mode even when faithful. */
    if (strict(t) && hit->region == 0 && *quirk != LUT_QUIRK4_DECODE) {
        int16_t v;
        uint32_t run = rj_sim_lut_flat_run(t->sim, hit->table, hit->seg, &v);
        if (run >= 64 && v != 1 && v != 32767 && !(v == 0 && run < RJ_LUT_ENTRIES))
            return rj_sim_hazard(t, "DPU_LUT_ACCESS_DATA", "QUIRK 1 (flat LUT run)",
                                 "element %llu lands in a run of %u identical %s entries (value %d); a flat "
                                 "in-table run mis-toggles the LE/LO mux on hardware. Use the 2-pass "
                                 "x*gate(x) form or keep flat regions out of the table "
                                 "(notes: encodings/dpu-lut-activation.md)", (unsigned long long)e, run,
                                 hit->table == RJ_LUT_LE ? "LE" : "LO", (int)v);
    }
    return 0;
}

static int run_float(rj_sim_task *t, dpu_run *r, uint64_t n, const out_cvt *cvt)
{
    const int lut = r->ew.active && r->ew.lut;
    const int check = lut && (strict(t) || (t->sim->flags & RJ_SIM_FAITHFUL));
    /* The BN ALU moves the table index (the shifted arrangement) unless it adds exactly 0
     * (conformance 05's -0.0 word). */
    const int biased = r->bn.active && r->bn.alu && (r->bn.alu_algo != 2 || r->bn.alu_f != 0.0f);
    if (!r->bs.active && !r->bn.active && !lut && !cvt->affine) {
        /* Only the EW operand op and/or ReLU (the K-accumulation partial add): the loop below
         * reduced to its live steps, one flat pass each, the same operations per element. */
        float *restrict v = r->vf;
        if (r->ew.active && r->ew.op) {
            const float *restrict b = r->ew.operand;
            if (r->ew.op_mul)
                for (uint64_t e = 0; e < n; e++)
                    v[e] = v[e] * b[e];
            else if (r->ew.alu_algo == 2)
                for (uint64_t e = 0; e < n; e++)
                    v[e] = v[e] + b[e];
            else
                for (uint64_t e = 0; e < n; e++)
                    v[e] = alu_f(r->ew.alu_algo, v[e], b[e]);
        }
        if (r->ew.active && r->ew.relu)
            for (uint64_t e = 0; e < n; e++)
                v[e] = fmaxf(v[e], 0.0f);
        return 0;
    }
    for (uint64_t e = 0; e < n; e++) {
        float x = r->vf[e];
        if (r->bs.active) {
            if (r->bs.alu)
                x = alu_f(r->bs.alu_algo, x, r->bs.alu_f);
            if (r->bs.mul)
                x *= r->bs.mul_f;
            if (r->bs.relu)
                x = fmaxf(x, 0.0f);
        }
        const float x_in = x; /* the value the activation sees before its index scaling */
        float pre_bias = x;
        if (r->bn.active) {
            /* MUL then ALU (notes: dpu-lut-activation.md, "BN-ALU bias works in the index
             * domain"). */
            if (r->bn.mul)
                x *= r->bn.mul_f;
            pre_bias = x;
            if (r->bn.alu)
                x = alu_f(r->bn.alu_algo, x, r->bn.alu_f);
            if (r->bn.relu)
                x = fmaxf(x, 0.0f);
        }
        int quirk = LUT_QUIRK_NONE;
        if (r->ew.active) {
            if (r->ew.op) {
                const float b = r->ew.operand[e];
                /* computed in fp32, rounded once at the output (conformance 06: "only the final
                 * conversion rounds"; 02: exact integer partials) */
                x = r->ew.op_mul ? x * b : alu_f(r->ew.alu_algo, x, b);
            }
            if (r->ew.relu)
                x = fmaxf(x, 0.0f);
            if (lut) {
                rj_lut_hit hit;
                x = rj_sim_lut_eval(t->sim, x, &hit);
                if (check) {
                    int rc = lut_hazards(t, cvt, e, x_in, pre_bias, biased, &hit, &quirk);
                    if (rc)
                        return rc;
                }
            }
        }
        if (cvt->affine)
            x = (float)(((double)x + (double)cvt->offset) * ldexp(1.0, -(int)cvt->minus_exp) * (double)cvt->scale);
        /* faithful mode: what silicon emits for the quirk this lookup met (lut_hazards) */
        if (quirk == LUT_QUIRK4_DECODE)
            x = QUIRK4_VALUE;
        else if (quirk == LUT_QUIRK2_SPIKE)
            x += QUIRK2_SPIKE;
        r->vf[e] = x;
    }
    return 0;
}

static int run_int(rj_sim_task *t, dpu_run *r, uint32_t C, uint64_t n, const out_cvt *cvt, uint32_t out_prec,
                   const rj_sim_acc *acc, int32_t ow_op, const int16_t *ow_vec)
{
    for (uint64_t e = 0; e < n; e++) {
        const uint32_t c = (uint32_t)(e % C);
        int64_t x = r->vi[e];
        /* CPEND (DPU_BS_OW_CFG.OD_BYPASS = 0): + OW_OP (signed 16) x the window sum of the CNA's
         * input, before the BS stage (notes: depthwise-conv.md "DPU_BS_OW_OP is the CPEND
         * operand": Sum xp*w + OW_OP*S + A explains every element; TRM names it CPEND). */
        if (acc && acc->wsum) {
            const uint64_t p = e / C;
            if (c < acc->channels)
                x += (ow_vec ? (int64_t)ow_vec[c] : (int64_t)ow_op) *
                     acc->wsum[acc->wsum_per_channel ? p * acc->channels + c : p];
        }
        const sdp_stage *st[2] = {&r->bs, &r->bn};
        for (int k = 0; k < 2; k++) {
            const sdp_stage *s = st[k];
            if (!s->active)
                continue;
            /* BS: ALU then MUL; BN: MUL then ALU (parse_stage). */
            const int alu_first = k == 0;
            if (s->alu && alu_first)
                x = alu_i(s->alu_algo, x, s->alu_vec ? (int64_t)s->alu_vec[c] : s->alu_i);
            if (s->mul) {
                /* The product is held wide under a shift, rounded half to even, then saturated
                 * to int32; at shift 0 it saturates directly (out-cvt-converter.md, BS per-channel
                 * multiplier sweep; the register operand and BN are inferences). */
                const int64_t p = x * (s->mul_vec ? (int64_t)s->mul_vec[c] : s->mul_i);
                x = sat(round_shift(p, p >= 0 ? s->mul_shift : s->mul_shift_neg, 0), INT32_MIN, INT32_MAX);
            }
            if (s->alu && !alu_first)
                x = alu_i(s->alu_algo, x, s->alu_vec ? (int64_t)s->alu_vec[c] : s->alu_i);
            if (s->relu && x < 0)
                x = 0;
        }
        /* OUT_CVT integer form (parse_out_cvt): round((x * SCALE) >> SHIFT) + OFFSET. */
        x = round_shift(x * (int64_t)cvt->scale_i, cvt->shift, cvt->round_away) + (int64_t)cvt->offset;
        switch (out_prec) {
        /* Saturation to the output type: documented for int8 (out-cvt-converter.md, "saturation
         * comes after the offset") and int4's int16 output (tile-layouts.md); for int32 an
         * inference. */
        case RJ_PREC_INT32: x = sat(x, INT32_MIN, INT32_MAX); break;
        case RJ_PREC_INT16: x = sat(x, INT16_MIN, INT16_MAX); break;
        case RJ_PREC_INT8: x = sat(x, INT8_MIN, INT8_MAX); break;
        case RJ_PREC_FP16:
            /* fp16 of the integer accumulator: "range-limited |acc| <= 2048" (out-cvt-converter.md);
             * beyond it silicon's value is not documented. */
            if (strict(t) && (x > 2048 || x < -2048))
                return rj_sim_hazard(t, "DPU_DATA_FORMAT", "fp16 output of an integer accumulator",
                                     "element %llu is %lld after OUT_CVT; the integer path's fp16 writer is "
                                     "documented only for |value| <= 2048 (notes: "
                                     "encodings/out-cvt-converter.md)", (unsigned long long)e, (long long)x);
            break;
        default: break;
        }
        r->vi[e] = x;
    }
    return 0;
}

int rj_sim_dpu_run(rj_sim_task *t, const rj_sim_acc *acc)
{
    rj_sim *sim = t->sim;
    const int flying = acc == NULL;
    uint32_t fmc, fmt, wreg, hreg, creg, dst, sstride, owcfg, notch;
    RJ_SIM_REQUIRE(t, DPU_FEATURE_MODE_CFG, &fmc);
    RJ_SIM_REQUIRE(t, DPU_DATA_FORMAT, &fmt);
    RJ_SIM_REQUIRE(t, DPU_DATA_CUBE_WIDTH, &wreg);
    RJ_SIM_REQUIRE(t, DPU_DATA_CUBE_HEIGHT, &hreg);
    RJ_SIM_REQUIRE(t, DPU_DATA_CUBE_CHANNEL, &creg);
    RJ_SIM_REQUIRE(t, DPU_DST_BASE_ADDR, &dst);
    RJ_SIM_REQUIRE(t, DPU_DST_SURF_STRIDE, &sstride);
    RJ_SIM_REQUIRE(t, DPU_BS_OW_CFG, &owcfg);
    notch = rj_sim_reg(sim, RJ_REG_DPU_DATA_CUBE_NOTCH_ADDR);

    /* Cube sizes are stored minus one (conformance 01/05: width 0 = 1 column). */
    const uint32_t W = RJ_GET(wreg, DPU_DATA_CUBE_WIDTH, WIDTH) + 1u;
    const uint32_t H = RJ_GET(hreg, DPU_DATA_CUBE_HEIGHT, HEIGHT) + 1u;
    const uint32_t C = RJ_GET(creg, DPU_DATA_CUBE_CHANNEL, CHANNEL) + 1u;

    /* QUIRK 3: a cube of exactly 8191 columns (the 13-bit ceiling) corrupts ~54 tail positions
     * (notes: dpu-lut-activation.md, "do NOT ride the maximum width"). Field values 8190 and
     * 8191 (8191 and 8192 columns) both ride the ceiling. */
    if (strict(t) && W >= 8191u)
        return rj_sim_hazard(t, "DPU_DATA_CUBE_WIDTH", "QUIRK 3 (13-bit max width)",
                             "width field %u (%u columns) rides the 13-bit maximum; the hardware corrupts "
                             "a tail of ~54 cube positions. Tile the cube well under it, e.g. 4096 "
                             "columns (notes: encodings/dpu-lut-activation.md)", W - 1u, W);

    /* DPU_FEATURE_MODE_CFG: every documented program uses OUTPUT_MODE = 2 (write to memory);
     * FLYING_MODE picks the source (notes: mrdma-trap.md, dpu-lut-activation.md). */
    if (RJ_GET(fmc, DPU_FEATURE_MODE_CFG, OUTPUT_MODE) != 2 || RJ_GET(fmc, DPU_FEATURE_MODE_CFG, TP_EN) ||
        RJ_GET(fmc, DPU_FEATURE_MODE_CFG, COMB_USE) || RJ_GET(fmc, DPU_FEATURE_MODE_CFG, NONALIGN) ||
        RJ_GET(fmc, DPU_FEATURE_MODE_CFG, RGP_TYPE))
        return UNSUPP(t, "DPU_FEATURE_MODE_CFG = 0x%x: only OUTPUT_MODE = 2 (write to memory) without "
                      "TP_EN / COMB_USE / NONALIGN / RGP_TYPE is modelled", fmc);
    if (RJ_GET(fmc, DPU_FEATURE_MODE_CFG, FLYING_MODE) != (uint32_t)flying)
        return UNSUPP(t, "DPU_FEATURE_MODE_CFG = 0x%x: FLYING_MODE = %u but the DPU's source is %s; "
                      "FLYING_MODE = 1 means the source comes from DPU_RDMA (no CNA/CORE in the enable "
                      "mask), 0 means the CORE accumulator", fmc,
                      RJ_GET(fmc, DPU_FEATURE_MODE_CFG, FLYING_MODE),
                      flying ? "DPU_RDMA (no CNA/CORE ran)" : "the CORE accumulator");
    if (RJ_GET(fmt, DPU_DATA_FORMAT, EW_TRUNCATE_NEG) || RJ_GET(fmt, DPU_DATA_FORMAT, MC_SURF_OUT))
        return UNSUPP(t, "DPU_DATA_FORMAT = 0x%x: EW_TRUNCATE_NEG and MC_SURF_OUT are not modelled", fmt);
    if (notch)
        return UNSUPP(t, "DPU_DATA_CUBE_NOTCH_ADDR = 0x%x: a nonzero line/surface notch is not modelled", notch);
    if (RJ_GET(owcfg, DPU_BS_OW_CFG, TP_ORG_EN))
        return UNSUPP(t, "DPU_BS_OW_CFG = 0x%x: TP_ORG_EN (the transposed int16 writer, "
                      "encodings/output-transpose-int16.md) is not modelled", owcfg);

    const uint32_t proc = RJ_GET(fmt, DPU_DATA_FORMAT, PROC_PRECISION);
    const uint32_t out_prec = RJ_GET(fmt, DPU_DATA_FORMAT, OUT_PRECISION);
    const int int_path = flying ? 0 : acc->is_int;
    int32_t ow_op = 0; /* CPEND operand, when OD_BYPASS = 0 on the integer path */
    int ow_src = 0;    /* CPEND operand per channel from the BRDMA group (OW_SRC = 1) */
    /* Precision values (notes: precision-field.md): float accumulators come from fp16 (2), bf16
     * (3) or tf32 (DPU 5) processing, int32 accumulators from int8 (0) or int4 (6). */
    if (int_path) {
        if (proc == RJ_PREC_INT16) {
            if (strict(t))
                return rj_sim_hazard(t, "DPU_DATA_FORMAT", "no native int16 output",
                                     "PROC_PRECISION = 1 (int16): the int16 conv's writer emits only one int32 "
                                     "tile; use int8 byte decomposition (notes: "
                                     "encodings/output-transpose-int16.md)");
            return UNSUPP(t, "DPU_DATA_FORMAT = 0x%x: the int16 output writer is not modelled", fmt);
        }
        if (proc != RJ_PREC_INT8 && proc != RJ_PREC_INT4)
            return UNSUPP(t, "DPU_DATA_FORMAT = 0x%x: PROC_PRECISION = %u does not match the integer "
                          "accumulator the CORE produced (int8 = 0, int4 = 6)", fmt, proc);
        if (out_prec != RJ_PREC_INT32 && out_prec != RJ_PREC_INT16 && out_prec != RJ_PREC_INT8 &&
            out_prec != RJ_PREC_FP32 && out_prec != RJ_PREC_FP16)
            return UNSUPP(t, "DPU_DATA_FORMAT = 0x%x: OUT_PRECISION = %u on the integer path is not modelled "
                          "(int32 = 4, int16 = 1, int8 = 0, fp32 = 5, fp16 = 2 are)", fmt, out_prec);
        uint32_t e0 = RJ_GET(owcfg, DPU_BS_OW_CFG, SIZE_E_0), e1 = RJ_GET(owcfg, DPU_BS_OW_CFG, SIZE_E_1),
                 e2 = RJ_GET(owcfg, DPU_BS_OW_CFG, SIZE_E_2);
        if (out_prec == RJ_PREC_FP16) {
            /* fp16 of the int32 accumulator: writer geometry size_e = 3, C2 = 8, correct "for small
             * single-tile shapes only (wrong or strided values at 64x128x64)" (notes:
             * out-cvt-converter.md). Strict mode takes one output surface (C <= 8) as the small
             * shape -- an inference: the notes give no boundary. */
            if (strict(t) && (e0 != 3 || e1 != 3 || e2 != 3))
                return rj_sim_hazard(t, "DPU_BS_OW_CFG", "size_e integer-output quirk",
                                     "SIZE_E = %u/%u/%u for the fp16 output of an integer accumulator; its "
                                     "documented writer geometry is size_e = 3 (notes: "
                                     "encodings/out-cvt-converter.md)", e0, e1, e2);
            if (strict(t) && C > 8u)
                return rj_sim_hazard(t, "DPU_DATA_CUBE_CHANNEL", "fp16 output of an integer accumulator",
                                     "%u channels: the integer path's fp16 writer is correct only for small "
                                     "single-tile shapes (wrong or strided values at 64x128x64); keep one "
                                     "output surface (<= 8 channels) or write int32/fp32 (notes: "
                                     "encodings/out-cvt-converter.md)", C);
        } else if (out_prec != RJ_PREC_INT8) {
            /* Integer-path outputs stride as size_e = 7 whatever their width; another value leaves
             * surfaces unwritten (notes: encodings/size-e-quirk.md; out-cvt-converter.md table: fp32
             * cast of the int32 accumulator also uses 7). Not documented for int8 outputs. */
            if (strict(t) && (e0 != 7 || e1 != 7 || e2 != 7))
                return rj_sim_hazard(t, "DPU_BS_OW_CFG", "size_e integer-output quirk",
                                     "SIZE_E = %u/%u/%u for an integer-path output (OUT_PRECISION %u); the "
                                     "hardware strides integer outputs as size_e = 7 and leaves surfaces "
                                     "unwritten otherwise. Set SIZE_E_0..2 = 7 (notes: "
                                     "encodings/size-e-quirk.md)", e0, e1, e2, out_prec);
        }
        if (!RJ_GET(owcfg, DPU_BS_OW_CFG, OD_BYPASS)) {
            /* CPEND is documented on the int8-output writers (direct and depthwise, Mesa's requant
             * programs); on the int32-raw writer "clearing OD_BYPASS to reach CPEND makes every
             * value wrong" (notes: depthwise-conv.md). OW_SRC = 1 reads a per-channel operand
             * through BRDMA (out-cvt-converter.md), not modelled. */
            /* OW_SRC = 1: the operand is B[c] of BRDMA's DATA_USE 7 group, "(acc + A + B[c]*S) * C"
             * (out-cvt-converter.md "Per-channel (per-axis) requant on the BS multiplier"); checked
             * against the BS stage's read below. */
            ow_src = (int)RJ_GET(owcfg, DPU_BS_OW_CFG, OW_SRC);
            if (!ow_src) {
                uint32_t op;
                RJ_SIM_REQUIRE(t, DPU_BS_OW_OP, &op);
                /* OW_OP is read as signed 16-bit ("a read of the low byte alone, or as unsigned, does
                 * not match", depthwise-conv.md). */
                ow_op = (int16_t)(RJ_GET(op, DPU_BS_OW_OP, OW_OP) & 0xffffu);
            }
            if (!acc->wsum)
                return rj_sim_fail(t, RJ_EINVAL, "DPU: CPEND needs the CNA's window sums, which the CORE "
                                   "did not hand over");
            if (acc->clip_truncate && (ow_op || ow_src))
                return UNSUPP(t, "DPU_BS_OW_OP = %d with CORE_CLIP_TRUNCATE = %u: whether CPEND's window "
                              "sum is scaled by the accumulator's rounding shift is not documented",
                              ow_op, acc->clip_truncate);
            if (out_prec != RJ_PREC_INT8) {
                if (strict(t))
                    return rj_sim_hazard(t, "DPU_BS_OW_CFG", "CPEND on the int32-raw writer",
                                         "OD_BYPASS = 0 with OUT_PRECISION %u: on the raw integer writer "
                                         "CPEND makes every value wrong on hardware; set OD_BYPASS = 1, or "
                                         "write int8 (notes: depthwise-conv.md)", out_prec);
                return UNSUPP(t, "DPU_BS_OW_CFG = 0x%x: OD_BYPASS = 0 with a non-int8 integer output: what "
                              "the hardware writes is not documented (notes: depthwise-conv.md)", owcfg);
            }
        }
    } else {
        if (proc != RJ_PREC_FP16 && proc != RJ_PREC_BF16 && proc != RJ_PREC_FP32)
            return UNSUPP(t, "DPU_DATA_FORMAT = 0x%x: PROC_PRECISION = %u does not match a float source "
                          "(fp16 = 2, bf16 = 3, fp32 = 5)", fmt, proc);
        if (out_prec != RJ_PREC_FP16 && out_prec != RJ_PREC_FP32)
            return UNSUPP(t, "DPU_DATA_FORMAT = 0x%x: OUT_PRECISION = %u on the float path is not modelled "
                          "(fp16 = 2, fp32 = 5 are)", fmt, out_prec);
        /* OD_BYPASS/OW_OP: conformance 09 (fp16 depthwise, hardware-bit-exact) runs with
         * OD_BYPASS = 0 and OW_OP = 0x80, so they do not alter float results (inference). */
    }
    if (!flying) {
        if (acc->width != W || acc->height != H || acc->channels > C)
            return rj_sim_fail(t, RJ_EINVAL,
                            "DPU_DATA_CUBE_WIDTH/HEIGHT/CHANNEL give a %ux%ux%u cube but the CORE produced "
                            "%ux%ux%u; make the DPU cube match CORE_DATAOUT_SIZE_0/1",
                            W, H, C, acc->width, acc->height, acc->channels);
        if (int_path ? !acc->i : !acc->f)
            return rj_sim_fail(t, RJ_EINVAL, "DPU: the CORE handed over no %s accumulator",
                            int_path ? "int32" : "fp32");
    }
    /* Any DPU_RDMA read has to see the same cube (DPU_RDMA_RDMA_DATA_CUBE_*, conformance 02/05/06). */
    if (t->enable_mask & RJ_SIM_EN_DPU_RDMA) {
        uint32_t rw, rh, rc_;
        RJ_SIM_REQUIRE(t, DPU_RDMA_RDMA_DATA_CUBE_WIDTH, &rw);
        RJ_SIM_REQUIRE(t, DPU_RDMA_RDMA_DATA_CUBE_HEIGHT, &rh);
        RJ_SIM_REQUIRE(t, DPU_RDMA_RDMA_DATA_CUBE_CHANNEL, &rc_);
        uint32_t RW = RJ_GET(rw, DPU_RDMA_RDMA_DATA_CUBE_WIDTH, WIDTH) + 1u;
        uint32_t RH = RJ_GET(rh, DPU_RDMA_RDMA_DATA_CUBE_HEIGHT, HEIGHT) + 1u;
        uint32_t RC = RJ_GET(rc_, DPU_RDMA_RDMA_DATA_CUBE_CHANNEL, CHANNEL) + 1u;
        if (strict(t) && RW >= 8191u)
            return rj_sim_hazard(t, "DPU_RDMA_RDMA_DATA_CUBE_WIDTH", "QUIRK 3 (13-bit max width)",
                                 "width field %u rides the 13-bit maximum (notes: "
                                 "encodings/dpu-lut-activation.md)", RW - 1u);
        if (RW != W || RH != H || RC != C)
            return UNSUPP(t, "DPU_RDMA_RDMA_DATA_CUBE_* give %ux%ux%u but DPU_DATA_CUBE_* give %ux%ux%u: "
                          "mismatched read/write cubes are not modelled", RW, RH, RC, W, H, C);
    } else if (flying) {
        return UNSUPP(t, "the DPU runs without CNA/CORE (mask 0x%x) and without DPU_RDMA (bit 4): it has no "
                      "source data. A flying DPU job uses mask 0x18 (notes: dpu-lut-activation.md)",
                      t->enable_mask);
    }

    const uint32_t esize = rj_sim_dpu_out_esize(out_prec);
    const uint64_t P = (uint64_t)W * H, n = P * C;
    const uint32_t c2 = 16u / esize, nsurf = (C + c2 - 1u) / c2;
    const uint64_t surf_stride = sstride & ~0xfu; /* DST_SURF_STRIDE, bits 31..4, in bytes */
    if (nsurf > 1 && surf_stride < P * 16u)
        return UNSUPP(t, "DPU_DST_SURF_STRIDE = 0x%x is smaller than one surface (%llu bytes = W*H*16): "
                      "overlapping output surfaces are not modelled", sstride, (unsigned long long)(P * 16u));

    dpu_run r;
    memset(&r, 0, sizeof r);
    out_cvt cvt;
    int rc = parse_stage(t, &BS_REGS, "BS", int_path, C, &r.bs);
    if (!rc)
        rc = parse_stage(t, &BN_REGS, "BN", int_path, C, &r.bn);
    if (!rc && ow_src && !r.bs.ow_vec)
        rc = UNSUPP(t, "DPU_BS_OW_CFG.OW_SRC = 1 reads the CPEND operand B from BRDMA's DATA_USE 7 group, but "
                    "the BS stage does not read that group (set BRDMA_DATA_USE 7 with BS_ALU_SRC = 1 and "
                    "BS_MUL_SRC = 1; notes: encodings/out-cvt-converter.md)");
    if (!rc)
        rc = parse_out_cvt(t, int_path, out_prec, &cvt);
    if (!rc)
        rc = parse_ew(t, int_path, flying, W, H, C, &r.ew);
    if (!rc && r.ew.active && r.ew.lut) {
        if (int_path)
            rc = UNSUPP(t, "DPU_EW_CFG: the LUT on the integer path is not modelled");
        else
            rc = rj_sim_lut_validate(t);
    }
    if (rc) {
        run_free(&r);
        return rc;
    }

    /* A float accumulator that no stage changes (every stage bypassed, identity OUT_CVT, as in a
     * plain matmul) goes to the writer as it is: run_float would copy it and return every value
     * unchanged. */
    if (!int_path && !flying && !r.bs.active && !r.bn.active && !r.ew.active && !cvt.affine &&
        acc->channels == C) {
        rj_dpu_out o = {W, H, C, out_prec, esize, dst, surf_stride};
        rc = rj_sim_dpu_write(t, &o, acc->f, NULL);
        run_free(&r);
        return rc;
    }

    /* The source cube, in [(h*W + w)*C + c] order. */
    if (int_path) {
        r.vi = calloc((size_t)n, sizeof(int64_t));
        if (!r.vi)
            rc = rj_sim_fail(t, RJ_ENOMEM, "DPU: out of memory for a %llu-element cube", (unsigned long long)n);
        else
            for (uint64_t p = 0; p < P; p++)
                for (uint32_t c = 0; c < acc->channels; c++)
                    r.vi[p * C + c] = acc->i[p * acc->channels + c];
    } else {
        r.vf = calloc((size_t)n, sizeof(float));
        if (!r.vf)
            rc = rj_sim_fail(t, RJ_ENOMEM, "DPU: out of memory for a %llu-element cube", (unsigned long long)n);
        else if (flying)
            rc = read_flying_source(t, W, H, C, r.vf);
        else
            /* Channels the CORE did not produce (a DPU cube wider than the accumulator) read 0,
             * the value of an all-zero kernel (inference). */
            for (uint64_t p = 0; p < P; p++)
                for (uint32_t c = 0; c < acc->channels; c++)
                    r.vf[p * C + c] = acc->f[p * acc->channels + c];
    }
    if (!rc)
        rc = int_path ? run_int(t, &r, C, n, &cvt, out_prec, acc, ow_op, ow_src ? r.bs.ow_vec : NULL) : run_float(t, &r, n, &cvt);
    if (!rc) {
        float *vf = r.vf;
        if (int_path && (out_prec == RJ_PREC_FP32 || out_prec == RJ_PREC_FP16)) {
            /* fp32 output of the int32 accumulator: a plain cast (notes: out-cvt-converter.md,
             * "bit-exact cast of the int32 acc"); fp16: the writer rounds to nearest even (exact
             * inside the documented |value| <= 2048). */
            vf = malloc((size_t)n * sizeof(float));
            if (!vf)
                rc = rj_sim_fail(t, RJ_ENOMEM, "DPU: out of memory");
            else
                for (uint64_t e = 0; e < n; e++)
                    vf[e] = (float)r.vi[e];
        }
        if (!rc) {
            rj_dpu_out o = {W, H, C, out_prec, esize, dst, surf_stride};
            rc = rj_sim_dpu_write(t, &o, vf, r.vi);
        }
        if (vf != r.vf)
            free(vf);
    }
    run_free(&r);
    return rc;
}
