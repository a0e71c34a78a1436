/* CNA + CORE: feature/weight fetch from their cube layouts, the CBUF model, the convolution.
 *
 * Register semantics and their sources (facts; the code is ours):
 *  - CONV_CON1.CONV_MODE 0 = direct, 3 = depthwise, with CORE_MISC_CFG.DW_EN (notes:
 *    depthwise-conv.md). IN/PROC_PRECISION: 0 int8, 2 fp16, 3 bf16, 6 int4, 7 tf32 (notes:
 *    encodings/precision-field.md); the matmul is same-dtype only (tile-layouts.md).
 *  - Feature cube: atoms of 16 bytes = C2 channels (8 for 2-byte, 16 for int8), laid
 *    [C/C2][H][W][C2] (notes: encodings/tile-layouts.md "Feature / input cube"; conformance
 *    cases 01/03/04). LINE_STRIDE and SURF_STRIDE are decoded from Mesa's formulas
 *    (rkt_task.c: line = W*16/4, surf = line*(H/4 - 1)), which the conformance programs
 *    follow: line pitch = 4*LINE_STRIDE bytes, surface pitch = 16*(SURF_STRIDE+LINE_STRIDE)
 *    bytes (case 04: 48 -> 192 B, 72+48 -> 1920 B = 10*12*16).
 *  - Weight layouts: direct [N/GK][C/32][KH][KW][GK][32], GK = 16 (fp16/bf16) or 32 (int8);
 *    depthwise [C/G][KH][KW][G], G = 32 (fp16) or 64 (int8) (tile-layouts.md; matmul-as-conv.md
 *    nesting; depthwise-conv.md; conformance cases 01/03/04/09; Mesa rkt_coefs.c for the short
 *    last kernel group and the min(C, group) channel group).
 *  - WEIGHT_SIZE0/1/2 = total bytes / bytes per kernel / kernels x KH x KW (Mesa rkt_regcmd.c).
 *  - Strides CONV_CON3 X/Y_STRIDE (stored as the stride); PAD_CON0 top/left; the bottom/right
 *    extent follows from the output size (CORE_DATAOUT_SIZE_0, stored minus one, Mesa).
 *  - CBUF: 12 banks x 32 KB, CBUF_CON0 DATA_BANK/WEIGHT_BANK partition them; DATA_REUSE /
 *    WEIGHT_REUSE keep the previous task's operand (notes: hardware-overview.md,
 *    encodings/cbuf-reuse.md, encodings/cbuf-bank-slack.md).
 * Modelled by inference (no citable source; listed in tests/sim/README.md too):
 *  - ATROUS_X/Y_DILATION hold dilation - 1 (NVDLA's convention; 0 = no dilation as in every
 *    conformance program).
 *  - PAD_CON1.PAD_VALUE: fp16 bit pattern in bits 15..0 (bf16 likewise), int8 value in bits 7..0
 *    (Mesa writes input_zp - 0x80 in the low byte).
 *  - channels at or above DATAIN_CHANNEL_REAL read as zero.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#define RJ_CNA_SIMD 1
#endif

#include "core_mac.h"
#include "rj_sim_profile.h"
#include "sim_internal.h"

#define CBUF_BANKS 12u
#define CBUF_BANK_BYTES 32768u

enum { PREC_INT8 = 0, PREC_INT16 = 1, PREC_FP16 = 2, PREC_BF16 = 3, PREC_INT4 = 6, PREC_TF32 = 7 };

/* Everything the registers say about one conv task. */
typedef struct conv_geom {
    uint32_t prec, is_int, ebytes, c2;      /* precision, element bytes, feature atom channels */
    uint32_t int4;                          /* nibble elements: ebytes is 1, sizes halve */
    uint32_t clip_truncate;                 /* integer CACC -> DPU rounding shift */
    int depthwise;
    uint32_t W, H, C, C_real;               /* input cube */
    uint32_t OW, OH, N;                     /* output cube (N = output channels) */
    uint32_t KW, KH, kernels;               /* weights */
    uint32_t sx, sy, dx, dy, pad_l, pad_t;  /* stride, dilation, padding */
    uint32_t pad_raw;
    uint64_t faddr, line_pitch, surf_pitch, fbytes_extent;
    uint64_t waddr, wbytes, wextent;
    uint32_t data_bank, weight_bank, data_reuse, weight_reuse;
    uint32_t gk, gc;                        /* weight kernel group, channel group (effective) */
} conv_geom;

/* What the CBUF holds, unpacked once into host-friendly arrays. */
struct rj_cbuf_state {
    int feat_valid;
    conv_geom fkey;           /* geometry the feature was loaded with */
    float *feat_f;            /* [H][W][C] */
    int32_t *feat_i;
    size_t feat_cap, feat_cap_i; /* elements allocated, per buffer */

    int wt_valid;
    conv_geom wkey;
    float *wt_f;              /* direct: panels [ceil(N/16)][KH*KW*C][16]; depthwise [KH*KW][C] */
    int32_t *wt_i;            /* direct: [KH*KW*C][N]; depthwise [KH*KW][C] */
    size_t wt_cap, wt_cap_i;

    /* the last accumulator cube (kept for rj_sim_last_acc) and scratch */
    rj_sim_acc acc;
    size_t acc_cap, acc_cap_i;
    int64_t *wsum_buf;        /* CPEND window sums (acc.wsum points here when in use) */
    size_t wsum_cap;
    int32_t *col_i;           /* im2col scratch (int8 path; the float path packs directly) */
    size_t col_cap_i;

    /* The float feature operand packed for the MAC kernels (core_mac.h), derived from feat_f
     * and the tap geometry in akey. It stays valid while the CBUF keeps the same feature tile
     * (DATA_REUSE) and the geometry matches, so a tile reused across the tasks of a kick is
     * unpacked and packed once, as the hardware fetches it once. */
    int apack_valid;
    conv_geom akey;
    float *apack;
    size_t apack_cap;

    rj_sim_phase_ns prof;
};

void rj_sim_cbuf_free(struct rj_cbuf_state *cb)
{
    if (!cb)
        return;
    free(cb->feat_f);
    free(cb->feat_i);
    free(cb->wt_f);
    free(cb->wt_i);
    free(cb->acc.f);
    free(cb->acc.i);
    free(cb->wsum_buf);
    free(cb->col_i);
    free(cb->apack);
    free(cb);
}

