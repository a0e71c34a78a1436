#ifndef RJ_RUNTIME_H
#define RJ_RUNTIME_H
/* The runtime core: buffer objects, devices, jobs, programs and their step lists.
 *
 * Ownership: a device owns nothing but its contexts; a program owns its BOs (created on the
 * program's device) and frees them in reverse order on destroy. Every call that can fail
 * returns 0 or a negative RJ_E* code with a message in `err`; nothing aborts.
 *
 * Contexts ("ctx"): a device has one or more execution contexts. On the rocket driver a
 * context is one open fd, which is one scheduling entity and so at most one core at a time,
 * and it has its own 32-bit IOVA window (notes: perf/iova-and-multicore.md). A BO lives in
 * exactly one context and a job may only touch BOs of its own context. All devices model
 * this, so a program that mixes contexts fails the same way on the simulator as on silicon. */
#include <stdint.h>

#include "rj_err.h"
#include "runtime/rj_host_ops.h"
#include "sim/rj_sim.h"

/* ---- buffer objects ------------------------------------------------------------------- */

/* Shared with Python (cffi reads the fields). */
typedef struct rj_bo {
    uint8_t *host;   /* CPU mapping of the whole BO */
    uint64_t iova;   /* device address; always < 4 GiB (regcmd address fields are 32-bit) */
    uint64_t size;   /* bytes requested */
    uint32_t handle; /* device handle (GEM handle on rocket) */
    uint32_t ctx;    /* context the BO lives in */
    uint64_t map_size; /* bytes mapped (size rounded up to the page) */
} rj_bo;

/* ---- devices ---------------------------------------------------------------------------- */

typedef struct rj_device rj_device;

/* Counters every device keeps (bytes are the sizes of the BOs named by submitted jobs). */
typedef struct rj_device_stats {
    uint64_t jobs;          /* jobs submitted */
    uint64_t tasks;         /* uAPI tasks submitted */
    uint64_t kicks;         /* hardware starts: one per task, one per self-chained job */
    uint64_t submits;       /* submit calls (ioctls on rocket) */
    uint64_t waits;         /* fence waits (PREP_BO calls on rocket) */
    uint64_t syncs;         /* cache syncs for the device (FINI_BO on rocket) */
    uint64_t regcmd_bytes;  /* regcmd bytes named by submitted tasks */
    uint64_t in_bytes;      /* bytes of in-BOs of submitted jobs */
    uint64_t out_bytes;     /* bytes of out-BOs of submitted jobs */
    uint64_t bos_live;      /* BOs currently allocated */
    uint64_t bo_bytes_live;
    uint64_t bos_created;
} rj_device_stats;

/* A job as a device sees it: a target context, an ordered task list and BO lists.
 * A self-chained job runs as one kick: the compiler emitted the chaining words (each trailer
 * links the PC to the next task) and every task is still listed, as the batched submit of
 * notes: encodings/regcmd-task-model.md ("Contiguous chaining") expects; the runtime only
 * submits it and counts one kick. */
enum {
    RJ_JOB_SELF_CHAINED = 1u << 0,
};
#define RJ_JOB_KNOWN_FLAGS (RJ_JOB_SELF_CHAINED)

typedef struct rj_job {
    const rj_task *tasks;
    rj_bo *const *in_bos;
    rj_bo *const *out_bos;
    uint32_t ntasks;
    uint32_t n_in;
    uint32_t n_out;
    uint32_t ctx;
    uint32_t flags;         /* RJ_JOB_* */
    uint32_t reserved;      /* must be zero */
} rj_job;

enum {
    RJ_SIM_DEVICE = 1,
    RJ_ROCKET_DEVICE = 2,
    RJ_NULL_DEVICE = 3,
};

int rj_sim_device_create(rj_device **out, uint32_t nctx, uint32_t sim_flags, rj_err *err);
int rj_null_device_create(rj_device **out, uint32_t nctx, rj_err *err);
/* Frees the device now, or, while BOs created on it are alive, when the last one is freed
 * (so programs and devices may be released in any order). */
