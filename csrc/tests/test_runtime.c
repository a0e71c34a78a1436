/* Runtime core: BOs, arena placement, relocations, job checks, host steps, programs. */
#include <math.h>
#include <stdint.h>

#include <pthread.h>
#include <unistd.h>

#include "layout/rj_layout.h"
#include "rj_regs.h"
#include "runtime/rj_host_pool.h"
#include "runtime/rj_runtime.h"
#include "test_util.h"

static void test_bo_iova_and_guard(void)
{
    rj_err err = {0};
    rj_device *dev;
    CHECK_OK(rj_sim_device_create(&dev, 2, RJ_SIM_STRICT, &err), err);
    rj_bo *a, *b, *c;
    CHECK_OK(rj_bo_create(dev, 0, 5000, &a, &err), err);
    CHECK_OK(rj_bo_create(dev, 0, 100, &b, &err), err);
    CHECK_OK(rj_bo_create(dev, 1, 100, &c, &err), err);
    CHECK(a->iova % 4096 == 0 && b->iova % 4096 == 0, "IOVAs page aligned: 0x%llx 0x%llx",
          (unsigned long long)a->iova, (unsigned long long)b->iova);
    /* 5000 bytes map two pages; one unmapped guard page follows. */
    CHECK(b->iova >= a->iova + 8192 + 4096, "guard gap: a 0x%llx b 0x%llx",
          (unsigned long long)a->iova, (unsigned long long)b->iova);
    CHECK(b->iova + b->size <= 0x100000000ull, "below 4 GiB");
    CHECK(c->ctx == 1 && c->iova == a->iova, "context 1 has its own IOVA space (0x%llx vs 0x%llx)",
          (unsigned long long)c->iova, (unsigned long long)a->iova);
    memset(a->host, 0x5A, a->size);
    CHECK(a->host[4999] == 0x5A, "host mapping writable");
    rj_bo *bad;
    CHECK_FAILS(rj_bo_create(dev, 2, 100, &bad, &err), RJ_EINVAL, err, "context 2 does not exist");
    CHECK_FAILS(rj_bo_create(dev, 0, 0, &bad, &err), RJ_EINVAL, err, "size 0");
    rj_device_stats st;
    rj_device_get_stats(dev, &st);
    CHECK(st.bos_live == 3 && st.bo_bytes_live == 5200, "live %llu bytes %llu",
          (unsigned long long)st.bos_live, (unsigned long long)st.bo_bytes_live);
    rj_bo_destroy(dev, c);
    rj_bo_destroy(dev, b);
    rj_bo_destroy(dev, a);
    rj_device_get_stats(dev, &st);
    CHECK(st.bos_live == 0 && st.bo_bytes_live == 0, "all freed");
    rj_device_destroy(dev);
}

static void test_arena_placement(void)
{
    rj_err err = {0};
    rj_device *dev;
    rj_program *p;
    uint32_t arena;
    uint64_t off;
    CHECK_OK(rj_null_device_create(&dev, 1, &err), err);
    CHECK_OK(rj_program_create(dev, &p, &err), err);
    CHECK_OK(rj_program_add_bo(p, 0, RJ_BO_ARENA, 4096, &arena, &err), err);
    CHECK_OK(rj_program_place(p, arena, RJ_PLACE_ANY, 100, 64, &off, &err), err);
    CHECK(off == 0, "first region at 0, got %llu", (unsigned long long)off);
    CHECK_OK(rj_program_place(p, arena, RJ_PLACE_ANY, 10, 256, &off, &err), err);
    CHECK(off == 256, "next region aligned to 256, got %llu", (unsigned long long)off);
    CHECK_OK(rj_program_place(p, arena, 1024, 64, 8, &off, &err), err);
    CHECK(off == 1024, "fixed placement kept");
    CHECK_OK(rj_program_place(p, arena, 0, 32, 16, &off, &err), err); /* reuse by liveness */
    CHECK_OK(rj_program_place(p, arena, RJ_PLACE_ANY, 8, 8, &off, &err), err);
    CHECK(off == 1088, "bump continues after the highest region, got %llu", (unsigned long long)off);
    CHECK_FAILS(rj_program_place(p, arena, 1001, 8, 8, &off, &err), RJ_EINVAL, err, "alignment");
    CHECK_FAILS(rj_program_place(p, arena, 4000, 200, 8, &off, &err), RJ_EINVAL, err, "does not fit");
    CHECK_FAILS(rj_program_place(p, arena, 0, 8, 3, &off, &err), RJ_EINVAL, err, "power of two");
    rj_program_destroy(p);
    rj_device_destroy(dev);
}

