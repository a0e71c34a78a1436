/* The PC: regcmd word decode, the register file, the task trailer, self-chaining, the job loop.
 *
 * Sources (facts only; the code is ours):
 *  - word format (op << 48) | (value << 16) | reg, op high byte = block, low byte 0x01 write,
 *    0x41 OP_40, 0x81 OP_ENABLE, op 0 filler: the conformance README, notes
 *    encodings/regcmd-task-model.md, Mesa rkt_regcmd.c trailer ("before op_en, 0x0041... must be
 *    set").
 *  - enable bitmap: seed page 003 section 3 (0x1D = PC/CNA/DPU/DPU_RDMA, 0x60 = PPU/PPU_RDMA).
 *  - kernel per-kick setup (TASK_NUMBER = 1, REGISTER_AMOUNTS = (count+1)/2 - 1, the kernel
 *    writes CNA/CORE S_POINTER itself): linux drivers/accel/rocket/rocket_job.c.
 *  - self-chaining (PC_BASE_ADDRESS redirect in the trailer, TASK_NUMBER = N is the true stop,
 *    the batched kernel sets TASK_NUMBER = task_count): notes regcmd-task-model.md, seed 000.
 *  - register state persists across tasks/jobs but must not be relied on: notes
 *    regcmd-task-model.md. We keep the persisted file (as silicon) and, in strict mode,
 *    refuse a task whose enabled blocks read a register it did not write (rj_sim_need).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rj_runtime.h" /* rj_env_switch: RJ_SIM_FAITHFUL from the environment */
#include "sim_internal.h"

#define OP_LOW_WRITE 0x01u
#define OP_LOW_OP40 0x41u
#define OP_LOW_ENABLE 0x81u

/* Every bit of the enable bitmap we know the meaning of (seed 003 section 3). Bit 1 is not
 * documented anywhere we can cite, so a program setting it is refused rather than guessed. */
#define RJ_SIM_EN_KNOWN (RJ_SIM_EN_PC | RJ_SIM_EN_CNA | RJ_SIM_EN_DPU | RJ_SIM_EN_DPU_RDMA | \
                         RJ_SIM_EN_PPU | RJ_SIM_EN_PPU_RDMA)

/* ---- small helpers ------------------------------------------------------------------- */

typedef struct block_info {
    uint32_t lo, hi; /* register offset range [lo, hi) */
    uint32_t target; /* op high byte << 8 */
    const char *name;
} block_info;

/* Register offset ranges per block (notes: hardware-overview.md "Register bases"; rj_regs.h). */
static const block_info BLOCKS[] = {
    {0x0000u, 0x1000u, RJ_TARGET_PC, "PC"},
    {0x1000u, 0x2000u, RJ_TARGET_CNA, "CNA"},
    {0x3000u, 0x4000u, RJ_TARGET_CORE, "CORE"},
    {0x4000u, 0x5000u, RJ_TARGET_DPU, "DPU"},
    {0x5000u, 0x6000u, RJ_TARGET_DPU_RDMA, "DPU_RDMA"},
    {0x6000u, 0x7000u, RJ_TARGET_PPU, "PPU"},
    {0x7000u, 0x8000u, RJ_TARGET_PPU_RDMA, "PPU_RDMA"},
};

static const block_info *block_of_offset(uint32_t reg)
{
    for (size_t i = 0; i < sizeof BLOCKS / sizeof BLOCKS[0]; i++)
        if (reg >= BLOCKS[i].lo && reg < BLOCKS[i].hi)
            return &BLOCKS[i];
    return NULL;
}

static const char *block_name_of_target(uint32_t target)
{
    for (size_t i = 0; i < sizeof BLOCKS / sizeof BLOCKS[0]; i++)
        if (BLOCKS[i].target == target)
            return BLOCKS[i].name;
    return "no block";
}

int rj_sim_fail(rj_sim_task *t, int code, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return rj_fail(t->err, code, "job %u task %u: %s", t->job_index, t->task_index, msg);
}