static int grow(void **p, size_t *cap, size_t need_elems, size_t esize)
{
    if (need_elems <= *cap && *p)
        return 0;
    size_t bytes = need_elems * esize;
    bytes = (bytes + 63u) & ~(size_t)63u;
    if (bytes == 0)
        bytes = 64;
    void *n = aligned_alloc(64, bytes);
    if (!n)
        return -1;
    free(*p);
    *p = n;
    *cap = need_elems;
    return 0;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int oom(rj_sim_task *t, const char *what)
{
    return rj_fail(t->err, RJ_ENOMEM, "job %u task %u: out of host memory for the %s", t->job_index, t->task_index,
                   what);
}

/* ---- register decode ----------------------------------------------------------------- */

#define BAD(...) rj_fail(t->err, RJ_EINVAL, __VA_ARGS__)
#define UNSUPP(...) rj_fail(t->err, RJ_EUNSUPP, __VA_ARGS__)

static const char *prec_name(uint32_t p)
{
    static const char *names[8] = {"int8", "int16", "fp16", "bf16", "int32/4", "fp32/5", "int4", "tf32"};
    return names[p & 7u];
}

static int decode_geom(rj_sim_task *t, conv_geom *g)
{
    uint32_t con1, con2, con3, ds0, ds1, ds2, ds3, ws0, ws1, ws2, cb0, cvt0, fc0, pad0, pad1, faddr, dma1,
        dma2, waddr, dcomp, misc, out0, out1, clip;
    RJ_SIM_REQUIRE(t, CNA_CONV_CON1, &con1);
    RJ_SIM_REQUIRE(t, CNA_CONV_CON2, &con2);
    RJ_SIM_REQUIRE(t, CNA_CONV_CON3, &con3);
    RJ_SIM_REQUIRE(t, CNA_DATA_SIZE0, &ds0);
    RJ_SIM_REQUIRE(t, CNA_DATA_SIZE1, &ds1);
    RJ_SIM_REQUIRE(t, CNA_DATA_SIZE2, &ds2);
    RJ_SIM_REQUIRE(t, CNA_DATA_SIZE3, &ds3);
    RJ_SIM_REQUIRE(t, CNA_WEIGHT_SIZE0, &ws0);
    RJ_SIM_REQUIRE(t, CNA_WEIGHT_SIZE1, &ws1);
    RJ_SIM_REQUIRE(t, CNA_WEIGHT_SIZE2, &ws2);
    RJ_SIM_REQUIRE(t, CNA_CBUF_CON0, &cb0);
    RJ_SIM_REQUIRE(t, CNA_CVT_CON0, &cvt0);
    RJ_SIM_REQUIRE(t, CNA_FC_CON0, &fc0);
    RJ_SIM_REQUIRE(t, CNA_PAD_CON0, &pad0);
    RJ_SIM_REQUIRE(t, CNA_PAD_CON1, &pad1);
    RJ_SIM_REQUIRE(t, CNA_FEATURE_DATA_ADDR, &faddr);
    RJ_SIM_REQUIRE(t, CNA_DMA_CON1, &dma1);
    RJ_SIM_REQUIRE(t, CNA_DMA_CON2, &dma2);
    RJ_SIM_REQUIRE(t, CNA_DCOMP_CTRL, &dcomp);
    RJ_SIM_REQUIRE(t, CNA_DCOMP_ADDR0, &waddr);
    RJ_SIM_REQUIRE(t, CORE_MISC_CFG, &misc);
    RJ_SIM_REQUIRE(t, CORE_DATAOUT_SIZE_0, &out0);
    RJ_SIM_REQUIRE(t, CORE_DATAOUT_SIZE_1, &out1);
    RJ_SIM_REQUIRE(t, CORE_CLIP_TRUNCATE, &clip);
    (void)con2; /* FEATURE_GRAINS: a fetch-granularity hint, no effect on the result (depthwise-conv.md) */

    uint32_t J = t->job_index, T = t->task_index;
    memset(g, 0, sizeof *g);

    /* precision: CNA in/proc and CORE proc must name the same supported dtype */
    uint32_t pin = RJ_GET(con1, CNA_CONV_CON1, IN_PRECISION);
    uint32_t pproc = RJ_GET(con1, CNA_CONV_CON1, PROC_PRECISION);
    uint32_t pcore = RJ_GET(misc, CORE_MISC_CFG, PROC_PRECISION);
    if (pin != pproc || pin != pcore)
        return UNSUPP("job %u task %u: CNA_CONV_CON1 IN_PRECISION=%u (%s), PROC_PRECISION=%u (%s) and "
                      "CORE_MISC_CFG.PROC_PRECISION=%u (%s) differ; the MAC path is same-dtype only "
                      "(notes: encodings/tile-layouts.md)", J, T, pin, prec_name(pin), pproc, prec_name(pproc),
                      pcore, prec_name(pcore));
    if (pin != PREC_INT8 && pin != PREC_FP16 && pin != PREC_BF16 && pin != PREC_TF32 && pin != PREC_INT4)
        return UNSUPP("job %u task %u: CNA_CONV_CON1 precision %u (%s) is not modelled (int8=0, fp16=2, bf16=3, "
                      "int4=6, tf32=7 are)", J, T, pin, prec_name(pin));
    g->prec = pin;
    /* int4 (6): two signed nibbles per byte, element 2i in the low nibble (notes:
     * encodings/tile-layouts.md "2 values per byte with HILO=0, ... no swap"; reading HILO=0 as
     * low-nibble-first and the nibble as two's complement are inferences), feature C2 = 32,
     * weights (N/64, K/32, 64, 32), int32 accumulator to an int16 output (precision-field.md). */
    g->int4 = pin == PREC_INT4;
    g->is_int = pin == PREC_INT8 || pin == PREC_INT4;
    /* tf32 (7, CNA/CORE only): raw fp32 in a 4-byte element, feature C2 = 4 (notes:
     * encodings/precision-field.md "tf32 (precision value 7)", HW sweep). */
    g->ebytes = g->is_int ? 1u : (pin == PREC_TF32 ? 4u : 2u);
    g->c2 = g->int4 ? 32u : 16u / g->ebytes;

    uint32_t mode = RJ_GET(con1, CNA_CONV_CON1, CONV_MODE);
    uint32_t dw_en = RJ_GET(misc, CORE_MISC_CFG, DW_EN);
    if (mode != 0 && mode != 3)
        return UNSUPP("job %u task %u: CNA_CONV_CON1.CONV_MODE=%u is not modelled (0 direct, 3 depthwise)", J, T,
                      mode);
    if ((mode == 3) != (dw_en == 1))
        return UNSUPP("job %u task %u: CNA_CONV_CON1.CONV_MODE=%u but CORE_MISC_CFG.DW_EN=%u; depthwise needs "
                      "both (notes: depthwise-conv.md)", J, T, mode, dw_en);
    g->depthwise = mode == 3;
    if (g->depthwise && pin == PREC_INT4)
        return UNSUPP("job %u task %u: an int4 depthwise conv is not modelled: its weight group is not "
                      "documented (notes: encodings/tile-layouts.md documents the int4 matmul tile)", J, T);
    if (g->depthwise && pin == PREC_TF32)
        return UNSUPP("job %u task %u: a tf32 depthwise conv is not modelled: its weight group is not "
                      "documented (notes: encodings/precision-field.md documents the tf32 matmul/direct tile)",
                      J, T);
    if (RJ_GET(con1, CNA_CONV_CON1, DECONV) || RJ_GET(con3, CNA_CONV_CON3, DECONV_X_STRIDE) ||
        RJ_GET(con3, CNA_CONV_CON3, DECONV_Y_STRIDE))
        return UNSUPP("job %u task %u: CNA deconvolution fields are set; there is no hardware deconv mode "
                      "(notes: encodings/conv-transpose.md)", J, T);
    if (RJ_GET(con1, CNA_CONV_CON1, ARGB_IN) || RJ_GET(con1, CNA_CONV_CON1, NONALIGN_DMA) ||
        RJ_GET(con1, CNA_CONV_CON1, GROUP_LINE_OFF))
        return UNSUPP("job %u task %u: CNA_CONV_CON1 0x%x selects the image/non-aligned/row-major input "
                      "path (ARGB_IN, NONALIGN_DMA or GROUP_LINE_OFF), which the simulator does not model", J, T,
                      con1);
    if (!RJ_GET(cvt0, CNA_CVT_CON0, CVT_BYPASS))
        return UNSUPP("job %u task %u: CNA_CVT_CON0.CVT_BYPASS=0: the input converter is not modelled "
                      "(the matmul/conv path bypasses it, notes: matmul-as-conv.md)", J, T);
    if (g->is_int && !RJ_GET(cvt0, CNA_CVT_CON0, DATA_SIGN))
        return UNSUPP("job %u task %u: CNA_CVT_CON0.DATA_SIGN=0 (unsigned int8 input) is not modelled", J, T);
    if (RJ_GET(fc0, CNA_FC_CON0, FC_SKIP_EN))
        return UNSUPP("job %u task %u: CNA_FC_CON0.FC_SKIP_EN is not modelled", J, T);
    if (RJ_GET(dcomp, CNA_DCOMP_CTRL, DECOMP_CONTROL))
        return UNSUPP("job %u task %u: CNA_DCOMP_CTRL=0x%x enables weight decompression, which is not "
                      "modelled (notes: encodings/cna-dcomp-weight-decompression.md)", J, T, dcomp);
    /* CLIP_TRUNCATE: the integer accumulator is rounded by 2^t and saturated to int32 on its way to
     * the DPU (NVDLA IAS "convolution accumulator", quoted by Mesa rkt_coefs.c, whose
     * hardware-run int8 programs set t = 1 for some scales and divide the bias by 2^t); the rule,
     * round half away from zero then saturate, is NVDLA's cmod (NV_NVDLA_cacc.cpp) -- an
     * inference for RK3588. Float accumulators ignore it (NVDLA: "For FP16 ... just converted"). */
    g->clip_truncate = g->is_int ? RJ_GET(clip, CORE_CLIP_TRUNCATE, CLIP_TRUNCATE) : 0u;
    if (g->is_int && RJ_GET(clip, CORE_CLIP_TRUNCATE, ROUND_TYPE))
        return UNSUPP("job %u task %u: CORE_CLIP_TRUNCATE.ROUND_TYPE=1 is not modelled (undocumented; the "
                      "NVDLA rounding is modelled for ROUND_TYPE=0)", J, T);

    g->H = RJ_GET(ds0, CNA_DATA_SIZE0, DATAIN_HEIGHT);
    g->W = RJ_GET(ds0, CNA_DATA_SIZE0, DATAIN_WIDTH);
    g->C = RJ_GET(ds1, CNA_DATA_SIZE1, DATAIN_CHANNEL);
    g->C_real = RJ_GET(ds1, CNA_DATA_SIZE1, DATAIN_CHANNEL_REAL) + 1u;
    if (!g->W || !g->H || !g->C)
        return BAD("job %u task %u: CNA_DATA_SIZE0/1 give an empty input cube (W=%u H=%u C=%u)", J, T, g->W, g->H,
                   g->C);
    if (g->C_real > g->C)
        return BAD("job %u task %u: CNA_DATA_SIZE1 DATAIN_CHANNEL_REAL+1=%u exceeds DATAIN_CHANNEL=%u", J, T,
                   g->C_real, g->C);

    g->OW = RJ_GET(out0, CORE_DATAOUT_SIZE_0, DATAOUT_WIDTH) + 1u;
    g->OH = RJ_GET(out0, CORE_DATAOUT_SIZE_0, DATAOUT_HEIGHT) + 1u;
    g->N = RJ_GET(out1, CORE_DATAOUT_SIZE_1, DATAOUT_CHANNEL) + 1u;
    if (RJ_GET(ds2, CNA_DATA_SIZE2, DATAOUT_WIDTH) != g->OW)
        return BAD("job %u task %u: CNA_DATA_SIZE2.DATAOUT_WIDTH=%u disagrees with CORE_DATAOUT_SIZE_0 width %u",
                   J, T, RJ_GET(ds2, CNA_DATA_SIZE2, DATAOUT_WIDTH), g->OW);
    if (RJ_GET(ds3, CNA_DATA_SIZE3, DATAOUT_ATOMICS) != g->OW * g->OH)
        return BAD("job %u task %u: CNA_DATA_SIZE3.DATAOUT_ATOMICS=%u is not output width x height = %u", J, T,
                   RJ_GET(ds3, CNA_DATA_SIZE3, DATAOUT_ATOMICS), g->OW * g->OH);

    g->KW = RJ_GET(ws2, CNA_WEIGHT_SIZE2, WEIGHT_WIDTH);
    g->KH = RJ_GET(ws2, CNA_WEIGHT_SIZE2, WEIGHT_HEIGHT);
    g->kernels = RJ_GET(ws2, CNA_WEIGHT_SIZE2, WEIGHT_KERNELS);
    if (!g->KW || !g->KH || !g->kernels)
        return BAD("job %u task %u: CNA_WEIGHT_SIZE2 gives an empty kernel (KW=%u KH=%u kernels=%u)", J, T, g->KW,
                   g->KH, g->kernels);
    uint32_t per_kernel = RJ_GET(ws1, CNA_WEIGHT_SIZE1, WEIGHT_BYTES_PER_KERNEL);
    uint32_t want_pk = g->KW * g->KH * g->C * g->ebytes;
    if (g->int4)
        want_pk = (want_pk + 1u) / 2u; /* nibbles */
    if (per_kernel != want_pk)
        return BAD("job %u task %u: CNA_WEIGHT_SIZE1.WEIGHT_BYTES_PER_KERNEL=%u, but KW*KH*C*bytes = %u*%u*%u*%u "
                   "= %u", J, T, per_kernel, g->KW, g->KH, g->C, g->ebytes, want_pk);
    if ((uint64_t)ws0 != (uint64_t)per_kernel * g->kernels)
        return BAD("job %u task %u: CNA_WEIGHT_SIZE0.WEIGHT_BYTES=%u is not bytes per kernel x kernels = %u x %u",
                   J, T, ws0, per_kernel, g->kernels);
    g->wbytes = ws0;
    if (g->depthwise) {
        if (g->kernels != 1)
            return BAD("job %u task %u: depthwise needs CNA_WEIGHT_SIZE2.WEIGHT_KERNELS=1, got %u (notes: "
                       "depthwise-conv.md)", J, T, g->kernels);
        if (g->N > g->C)
            return BAD("job %u task %u: depthwise output channels %u exceed the input channels %u", J, T, g->N,
                       g->C);
    } else if (g->N > g->kernels) {
        /* Mesa packs a partial kernel group this way: WEIGHT_KERNELS = OC, the CORE and DPU over the
         * whole 32-kernel group (notes teflon-add-capture: OC 8, DATAOUT_CHANNEL 31). On RK3588 "a
         * direct program whose OC ends part way through a 32-kernel group does not complete ... each
         * task outlasts the driver's watchdog", measured at OC 16 and 48 (notes:
         * encodings/out-cvt-converter.md "Direct int8-output program"). Conflicting evidence, noted:
         * Mesa's CI list of failing tests (ci/rocket-rk3588-fails.txt) names one Conv2D case only,
         * though its suite has OC 1 and 16; the notes' measurement is followed. */
        const uint32_t grp = g->is_int ? 32u : 16u;
        if ((t->sim->flags & RJ_SIM_STRICT) && g->kernels % grp && g->N == (g->kernels + grp - 1u) / grp * grp)
            return rj_sim_hazard(t, "CNA_WEIGHT_SIZE2", "partial kernel group",
                                 "WEIGHT_KERNELS=%u with CORE_DATAOUT_SIZE_1 over %u channels: a direct program "
                                 "whose kernels end part way through a %u-kernel group does not complete on "
                                 "hardware (watchdog). Program whole groups with zero kernels in the padding "
                                 "(notes: encodings/out-cvt-converter.md \"Direct int8-output program\")",
                                 g->kernels, g->N, grp);
        return BAD("job %u task %u: CORE_DATAOUT_SIZE_1 asks for %u output channels but CNA_WEIGHT_SIZE2 holds "
                   "%u kernels", J, T, g->N, g->kernels);
    }

    g->sx = RJ_GET(con3, CNA_CONV_CON3, CONV_X_STRIDE);
    g->sy = RJ_GET(con3, CNA_CONV_CON3, CONV_Y_STRIDE);
    if (!g->sx || !g->sy)
        return BAD("job %u task %u: CNA_CONV_CON3 stride 0 (x=%u y=%u); strides are stored as-is, 1 = dense", J,
                   T, g->sx, g->sy);
    g->dx = RJ_GET(con3, CNA_CONV_CON3, ATROUS_X_DILATION) + 1u; /* inference: stored minus one */
    g->dy = RJ_GET(con3, CNA_CONV_CON3, ATROUS_Y_DILATION) + 1u;
    g->pad_l = RJ_GET(pad0, CNA_PAD_CON0, PAD_LEFT);
    g->pad_t = RJ_GET(pad0, CNA_PAD_CON0, PAD_TOP);
    g->pad_raw = RJ_GET(pad1, CNA_PAD_CON1, PAD_VALUE);

    g->faddr = faddr;
    uint32_t line_reg = RJ_GET(dma1, CNA_DMA_CON1, LINE_STRIDE);
    uint32_t surf_reg = RJ_GET(dma2, CNA_DMA_CON2, SURF_STRIDE);
    g->line_pitch = 4ull * line_reg;
    g->surf_pitch = 16ull * ((uint64_t)surf_reg + line_reg);
    if (g->line_pitch < 16ull * g->W)
        return BAD("job %u task %u: CNA_DMA_CON1.LINE_STRIDE=%u (%llu bytes) is shorter than one line of %u "
                   "16-byte atoms", J, T, line_reg, (unsigned long long)g->line_pitch, g->W);
    uint32_t surfaces = (g->C + g->c2 - 1u) / g->c2;
    if (surfaces > 1 && g->surf_pitch < g->line_pitch * g->H)
        return BAD("job %u task %u: CNA_DMA_CON2.SURF_STRIDE=%u gives a surface pitch of %llu bytes, shorter "
                   "than H=%u lines of %llu bytes (surface pitch = 16*(SURF_STRIDE+LINE_STRIDE))", J, T, surf_reg,
                   (unsigned long long)g->surf_pitch, g->H, (unsigned long long)g->line_pitch);
    g->fbytes_extent = (uint64_t)(surfaces - 1u) * g->surf_pitch + (uint64_t)(g->H - 1u) * g->line_pitch +
                       16ull * g->W;

    g->data_bank = RJ_GET(cb0, CNA_CBUF_CON0, DATA_BANK);
    g->weight_bank = RJ_GET(cb0, CNA_CBUF_CON0, WEIGHT_BANK);
    g->data_reuse = RJ_GET(cb0, CNA_CBUF_CON0, DATA_REUSE);
    g->weight_reuse = RJ_GET(cb0, CNA_CBUF_CON0, WEIGHT_REUSE);
    if (RJ_GET(cb0, CNA_CBUF_CON0, FC_DATA_BANK))
        return UNSUPP("job %u task %u: CNA_CBUF_CON0.FC_DATA_BANK=%u: a nonzero value corrupts the conv path on "
                      "hardware and is not modelled; keep it 0 (notes: encodings/cbuf-reuse.md)", J, T,
                      RJ_GET(cb0, CNA_CBUF_CON0, FC_DATA_BANK));

    /* weight memory layout */
    g->waddr = waddr;
    if (g->depthwise) {
        uint32_t G = g->is_int ? 64u : 32u; /* 64-byte channel group (depthwise-conv.md) */
        g->gc = g->C < G ? g->C : G;
        g->gk = 1;
        uint32_t ngc = (g->C + g->gc - 1u) / g->gc;
        g->wextent = (uint64_t)ngc * g->gc * g->KH * g->KW * g->ebytes;
    } else {
        /* kernel group: 16 for 2- and 4-byte elements, 32 for int8; channel group 32, halved to
         * 16 for tf32's 4-byte element: the (N/16, K/16, 16, 16) tile (precision-field.md). */
        g->gk = g->int4 ? 64u : g->is_int ? 32u : 16u;
        const uint32_t kgrp = g->prec == PREC_TF32 ? 16u : 32u;
        g->gc = g->C < kgrp ? g->C : kgrp;
        uint32_t ngc = (g->C + g->gc - 1u) / g->gc;
        g->wextent = (uint64_t)g->kernels * ngc * g->gc * g->KH * g->KW * g->ebytes;
        if (g->int4)
            g->wextent = (g->wextent + 1u) / 2u;
    }
    return 0;
}

/* ---- strict-mode hazards --------------------------------------------------------------- */

static int check_hazards(rj_sim_task *t, const conv_geom *g)
{
    /* The M==1 GEMV break: a feature height below 4 mis-computes at every dtype
     * (notes: matmul-as-conv.md "Feature height < 4 is broken"). */
    if (g->H < 4)
        return rj_sim_hazard(t, "CNA_DATA_SIZE0", "feature height < 4 (M==1 GEMV break)",
                             "DATAIN_HEIGHT=%u; the datapath produces wrong output below 4 rows. Pad the "
                             "rows (M) to a multiple of 4 with zero rows.", g->H);

    /* The CACC clears per kick, not per task: integer tasks after the first conv task of a
     * self-chained kick accumulate onto its residual (notes: regcmd-task-model.md). */
    const rj_sim_kick *k = t->sim->cur_kick;
    if (g->is_int && k && k->conv_tasks_run > 0)
        return rj_sim_hazard(t, "CNA_CONV_CON1", "integer tasks self-chained in one kick",
                             "task %u of a chained kick runs an %s conv after %u conv task(s) in the same "
                             "kick; the int32 CACC is not cleared per task, so this result would be garbage. "
                             "Submit integer tasks gapped (one kick each).", k->position,
                             prec_name(g->prec), k->conv_tasks_run);

    /* Alignment of the atoms (notes: matmul-as-conv.md "Alignment requirements"):
     * K (channels) % 32 for fp16/bf16/int8; N (kernels) % 16 fp16/bf16, % 32 int8. */
    const uint32_t kalign = g->prec == PREC_TF32 ? 16u : 32u; /* tf32: K%16 (precision-field.md) */
    if (g->C % kalign)
        return rj_sim_hazard(t, "CNA_DATA_SIZE1", "unaligned K",
                             "DATAIN_CHANNEL=%u is not a multiple of %u (the %s weight K-group); pad the "
                             "channels with zeros.", g->C, kalign, prec_name(g->prec));
    if (!g->depthwise && g->kernels % g->gk)
        return rj_sim_hazard(t, "CNA_WEIGHT_SIZE2", "unaligned N",
                             "WEIGHT_KERNELS=%u is not a multiple of %u (the %s weight N-group); the NPU "
                             "reads a whole group and disagrees with the packing (silent garbage). Pad the "
                             "kernels.", g->kernels, g->gk, prec_name(g->prec));

    /* CBUF over-subscription (notes: hardware-overview.md CBUF 12 x 32 KB; both operands must
     * be resident; encodings/cbuf-bank-slack.md: int8 feature needs one bank of slack). */
    uint32_t surfaces = (g->C + g->c2 - 1u) / g->c2;
    uint64_t fbytes = (uint64_t)surfaces * g->H * g->W * 16u;
    uint32_t fd_banks = (uint32_t)((fbytes + CBUF_BANK_BYTES - 1u) / CBUF_BANK_BYTES);
    uint32_t wt_banks = (uint32_t)((g->wbytes + CBUF_BANK_BYTES - 1u) / CBUF_BANK_BYTES);
    if (g->data_bank + g->weight_bank > CBUF_BANKS)
        return rj_sim_hazard(t, "CNA_CBUF_CON0", "CBUF over-subscription",
                             "DATA_BANK=%u + WEIGHT_BANK=%u exceed the %u banks of 32 KB", g->data_bank,
                             g->weight_bank, CBUF_BANKS);
    if (g->prec == PREC_INT8 && g->data_bank < fd_banks + 1u)
        return rj_sim_hazard(t, "CNA_CBUF_CON0", "int8 feature bank slack",
                             "the int8 feature cube takes %u bank(s) (%llu bytes) but DATA_BANK=%u; the int8 "
                             "feature DMA over-reads by one bank, reserve DATA_BANK >= %u", fd_banks,
                             (unsigned long long)fbytes, g->data_bank, fd_banks + 1u);
    if (g->data_bank < fd_banks)
        return rj_sim_hazard(t, "CNA_CBUF_CON0", "CBUF over-subscription",
                             "the feature cube needs %u bank(s) (%llu bytes) but DATA_BANK=%u; tile M or K",
                             fd_banks, (unsigned long long)fbytes, g->data_bank);
    if (g->weight_bank < wt_banks)
        return rj_sim_hazard(t, "CNA_CBUF_CON0", "CBUF over-subscription",
                             "the weights need %u bank(s) (%llu bytes) but WEIGHT_BANK=%u; tile N or K",
                             wt_banks, (unsigned long long)g->wbytes, g->weight_bank);
    return 0;
}

/* ---- operand fetch --------------------------------------------------------------------- */

static float pad_value_f(const conv_geom *g)
{
    uint16_t bits = (uint16_t)(g->pad_raw & 0xFFFFu);
    if (g->prec == PREC_BF16) {
        uint32_t u = (uint32_t)bits << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    return rj_f16_to_f32(bits);
}

static int32_t pad_value_i(const conv_geom *g) { return (int32_t)(int8_t)(g->pad_raw & 0xFFu); }

static void bf16_to_f32_n(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(dst + i, &u, sizeof u);
    }
}

#if RJ_CNA_SIMD
/* Eight consecutive fp16 (F16C: exact, as every half is an fp32) or bf16 (the top half of an
 * fp32) values as fp32. */
static inline __m256 load8_f32(const uint8_t *p, int bf16)
{
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    if (bf16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* In-register 8 x 8 transpose: r[i] lane j <-> r[j] lane i. */
static inline void transpose8(__m256 r[8])
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}
#endif

/* fp32 -> tf32 (1-8-10) kept in an fp32: "the MAC rounds to a 10-bit mantissa, multiplies, and
 * accumulates in fp32" (notes: encodings/precision-field.md); round to nearest even is an
 * inference (the notes match a tf32-rounded reference to ~1.5e-7 without naming the tie rule). */
static float tf32_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) {
        u += 0xfffu + ((u >> 13) & 1u);
        u &= ~0x1fffu;
    }
    memcpy(&f, &u, 4);
    return f;
}

