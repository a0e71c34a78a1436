/* DPU LUT: table upload through the LUT access port, and the LE/LO hybrid lookup.
 *
 * Sources: notes encodings/dpu-lut-activation.md (cited per behaviour below) and the
 * DPU_LUT_* register fields of rk3588-registers.xml. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lut.h"

/* ---- table storage -------------------------------------------------------------------
 * RK3588 tables hold 513 entries each (notes: dpu-lut-activation.md); rj_sim_lut keeps both and
 * remembers which were ever uploaded, so a lookup through a never-written table is refused
 * rather than reading zeros. */
_Static_assert(sizeof(((rj_sim_lut *)0)->le) / sizeof(int16_t) == RJ_LUT_ENTRIES &&
               sizeof(((rj_sim_lut *)0)->lo) / sizeof(int16_t) == RJ_LUT_ENTRIES,
               "rj_sim_lut must hold RJ_LUT_ENTRIES entries per table");

/* Entries of table `id`, or NULL when nothing was ever uploaded. */
static const int16_t *table_ro(const rj_sim *sim, int id)
{
    if (!(sim->lut.loaded & (1u << id)))
        return NULL;
    return id == RJ_LUT_LE ? sim->lut.le : sim->lut.lo;
}

static int16_t *table_rw(rj_sim *sim, int id)
{
    sim->lut.loaded |= 1u << id;
    return id == RJ_LUT_LE ? sim->lut.le : sim->lut.lo;
}

/* ---- upload port ---------------------------------------------------------------------- */

/* DPU_LUT_ACCESS_CFG: LUT_ACCESS_TYPE (bit 17, 1 = write), LUT_TABLE_ID (bit 16, 0 = LE,
 * 1 = LO), LUT_ADDR (bits 0..9, first entry). Each DPU_LUT_ACCESS_DATA write then stores its
 * low 16 bits at the next address (notes: dpu-lut-activation.md, "auto-incrementing the
 * address"; conformance 05 words 2 and 516). A DATA write while ACCESS_TYPE = 0 (read) leaves
 * the tables alone: Mesa's plain-conv program writes ACCESS_CFG = 0 then ACCESS_DATA = 0
 * (conformance 01 words 93/94) and must not clobber entry 0. */
int rj_sim_dpu_on_write(rj_sim_task *t, uint32_t offset, uint32_t value)
{
    rj_sim *sim = t->sim;
    if (offset == RJ_REG_DPU_LUT_ACCESS_CFG) {
        sim->lut.table = RJ_GET(value, DPU_LUT_ACCESS_CFG, LUT_TABLE_ID);
        sim->lut.cursor = RJ_GET(value, DPU_LUT_ACCESS_CFG, LUT_ADDR);
        return 0;
    }
    if (offset != RJ_REG_DPU_LUT_ACCESS_DATA)
        return 0;
    if (!RJ_SIM_FIELD(sim, DPU_LUT_ACCESS_CFG, LUT_ACCESS_TYPE))
        return 0;
    if (sim->lut.cursor >= RJ_LUT_ENTRIES)
        return rj_fail(t->err, RJ_EUNSUPP,
                       "job %u task %u: DPU_LUT_ACCESS_DATA: write to %s entry %u, past the %u "
                       "entries of an RK3588 LUT table (notes: encodings/dpu-lut-activation.md); "
                       "upload at most %u entries after each DPU_LUT_ACCESS_CFG",
                       t->job_index, t->task_index, sim->lut.table ? "LO" : "LE",
                       sim->lut.cursor, RJ_LUT_ENTRIES, RJ_LUT_ENTRIES);
    int16_t *tab = table_rw(sim, sim->lut.table ? RJ_LUT_LO : RJ_LUT_LE);
    tab[sim->lut.cursor++] = (int16_t)RJ_GET(value, DPU_LUT_ACCESS_DATA, LUT_ACCESS_DATA);
    return 0;
}

/* ---- geometry -------------------------------------------------------------------------- */

typedef struct lut_geom {
    int64_t start, end;   /* index range covered by the table */
    uint32_t sel;         /* step = 2^sel index units per segment */
    uint32_t segs;        /* (end - start) >> sel */
    int32_t uscale, oscale;
    uint32_t ushift, oshift;
} lut_geom;

