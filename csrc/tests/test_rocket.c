/* The devices end to end: conformance programs on the simulator, through the rocket ioctl
 * fake (the real RocketDevice path) and on the null device; the fake's kernel checks; PREP_BO
 * deadlines; error unwinding. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include "rj_regs.h"
#include "rocket/rj_rocket.h"
#include "runtime/device_internal.h"
#include "runtime/rj_runtime.h"
#include "test_util.h"

static const char *conf_dir(void) { return RJ_TEST_CONFORMANCE_DIR; }

/* 1 when the case can run. Only an absent conformance folder is a reason to skip: a folder
 * that exists but lacks the case is a broken checkout and counts as a failure. */
static int have_case(const char *name)
{
    struct stat st;
    if (stat(conf_dir(), &st) != 0 || !S_ISDIR(st.st_mode))
        return 0;
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s/expected_output.bin", conf_dir(), name);
    FILE *f = fopen(path, "rb");
    if (f)
        fclose(f);
    CHECK(f != NULL, "conformance folder %s exists but case %s is missing (%s)", conf_dir(), name,
          path);
    return f != NULL;
}

/* A conformance case added to a program on context ctx. The program's addresses are ours, so
 * each address register is relocated: case.md lists them (CNA_FEATURE_DATA_ADDR -> input,
 * CNA_DCOMP_ADDR0 -> weight, DPU_DST_BASE_ADDR -> output) and the stand-in driver placed
 * input/weight/output at 0x01004000/0x01006000/0x01008000 in cases 01 and 03. */
typedef struct loaded_case {
    uint32_t job, out_bo;
    unsigned char *expected;
    size_t expected_size;
    unsigned char *initial_out;
} loaded_case;

static int add_case(rj_program *p, uint32_t ctx, const char *name, loaded_case *lc, rj_err *err)
{
    static const char *files[3] = {"program/blobs/input.bin", "program/blobs/weight.bin",
                                   "program/blobs/output.initial.bin"};
    static const uint32_t roles[3] = {RJ_BO_IO, RJ_BO_WEIGHTS, RJ_BO_IO};
    static const uint32_t regs[3] = {RJ_REG_CNA_FEATURE_DATA_ADDR, RJ_REG_CNA_DCOMP_ADDR0,
                                     RJ_REG_DPU_DST_BASE_ADDR};
    static const uint32_t orig_iova[3] = {0x01004000u, 0x01006000u, 0x01008000u};
    char path[1024];
    uint32_t bo[3], rc_bo;
    int rc;
    memset(lc, 0, sizeof(*lc));
    for (int i = 0; i < 3; i++) {
        size_t n;
        snprintf(path, sizeof(path), "%s/%s/%s", conf_dir(), name, files[i]);
        unsigned char *data = read_file(path, &n);
        if (!data)
            return rj_fail(err, RJ_EIO, "cannot read %s", path);
        rc = rj_program_add_bo(p, ctx, roles[i], n, &bo[i], err);
        if (!rc)
            rc = rj_program_write(p, bo[i], 0, data, n, err);
        if (i == 2)
            lc->initial_out = data;
        else
            free(data);
        if (rc)
            return rc;
    }
    size_t nbytes;
    snprintf(path, sizeof(path), "%s/%s/program/j0_t000.regcmd", conf_dir(), name);
    unsigned char *words = read_file(path, &nbytes);
    if (!words)
        return rj_fail(err, RJ_EIO, "cannot read %s", path);
    rc = rj_program_add_bo(p, ctx, RJ_BO_REGCMD, 4096, &rc_bo, err);
    if (!rc)
        rc = rj_program_write(p, rc_bo, 0, words, nbytes, err);
    int found = 0;
    for (size_t w = 0; w < nbytes / 8 && !rc; w++) {
        uint64_t x;
        memcpy(&x, words + 8 * w, 8);
        uint32_t reg = (uint32_t)(x & 0xFFFF), value = (uint32_t)(x >> 16);
        for (int i = 0; i < 3 && !rc; i++)
            if (reg == regs[i] && ((x >> 48) & 0xFF) == 1) {
                rj_reloc r = {.regcmd_bo = rc_bo, .target_bo = bo[i], .word_offset = 8 * w,
                              .target_offset = value - orig_iova[i]};
                rc = rj_program_add_reloc(p, &r, err);
                found++;
            }
    }
    free(words);
    if (rc)
        return rc;
    if (found != 3)
        return rj_fail(err, RJ_EINVAL, "%s: found %d address registers, expected 3", name, found);
    if ((rc = rj_program_add_job(p, ctx, 0, &lc->job, err)) ||
        (rc = rj_program_job_add_task(p, lc->job, rc_bo, 0, (uint32_t)(nbytes / 8), err)) ||
        (rc = rj_program_job_add_bo(p, lc->job, bo[0], RJ_JOB_IN, err)) ||
        (rc = rj_program_job_add_bo(p, lc->job, bo[1], RJ_JOB_IN, err)) ||
        (rc = rj_program_job_add_bo(p, lc->job, bo[2], RJ_JOB_OUT, err)))
        return rc;
    lc->out_bo = bo[2];
    snprintf(path, sizeof(path), "%s/%s/expected_output.bin", conf_dir(), name);
    lc->expected = read_file(path, &lc->expected_size);
    if (!lc->expected)
        return rj_fail(err, RJ_EIO, "cannot read %s", path);
    return RJ_OK;
}