static float tf32_at(const uint8_t *p)
{
    float f;
    memcpy(&f, p, 4);
    return tf32_round(f);
}

/* Element i of a nibble-packed int4 array: low nibble first, two's complement (see decode_geom). */
static inline int32_t nibble(const uint8_t *p, size_t i)
{
    uint32_t v = (p[i >> 1] >> ((i & 1u) * 4u)) & 0xfu;
    return (int32_t)v - (int32_t)((v & 8u) << 1);
}

/* Read the feature cube [C/C2][H][W][C2] into [H][W][C]. */
static int fetch_feature(rj_sim_task *t, const conv_geom *g, struct rj_cbuf_state *cb)
{
    size_t n = (size_t)g->H * g->W * g->C;
    if (g->is_int ? grow((void **)&cb->feat_i, &cb->feat_cap_i, n, 4) : grow((void **)&cb->feat_f, &cb->feat_cap, n, 4))
        return oom(t, "feature cube");
    const uint8_t *base = rj_sim_mem(t, g->faddr, g->fbytes_extent, "CNA_FEATURE_DATA_ADDR");
    if (!base)
        return t->err->code;
    t->sim->stats.bytes_read += (uint64_t)((g->C + g->c2 - 1u) / g->c2) * g->H * g->W * 16u;
    uint32_t surfaces = (g->C + g->c2 - 1u) / g->c2;
    for (uint32_t s = 0; s < surfaces; s++) {
        uint32_t c0 = s * g->c2;
        uint32_t cn = g->C - c0 < g->c2 ? g->C - c0 : g->c2;
        for (uint32_t h = 0; h < g->H; h++) {
            const uint8_t *line = base + s * g->surf_pitch + h * g->line_pitch;
            for (uint32_t w = 0; w < g->W; w++) {
                const uint8_t *atom = line + 16u * w;
                size_t o = ((size_t)h * g->W + w) * g->C + c0;
                if (g->int4) {
                    for (uint32_t c = 0; c < cn; c++)
                        cb->feat_i[o + c] = nibble(atom, c);
                } else if (g->is_int) {
                    for (uint32_t c = 0; c < cn; c++)
                        cb->feat_i[o + c] = (int8_t)atom[c];
                } else if (g->prec == PREC_TF32) {
                    for (uint32_t c = 0; c < cn; c++)
                        cb->feat_f[o + c] = tf32_at(atom + 4u * c);
                } else {
#if RJ_CNA_SIMD
                    if (cn == 8) {
                        _mm256_storeu_ps(cb->feat_f + o, load8_f32(atom, g->prec == PREC_BF16));
                        continue;
                    }
#endif
                    uint16_t half[8];
                    memcpy(half, atom, sizeof half);
                    float tmp[8];
                    if (g->prec == PREC_BF16)
                        bf16_to_f32_n(half, tmp, 8);
                    else
                        rj_f16_to_f32_n(half, tmp, 8);
                    memcpy(cb->feat_f + o, tmp, cn * sizeof(float));
                }
            }
        }
    }
    if (g->C_real < g->C) { /* inference: channels past DATAIN_CHANNEL_REAL read as zero */
        for (size_t p = 0; p < (size_t)g->H * g->W; p++)
            for (uint32_t c = g->C_real; c < g->C; c++) {
                if (g->is_int)
                    cb->feat_i[p * g->C + c] = 0;
                else
                    cb->feat_f[p * g->C + c] = 0.0f;
            }
    }
    return 0;
}