static void geom(const rj_sim *sim, int id, lut_geom *g)
{
    /* LE covers [LE_START, LE_END], LO covers [LO_START, LO_END] in index units; the
     * INDEX_SELECT fields give the step 2^sel (notes: dpu-lut-activation.md, "table step =
     * 2^5 = 32 index units"). Out-of-range inputs extrapolate with the table's own slope
     * registers: UFLOW below START, OFLOW above END (notes: same page, "Out-of-table inputs
     * extrapolate linearly"; the register database gives each table UFLOW and OFLOW fields). */
    uint32_t slope_scale, slope_shift;
    if (id == RJ_LUT_LE) {
        g->start = (int32_t)rj_sim_reg(sim, RJ_REG_DPU_LUT_LE_START);
        g->end = (int32_t)rj_sim_reg(sim, RJ_REG_DPU_LUT_LE_END);
        g->sel = RJ_SIM_FIELD(sim, DPU_LUT_INFO, LUT_LE_INDEX_SELECT);
        slope_scale = rj_sim_reg(sim, RJ_REG_DPU_LUT_LE_SLOPE_SCALE);
        slope_shift = rj_sim_reg(sim, RJ_REG_DPU_LUT_LE_SLOPE_SHIFT);
    } else {
        g->start = (int32_t)rj_sim_reg(sim, RJ_REG_DPU_LUT_LO_START);
        g->end = (int32_t)rj_sim_reg(sim, RJ_REG_DPU_LUT_LO_END);
        g->sel = RJ_SIM_FIELD(sim, DPU_LUT_INFO, LUT_LO_INDEX_SELECT);
        slope_scale = rj_sim_reg(sim, RJ_REG_DPU_LUT_LO_SLOPE_SCALE);
        slope_shift = rj_sim_reg(sim, RJ_REG_DPU_LUT_LO_SLOPE_SHIFT);
    }
    /* Slope scales are 16-bit fields; read as signed (NVDLA's slope scale is a signed int16,
     * an inference: every slope in the notes is positive). */
    g->uscale = (int16_t)(slope_scale & 0xffffu);
    g->oscale = (int16_t)(slope_scale >> 16);
    g->ushift = slope_shift & 0x1fu;
    g->oshift = (slope_shift >> 5) & 0x1fu;
    g->segs = 0;
    if (g->sel < 31 && g->end > g->start)
        g->segs = (uint32_t)((g->end - g->start) >> g->sel);
}

int rj_sim_lut_validate(rj_sim_task *t)
{
    const rj_sim *sim = t->sim;
    uint32_t cfg = rj_sim_reg(sim, RJ_REG_DPU_LUT_CFG);
    /* The only LUT_CFG the notes document is the LE+LO hybrid:
     * HYBRID_PRIORITY(1) | OFLOW_PRIORITY(1) | LO_LE_MUX(2) = 0x68 (dpu-lut-activation.md).
     * Single-table modes, other priorities, EXPAND_EN/ROAD_SEL/CAL_SEL are not modelled. */
    if (cfg != 0x68u)
        return rj_fail(t->err, RJ_EUNSUPP,
                       "job %u task %u: DPU_LUT_CFG = 0x%x: only the LE/LO hybrid setting 0x68 "
                       "(LUT_HYBRID_PRIORITY=1, LUT_OFLOW_PRIORITY=1, LUT_LO_LE_MUX=2) is "
                       "modelled (notes: encodings/dpu-lut-activation.md)",
                       t->job_index, t->task_index, cfg);
    static const char *const names[2] = {"LE", "LO"};
    for (int id = 0; id < 2; id++) {
        lut_geom g;
        geom(sim, id, &g);
        if (g.sel >= 31 || g.end <= g.start || ((g.end - g.start) & ((1ll << g.sel) - 1)) != 0 ||
            g.segs == 0 || g.segs > RJ_LUT_ENTRIES - 1)
            return rj_fail(t->err, RJ_EUNSUPP,
                           "job %u task %u: DPU_LUT_%s_START/END = %lld/%lld with "
                           "LUT_%s_INDEX_SELECT = %u: the table must span a positive whole "
                           "number of 2^sel steps, at most %u segments (513 entries; notes: "
                           "encodings/dpu-lut-activation.md)",
                           t->job_index, t->task_index, names[id], (long long)g.start,
                           (long long)g.end, names[id], g.sel, RJ_LUT_ENTRIES - 1);
        const int16_t *tab = table_ro(sim, id);
        if (!tab)
            return rj_fail(t->err, RJ_EINVAL,
                           "job %u task %u: DPU_EW_CFG runs the LUT (EW_LUT_BYPASS=0) but no %s "
                           "table was ever uploaded (DPU_LUT_ACCESS_CFG with LUT_ACCESS_TYPE=1, then "
                           "DPU_LUT_ACCESS_DATA words)", t->job_index, t->task_index, names[id]);
        if (!(sim->flags & RJ_SIM_STRICT))
            continue;
        for (uint32_t i = 0; i <= g.segs; i++) {
            if (tab[i] != 0)
                continue;
            /* QUIRK 4: an entry of exactly 0 decodes to ~4.0 instead of 0 (notes:
             * dpu-lut-activation.md, "a q=0 LUT table entry mis-decodes"). */
            return rj_sim_hazard(t, "DPU_LUT_ACCESS_DATA", "QUIRK 4 (q=0 LUT entry)",
                                 "%s table entry %u of 0..%u is exactly 0, which the hardware "
                                 "decodes as ~4.0; floor every entry to q >= 1 "
                                 "(notes: encodings/dpu-lut-activation.md)",
                                 names[id], i, g.segs);
        }
    }
    return 0;
}

