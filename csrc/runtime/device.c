/* What every device shares: argument checks, counters, deadlines, and the host-memory BO
 * backing of the simulated devices. The device-specific part sits behind rj_device_ops. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "runtime/device_internal.h"

int64_t rj_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* ---- host-memory BOs (sim and null devices) ----------------------------------------------- */

int rj_hostmem_bo_create(rj_iova_space *space, uint64_t size, rj_bo *bo, rj_err *err,
                         const char *who)
{
    uint64_t map = rj_round_up(size, RJ_PAGE);
    /* One unmapped page after every BO, so a run-off-the-end address faults instead of
     * landing in the neighbour (the conformance stand-in driver did the same). */
    if (space->next + map > space->limit)
        return rj_fail(err, RJ_ENOMEM,
                       "%s: a %llu-byte BO does not fit the 32-bit IOVA window (next free "
                       "address 0x%llx); regcmd address fields are 32 bits wide "
                       "(notes: perf/iova-and-multicore.md). Free BOs or spread them over "
                       "more contexts.",
                       who, (unsigned long long)size, (unsigned long long)space->next);
    void *mem = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        return rj_fail(err, RJ_ENOMEM, "%s: cannot allocate %llu bytes of host memory for a BO",
                       who, (unsigned long long)map);
    bo->host = mem;
    bo->iova = space->next;
    bo->size = size;
    bo->map_size = map;
    space->next += map + RJ_PAGE;
    return RJ_OK;
}

void rj_hostmem_bo_destroy(rj_bo *bo)
{
    if (bo->host)
        munmap(bo->host, bo->map_size);
    bo->host = NULL;
}

/* ---- generic device calls ------------------------------------------------------------------ */

/* A device outlives its BOs: when it is destroyed while some are alive (a program or a
 * garbage-collected Python object still holds them) the release finishes with the last
 * rj_bo_destroy, so no destruction order can use freed device state. */
void rj_device_destroy(rj_device *dev)
{
    if (!dev)
        return;
    if (dev->stats.bos_live > 0) {
        dev->destroy_pending = 1;
        return;
    }
    dev->ops->destroy(dev);
}

uint32_t rj_device_kind(const rj_device *dev) { return dev ? dev->ops->kind : 0; }
uint32_t rj_device_nctx(const rj_device *dev) { return dev ? dev->nctx : 0; }

void rj_device_get_stats(const rj_device *dev, rj_device_stats *out)
{
    if (dev && out)
        *out = dev->stats;
}

int rj_bo_create(rj_device *dev, uint32_t ctx, uint64_t size, rj_bo **out, rj_err *err)
{
    if (!dev || !out)
        return rj_fail(err, RJ_EINVAL, "rj_bo_create: NULL device or output pointer");
    *out = NULL;
    if (ctx >= dev->nctx)
        return rj_fail(err, RJ_EINVAL,
                       "rj_bo_create: context %u does not exist; the %s device was opened with "
                       "%u context(s)", ctx, dev->ops->name, dev->nctx);
    if (size == 0 || size > 0xFFFFFFFFull)
        return rj_fail(err, RJ_EINVAL,
                       "rj_bo_create: size %llu is out of range; a BO holds 1 byte to 4 GiB - 1 "
                       "(the rocket CREATE_BO size field is 32-bit)", (unsigned long long)size);
    rj_bo *bo = calloc(1, sizeof(*bo));
    if (!bo)
        return rj_fail(err, RJ_ENOMEM, "rj_bo_create: out of memory");
    bo->ctx = ctx;
    int poison, rc = rj_env_switch(RJ_ENV_POISON_BOS, &poison, err);
    if (rc || (rc = dev->ops->bo_create(dev, ctx, size, bo, err))) {
        free(bo);
        return rc;
    }
    if (poison)
        memset(bo->host, 0xAA, bo->size);
    dev->stats.bos_live++;
    dev->stats.bos_created++;
    dev->stats.bo_bytes_live += bo->size;
    *out = bo;
    return RJ_OK;
}

void rj_bo_destroy(rj_device *dev, rj_bo *bo)
{
    if (!dev || !bo)
        return;
    dev->ops->bo_destroy(dev, bo);
    dev->stats.bos_live--;
    dev->stats.bo_bytes_live -= bo->size;
    free(bo);
    if (dev->destroy_pending && dev->stats.bos_live == 0)
        dev->ops->destroy(dev);
}

int rj_bo_sync_for_device(rj_device *dev, rj_bo *bo, rj_err *err)
{
    if (!dev || !bo)
        return rj_fail(err, RJ_EINVAL, "rj_bo_sync_for_device: NULL device or BO");
    dev->stats.syncs++;
    return dev->ops->sync_for_device(dev, bo, err);
}

int rj_bo_sync_for_cpu(rj_device *dev, rj_bo *bo, int64_t timeout_ns, rj_err *err)
{
    if (!dev || !bo)
        return rj_fail(err, RJ_EINVAL, "rj_bo_sync_for_cpu: NULL device or BO");
    dev->stats.waits++;
    return dev->ops->sync_for_cpu(dev, bo, rj_now_ns() + timeout_ns, err);
}

/* The checks every device makes before anything reaches the wire. The rocket kernel drops a
 * malformed job without an error (rocket_ioctl_submit ignores each job's result), so these
 * must happen in userspace. */
