/* SimDevice and NullDevice: BOs are host memory at IOVAs from a per-context bump allocator.
 * SimDevice runs each submitted job synchronously on one simulator per context (register
 * state persists per core, as on silicon); NullDevice only counts. */
#include <stdlib.h>
#include <string.h>

#include "runtime/device_internal.h"

/* Same base as the stand-in driver the conformance programs came from; a non-zero base makes
 * a forgotten relocation (address 0) fault instead of aliasing the first BO. */
#define SIM_IOVA_BASE 0x01000000ull
#define SIM_IOVA_LIMIT 0x100000000ull

typedef struct sim_ctx {
    rj_iova_space space;
    rj_sim *sim;         /* NULL on the null device */
    rj_bo **bos;
    uint32_t nbos, cap;
    rj_region *regions;  /* rebuilt when the BO set changes */
    uint32_t regions_valid;
} sim_ctx;

typedef struct sim_dev {
    rj_device base;
    sim_ctx *ctx;
} sim_dev;

static sim_dev *to_sim(rj_device *d) { return (sim_dev *)d; }

static int simdev_bo_create(rj_device *d, uint32_t ctx, uint64_t size, rj_bo *bo, rj_err *err)
{
    sim_ctx *c = &to_sim(d)->ctx[ctx];
    if (c->nbos == c->cap) {
        uint32_t cap = c->cap ? c->cap * 2 : 16;
        rj_bo **nb = realloc(c->bos, sizeof(*nb) * cap);
        if (!nb)
            return rj_fail(err, RJ_ENOMEM, "%s device: out of memory", d->ops->name);
        c->bos = nb;
        c->cap = cap;
    }
    int rc = rj_hostmem_bo_create(&c->space, size, bo, err, d->ops->name);
    if (rc)
        return rc;
    static uint32_t next_handle = 1;
    bo->handle = __atomic_fetch_add(&next_handle, 1, __ATOMIC_RELAXED);
    c->bos[c->nbos++] = bo;
    c->regions_valid = 0;
    return RJ_OK;
}

static void simdev_bo_destroy(rj_device *d, rj_bo *bo)
{
    sim_ctx *c = &to_sim(d)->ctx[bo->ctx];
    for (uint32_t i = 0; i < c->nbos; i++) {
        if (c->bos[i] == bo) {
            c->bos[i] = c->bos[--c->nbos];
            break;
        }
    }
    c->regions_valid = 0;
    rj_hostmem_bo_destroy(bo);
}

static int simdev_sync_nop(rj_device *d, rj_bo *bo, rj_err *err) { return RJ_OK; }
static int simdev_wait_nop(rj_device *d, rj_bo *bo, int64_t deadline, rj_err *err) { return RJ_OK; }

static int regions_for(rj_device *d, sim_ctx *c, rj_err *err)
{
    if (c->regions_valid)
        return RJ_OK;
    free(c->regions);
    c->regions = calloc(c->nbos ? c->nbos : 1, sizeof(*c->regions));
    if (!c->regions)
        return rj_fail(err, RJ_ENOMEM, "%s device: out of memory", d->ops->name);
    for (uint32_t i = 0; i < c->nbos; i++) {
        c->regions[i].iova = c->bos[i]->iova;
        c->regions[i].size = c->bos[i]->size;
        c->regions[i].host = c->bos[i]->host;
    }
    c->regions_valid = 1;
    return RJ_OK;
}

static int simdev_submit(rj_device *d, const rj_job *jobs, uint32_t njobs, rj_err *err)
{
    sim_dev *s = to_sim(d);
    for (uint32_t i = 0; i < njobs; i++) {
        sim_ctx *c = &s->ctx[jobs[i].ctx];
        int rc = regions_for(d, c, err);
        if (rc)
            return rc;
        rj_sim_stats before, after;
        rj_sim_get_stats(c->sim, &before);
        rc = rj_sim_run_job(c->sim, c->regions, c->nbos, jobs[i].tasks, jobs[i].ntasks, err);
        if (rc)
            return rc;
        /* The simulator decides kicks from the words alone (a chain link in the first task's
         * trailer); the job's flag is what the runtime counts. A disagreement is a program bug
         * that would make the counters lie, so it is refused. */
        rj_sim_get_stats(c->sim, &after);
        uint64_t kicks = after.kicks - before.kicks;
        int chained = (jobs[i].flags & RJ_JOB_SELF_CHAINED) != 0;
        if (jobs[i].ntasks > 1 && chained != (kicks == 1))
            return rj_fail(err, RJ_EINVAL,
                           "job %u is %sflagged self-chained but its %u tasks ran as %llu kick(s): %s "
                           "(notes: encodings/regcmd-task-model.md \"Contiguous chaining\")", i,
                           chained ? "" : "not ", jobs[i].ntasks, (unsigned long long)kicks,
                           chained ? "link every task's trailer to the next one (PC_BASE_ADDRESS "
                                     "in the OP_NONE slot) or drop the flag"
                                   : "set the flag for a job whose trailers link its tasks");
    }
    return RJ_OK;
}

