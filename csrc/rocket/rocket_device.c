/* RocketDevice: the NPU through the mainline rocket uAPI, one fd per context.
 *
 *   BO      CREATE_BO on the context's fd, then mmap of the returned offset; freed by munmap
 *           and GEM_CLOSE.
 *   submit  one SUBMIT per fd carrying that fd's jobs (tasks + in/out handle lists).
 *   fence   PREP_BO on each out-BO with one absolute CLOCK_MONOTONIC deadline; EINTR is
 *           retried with the same struct, so the deadline never stretches.
 *   sync    FINI_BO hands CPU writes to the device.
 * Facts: torvalds/linux include/uapi/drm/rocket_accel.h, drivers/accel/rocket/rocket_gem.c,
 * rocket_job.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "rocket/rj_rocket.h"
#include "runtime/device_internal.h"

typedef struct rocket_dev {
    rj_device base;
    const rj_sys_ops *sys;
    int *fds;
    rj_bo **live;   /* BOs still mapped, released on destroy if the caller forgot */
    uint32_t nlive, cap_live;
    char path[256];
} rocket_dev;

static rocket_dev *to_rk(rj_device *d) { return (rocket_dev *)d; }

/* ioctl with the EINTR/EAGAIN restart libdrm's drmIoctl does: the kernel state is unchanged
 * when a wait is interrupted, and PREP_BO's deadline is absolute, so a retry with the same
 * arguments waits only for what remains. */
static int xioctl(const rj_sys_ops *sys, int fd, unsigned long req, void *arg)
{
    int rc;
    do {
        rc = sys->ioctl(fd, req, arg);
    } while (rc == -1 && (errno == EINTR || errno == EAGAIN));
    return rc;
}

/* What an errno means for the caller, where the bare strerror does not say. */
static const char *errno_hint(int e)
{
    switch (e) {
    case ENODEV:
        return " (the NPU device went away: driver unbound, module unloaded or a reset; a "
               "compiled function reopens it on its next call)";
    case EINVAL:
        return " (the kernel refused the request's arguments: a struct or job the runtime built "
               "wrongly; report it with RJ_DUMP_REGCMD output)";
    case ENOMEM:
        return " (the kernel is out of memory for the job)";
    default:
        return "";
    }
}

static int track(rocket_dev *r, rj_bo *bo, rj_err *err)
{
    if (r->nlive == r->cap_live) {
        uint32_t cap = r->cap_live ? 2 * r->cap_live : 16;
        rj_bo **n = realloc(r->live, sizeof(*n) * cap);
        if (!n)
            return rj_fail(err, RJ_ENOMEM, "rocket: out of memory");
        r->live = n;
        r->cap_live = cap;
    }
    r->live[r->nlive++] = bo;
    return RJ_OK;
}

static void untrack(rocket_dev *r, rj_bo *bo)
{
    for (uint32_t i = 0; i < r->nlive; i++)
        if (r->live[i] == bo) {
            r->live[i] = r->live[--r->nlive];
            return;
        }
}

static void gem_close(rocket_dev *r, int fd, uint32_t handle)
{
    rj_drm_gem_close c = {.handle = handle, .pad = 0};
    xioctl(r->sys, fd, rj_rocket_ioctl_request(RJ_ROCKET_IOCTL_GEM_CLOSE), &c);
}

