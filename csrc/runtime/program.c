/* Programs: BOs, placed regions, relocations, jobs and the step list, run by one C call.
 *
 * Lifecycle: build (add_*), load (patch relocations, resolve task IOVAs, check jobs, hand
 * CPU-written BOs to the device), run (any number of times). Anything that changes what load
 * computed marks the program unloaded, and run loads again. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/device_internal.h"
#include "runtime/rj_host_ops.h"
#include "runtime/rj_host_pool.h"

#define DEFAULT_TIMEOUT_NS (10ll * 1000 * 1000 * 1000)

typedef struct prog_bo {
    rj_bo *bo;
    uint32_t role;
    uint32_t cpu_dirty;  /* CPU wrote it since the last hand-over to the device */
    uint32_t holds_desc; /* a prepared host step's descriptor lives here */
    uint64_t place_end;  /* end of the highest placed region */
} prog_bo;

typedef struct prog_task {
    uint32_t bo;
    uint32_t words;
    uint64_t offset;
} prog_task;

typedef struct prog_job {
    uint32_t ctx, flags;
    prog_task *tasks;
    uint32_t ntasks, cap_tasks;
    uint32_t *in, *out;
    uint32_t n_in, cap_in, n_out, cap_out;
    /* resolved by load */
    rj_task *wire;
    rj_bo **in_bos, **out_bos;
    uint32_t n_in_bos;
} prog_job;

enum { STEP_NPU = 1, STEP_HOST = 2 };

typedef struct prog_step {
    uint32_t kind;
    uint32_t first, count;   /* NPU: slice of step_jobs */
    rj_host_step host;
} prog_step;

struct rj_program {
    rj_device *dev;
    prog_bo *bos;
    rj_bo **bo_ptrs;         /* parallel to bos, for the host-step library */
    uint32_t nbos, cap_bos;
    rj_reloc *relocs;
    uint32_t nrelocs, cap_relocs;
    prog_job *jobs;
    uint32_t njobs, cap_jobs;
    uint32_t *step_jobs;
    uint32_t nstep_jobs, cap_step_jobs;
    prog_step *steps;
    uint32_t nsteps, cap_steps;
    rj_job *scratch;         /* per-step job descriptors */
    rj_host_prepared **prep; /* per step (host-op steps; NULL: run the unprepared way) */
    uint32_t nprep;
    int prepared;            /* prep matches the steps and the descriptors' bytes */
    uint32_t cap_scratch;
    int loaded;
    int trace;               /* RJ_TRACE_STEPS, read once per load, not per step */
    int64_t timeout_ns;
    rj_program_stats stats;
};

/* Grow *arr (elements of `size` bytes) so it holds at least n+1. */
static int grow(void **arr, uint32_t *cap, uint32_t n, size_t size, rj_err *err)
{
    if (n < *cap)
        return RJ_OK;
    uint32_t nc = *cap ? *cap * 2 : 8;
    void *p = realloc(*arr, nc * size);
    if (!p)
        return rj_fail(err, RJ_ENOMEM, "program: out of memory");
    memset((char *)p + (size_t)*cap * size, 0, (size_t)(nc - *cap) * size);
    *arr = p;
    *cap = nc;
    return RJ_OK;
}
#define GROW(arr, cap, n, err) grow((void **)&(arr), &(cap), (n), sizeof(*(arr)), (err))

static void unprepare(rj_program *p)
{
    for (uint32_t i = 0; i < p->nprep; i++)
        rj_host_prepared_free(p->prep[i]);
    free(p->prep);
    p->prep = NULL;
    p->nprep = 0;
    p->prepared = 0;
}

/* Resolve, check and plan every host-op step once, so a run only walks: per-step checks and
 * plans cost a large share of a forward's ~10^3 mostly small host steps. A step that does not
 * prepare (its descriptor was refused), or whose descriptor lies in a BO some step or job
 * writes (its bytes may change during a run), is left to the unprepared path, which reads the
 * descriptor when the step runs and reports what is wrong with it. */
static int prepare_host_steps(rj_program *p, rj_err *err)
{
    unprepare(p);
    p->prep = calloc(p->nsteps ? p->nsteps : 1, sizeof(*p->prep));
    uint8_t *written = calloc(p->nbos ? p->nbos : 1, 1);
    if (!p->prep || !written) {
        free(written);
        return rj_fail(err, RJ_ENOMEM, "program: out of memory for %u prepared steps", p->nsteps);
    }
    p->nprep = p->nsteps;
    for (uint32_t i = 0; i < p->nsteps; i++) {
        const prog_step *s = &p->steps[i];
        if (s->kind == STEP_HOST && s->host.dst.bo < p->nbos)
            written[s->host.dst.bo] = 1;
        for (uint32_t k = 0; s->kind == STEP_NPU && k < s->count; k++) {
            const prog_job *j = &p->jobs[p->step_jobs[s->first + k]];
            for (uint32_t o = 0; o < j->n_out; o++)
                written[j->out[o]] = 1;
        }
    }
    for (uint32_t i = 0; i < p->nsteps; i++) {
        const prog_step *s = &p->steps[i];
        if (s->kind != STEP_HOST || s->host.kind < RJ_HOST_OPS_FIRST ||
            s->host.kind > RJ_HOST_FUSED || s->host.aux.bo >= p->nbos ||
            written[s->host.aux.bo])
            continue;
        rj_err ignored;
        if (rj_host_op_step_prepare(&s->host, p->bo_ptrs, p->nbos, &p->prep[i], &ignored) == RJ_OK)
            p->bos[s->host.aux.bo].holds_desc = 1;
    }
    free(written);
    p->prepared = 1;
    return RJ_OK;
}