static void free_case(loaded_case *lc)
{
    free(lc->expected);
    free(lc->initial_out);
}

static int output_matches(rj_program *p, const loaded_case *lc)
{
    unsigned char *got = malloc(lc->expected_size);
    rj_err err;
    int ok = got && rj_program_read(p, lc->out_bo, 0, got, lc->expected_size, &err) == 0 &&
             memcmp(got, lc->expected, lc->expected_size) == 0;
    free(got);
    return ok;
}

static void run_case_on(rj_device *dev, const char *name, int compute)
{
    rj_err err = {0};
    rj_program *p;
    loaded_case lc;
    CHECK_OK(rj_program_create(dev, &p, &err), err);
    int rc = add_case(p, 0, name, &lc, &err);
    CHECK_OK(rc, err);
    if (!rc) {
        CHECK_OK(rj_program_add_npu_step(p, &lc.job, 1, &err), err);
        CHECK_OK(rj_program_run(p, &err), err);
        if (compute) {
            CHECK(output_matches(p, &lc), "%s: output differs from expected_output.bin", name);
        } else {
            /* the null device computes nothing: the output keeps its initial bytes */
            unsigned char *got = malloc(lc.expected_size);
            rj_program_read(p, lc.out_bo, 0, got, lc.expected_size, &err);
            CHECK(memcmp(got, lc.initial_out, lc.expected_size) == 0, "null device wrote output");
            free(got);
        }
        rj_program_stats st;
        rj_program_get_stats(p, &st);
        CHECK(st.jobs == 1 && st.tasks == 1 && st.kicks == 1 && st.relocs_applied == 3,
              "program counters jobs %llu tasks %llu kicks %llu relocs %llu",
              (unsigned long long)st.jobs, (unsigned long long)st.tasks,
              (unsigned long long)st.kicks, (unsigned long long)st.relocs_applied);
    }
    free_case(&lc);
    rj_program_destroy(p);
}

static void test_conformance_sim(void)
{
    rj_err err = {0};
    rj_device *dev;
    CHECK_OK(rj_sim_device_create(&dev, 1, RJ_SIM_STRICT, &err), err);
    run_case_on(dev, "01_matmul_fp16", 1);
    run_case_on(dev, "03_matmul_int8", 1);
    rj_device_destroy(dev);
}