static uint64_t word(uint32_t op, uint32_t value, uint32_t reg)
{
    return ((uint64_t)op << 48) | ((uint64_t)value << 16) | reg;
}

static void test_relocations(void)
{
    rj_err err = {0};
    rj_device *dev;
    rj_program *p;
    uint32_t rc_bo, tgt, other_ctx_bo;
    CHECK_OK(rj_sim_device_create(&dev, 2, RJ_SIM_STRICT, &err), err);
    CHECK_OK(rj_program_create(dev, &p, &err), err);
    CHECK_OK(rj_program_add_bo(p, 0, RJ_BO_REGCMD, 64, &rc_bo, &err), err);
    CHECK_OK(rj_program_add_bo(p, 0, RJ_BO_ARENA, 8192, &tgt, &err), err);
    CHECK_OK(rj_program_add_bo(p, 1, RJ_BO_ARENA, 4096, &other_ctx_bo, &err), err);
    uint64_t w[3] = {
        word(RJ_TARGET_DPU | 1, 0xDEAD, RJ_REG_DPU_DST_BASE_ADDR),
        word(RJ_TARGET_PPU | 1, 0x5, RJ_REG_PPU_DST_BASE_ADDR), /* low flag bits to keep */
        word(RJ_TARGET_PC | 0x81, 0x1d, RJ_REG_PC_OPERATION_ENABLE),
    };
    CHECK_OK(rj_program_write(p, rc_bo, 0, w, sizeof(w), &err), err);
    rj_reloc r0 = {.regcmd_bo = rc_bo, .target_bo = tgt, .word_offset = 0, .target_offset = 0x40};
    rj_reloc r1 = {.regcmd_bo = rc_bo, .target_bo = tgt, .word_offset = 8, .target_offset = 0x1000,
                   .keep_mask = 0xF};
    CHECK_OK(rj_program_add_reloc(p, &r0, &err), err);
    CHECK_OK(rj_program_add_reloc(p, &r1, &err), err);
    CHECK_OK(rj_program_load(p, &err), err);
    rj_bo info, tinfo;
    rj_program_bo_info(p, rc_bo, &info, &err);
    rj_program_bo_info(p, tgt, &tinfo, &err);
    uint64_t got[2];
    memcpy(got, info.host, 16);
    CHECK(got[0] == word(RJ_TARGET_DPU | 1, (uint32_t)tinfo.iova + 0x40, RJ_REG_DPU_DST_BASE_ADDR),
          "word 0 patched: 0x%016llx", (unsigned long long)got[0]);
    CHECK(got[1] == word(RJ_TARGET_PPU | 1, ((uint32_t)tinfo.iova + 0x1000) | 5, RJ_REG_PPU_DST_BASE_ADDR),
          "word 1 patched keeping low bits: 0x%016llx", (unsigned long long)got[1]);
    /* Loading twice gives the same words (relocations are absolute, not additive). */
    CHECK_OK(rj_program_load(p, &err), err);
    uint64_t again[2];
    memcpy(again, info.host, 16);
    CHECK(again[0] == got[0] && again[1] == got[1], "reload is idempotent");

    rj_reloc bad = {.regcmd_bo = rc_bo, .target_bo = tgt, .word_offset = 16};
    CHECK_OK(rj_program_add_reloc(p, &bad, &err), err);
    CHECK_FAILS(rj_program_load(p, &err), RJ_EINVAL, err, "not a register write");

    rj_reloc cross = {.regcmd_bo = rc_bo, .target_bo = other_ctx_bo, .word_offset = 0};
    CHECK_FAILS(rj_program_add_reloc(p, &cross, &err), RJ_EINVAL, err, "IOVA space");
    rj_reloc oob = {.regcmd_bo = rc_bo, .target_bo = tgt, .word_offset = 0, .target_offset = 8192};
    CHECK_FAILS(rj_program_add_reloc(p, &oob, &err), RJ_EINVAL, err, "outside BO");
    rj_reloc unaligned = {.regcmd_bo = rc_bo, .target_bo = tgt, .word_offset = 4};
    CHECK_FAILS(rj_program_add_reloc(p, &unaligned, &err), RJ_EINVAL, err, "multiple of 8");
    rj_reloc notrc = {.regcmd_bo = tgt, .target_bo = tgt};
    CHECK_FAILS(rj_program_add_reloc(p, &notrc, &err), RJ_EINVAL, err, "not a regcmd BO");
    rj_reloc resv = {.regcmd_bo = rc_bo, .target_bo = tgt, .reserved = 1};
    CHECK_FAILS(rj_program_add_reloc(p, &resv, &err), RJ_EINVAL, err, "reserved");
    rj_program_destroy(p);
    rj_device_destroy(dev);
}