int rj_program_create(rj_device *dev, rj_program **out, rj_err *err)
{
    if (!dev || !out)
        return rj_fail(err, RJ_EINVAL, "rj_program_create: NULL device or output pointer");
    rj_program *p = calloc(1, sizeof(*p));
    if (!p)
        return rj_fail(err, RJ_ENOMEM, "rj_program_create: out of memory");
    p->dev = dev;
    p->timeout_ns = DEFAULT_TIMEOUT_NS;
    *out = p;
    return RJ_OK;
}

void rj_program_destroy(rj_program *p)
{
    if (!p)
        return;
    for (uint32_t i = 0; i < p->njobs; i++) {
        prog_job *j = &p->jobs[i];
        free(j->wire);
        free(j->in_bos);
        free(j->out_bos);
        free(j->out);
        free(j->in);
        free(j->tasks);
    }
    /* BOs go in reverse order of creation. */
    for (uint32_t i = p->nbos; i-- > 0;)
        rj_bo_destroy(p->dev, p->bos[i].bo);
    unprepare(p);
    free(p->scratch);
    free(p->steps);
    free(p->step_jobs);
    free(p->jobs);
    free(p->relocs);
    free(p->bo_ptrs);
    free(p->bos);
    free(p);
}

void rj_program_set_timeout(rj_program *p, int64_t timeout_ns)
{
    if (p)
        p->timeout_ns = timeout_ns;
}

void rj_program_get_stats(const rj_program *p, rj_program_stats *out)
{
    if (p && out)
        *out = p->stats;
}

uint32_t rj_program_bo_count(const rj_program *p) { return p ? p->nbos : 0; }

static int check_bo(const rj_program *p, uint32_t bo, const char *what, rj_err *err)
{
    if (bo >= p->nbos)
        return rj_fail(err, RJ_EINVAL, "%s: BO index %u does not exist (the program has %u BOs)",
                       what, bo, p->nbos);
    return RJ_OK;
}

int rj_program_add_bo(rj_program *p, uint32_t ctx, uint32_t role, uint64_t size,
                      uint32_t *out_index, rj_err *err)
{
    if (!p || !out_index)
        return rj_fail(err, RJ_EINVAL, "rj_program_add_bo: NULL program or output pointer");
    if (role < RJ_BO_ARENA || role > RJ_BO_IO)
        return rj_fail(err, RJ_EINVAL, "rj_program_add_bo: unknown role %u", role);
    int rc;
    if ((rc = GROW(p->bos, p->cap_bos, p->nbos, err)))
        return rc;
    rj_bo **np = realloc(p->bo_ptrs, sizeof(*np) * p->cap_bos);
    if (!np)
        return rj_fail(err, RJ_ENOMEM, "rj_program_add_bo: out of memory");
    p->bo_ptrs = np;
    rj_bo *bo;
    if ((rc = rj_bo_create(p->dev, ctx, size, &bo, err)))
        return rc;
    p->bos[p->nbos] = (prog_bo){.bo = bo, .role = role, .cpu_dirty = 1};
    p->bo_ptrs[p->nbos] = bo;
    *out_index = p->nbos++;
    p->loaded = 0;
    return RJ_OK;
}

int rj_program_bo_info(const rj_program *p, uint32_t bo, rj_bo *out, rj_err *err)
{
    int rc;
    if (!p || !out)
        return rj_fail(err, RJ_EINVAL, "rj_program_bo_info: NULL program or output pointer");
    if ((rc = check_bo(p, bo, "rj_program_bo_info", err)))
        return rc;
    *out = *p->bos[bo].bo;
    return RJ_OK;
}

int rj_program_place(rj_program *p, uint32_t bo, uint64_t offset, uint64_t size, uint64_t align,
                     uint64_t *out_offset, rj_err *err)
{
    int rc;
    if (!p || !out_offset)
        return rj_fail(err, RJ_EINVAL, "rj_program_place: NULL program or output pointer");
    if ((rc = check_bo(p, bo, "rj_program_place", err)))
        return rc;
    if (align == 0)
        align = 1;
    if (align & (align - 1))
        return rj_fail(err, RJ_EINVAL, "rj_program_place: alignment %llu is not a power of two",
                       (unsigned long long)align);
    prog_bo *b = &p->bos[bo];
    uint64_t off = offset == RJ_PLACE_ANY ? rj_round_up(b->place_end, align) : offset;
    if (off % align)
        return rj_fail(err, RJ_EINVAL,
                       "rj_program_place: offset %llu in BO %u is not a multiple of the required "
                       "alignment %llu", (unsigned long long)off, bo, (unsigned long long)align);
    if (size > b->bo->size || off > b->bo->size - size)
        return rj_fail(err, RJ_EINVAL,
                       "rj_program_place: region [%llu, %llu) does not fit BO %u of %llu bytes; "
                       "size the arena from the memory plan's high-water mark",
                       (unsigned long long)off, (unsigned long long)(off + size), bo,
                       (unsigned long long)b->bo->size);
    if (off + size > b->place_end)
        b->place_end = off + size;
    *out_offset = off;
    return RJ_OK;
}