static void test_conformance_fake_rocket(void)
{
    rj_err err = {0};
    rj_device *dev;
    rj_fake_rocket_stats fs;
    CHECK_OK(rj_fake_rocket_reset(&err), err);
    CHECK_OK(rj_rocket_device_create(&dev, NULL, 1, RJ_ROCKET_USE_FAKE, &err), err);
    run_case_on(dev, "01_matmul_fp16", 1);
    run_case_on(dev, "03_matmul_int8", 1);
    rj_fake_rocket_get_stats(&fs);
    CHECK(fs.jobs_run == 2 && fs.jobs_dropped == 0, "fake ran %llu, dropped %llu (%s)",
          (unsigned long long)fs.jobs_run, (unsigned long long)fs.jobs_dropped, fs.last_error);
    CHECK(fs.live_bos == 0, "programs freed their BOs (%u live)", fs.live_bos);
    CHECK(fs.finis > 0 && fs.preps >= 2, "FINI_BO before and PREP_BO after each job");
    rj_device_destroy(dev);
    rj_fake_rocket_get_stats(&fs);
    CHECK(fs.open_fds == 0, "device closed its fd");
}

static void test_conformance_null(void)
{
    rj_err err = {0};
    rj_device *dev;
    CHECK_OK(rj_null_device_create(&dev, 1, &err), err);
    run_case_on(dev, "01_matmul_fp16", 0);
    rj_device_stats st;
    rj_device_get_stats(dev, &st);
    CHECK(st.jobs == 1 && st.tasks == 1 && st.kicks == 1 && st.regcmd_bytes == 126 * 8,
          "null device counted jobs %llu tasks %llu regcmd bytes %llu", (unsigned long long)st.jobs,
          (unsigned long long)st.tasks, (unsigned long long)st.regcmd_bytes);
    rj_device_destroy(dev);
}

/* Three contexts (fds), three jobs in one NPU step; each context has its own IOVA space. */
static void test_three_fds(void)
{
    rj_err err = {0};
    rj_device *dev;
    rj_program *p;
    loaded_case lc[3];
    CHECK_OK(rj_fake_rocket_reset(&err), err);
    CHECK_OK(rj_rocket_device_create(&dev, NULL, 3, RJ_ROCKET_USE_FAKE, &err), err);
    CHECK_OK(rj_program_create(dev, &p, &err), err);
    const char *names[3] = {"01_matmul_fp16", "03_matmul_int8", "01_matmul_fp16"};
    uint32_t jobs[3];
    for (uint32_t c = 0; c < 3; c++) {
        CHECK_OK(add_case(p, c, names[c], &lc[c], &err), err);
        jobs[c] = lc[c].job;
    }
    rj_fake_rocket_stats fs;
    rj_fake_rocket_get_stats(&fs);
    CHECK(fs.open_fds == 3, "three fds open (%u)", fs.open_fds);
    rj_bo b0, b1;
    rj_program_bo_info(p, 0, &b0, &err);
    rj_program_bo_info(p, 4, &b1, &err); /* first BO of context 1 */
    CHECK(b1.ctx == 1 && b0.iova == b1.iova, "per-fd IOVA spaces start at the same address "
          "(0x%llx vs 0x%llx)", (unsigned long long)b0.iova, (unsigned long long)b1.iova);
    CHECK(rj_rocket_device_fd(dev, 0) != rj_rocket_device_fd(dev, 2), "distinct fds");
    CHECK_OK(rj_program_add_npu_step(p, jobs, 3, &err), err);
    /* Every job takes 150 ms of "NPU time": three fds = three cores, so the step takes about
     * 150 ms, not 450, and all three jobs are executing at one moment. */
    rj_fake_rocket_faults slow = {.job_delay_us = 150000};
    rj_fake_rocket_set_faults(&slow);
    int64_t t0 = rj_now_ns();
    CHECK_OK(rj_program_run(p, &err), err);
    int64_t took = rj_now_ns() - t0;
    rj_fake_rocket_set_faults(NULL);
    for (int c = 0; c < 3; c++)
        CHECK(output_matches(p, &lc[c]), "context %d output", c);
    rj_fake_rocket_get_stats(&fs);
    CHECK(fs.max_running == 3, "three jobs ran at the same time (at most %u did)", fs.max_running);
    CHECK(took >= 150000000ll && took < 400000000ll, "the step took %lld ms (parallel: ~150)",
          (long long)(took / 1000000));
    rj_device_stats st;
    rj_device_get_stats(dev, &st);
    CHECK(st.submits == 1 && st.jobs == 3, "one submit call, three jobs");
    rj_fake_rocket_get_stats(&fs);
    CHECK(fs.submits == 3, "one SUBMIT ioctl per fd (%llu)", (unsigned long long)fs.submits);
    for (int c = 0; c < 3; c++)
        free_case(&lc[c]);
    rj_program_destroy(p);
    rj_device_destroy(dev);
}