static void test_job_checks_and_null_counts(void)
{
    rj_err err = {0};
    rj_device *dev;
    CHECK_OK(rj_null_device_create(&dev, 2, &err), err);
    rj_bo *rc, *in, *out, *far;
    CHECK_OK(rj_bo_create(dev, 0, 4096, &rc, &err), err);
    CHECK_OK(rj_bo_create(dev, 0, 1024, &in, &err), err);
    CHECK_OK(rj_bo_create(dev, 0, 512, &out, &err), err);
    CHECK_OK(rj_bo_create(dev, 1, 512, &far, &err), err);
    rj_task tasks[2] = {{rc->iova, 126, 0}, {rc->iova + 1024, 126, 0}};
    rj_bo *ins[2] = {in, rc}, *outs[1] = {out};
    rj_job j = {.tasks = tasks, .in_bos = ins, .out_bos = outs, .ntasks = 2, .n_in = 2, .n_out = 1};
    CHECK_OK(rj_device_submit(dev, &j, 1, &err), err);
    CHECK_OK(rj_device_wait(dev, &j, 1, 1000000000, &err), err);
    rj_job chained = j;
    chained.flags = RJ_JOB_SELF_CHAINED;
    CHECK_OK(rj_device_submit(dev, &chained, 1, &err), err);
    rj_device_stats st;
    rj_device_get_stats(dev, &st);
    CHECK(st.jobs == 2 && st.tasks == 4 && st.kicks == 3, "jobs %llu tasks %llu kicks %llu",
          (unsigned long long)st.jobs, (unsigned long long)st.tasks, (unsigned long long)st.kicks);
    CHECK(st.regcmd_bytes == 4 * 126 * 8 && st.in_bytes == 2 * (1024 + 4096) && st.out_bytes == 1024,
          "byte counters %llu %llu %llu", (unsigned long long)st.regcmd_bytes,
          (unsigned long long)st.in_bytes, (unsigned long long)st.out_bytes);

    rj_job nout = j;
    nout.n_out = 0;
    CHECK_FAILS(rj_device_submit(dev, &nout, 1, &err), RJ_EINVAL, err, "fence");
    rj_bo *both[1] = {out};
    rj_job haz = j;
    haz.in_bos = both;
    haz.n_in = 1;
    CHECK_FAILS(rj_device_submit(dev, &haz, 1, &err), RJ_EHAZARD, err, "both in and out");
    rj_bo *fars[1] = {far};
    rj_job cross = j;
    cross.out_bos = fars;
    CHECK_FAILS(rj_device_submit(dev, &cross, 1, &err), RJ_EINVAL, err, "lives in context 1");
    rj_task zero = {rc->iova, 0, 0};
    rj_job z = j;
    z.tasks = &zero;
    z.ntasks = 1;
    CHECK_FAILS(rj_device_submit(dev, &z, 1, &err), RJ_EINVAL, err, "regcmd_count is 0");
    rj_device_get_stats(dev, &st);
    CHECK(st.jobs == 2, "refused jobs are not counted");
    rj_bo_destroy(dev, far);
    rj_bo_destroy(dev, out);
    rj_bo_destroy(dev, in);
    rj_bo_destroy(dev, rc);
    rj_device_destroy(dev);
}