/* Element offset of weight (kernel n, tap ky/kx, channel c) in the direct layout. */
static inline size_t wt_index_direct(const conv_geom *g, uint32_t ngc, uint32_t n, uint32_t ky, uint32_t kx,
                                     uint32_t c)
{
    uint32_t kg = n / g->gk, nk = n % g->gk;
    uint32_t kgs = g->kernels - kg * g->gk < g->gk ? g->kernels - kg * g->gk : g->gk; /* short last group */
    uint32_t cg = c / g->gc, cc = c % g->gc;
    size_t block = (size_t)kg * g->gk * ngc * g->gc * g->KH * g->KW;
    return block + ((((size_t)cg * g->KH + ky) * g->KW + kx) * kgs + nk) * g->gc + cc;
}

/* One fp16/bf16 direct-conv weight panel (kernel group kg = panel kg: GK = NR = 16) into
 * [Kd][16] fp32. Every (channel group, tap) block of the DRAM layout -- up to 16 kernels x 32
 * channels, kernel-major -- becomes 32 panel rows of 16 kernels: 8 x 8 sub-blocks transposed
 * in registers, scalar at ragged edges, zero for kernels at or past N. */
typedef struct wt_unpack {
    const conv_geom *g;
    const uint8_t *base;
    float *wt;
    uint32_t ngc;
    size_t Kd;
} wt_unpack;

