#ifndef RJ_SIM_H
#define RJ_SIM_H
/* The RK3588 NPU functional simulator: public interface.
 *
 * The simulator sees exactly what the hardware sees: task descriptors (regcmd IOVA + word
 * count, as in a rocket SUBMIT) and device memory (regions at IOVAs). Nothing else. */
#include <stdint.h>

#include "rj_err.h"

/* One piece of device memory: `size` bytes at device address `iova`, backed by `host`. */
typedef struct rj_region {
    uint64_t iova;
    uint64_t size;
    uint8_t *host;
} rj_region;

/* One task, as in the rocket uAPI: where its regcmd words are and how many there are. */
typedef struct rj_task {
    uint64_t regcmd_iova;
    uint32_t regcmd_count;
    uint32_t reserved; /* must be zero */
} rj_task;

/* Counters a run adds to. */
typedef struct rj_sim_stats {
    uint64_t jobs;
    uint64_t tasks;        /* tasks executed, chained ones included */
    uint64_t kicks;        /* hardware starts: one per submitted task, chains count once */
    uint64_t macs;
    uint64_t bytes_read;
    uint64_t bytes_written;
} rj_sim_stats;

enum {
    /* Refuse programs the hardware is known to mishandle (default). Without it the
     * simulator still computes, but hazards are not checked. */
    RJ_SIM_STRICT = 1u << 0,
    /* Reproduce what silicon computes for a documented quirk that has a model (QUIRK 2's x~0
     * spike, QUIRK 4's ~4.0 decode) instead of refusing it, even in strict mode: for foreign
     * programs that tolerate or repair the quirk (design.md convention 9). rockjit's own
     * programs never set it. rj_sim_create also sets it when RJ_SIM_FAITHFUL=1 is in the
     * environment (csrc/runtime/envflags.c). */
    RJ_SIM_FAITHFUL = 1u << 1,
};

typedef struct rj_sim rj_sim;

int rj_sim_create(rj_sim **out, uint32_t flags, rj_err *err);
void rj_sim_destroy(rj_sim *sim);

/* Run one job: its tasks in order against the given memory. Register state and CBUF
 * contents persist inside `sim` across tasks and jobs, as on silicon. */
int rj_sim_run_job(rj_sim *sim, const rj_region *regions, uint32_t nregions,
                   const rj_task *tasks, uint32_t ntasks, rj_err *err);

void rj_sim_get_stats(const rj_sim *sim, rj_sim_stats *out);

#endif /* RJ_SIM_H */