int rj_sim_hazard(rj_sim_task *t, const char *reg, const char *quirk, const char *fmt, ...)
{
    char detail[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return rj_fail(t->err, RJ_EHAZARD, "job %u task %u: %s: %s: %s", t->job_index, t->task_index,
                   reg, quirk, detail);
}

uint8_t *rj_sim_mem(rj_sim_task *t, uint64_t iova, uint64_t len, const char *what)
{
    if (len == 0)
        len = 1;
    for (uint32_t i = 0; i < t->nregions; i++) {
        const rj_region *r = &t->regions[i];
        if (iova >= r->iova && iova - r->iova <= r->size && len <= r->size - (iova - r->iova))
            return r->host + (iova - r->iova);
    }
    if (t->sim->flags & RJ_SIM_STRICT) {
        rj_sim_hazard(t, what, "address outside every BO",
                      "[0x%08llx, 0x%08llx) is not inside one buffer object; on silicon this is an "
                      "IOMMU fault. Point %s into a buffer of the job.",
                      (unsigned long long)iova, (unsigned long long)(iova + len), what);
    } else {
        rj_fail(t->err, RJ_EFAULT,
                "job %u task %u: %s: [0x%08llx, 0x%08llx) is not inside one buffer object",
                t->job_index, t->task_index, what, (unsigned long long)iova,
                (unsigned long long)(iova + len));
    }
    return NULL;
}

int rj_sim_need(rj_sim_task *t, uint32_t offset, const char *name, uint32_t *out)
{
    *out = rj_sim_reg(t->sim, offset);
    if ((t->sim->flags & RJ_SIM_STRICT) && !rj_sim_written(t->sim, offset))
        return rj_sim_hazard(t, name, "stale register state (delta task)",
                             "the enabled blocks read this register but the task does not write it; "
                             "the value left by an earlier task does not reach the executing register "
                             "group (notes: encodings/regcmd-task-model.md). Emit the full register "
                             "set in every task.");
    return 0;
}

const rj_sim_kick *rj_sim_current_kick(const rj_sim_task *t) { return t->sim->cur_kick; }

/* ---- create / destroy / stats ------------------------------------------------------- */

int rj_sim_create(rj_sim **out, uint32_t flags, rj_err *err)
{
    if (!out)
        return rj_fail(err, RJ_EINVAL, "rj_sim_create: out must not be NULL");
    *out = NULL;
    const uint32_t known = RJ_SIM_STRICT | RJ_SIM_FAITHFUL;
    if (flags & ~known)
        return rj_fail(err, RJ_EINVAL, "rj_sim_create: unknown flag bits 0x%x (RJ_SIM_STRICT = 1 and "
                       "RJ_SIM_FAITHFUL = 2 exist)", flags & ~known);
    int faithful = 0;
    int rc = rj_env_switch(RJ_ENV_SIM_FAITHFUL, &faithful, err);
    if (rc)
        return rc;
    if (faithful)
        flags |= RJ_SIM_FAITHFUL;
    rj_sim *sim = calloc(1, sizeof *sim);
    if (!sim)
        return rj_fail(err, RJ_ENOMEM, "rj_sim_create: out of memory for the simulator state");
    sim->flags = flags;
    *out = sim;
    return 0;
}

void rj_sim_destroy(rj_sim *sim)
{
    if (!sim)
        return;
    rj_sim_cbuf_free(sim->cbuf);
    free(sim);
}

void rj_sim_get_stats(const rj_sim *sim, rj_sim_stats *out)
{
    if (sim && out)
        *out = sim->stats;
}

/* ---- one task ---------------------------------------------------------------------- */

typedef struct task_trailer {
    uint32_t enable;        /* OP_ENABLE value */
    int has_redirect;       /* a nonzero PC_BASE_ADDRESS was written (chain link) */
    uint64_t next_iova;     /* PC_SOURCE_ADDR << 4 */
    uint32_t next_amount;   /* PC_REGISTER_AMOUNTS.PC_DATA_AMOUNT written in the trailer */
} task_trailer;

/* Decode and apply one task's words; fills `tr`. */
static int decode_task(rj_sim_task *t, const uint8_t *words, uint32_t count, task_trailer *tr)
{
    rj_sim *sim = t->sim;
    int strict = (sim->flags & RJ_SIM_STRICT) != 0;
    int seen_op40 = 0, seen_enable = 0;
    memset(tr, 0, sizeof *tr);
    memset(sim->written, 0, sizeof sim->written);

    for (uint32_t i = 0; i < count; i++) {
        uint64_t w;
        memcpy(&w, words + 8u * i, 8); /* little-endian host, as the NPU */
        uint32_t op = (uint32_t)(w >> 48);
        uint32_t value = (uint32_t)(w >> 16);
        uint32_t reg = (uint32_t)(w & 0xFFFFu);
        if (op == 0)
            continue; /* OP_NONE filler (trailer slot count-4, alignment padding) */
        if (seen_enable)
            return rj_fail(t->err, RJ_EINVAL,
                           "job %u task %u: word %u (0x%016llx) follows the PC_OPERATION_ENABLE word; "
                           "a task ends at its OP_ENABLE trailer (only OP_NONE filler may follow)",
                           t->job_index, t->task_index, i, (unsigned long long)w);
        uint32_t low = op & 0xFFu, target = op & 0xFF00u;
        if (low == OP_LOW_OP40) {
            seen_op40 = 1;
            continue;
        }
        if (low == OP_LOW_ENABLE) {
            if (reg != RJ_REG_PC_OPERATION_ENABLE || target != 0)
                return rj_fail(t->err, RJ_EINVAL,
                               "job %u task %u: word %u (0x%016llx): an OP_ENABLE word must be "
                               "0x0081 << 48 | mask << 16 | 0x0008 (PC_OPERATION_ENABLE)",
                               t->job_index, t->task_index, i, (unsigned long long)w);
            if (strict && !seen_op40)
                return rj_sim_hazard(t, "PC_OPERATION_ENABLE", "OP_40 missing",
                                     "word %u enables the blocks without the 0x0041 OP_40 word the TRM "
                                     "requires before op_en (Mesa rkt_regcmd.c trailer)", i);
            tr->enable = value;
            seen_enable = 1;
            continue;
        }
        if (low != OP_LOW_WRITE)
            return rj_fail(t->err, RJ_EINVAL,
                           "job %u task %u: word %u (0x%016llx): unknown op 0x%04x (expected low byte "
                           "0x01 write, 0x41 OP_40, 0x81 OP_ENABLE, or op 0 filler)",
                           t->job_index, t->task_index, i, (unsigned long long)w, op);
        const block_info *b = block_of_offset(reg);
        if (!b || (reg & 3u))
            return rj_fail(t->err, RJ_EINVAL,
                           "job %u task %u: word %u (0x%016llx): register offset 0x%04x is not a "
                           "register of any block", t->job_index, t->task_index, i,
                           (unsigned long long)w, reg);
        if (b->target != target)
            return rj_fail(t->err, RJ_EINVAL,
                           "job %u task %u: word %u (0x%016llx): op target 0x%02x names block %s but "
                           "register 0x%04x belongs to block %s (op high byte must be 0x%02x)",
                           t->job_index, t->task_index, i, (unsigned long long)w, target >> 8,
                           block_name_of_target(target), reg, b->name, b->target >> 8);

        if (strict && (reg == RJ_REG_CNA_S_POINTER || reg == RJ_REG_CORE_S_POINTER))
            return rj_sim_hazard(t, reg == RJ_REG_CNA_S_POINTER ? "CNA_S_POINTER" : "CORE_S_POINTER",
                                 "userspace S_POINTER write",
                                 "word %u: the kernel writes CNA/CORE S_POINTER with its per-core bit "
                                 "before every task (rocket_job.c); a regcmd write drops or mis-sets that "
                                 "bit and the task never completes (seed page 003 section 4). Remove it.",
                                 i);
        if (reg == RJ_REG_PC_TASK_CON)
            return rj_fail(t->err, RJ_EUNSUPP,
                           "job %u task %u: word %u: PC_TASK_CON is programmed by the kernel per kick "
                           "(TASK_NUMBER = 1, or task_count for a batched job); the simulator does not "
                           "model a regcmd write to it. Self-chain through the trailer instead.",
                           t->job_index, t->task_index, i);
        if (reg == RJ_REG_PC_BASE_ADDRESS) {
            uint32_t addr = value & 0xFFFFFFF0u; /* PC_SOURCE_ADDR, bits 31..4 */
            tr->has_redirect = addr != 0;      /* Mesa's unchained multi-task trailer writes 0 */
            tr->next_iova = addr;
        } else if (reg == RJ_REG_PC_REGISTER_AMOUNTS) {
            tr->next_amount = RJ_GET(value, PC_REGISTER_AMOUNTS, PC_DATA_AMOUNT);
        }
        sim->regs[reg / 4u] = value;
        sim->written[reg / 4u] = 1;
        if (b->target == RJ_TARGET_DPU) {
            int rc = rj_sim_dpu_on_write(t, reg, value);
            if (rc)
                return rc;
        }
    }
    if (!seen_enable)
        return rj_fail(t->err, RJ_EINVAL,
                       "job %u task %u: the %u words end without the PC_OPERATION_ENABLE trailer word "
                       "(0x0081 << 48 | mask << 16 | 0x0008); the PC would never fire the blocks",
                       t->job_index, t->task_index, count);
    return 0;
}

/* The MRDMA trap (notes: encodings/mrdma-trap.md): a conv/matmul program must emit the
 * DPU_RDMA block and enable it, and a non-eltwise program must set MRDMA_DISABLE, else the DPU
 * read DMA waits for data that never comes and the job times out. */
static int check_mrdma_trap(rj_sim_task *t)
{
    rj_sim *sim = t->sim;
    if (!(t->enable_mask & RJ_SIM_EN_DPU_RDMA))
        return rj_sim_hazard(t, "PC_OPERATION_ENABLE", "MRDMA trap",
                             "the task drives CNA/CORE/DPU (mask 0x%x) without the DPU_RDMA enable bit "
                             "(bit 4; a conv uses 0x1D); the job would time out with the output untouched",
                             t->enable_mask);
    int any = 0;
    for (uint32_t r = 0x5000u; r < 0x6000u; r += 4u)
        if (rj_sim_written(sim, r)) {
            any = 1;
            break;
        }
    if (!any)
        return rj_sim_hazard(t, "DPU_RDMA", "MRDMA trap",
                             "the task drives CNA/CORE/DPU but writes no DPU_RDMA (0x5xxx) register; emit "
                             "the DPU_RDMA block with MRDMA_DISABLE=1 for a plain conv/matmul, or the job "
                             "times out");
    uint32_t fm;
    int rc = RJ_SIM_NEED(t, DPU_RDMA_RDMA_FEATURE_MODE_CFG, &fm);
    if (rc)
        return rc;
    if (!RJ_GET(fm, DPU_RDMA_RDMA_FEATURE_MODE_CFG, MRDMA_DISABLE) &&
        !RJ_GET(fm, DPU_RDMA_RDMA_FEATURE_MODE_CFG, COMB_USE) &&
        !RJ_GET(fm, DPU_RDMA_RDMA_FEATURE_MODE_CFG, FLYING_MODE))
        return rj_sim_hazard(t, "DPU_RDMA_RDMA_FEATURE_MODE_CFG", "MRDMA trap",
                             "value 0x%x leaves MRDMA enabled (MRDMA_DISABLE=0) with nothing feeding it "
                             "(COMB_USE=0, no flying mode); set MRDMA_DISABLE=1 for a plain conv", fm);
    return 0;
}

/* Run the blocks the enable bitmap fires, in pipeline order. */
static int run_blocks(rj_sim_task *t)
{
    uint32_t m = t->enable_mask;
    int strict = (t->sim->flags & RJ_SIM_STRICT) != 0;
    if (m & ~RJ_SIM_EN_KNOWN)
        return rj_fail(t->err, RJ_EUNSUPP,
                       "job %u task %u: PC_OPERATION_ENABLE mask 0x%x sets bit(s) 0x%x whose block is not "
                       "documented (known: bit0 PC, bit2 CNA+CORE, bit3 DPU, bit4 DPU_RDMA, bit5 PPU, bit6 "
                       "PPU_RDMA; seed page 003)", t->job_index, t->task_index, m, m & ~RJ_SIM_EN_KNOWN);
    if (m & RJ_SIM_EN_CNA) {
        if (!(m & RJ_SIM_EN_DPU))
            return rj_fail(t->err, RJ_EUNSUPP,
                           "job %u task %u: mask 0x%x fires CNA/CORE without the DPU (bit 3); the conv "
                           "result has nowhere to go. A conv uses 0x1D.", t->job_index, t->task_index, m);
        if (strict) {
            int rc = check_mrdma_trap(t);
            if (rc)
                return rc;
        }
        int rc = rj_sim_conv_run(t); /* hands the accumulator to rj_sim_dpu_run */
        if (rc)
            return rc;
    } else if (m & RJ_SIM_EN_DPU) {
        int rc = rj_sim_dpu_run(t, NULL); /* flying mode: DPU_RDMA feeds the DPU */
        if (rc)
            return rc;
    } else if (m & RJ_SIM_EN_DPU_RDMA) {
        return rj_fail(t->err, RJ_EUNSUPP,
                       "job %u task %u: mask 0x%x fires DPU_RDMA without the DPU (bit 3)", t->job_index,
                       t->task_index, m);
    }
    if (m & (RJ_SIM_EN_PPU | RJ_SIM_EN_PPU_RDMA)) {
        int rc = rj_sim_ppu_run(t);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- jobs and kicks ---------------------------------------------------------------- */

/* Word count the PC fetches for a REGISTER_AMOUNTS value: the kernel programs
 * (count + 1) / 2 - 1 (rocket_job.c), i.e. 128-bit units minus one. */
static uint32_t words_of_amount(uint32_t amount) { return 2u * (amount + 1u); }

static int run_one_task(rj_sim *sim, rj_sim_task *t, uint64_t iova, uint32_t count, task_trailer *tr)
{
    if (count == 0)
        return rj_fail(t->err, RJ_EINVAL, "job %u task %u: regcmd_count is 0", t->job_index, t->task_index);
    uint8_t *words = rj_sim_mem(t, iova, (uint64_t)count * 8u, "regcmd");
    if (!words)
        return t->err ? t->err->code : RJ_EFAULT;
    int rc = decode_task(t, words, count, tr);
    if (rc)
        return rc;
    t->enable_mask = tr->enable;
    rc = run_blocks(t);
    sim->stats.tasks++;
    return rc;
}

int rj_sim_run_job(rj_sim *sim, const rj_region *regions, uint32_t nregions, const rj_task *tasks,
                   uint32_t ntasks, rj_err *err)
{
    if (err) {
        err->code = 0;
        err->msg[0] = 0;
    }
    if (!sim || (!tasks && ntasks) || (!regions && nregions))
        return rj_fail(err, RJ_EINVAL, "rj_sim_run_job: NULL simulator, task or region array");
    if (ntasks == 0)
        return rj_fail(err, RJ_EINVAL, "rj_sim_run_job: a job needs at least one task (rocket SUBMIT "
                                       "refuses task_count 0)");
    for (uint32_t i = 0; i < ntasks; i++)
        if (tasks[i].reserved)
            return rj_fail(err, RJ_EINVAL, "rj_sim_run_job: task %u: reserved must be zero", i);

    uint32_t job_index = (uint32_t)sim->stats.jobs;
    sim->stats.jobs++;
    rj_sim_task t = {sim, regions, nregions, job_index, 0, 0, err};
    rj_sim_kick kick;
    int rc = 0;

    uint32_t i = 0, nkick = 0;
    while (i < ntasks && rc == 0) {
        /* One kick. The kernel points the PC at task i with TASK_NUMBER = 1 (rocket_job.c). A
         * job whose first task self-chains (its trailer redirects the PC) is a batched job: the
         * kernel then sets TASK_NUMBER = task_count and kicks once (seed 000, notes
         * regcmd-task-model.md). */
        memset(&kick, 0, sizeof kick);
        kick.index = nkick++;
        kick.ntasks = 1;
        sim->cur_kick = &kick;
        sim->stats.kicks++;

        task_trailer tr;
        uint64_t iova = tasks[i].regcmd_iova;
        uint32_t count = tasks[i].regcmd_count;
        for (;;) {
            t.task_index = i;
            rc = run_one_task(sim, &t, iova, count, &tr);
            if (rc)
                break;
            if (kick.position == 0 && i == 0 && tr.has_redirect && ntasks > 1)
                kick.ntasks = ntasks; /* batched job */
            kick.position++;
            i++;
            if (kick.position >= kick.ntasks)
                break; /* TASK_NUMBER retired: the PC halts even if the link dangles */
            if (!tr.has_redirect) {
                rc = rj_fail(err, RJ_EINVAL,
                             "job %u task %u: self-chained kick of %u tasks, but this task's trailer has no "
                             "PC_BASE_ADDRESS redirect: the PC stops here and the remaining %u task(s) never "
                             "run (the job times out). Link every task but the last to the next one "
                             "(notes: encodings/regcmd-task-model.md).",
                             job_index, i - 1, kick.ntasks, kick.ntasks - kick.position);
                break;
            }
            /* Userspace lays the chain and the kernel's task list must agree (seed 000). */
            uint32_t want = words_of_amount(tr.next_amount);
            uint32_t listed = (tasks[i].regcmd_count + 1u) & ~1u;
            if (tr.next_iova != tasks[i].regcmd_iova || want != listed) {
                rc = rj_fail(err, RJ_EINVAL,
                             "job %u task %u: chain link points at 0x%08llx for %u words, but the job lists "
                             "task %u at 0x%08llx with %u words; the self-chained layout and the task list "
                             "must agree", job_index, i - 1, (unsigned long long)tr.next_iova, want, i,
                             (unsigned long long)tasks[i].regcmd_iova, tasks[i].regcmd_count);
                break;
            }
            iova = tr.next_iova;
            count = tasks[i].regcmd_count;
        }
    }
    sim->cur_kick = NULL;
    return rc;
}