static void unpack_panel(void *ctx, size_t item)
{
    const wt_unpack *u = ctx;
    const conv_geom *g = u->g;
    const int bf16 = g->prec == PREC_BF16;
    uint32_t kg = (uint32_t)item;
    uint32_t nvalid = g->N - kg * RJ_MAC_NR < RJ_MAC_NR ? g->N - kg * RJ_MAC_NR : RJ_MAC_NR;
    float *pan = u->wt + (size_t)kg * u->Kd * RJ_MAC_NR;
    uint32_t kgs = g->kernels - kg * g->gk < g->gk ? g->kernels - kg * g->gk : g->gk; /* kernels in memory */
    const size_t blk_bytes = (size_t)kgs * g->gc * 2u; /* one (channel group, tap) block */
    (void)blk_bytes; /* read by the prefetch only */
    if (g->prec == PREC_TF32) {
        /* 4-byte elements, scalar: the same panel order as below */
        for (uint32_t cg = 0; cg < u->ngc; cg++) {
            uint32_t cn = g->C - cg * g->gc < g->gc ? g->C - cg * g->gc : g->gc;
            for (uint32_t ky = 0; ky < g->KH; ky++)
                for (uint32_t kx = 0; kx < g->KW; kx++) {
                    const uint8_t *blk = u->base + 4u * wt_index_direct(g, u->ngc, kg * g->gk, ky, kx, cg * g->gc);
                    float *dst = pan + (((size_t)ky * g->KW + kx) * g->C + (size_t)cg * g->gc) * RJ_MAC_NR;
                    for (uint32_t c = 0; c < cn; c++)
                        for (uint32_t k = 0; k < RJ_MAC_NR; k++)
                            dst[(size_t)c * RJ_MAC_NR + k] =
                                k < nvalid ? tf32_at(blk + 4u * ((size_t)k * g->gc + c)) : 0.0f;
                }
        }
        return;
    }
    for (uint32_t cg = 0; cg < u->ngc; cg++) {
        uint32_t cn = g->C - cg * g->gc < g->gc ? g->C - cg * g->gc : g->gc;
        for (uint32_t ky = 0; ky < g->KH; ky++)
            for (uint32_t kx = 0; kx < g->KW; kx++) {
                const uint8_t *blk = u->base + 2u * wt_index_direct(g, u->ngc, kg * g->gk, ky, kx, cg * g->gc);
                float *dst = pan + (((size_t)ky * g->KW + kx) * g->C + (size_t)cg * g->gc) * RJ_MAC_NR;
#if RJ_CNA_SIMD
                /* The blocks of one kernel group follow each other in memory: ask for the one two
                 * steps ahead while this one converts (the weights stream from L3/DRAM). A
                 * prefetch past the group's end is harmless (no fault, at most a wasted line). */
                for (size_t off = 2 * blk_bytes; off < 3 * blk_bytes; off += 64)
                    _mm_prefetch((const char *)blk + off, _MM_HINT_T0);
#endif
                for (uint32_t c0 = 0; c0 < cn; c0 += 8)
                    for (uint32_t k0 = 0; k0 < RJ_MAC_NR; k0 += 8) {
#if RJ_CNA_SIMD
                        if (c0 + 8 <= cn && k0 + 8 <= nvalid) {
                            __m256 r[8];
                            for (int i = 0; i < 8; i++)
                                r[i] = load8_f32(blk + 2u * ((size_t)(k0 + i) * g->gc + c0), bf16);
                            transpose8(r);
                            for (int i = 0; i < 8; i++)
                                _mm256_storeu_ps(dst + (size_t)(c0 + i) * RJ_MAC_NR + k0, r[i]);
                            continue;
                        }
#endif
                        for (uint32_t c = c0; c < c0 + 8 && c < cn; c++)
                            for (uint32_t k = k0; k < k0 + 8; k++) {
                                float f = 0.0f;
                                if (k < nvalid) {
                                    uint16_t h;
                                    memcpy(&h, blk + 2u * ((size_t)k * g->gc + c), 2);
                                    if (bf16)
                                        bf16_to_f32_n(&h, &f, 1);
                                    else
                                        f = rj_f16_to_f32(h);
                                }
                                dst[(size_t)c * RJ_MAC_NR + k] = f;
                            }
                    }
            }
    }
}

