#ifndef RJ_SIM_INTERNAL_H
#define RJ_SIM_INTERNAL_H
/* Contract between the simulator's parts:
 *   sim.c   PC: word decode, register file, task trailer, self-chaining, job loop
 *   cna.c   CNA + CORE: feature/weight fetch from their cube layouts, CBUF, the MAC array
 *   dpu.c   DPU + DPU_RDMA: BS/BN/EW stages, OUT_CVT, output writers, flying mode
 *   lut.c   DPU LUT: table upload and lookup/interpolation
 *   ppu.c   PPU + PPU_RDMA: pooling
 * Each modelled behaviour cites its source (a notes page or a register field). */
#include <stddef.h>
#include <stdint.h>

#include "rj_regs.h"
#include "rj_sim.h"

/* Register offsets span 0x0000..0x7FFF across PC..PPU_RDMA (rj_regs.h), so one flat file
 * indexed by offset/4 holds every block. */
#define RJ_SIM_NREGS (0x8000u / 4u)

typedef struct rj_sim_lut {
    /* DPU LUT tables as uploaded through LUT_ACCESS_CFG/LUT_ACCESS_DATA: LE and LO, 513
     * entries each, 16-bit signed (notes: encodings/dpu-lut-activation.md; conformance 05). */
    int16_t le[513];
    int16_t lo[513];
    uint32_t cursor;   /* next entry index of the table being written */
    uint32_t table;    /* 0 = LE, 1 = LO, as selected by LUT_ACCESS_CFG */
    uint32_t loaded;   /* bit per table: written at least once */
} rj_sim_lut;

struct rj_cbuf_state; /* CNA-private: what the CBUF holds, for DATA_REUSE/WEIGHT_REUSE */

struct rj_sim {
    uint32_t flags;
    uint32_t regs[RJ_SIM_NREGS];
    uint8_t written[RJ_SIM_NREGS]; /* 1 if written by the current task */
    rj_sim_lut lut;
    struct rj_cbuf_state *cbuf;
    rj_sim_stats stats;
    struct rj_sim_kick *cur_kick; /* appended by sim A: the kick being run (sim.c) */
};

/* Everything a block needs while one task runs. */
typedef struct rj_sim_task {
    rj_sim *sim;
    const rj_region *regions;
    uint32_t nregions;
    uint32_t job_index;
    uint32_t task_index;   /* index within the job, chained tasks included */
    uint32_t enable_mask;  /* the PC_OPERATION_ENABLE value of the trailer */
    rj_err *err;
} rj_sim_task;

static inline uint32_t rj_sim_reg(const rj_sim *s, uint32_t offset) { return s->regs[offset / 4u]; }
static inline int rj_sim_written(const rj_sim *s, uint32_t offset) { return s->written[offset / 4u]; }
#define RJ_SIM_FIELD(sim, REG, F) RJ_GET(rj_sim_reg((sim), RJ_REG_##REG), REG, F)

/* Host pointer for [iova, iova+len) if it lies inside one region; otherwise NULL with an
 * RJ_EFAULT (strict: RJ_EHAZARD "address outside every BO") error naming `what`. */
uint8_t *rj_sim_mem(rj_sim_task *t, uint64_t iova, uint64_t len, const char *what);