static int nulldev_submit(rj_device *d, const rj_job *jobs, uint32_t njobs, rj_err *err)
{
    return RJ_OK;
}

static void simdev_destroy(rj_device *d)
{
    sim_dev *s = to_sim(d);
    for (uint32_t i = d->nctx; i-- > 0;) {
        sim_ctx *c = &s->ctx[i];
        /* BOs still alive belong to a program that outlives its device: a caller bug, but
         * their memory is ours, so release it rather than leak it. */
        for (uint32_t b = 0; b < c->nbos; b++)
            rj_hostmem_bo_destroy(c->bos[b]);
        free(c->regions);
        free(c->bos);
        if (c->sim)
            rj_sim_destroy(c->sim);
    }
    free(s->ctx);
    free(s);
}

static const rj_device_ops sim_ops = {
    .name = "sim",
    .kind = RJ_SIM_DEVICE,
    .bo_create = simdev_bo_create,
    .bo_destroy = simdev_bo_destroy,
    .sync_for_device = simdev_sync_nop,
    .sync_for_cpu = simdev_wait_nop,
    .submit = simdev_submit,
    .job_done = NULL,
    .destroy = simdev_destroy,
};

static const rj_device_ops null_ops = {
    .name = "null",
    .kind = RJ_NULL_DEVICE,
    .bo_create = simdev_bo_create,
    .bo_destroy = simdev_bo_destroy,
    .sync_for_device = simdev_sync_nop,
    .sync_for_cpu = simdev_wait_nop,
    .submit = nulldev_submit,
    .job_done = NULL,
    .destroy = simdev_destroy,
};

static int create(rj_device **out, const rj_device_ops *ops, uint32_t nctx, int with_sim,
                  uint32_t sim_flags, rj_err *err)
{
    if (!out)
        return rj_fail(err, RJ_EINVAL, "%s device: NULL output pointer", ops->name);
    *out = NULL;
    if (nctx == 0 || nctx > 64)
        return rj_fail(err, RJ_EINVAL, "%s device: %u contexts requested; use 1..64 (the RK3588 "
                       "has 3 NPU cores)", ops->name, nctx);
    sim_dev *s = calloc(1, sizeof(*s));
    if (!s)
        return rj_fail(err, RJ_ENOMEM, "%s device: out of memory", ops->name);
    s->ctx = calloc(nctx, sizeof(*s->ctx));
    if (!s->ctx) {
        free(s);
        return rj_fail(err, RJ_ENOMEM, "%s device: out of memory", ops->name);
    }
    s->base.ops = ops;
    s->base.nctx = nctx;
    for (uint32_t i = 0; i < nctx; i++) {
        s->ctx[i].space.next = SIM_IOVA_BASE;
        s->ctx[i].space.limit = SIM_IOVA_LIMIT;
        if (with_sim) {
            int rc = rj_sim_create(&s->ctx[i].sim, sim_flags, err);
            if (rc) {
                s->base.nctx = i; /* unwind only what was created */
                simdev_destroy(&s->base);
                return rc;
            }
        }
    }
    *out = &s->base;
    return RJ_OK;
}

int rj_sim_device_create(rj_device **out, uint32_t nctx, uint32_t sim_flags, rj_err *err)
{
    return create(out, &sim_ops, nctx, 1, sim_flags, err);
}

int rj_null_device_create(rj_device **out, uint32_t nctx, rj_err *err)
{
    return create(out, &null_ops, nctx, 0, 0, err);
}
