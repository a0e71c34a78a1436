/* PPU + PPU_RDMA: the pooling engine (the NVDLA PDP analogue).
 *
 * Sources: notes encodings/ppu-pooling.md (program, layouts, reciprocal format, padding
 * semantics), encodings/ppu-reduce-mean.md (MIN method), perf/ppu-pooling-not-detile.md, and
 * the PPU / PPU_RDMA fields of rk3588-registers.xml. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_internal.h"


#define UNSUPP(t, ...) rj_sim_fail((t), RJ_EUNSUPP, __VA_ARGS__)

enum { POOL_AVG = 0, POOL_MAX = 1, POOL_MIN = 2 };
#define PREC_INT8 0u
#define PREC_FP16 2u

/* A pooling job is PPU + PPU_RDMA together (enable mask 0x60, notes: ppu-pooling.md); precision
 * must be fp16: the PPU has no int8 mode and reads int8 bytes as fp16 garbage (same page,
 * "no native int8 PPU precision"). */
static int check_precision(rj_sim_task *t, const char *reg, uint32_t value, uint32_t prec)
{
    if (prec == PREC_FP16)
        return 0;
    if (prec == PREC_INT8 && (t->sim->flags & RJ_SIM_STRICT))
        return rj_sim_hazard(t, reg, "no int8 pooling",
                             "value 0x%x selects int8 (0); the PPU reads the bytes as fp16 and emits "
                             "garbage. Pool int8 data as fp16 (every int8 value is exact in fp16) "
                             "(notes: encodings/ppu-pooling.md)", value);
    return UNSUPP(t, "%s = 0x%x: precision %u is not modelled; the PPU pools fp16 (2) only "
                  "(notes: encodings/ppu-pooling.md)", reg, value, prec);
}

static float f16_reg(uint32_t v) { return rj_f16_to_f32((uint16_t)(v & 0xffffu)); }