static int check_job(const rj_device *dev, const rj_job *j, uint32_t idx, rj_err *err)
{
    if (j->ctx >= dev->nctx)
        return rj_fail(err, RJ_EINVAL, "job %u: context %u does not exist (the %s device has %u)",
                       idx, j->ctx, dev->ops->name, dev->nctx);
    if (j->flags & ~(uint32_t)RJ_JOB_KNOWN_FLAGS)
        return rj_fail(err, RJ_EINVAL, "job %u: unknown flag bits 0x%x", idx,
                       j->flags & ~(uint32_t)RJ_JOB_KNOWN_FLAGS);
    if (j->reserved)
        return rj_fail(err, RJ_EINVAL, "job %u: reserved field is %u, must be zero", idx, j->reserved);
    if (j->ntasks == 0 || !j->tasks)
        return rj_fail(err, RJ_EINVAL, "job %u has no tasks; the kernel refuses task_count 0", idx);
    if (j->n_out == 0 || !j->out_bos)
        return rj_fail(err, RJ_EINVAL,
                       "job %u writes no BO, so nothing can fence it: PREP_BO on an out-BO is the "
                       "only completion signal of the rocket uAPI. List the BO it writes as out.",
                       idx);
    for (uint32_t t = 0; t < j->ntasks; t++) {
        if (j->tasks[t].regcmd_count == 0)
            return rj_fail(err, RJ_EINVAL, "job %u task %u: regcmd_count is 0 (kernel: must be > 0)",
                           idx, t);
        if (j->tasks[t].regcmd_iova > 0xFFFFFFFFull)
            return rj_fail(err, RJ_EINVAL,
                           "job %u task %u: regcmd IOVA 0x%llx does not fit the 32-bit task field",
                           idx, t, (unsigned long long)j->tasks[t].regcmd_iova);
        if (j->tasks[t].reserved)
            return rj_fail(err, RJ_EINVAL, "job %u task %u: reserved field must be zero", idx, t);
    }
    for (int side = 0; side < 2; side++) {
        rj_bo *const *list = side ? j->out_bos : j->in_bos;
        uint32_t n = side ? j->n_out : j->n_in;
        for (uint32_t i = 0; i < n; i++) {
            if (!list[i])
                return rj_fail(err, RJ_EINVAL, "job %u: %s-BO %u is NULL", idx, side ? "out" : "in", i);
            if (list[i]->ctx != j->ctx)
                return rj_fail(err, RJ_EINVAL,
                               "job %u runs on context %u but its %s-BO (handle %u) lives in context "
                               "%u; each rocket fd has its own IOVA space, so create the BO on the "
                               "job's context (notes: perf/iova-and-multicore.md)",
                               idx, j->ctx, side ? "out" : "in", list[i]->handle, list[i]->ctx);
        }
    }
    for (uint32_t i = 0; i < j->n_in; i++)
        for (uint32_t o = 0; o < j->n_out; o++)
            if (j->in_bos[i] == j->out_bos[o])
                return rj_fail(err, RJ_EHAZARD,
                               "job %u lists BO handle %u as both in and out: on hardware the kernel "
                               "then signals completion having executed nothing (notes: "
                               "encodings/regcmd-task-model.md). A BO the job reads and writes "
                               "belongs in the out list only.",
                               idx, j->in_bos[i]->handle);
    return RJ_OK;
}

int rj_device_submit(rj_device *dev, const rj_job *jobs, uint32_t njobs, rj_err *err)
{
    if (!dev || (!jobs && njobs))
        return rj_fail(err, RJ_EINVAL, "rj_device_submit: NULL device or job list");
    if (njobs == 0)
        return RJ_OK;
    int rc = RJ_OK;
    for (uint32_t i = 0; i < njobs && rc == RJ_OK; i++)
        rc = check_job(dev, &jobs[i], i, err);
    if (rc == RJ_OK)
        rc = dev->ops->submit(dev, jobs, njobs, err);
    if (rc)
        return rc;
    dev->stats.submits++;
    for (uint32_t i = 0; i < njobs; i++) {
        const rj_job *j = &jobs[i];
        dev->stats.jobs++;
        dev->stats.tasks += j->ntasks;
        /* A self-chained job is one kick (its first trailer links the rest); otherwise the
         * kernel kicks once per task (rocket_job.c re-arms on each completion IRQ). */
        dev->stats.kicks += (j->flags & RJ_JOB_SELF_CHAINED) ? 1 : j->ntasks;
        for (uint32_t t = 0; t < j->ntasks; t++)
            dev->stats.regcmd_bytes += 8ull * j->tasks[t].regcmd_count;
        for (uint32_t b = 0; b < j->n_in; b++)
            dev->stats.in_bytes += j->in_bos[b]->size;
        for (uint32_t b = 0; b < j->n_out; b++)
            dev->stats.out_bytes += j->out_bos[b]->size;
    }
    return RJ_OK;
}

int rj_device_wait(rj_device *dev, const rj_job *jobs, uint32_t njobs, int64_t timeout_ns,
                   rj_err *err)
{
    if (!dev || (!jobs && njobs))
        return rj_fail(err, RJ_EINVAL, "rj_device_wait: NULL device or job list");
    /* One deadline for the whole wait: retries and later jobs do not extend it. */
    int64_t deadline = rj_now_ns() + timeout_ns;
    for (uint32_t i = 0; i < njobs; i++) {
        for (uint32_t o = 0; o < jobs[i].n_out; o++) {
            dev->stats.waits++;
            int rc = dev->ops->sync_for_cpu(dev, jobs[i].out_bos[o], deadline, err);
            if (rc)
                return rc;
        }
        if (dev->ops->job_done) {
            int rc = dev->ops->job_done(dev, &jobs[i], err);
            if (rc)
                return rc;
        }
    }
    return RJ_OK;
}