static void test_host_steps(void)
{
    rj_err err = {0};
    rj_device *dev;
    CHECK_OK(rj_null_device_create(&dev, 1, &err), err);
    rj_bo *a, *b, *c;
    CHECK_OK(rj_bo_create(dev, 0, 4096, &a, &err), err);
    CHECK_OK(rj_bo_create(dev, 0, 4096, &b, &err), err);
    CHECK_OK(rj_bo_create(dev, 0, 4096, &c, &err), err);
    rj_bo *bos[3] = {a, b, c};
    /* a valid cube pack (2 x 2 x 4 fp16 into c2 = 8): the checks below each break one field */
    uint64_t bytes;
    rj_host_step s = {.kind = RJ_HOST_PACK, .param = {RJ_LAYOUT_CUBE, 2, 2, 4, 8, 2}};
    s.src = (rj_operand){.bo = 0, .dtype = RJ_DT_U8};
    s.dst = (rj_operand){.bo = 1, .dtype = RJ_DT_U8};
    s.aux.bo = RJ_NO_BO;
    CHECK_OK(rj_host_step_run(&s, bos, 3, &bytes, &err), err);
    CHECK(bytes == 2 * 2 * 4 * 2 + 2 * 2 * 8 * 2, "bytes %llu", (unsigned long long)bytes);

    /* checks */
    rj_host_step big = s;
    big.param[1] = 200;
    CHECK_FAILS(rj_host_step_run(&big, bos, 3, &bytes, &err), RJ_EFAULT, err, "needs");
    rj_host_step badk = s;
    badk.kind = 99;
    CHECK_FAILS(rj_host_step_run(&badk, bos, 3, &bytes, &err), RJ_EINVAL, err, "unknown kind");
    rj_host_step retired = s;
    retired.kind = 1; /* the retired row max */
    CHECK_FAILS(rj_host_step_run(&retired, bos, 3, &bytes, &err), RJ_EINVAL, err, "unknown kind");
    rj_host_step resv = s;
    resv.reserved = 1;
    CHECK_FAILS(rj_host_step_run(&resv, bos, 3, &bytes, &err), RJ_EINVAL, err, "reserved");
    rj_host_step nobo = s;
    nobo.src.bo = 7;
    CHECK_FAILS(rj_host_step_run(&nobo, bos, 3, &bytes, &err), RJ_EINVAL, err, "program has 3 BOs");

    rj_bo_destroy(dev, c);
    rj_bo_destroy(dev, b);
    rj_bo_destroy(dev, a);
    rj_device_destroy(dev);
}

/* Pack a small fp16 [H][W][C] feature map into the cube layout through a program host step
 * and compare with the layout formula of notes: encodings/tile-layouts.md written out here. */
static void test_program_pack_steps(void)
{
    rj_err err = {0};
    rj_device *dev;
    rj_program *p;
    uint32_t io, arena;
    enum { H = 3, W = 2, C = 12, C2 = 8, ES = 2 };
    CHECK_OK(rj_null_device_create(&dev, 1, &err), err);
    CHECK_OK(rj_program_create(dev, &p, &err), err);
    CHECK_OK(rj_program_add_bo(p, 0, RJ_BO_IO, 4096, &io, &err), err);
    CHECK_OK(rj_program_add_bo(p, 0, RJ_BO_ARENA, 4096, &arena, &err), err);
    uint16_t src[H][W][C];
    for (int h = 0; h < H; h++)
        for (int w = 0; w < W; w++)
            for (int c = 0; c < C; c++)
                src[h][w][c] = (uint16_t)(1 + h * 1000 + w * 100 + c);
    CHECK_OK(rj_program_write(p, io, 0, src, sizeof(src), &err), err);
    rj_host_step pk = {.kind = RJ_HOST_PACK, .param = {RJ_LAYOUT_CUBE, H, W, C, C2, ES}};
    pk.src = (rj_operand){.bo = io, .dtype = RJ_DT_U8};
    pk.dst = (rj_operand){.bo = arena, .dtype = RJ_DT_U8, .offset = 256};
    pk.aux.bo = RJ_NO_BO;
    rj_host_step un = {.kind = RJ_HOST_UNPACK, .param = {RJ_LAYOUT_CUBE, H, W, C, C2, ES}};
    un.src = (rj_operand){.bo = arena, .dtype = RJ_DT_U8, .offset = 256};
    un.dst = (rj_operand){.bo = io, .dtype = RJ_DT_U8, .offset = 2048};
    un.aux.bo = RJ_NO_BO;
    CHECK_OK(rj_program_add_host_step(p, &pk, &err), err);
    CHECK_OK(rj_program_add_host_step(p, &un, &err), err);
    CHECK_OK(rj_program_run(p, &err), err);
    rj_bo ab, iob;
    rj_program_bo_info(p, arena, &ab, &err);
    rj_program_bo_info(p, io, &iob, &err);
    const uint16_t *cube = (const uint16_t *)(ab.host + 256);
    uint64_t line = W * C2 * ES, surf = H * line;
    int bad = 0;
    for (int h = 0; h < H; h++)
        for (int w = 0; w < W; w++)
            for (int c = 0; c < C; c++) {
                uint64_t byte = (c / C2) * surf + h * line + w * C2 * ES + (c % C2) * ES;
                bad += cube[byte / 2] != src[h][w][c];
            }
    CHECK(bad == 0, "%d packed elements misplaced", bad);
    CHECK(memcmp(iob.host + 2048, src, sizeof(src)) == 0, "unpack restores the row-major array");
    rj_program_stats st;
    rj_program_get_stats(p, &st);
    uint64_t cube_bytes = 2 * surf;
    CHECK(st.host_steps == 2 && st.host_bytes == 2 * (sizeof(src) + cube_bytes),
          "host steps %llu bytes %llu", (unsigned long long)st.host_steps,
          (unsigned long long)st.host_bytes);
    /* a cube that overruns its BO is refused when the step is added */
    rj_host_step far = pk;
    far.dst.offset = 4000;
    CHECK_FAILS(rj_program_add_host_step(p, &far, &err), RJ_EFAULT, err, "needs bytes");
    rj_program_destroy(p);
    rj_device_destroy(dev);
}