int rj_sim_ppu_run(rj_sim_task *t)
{
    rj_sim *sim = t->sim;
    const uint32_t both = RJ_SIM_EN_PPU | RJ_SIM_EN_PPU_RDMA;
    if ((t->enable_mask & both) != both)
        return UNSUPP(t, "PC_OPERATION_ENABLE mask 0x%x fires only one of PPU (bit 5) / PPU_RDMA (bit 6); "
                      "a pooling job fires both (0x60) (notes: encodings/ppu-pooling.md)", t->enable_mask);

    uint32_t iw, ih, ic, ow, oh, oc, mode, kcfg, pcfg, dst, dstride, fmt, misc;
    uint32_t rw, rh, rc_, src, lstride, sstride, rfmt;
    RJ_SIM_REQUIRE(t, PPU_DATA_CUBE_IN_WIDTH, &iw);
    RJ_SIM_REQUIRE(t, PPU_DATA_CUBE_IN_HEIGHT, &ih);
    RJ_SIM_REQUIRE(t, PPU_DATA_CUBE_IN_CHANNEL, &ic);
    RJ_SIM_REQUIRE(t, PPU_DATA_CUBE_OUT_WIDTH, &ow);
    RJ_SIM_REQUIRE(t, PPU_DATA_CUBE_OUT_HEIGHT, &oh);
    RJ_SIM_REQUIRE(t, PPU_DATA_CUBE_OUT_CHANNEL, &oc);
    RJ_SIM_REQUIRE(t, PPU_OPERATION_MODE_CFG, &mode);
    RJ_SIM_REQUIRE(t, PPU_POOLING_KERNEL_CFG, &kcfg);
    RJ_SIM_REQUIRE(t, PPU_POOLING_PADDING_CFG, &pcfg);
    RJ_SIM_REQUIRE(t, PPU_DST_BASE_ADDR, &dst);
    RJ_SIM_REQUIRE(t, PPU_DST_SURF_STRIDE, &dstride);
    RJ_SIM_REQUIRE(t, PPU_DATA_FORMAT, &fmt);
    misc = rj_sim_reg(sim, RJ_REG_PPU_MISC_CTRL);
    RJ_SIM_REQUIRE(t, PPU_RDMA_RDMA_CUBE_IN_WIDTH, &rw);
    RJ_SIM_REQUIRE(t, PPU_RDMA_RDMA_CUBE_IN_HEIGHT, &rh);
    RJ_SIM_REQUIRE(t, PPU_RDMA_RDMA_CUBE_IN_CHANNEL, &rc_);
    RJ_SIM_REQUIRE(t, PPU_RDMA_RDMA_SRC_BASE_ADDR, &src);
    RJ_SIM_REQUIRE(t, PPU_RDMA_RDMA_SRC_LINE_STRIDE, &lstride);
    RJ_SIM_REQUIRE(t, PPU_RDMA_RDMA_SRC_SURF_STRIDE, &sstride);
    RJ_SIM_REQUIRE(t, PPU_RDMA_RDMA_DATA_FORMAT, &rfmt);

    /* Geometry fields are stored minus one; pad counts are not (notes: ppu-pooling.md). */
    const uint32_t IW = RJ_GET(iw, PPU_DATA_CUBE_IN_WIDTH, CUBE_IN_WIDTH) + 1u;
    const uint32_t IH = RJ_GET(ih, PPU_DATA_CUBE_IN_HEIGHT, CUBE_IN_HEIGHT) + 1u;
    const uint32_t C = RJ_GET(ic, PPU_DATA_CUBE_IN_CHANNEL, CUBE_IN_CHANNEL) + 1u;
    const uint32_t OW = RJ_GET(ow, PPU_DATA_CUBE_OUT_WIDTH, CUBE_OUT_WIDTH) + 1u;
    const uint32_t OH = RJ_GET(oh, PPU_DATA_CUBE_OUT_HEIGHT, CUBE_OUT_HEIGHT) + 1u;
    const uint32_t OC = RJ_GET(oc, PPU_DATA_CUBE_OUT_CHANNEL, CUBE_OUT_CHANNEL) + 1u;
    const uint32_t KW = RJ_GET(kcfg, PPU_POOLING_KERNEL_CFG, KERNEL_WIDTH) + 1u;
    const uint32_t KH = RJ_GET(kcfg, PPU_POOLING_KERNEL_CFG, KERNEL_HEIGHT) + 1u;
    const uint32_t SX = RJ_GET(kcfg, PPU_POOLING_KERNEL_CFG, KERNEL_STRIDE_WIDTH) + 1u;
    const uint32_t SY = RJ_GET(kcfg, PPU_POOLING_KERNEL_CFG, KERNEL_STRIDE_HEIGHT) + 1u;
    const uint32_t PL = RJ_GET(pcfg, PPU_POOLING_PADDING_CFG, PAD_LEFT);
    const uint32_t PT = RJ_GET(pcfg, PPU_POOLING_PADDING_CFG, PAD_TOP);
    const uint32_t PR = RJ_GET(pcfg, PPU_POOLING_PADDING_CFG, PAD_RIGHT);
    const uint32_t PB = RJ_GET(pcfg, PPU_POOLING_PADDING_CFG, PAD_BOTTOM);
    const uint32_t method = RJ_GET(mode, PPU_OPERATION_MODE_CFG, POOLING_METHOD);

    /* OPERATION_MODE_CFG: a standalone pool has FLYING_MODE = 1 with PPU_RDMA feeding it and
     * DATA_FORMAT.DPU_FLYIN = 0 (notes: ppu-pooling.md, "Flying vs standalone"). Methods:
     * 0 = average, 1 = max (ppu-pooling.md), 2 = min (ppu-reduce-mean.md). */
    if (!RJ_GET(mode, PPU_OPERATION_MODE_CFG, FLYING_MODE) || RJ_GET(mode, PPU_OPERATION_MODE_CFG, INDEX_EN) ||
        RJ_GET(mode, PPU_OPERATION_MODE_CFG, USE_CNT) || RJ_GET(mode, PPU_OPERATION_MODE_CFG, NOTCH_ADDR))
        return UNSUPP(t, "PPU_OPERATION_MODE_CFG = 0x%x: only FLYING_MODE = 1 (fed by PPU_RDMA) without "
                      "INDEX_EN / USE_CNT / NOTCH_ADDR is modelled (notes: encodings/ppu-pooling.md)", mode);
    if (method > POOL_MIN)
        return UNSUPP(t, "PPU_OPERATION_MODE_CFG = 0x%x: POOLING_METHOD = %u is not modelled (0 average, "
                      "1 max, 2 min)", mode, method);
    if (RJ_GET(fmt, PPU_DATA_FORMAT, DPU_FLYIN))
        return UNSUPP(t, "PPU_DATA_FORMAT = 0x%x: DPU_FLYIN = 1 (pooling fed directly by the DPU) is not "
                      "modelled; write the DPU output to memory and pool it with PPU_RDMA", fmt);
    int rc = check_precision(t, "PPU_DATA_FORMAT", fmt, RJ_GET(fmt, PPU_DATA_FORMAT, PROC_PRECISION));
    if (!rc)
        rc = check_precision(t, "PPU_RDMA_RDMA_DATA_FORMAT", rfmt,
                             RJ_GET(rfmt, PPU_RDMA_RDMA_DATA_FORMAT, IN_PRECISION));
    if (rc)
        return rc;
    if (RJ_GET(misc, PPU_MISC_CTRL, MC_SURF_OUT) || RJ_GET(misc, PPU_MISC_CTRL, NONALIGN))
        return UNSUPP(t, "PPU_MISC_CTRL = 0x%x: MC_SURF_OUT / NONALIGN are not modelled", misc);
    {
        uint32_t RW = RJ_GET(rw, PPU_RDMA_RDMA_CUBE_IN_WIDTH, CUBE_IN_WIDTH) + 1u;
        uint32_t RH = RJ_GET(rh, PPU_RDMA_RDMA_CUBE_IN_HEIGHT, CUBE_IN_HEIGHT) + 1u;
        uint32_t RC = RJ_GET(rc_, PPU_RDMA_RDMA_CUBE_IN_CHANNEL, CUBE_IN_CHANNEL) + 1u;
        if (RW != IW || RH != IH || RC != C)
            return UNSUPP(t, "PPU_RDMA_RDMA_CUBE_IN_* give %ux%ux%u but PPU_DATA_CUBE_IN_* give %ux%ux%u: the "
                          "read and pool cubes must match", RW, RH, RC, IW, IH, C);
    }
    if (OC != C)
        return UNSUPP(t, "PPU_DATA_CUBE_OUT_CHANNEL = %u but the input has %u channels: the PPU pools "
                      "each channel on its own (notes: encodings/feature-reduce.md)", OC, C);
    if ((uint64_t)(OW - 1u) * SX + KW > (uint64_t)IW + PL + PR ||
        (uint64_t)(OH - 1u) * SY + KH > (uint64_t)IH + PT + PB)
        return UNSUPP(t, "PPU: an output of %ux%u with kernel %ux%u, stride %ux%u reaches past the padded "
                      "%ux%u input (pads L%u T%u R%u B%u); windows outside the padded input are not "
                      "modelled", OW, OH, KW, KH, SX, SY, IW, IH, PL, PT, PR, PB);

    /* Padded positions read PADDING_VALUE_1_CFG as an fp16 pattern in its low half: 0 for
     * average, 0xFC00 = -inf for max (notes: ppu-pooling.md); reading the low 16 bits is an
     * inference from those two values. */
    float pad_value = 0.0f;
    if (PL | PT | PR | PB) {
        uint32_t pv1, pv2;
        RJ_SIM_REQUIRE(t, PPU_PADDING_VALUE_1_CFG, &pv1);
        pv2 = rj_sim_reg(sim, RJ_REG_PPU_PADDING_VALUE_2_CFG);
        if ((pv1 >> 16) != 0 || pv2 != 0)
            return UNSUPP(t, "PPU_PADDING_VALUE_1_CFG = 0x%x, PADDING_VALUE_2_CFG = 0x%x: only an fp16 pad "
                          "value in the low half of PADDING_VALUE_1_CFG is modelled", pv1, pv2);
        pad_value = f16_reg(pv1);
    }
    /* Average: no divider; the window sum is multiplied by two per-axis fp16 reciprocals holding
     * 65536/k, then by 2^-32 (notes: ppu-pooling.md, "Average reciprocal"). The registers are used
     * as written, so a reciprocal that does not match the kernel scales the result accordingly. */
    double recip = 0.0;
    if (method == POOL_AVG) {
        uint32_t rcw, rch;
        RJ_SIM_REQUIRE(t, PPU_RECIP_KERNEL_WIDTH, &rcw);
        RJ_SIM_REQUIRE(t, PPU_RECIP_KERNEL_HEIGHT, &rch);
        rcw = RJ_GET(rcw, PPU_RECIP_KERNEL_WIDTH, RECIP_KERNEL_WIDTH);
        rch = RJ_GET(rch, PPU_RECIP_KERNEL_HEIGHT, RECIP_KERNEL_HEIGHT);
        float fw = f16_reg(rcw), fh = f16_reg(rch);
        if ((rcw >> 16) || (rch >> 16) || !isfinite(fw) || !isfinite(fh))
            return UNSUPP(t, "PPU_RECIP_KERNEL_WIDTH/HEIGHT = 0x%x/0x%x: the reciprocals must be finite fp16 "
                          "patterns of 65536/k; k = 1 overflows fp16, so an average over a kernel axis of 1 "
                          "cannot be expressed (notes: encodings/ppu-pooling.md)", rcw, rch);
        recip = (double)fw * (double)fh * ldexp(1.0, -32);
    }

    /* Cubes: the conv feature layout, 8 fp16 channels per 16-byte atom; the input rows are
     * SRC_LINE_STRIDE apart and surfaces SRC_SURF_STRIDE apart; the output is dense, rows
     * OW*16 bytes apart and surfaces DST_SURF_STRIDE apart (notes: ppu-pooling.md program table,
     * "DST_SURF_STRIDE = oh*ow*C2*2"; conformance 07/08 byte formulas). Addresses use bits 31..4
     * (DST_BASE_ADDR, strides: rk3588-registers.xml). */
    const uint64_t line = lstride & ~0xfu, ssurf = sstride & ~0xfu, dsurf = dstride & ~0xfu;
    const uint64_t obase = dst & ~0xfu;
    const uint32_t nsurf = (C + 7u) / 8u;
    const uint64_t in_bytes = (uint64_t)(IH - 1u) * line + (uint64_t)IW * 16u;
    const uint64_t out_bytes = (uint64_t)OW * OH * 16u;
    if (line < (uint64_t)IW * 16u || (nsurf > 1 && (ssurf < in_bytes || dsurf < out_bytes)))
        return UNSUPP(t, "PPU strides (SRC_LINE_STRIDE 0x%x, SRC_SURF_STRIDE 0x%x, DST_SURF_STRIDE 0x%x) "
                      "overlap rows or surfaces of the %ux%u input / %ux%u output cubes",
                      lstride, sstride, dstride, IW, IH, OW, OH);
    for (uint32_t s = 0; s < nsurf; s++) {
        const uint8_t *in = rj_sim_mem(t, (uint64_t)src + s * ssurf, in_bytes, "PPU_RDMA_RDMA_SRC_BASE_ADDR");
        if (!in)
            return t->err ? t->err->code : RJ_EFAULT;
        uint8_t *out = rj_sim_mem(t, obase + s * dsurf, out_bytes, "PPU_DST_BASE_ADDR");
        if (!out)
            return t->err ? t->err->code : RJ_EFAULT;
        const uint32_t lanes = (s + 1u) * 8u <= C ? 8u : C - s * 8u;
        for (uint32_t oy = 0; oy < OH; oy++)
            for (uint32_t ox = 0; ox < OW; ox++)
                for (uint32_t l = 0; l < lanes; l++) {
                    double acc = method == POOL_MAX ? -INFINITY : method == POOL_MIN ? INFINITY : 0.0;
                    for (uint32_t ky = 0; ky < KH; ky++)
                        for (uint32_t kx = 0; kx < KW; kx++) {
                            int64_t y = (int64_t)oy * SY + ky - PT, x = (int64_t)ox * SX + kx - PL;
                            float v = pad_value;
                            if (y >= 0 && y < IH && x >= 0 && x < IW) {
                                uint16_t h;
                                memcpy(&h, in + (uint64_t)y * line + (uint64_t)x * 16u + l * 2u, 2);
                                v = rj_f16_to_f32(h);
                            }
                            if (method == POOL_MAX)
                                acc = v > acc ? v : acc;
                            else if (method == POOL_MIN)
                                acc = v < acc ? v : acc;
                            else
                                acc += v; /* count-include-pad: pads join the sum (ppu-pooling.md) */
                        }
                    /* Max/min select an input value (bit-exact, ppu-pooling.md). The average is
                     * rounded to fp16 once, after the reciprocal multiply (inference: the
                     * hardware's internal rounding points are not documented; the notes measure
                     * <= 0.002 against the true mean). */
                    float r = method == POOL_AVG ? (float)(acc * recip) : (float)acc;
                    uint16_t h = rj_f32_to_f16(r);
                    memcpy(out + ((uint64_t)oy * OW + ox) * 16u + l * 2u, &h, 2);
                }
        sim->stats.bytes_read += in_bytes;
        sim->stats.bytes_written += out_bytes;
    }
    return 0;
}