static int check_range(const rj_program *p, uint32_t bo, uint64_t offset, uint64_t size,
                       const char *what, rj_err *err)
{
    int rc;
    if ((rc = check_bo(p, bo, what, err)))
        return rc;
    uint64_t bsize = p->bos[bo].bo->size;
    if (size > bsize || offset > bsize - size)
        return rj_fail(err, RJ_EINVAL, "%s: bytes [%llu, %llu) are outside BO %u of %llu bytes",
                       what, (unsigned long long)offset, (unsigned long long)(offset + size), bo,
                       (unsigned long long)bsize);
    return RJ_OK;
}

int rj_program_write(rj_program *p, uint32_t bo, uint64_t offset, const void *data,
                     uint64_t size, rj_err *err)
{
    int rc;
    if (!p || (!data && size))
        return rj_fail(err, RJ_EINVAL, "rj_program_write: NULL program or data");
    if ((rc = check_range(p, bo, offset, size, "rj_program_write", err)))
        return rc;
    memcpy(p->bos[bo].bo->host + offset, data, size);
    p->bos[bo].cpu_dirty = 1;
    if (p->bos[bo].holds_desc)
        p->prepared = 0; /* a descriptor may have changed */
    if (p->bos[bo].role == RJ_BO_REGCMD)
        p->loaded = 0; /* relocated words may have been overwritten */
    p->stats.upload_bytes += size;
    return RJ_OK;
}

int rj_program_read(rj_program *p, uint32_t bo, uint64_t offset, void *data, uint64_t size,
                    rj_err *err)
{
    int rc;
    if (!p || (!data && size))
        return rj_fail(err, RJ_EINVAL, "rj_program_read: NULL program or data");
    if ((rc = check_range(p, bo, offset, size, "rj_program_read", err)))
        return rc;
    memcpy(data, p->bos[bo].bo->host + offset, size);
    p->stats.readback_bytes += size;
    return RJ_OK;
}

/* One rank-1 host-op copy between caller memory and a BO region (to_bo: caller -> BO). */
static int convert_io(rj_program *p, uint32_t bo, uint64_t offset, uint32_t bo_dtype, void *data,
                      uint32_t data_dtype, uint64_t count, uint64_t bytes, int to_bo,
                      rj_err *err)
{
    const char *what = to_bo ? "rj_program_write_as" : "rj_program_read_as";
    if (!p || (!data && count))
        return rj_fail(err, RJ_EINVAL, "%s: NULL program or data", what);
    uint32_t bes = rj_host_dtype_size(bo_dtype), des = rj_host_dtype_size(data_dtype);
    if (!bes || !des)
        return rj_fail(err, RJ_EINVAL, "%s: dtype code %u is not an RJ_DT_* code", what,
                       bes ? data_dtype : bo_dtype);
    if (count > bytes / des)
        return rj_fail(err, RJ_EINVAL, "%s: %llu elements of %s need %llu bytes, the buffer has "
                       "%llu", what, (unsigned long long)count, rj_host_dtype_name(data_dtype),
                       (unsigned long long)count * des, (unsigned long long)bytes);
    if (count > UINT64_MAX / bes)
        return rj_fail(err, RJ_EINVAL, "%s: %llu elements overflow a byte count", what,
                       (unsigned long long)count);
    int rc = check_range(p, bo, offset, count * bes, what, err);
    if (rc)
        return rc;
    if (!count)
        return RJ_OK;
    rj_host_op op = {.magic = RJ_HOST_OP_MAGIC, .version = RJ_HOST_OP_VERSION, .kind = RJ_HOST_COPY,
                     .rank = 1, .ninputs = 1, .shape = {(int64_t)count}};
    rj_host_buf mem = {p->bos[bo].bo->host + offset, count * bes}, user = {data, bytes};
    op.view[0] = (rj_host_view){.dtype = to_bo ? bo_dtype : data_dtype, .stride = {1}};
    op.view[1] = (rj_host_view){.dtype = to_bo ? data_dtype : bo_dtype, .stride = {1}};
    rj_host_buf bufs[2] = {to_bo ? mem : user, to_bo ? user : mem};
    uint32_t threads = 1; /* a large input or output converts on the host steps' threads */
    if ((rc = rj_host_threads_get(&threads, err)) ||
        (rc = rj_host_op_run_threads(&op, bufs, 2, threads, NULL, NULL, err)))
        return rc;
    if (to_bo) {
        p->bos[bo].cpu_dirty = 1;
        if (p->bos[bo].holds_desc)
            p->prepared = 0;
        if (p->bos[bo].role == RJ_BO_REGCMD)
            p->loaded = 0;
        p->stats.upload_bytes += count * bes;
    } else {
        p->stats.readback_bytes += count * bes;
    }
    return RJ_OK;
}

int rj_program_write_as(rj_program *p, uint32_t bo, uint64_t offset, uint32_t bo_dtype,
                        const void *data, uint32_t data_dtype, uint64_t count, uint64_t bytes,
                        rj_err *err)
{
    return convert_io(p, bo, offset, bo_dtype, (void *)data, data_dtype, count, bytes, 1, err);
}