static int rk_bo_create(rj_device *d, uint32_t ctx, uint64_t size, rj_bo *bo, rj_err *err)
{
    rocket_dev *r = to_rk(d);
    int fd = r->fds[ctx];
    rj_drm_rocket_create_bo cb = {.size = (uint32_t)size};
    if (xioctl(r->sys, fd, rj_rocket_ioctl_request(RJ_ROCKET_IOCTL_CREATE_BO), &cb) != 0) {
        int e = errno;
        return rj_fail(err, e == ENOMEM || e == ENOSPC ? RJ_ENOMEM : RJ_EIO,
                       "rocket CREATE_BO of %llu bytes on %s (context %u) failed: %s%s",
                       (unsigned long long)size, r->path, ctx, strerror(e),
                       e == ENOSPC ? " (this fd's 4 GiB IOVA window is full; spread BOs over more "
                                     "contexts, notes: perf/iova-and-multicore.md)" : errno_hint(e));
    }
    if (cb.dma_address + size > 0x100000000ull) {
        gem_close(r, fd, cb.handle);
        return rj_fail(err, RJ_EIO, "rocket CREATE_BO returned IOVA 0x%llx for %llu bytes, past the "
                       "32-bit window regcmd address fields can reach", (unsigned long long)cb.dma_address,
                       (unsigned long long)size);
    }
    uint64_t map = rj_round_up(size, RJ_PAGE);
    void *mem = r->sys->mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (int64_t)cb.offset);
    if (mem == MAP_FAILED) {
        int e = errno;
        gem_close(r, fd, cb.handle); /* unwind the CREATE_BO */
        return rj_fail(err, RJ_ENOMEM, "rocket: mmap of BO handle %u (%llu bytes, offset 0x%llx) on "
                       "%s failed: %s", cb.handle, (unsigned long long)map,
                       (unsigned long long)cb.offset, r->path, strerror(e));
    }
    bo->host = mem;
    bo->iova = cb.dma_address;
    bo->size = size;
    bo->map_size = map;
    bo->handle = cb.handle;
    int rc = track(r, bo, err);
    if (rc) {
        r->sys->munmap(mem, map);
        gem_close(r, fd, cb.handle);
        return rc;
    }
    return RJ_OK;
}

static void rk_bo_destroy(rj_device *d, rj_bo *bo)
{
    rocket_dev *r = to_rk(d);
    untrack(r, bo);
    if (bo->host)
        r->sys->munmap(bo->host, bo->map_size);
    bo->host = NULL;
    gem_close(r, r->fds[bo->ctx], bo->handle);
}

static int rk_sync_for_device(rj_device *d, rj_bo *bo, rj_err *err)
{
    rocket_dev *r = to_rk(d);
    rj_drm_rocket_fini_bo f = {.handle = bo->handle, .reserved = 0};
    if (xioctl(r->sys, r->fds[bo->ctx], rj_rocket_ioctl_request(RJ_ROCKET_IOCTL_FINI_BO), &f) != 0)
        return rj_fail(err, RJ_EIO, "rocket FINI_BO of BO handle %u (context %u) failed: %s%s",
                       bo->handle, bo->ctx, strerror(errno), errno_hint(errno));
    return RJ_OK;
}

static int rk_sync_for_cpu(rj_device *d, rj_bo *bo, int64_t deadline_ns, rj_err *err)
{
    rocket_dev *r = to_rk(d);
    /* timeout_ns is absolute CLOCK_MONOTONIC (rocket_gem.c: drm_timeout_abs_to_jiffies). A
     * deadline of 0 would mean "poll", so never send 0 for a real wait. */
    rj_drm_rocket_prep_bo pb = {.handle = bo->handle, .reserved = 0,
                                .timeout_ns = deadline_ns > 0 ? deadline_ns : 1};
    if (xioctl(r->sys, r->fds[bo->ctx], rj_rocket_ioctl_request(RJ_ROCKET_IOCTL_PREP_BO), &pb) == 0)
        return RJ_OK;
    int e = errno;
    if (e == ETIMEDOUT || e == EBUSY)
        return rj_fail(err, RJ_ETIMEDOUT,
                       "rocket: the job writing BO handle %u (context %u) did not finish before the "
                       "deadline (PREP_BO: %s). The kernel resets a core after 500 ms per job "
                       "(rocket_job.c), so a longer hang means the job never completed: check the "
                       "regcmd trailer and enable mask, or raise the program timeout",
                       bo->handle, bo->ctx, strerror(e));
    return rj_fail(err, RJ_EIO, "rocket PREP_BO of BO handle %u (context %u) failed: %s%s",
                   bo->handle, bo->ctx, strerror(e), errno_hint(e));
}

/* Best effort after a failed submit: let already-queued jobs finish before their BOs can be
 * freed, so an error path never frees memory the NPU is still writing. */
