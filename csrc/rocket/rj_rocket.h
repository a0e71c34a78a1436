#ifndef RJ_ROCKET_H
#define RJ_ROCKET_H
/* The rocket driver (/dev/accel/accelN) as a device, the system-call seam it goes through,
 * and the in-process ioctl fake of the kernel side.
 *
 * uAPI facts, restated from the mainline kernel (torvalds/linux):
 *   include/uapi/drm/rocket_accel.h   ioctl numbers 0x00..0x03 above DRM_COMMAND_BASE, struct
 *                                     layouts and field meanings
 *   drivers/accel/rocket/rocket_gem.c CREATE_BO / PREP_BO / FINI_BO behaviour and checks
 *   drivers/accel/rocket/rocket_job.c SUBMIT checks
 *   include/uapi/drm/drm.h            DRM_IOCTL_BASE 'd', DRM_COMMAND_BASE 0x40,
 *                                     GEM_CLOSE = DRM_IOW(0x09, {u32 handle; u32 pad})
 * The structs below mirror those layouts field for field under rj_ names (sizes asserted in
 * rocket_uapi.c). */
#include <stddef.h>
#include <stdint.h>

#include "rj_err.h"
#include "runtime/rj_runtime.h"

/* CREATE_BO, _IOWR, 24 bytes. size in; handle, dma_address (per-fd IOVA) and the fake mmap
 * offset for the DRM node out. */
typedef struct rj_drm_rocket_create_bo {
    uint32_t size;
    uint32_t handle;
    uint64_t dma_address;
    uint64_t offset;
} rj_drm_rocket_create_bo;

/* SUBMIT, _IOW, 24 bytes: an array of jobs with an explicit element size. */
typedef struct rj_drm_rocket_submit {
    uint64_t jobs;
    uint32_t job_count;
    uint32_t job_struct_size;
    uint64_t reserved; /* must be zero */
} rj_drm_rocket_submit;

/* One job, 40 bytes: tasks and the BO handles (u32 arrays) it reads and writes. */
typedef struct rj_drm_rocket_job {
    uint64_t tasks;
    uint64_t in_bo_handles;
    uint64_t out_bo_handles;
    uint32_t task_count;
    uint32_t task_struct_size;
    uint32_t in_bo_handle_count;
    uint32_t out_bo_handle_count;
} rj_drm_rocket_job;

/* One task, 8 bytes: the regcmd IOVA (32-bit) and its word count. */
typedef struct rj_drm_rocket_task {
    uint32_t regcmd;
    uint32_t regcmd_count;
} rj_drm_rocket_task;

/* PREP_BO, _IOW, 16 bytes. timeout_ns is an ABSOLUTE CLOCK_MONOTONIC deadline
 * (drm_timeout_abs_to_jiffies); 0 or a past deadline polls. */
typedef struct rj_drm_rocket_prep_bo {
    uint32_t handle;
    uint32_t reserved; /* must be zero */
    int64_t timeout_ns;
} rj_drm_rocket_prep_bo;

/* FINI_BO, _IOW, 8 bytes. */
typedef struct rj_drm_rocket_fini_bo {
    uint32_t handle;
    uint32_t reserved; /* must be zero */
} rj_drm_rocket_fini_bo;

/* GEM_CLOSE (drm core), _IOW, 8 bytes. */
typedef struct rj_drm_gem_close {
    uint32_t handle;
    uint32_t pad;
} rj_drm_gem_close;

enum {
    RJ_ROCKET_IOCTL_CREATE_BO = 0,
    RJ_ROCKET_IOCTL_SUBMIT = 1,
    RJ_ROCKET_IOCTL_PREP_BO = 2,
    RJ_ROCKET_IOCTL_FINI_BO = 3,
    RJ_ROCKET_IOCTL_GEM_CLOSE = 4,
    RJ_ROCKET_IOCTL_COUNT = 5,
};
/* The ioctl request number of one of the above (0 for an unknown id). */
unsigned long rj_rocket_ioctl_request(uint32_t which);

/* ---- the system-call seam ------------------------------------------------------------------ */

/* Everything RocketDevice does to the kernel goes through one of these tables: libc by
 * default, the fake for CI. Calls follow libc conventions (-1 / MAP_FAILED and errno). */
typedef struct rj_sys_ops {
    const char *name;
    int (*open)(const char *path, int flags);
    int (*close)(int fd);
    int (*ioctl)(int fd, unsigned long request, void *arg);
    void *(*mmap)(void *addr, size_t len, int prot, int flags, int fd, int64_t offset);
    int (*munmap)(void *addr, size_t len);
    /* Optional (NULL on libc): an execution error the backend saw for a job on fd since
     * the last call; returns 0 or an RJ_E* code with err filled. */
    int (*job_error)(int fd, rj_err *err);
} rj_sys_ops;

