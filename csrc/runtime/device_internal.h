#ifndef RJ_DEVICE_INTERNAL_H
#define RJ_DEVICE_INTERNAL_H
/* The one device interface. Each device fills a vtable; device.c does the argument checks,
 * the counters and the per-job bookkeeping that every device shares. */
#include <stddef.h>
#include <stdint.h>

#include "runtime/rj_runtime.h"

typedef struct rj_device_ops {
    const char *name;
    uint32_t kind;
    /* Allocate `size` bytes in context ctx; fill host, iova, handle, map_size, priv. */
    int (*bo_create)(rj_device *dev, uint32_t ctx, uint64_t size, rj_bo *bo, rj_err *err);
    void (*bo_destroy)(rj_device *dev, rj_bo *bo);
    int (*sync_for_device)(rj_device *dev, rj_bo *bo, rj_err *err);
    /* Fence: wait for writers of bo until the absolute CLOCK_MONOTONIC deadline. */
    int (*sync_for_cpu)(rj_device *dev, rj_bo *bo, int64_t deadline_ns, rj_err *err);
    /* Submit already-checked jobs; tasks are what goes on the wire (head only if chained). */
    int (*submit)(rj_device *dev, const rj_job *jobs, uint32_t njobs, rj_err *err);
    /* Called after the out-BO fences of a job have passed (device-side error report). */
    int (*job_done)(rj_device *dev, const rj_job *job, rj_err *err);
    void (*destroy)(rj_device *dev);
} rj_device_ops;

struct rj_device {
    const rj_device_ops *ops;
    uint32_t nctx;
    uint32_t destroy_pending; /* destroy was asked while BOs were alive: finish at the last */
    rj_device_stats stats;
    void *priv;
};

/* Monotonic clock in ns (CLOCK_MONOTONIC: the clock PREP_BO's deadline is measured on). */
int64_t rj_now_ns(void);

/* A bump allocator of 32-bit device addresses with an unmapped guard page between BOs. */
typedef struct rj_iova_space {
    uint64_t next;
    uint64_t limit;
} rj_iova_space;
#define RJ_PAGE 4096u
static inline uint64_t rj_round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* Host-memory BO backing used by the sim and null devices. */
int rj_hostmem_bo_create(rj_iova_space *space, uint64_t size, rj_bo *bo, rj_err *err,
                         const char *who);
void rj_hostmem_bo_destroy(rj_bo *bo);

#endif /* RJ_DEVICE_INTERNAL_H */