static void drain(rocket_dev *r, const rj_job *jobs, uint32_t njobs)
{
    int64_t deadline = rj_now_ns() + 2ll * 1000 * 1000 * 1000;
    for (uint32_t i = 0; i < njobs; i++)
        for (uint32_t o = 0; o < jobs[i].n_out; o++) {
            rj_drm_rocket_prep_bo pb = {.handle = jobs[i].out_bos[o]->handle,
                                        .timeout_ns = deadline};
            xioctl(r->sys, r->fds[jobs[i].ctx], rj_rocket_ioctl_request(RJ_ROCKET_IOCTL_PREP_BO),
                   &pb);
        }
}

static int rk_submit(rj_device *d, const rj_job *jobs, uint32_t njobs, rj_err *err)
{
    rocket_dev *r = to_rk(d);
    uint32_t ntasks = 0, nhandles = 0;
    for (uint32_t i = 0; i < njobs; i++) {
        ntasks += jobs[i].ntasks;
        nhandles += jobs[i].n_in + jobs[i].n_out;
    }
    rj_drm_rocket_job *dj = calloc(njobs, sizeof(*dj));
    rj_drm_rocket_task *dt = calloc(ntasks ? ntasks : 1, sizeof(*dt));
    uint32_t *dh = calloc(nhandles ? nhandles : 1, sizeof(*dh));
    const rj_job **order = calloc(njobs, sizeof(*order));
    int rc = RJ_OK;
    uint32_t submitted = 0;
    if (!dj || !dt || !dh || !order) {
        rc = rj_fail(err, RJ_ENOMEM, "rocket submit: out of memory");
        goto out;
    }
    /* One SUBMIT per context, jobs in the caller's order within it. */
    uint32_t t = 0, h = 0;
    for (uint32_t ctx = 0; ctx < d->nctx && rc == RJ_OK; ctx++) {
        uint32_t first = submitted, n = 0;
        for (uint32_t i = 0; i < njobs; i++) {
            const rj_job *j = &jobs[i];
            if (j->ctx != ctx)
                continue;
            rj_drm_rocket_job *w = &dj[first + n];
            order[first + n] = j;
            n++;
            w->tasks = (uint64_t)(uintptr_t)&dt[t];
            w->task_count = j->ntasks;
            w->task_struct_size = sizeof(rj_drm_rocket_task);
            for (uint32_t k = 0; k < j->ntasks; k++, t++) {
                dt[t].regcmd = (uint32_t)j->tasks[k].regcmd_iova;
                dt[t].regcmd_count = j->tasks[k].regcmd_count;
            }
            w->in_bo_handles = (uint64_t)(uintptr_t)&dh[h];
            w->in_bo_handle_count = j->n_in;
            for (uint32_t k = 0; k < j->n_in; k++)
                dh[h++] = j->in_bos[k]->handle;
            w->out_bo_handles = (uint64_t)(uintptr_t)&dh[h];
            w->out_bo_handle_count = j->n_out;
            for (uint32_t k = 0; k < j->n_out; k++)
                dh[h++] = j->out_bos[k]->handle;
        }
        if (n == 0)
            continue;
        rj_drm_rocket_submit s = {.jobs = (uint64_t)(uintptr_t)&dj[first], .job_count = n,
                                  .job_struct_size = sizeof(rj_drm_rocket_job), .reserved = 0};
        if (xioctl(r->sys, r->fds[ctx], rj_rocket_ioctl_request(RJ_ROCKET_IOCTL_SUBMIT), &s) != 0) {
            int e = errno;
            rc = rj_fail(err, RJ_EIO, "rocket SUBMIT of %u job(s) on %s context %u failed: %s%s", n, r->path, ctx,
                         strerror(e), errno_hint(e));
            break;
        }
        submitted += n;
    }
    if (rc && submitted) {
        /* Jobs of earlier contexts are already queued: wait for them. */
        rj_job *done = calloc(submitted, sizeof(*done));
        if (done) {
            for (uint32_t i = 0; i < submitted; i++)
                done[i] = *order[i];
            drain(r, done, submitted);
            free(done);
        }
    }
out:
    free(order);
    free(dh);
    free(dt);
    free(dj);
    return rc;
}