int rj_program_read_as(rj_program *p, uint32_t bo, uint64_t offset, uint32_t bo_dtype,
                       void *data, uint32_t data_dtype, uint64_t count, uint64_t bytes,
                       rj_err *err)
{
    return convert_io(p, bo, offset, bo_dtype, data, data_dtype, count, bytes, 0, err);
}

int rj_program_add_reloc(rj_program *p, const rj_reloc *r, rj_err *err)
{
    int rc;
    if (!p || !r)
        return rj_fail(err, RJ_EINVAL, "rj_program_add_reloc: NULL program or relocation");
    if (r->reserved)
        return rj_fail(err, RJ_EINVAL, "relocation: reserved field is %u, must be zero", r->reserved);
    if ((rc = check_bo(p, r->regcmd_bo, "relocation source", err)) ||
        (rc = check_bo(p, r->target_bo, "relocation target", err)))
        return rc;
    if (p->bos[r->regcmd_bo].role != RJ_BO_REGCMD)
        return rj_fail(err, RJ_EINVAL, "relocation: BO %u is not a regcmd BO; relocations patch "
                       "register command words only", r->regcmd_bo);
    if (r->word_offset % 8)
        return rj_fail(err, RJ_EINVAL, "relocation: word offset %llu is not a multiple of 8 (regcmd "
                       "words are u64)", (unsigned long long)r->word_offset);
    if ((rc = check_range(p, r->regcmd_bo, r->word_offset, 8, "relocation word", err)))
        return rc;
    if (r->target_offset >= p->bos[r->target_bo].bo->size)
        return rj_fail(err, RJ_EINVAL, "relocation: target offset %llu is outside BO %u of %llu bytes",
                       (unsigned long long)r->target_offset, r->target_bo,
                       (unsigned long long)p->bos[r->target_bo].bo->size);
    if (p->bos[r->regcmd_bo].bo->ctx != p->bos[r->target_bo].bo->ctx)
        return rj_fail(err, RJ_EINVAL,
                       "relocation: regcmd BO %u (context %u) points at BO %u in context %u; an "
                       "address is only meaningful inside its own fd's IOVA space (notes: "
                       "perf/iova-and-multicore.md)", r->regcmd_bo, p->bos[r->regcmd_bo].bo->ctx,
                       r->target_bo, p->bos[r->target_bo].bo->ctx);
    if ((rc = GROW(p->relocs, p->cap_relocs, p->nrelocs, err)))
        return rc;
    p->relocs[p->nrelocs++] = *r;
    p->loaded = 0;
    return RJ_OK;
}

static void prefix_msg(rj_err *err, const char *prefix);

int rj_program_add_relocs(rj_program *p, const rj_reloc *relocs, uint32_t count, rj_err *err)
{
    if (!p || (count && !relocs))
        return rj_fail(err, RJ_EINVAL, "rj_program_add_relocs: NULL program or relocations");
    for (uint32_t i = 0; i < count; i++) {
        int rc = rj_program_add_reloc(p, &relocs[i], err);
        if (rc) {
            char where[48];
            snprintf(where, sizeof(where), "relocation %u of %u: ", i, count);
            prefix_msg(err, where);
            return rc;
        }
    }
    return RJ_OK;
}

int rj_program_add_job(rj_program *p, uint32_t ctx, uint32_t flags, uint32_t *out_index,
                       rj_err *err)
{
    int rc;
    if (!p || !out_index)
        return rj_fail(err, RJ_EINVAL, "rj_program_add_job: NULL program or output pointer");
    if (ctx >= rj_device_nctx(p->dev))
        return rj_fail(err, RJ_EINVAL, "rj_program_add_job: context %u does not exist (the device "
                       "has %u)", ctx, rj_device_nctx(p->dev));
    if (flags & ~(uint32_t)RJ_JOB_KNOWN_FLAGS)
        return rj_fail(err, RJ_EINVAL, "rj_program_add_job: unknown flag bits 0x%x",
                       flags & ~(uint32_t)RJ_JOB_KNOWN_FLAGS);
    if ((rc = GROW(p->jobs, p->cap_jobs, p->njobs, err)))
        return rc;
    p->jobs[p->njobs] = (prog_job){.ctx = ctx, .flags = flags};
    *out_index = p->njobs++;
    p->loaded = 0;
    return RJ_OK;
}

static int check_job_index(const rj_program *p, uint32_t job, const char *what, rj_err *err)
{
    if (job >= p->njobs)
        return rj_fail(err, RJ_EINVAL, "%s: job %u does not exist (the program has %u)", what, job,
                       p->njobs);
    return RJ_OK;
}

int rj_program_job_add_task(rj_program *p, uint32_t job, uint32_t regcmd_bo, uint64_t offset,
                            uint32_t words, rj_err *err)
{
    int rc;
    if (!p)
        return rj_fail(err, RJ_EINVAL, "rj_program_job_add_task: NULL program");
    if ((rc = check_job_index(p, job, "add task", err)) ||
        (rc = check_bo(p, regcmd_bo, "add task", err)))
        return rc;
    if (words == 0)
        return rj_fail(err, RJ_EINVAL, "job %u: a task needs at least one regcmd word", job);
    prog_job *j = &p->jobs[job];
    if ((rc = GROW(j->tasks, j->cap_tasks, j->ntasks, err)))
        return rc;
    j->tasks[j->ntasks++] = (prog_task){.bo = regcmd_bo, .words = words, .offset = offset};
    p->loaded = 0;
    return RJ_OK;
}