/* ---- lookup ---------------------------------------------------------------------------- */

float rj_sim_lut_eval(const rj_sim *sim, float index, float mux, rj_lut_hit *hit)
{
    /* LE/LO selection follows the sign of the pre-BN-ALU value, not the table address
     * (notes: dpu-lut-activation.md, "the mux selects on sign(x)"); x = 0 goes to LO, the
     * table of inputs >= 0 (conformance 05 case.md). */
    int id = mux < 0.0f ? RJ_LUT_LE : RJ_LUT_LO;
    lut_geom g;
    geom(sim, id, &g);
    const int16_t *tab = table_ro(sim, id);
    double e0 = tab ? tab[0] : 0.0;
    double en = (tab && g.segs < RJ_LUT_ENTRIES) ? tab[g.segs] : 0.0;
    double x = index, q;
    rj_lut_hit h = {id, 0, 0};
    if (g.segs == 0 || g.segs >= RJ_LUT_ENTRIES) {
        q = 0.0; /* rj_sim_lut_validate refuses this geometry before any lookup */
    } else if (x < (double)g.start) {
        /* underflow: LUT[0] + (X - START) * UFLOW_SCALE / 2^UFLOW_SHIFT */
        h.region = -1;
        q = e0 + (x - (double)g.start) * (double)g.uscale / ldexp(1.0, (int)g.ushift);
    } else if (x > (double)g.end) {
        /* overflow: LUT[N] + (X - END) * OFLOW_SCALE / 2^OFLOW_SHIFT */
        h.region = 1;
        q = en + (x - (double)g.end) * (double)g.oscale / ldexp(1.0, (int)g.oshift);
    } else {
        /* linear interpolation between adjacent entries (notes: "The hardware linearly
         * interpolates between adjacent entries"); the fractional position is kept exact, an
         * inference: the hardware's fraction width is not documented. */
        double pos = (x - (double)g.start) / ldexp(1.0, (int)g.sel);
        int32_t seg = (int32_t)floor(pos);
        if (seg >= (int32_t)g.segs)
            seg = (int32_t)g.segs - 1;
        if (seg < 0)
            seg = 0;
        double frac = pos - seg;
        double a = tab ? tab[seg] : 0.0, b = tab ? tab[seg + 1] : 0.0;
        q = a + (b - a) * frac;
        h.seg = seg;
    }
    if (hit)
        *hit = h;
    return (float)q;
}

float rj_sim_lut_apply(const rj_sim *sim, float x)
{
    /* Without a BN ALU bias the mux value is the table address itself. */
    return rj_sim_lut_eval(sim, x, x, NULL);
}

uint32_t rj_sim_lut_flat_run(const rj_sim *sim, int table, int32_t seg, int16_t *value)
{
    const int16_t *tab = table_ro(sim, table);
    if (!tab || seg < 0 || (uint32_t)seg + 1 >= RJ_LUT_ENTRIES) {
        if (value)
            *value = 0;
        return 1;
    }
    int16_t v = tab[seg];
    if (value)
        *value = v;
    if (tab[seg + 1] != v)
        return 1;
    int32_t lo = seg, hi = seg + 1;
    while (lo > 0 && tab[lo - 1] == v)
        lo--;
    while ((uint32_t)hi + 1 < RJ_LUT_ENTRIES && tab[hi + 1] == v)
        hi++;
    return (uint32_t)(hi - lo + 1);
}