void rj_device_destroy(rj_device *dev);
uint32_t rj_device_kind(const rj_device *dev);
uint32_t rj_device_nctx(const rj_device *dev);
void rj_device_get_stats(const rj_device *dev, rj_device_stats *out);

int rj_bo_create(rj_device *dev, uint32_t ctx, uint64_t size, rj_bo **out, rj_err *err);
void rj_bo_destroy(rj_device *dev, rj_bo *bo);
/* Hand CPU writes to the device (FINI_BO on rocket). */
int rj_bo_sync_for_device(rj_device *dev, rj_bo *bo, rj_err *err);
/* Wait for writers and take the BO back for the CPU (PREP_BO on rocket). */
int rj_bo_sync_for_cpu(rj_device *dev, rj_bo *bo, int64_t timeout_ns, rj_err *err);

/* Submit jobs (they may run in parallel when their contexts differ), then fence them all.
 * timeout_ns is relative to the call; the device turns it into one absolute deadline. */
int rj_device_submit(rj_device *dev, const rj_job *jobs, uint32_t njobs, rj_err *err);
int rj_device_wait(rj_device *dev, const rj_job *jobs, uint32_t njobs, int64_t timeout_ns,
                   rj_err *err);

/* ---- host steps ------------------------------------------------------------------------- */

/* Element types: RJ_DT_* (rj_host_ops.h, the one table; host steps use F32..U8). */

/* Host step kinds; each has one entry in the host-step table (host_steps.c). */
enum {
    /* 1..4: retired (row max, per-row 1/sum and rsqrt scales, row gather; the compiler never
       emitted them: host ops do that work) */
    RJ_HOST_PACK = 5,           /* row-major -> cube layout (csrc/layout) */
    RJ_HOST_UNPACK = 6,         /* cube layout -> row-major (csrc/layout) */
    RJ_HOST_KIND_COUNT = 7,
};

/* One operand: a (BO, offset) address inside the program, a dtype and a row stride. */
typedef struct rj_operand {
    uint32_t bo;         /* program BO index; RJ_NO_BO = absent */
    uint32_t dtype;      /* RJ_DT_* */
    uint64_t offset;     /* bytes into the BO */
    uint64_t row_stride; /* bytes between rows; 0 = dense */
} rj_operand;
#define RJ_NO_BO 0xFFFFFFFFu

/* A host step, shared with Python. Unused operands have bo = RJ_NO_BO; unused params are 0. */
typedef struct rj_host_step {
    uint32_t kind;       /* RJ_HOST_* */
    uint32_t reserved;   /* must be zero */
    rj_operand src;
    rj_operand dst;
    rj_operand aux;
    uint32_t rows;
    uint32_t cols;       /* elements per row */
    float eps;
    uint32_t param[8];   /* kind-specific (see host_steps.c) */
    uint64_t param64[2];
} rj_host_step;

/* PACK / UNPACK: param[0] names the layout, the rest carry its fields:
 *   RJ_LAYOUT_CUBE       param[1..5] = height, width, channels, c2, esize;
 *                        param64[0..1] = line_stride, surf_stride (0 = dense)
 *   RJ_LAYOUT_WEIGHT     param[1..7] = kernels, channels, kh, kw, n_group, k_group, esize
 *   RJ_LAYOUT_DW_WEIGHT  param[1..5] = channels, kh, kw, group, esize
 * src (pack) / dst (unpack) is the dense row-major array; offsets only, strides unused. */
enum {
    RJ_LAYOUT_CUBE = 1,
    RJ_LAYOUT_WEIGHT = 2,
    RJ_LAYOUT_DW_WEIGHT = 3,
};

/* ---- programs --------------------------------------------------------------------------- */

typedef struct rj_program rj_program;

