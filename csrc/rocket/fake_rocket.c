/* An in-process stand-in for the kernel side of /dev/accel/accel0, behind the system-call
 * seam, so the real RocketDevice code path (ioctl numbers and struct layouts included) runs
 * without hardware. It checks every argument the way the mainline driver does and runs
 * submitted jobs on the simulator.
 *
 * Kernel behaviour modelled (torvalds/linux drivers/accel/rocket/, restated):
 *   open        one file = one IOVA space (starting at 0, notes: perf/iova-and-multicore.md)
 *               and one scheduling entity; here also one simulator core with its own worker
 *               thread, so jobs of different files run at the same time, as on three cores.
 *   CREATE_BO   page-aligned first-fit IOVA; handles count from 1; returns an mmap offset.
 *   SUBMIT      job_count 0 -> success, nothing done; job_struct_size < 40 or reserved != 0
 *               -> EINVAL; then per job: task_count 0, task_struct_size < 8, regcmd_count 0
 *               -> EINVAL; an unknown handle -> ENOENT. A failing job is dropped and SUBMIT
 *               still returns 0 (rocket_ioctl_submit ignores each job's result). An accepted
 *               job is queued on its file and runs asynchronously; its out-BOs are busy until
 *               it completes. Jobs of one file run in submission order.
 *   PREP_BO     reserved != 0 -> EINVAL; unknown handle -> ENOENT; blocks until the BO's
 *               writers completed or the absolute CLOCK_MONOTONIC deadline passed: 0 or a past
 *               deadline polls and gives EBUSY, a future one that expires gives ETIMEDOUT.
 *   FINI_BO     reserved != 0 -> EINVAL; unknown handle -> ENOENT.
 *   GEM_CLOSE   unknown handle -> EINVAL; memory lives on while mapped.
 * Deliberately stricter than the kernel: an ioctl whose encoded size or direction differs
 * from the uAPI struct is refused (the kernel would zero-extend), because for us that means
 * our own struct layout drifted. Observed on hardware, not in the kernel: a BO in both the in-
 * and out-list makes the job complete having executed nothing (notes:
 * encodings/regcmd-task-model.md); the fake drops such a job the same way. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "rocket/rj_rocket.h"
#include "runtime/device_internal.h"

#define FAKE_MAX_FILES 64
#define FAKE_IOVA_LIMIT 0x100000000ull
/* DRM hands out mmap offsets in a "fake offset" range above the file's real pages; any
 * page-aligned unique value serves. */
#define FAKE_MMAP_BASE 0x100000000ull

typedef struct fake_bo {
    int file;            /* index into files[], -1 once the file is closed */
    uint32_t handle;
    int handle_open;
    uint32_t maps;
    uint32_t busy;       /* queued or running jobs that write it (a hung job never finishes) */
    uint32_t refs;       /* queued jobs and waiters holding it (the kernel's job BO refs) */
    uint64_t iova, size, map_size, mmap_offset;
    uint64_t job_size;   /* what a job may reach: size, or less under the short_bo fault */
    uint8_t *mem;
} fake_bo;

/* An accepted job waiting for (or running on) its file's worker. It holds a reference on every
 * BO of the file, so the memory it may address outlives a GEM_CLOSE issued meanwhile. */
typedef struct fake_job {
    struct fake_job *next;
    rj_task *tasks;
    uint32_t ntasks;
    fake_bo **bos;       /* the file's BOs at submit: the job's view of the IOVA space */
    uint32_t nbos;
    fake_bo **outs;      /* writers: busy drops when the job completes */
    uint32_t nouts;
    int hang;            /* injected: never completes */
} fake_job;