/* The device may be released before its program: the release completes with the last BO. */
static void test_device_outlives_its_bos(void)
{
    rj_err err = {0};
    rj_device *dev;
    rj_program *p;
    uint32_t a, b;
    CHECK_OK(rj_sim_device_create(&dev, 1, RJ_SIM_STRICT, &err), err);
    CHECK_OK(rj_program_create(dev, &p, &err), err);
    CHECK_OK(rj_program_add_bo(p, 0, RJ_BO_ARENA, 4096, &a, &err), err);
    CHECK_OK(rj_program_add_bo(p, 0, RJ_BO_IO, 4096, &b, &err), err);
    rj_device_destroy(dev);   /* deferred: two BOs alive */
    rj_program_destroy(p);    /* frees the BOs, then the device (ASan checks both) */
    CHECK(1, "no use after free");
}

static void test_env_table(void)
{
    rj_env_flag_info info;
    uint32_t n = rj_env_flag_count();
    CHECK(n == RJ_ENV_COUNT, "flag count");
    for (uint32_t i = 0; i < n; i++) {
        CHECK(rj_env_flag_describe(i, &info) == 0 && info.name && strncmp(info.name, "RJ_", 3) == 0 &&
                  info.description && strlen(info.description) > 10,
              "flag %u registered with a description", i);
    }
    CHECK(rj_env_flag_describe(n, &info) == RJ_EINVAL, "out of range");
    int on = -1;
    CHECK(rj_env_parse_bool("YES", &on) == RJ_OK && on == 1, "YES is on");
    CHECK(rj_env_parse_bool("", &on) == RJ_OK && on == 0, "empty is off");
    CHECK(rj_env_parse_bool("banana", &on) == RJ_EINVAL, "banana is refused");
    rj_err err = {0};
    setenv("RJ_TRACE_STEPS", "banana", 1);
    CHECK(rj_env_switch(RJ_ENV_TRACE_STEPS, &on, &err) == RJ_EINVAL && strstr(err.msg, "RJ_TRACE_STEPS"),
          "rj_env_switch names the flag");
    unsetenv("RJ_TRACE_STEPS");
}

/* ---- the host-step pool (runtime/rj_host_pool.h) ---- */

enum { POOL_N = 1 << 16, POOL_ITEMS = 12 };

typedef struct pool_case {
    uint32_t *out;
    uint32_t salt;
    uint32_t fail_from; /* items >= this fail (UINT32_MAX: none) */
} pool_case;

static int pool_item(void *ctx, uint32_t item, rj_err *err)
{
    const pool_case *c = ctx;
    uint32_t lo = POOL_N / POOL_ITEMS * item;
    uint32_t hi = item + 1 == POOL_ITEMS ? POOL_N : POOL_N / POOL_ITEMS * (item + 1);
    for (uint32_t i = lo; i < hi; i++)
        c->out[i] = i * 2654435761u + c->salt;
    if (item >= c->fail_from)
        return rj_fail(err, RJ_EINVAL, "item %u failed", item);
    return RJ_OK;
}