static int fetch_weights(rj_sim_task *t, const conv_geom *g, struct rj_cbuf_state *cb)
{
    const uint8_t *base = rj_sim_mem(t, g->waddr, g->wextent, "CNA_DCOMP_ADDR0 (weights)");
    if (!base)
        return t->err->code;
    t->sim->stats.bytes_read += g->wextent;
    uint32_t ngc = (g->C + g->gc - 1u) / g->gc;
    size_t taps = (size_t)g->KH * g->KW;

    if (g->depthwise) {
        size_t n = taps * g->C;
        if (g->is_int ? grow((void **)&cb->wt_i, &cb->wt_cap_i, n, 4) : grow((void **)&cb->wt_f, &cb->wt_cap, n, 4))
            return oom(t, "weights");
        for (uint32_t cg = 0; cg < ngc; cg++)
            for (uint32_t ky = 0; ky < g->KH; ky++)
                for (uint32_t kx = 0; kx < g->KW; kx++) {
                    size_t src = (((size_t)cg * g->KH + ky) * g->KW + kx) * g->gc;
                    size_t dst = ((size_t)ky * g->KW + kx) * g->C + (size_t)cg * g->gc;
                    uint32_t cn = g->C - cg * g->gc < g->gc ? g->C - cg * g->gc : g->gc;
                    for (uint32_t c = 0; c < cn; c++) {
                        if (g->is_int) {
                            cb->wt_i[dst + c] = (int8_t)base[src + c];
                        } else {
                            uint16_t h;
                            memcpy(&h, base + 2u * (src + c), 2);
                            float f;
                            if (g->prec == PREC_BF16)
                                bf16_to_f32_n(&h, &f, 1);
                            else
                                f = rj_f16_to_f32(h);
                            cb->wt_f[dst + c] = f;
                        }
                    }
                }
        return 0;
    }

    size_t Kd = taps * g->C;
    if (g->is_int) {
        /* int32 [Kd][N]: k = (ky*KW + kx)*C + c, n contiguous */
        size_t n = Kd * g->N;
        if (grow((void **)&cb->wt_i, &cb->wt_cap_i, n, 4))
            return oom(t, "weights");
        for (uint32_t k = 0; k < g->N; k++)
            for (uint32_t ky = 0; ky < g->KH; ky++)
                for (uint32_t kx = 0; kx < g->KW; kx++)
                    for (uint32_t c = 0; c < g->C; c++) {
                        size_t kd = ((size_t)ky * g->KW + kx) * g->C + c;
                        size_t wi = wt_index_direct(g, ngc, k, ky, kx, c);
                        cb->wt_i[kd * g->N + k] = g->int4 ? nibble(base, wi) : (int8_t)base[wi];
                    }
        return 0;
    }
    /* fp32 panels [ceil(N/16)][Kd][16], zero past N (unpack_panel); panels are independent,
     * so large weight tiles are converted on both threads. */
    _Static_assert(RJ_MAC_NR == 16, "the fp16/bf16 weight kernel group must be one MAC panel");
    size_t npan = (g->N + RJ_MAC_NR - 1u) / RJ_MAC_NR;
    size_t n = npan * Kd * RJ_MAC_NR;
    if (grow((void **)&cb->wt_f, &cb->wt_cap, n, 4))
        return oom(t, "weights");
    wt_unpack u = {g, base, cb->wt_f, ngc, Kd};
    rj_mac_parallel_for(npan, unpack_panel, &u, n >= 65536);
    return 0;
}

/* Same operand geometry (what the CBUF holds must match what the registers describe). */
static int same_feature(const conv_geom *a, const conv_geom *b)
{
    return a->prec == b->prec && a->W == b->W && a->H == b->H && a->C == b->C && a->C_real == b->C_real;
}

static int same_weights(const conv_geom *a, const conv_geom *b)
{
    return a->prec == b->prec && a->depthwise == b->depthwise && a->KW == b->KW && a->KH == b->KH &&
           a->C == b->C && a->kernels == b->kernels && a->N == b->N;
}

/* DATA_REUSE / WEIGHT_REUSE: use what the CBUF already holds instead of fetching
 * (notes: encodings/cbuf-reuse.md). A reuse bit with nothing (or something else) loaded is an
 * error: the hardware would compute with whatever the banks hold. */
static int load_operands(rj_sim_task *t, const conv_geom *g, struct rj_cbuf_state *cb)
{
    int strict = (t->sim->flags & RJ_SIM_STRICT) != 0;
    uint32_t J = t->job_index, T = t->task_index;
    if (g->data_reuse) {
        if (!cb->feat_valid)
            return BAD("job %u task %u: CNA_CBUF_CON0.DATA_REUSE is set but no feature tile is resident in the "
                       "CBUF (no earlier conv task loaded one); clear DATA_REUSE on the first task", J, T);
        if (!same_feature(&cb->fkey, g))
            return BAD("job %u task %u: CNA_CBUF_CON0.DATA_REUSE is set but the resident feature tile is %ux%ux%u "
                       "%s and this task describes %ux%ux%u %s; clear DATA_REUSE", J, T, cb->fkey.W, cb->fkey.H,
                       cb->fkey.C, prec_name(cb->fkey.prec), g->W, g->H, g->C, prec_name(g->prec));
        if (strict && cb->fkey.faddr != g->faddr)
            return rj_sim_hazard(t, "CNA_FEATURE_DATA_ADDR", "DATA_REUSE of a different tile",
                                 "DATA_REUSE keeps the tile loaded from 0x%08llx, but this task points at "
                                 "0x%08llx; the new address is never read", (unsigned long long)cb->fkey.faddr,
                                 (unsigned long long)g->faddr);
        if (strict && cb->fkey.data_bank != g->data_bank)
            return rj_sim_hazard(t, "CNA_CBUF_CON0", "DATA_REUSE across a bank repartition",
                                 "the resident feature was loaded with DATA_BANK=%u, this task sets %u",
                                 cb->fkey.data_bank, g->data_bank);
    } else {
        cb->feat_valid = 0;
        cb->apack_valid = 0;
        uint64_t t0 = now_ns();
        int rc = fetch_feature(t, g, cb);
        cb->prof.feature += now_ns() - t0;
        if (rc)
            return rc;
        cb->fkey = *g;
        cb->feat_valid = 1;
    }
    if (g->weight_reuse) {
        if (!cb->wt_valid)
            return BAD("job %u task %u: CNA_CBUF_CON0.WEIGHT_REUSE is set but no weights are resident in the CBUF; "
                       "clear WEIGHT_REUSE on the first task", J, T);
        if (!same_weights(&cb->wkey, g))
            return BAD("job %u task %u: CNA_CBUF_CON0.WEIGHT_REUSE is set but the resident weights (%u kernels "
                       "%ux%ux%u) differ from this task's (%u kernels %ux%ux%u); clear WEIGHT_REUSE", J, T,
                       cb->wkey.kernels, cb->wkey.KH, cb->wkey.KW, cb->wkey.C, g->kernels, g->KH, g->KW, g->C);
        if (strict && cb->wkey.waddr != g->waddr)
            return rj_sim_hazard(t, "CNA_DCOMP_ADDR0", "WEIGHT_REUSE of a different tile",
                                 "WEIGHT_REUSE keeps the weights loaded from 0x%08llx, but this task points "
                                 "at 0x%08llx; the new address is never read",
                                 (unsigned long long)cb->wkey.waddr, (unsigned long long)g->waddr);
        if (strict && cb->wkey.weight_bank != g->weight_bank)
            return rj_sim_hazard(t, "CNA_CBUF_CON0", "WEIGHT_REUSE across a bank repartition",
                                 "the resident weights were loaded with WEIGHT_BANK=%u, this task sets %u",
                                 cb->wkey.weight_bank, g->weight_bank);
    } else {
        cb->wt_valid = 0;
        uint64_t t0 = now_ns();
        int rc = fetch_weights(t, g, cb);
        cb->prof.weights += now_ns() - t0;
        if (rc)
            return rc;
        cb->wkey = *g;
        cb->wt_valid = 1;
    }
    return 0;
}