typedef struct fake_file {
    int used;
    int fd;
    rj_sim *sim;         /* touched only by the file's worker once the file is open */
    uint32_t next_handle;
    int job_err_code;
    char job_err_msg[1024];
    uint32_t jobs_dropped;   /* since the last job_error(): jobs the kernel refused silently */
    char drop_msg[512];
    pthread_t worker;
    pthread_cond_t work; /* the queue got a job, or the file is closing */
    fake_job *head, *tail;
    int closing;
} fake_file;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t done; /* some job completed (CLOCK_MONOTONIC, for PREP_BO deadlines) */
    uint32_t running;    /* jobs executing right now, over all files */
    fake_file files[FAKE_MAX_FILES];
    fake_bo **bos;
    uint32_t nbos, cap_bos;
    uint64_t next_mmap;
    uint32_t sim_flags;
    int sim_flags_set;
    rj_fake_rocket_faults faults;
    uint32_t creates_seen, mmaps_seen;
    rj_fake_rocket_stats st;
} K = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Keep why the last ioctl or job was refused (the kernel's drm_dbg reason, in our words). */
static void note_error(int e, const char *fmt, va_list ap)
{
    vsnprintf(K.st.last_error, sizeof(K.st.last_error), fmt, ap);
    K.st.last_errno = e;
}

static int fail_errno(int e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail_errno(int e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    note_error(e, fmt, ap);
    va_end(ap);
    K.st.ioctl_errors++;
    errno = e;
    return -1;
}

/* A job refused after SUBMIT's own checks passed: recorded, not returned (kernel). */
static void drop_job(int e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void drop_job(int e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    note_error(e, fmt, ap);
    va_end(ap);
    K.st.jobs_dropped++;
}

static fake_file *file_of(int fd, int *index)
{
    if (fd < 0)
        return NULL;
    for (int i = 0; i < FAKE_MAX_FILES; i++)
        if (K.files[i].used && K.files[i].fd == fd) {
            if (index)
                *index = i;
            return &K.files[i];
        }
    return NULL;
}

static fake_bo *lookup(int file, uint32_t handle)
{
    for (uint32_t i = 0; i < K.nbos; i++)
        if (K.bos[i]->file == file && K.bos[i]->handle_open && K.bos[i]->handle == handle)
            return K.bos[i];
    return NULL;
}

static pthread_once_t done_once = PTHREAD_ONCE_INIT;

/* PREP_BO deadlines are CLOCK_MONOTONIC, so the completion condition waits on that clock. */
static void init_done_cond(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&K.done, &a);
    pthread_condattr_destroy(&a);
}

static void free_bo_if_unused(fake_bo *b)
{
    if (b->handle_open || b->maps || b->refs)
        return;
    for (uint32_t i = 0; i < K.nbos; i++)
        if (K.bos[i] == b) {
            K.bos[i] = K.bos[--K.nbos];
            break;
        }
    munmap(b->mem, b->map_size);
    free(b);
}

/* First fit in [0, 4 GiB) among the file's live BOs, page aligned (rocket_gem.c inserts
 * the node with PAGE_SIZE alignment). */
static int alloc_iova(int file, uint64_t map, uint64_t *out)
{
    uint64_t at = 0;
    for (;;) {
        int moved = 0;
        for (uint32_t i = 0; i < K.nbos; i++) {
            fake_bo *b = K.bos[i];
            if (b->file != file)
                continue;
            if (at < b->iova + b->map_size && b->iova < at + map) {
                at = b->iova + b->map_size;
                moved = 1;
            }
        }
        if (!moved)
            break;
    }
    if (at + map > FAKE_IOVA_LIMIT)
        return -1;
    *out = at;
    return 0;
}

/* ---- ioctls ------------------------------------------------------------------------------- */

static int do_create_bo(int fi, rj_drm_rocket_create_bo *a)
{
    fake_file *f = &K.files[fi];
    if (a->size == 0)
        return fail_errno(EINVAL, "CREATE_BO: size 0 (a GEM object needs at least one page)");
    K.creates_seen++;
    int short_bo = K.faults.short_bo_at && K.creates_seen == K.faults.short_bo_at;
    if (short_bo)
        K.faults.short_bo_at = 0;
    if (K.faults.fail_create_at && K.creates_seen == K.faults.fail_create_at) {
        K.faults.fail_create_at = 0;
        return fail_errno(ENOMEM, "CREATE_BO: injected ENOMEM");
    }
    uint64_t map = rj_round_up(a->size, RJ_PAGE), iova;
    if (alloc_iova(fi, map, &iova))
        return fail_errno(ENOSPC, "CREATE_BO: no room for %u bytes in this fd's 4 GiB IOVA space",
                          a->size);
    fake_bo *b = calloc(1, sizeof(*b));
    if (!b)
        return fail_errno(ENOMEM, "CREATE_BO: out of memory");
    b->mem = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (b->mem == MAP_FAILED) {
        free(b);
        return fail_errno(ENOMEM, "CREATE_BO: out of memory");
    }
    if (K.nbos == K.cap_bos) {
        uint32_t cap = K.cap_bos ? 2 * K.cap_bos : 32;
        fake_bo **n = realloc(K.bos, sizeof(*n) * cap);
        if (!n) {
            munmap(b->mem, map);
            free(b);
            return fail_errno(ENOMEM, "CREATE_BO: out of memory");
        }
        K.bos = n;
        K.cap_bos = cap;
    }
    b->file = fi;
    b->handle = f->next_handle++;
    b->handle_open = 1;
    b->iova = iova;
    b->size = a->size;
    b->job_size = short_bo ? a->size / 2 : a->size;
    b->map_size = map;
    b->mmap_offset = FAKE_MMAP_BASE + K.next_mmap;
    K.next_mmap += map;
    K.bos[K.nbos++] = b;
    K.st.bos_created++;
    a->handle = b->handle;
    a->dma_address = iova;
    a->offset = b->mmap_offset;
    return 0;
}

/* Copy a user array the way copy_from_user would fail on it. */
static int user_ok(uint64_t ptr, uint64_t count) { return count == 0 || ptr != 0; }

static void job_free(fake_job *j)
{
    for (uint32_t i = 0; i < j->nbos; i++) {
        j->bos[i]->refs--;
        free_bo_if_unused(j->bos[i]);
    }
    free(j->bos);
    free(j->outs);
    free(j->tasks);
    free(j);
}

/* The file's worker: the core the fd is scheduled on. It runs queued jobs in order on the
 * file's own simulator, with the global lock dropped, so files run in parallel. Called with
 * K.lock held; returns with it held once the file is closing and its queue is drained. */
static void *worker_main(void *arg)
{
    fake_file *f = arg;
    pthread_mutex_lock(&K.lock);
    for (;;) {
        while (!f->head && !f->closing)
            pthread_cond_wait(&f->work, &K.lock);
        fake_job *j = f->head;
        if (!j)
            break;
        f->head = j->next;
        if (!f->head)
            f->tail = NULL;
        if (j->hang) {
            /* The job never completes: its writers stay busy, its fence never signals. */
            job_free(j);
            continue;
        }
        rj_region *regions = calloc(j->nbos ? j->nbos : 1, sizeof(*regions));
        for (uint32_t i = 0; regions && i < j->nbos; i++)
            regions[i] = (rj_region){.iova = j->bos[i]->iova, .size = j->bos[i]->job_size,
                                     .host = j->bos[i]->mem};
        uint32_t delay_us = K.faults.job_delay_us;
        K.running++;
        if (K.running > K.st.max_running)
            K.st.max_running = K.running;
        pthread_mutex_unlock(&K.lock);

        rj_err e = {0};
        int rc = regions ? rj_sim_run_job(f->sim, regions, j->nbos, j->tasks, j->ntasks, &e)
                         : rj_fail(&e, RJ_ENOMEM, "fake rocket: out of memory for a job's regions");
        if (delay_us) {
            /* Stand-in for the time the NPU spends on the job (fault injection). */
            struct timespec ts = {.tv_sec = delay_us / 1000000u,
                                  .tv_nsec = (long)(delay_us % 1000000u) * 1000};
            while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
            }
        }
        free(regions);

        pthread_mutex_lock(&K.lock);
        K.running--;
        for (uint32_t i = 0; rc && i < j->nbos; i++)
            if (j->bos[i]->job_size < j->bos[i]->size) {
                /* The injected short BO, not the program, put the access out of bounds: a
                 * device-side memory fault (RocketDevice reports it as such). */
                rc = RJ_EFAULT;
                break;
            }
        if (rc && !f->job_err_code) {
            /* On silicon this is a job that hangs until the 500 ms scheduler timeout and a
             * core reset; the fence still signals. Keep the simulator's reason for job_error(). */
            f->job_err_code = rc;
            snprintf(f->job_err_msg, sizeof(f->job_err_msg), "%s", e.msg);
        }
        K.st.jobs_run++;
        for (uint32_t o = 0; o < j->nouts; o++)
            j->outs[o]->busy--;
        job_free(j);
        pthread_cond_broadcast(&K.done);
    }
    pthread_mutex_unlock(&K.lock);
    return NULL;
}

/* Queue an accepted job on its file (K.lock held). */
static void queue_job(int fi, const rj_drm_rocket_job *dj, uint32_t ji, fake_bo **outs)
{
    fake_file *f = &K.files[fi];
    fake_job *j = calloc(1, sizeof(*j));
    uint32_t n = 0;
    for (uint32_t i = 0; i < K.nbos; i++)
        n += K.bos[i]->file == fi;
    if (j) {
        j->tasks = calloc(dj->task_count, sizeof(*j->tasks));
        j->bos = calloc(n ? n : 1, sizeof(*j->bos));
        j->outs = calloc(dj->out_bo_handle_count ? dj->out_bo_handle_count : 1, sizeof(*j->outs));
    }
    if (!j || !j->tasks || !j->bos || !j->outs) {
        if (j) {
            free(j->tasks);
            free(j->bos);
            free(j->outs);
            free(j);
        }
        drop_job(ENOMEM, "SUBMIT job %u: out of memory", ji);
        return;
    }
    const uint8_t *base = (const uint8_t *)(uintptr_t)dj->tasks;
    for (uint32_t t = 0; t < dj->task_count; t++) {
        rj_drm_rocket_task dt;
        memcpy(&dt, base + (uint64_t)t * dj->task_struct_size, sizeof(dt));
        j->tasks[t] = (rj_task){.regcmd_iova = dt.regcmd, .regcmd_count = dt.regcmd_count};
    }
    j->ntasks = dj->task_count;
    for (uint32_t i = 0; i < K.nbos; i++)
        if (K.bos[i]->file == fi) {
            K.bos[i]->refs++;
            j->bos[j->nbos++] = K.bos[i];
        }
    for (uint32_t o = 0; o < dj->out_bo_handle_count; o++) {
        outs[o]->busy++;
        j->outs[j->nouts++] = outs[o];
    }
    if (K.faults.hang_jobs) {
        K.faults.hang_jobs--;
        j->hang = 1;
    }
    if (f->tail)
        f->tail->next = j;
    else
        f->head = j;
    f->tail = j;
    pthread_cond_signal(&f->work);
}

static int lookup_handles(int fi, uint64_t ptr, uint32_t count, fake_bo **out, uint32_t ji,
                          const char *which)
{
    if (!user_ok(ptr, count)) {
        drop_job(EFAULT, "SUBMIT job %u: %s_bo_handles is NULL with a count of %u", ji, which, count);
        return -1;
    }
    const uint32_t *h = (const uint32_t *)(uintptr_t)ptr;
    for (uint32_t i = 0; i < count; i++) {
        out[i] = lookup(fi, h[i]);
        if (!out[i]) {
            drop_job(ENOENT, "SUBMIT job %u: %s BO handle %u (entry %u) is not a handle of this fd",
                     ji, which, h[i], i);
            return -1;
        }
    }
    return 0;
}

static void submit_job(int fi, const rj_drm_rocket_job *j, uint32_t ji)
{
    if (j->task_count == 0)
        { drop_job(EINVAL, "SUBMIT job %u: task_count is 0", ji); return; }
    if (j->task_struct_size < sizeof(rj_drm_rocket_task))
        { drop_job(EINVAL, "SUBMIT job %u: task_struct_size %u is smaller than drm_rocket_task "
                        "(%zu bytes)", ji, j->task_struct_size, sizeof(rj_drm_rocket_task)); return; }
    if (!j->tasks)
        { drop_job(EFAULT, "SUBMIT job %u: tasks pointer is NULL", ji); return; }
    const uint8_t *base = (const uint8_t *)(uintptr_t)j->tasks;
    for (uint32_t t = 0; t < j->task_count; t++) {
        rj_drm_rocket_task dt;
        memcpy(&dt, base + (uint64_t)t * j->task_struct_size, sizeof(dt));
        if (dt.regcmd_count == 0)
            { drop_job(EINVAL, "SUBMIT job %u task %u: regcmd_count is 0", ji, t); return; }
    }
    fake_bo **ins = calloc(j->in_bo_handle_count + 1, sizeof(*ins));
    fake_bo **outs = calloc(j->out_bo_handle_count + 1, sizeof(*outs));
    if (!ins || !outs) {
        free(ins);
        free(outs);
        { drop_job(ENOMEM, "SUBMIT job %u: out of memory", ji); return; }
    }
    if (lookup_handles(fi, j->in_bo_handles, j->in_bo_handle_count, ins, ji, "in") == 0 &&
        lookup_handles(fi, j->out_bo_handles, j->out_bo_handle_count, outs, ji, "out") == 0) {
        int both = 0;
        for (uint32_t i = 0; i < j->in_bo_handle_count && !both; i++)
            for (uint32_t o = 0; o < j->out_bo_handle_count && !both; o++)
                both = ins[i] == outs[o];
        if (both)
            drop_job(0, "SUBMIT job %u: a BO is in both the in- and out-list; hardware completes "
                     "such a job having executed nothing (notes: encodings/regcmd-task-model.md)",
                     ji);
        else if (K.faults.drop_jobs) {
            K.faults.drop_jobs--;
            drop_job(ENOENT, "SUBMIT job %u: injected: a BO handle of the job was closed (the "
                     "kernel drops the job and SUBMIT still returns 0)", ji);
        } else
            queue_job(fi, j, ji, outs);
    }
    free(ins);
    free(outs);
}

static int do_submit(int fi, rj_drm_rocket_submit *a)
{
    K.st.submits++;
    if (a->job_count == 0)
        return 0;
    if (a->job_struct_size < sizeof(rj_drm_rocket_job))
        return fail_errno(EINVAL, "SUBMIT: job_struct_size %u is smaller than drm_rocket_job (%zu)",
                          a->job_struct_size, sizeof(rj_drm_rocket_job));
    if (a->reserved != 0)
        return fail_errno(EINVAL, "SUBMIT: reserved field is 0x%llx, must be zero",
                          (unsigned long long)a->reserved);
    if (!a->jobs)
        return fail_errno(EFAULT, "SUBMIT: jobs pointer is NULL");
    if (K.faults.fail_submit) {
        K.faults.fail_submit--;
        int e = K.faults.submit_errno ? (int)K.faults.submit_errno : ENOMEM;
        return fail_errno(e, "SUBMIT: injected %s", strerror(e));
    }
    const uint8_t *base = (const uint8_t *)(uintptr_t)a->jobs;
    for (uint32_t i = 0; i < a->job_count; i++) {
        rj_drm_rocket_job j;
        memcpy(&j, base + (uint64_t)i * a->job_struct_size, sizeof(j));
        uint64_t before = K.st.jobs_dropped;
        submit_job(fi, &j, i);
        if (K.st.jobs_dropped != before && K.st.last_errno != 0) {
            /* Silicon gives userspace no sign of a dropped job (its fence just signals); the
             * fake keeps the reason so job_error() can tell the runtime. */
            K.files[fi].jobs_dropped++;
            snprintf(K.files[fi].drop_msg, sizeof(K.files[fi].drop_msg), "%s", K.st.last_error);
        }
    }
    return 0;
}

/* Returns 0, or -1 with errno. Blocks (K.lock released while waiting) until the BO has no
 * pending writer or the absolute deadline passes. */
static int do_prep_bo(int fi, rj_drm_rocket_prep_bo *a)
{
    K.st.preps++;
    if (a->reserved != 0)
        return fail_errno(EINVAL, "PREP_BO: reserved field is %u, must be zero", a->reserved);
    fake_bo *b = lookup(fi, a->handle);
    if (!b)
        return fail_errno(ENOENT, "PREP_BO: handle %u is not a handle of this fd", a->handle);
    if (K.st.n_prep_deadlines == RJ_FAKE_ROCKET_MAX_DEADLINES) {
        memmove(K.st.prep_deadlines, K.st.prep_deadlines + 1,
                sizeof(int64_t) * (RJ_FAKE_ROCKET_MAX_DEADLINES - 1));
        K.st.n_prep_deadlines--;
    }
    K.st.prep_deadlines[K.st.n_prep_deadlines++] = a->timeout_ns;
    if (K.faults.prep_eintr) {
        K.faults.prep_eintr--;
        K.st.eintr_returned++;
        errno = EINTR;
        return -1;
    }
    if (K.faults.prep_timeout) {
        K.faults.prep_timeout--;
        K.st.timeouts++;
        return fail_errno(ETIMEDOUT, "PREP_BO: injected: handle %u timed out", a->handle);
    }
    if (!b->busy)
        return 0;
    if (a->timeout_ns == 0 || a->timeout_ns <= rj_now_ns()) {
        K.st.timeouts++;
        return fail_errno(EBUSY, "PREP_BO: handle %u still busy at a deadline already passed (poll)",
                          a->handle);
    }
    struct timespec until = {.tv_sec = a->timeout_ns / 1000000000ll,
                             .tv_nsec = a->timeout_ns % 1000000000ll};
    b->refs++; /* a GEM_CLOSE while we wait must not free it under us */
    int rc = 0;
    while (b->busy && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&K.done, &K.lock, &until);
    int still = b->busy != 0;
    b->refs--;
    free_bo_if_unused(b);
    if (still) {
        K.st.timeouts++;
        return fail_errno(ETIMEDOUT, "PREP_BO: handle %u still busy at the deadline", a->handle);
    }
    return 0;
}

static int do_fini_bo(int fi, rj_drm_rocket_fini_bo *a)
{
    K.st.finis++;
    if (a->reserved != 0)
        return fail_errno(EINVAL, "FINI_BO: reserved field is %u, must be zero", a->reserved);
    if (!lookup(fi, a->handle))
        return fail_errno(ENOENT, "FINI_BO: handle %u is not a handle of this fd", a->handle);
    return 0;
}

static int do_gem_close(int fi, rj_drm_gem_close *a)
{
    fake_bo *b = lookup(fi, a->handle);
    if (!b)
        return fail_errno(EINVAL, "GEM_CLOSE: handle %u is not a handle of this fd", a->handle);
    b->handle_open = 0;
    free_bo_if_unused(b);
    return 0;
}

static int fake_ioctl(int fd, unsigned long request, void *arg)
{
    pthread_once(&done_once, init_done_cond);
    pthread_mutex_lock(&K.lock);
    K.st.ioctls++;
    int fi, rc;
    if (!file_of(fd, &fi)) {
        rc = fail_errno(EBADF, "ioctl on fd %d, which is not an open fake rocket file", fd);
        goto out;
    }
    int which = -1;
    for (int w = 0; w < RJ_ROCKET_IOCTL_COUNT; w++)
        if (rj_rocket_ioctl_request((uint32_t)w) == request)
            which = w;
    if (which < 0) {
        /* Same type and command number as a known ioctl but another size or direction means
         * the caller's struct layout is not the uAPI's. */
        for (int w = 0; w < RJ_ROCKET_IOCTL_COUNT; w++)
            if ((rj_rocket_ioctl_request((uint32_t)w) & 0xFFFFu) == (request & 0xFFFFu)) {
                rc = fail_errno(EINVAL, "ioctl 0x%lx: command 0x%lx carries size %lu, the uAPI struct "
                                "has %lu (struct layout drift)", request, request & 0xFFFFu,
                                (request >> 16) & 0x3FFFu,
                                (rj_rocket_ioctl_request((uint32_t)w) >> 16) & 0x3FFFu);
                goto out;
            }
        rc = fail_errno(EINVAL, "ioctl 0x%lx is not a rocket or GEM_CLOSE ioctl", request);
        goto out;
    }
    if (!arg) {
        rc = fail_errno(EFAULT, "ioctl 0x%lx: NULL argument", request);
        goto out;
    }
    if (K.faults.device_gone && which != RJ_ROCKET_IOCTL_GEM_CLOSE) {
        /* An unplugged DRM device answers ENODEV (drm_dev_enter fails); handles can still be
         * closed so userspace can clean up. */
        rc = fail_errno(ENODEV, "ioctl 0x%lx: injected: the device is gone", request);
        goto out;
    }
    switch (which) {
    case RJ_ROCKET_IOCTL_CREATE_BO: rc = do_create_bo(fi, arg); break;
    case RJ_ROCKET_IOCTL_SUBMIT: rc = do_submit(fi, arg); break;
    case RJ_ROCKET_IOCTL_PREP_BO: rc = do_prep_bo(fi, arg); break;
    case RJ_ROCKET_IOCTL_FINI_BO: rc = do_fini_bo(fi, arg); break;
    default: rc = do_gem_close(fi, arg); break;
    }
out:;
    int e = errno;
    pthread_mutex_unlock(&K.lock);
    errno = e;
    return rc;
}

/* ---- open / close / mmap ------------------------------------------------------------------- */

static int fake_open(const char *path, int flags)
{
    if (!path || strcmp(path, RJ_ROCKET_DEFAULT_PATH) != 0) {
        errno = ENOENT;
        return -1;
    }
    if ((flags & O_ACCMODE) != O_RDWR) {
        errno = EACCES; /* the DRM node is used read-write */
        return -1;
    }
    pthread_once(&done_once, init_done_cond);
    pthread_mutex_lock(&K.lock);
    int rc = -1, e = EMFILE;
    for (int i = 0; i < FAKE_MAX_FILES; i++) {
        if (K.files[i].used)
            continue;
        /* A real descriptor reserves the number, so it never collides with another file. */
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            e = errno;
            break;
        }
        fake_file *f = &K.files[i];
        memset(f, 0, sizeof(*f));
        rj_err err;
        if (rj_sim_create(&f->sim, K.sim_flags_set ? K.sim_flags : RJ_SIM_STRICT, &err)) {
            close(fd);
            e = ENOMEM;
            break;
        }
        pthread_cond_init(&f->work, NULL);
        if (pthread_create(&f->worker, NULL, worker_main, f) != 0) {
            pthread_cond_destroy(&f->work);
            rj_sim_destroy(f->sim);
            close(fd);
            e = EAGAIN;
            break;
        }
        f->used = 1;
        f->fd = fd;
        f->next_handle = 1;
        rc = fd;
        break;
    }
    pthread_mutex_unlock(&K.lock);
    if (rc < 0)
        errno = e;
    return rc;
}