int rj_program_job_add_bo(rj_program *p, uint32_t job, uint32_t bo, uint32_t dir, rj_err *err)
{
    int rc;
    if (!p)
        return rj_fail(err, RJ_EINVAL, "rj_program_job_add_bo: NULL program");
    if ((rc = check_job_index(p, job, "add job BO", err)) ||
        (rc = check_bo(p, bo, "add job BO", err)))
        return rc;
    prog_job *j = &p->jobs[job];
    if (dir == RJ_JOB_IN) {
        if ((rc = GROW(j->in, j->cap_in, j->n_in, err)))
            return rc;
        j->in[j->n_in++] = bo;
    } else if (dir == RJ_JOB_OUT) {
        if ((rc = GROW(j->out, j->cap_out, j->n_out, err)))
            return rc;
        j->out[j->n_out++] = bo;
    } else {
        return rj_fail(err, RJ_EINVAL, "job %u: BO direction %u is neither RJ_JOB_IN nor RJ_JOB_OUT",
                       job, dir);
    }
    p->loaded = 0;
    return RJ_OK;
}

int rj_program_add_npu_step(rj_program *p, const uint32_t *jobs, uint32_t njobs, rj_err *err)
{
    int rc;
    if (!p || !jobs || njobs == 0)
        return rj_fail(err, RJ_EINVAL, "rj_program_add_npu_step: an NPU step needs at least one job");
    for (uint32_t i = 0; i < njobs; i++) {
        if ((rc = check_job_index(p, jobs[i], "NPU step", err)))
            return rc;
        for (uint32_t k = 0; k < i; k++) {
            if (jobs[k] == jobs[i])
                return rj_fail(err, RJ_EINVAL, "NPU step: job %u is listed twice", jobs[i]);
            /* One fd is one scheduling entity: two jobs on one context serialize, and the
             * runtime fences a step as one unit, so that is allowed but never parallel. */
        }
    }
    if ((rc = GROW(p->steps, p->cap_steps, p->nsteps, err)))
        return rc;
    uint32_t first = p->nstep_jobs;
    for (uint32_t i = 0; i < njobs; i++) {
        if ((rc = GROW(p->step_jobs, p->cap_step_jobs, p->nstep_jobs, err)))
            return rc;
        p->step_jobs[p->nstep_jobs++] = jobs[i];
    }
    if (njobs > p->cap_scratch) {
        rj_job *s = realloc(p->scratch, sizeof(*s) * njobs);
        if (!s)
            return rj_fail(err, RJ_ENOMEM, "rj_program_add_npu_step: out of memory");
        p->scratch = s;
        p->cap_scratch = njobs;
    }
    p->steps[p->nsteps++] = (prog_step){.kind = STEP_NPU, .first = first, .count = njobs};
    p->loaded = 0;
    return RJ_OK;
}

int rj_program_add_host_step(rj_program *p, const rj_host_step *step, rj_err *err)
{
    int rc;
    if (!p || !step)
        return rj_fail(err, RJ_EINVAL, "rj_program_add_host_step: NULL program or step");
    if ((rc = rj_host_step_check(step, p->bo_ptrs, p->nbos, err)))
        return rc;
    if ((rc = GROW(p->steps, p->cap_steps, p->nsteps, err)))
        return rc;
    p->steps[p->nsteps++] = (prog_step){.kind = STEP_HOST, .host = *step};
    p->prepared = 0;
    return RJ_OK;
}

/* ---- load ------------------------------------------------------------------------------------ */

static int apply_reloc(rj_program *p, const rj_reloc *r, uint32_t idx, rj_err *err)
{
    rj_bo *src = p->bos[r->regcmd_bo].bo, *dst = p->bos[r->target_bo].bo;
    uint64_t word;
    memcpy(&word, src->host + r->word_offset, 8);
    uint32_t op = (uint32_t)(word >> 48), old = (uint32_t)(word >> 16);
    /* A relocation may only patch a register write (op low byte 0x01; conformance README,
     * design.md convention 6): anything else means the offset points at the wrong word. */
    if ((op & 0xFFu) != 0x01u)
        return rj_fail(err, RJ_EINVAL,
                       "relocation %u: word at byte %llu of BO %u is 0x%016llx, not a register "
                       "write (op 0x%04x); write the regcmd words before loading and check the "
                       "word offset", idx, (unsigned long long)r->word_offset, r->regcmd_bo,
                       (unsigned long long)word, op);
    uint64_t addr = dst->iova + r->target_offset;
    /* notes: perf/iova-and-multicore.md: regcmd address fields are 32-bit. */
    if (addr > 0xFFFFFFFFull)
        return rj_fail(err, RJ_EINVAL, "relocation %u: address 0x%llx does not fit the 32-bit "
                       "register field", idx, (unsigned long long)addr);
    if (addr & r->keep_mask)
        return rj_fail(err, RJ_EINVAL,
                       "relocation %u: address 0x%llx has bits in keep_mask 0x%x set; the register "
                       "needs an address aligned past its flag bits", idx,
                       (unsigned long long)addr, r->keep_mask);
    uint32_t value = (uint32_t)addr | (old & r->keep_mask);
    word = (word & ~(0xFFFFFFFFull << 16)) | ((uint64_t)value << 16);
    memcpy(src->host + r->word_offset, &word, 8);
    return RJ_OK;
}