/* BO roles; the runtime uses them for checks and statistics. */
enum {
    RJ_BO_ARENA = 1,   /* activations: placed regions, reused by liveness */
    RJ_BO_WEIGHTS = 2, /* uploaded once */
    RJ_BO_REGCMD = 3,  /* register command words (relocation sources) */
    RJ_BO_IO = 4,      /* anything else the caller reads/writes */
};

/* A relocation: the regcmd word at `word_offset` bytes into BO `regcmd_bo` gets the value
 * field (bits 47..16) = iova(target_bo) + target_offset, ORed with the bits of the word's old
 * value selected by `keep_mask` (for address registers that share the word with low flag
 * bits); op (63..48) and register (15..0) are kept. */
typedef struct rj_reloc {
    uint32_t regcmd_bo;
    uint32_t target_bo;
    uint64_t word_offset;
    uint64_t target_offset;
    uint32_t keep_mask;
    uint32_t reserved; /* must be zero */
} rj_reloc;

/* Counters a program keeps across runs. */
typedef struct rj_program_stats {
    uint64_t runs;
    uint64_t steps;
    uint64_t npu_steps;
    uint64_t jobs;
    uint64_t tasks;       /* tasks executed, chained ones included */
    uint64_t kicks;
    uint64_t host_steps;
    uint64_t host_bytes;  /* bytes host steps read + wrote */
    uint64_t upload_bytes;   /* rj_program_write */
    uint64_t readback_bytes; /* rj_program_read */
    uint64_t relocs_applied;
    uint64_t host_threads;   /* threads host steps ran on, summed over steps (rj_host_pool.h) */
} rj_program_stats;

int rj_program_create(rj_device *dev, rj_program **out, rj_err *err);
void rj_program_destroy(rj_program *prog);

int rj_program_add_bo(rj_program *prog, uint32_t ctx, uint32_t role, uint64_t size,
                      uint32_t *out_index, rj_err *err);
int rj_program_bo_info(const rj_program *prog, uint32_t bo, rj_bo *out, rj_err *err);
uint32_t rj_program_bo_count(const rj_program *prog);

/* Place a region in an arena BO: at `offset` (must be aligned; overlaps are the planner's
 * business: liveness reuse shares bytes) or, with RJ_PLACE_ANY, after the last region. */
#define RJ_PLACE_ANY 0xFFFFFFFFFFFFFFFFull
int rj_program_place(rj_program *prog, uint32_t bo, uint64_t offset, uint64_t size,
                     uint64_t align, uint64_t *out_offset, rj_err *err);

int rj_program_write(rj_program *prog, uint32_t bo, uint64_t offset, const void *data,
                     uint64_t size, rj_err *err);
int rj_program_read(rj_program *prog, uint32_t bo, uint64_t offset, void *data,
                    uint64_t size, rj_err *err);

/* rj_program_write / rj_program_read of `count` elements converted between the caller's dtype
 * and the BO's (RJ_DT_* codes; the host-op library's copy: float -> f16/bf16 rounds to nearest
 * even, as numpy's astype does), so a call's inputs and outputs cross in one pass. `bytes` is
 * the caller's buffer size. */
int rj_program_write_as(rj_program *prog, uint32_t bo, uint64_t offset, uint32_t bo_dtype,
                        const void *data, uint32_t data_dtype, uint64_t count, uint64_t bytes,
                        rj_err *err);
int rj_program_read_as(rj_program *prog, uint32_t bo, uint64_t offset, uint32_t bo_dtype,
                       void *data, uint32_t data_dtype, uint64_t count, uint64_t bytes,
                       rj_err *err);
int rj_program_add_reloc(rj_program *prog, const rj_reloc *reloc, rj_err *err);
/* ``count`` relocations at once (each checked as by rj_program_add_reloc; the first refused one
 * fails the call, its index in the message): a whole encoder has ~10^5 of them. */