static int fake_close(int fd)
{
    pthread_mutex_lock(&K.lock);
    int fi;
    fake_file *f = file_of(fd, &fi);
    if (!f || f->closing) {
        pthread_mutex_unlock(&K.lock);
        errno = EBADF;
        return -1;
    }
    /* The last reference to the file goes: queued jobs still finish (the kernel keeps their
     * BOs referenced), then the worker exits. */
    f->closing = 1;
    pthread_cond_signal(&f->work);
    pthread_mutex_unlock(&K.lock);
    pthread_join(f->worker, NULL);
    pthread_mutex_lock(&K.lock);
    /* Closing the file releases its handles; mapped memory stays until munmap. */
    for (uint32_t i = K.nbos; i-- > 0;) {
        fake_bo *b = K.bos[i];
        if (b->file != fi)
            continue;
        b->handle_open = 0;
        b->file = -1;
        free_bo_if_unused(b);
    }
    rj_sim_destroy(f->sim);
    pthread_cond_destroy(&f->work);
    close(f->fd);
    memset(f, 0, sizeof(*f));
    pthread_mutex_unlock(&K.lock);
    return 0;
}

static void *fake_mmap(void *addr, size_t len, int prot, int flags, int fd, int64_t offset)
{
    pthread_mutex_lock(&K.lock);
    void *res = MAP_FAILED;
    int fi;
    if (!file_of(fd, &fi)) {
        fail_errno(EBADF, "mmap: fd %d is not an open fake rocket file", fd);
        goto out;
    }
    K.mmaps_seen++;
    if (K.faults.device_gone) {
        fail_errno(ENODEV, "mmap: injected: the device is gone");
        goto out;
    }
    if (K.faults.fail_mmap_at && K.mmaps_seen == K.faults.fail_mmap_at) {
        K.faults.fail_mmap_at = 0;
        fail_errno(ENOMEM, "mmap: injected ENOMEM");
        goto out;
    }
    if (!(flags & MAP_SHARED)) {
        /* Private (copy-on-write) mappings of GEM shmem objects are refused. */
        fail_errno(EINVAL, "mmap: a BO must be mapped MAP_SHARED");
        goto out;
    }
    fake_bo *b = NULL;
    for (uint32_t i = 0; i < K.nbos && !b; i++)
        if (K.bos[i]->mmap_offset == (uint64_t)offset && K.bos[i]->handle_open)
            b = K.bos[i];
    if (!b) {
        fail_errno(EINVAL, "mmap: offset 0x%llx is not the offset of any live BO",
                   (unsigned long long)offset);
        goto out;
    }
    if (b->file != fi) {
        fail_errno(EACCES, "mmap: offset 0x%llx belongs to a BO of another fd", (unsigned long long)offset);
        goto out;
    }
    if (len == 0 || len > b->map_size) {
        fail_errno(EINVAL, "mmap: length %zu does not fit BO handle %u (%llu bytes mapped)", len,
                   b->handle, (unsigned long long)b->map_size);
        goto out;
    }
    b->maps++;
    res = b->mem;
out:
    pthread_mutex_unlock(&K.lock);
    return res;
}