/* ---- the MAC array ----------------------------------------------------------------------- */

/* Input row/column a tap reads, or -1 when it falls into the padding. */
static inline int64_t src_coord(uint32_t o, uint32_t stride, uint32_t k, uint32_t dil, uint32_t pad, uint32_t n)
{
    int64_t i = (int64_t)o * stride + (int64_t)k * dil - (int64_t)pad;
    return (i >= 0 && i < (int64_t)n) ? i : -1;
}

static int is_plain_1x1(const conv_geom *g)
{
    return g->KW == 1 && g->KH == 1 && g->sx == 1 && g->sy == 1 && g->pad_l == 0 && g->pad_t == 0 &&
           g->OW == g->W && g->OH == g->H;
}

/* The packed float feature operand depends on the resident feature tile and on how the taps
 * read it; the weights do not enter. */
static int same_taps(const conv_geom *a, const conv_geom *b)
{
    return a->KW == b->KW && a->KH == b->KH && a->sx == b->sx && a->sy == b->sy && a->dx == b->dx &&
           a->dy == b->dy && a->pad_l == b->pad_l && a->pad_t == b->pad_t && a->pad_raw == b->pad_raw &&
           a->OW == b->OW && a->OH == b->OH && a->C == b->C && a->prec == b->prec;
}

/* im2col: row m = output position, columns (ky, kx, c); padding reads the pad value. */
static int build_columns_i(rj_sim_task *t, const conv_geom *g, struct rj_cbuf_state *cb, size_t Kd)
{
    size_t M = (size_t)g->OH * g->OW;
    if (grow((void **)&cb->col_i, &cb->col_cap_i, M * Kd, 4))
        return oom(t, "im2col scratch");
    int32_t pi = pad_value_i(g);
    for (uint32_t oy = 0; oy < g->OH; oy++)
        for (uint32_t ox = 0; ox < g->OW; ox++) {
            size_t row = ((size_t)oy * g->OW + ox) * Kd;
            for (uint32_t ky = 0; ky < g->KH; ky++) {
                int64_t iy = src_coord(oy, g->sy, ky, g->dy, g->pad_t, g->H);
                for (uint32_t kx = 0; kx < g->KW; kx++) {
                    int64_t ix = src_coord(ox, g->sx, kx, g->dx, g->pad_l, g->W);
                    size_t dst = row + ((size_t)ky * g->KW + kx) * g->C;
                    if (iy >= 0 && ix >= 0)
                        memcpy(cb->col_i + dst, cb->feat_i + ((size_t)iy * g->W + (size_t)ix) * g->C,
                               g->C * sizeof(int32_t));
                    else
                        for (uint32_t c = 0; c < g->C; c++)
                            cb->col_i[dst + c] = pi;
                }
            }
        }
    return 0;
}

/* The float im2col, written straight into the MAC's packed feature layout (core_mac.h): panel
 * row i is output position m0 + i, panel column kd = (ky*KW + kx)*C + c; a tap in the padding
 * reads the pad value, positions past M read zero. A 1x1 dense conv reads the feature cube as
 * it is. Row panels are independent items, shared with the helper thread when large. */
typedef struct col_pack {
    const conv_geom *g;
    const float *feat;
    float *Ap;
    size_t M, Kd;
    float pf;
} col_pack;

static void pack_column_panel(void *ctx, size_t item)
{
    const col_pack *p = ctx;
    const conv_geom *g = p->g;
    const size_t m0 = item * RJ_MAC_MR;
    float *panel = p->Ap + m0 * p->Kd; /* panel m0/MR starts at (m0/MR)*Kd*MR */
    for (uint32_t ky = 0; ky < g->KH; ky++)
        for (uint32_t kx = 0; kx < g->KW; kx++) {
            const float *src[RJ_MAC_MR];
            float fill[RJ_MAC_MR];
            for (size_t i = 0; i < RJ_MAC_MR; i++) {
                size_t m = m0 + i;
                src[i] = NULL;
                fill[i] = 0.0f;
                if (m >= p->M)
                    continue;
                uint32_t oy = (uint32_t)(m / g->OW), ox = (uint32_t)(m % g->OW);
                int64_t iy = src_coord(oy, g->sy, ky, g->dy, g->pad_t, g->H);
                int64_t ix = src_coord(ox, g->sx, kx, g->dx, g->pad_l, g->W);
                if (iy >= 0 && ix >= 0)
                    src[i] = p->feat + ((size_t)iy * g->W + (size_t)ix) * g->C;
                else
                    fill[i] = p->pf;
            }
            rj_mac_pack_rows(src, fill, g->C, panel + ((size_t)ky * g->KW + kx) * g->C * RJ_MAC_MR);
        }
}

static void pack_columns_f(const conv_geom *g, const float *feat, float *Ap)
{
    col_pack p = {g, feat, Ap, (size_t)g->OH * g->OW, (size_t)g->KH * g->KW * g->C, pad_value_f(g)};
    size_t panels = (p.M + RJ_MAC_MR - 1) / RJ_MAC_MR;
    rj_mac_parallel_for(panels, pack_column_panel, &p, p.M * p.Kd >= (1u << 18));
}

static void depthwise_f(const conv_geom *g, const struct rj_cbuf_state *cb, float *acc)
{
    float pf = pad_value_f(g);
    for (uint32_t oy = 0; oy < g->OH; oy++)
        for (uint32_t ox = 0; ox < g->OW; ox++) {
            float *restrict out = acc + ((size_t)oy * g->OW + ox) * g->N;
            for (uint32_t ky = 0; ky < g->KH; ky++) {
                int64_t iy = src_coord(oy, g->sy, ky, g->dy, g->pad_t, g->H);
                for (uint32_t kx = 0; kx < g->KW; kx++) {
                    int64_t ix = src_coord(ox, g->sx, kx, g->dx, g->pad_l, g->W);
                    const float *restrict w = cb->wt_f + ((size_t)ky * g->KW + kx) * g->C;
                    if (iy >= 0 && ix >= 0) {
                        const float *restrict x = cb->feat_f + ((size_t)iy * g->W + (size_t)ix) * g->C;
                        for (uint32_t c = 0; c < g->N; c++)
                            out[c] += x[c] * w[c];
                    } else {
                        for (uint32_t c = 0; c < g->N; c++)
                            out[c] += pf * w[c];
                    }
                }
            }
        }
}

static void depthwise_i(const conv_geom *g, const struct rj_cbuf_state *cb, int32_t *acc)
{
    int32_t pi = pad_value_i(g);
    for (uint32_t oy = 0; oy < g->OH; oy++)
        for (uint32_t ox = 0; ox < g->OW; ox++) {
            int32_t *restrict out = acc + ((size_t)oy * g->OW + ox) * g->N;
            for (uint32_t ky = 0; ky < g->KH; ky++) {
                int64_t iy = src_coord(oy, g->sy, ky, g->dy, g->pad_t, g->H);
                for (uint32_t kx = 0; kx < g->KW; kx++) {
                    int64_t ix = src_coord(ox, g->sx, kx, g->dx, g->pad_l, g->W);
                    const int32_t *restrict w = cb->wt_i + ((size_t)ky * g->KW + kx) * g->C;
                    if (iy >= 0 && ix >= 0) {
                        const int32_t *restrict x = cb->feat_i + ((size_t)iy * g->W + (size_t)ix) * g->C;
                        for (uint32_t c = 0; c < g->N; c++)
                            out[c] += x[c] * w[c];
                    } else {
                        for (uint32_t c = 0; c < g->N; c++)
                            out[c] += pi * w[c];
                    }
                }
            }
        }
}

/* int8 x int8 sums over Kd terms stay inside int32 while Kd * 128 * 128 < 2^31; past that,
 * accumulate in int64 and saturate to int32, as the wide CACC does before the 32-bit handoff
 * to the DPU (notes: hardware-overview.md, NVDLA CACC via Mesa rkt_coefs.c). */
/* CACC -> DPU: round by 2^t (half away from zero) and saturate to int32 (CLIP_TRUNCATE, above). */
static int32_t cacc_deliver(int64_t s, uint32_t t)
{
    if (t) {
        const int64_t half = (int64_t)1 << (t - 1u);
        s = s >= 0 ? (s + half) >> t : -((-s + half) >> t);
    }
    return s > INT32_MAX ? INT32_MAX : s < INT32_MIN ? INT32_MIN : (int32_t)s;
}