/* ---- the fake's kernel checks, through raw ioctls ------------------------------------------ */

static unsigned long req(uint32_t w) { return rj_rocket_ioctl_request(w); }

static void test_fake_validation(void)
{
    rj_err err = {0};
    const rj_sys_ops *k = rj_sys_fake_rocket();
    rj_fake_rocket_stats fs;
    CHECK_OK(rj_fake_rocket_reset(&err), err);
    CHECK(k->open("/dev/accel/accel1", O_RDWR) == -1 && errno == ENOENT, "only accel0 is served");
    int fd = k->open("/dev/accel/accel0", O_RDWR);
    CHECK(fd >= 0, "open");
    /* ioctl numbers as the uAPI defines them: 'd', 0x40 + n, and the struct sizes */
    CHECK(req(RJ_ROCKET_IOCTL_CREATE_BO) == 0xC0186440ul, "CREATE_BO = _IOWR('d', 0x40, 24 bytes)");
    CHECK(req(RJ_ROCKET_IOCTL_SUBMIT) == 0x40186441ul, "SUBMIT = _IOW('d', 0x41, 24 bytes)");
    CHECK(req(RJ_ROCKET_IOCTL_PREP_BO) == 0x40106442ul, "PREP_BO = _IOW('d', 0x42, 16 bytes)");
    CHECK(req(RJ_ROCKET_IOCTL_FINI_BO) == 0x40086443ul, "FINI_BO = _IOW('d', 0x43, 8 bytes)");
    CHECK(req(RJ_ROCKET_IOCTL_GEM_CLOSE) == 0x40086409ul, "GEM_CLOSE = _IOW('d', 0x09, 8 bytes)");

    rj_drm_rocket_create_bo cb = {.size = 0};
    CHECK(k->ioctl(fd, req(RJ_ROCKET_IOCTL_CREATE_BO), &cb) == -1 && errno == EINVAL, "size 0");
    cb.size = 4096;
    CHECK(k->ioctl(fd, req(RJ_ROCKET_IOCTL_CREATE_BO), &cb) == 0 && cb.handle == 1 &&
              cb.dma_address == 0, "first BO: handle 1 at IOVA 0 (got %u, 0x%llx)", cb.handle,
          (unsigned long long)cb.dma_address);
    rj_drm_rocket_create_bo cb2 = {.size = 100};
    CHECK(k->ioctl(fd, req(RJ_ROCKET_IOCTL_CREATE_BO), &cb2) == 0 && cb2.dma_address == 4096,
          "second BO page-aligned after the first (0x%llx)", (unsigned long long)cb2.dma_address);
    CHECK(k->ioctl(fd, req(RJ_ROCKET_IOCTL_CREATE_BO) + (1ul << 16), &cb) == -1 && errno == EINVAL,
          "a size mismatch in the ioctl number is refused");
    CHECK(k->ioctl(fd + 1000, req(RJ_ROCKET_IOCTL_CREATE_BO), &cb) == -1 && errno == EBADF, "bad fd");

    rj_drm_rocket_prep_bo pb = {.handle = cb.handle, .reserved = 1, .timeout_ns = 0};
    CHECK(k->ioctl(fd, req(RJ_ROCKET_IOCTL_PREP_BO), &pb) == -1 && errno == EINVAL, "PREP reserved");
    pb.reserved = 0;
    pb.handle = 77;
    CHECK(k->ioctl(fd, req(RJ_ROCKET_IOCTL_PREP_BO), &pb) == -1 && errno == ENOENT, "PREP handle");
    pb.handle = cb.handle;
    CHECK(k->ioctl(fd, req(RJ_ROCKET_IOCTL_PREP_BO), &pb) == 0, "PREP of an idle BO polls fine");
    rj_drm_rocket_fini_bo fb = {.handle = cb.handle, .reserved = 2};
    CHECK(k->ioctl(fd, req(RJ_ROCKET_IOCTL_FINI_BO), &fb) == -1 && errno == EINVAL, "FINI reserved");
    fb.reserved = 0;
    fb.handle = 99;
    CHECK(k->ioctl(fd, req(RJ_ROCKET_IOCTL_FINI_BO), &fb) == -1 && errno == ENOENT, "FINI handle");

    rj_drm_rocket_task task = {.regcmd = 0, .regcmd_count = 4};
    uint32_t in_h[1] = {cb.handle}, out_h[1] = {cb2.handle}, bad_h[1] = {42};
    rj_drm_rocket_job job = {.tasks = (uint64_t)(uintptr_t)&task, .in_bo_handles = (uint64_t)(uintptr_t)in_h,
                             .out_bo_handles = (uint64_t)(uintptr_t)out_h, .task_count = 1,
                             .task_struct_size = sizeof(task), .in_bo_handle_count = 1,
                             .out_bo_handle_count = 1};
    rj_drm_rocket_submit sb = {.jobs = (uint64_t)(uintptr_t)&job, .job_count = 1,
                               .job_struct_size = sizeof(job), .reserved = 1};
    CHECK(k->ioctl(fd, req(RJ_ROCKET_IOCTL_SUBMIT), &sb) == -1 && errno == EINVAL, "SUBMIT reserved");
    sb.reserved = 0;
    sb.job_struct_size = 32;
    CHECK(k->ioctl(fd, req(RJ_ROCKET_IOCTL_SUBMIT), &sb) == -1 && errno == EINVAL, "job_struct_size");
    sb.job_struct_size = sizeof(job);
    sb.job_count = 0;
    CHECK(k->ioctl(fd, req(RJ_ROCKET_IOCTL_SUBMIT), &sb) == 0, "job_count 0 is a no-op");
    sb.job_count = 1;

    /* per-job failures: SUBMIT returns 0, the job is dropped (the kernel ignores each job's
     * result) */
    rj_fake_rocket_get_stats(&fs);
    uint64_t dropped = fs.jobs_dropped;
    job.in_bo_handles = (uint64_t)(uintptr_t)bad_h;
    CHECK(k->ioctl(fd, req(RJ_ROCKET_IOCTL_SUBMIT), &sb) == 0, "SUBMIT returns 0 with a bad job");
    rj_fake_rocket_get_stats(&fs);
    CHECK(fs.jobs_dropped == dropped + 1 && fs.last_errno == ENOENT, "bad handle dropped: %s",
          fs.last_error);
    job.in_bo_handles = (uint64_t)(uintptr_t)in_h;
    job.task_count = 0;
    k->ioctl(fd, req(RJ_ROCKET_IOCTL_SUBMIT), &sb);
    rj_fake_rocket_get_stats(&fs);
    CHECK(fs.jobs_dropped == dropped + 2 && fs.last_errno == EINVAL, "task_count 0 dropped");
    job.task_count = 1;
    job.task_struct_size = 4;
    k->ioctl(fd, req(RJ_ROCKET_IOCTL_SUBMIT), &sb);
    rj_fake_rocket_get_stats(&fs);
    CHECK(fs.jobs_dropped == dropped + 3 && fs.last_errno == EINVAL, "task_struct_size dropped");
    job.task_struct_size = sizeof(task);
    task.regcmd_count = 0;
    k->ioctl(fd, req(RJ_ROCKET_IOCTL_SUBMIT), &sb);
    rj_fake_rocket_get_stats(&fs);
    CHECK(fs.jobs_dropped == dropped + 4 && fs.last_errno == EINVAL, "regcmd_count 0 dropped");
    task.regcmd_count = 4;
    job.out_bo_handles = (uint64_t)(uintptr_t)in_h;
    k->ioctl(fd, req(RJ_ROCKET_IOCTL_SUBMIT), &sb);
    rj_fake_rocket_get_stats(&fs);
    CHECK(fs.jobs_dropped == dropped + 5 && strstr(fs.last_error, "both"), "in+out dropped: %s",
          fs.last_error);

    /* mmap checks */
    CHECK(k->mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 12345) == MAP_FAILED &&
              errno == EINVAL, "unknown mmap offset");
    CHECK(k->mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, (int64_t)cb.offset) ==
              MAP_FAILED && errno == EINVAL, "private mapping refused");
    CHECK(k->mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (int64_t)cb.offset) ==
              MAP_FAILED && errno == EINVAL, "mapping longer than the BO refused");
    void *m = k->mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (int64_t)cb.offset);
    CHECK(m != MAP_FAILED, "map");

    rj_drm_gem_close gc = {.handle = 55};
    CHECK(k->ioctl(fd, req(RJ_ROCKET_IOCTL_GEM_CLOSE), &gc) == -1 && errno == EINVAL, "GEM_CLOSE handle");
    gc.handle = cb.handle;
    CHECK(k->ioctl(fd, req(RJ_ROCKET_IOCTL_GEM_CLOSE), &gc) == 0, "GEM_CLOSE");
    rj_fake_rocket_get_stats(&fs);
    CHECK(fs.live_bos == 2, "a closed but mapped BO stays alive (%u)", fs.live_bos);
    CHECK(k->munmap(m, 4096) == 0, "unmap");
    CHECK(k->close(fd) == 0, "close");
    rj_fake_rocket_get_stats(&fs);
    CHECK(fs.live_bos == 0 && fs.open_fds == 0, "close released everything (%u BOs, %u fds)",
          fs.live_bos, fs.open_fds);
}