static int fake_munmap(void *addr, size_t len)
{
    pthread_mutex_lock(&K.lock);
    for (uint32_t i = 0; i < K.nbos; i++) {
        fake_bo *b = K.bos[i];
        if (b->mem == addr && b->maps) {
            b->maps--;
            free_bo_if_unused(b);
            pthread_mutex_unlock(&K.lock);
            return 0;
        }
    }
    pthread_mutex_unlock(&K.lock);
    errno = EINVAL;
    return -1;
}

static int fake_job_error(int fd, rj_err *err)
{
    pthread_mutex_lock(&K.lock);
    fake_file *f = file_of(fd, NULL);
    int rc = 0;
    if (f && f->job_err_code) {
        rc = rj_fail(err, f->job_err_code, "%s", f->job_err_msg);
        f->job_err_code = 0;
    } else if (f && f->jobs_dropped) {
        rc = rj_fail(err, RJ_EIO, "the kernel dropped %u job(s) without running them (%s); their "
                     "outputs were not written", f->jobs_dropped, f->drop_msg);
    }
    if (f) {
        f->jobs_dropped = 0;
        f->drop_msg[0] = 0;
    }
    pthread_mutex_unlock(&K.lock);
    return rc;
}

static const rj_sys_ops fake_ops = {
    .name = "fake rocket",
    .open = fake_open,
    .close = fake_close,
    .ioctl = fake_ioctl,
    .mmap = fake_mmap,
    .munmap = fake_munmap,
    .job_error = fake_job_error,
};