static int rk_job_done(rj_device *d, const rj_job *job, rj_err *err)
{
    rocket_dev *r = to_rk(d);
    if (!r->sys->job_error)
        return RJ_OK; /* the kernel reports no per-job result */
    int rc = r->sys->job_error(r->fds[job->ctx], err);
    if (rc == RJ_EFAULT && err) {
        /* An address outside the job's BOs is an IOMMU fault on silicon: the device's failure,
         * not a malformed program the runtime could have refused (those fail at load). */
        char msg[sizeof(err->msg)];
        snprintf(msg, sizeof(msg), "%s", err->msg);
        rc = rj_fail(err, RJ_EIO, "rocket: the job on %s context %u faulted: the NPU reached memory "
                     "outside its BOs (an IOMMU fault on silicon; a BO shorter than planned?): %s",
                     r->path, job->ctx, msg);
    }
    return rc;
}

static void rk_destroy(rj_device *d)
{
    rocket_dev *r = to_rk(d);
    /* BOs a caller never freed: unmap them; closing the fds releases their handles. */
    for (uint32_t i = r->nlive; i-- > 0;)
        if (r->live[i]->host)
            r->sys->munmap(r->live[i]->host, r->live[i]->map_size);
    for (uint32_t i = d->nctx; i-- > 0;)
        if (r->fds[i] >= 0)
            r->sys->close(r->fds[i]);
    free(r->live);
    free(r->fds);
    free(r);
}

static const rj_device_ops rocket_ops = {
    .name = "rocket",
    .kind = RJ_ROCKET_DEVICE,
    .bo_create = rk_bo_create,
    .bo_destroy = rk_bo_destroy,
    .sync_for_device = rk_sync_for_device,
    .sync_for_cpu = rk_sync_for_cpu,
    .submit = rk_submit,
    .job_done = rk_job_done,
    .destroy = rk_destroy,
};

int rj_rocket_device_create(rj_device **out, const char *path, uint32_t nctx, uint32_t flags,
                            rj_err *err)
{
    if (!out)
        return rj_fail(err, RJ_EINVAL, "rocket: NULL output pointer");
    *out = NULL;
    if (flags & ~(uint32_t)RJ_ROCKET_USE_FAKE)
        return rj_fail(err, RJ_EINVAL, "rocket: unknown flag bits 0x%x", flags & ~1u);
    if (nctx == 0 || nctx > 16)
        return rj_fail(err, RJ_EINVAL, "rocket: %u contexts requested; use 1..16 fds (the RK3588 has 3 "
                       "cores; one more fd than cores measured best, notes: perf/iova-and-multicore.md)",
                       nctx);
    if (!path)
        path = RJ_ROCKET_DEFAULT_PATH;
    const rj_sys_ops *sys = rj_sys_fake_rocket();
    int rc;
    if (!(flags & RJ_ROCKET_USE_FAKE) && (rc = rj_sys_select(&sys, err)))
        return rc;
    rocket_dev *r = calloc(1, sizeof(*r));
    if (!r)
        return rj_fail(err, RJ_ENOMEM, "rocket: out of memory");
    r->fds = malloc(sizeof(int) * nctx);
    if (!r->fds) {
        free(r);
        return rj_fail(err, RJ_ENOMEM, "rocket: out of memory");
    }
    r->base.ops = &rocket_ops;
    r->base.nctx = 0;
    r->sys = sys;
    strncpy(r->path, path, sizeof(r->path) - 1);
    for (uint32_t i = 0; i < nctx; i++) {
        int fd = r->sys->open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            rj_fail(err, RJ_EIO, "rocket: cannot open %s (fd %u of %u) through %s: %s. %s", path, i + 1,
                    nctx, r->sys->name, strerror(e),
                    e == ENOENT ? "Is the rocket driver loaded (modprobe rocket)? Without an NPU, use "
                                  "SimDevice, or RocketDevice(fake=True) / RJ_FAKE_ROCKET=1."
                    : e == EACCES ? "Give this user access to the accel node (e.g. a udev rule or the "
                                    "render group)."
                                  : "");
            rk_destroy(&r->base); /* closes the fds opened so far, in reverse */
            return RJ_EIO;
        }
        r->fds[i] = fd;
        r->base.nctx = i + 1;
    }
    *out = &r->base;
    return RJ_OK;
}

int rj_rocket_device_fd(const rj_device *d, uint32_t ctx)
{
    if (!d || d->ops != &rocket_ops || ctx >= d->nctx)
        return -1;
    return ((const rocket_dev *)d)->fds[ctx];
}