static void gemm_i64_saturating(size_t M, size_t N, size_t Kd, const int32_t *A, const int32_t *B, int32_t *C,
                                uint32_t clip_truncate)
{
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++) {
            int64_t s = 0;
            for (size_t k = 0; k < Kd; k++)
                s += (int64_t)A[m * Kd + k] * B[k * N + n];
            C[m * N + n] = cacc_deliver(s, clip_truncate);
        }
}

/* CPEND's S: the window sum of the input the CNA feeds, pad taps at the pad value, over every
 * programmed input channel (direct) or per channel (depthwise). "The border pad counts in that
 * sum, at the input zero point"; "S sums the window over every programmed input channel"; "the
 * CNA pads the channel padding with the input zero point too" (notes: depthwise-conv.md). */
static int window_sums(rj_sim_task *t, const conv_geom *g, struct rj_cbuf_state *cb)
{
    const size_t M = (size_t)g->OH * g->OW, per = g->depthwise ? g->N : 1u;
    if (grow((void **)&cb->wsum_buf, &cb->wsum_cap, M * per, sizeof(int64_t)))
        return oom(t, "CPEND window sums");
    memset(cb->wsum_buf, 0, M * per * sizeof(int64_t));
    const int64_t pi = pad_value_i(g);
    const uint32_t nc = g->depthwise ? g->N : g->C;
    for (uint32_t oy = 0; oy < g->OH; oy++)
        for (uint32_t ox = 0; ox < g->OW; ox++) {
            int64_t *s = cb->wsum_buf + ((size_t)oy * g->OW + ox) * per;
            for (uint32_t ky = 0; ky < g->KH; ky++) {
                int64_t iy = src_coord(oy, g->sy, ky, g->dy, g->pad_t, g->H);
                for (uint32_t kx = 0; kx < g->KW; kx++) {
                    int64_t ix = src_coord(ox, g->sx, kx, g->dx, g->pad_l, g->W);
                    const int32_t *x = (iy >= 0 && ix >= 0)
                        ? cb->feat_i + ((size_t)iy * g->W + (size_t)ix) * g->C : NULL;
                    for (uint32_t c = 0; c < nc; c++)
                        s[g->depthwise ? c : 0] += x ? x[c] : pi;
                }
            }
        }
    cb->acc.wsum = cb->wsum_buf;
    cb->acc.wsum_per_channel = g->depthwise;
    return 0;
}

int rj_sim_conv_run(rj_sim_task *t)
{
    rj_sim *sim = t->sim;
    conv_geom g;
    int rc = decode_geom(t, &g);
    if (rc)
        return rc;
    if (sim->flags & RJ_SIM_STRICT) {
        rc = check_hazards(t, &g);
        if (rc)
            return rc;
    }
    if (!sim->cbuf) {
        sim->cbuf = calloc(1, sizeof *sim->cbuf);
        if (!sim->cbuf)
            return oom(t, "CBUF model");
    }
    struct rj_cbuf_state *cb = sim->cbuf;
    rc = load_operands(t, &g, cb);
    if (rc)
        return rc;

    size_t M = (size_t)g.OH * g.OW;
    size_t nacc = M * g.N;
    rj_sim_acc *acc = &cb->acc;
    if (g.is_int ? grow((void **)&acc->i, &cb->acc_cap_i, nacc, 4) : grow((void **)&acc->f, &cb->acc_cap, nacc, 4))
        return oom(t, "accumulator");
    acc->width = g.OW;
    acc->height = g.OH;
    acc->channels = g.N;
    acc->is_int = (int)g.is_int;
    acc->wsum = NULL;
    acc->wsum_per_channel = 0;
    acc->clip_truncate = g.clip_truncate;
    size_t taps = (size_t)g.KH * g.KW;
    /* CPEND (DPU_BS_OW_CFG.OD_BYPASS = 0) on the integer path needs the input's window sums. */
    if (g.is_int && !RJ_GET(rj_sim_reg(sim, RJ_REG_DPU_BS_OW_CFG), DPU_BS_OW_CFG, OD_BYPASS)) {
        rc = window_sums(t, &g, cb);
        if (rc)
            return rc;
    }

    if (g.depthwise) {
        uint64_t t1 = now_ns();
        if (g.is_int) {
            memset(acc->i, 0, nacc * sizeof(int32_t));
            depthwise_i(&g, cb, acc->i);
            if (g.clip_truncate)
                for (size_t e = 0; e < nacc; e++)
                    acc->i[e] = cacc_deliver(acc->i[e], g.clip_truncate);
        } else {
            memset(acc->f, 0, nacc * sizeof(float));
            depthwise_f(&g, cb, acc->f);
        }
        cb->prof.mac += now_ns() - t1;
        sim->stats.macs += (uint64_t)M * g.N * taps;
    } else {
        size_t Kd = taps * g.C;
        const int32_t *Ai = cb->feat_i;
        if (g.is_int && !is_plain_1x1(&g)) {
            uint64_t t1 = now_ns();
            rc = build_columns_i(t, &g, cb, Kd);
            cb->prof.columns += now_ns() - t1;
            if (rc)
                return rc;
            Ai = cb->col_i;
        }
        if (g.is_int) {
            uint64_t t1 = now_ns();
            if (Kd < (1u << 17)) {
                memset(acc->i, 0, nacc * sizeof(int32_t));
                rj_mac_gemm_i32(M, g.N, Kd, Ai, Kd, cb->wt_i, acc->i, g.N);
                /* exact in int32 here (|sum| < 2^17 * 2^14); then the CACC's rounding shift */
                if (g.clip_truncate)
                    for (size_t e = 0; e < nacc; e++)
                        acc->i[e] = cacc_deliver(acc->i[e], g.clip_truncate);
            } else {
                gemm_i64_saturating(M, g.N, Kd, Ai, cb->wt_i, acc->i, g.clip_truncate);
            }
            cb->prof.mac += now_ns() - t1;
        } else {
            if (!cb->apack_valid || !same_taps(&cb->akey, &g)) {
                cb->apack_valid = 0;
                uint64_t t1 = now_ns();
                if (grow((void **)&cb->apack, &cb->apack_cap, rj_mac_packed_a_floats(M, Kd), 4))
                    return oom(t, "packed feature operand");
                pack_columns_f(&g, cb->feat_f, cb->apack);
                cb->akey = g;
                cb->apack_valid = 1;
                cb->prof.columns += now_ns() - t1;
            }
            uint64_t t1 = now_ns();
            memset(acc->f, 0, nacc * sizeof(float));
            if (rj_mac_gemm_f32(M, g.N, Kd, cb->apack, cb->wt_f, acc->f, g.N))
                return oom(t, "MAC scratch");
            cb->prof.mac += now_ns() - t1;
        }
        sim->stats.macs += (uint64_t)M * g.N * Kd;
    }
    if (sim->cur_kick)
        sim->cur_kick->conv_tasks_run++;
    uint64_t t2 = now_ns();
    rc = rj_sim_dpu_run(t, acc);
    cb->prof.dpu += now_ns() - t2;
    cb->prof.conv_tasks++;
    return rc;
}

void rj_sim_get_phase_ns(const rj_sim *sim, rj_sim_phase_ns *out)
{
    if (!out)
        return;
    if (sim && sim->cbuf)
        *out = sim->cbuf->prof;
    else
        memset(out, 0, sizeof *out);
}

int64_t rj_sim_last_acc(const rj_sim *sim, uint32_t dims[4], void *buf, uint64_t buf_bytes)
{
    if (!sim || !sim->cbuf || !(sim->cbuf->acc.f || sim->cbuf->acc.i) || !sim->cbuf->acc.width)
        return -1;
    const rj_sim_acc *a = &sim->cbuf->acc;
    uint64_t n = (uint64_t)a->width * a->height * a->channels;
    if (dims) {
        dims[0] = a->width;
        dims[1] = a->height;
        dims[2] = a->channels;
        dims[3] = (uint32_t)a->is_int;
    }
    if (buf) {
        if (buf_bytes < n * 4u)
            return -1;
        memcpy(buf, a->is_int ? (const void *)a->i : (const void *)a->f, n * 4u);
    }
    return (int64_t)n;
}