const rj_sys_ops *rj_sys_fake_rocket(void) { return &fake_ops; }

/* ---- control ----------------------------------------------------------------------------- */

void rj_fake_rocket_set_faults(const rj_fake_rocket_faults *faults)
{
    pthread_mutex_lock(&K.lock);
    if (faults)
        K.faults = *faults;
    else
        memset(&K.faults, 0, sizeof(K.faults));
    K.creates_seen = 0;
    K.mmaps_seen = 0;
    pthread_mutex_unlock(&K.lock);
}

void rj_fake_rocket_get_stats(rj_fake_rocket_stats *out)
{
    if (!out)
        return;
    pthread_mutex_lock(&K.lock);
    K.st.open_fds = 0;
    for (int i = 0; i < FAKE_MAX_FILES; i++)
        K.st.open_fds += K.files[i].used != 0;
    K.st.live_bos = K.nbos;
    K.st.live_bytes = 0;
    for (uint32_t i = 0; i < K.nbos; i++)
        K.st.live_bytes += K.bos[i]->size;
    *out = K.st;
    pthread_mutex_unlock(&K.lock);
}

int rj_fake_rocket_reset(rj_err *err)
{
    pthread_mutex_lock(&K.lock);
    for (int i = 0; i < FAKE_MAX_FILES; i++)
        if (K.files[i].used) {
            pthread_mutex_unlock(&K.lock);
            return rj_fail(err, RJ_EINVAL, "fake rocket: fd %d is still open; destroy every "
                           "RocketDevice before resetting the fake", K.files[i].fd);
        }
    memset(&K.st, 0, sizeof(K.st));
    memset(&K.faults, 0, sizeof(K.faults));
    K.creates_seen = K.mmaps_seen = 0;
    pthread_mutex_unlock(&K.lock);
    return RJ_OK;
}

void rj_fake_rocket_set_sim_flags(uint32_t flags)
{
    pthread_mutex_lock(&K.lock);
    K.sim_flags = flags;
    K.sim_flags_set = 1;
    pthread_mutex_unlock(&K.lock);
}
