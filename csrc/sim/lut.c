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

/* DPU_LUT_CFG fields (rk3588-registers.xml): CAL_SEL 7, HYBRID_PRIORITY 6, OFLOW_PRIORITY 5,
 * UFLOW_PRIORITY 4, LO_LE_MUX 3..2, EXPAND_EN 1, ROAD_SEL 0. The three priority bits are NVDLA's
 * (0 = LE, 1 = LO; NVDLA v1 C model, nvdla/hw cmod NV_NVDLA_cdp.cpp lookup_lut: the SDP LUT
 * shares the logic, NVDLA IAS "LUT programming"). LO_LE_MUX = 2 is the only value any public
 * program uses (notes: dpu-lut-activation.md; rocket-userspace activations and conformance 05
 * all write 0x68); the other values and the three remaining bits have no NVDLA counterpart and
 * no documentation. */
#define LUT_CFG_PRIORITY_BITS 0x70u
#define LUT_CFG_MUX_HYBRID 0x08u

int rj_sim_lut_validate(rj_sim_task *t)
{
    const rj_sim *sim = t->sim;
    uint32_t cfg = rj_sim_reg(sim, RJ_REG_DPU_LUT_CFG);
    if ((cfg & ~LUT_CFG_PRIORITY_BITS) != LUT_CFG_MUX_HYBRID)
        return rj_fail(t->err, RJ_EUNSUPP,
                       "job %u task %u: DPU_LUT_CFG = 0x%x: only LUT_LO_LE_MUX=2 with any of "
                       "LUT_HYBRID/OFLOW/UFLOW_PRIORITY is modelled (the NVDLA hybrid lookup; "
                       "LUT_EXPAND_EN, LUT_ROAD_SEL, LUT_CAL_SEL and other LO_LE_MUX values are "
                       "undocumented; notes: encodings/dpu-lut-activation.md)",
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
        if (!table_ro(sim, id))
            return rj_fail(t->err, RJ_EINVAL,
                           "job %u task %u: DPU_EW_CFG runs the LUT (EW_LUT_BYPASS=0) but no %s "
                           "table was ever uploaded (DPU_LUT_ACCESS_CFG with LUT_ACCESS_TYPE=1, then "
                           "DPU_LUT_ACCESS_DATA words)", t->job_index, t->task_index, names[id]);
    }
    /* QUIRK 4 (a q = 0 entry) is no longer refused here, at table load: the hardware evidence
     * ties it to entries a lookup reads through a BN-ALU-biased index (dpu.c, lut_hazards). */
    return 0;
}

/* ---- lookup ---------------------------------------------------------------------------- */

/* One table's own lookup of `x` (index units), as NVDLA's C model computes each of the pair
 * before choosing: x <= START underflows and extrapolates from entry 0 with the UFLOW slope,
 * x >= END overflows and extrapolates from entry N with the OFLOW slope, anything between
 * interpolates linearly (NVDLA cmod lookup_lut; notes: dpu-lut-activation.md "Out-of-table
 * inputs extrapolate linearly", "linearly interpolates between adjacent entries"). At START and
 * END both forms give the entry itself. The fractional position is kept exact (inference: NVDLA
 * keeps 16 fraction bits, more than the 2^5 step of every public RK3588 table needs). */
static double table_lookup(const rj_sim *sim, int id, double x, rj_lut_hit *h)
{
    lut_geom g;
    geom(sim, id, &g);
    const int16_t *tab = table_ro(sim, id);
    h->table = id;
    h->seg = 0;
    h->zero_read = 0;
    if (!tab || g.segs == 0 || g.segs >= RJ_LUT_ENTRIES) {
        h->region = 0;
        return 0.0; /* rj_sim_lut_validate refuses this geometry before any lookup */
    }
    if (x <= (double)g.start) {
        h->region = -1;
        return tab[0] + (x - (double)g.start) * (double)g.uscale / ldexp(1.0, (int)g.ushift);
    }
    if (x >= (double)g.end) {
        h->region = 1;
        return tab[g.segs] + (x - (double)g.end) * (double)g.oscale / ldexp(1.0, (int)g.oshift);
    }
    h->region = 0;
    double pos = (x - (double)g.start) / ldexp(1.0, (int)g.sel);
    int32_t seg = (int32_t)floor(pos);
    if (seg >= (int32_t)g.segs)
        seg = (int32_t)g.segs - 1;
    if (seg < 0)
        seg = 0;
    double frac = pos - seg;
    double a = tab[seg], b = tab[seg + 1];
    h->seg = seg;
    /* An entry the interpolation gives weight to is "read" (QUIRK 4 bookkeeping). */
    h->zero_read = (a == 0.0 && frac < 1.0) || (b == 0.0 && frac > 0.0);
    return a + (b - a) * frac;
}

float rj_sim_lut_eval(const rj_sim *sim, float index, rj_lut_hit *hit)
{
    /* Both tables look the *index* up (the value after the whole BN stage, BN-ALU bias
     * included) and the result is chosen as NVDLA's hybrid LUT does (cmod lookup_lut): the one
     * table that hits; both underflowing -> UFLOW_PRIORITY; both overflowing -> OFLOW_PRIORITY;
     * otherwise (both hit, or one under- and one overflows) -> HYBRID_PRIORITY; 0 = LE, 1 = LO.
     * Evidence that RK3588 selects on the index and not on the pre-bias sign of x: the
     * shifted single-table programs (rocket-userspace rocket_activation.c build_lut_shifted:
     * the function in LO over [0, 16384], LE flat at LO[0], BN_ALU = -x_lo*scale) compute exp
     * over [-16, 0], softplus, ELU and abs on silicon to their references (seed 000,
     * notes dpu-lut-activation.md "EXP", "More activation kinds"); with a sign(x) choice every
     * x < 0 would read the flat LE table. With conformance 05's geometry (LE [-16384, 0], LO
     * [0, 16384], LUT_CFG 0x68) this rule picks LE for index < 0 and LO for index >= 0. */
    rj_lut_hit le, lo;
    const double x = index;
    const double q_le = table_lookup(sim, RJ_LUT_LE, x, &le);
    const double q_lo = table_lookup(sim, RJ_LUT_LO, x, &lo);
    uint32_t cfg = rj_sim_reg(sim, RJ_REG_DPU_LUT_CFG);
    int use_lo;
    if (le.region < 0 && lo.region < 0)
        use_lo = RJ_GET(cfg, DPU_LUT_CFG, LUT_UFLOW_PRIORITY);
    else if (le.region > 0 && lo.region > 0)
        use_lo = RJ_GET(cfg, DPU_LUT_CFG, LUT_OFLOW_PRIORITY);
    else if ((le.region == 0) != (lo.region == 0))
        use_lo = lo.region == 0;
    else
        use_lo = RJ_GET(cfg, DPU_LUT_CFG, LUT_HYBRID_PRIORITY);
    if (hit)
        *hit = use_lo ? lo : le;
    return (float)(use_lo ? q_lo : q_le);
}

float rj_sim_lut_apply(const rj_sim *sim, float x)
{
    return rj_sim_lut_eval(sim, x, NULL);
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