/* Relocations ordered by (regcmd BO, word offset): resolve_job finds a task's relocations by
 * binary search instead of scanning all of them per job (a whole encoder has ~10^5 relocations
 * and ~10^4 jobs). */
typedef struct reloc_key {
    uint64_t word_offset;
    uint32_t regcmd_bo;
    uint32_t index;     /* into p->relocs */
} reloc_key;

static int reloc_cmp(const void *a, const void *b)
{
    const reloc_key *x = a, *y = b;
    if (x->regcmd_bo != y->regcmd_bo)
        return x->regcmd_bo < y->regcmd_bo ? -1 : 1;
    if (x->word_offset != y->word_offset)
        return x->word_offset < y->word_offset ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* The first position in ``order`` at or after (bo, offset). */
static uint32_t reloc_lower_bound(const reloc_key *order, uint32_t n, uint32_t bo,
                                  uint64_t offset)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        const reloc_key *k = &order[mid];
        if (k->regcmd_bo < bo || (k->regcmd_bo == bo && k->word_offset < offset))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int resolve_job(rj_program *p, const reloc_key *order, uint32_t ji, rj_err *err)
{
    prog_job *j = &p->jobs[ji];
    if (j->ntasks == 0)
        return rj_fail(err, RJ_EINVAL, "job %u has no tasks", ji);
    if (j->n_out == 0)
        return rj_fail(err, RJ_EINVAL, "job %u lists no out-BO; the fence is PREP_BO on an out-BO, "
                       "so every job must name the BO it writes", ji);
    free(j->wire);
    free(j->in_bos);
    free(j->out_bos);
    j->wire = calloc(j->ntasks, sizeof(*j->wire));
    j->in_bos = calloc(j->n_in + j->ntasks, sizeof(*j->in_bos));
    j->out_bos = calloc(j->n_out, sizeof(*j->out_bos));
    if (!j->wire || !j->in_bos || !j->out_bos)
        return rj_fail(err, RJ_ENOMEM, "load: out of memory");
    for (uint32_t t = 0; t < j->ntasks; t++) {
        const prog_task *pt = &j->tasks[t];
        rj_bo *bo = p->bos[pt->bo].bo;
        if (p->bos[pt->bo].role != RJ_BO_REGCMD)
            return rj_fail(err, RJ_EINVAL, "job %u task %u: BO %u is not a regcmd BO", ji, t, pt->bo);
        if (pt->offset % 16)
            return rj_fail(err, RJ_EINVAL,
                           "job %u task %u: regcmd offset %llu is not 16-byte aligned (the PC "
                           "fetches regcmds by PC_BASE_ADDRESS.PC_SOURCE_ADDR, bits 31..4)",
                           ji, t, (unsigned long long)pt->offset);
        if ((uint64_t)pt->words * 8 > bo->size || pt->offset > bo->size - (uint64_t)pt->words * 8)
            return rj_fail(err, RJ_EINVAL, "job %u task %u: %u words at byte %llu run past the end "
                           "of regcmd BO %u (%llu bytes)", ji, t, pt->words,
                           (unsigned long long)pt->offset, pt->bo, (unsigned long long)bo->size);
        if (bo->ctx != j->ctx)
            return rj_fail(err, RJ_EINVAL, "job %u runs on context %u but its task %u lives in BO %u "
                           "of context %u (notes: perf/iova-and-multicore.md: IOVAs are per fd)",
                           ji, j->ctx, t, pt->bo, bo->ctx);
        if ((j->flags & RJ_JOB_SELF_CHAINED) && t > 0) {
            /* notes: encodings/regcmd-task-model.md: chained regcmds are contiguous with a
             * stride of the even-rounded word count. */
            const prog_task *prev = &j->tasks[t - 1];
            uint64_t expect = prev->offset + 8ull * ((prev->words + 1u) & ~1u);
            if (pt->bo != prev->bo || pt->offset != expect)
                return rj_fail(err, RJ_EINVAL,
                               "self-chained job %u: task %u starts at BO %u byte %llu, but a chain "
                               "must be contiguous: expected BO %u byte %llu (previous task's "
                               "%u words rounded up to even)", ji, t, pt->bo,
                               (unsigned long long)pt->offset, prev->bo, (unsigned long long)expect,
                               prev->words);
        }
        j->wire[t] = (rj_task){.regcmd_iova = bo->iova + pt->offset, .regcmd_count = pt->words};
    }
    uint32_t n = 0;
    for (uint32_t i = 0; i < j->n_in; i++)
        j->in_bos[n++] = p->bos[j->in[i]].bo;
    /* The job reads its regcmd BOs: list them unless the caller already did. */
    for (uint32_t t = 0; t < j->ntasks; t++) {
        rj_bo *bo = p->bos[j->tasks[t].bo].bo;
        int listed = 0;
        for (uint32_t i = 0; i < n && !listed; i++)
            listed = j->in_bos[i] == bo;
        for (uint32_t o = 0; o < j->n_out && !listed; o++)
            listed = p->bos[j->out[o]].bo == bo;
        if (!listed)
            j->in_bos[n++] = bo;
    }
    j->n_in_bos = n;
    for (uint32_t o = 0; o < j->n_out; o++)
        j->out_bos[o] = p->bos[j->out[o]].bo;
    for (uint32_t i = 0; i < n; i++) {
        if (j->in_bos[i]->ctx != j->ctx)
            return rj_fail(err, RJ_EINVAL, "job %u runs on context %u but reads a BO of context %u "
                           "(notes: perf/iova-and-multicore.md: IOVAs are per fd)", ji, j->ctx,
                           j->in_bos[i]->ctx);
        for (uint32_t o = 0; o < j->n_out; o++)
            if (j->in_bos[i] == j->out_bos[o])
                return rj_fail(err, RJ_EHAZARD,
                               "job %u lists a BO as both in and out: on hardware the kernel then "
                               "signals completion having executed nothing (notes: "
                               "encodings/regcmd-task-model.md). List a BO the job reads and "
                               "writes as out only.", ji);
    }
    /* Every BO a task's words address must be in the job's lists: the kernel orders jobs by
     * those lists (implicit fences) and the runtime hands exactly those BOs to the device. */
    for (uint32_t t = 0; t < j->ntasks; t++) {
        const prog_task *pt = &j->tasks[t];
        uint64_t end = pt->offset + 8ull * pt->words;
        for (uint32_t k = reloc_lower_bound(order, p->nrelocs, pt->bo, pt->offset);
             k < p->nrelocs; k++) {
            const rj_reloc *rl = &p->relocs[order[k].index];
            if (rl->regcmd_bo != pt->bo || rl->word_offset >= end)
                break;
            rj_bo *target = p->bos[rl->target_bo].bo;
            int listed = 0;
            for (uint32_t i = 0; i < n && !listed; i++)
                listed = j->in_bos[i] == target;
            for (uint32_t o = 0; o < j->n_out && !listed; o++)
                listed = j->out_bos[o] == target;
            if (!listed)
                return rj_fail(err, RJ_EINVAL,
                               "job %u task %u: word %llu addresses BO %u, which the job lists "
                               "neither as read nor as written; list it so the kernel orders the "
                               "job against its other users and the runtime syncs it", ji, t,
                               (unsigned long long)((rl->word_offset - pt->offset) / 8),
                               rl->target_bo);
        }
    }
    for (uint32_t o = 0; o < j->n_out; o++)
        if (j->out_bos[o]->ctx != j->ctx)
            return rj_fail(err, RJ_EINVAL, "job %u runs on context %u but writes a BO of context %u "
                           "(notes: perf/iova-and-multicore.md: IOVAs are per fd)", ji, j->ctx,
                           j->out_bos[o]->ctx);
    return RJ_OK;
}

static int dump_regcmd(rj_program *p, const char *dir, rj_err *err)
{
    mkdir(dir, 0777);
    for (uint32_t ji = 0; ji < p->njobs; ji++) {
        prog_job *j = &p->jobs[ji];
        for (uint32_t t = 0; t < j->ntasks; t++) {
            char path[4096];
            snprintf(path, sizeof(path), "%s/job%04u_task%04u.regcmd", dir, ji, t);
            FILE *f = fopen(path, "wb");
            if (!f)
                return rj_fail(err, RJ_EIO, "RJ_DUMP_REGCMD: cannot write %s: %s", path,
                               strerror(errno));
            const prog_task *pt = &j->tasks[t];
            size_t n = fwrite(p->bos[pt->bo].bo->host + pt->offset, 8, pt->words, f);
            fclose(f);
            if (n != pt->words)
                return rj_fail(err, RJ_EIO, "RJ_DUMP_REGCMD: short write to %s", path);
        }
    }
    return RJ_OK;
}

static int hand_to_device(rj_program *p, prog_bo *b, rj_err *err)
{
    if (!b->cpu_dirty)
        return RJ_OK;
    int rc = rj_bo_sync_for_device(p->dev, b->bo, err);
    if (rc == RJ_OK)
        b->cpu_dirty = 0;
    return rc;
}

int rj_program_load(rj_program *p, rj_err *err)
{
    int rc;
    if (!p)
        return rj_fail(err, RJ_EINVAL, "rj_program_load: NULL program");
    for (uint32_t i = 0; i < p->nrelocs; i++) {
        if ((rc = apply_reloc(p, &p->relocs[i], i, err)))
            return rc;
        p->bos[p->relocs[i].regcmd_bo].cpu_dirty = 1;
    }
    p->stats.relocs_applied += p->nrelocs;
    reloc_key *order = malloc((p->nrelocs ? p->nrelocs : 1) * sizeof(*order));
    if (!order)
        return rj_fail(err, RJ_ENOMEM, "rj_program_load: out of memory for %u relocations",
                       p->nrelocs);
    for (uint32_t i = 0; i < p->nrelocs; i++)
        order[i] = (reloc_key){p->relocs[i].word_offset, p->relocs[i].regcmd_bo, i};
    qsort(order, p->nrelocs, sizeof(*order), reloc_cmp);
    rc = RJ_OK;
    for (uint32_t i = 0; i < p->njobs && !rc; i++)
        rc = resolve_job(p, order, i, err);
    free(order);
    if (rc)
        return rc;
    const char *dump = rj_env_get(RJ_ENV_DUMP_REGCMD);
    if (dump && (rc = dump_regcmd(p, dump, err)))
        return rc;
    for (uint32_t i = 0; i < p->nbos; i++)
        if ((rc = hand_to_device(p, &p->bos[i], err)))
            return rc;
    int trace;
    if ((rc = rj_env_switch(RJ_ENV_TRACE_STEPS, &trace, err)))
        return rc;
    p->trace = trace;
    p->prepared = 0; /* prepared again by the next run, against what load checked */
    p->loaded = 1;
    return RJ_OK;
}

/* ---- run ------------------------------------------------------------------------------------- */

/* Put "where" in front of a message a lower layer wrote. */
static void prefix_msg(rj_err *err, const char *prefix)
{
    if (!err)
        return;
    char msg[sizeof(err->msg)];
    size_t pl = strnlen(prefix, sizeof(msg) - 1);
    memcpy(msg, prefix, pl);
    size_t ml = strnlen(err->msg, sizeof(err->msg));
    if (ml > sizeof(msg) - 1 - pl)
        ml = sizeof(msg) - 1 - pl;
    memcpy(msg + pl, err->msg, ml);
    msg[pl + ml] = 0;
    memcpy(err->msg, msg, sizeof(msg));
}

static int run_npu_step(rj_program *p, uint32_t si, const prog_step *s, rj_err *err)
{
    int rc;
    int64_t t0 = p->trace ? rj_now_ns() : 0;
    for (uint32_t k = 0; k < s->count; k++) {
        prog_job *j = &p->jobs[p->step_jobs[s->first + k]];
        p->scratch[k] = (rj_job){.tasks = j->wire, .in_bos = j->in_bos, .out_bos = j->out_bos,
                                 .ntasks = j->ntasks, .n_in = j->n_in_bos, .n_out = j->n_out,
                                 .ctx = j->ctx, .flags = j->flags};
        /* Host steps may have written BOs since the last hand-over. */
        for (uint32_t i = 0; i < j->n_in; i++)
            if ((rc = hand_to_device(p, &p->bos[j->in[i]], err)))
                goto fail;
        for (uint32_t o = 0; o < j->n_out; o++)
            if ((rc = hand_to_device(p, &p->bos[j->out[o]], err)))
                goto fail;
    }
    if ((rc = rj_device_submit(p->dev, p->scratch, s->count, err)))
        goto fail;
    if ((rc = rj_device_wait(p->dev, p->scratch, s->count, p->timeout_ns, err)))
        goto fail;
    for (uint32_t k = 0; k < s->count; k++) {
        prog_job *j = &p->jobs[p->step_jobs[s->first + k]];
        p->stats.jobs++;
        p->stats.tasks += j->ntasks;
        p->stats.kicks += (j->flags & RJ_JOB_SELF_CHAINED) ? 1 : j->ntasks;
    }
    p->stats.npu_steps++;
    if (p->trace)
        fprintf(stderr, "rockjit: step %u: npu, %u job(s), %lld ns\n", si, s->count,
                (long long)(rj_now_ns() - t0));
    return RJ_OK;
fail:
    {
        /* Say which step failed, keeping the device's message. */
        char where[96];
        snprintf(where, sizeof(where), "step %u (NPU, job %u%s): ", si, p->step_jobs[s->first],
                 s->count > 1 ? " and others" : "");
        prefix_msg(err, where);
    }
    return rc;
}

static int run_host_step(rj_program *p, uint32_t si, const prog_step *s, uint32_t threads,
                         rj_err *err)
{
    uint64_t bytes = 0;
    uint32_t used = 1;
    int64_t t0 = p->trace ? rj_now_ns() : 0;
    const rj_host_prepared *prep = si < p->nprep ? p->prep[si] : NULL;
    int rc = prep ? rj_host_prepared_run(prep, threads, &bytes, &used, err)
                  : rj_host_step_run_threads(&s->host, p->bo_ptrs, p->nbos, threads, &bytes, &used,
                                             err);
    if (rc) {
        char where[32];
        snprintf(where, sizeof(where), "step %u: ", si);
        prefix_msg(err, where);
        return rc;
    }
    p->bos[s->host.dst.bo].cpu_dirty = 1;
    p->stats.host_steps++;
    p->stats.host_bytes += bytes;
    p->stats.host_threads += used;
    if (p->trace)
        fprintf(stderr, "rockjit: step %u: host %s, %llu bytes, %u thread(s), %lld ns\n", si,
                rj_host_step_name(s->host.kind), (unsigned long long)bytes, used,
                (long long)(rj_now_ns() - t0));
    return RJ_OK;
}

int rj_program_run(rj_program *p, rj_err *err)
{
    int rc;
    if (!p)
        return rj_fail(err, RJ_EINVAL, "rj_program_run: NULL program");
    if (!p->loaded && (rc = rj_program_load(p, err)))
        return rc;
    if (!p->prepared && (rc = prepare_host_steps(p, err)))
        return rc;
    uint32_t threads = 1; /* read once per run: the setting may change between runs */
    if ((rc = rj_host_threads_get(&threads, err)))
        return rc;
    for (uint32_t si = 0; si < p->nsteps; si++) {
        const prog_step *s = &p->steps[si];
        rc = s->kind == STEP_NPU ? run_npu_step(p, si, s, err)
                                 : run_host_step(p, si, s, threads, err);
        if (rc)
            return rc;
        p->stats.steps++;
    }
    p->stats.runs++;
    return RJ_OK;
}
