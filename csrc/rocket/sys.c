/* The system-call seam and the ioctl request numbers of the rocket uAPI. */
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rocket/rj_rocket.h"

/* Layouts of include/uapi/drm/rocket_accel.h and drm.h: a size drift would change the ioctl
 * numbers and break the ABI silently, so pin them here. */
_Static_assert(sizeof(rj_drm_rocket_create_bo) == 24, "drm_rocket_create_bo is 24 bytes");
_Static_assert(sizeof(rj_drm_rocket_submit) == 24, "drm_rocket_submit is 24 bytes");
_Static_assert(sizeof(rj_drm_rocket_job) == 40, "drm_rocket_job is 40 bytes");
_Static_assert(sizeof(rj_drm_rocket_task) == 8, "drm_rocket_task is 8 bytes");
_Static_assert(sizeof(rj_drm_rocket_prep_bo) == 16, "drm_rocket_prep_bo is 16 bytes");
_Static_assert(sizeof(rj_drm_rocket_fini_bo) == 8, "drm_rocket_fini_bo is 8 bytes");
_Static_assert(sizeof(rj_drm_gem_close) == 8, "drm_gem_close is 8 bytes");
_Static_assert(offsetof(rj_drm_rocket_prep_bo, timeout_ns) == 8, "timeout_ns at byte 8");
_Static_assert(offsetof(rj_drm_rocket_job, task_count) == 24, "task_count at byte 24");

/* drm.h: driver ioctls are numbered from DRM_COMMAND_BASE under type 'd'. */
#define RJ_DRM_TYPE 'd'
#define RJ_DRM_COMMAND_BASE 0x40

unsigned long rj_rocket_ioctl_request(uint32_t which)
{
    switch (which) {
    case RJ_ROCKET_IOCTL_CREATE_BO:
        return _IOWR(RJ_DRM_TYPE, RJ_DRM_COMMAND_BASE + 0x00, rj_drm_rocket_create_bo);
    case RJ_ROCKET_IOCTL_SUBMIT:
        return _IOW(RJ_DRM_TYPE, RJ_DRM_COMMAND_BASE + 0x01, rj_drm_rocket_submit);
    case RJ_ROCKET_IOCTL_PREP_BO:
        return _IOW(RJ_DRM_TYPE, RJ_DRM_COMMAND_BASE + 0x02, rj_drm_rocket_prep_bo);
    case RJ_ROCKET_IOCTL_FINI_BO:
        return _IOW(RJ_DRM_TYPE, RJ_DRM_COMMAND_BASE + 0x03, rj_drm_rocket_fini_bo);
    case RJ_ROCKET_IOCTL_GEM_CLOSE:
        return _IOW(RJ_DRM_TYPE, 0x09, rj_drm_gem_close);
    default:
        return 0;
    }
}

static int libc_open(const char *path, int flags) { return open(path, flags); }
static int libc_close(int fd) { return close(fd); }
static int libc_ioctl(int fd, unsigned long request, void *arg) { return ioctl(fd, request, arg); }
static void *libc_mmap(void *addr, size_t len, int prot, int flags, int fd, int64_t offset)
{
    return mmap(addr, len, prot, flags, fd, (off_t)offset);
}
static int libc_munmap(void *addr, size_t len) { return munmap(addr, len); }

static const rj_sys_ops libc_ops = {
    .name = "libc",
    .open = libc_open,
    .close = libc_close,
    .ioctl = libc_ioctl,
    .mmap = libc_mmap,
    .munmap = libc_munmap,
    .job_error = NULL,
};

static const rj_sys_ops *override;

const rj_sys_ops *rj_sys_libc(void) { return &libc_ops; }

int rj_sys_select(const rj_sys_ops **out, rj_err *err)
{
    const rj_sys_ops *o = __atomic_load_n(&override, __ATOMIC_ACQUIRE);
    int fake, rc;
    *out = NULL;
    if (o) {
        *out = o;
        return RJ_OK;
    }
    if ((rc = rj_env_switch(RJ_ENV_FAKE_ROCKET, &fake, err)))
        return rc;
    *out = fake ? rj_sys_fake_rocket() : &libc_ops;
    return RJ_OK;
}

const rj_sys_ops *rj_sys_current(void)
{
    const rj_sys_ops *o;
    return rj_sys_select(&o, NULL) == RJ_OK ? o : NULL;
}

void rj_sys_set(const rj_sys_ops *ops) { __atomic_store_n(&override, ops, __ATOMIC_RELEASE); }