/* Fail the current task with `code`: "job J task T: <message>". Returns code. */
int rj_sim_fail(rj_sim_task *t, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Report a hardware hazard: "job J task T: REG: <quirk name>: <detail>". Returns RJ_EHAZARD. */
int rj_sim_hazard(rj_sim_task *t, const char *reg, const char *quirk, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The CORE's accumulator cube handed to the DPU: element (h, w, c) at [(h*width + w)*channels + c].
 * fp16/bf16 paths accumulate in fp32 (f); int8 paths in int32 (i). */
typedef struct rj_sim_acc {
    uint32_t width, height, channels;
    int is_int;
    float *f;
    int32_t *i;
    /* Integer path with DPU_BS_OW_CFG.OD_BYPASS = 0 (CPEND): the window sum S of the CNA's input
     * at each output position, pad taps at the pad value, over every programmed input channel
     * ([width*height]) or, for depthwise, per channel ([width*height*channels]); NULL otherwise
     * (notes: depthwise-conv.md "DPU_BS_OW_OP is the CPEND operand"). */
    int64_t *wsum;
    int wsum_per_channel;
    uint32_t clip_truncate; /* CORE_CLIP_TRUNCATE the integer sums were rounded by (cna.c) */
} rj_sim_acc;

/* cna.c: run CNA+CORE for the current task and hand the accumulator to rj_sim_dpu_run. */
int rj_sim_conv_run(rj_sim_task *t);
/* dpu.c: post-process and write out. acc == NULL means DPU-only "flying" mode, where the
 * DPU reads its source cube from memory through DPU_RDMA. */
int rj_sim_dpu_run(rj_sim_task *t, const rj_sim_acc *acc);
/* dpu.c/lut.c: called by the decoder for every DPU register write (the LUT upload port is a
 * FIFO-style register, not plain state). */
int rj_sim_dpu_on_write(rj_sim_task *t, uint32_t offset, uint32_t value);
/* lut.c: apply the uploaded LUT to one value, following the LUT_* registers. */
float rj_sim_lut_apply(const rj_sim *sim, float x);
/* ppu.c: run PPU+PPU_RDMA pooling for the current task. */
int rj_sim_ppu_run(rj_sim_task *t);

/* fp16 <-> fp32 with round-to-nearest-even (F16C where available). */
float rj_f16_to_f32(uint16_t h);
uint16_t rj_f32_to_f16(float f);
void rj_f16_to_f32_n(const uint16_t *src, float *dst, size_t n);
void rj_f32_to_f16_n(const float *src, uint16_t *dst, size_t n);


/* ---- Appended by sim A (sim.c / cna.c owner); sim B: these are additive, nothing above
 * changed. ---- */

/* PC_OPERATION_ENABLE trailer bits -> blocks (seed page 003 section 3: 0x1D fires
 * PC/CNA/DPU/DPU_RDMA for a conv, 0x60 PPU/PPU_RDMA for pooling; CORE runs with CNA). */
#define RJ_SIM_EN_PC       (1u << 0)
#define RJ_SIM_EN_CNA      (1u << 2)
#define RJ_SIM_EN_DPU      (1u << 3)
#define RJ_SIM_EN_DPU_RDMA (1u << 4)
#define RJ_SIM_EN_PPU      (1u << 5)
#define RJ_SIM_EN_PPU_RDMA (1u << 6)

/* Per-kick context the PC keeps while one hardware kick runs (several tasks when the job
 * self-chains; notes: encodings/regcmd-task-model.md "Contiguous chaining"). */
typedef struct rj_sim_kick {
    uint32_t index;          /* kick number within the job */
    uint32_t ntasks;         /* TASK_NUMBER of this kick */
    uint32_t position;       /* 0-based position of the current task inside the kick */
    uint32_t conv_tasks_run; /* CNA/CORE tasks already retired in this kick (CACC hazard) */
} rj_sim_kick;

/* The register value the current task needs. Strict mode refuses a value the task did not
 * write itself (a delta task relying on state left by an earlier task: notes:
 * encodings/regcmd-task-model.md "delta regcmd doesn't fire"); otherwise the persisted
 * value is returned, as the register file keeps it across tasks and jobs.
 * Returns 0 or RJ_EHAZARD (with t->err filled). sim B may use it for DPU registers too. */
int rj_sim_need(rj_sim_task *t, uint32_t offset, const char *name, uint32_t *out);
#define RJ_SIM_NEED(t, REG, out) rj_sim_need((t), RJ_REG_##REG, #REG, (out))
/* The same inside a block's run function: return the hazard from the caller. */
#define RJ_SIM_REQUIRE(t, REG, out)                    \
    do {                                               \
        int require_rc_ = RJ_SIM_NEED((t), REG, (out)); \
        if (require_rc_)                               \
            return require_rc_;                        \
    } while (0)

/* The kick the current task belongs to (NULL outside a run). */
const rj_sim_kick *rj_sim_current_kick(const rj_sim_task *t);

/* cna.c: free the CBUF model (called by rj_sim_destroy). */
void rj_sim_cbuf_free(struct rj_cbuf_state *cbuf);

#include "rj_sim_debug.h" /* rj_sim_f16_selftest, rj_sim_last_acc */

#endif /* RJ_SIM_INTERNAL_H */