int rj_program_add_relocs(rj_program *prog, const rj_reloc *relocs, uint32_t count, rj_err *err);

/* Jobs: tasks are (regcmd BO, byte offset, word count); the IOVA is resolved at load. */
int rj_program_add_job(rj_program *prog, uint32_t ctx, uint32_t flags, uint32_t *out_index,
                       rj_err *err);
int rj_program_job_add_task(rj_program *prog, uint32_t job, uint32_t regcmd_bo,
                            uint64_t offset, uint32_t words, rj_err *err);
enum { RJ_JOB_IN = 1, RJ_JOB_OUT = 2 };
int rj_program_job_add_bo(rj_program *prog, uint32_t job, uint32_t bo, uint32_t dir,
                          rj_err *err);

/* Steps run in order by rj_program_run. An NPU step submits its jobs together (jobs on
 * different contexts run in parallel) and fences all of them before the next step. */
int rj_program_add_npu_step(rj_program *prog, const uint32_t *jobs, uint32_t njobs,
                            rj_err *err);
int rj_program_add_host_step(rj_program *prog, const rj_host_step *step, rj_err *err);

/* Patch relocations, check every job, hand CPU-written BOs to the device. Idempotent; run
 * calls it when anything changed since the last load. */
int rj_program_load(rj_program *prog, rj_err *err);
/* Run the whole step list. */
int rj_program_run(rj_program *prog, rj_err *err);
/* Relative timeout of each NPU step's fence (default 10 s). */
void rj_program_set_timeout(rj_program *prog, int64_t timeout_ns);
void rj_program_get_stats(const rj_program *prog, rj_program_stats *out);

/* Check / run one host step directly on BOs (operand bo fields index `bos`). Used by the
 * program and by tests; *bytes (may be NULL) gets the bytes read + written. */
int rj_host_step_check(const rj_host_step *step, rj_bo *const *bos, uint32_t nbos, rj_err *err);
int rj_host_step_run(const rj_host_step *step, rj_bo *const *bos, uint32_t nbos,
                     uint64_t *bytes, rj_err *err);
const char *rj_host_step_name(uint32_t kind);

/* ---- debug / environment flags ---------------------------------------------------------- */

/* Every environment flag rockjit reads is one row of one table (envflags.c). */
enum {
    RJ_ENV_FAKE_ROCKET = 0,
    RJ_ENV_TRACE_STEPS = 1,
    RJ_ENV_DUMP_REGCMD = 2,
    RJ_ENV_POISON_BOS = 3,
    RJ_ENV_SIM_FAITHFUL = 4,
    RJ_ENV_HOST_THREADS = 5,
    RJ_ENV_COUNT = 6,
};
enum {
    RJ_ENV_BOOL = 0, /* a switch: 1/0, true/false, yes/no, on/off (any case); empty = unset = off */
    RJ_ENV_TEXT = 1, /* a value taken as it is (a directory) */
};
typedef struct rj_env_flag_info {
    const char *name;
    const char *description;
    uint32_t kind;     /* RJ_ENV_BOOL or RJ_ENV_TEXT */
    uint32_t reserved; /* must be zero */
} rj_env_flag_info;
uint32_t rj_env_flag_count(void);
int rj_env_flag_describe(uint32_t id, rj_env_flag_info *out);
/* The flag's value or NULL when unset/empty. */
const char *rj_env_get(uint32_t id);
/* The i-th word of the switch grammar and whether it means on (NULL past the last word). */
const char *rj_env_bool_word(uint32_t i, int *on);
/* A switch value: RJ_OK with *on set for a grammar word or NULL/empty (off), else RJ_EINVAL. */
int rj_env_parse_bool(const char *value, int *on);
/* Read switch flag `id`: RJ_OK with *on, or RJ_EINVAL naming the flag, its value and the
 * accepted words when the value is not one of them. */
int rj_env_switch(uint32_t id, int *on, rj_err *err);

#endif /* RJ_RUNTIME_H */