const rj_sys_ops *rj_sys_libc(void);
const rj_sys_ops *rj_sys_fake_rocket(void);
/* What a RocketDevice created now will use: the table set by rj_sys_set, else the fake when
 * RJ_FAKE_ROCKET is on, else libc. rj_sys_select says why when RJ_FAKE_ROCKET holds a value
 * that is not a switch word (rj_sys_current then returns NULL). */
int rj_sys_select(const rj_sys_ops **out, rj_err *err);
const rj_sys_ops *rj_sys_current(void);
void rj_sys_set(const rj_sys_ops *ops); /* NULL restores the default */

/* ---- RocketDevice ----------------------------------------------------------------------------- */

enum {
    RJ_ROCKET_USE_FAKE = 1u << 0, /* talk to the in-process fake regardless of the seam */
};
#define RJ_ROCKET_DEFAULT_PATH "/dev/accel/accel0"

/* Opens `nctx` fds on path (NULL = /dev/accel/accel0): one fd per context, which is how the
 * rocket driver spreads work over cores (notes: perf/iova-and-multicore.md). */
int rj_rocket_device_create(rj_device **out, const char *path, uint32_t nctx, uint32_t flags,
                            rj_err *err);
/* The fd behind context ctx (-1 if none); for tests and diagnostics. */
int rj_rocket_device_fd(const rj_device *dev, uint32_t ctx);

/* ---- the fake kernel ------------------------------------------------------------------------ */

typedef struct rj_fake_rocket_faults {
    uint32_t prep_eintr;        /* the next N PREP_BO calls fail with EINTR */
    uint32_t hang_jobs;         /* the next N jobs never complete (their out-BOs stay busy) */
    uint32_t fail_create_at;    /* the Nth CREATE_BO from now fails with ENOMEM (0 = never) */
    uint32_t fail_mmap_at;      /* the Nth mmap from now fails with ENOMEM (0 = never) */
    uint32_t fail_submit;       /* the next N SUBMIT calls fail with submit_errno */
    uint32_t job_delay_us;      /* every job takes at least this long (stand-in for NPU time) */
    uint32_t submit_errno;      /* errno of an injected SUBMIT failure (0 = ENOMEM) */
    uint32_t prep_timeout;      /* the next N PREP_BO calls time out at once (ETIMEDOUT) */
    uint32_t short_bo_at;       /* the Nth CREATE_BO from now backs only half its size: jobs
                                 * reaching the upper half fault (an IOMMU fault on silicon) */
    uint32_t drop_jobs;         /* the next N jobs are dropped as if a BO handle had been closed
                                 * (ENOENT per job; SUBMIT still returns 0, as the kernel does) */
    uint32_t device_gone;       /* every ioctl and mmap fails with ENODEV while set */
    uint32_t reserved[3];       /* must be zero */
} rj_fake_rocket_faults;

#define RJ_FAKE_ROCKET_MAX_DEADLINES 8
typedef struct rj_fake_rocket_stats {
    uint32_t open_fds;
    uint32_t live_bos;          /* BOs with an open handle or a live mapping */
    uint64_t live_bytes;
    uint64_t ioctls;
    uint64_t ioctl_errors;
    uint64_t bos_created;
    uint64_t submits;
    uint64_t jobs_run;
    uint64_t jobs_dropped;      /* refused per job: the kernel drops them and SUBMIT returns 0 */
    uint64_t preps;
    uint64_t finis;
    uint64_t eintr_returned;
    uint64_t timeouts;          /* PREP_BO calls that returned ETIMEDOUT or EBUSY */
    int64_t prep_deadlines[RJ_FAKE_ROCKET_MAX_DEADLINES]; /* timeout_ns of the last PREP_BOs */
    uint32_t n_prep_deadlines;  /* how many of the above are filled (most recent last) */
    int32_t last_errno;         /* errno of the last refused ioctl or dropped job */
    uint32_t max_running;       /* most jobs executing at the same moment, over all fds */
    char last_error[512];       /* why (the kernel's drm_dbg reason, in our words) */
} rj_fake_rocket_stats;

void rj_fake_rocket_set_faults(const rj_fake_rocket_faults *faults);
void rj_fake_rocket_get_stats(rj_fake_rocket_stats *out);
/* Forget counters and faults; refuses (RJ_EINVAL) while fds are still open. */
int rj_fake_rocket_reset(rj_err *err);
/* Simulator flags for cores opened from now on (default RJ_SIM_STRICT). */
void rj_fake_rocket_set_sim_flags(uint32_t flags);

#endif /* RJ_ROCKET_H */