static void *pool_caller(void *arg)
{
    uint32_t salt = (uint32_t)(uintptr_t)arg, *out = malloc(POOL_N * sizeof(uint32_t));
    intptr_t bad = out == NULL;
    for (int round = 0; round < 50 && !bad; round++) {
        pool_case c = {out, salt + (uint32_t)round, UINT32_MAX};
        rj_err err = {0};
        uint32_t used = 0;
        memset(out, 0, POOL_N * sizeof(uint32_t));
        if (rj_host_parallel(POOL_ITEMS, 3, pool_item, &c, &used, &err) || used < 1 || used > 3)
            bad = 1;
        for (uint32_t i = 0; i < POOL_N && !bad; i++)
            bad = out[i] != i * 2654435761u + c.salt;
    }
    free(out);
    return (void *)bad;
}

static void test_host_pool(void)
{
    rj_host_pool_shutdown();
    CHECK(rj_host_pool_workers() == 0, "no workers before a split");
    /* four callers at once: every item of every call runs exactly once, whichever thread */
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        CHECK(pthread_create(&th[i], NULL, pool_caller, (void *)(uintptr_t)(i * 1000)) == 0,
              "caller %d", i);
    for (int i = 0; i < 4; i++) {
        void *bad = NULL;
        pthread_join(th[i], &bad);
        CHECK(bad == NULL, "caller %d saw a wrong result", i);
    }
    CHECK(rj_host_pool_workers() == 2, "3 threads = the caller + 2 workers, got %u",
          rj_host_pool_workers());
    /* the lowest failing item's error is the one reported */
    uint32_t *out = calloc(POOL_N, sizeof(uint32_t));
    pool_case c = {out, 1, 5};
    rj_err err = {0};
    uint32_t used = 0;
    CHECK_FAILS(rj_host_parallel(POOL_ITEMS, 3, pool_item, &c, &used, &err), RJ_EINVAL, err,
                "item 5 failed");
    free(out);
    rj_host_pool_shutdown();
    CHECK(rj_host_pool_workers() == 0, "joined");
    /* the split rule */
    CHECK(rj_host_split_threads(RJ_HOST_SPLIT_MIN_BYTES - 1, 100, 3) == 1, "below the threshold");
    CHECK(rj_host_split_threads(RJ_HOST_SPLIT_MIN_BYTES, 100, 3) == 3, "at the threshold");
    CHECK(rj_host_split_threads(1u << 30, 2, 3) == 2, "no more threads than ranges");
    CHECK(rj_host_split_threads(1u << 30, 100, 1) == 1, "1 thread: no split");
    /* the setting */
    uint32_t n = 0;
    unsetenv("RJ_HOST_THREADS");
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t want = cpus - 1 >= RJ_HOST_THREADS_DEFAULT ? RJ_HOST_THREADS_DEFAULT
                    : cpus >= 2 ? (uint32_t)(cpus - 1) : 1;
    CHECK(rj_host_threads_get(&n, &err) == RJ_OK && n == want && rj_host_threads_default() == want,
          "default %u, want %u", n, want);
    setenv("RJ_HOST_THREADS", "2x", 1);
    CHECK_FAILS(rj_host_threads_get(&n, &err), RJ_EINVAL, err, "RJ_HOST_THREADS=2x");
    CHECK(rj_host_threads_set(4, &err) == RJ_OK && rj_host_threads_get(&n, &err) == RJ_OK && n == 4,
          "the set count wins over the flag");
    CHECK_FAILS(rj_host_threads_set(RJ_HOST_THREADS_MAX + 1, &err), RJ_EINVAL, err, "more than");
    rj_host_threads_set(0, &err);
    unsetenv("RJ_HOST_THREADS");
}

int main(void)
{
    RUN(test_bo_iova_and_guard);
    RUN(test_arena_placement);
    RUN(test_relocations);
    RUN(test_job_checks_and_null_counts);
    RUN(test_host_steps);
    RUN(test_program_pack_steps);
    RUN(test_device_outlives_its_bos);
    RUN(test_env_table);
    RUN(test_host_pool);
    TEST_MAIN_END();
}