/* ---- PREP_BO deadlines ------------------------------------------------------------------------ */

static void test_prep_deadline(void)
{
    rj_err err = {0};
    rj_device *dev;
    rj_program *p;
    loaded_case lc;
    rj_fake_rocket_stats fs;
    if (!have_case("01_matmul_fp16")) {
        printf("SKIP test_prep_deadline: conformance case 01 not found under %s\n", conf_dir());
        return;
    }
    CHECK_OK(rj_fake_rocket_reset(&err), err);
    CHECK_OK(rj_rocket_device_create(&dev, NULL, 1, RJ_ROCKET_USE_FAKE, &err), err);
    CHECK_OK(rj_program_create(dev, &p, &err), err);
    CHECK_OK(add_case(p, 0, "01_matmul_fp16", &lc, &err), err);
    CHECK_OK(rj_program_add_npu_step(p, &lc.job, 1, &err), err);
    CHECK_OK(rj_program_load(p, &err), err);

    /* one EINTR: retried with the very same absolute deadline */
    rj_fake_rocket_faults f = {.prep_eintr = 1};
    rj_fake_rocket_set_faults(&f);
    CHECK_OK(rj_program_run(p, &err), err);
    rj_fake_rocket_get_stats(&fs);
    CHECK(fs.eintr_returned == 1, "one EINTR served");
    CHECK(fs.n_prep_deadlines >= 2 &&
              fs.prep_deadlines[fs.n_prep_deadlines - 1] == fs.prep_deadlines[fs.n_prep_deadlines - 2],
          "retry keeps the deadline");
    CHECK(output_matches(p, &lc), "output correct after the retried fence");

    /* a hung job: ETIMEDOUT at the deadline, not earlier and not much later */
    f = (rj_fake_rocket_faults){.hang_jobs = 1};
    rj_fake_rocket_set_faults(&f);
    rj_program_set_timeout(p, 50 * 1000 * 1000);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = rj_program_run(p, &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    CHECK_FAILS(rc, RJ_ETIMEDOUT, err, "did not finish before the deadline");
    CHECK(ms >= 45.0 && ms < 1000.0, "waited %.1f ms for a 50 ms deadline", ms);
    rj_fake_rocket_get_stats(&fs);
    int64_t now = (int64_t)t1.tv_sec * 1000000000ll + t1.tv_nsec;
    int64_t dl = fs.prep_deadlines[fs.n_prep_deadlines - 1];
    CHECK(dl > now - 2000000000ll && dl <= now, "timeout_ns is an absolute CLOCK_MONOTONIC time");
    free_case(&lc);
    rj_program_destroy(p);
    rj_device_destroy(dev);
}

/* ---- error unwinding ------------------------------------------------------------------------ */

static void check_no_leaks(const char *when)
{
    rj_fake_rocket_stats fs;
    rj_fake_rocket_get_stats(&fs);
    CHECK(fs.live_bos == 0 && fs.open_fds == 0, "%s: %u BOs and %u fds left", when, fs.live_bos,
          fs.open_fds);
}

static void test_unwinding(void)
{
    rj_err err = {0};
    rj_device *dev;
    rj_program *p;
    loaded_case lc;
    if (!have_case("01_matmul_fp16")) {
        printf("SKIP test_unwinding: conformance case 01 not found\n");
        return;
    }
    /* CREATE_BO fails on the third BO */
    CHECK_OK(rj_fake_rocket_reset(&err), err);
    rj_fake_rocket_faults f = {.fail_create_at = 3};
    rj_fake_rocket_set_faults(&f);
    CHECK_OK(rj_rocket_device_create(&dev, NULL, 1, RJ_ROCKET_USE_FAKE, &err), err);
    CHECK_OK(rj_program_create(dev, &p, &err), err);
    CHECK_FAILS(add_case(p, 0, "01_matmul_fp16", &lc, &err), RJ_ENOMEM, err, "CREATE_BO");
    free_case(&lc);
    rj_program_destroy(p);
    rj_device_destroy(dev);
    check_no_leaks("failed CREATE_BO");

    /* mmap fails after CREATE_BO succeeded: the handle must be closed again */
    f = (rj_fake_rocket_faults){.fail_mmap_at = 2};
    rj_fake_rocket_set_faults(&f);
    CHECK_OK(rj_rocket_device_create(&dev, NULL, 1, RJ_ROCKET_USE_FAKE, &err), err);
    CHECK_OK(rj_program_create(dev, &p, &err), err);
    CHECK_FAILS(add_case(p, 0, "01_matmul_fp16", &lc, &err), RJ_ENOMEM, err, "mmap");
    rj_fake_rocket_stats fs;
    rj_fake_rocket_get_stats(&fs);
    CHECK(fs.live_bos == 1, "only the first BO lives (%u)", fs.live_bos);
    free_case(&lc);
    rj_program_destroy(p);
    rj_device_destroy(dev);
    check_no_leaks("failed mmap");

    /* SUBMIT fails */
    f = (rj_fake_rocket_faults){.fail_submit = 1};
    rj_fake_rocket_set_faults(&f);
    CHECK_OK(rj_rocket_device_create(&dev, NULL, 1, RJ_ROCKET_USE_FAKE, &err), err);
    CHECK_OK(rj_program_create(dev, &p, &err), err);
    CHECK_OK(add_case(p, 0, "01_matmul_fp16", &lc, &err), err);
    CHECK_OK(rj_program_add_npu_step(p, &lc.job, 1, &err), err);
    CHECK_FAILS(rj_program_run(p, &err), RJ_EIO, err, "SUBMIT");
    CHECK(strstr(err.msg, "step 0") != NULL, "message names the step: %s", err.msg);
    rj_device_stats st;
    rj_device_get_stats(dev, &st);
    CHECK(st.bos_live == 4, "program still owns its 4 BOs");
    free_case(&lc);
    rj_program_destroy(p);
    rj_device_get_stats(dev, &st);
    CHECK(st.bos_live == 0, "program freed its BOs");
    rj_device_destroy(dev);
    check_no_leaks("failed SUBMIT");

    /* a device whose open fails part-way closes what it opened */
    CHECK_FAILS(rj_rocket_device_create(&dev, "/dev/accel/accel7", 2, RJ_ROCKET_USE_FAKE, &err), RJ_EIO,
                err, "cannot open");
    check_no_leaks("failed open");
}

/* The simulator's refusal reaches the caller through the fake (job_error). */
static void test_sim_error_through_fake(void)
{
    rj_err err = {0};
    rj_device *dev;
    rj_program *p;
    uint32_t rc_bo, out;
    CHECK_OK(rj_fake_rocket_reset(&err), err);
    CHECK_OK(rj_rocket_device_create(&dev, NULL, 1, RJ_ROCKET_USE_FAKE, &err), err);
    CHECK_OK(rj_program_create(dev, &p, &err), err);
    CHECK_OK(rj_program_add_bo(p, 0, RJ_BO_REGCMD, 4096, &rc_bo, &err), err);
    CHECK_OK(rj_program_add_bo(p, 0, RJ_BO_IO, 4096, &out, &err), err);
    uint32_t job;
    CHECK_OK(rj_program_add_job(p, 0, 0, &job, &err), err);
    CHECK_OK(rj_program_job_add_task(p, job, rc_bo, 0, 8, &err), err); /* 8 filler words */
    CHECK_OK(rj_program_job_add_bo(p, job, out, RJ_JOB_OUT, &err), err);
    CHECK_OK(rj_program_add_npu_step(p, &job, 1, &err), err);
    int rc = rj_program_run(p, &err);
    CHECK(rc != 0 && strlen(err.msg) > 10, "a trailer-less task is refused (rc %d: %s)", rc, err.msg);
    rj_program_destroy(p);
    rj_device_destroy(dev);
    check_no_leaks("sim error");
}

static void test_env_selects_fake(void)
{
    rj_sys_set(NULL);
    unsetenv("RJ_FAKE_ROCKET");
    CHECK(rj_sys_current() == rj_sys_libc(), "libc by default");
    setenv("RJ_FAKE_ROCKET", "1", 1);
    CHECK(rj_sys_current() == rj_sys_fake_rocket(), "RJ_FAKE_ROCKET=1 selects the fake");
    setenv("RJ_FAKE_ROCKET", "0", 1);
    CHECK(rj_sys_current() == rj_sys_libc(), "RJ_FAKE_ROCKET=0 does not");
    setenv("RJ_FAKE_ROCKET", "Off", 1);
    CHECK(rj_sys_current() == rj_sys_libc(), "RJ_FAKE_ROCKET=Off does not");
    setenv("RJ_FAKE_ROCKET", "banana", 1);
    rj_err err = {0};
    const rj_sys_ops *o;
    CHECK(rj_sys_select(&o, &err) == RJ_EINVAL && strstr(err.msg, "RJ_FAKE_ROCKET=banana") &&
              strstr(err.msg, "on/off"), "an unknown value is refused with the flag's name");
    rj_device *dev = NULL;
    CHECK(rj_rocket_device_create(&dev, NULL, 1, 0, &err) == RJ_EINVAL && !dev,
          "no device on an unknown RJ_FAKE_ROCKET value");
    unsetenv("RJ_FAKE_ROCKET");
    rj_sys_set(rj_sys_fake_rocket());
    CHECK(rj_sys_current() == rj_sys_fake_rocket(), "explicit selection");
    rj_sys_set(NULL);
}

int main(void)
{
    if (!have_case("01_matmul_fp16") || !have_case("03_matmul_int8")) {
        printf("SKIP conformance tests: cases not found under %s\n", conf_dir());
    } else {
        RUN(test_conformance_sim);
        RUN(test_conformance_fake_rocket);
        RUN(test_conformance_null);
        RUN(test_three_fds);
    }
    RUN(test_fake_validation);
    RUN(test_prep_deadline);
    RUN(test_unwinding);
    RUN(test_sim_error_through_fake);
    RUN(test_env_selects_fake);
    TEST_MAIN_END();
}
