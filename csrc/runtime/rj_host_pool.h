#ifndef RJ_HOST_POOL_H
#define RJ_HOST_POOL_H
/* Host steps on several CPU threads (host_pool.c).
 *
 * A host step that moves at least RJ_HOST_SPLIT_MIN_BYTES (the bytes it reports: read +
 * written) is cut into contiguous ranges of its outer loop (a host op's outermost iteration
 * dimension that has room for the threads, a cube's lines, a weight layout's kernel or channel
 * groups). Each range writes its own disjoint part of the output, so the result is the same
 * bits as one thread's; which thread runs which range changes nothing.
 *
 * The threads are the caller plus a process-wide pool of workers, started on the first step
 * that splits and joined by rj_host_pool_shutdown (also run when the library unloads). While
 * one call uses the pool, a call from another thread runs its step alone: never a wait on
 * another caller, never a deadlock.
 *
 * Thread count: rj_host_threads_set (rockjit.runtime.set_host_threads), else the environment
 * flag RJ_HOST_THREADS, else rj_host_threads_default(): RJ_HOST_THREADS_DEFAULT on a host with
 * at least one more CPU than that (the board: 8), else one thread per CPU but one (a 2-CPU
 * build machine runs host steps on one thread: its cores are busy with the tests already).
 * 1 turns splitting off.
 *
 * Why 3 by default: the RK3588 has 4 Cortex-A76 cores (and 4 A55s); three de-tile while the
 * fourth keeps the Python caller and the driver's interrupt work, which is how the published
 * multicore library's figures were taken (its workers de-tile their slices on 3 A76 cores:
 * notes perf/rga-detile.md; rockjit/cost/published.py, host_threads=3). The threshold keeps
 * small steps, where a wake-up (some microseconds) costs more than the split saves, on one
 * thread: at the A76's ~1 GB/s strided rate 256 KiB is ~0.25 ms of work. The cost model
 * (rockjit/cost/from_program.py) reads these numbers through the binding and charges each
 * step at rj_host_step_plan_threads, the function the runtime itself uses. */
#include <stdint.h>

#include "rj_err.h"

enum {
    RJ_HOST_THREADS_DEFAULT = 3,
    RJ_HOST_THREADS_MAX = 8,
    RJ_HOST_SPLIT_MIN_BYTES = 262144, /* 256 KiB */
};

/* The process-wide thread count for host steps: n in 1..RJ_HOST_THREADS_MAX, or 0 to go back
 * to RJ_HOST_THREADS / the default. */
int rj_host_threads_set(uint32_t n, rj_err *err);
/* min(RJ_HOST_THREADS_DEFAULT, online CPUs - 1), at least 1: the count when nothing is set. */
uint32_t rj_host_threads_default(void);
/* The count in effect; an error (and *out = 1) when RJ_HOST_THREADS holds no valid count. */
int rj_host_threads_get(uint32_t *out, rj_err *err);

/* Threads a step runs on given `threads` available: 1 below the threshold, else at most
 * `threads` and at most the ranges its outer loop has. `desc`: the host-op descriptor of a
 * host-op step (RJ_HOST_COPY..RJ_HOST_IOTA; the runtime reads it from the step's aux
 * operand), NULL for a layout step. 0 when the step or descriptor is invalid. */
struct rj_host_step;
struct rj_host_op;
uint32_t rj_host_step_plan_threads(const struct rj_host_step *step, const struct rj_host_op *desc,
                                   uint32_t threads);

/* Join the pool's workers (a later split starts them again). Safe at any time: a step in
 * flight finishes its ranges on the threads that remain. */
void rj_host_pool_shutdown(void);
/* Worker threads alive now (tests: none leak, none before the first split). */
uint32_t rj_host_pool_workers(void);

/* ---- inside the runtime ---------------------------------------------------------------- */

/* Ranges of a split step: fn(ctx, item, err) for every item in 0..nitems-1. */
typedef int (*rj_host_item_fn)(void *ctx, uint32_t item, rj_err *err);
/* Run the items on up to `threads` threads (the caller included); returns 0, or the error of
 * the lowest-numbered failing item (copied into err). *used (may be NULL) gets the threads
 * the items were offered to: 1 when the pool is busy with another caller. */
int rj_host_parallel(uint32_t nitems, uint32_t threads, rj_host_item_fn fn, void *ctx,
                     uint32_t *used, rj_err *err);
/* Items to cut `extent` outer ranges into for `threads` threads: a few per thread, so a
 * late-waking worker costs only its share. */
uint32_t rj_host_split_items(uint64_t extent, uint32_t threads);
/* The thread count a step of `bytes` whose outer loop has `extent` ranges gets. */
uint32_t rj_host_split_threads(uint64_t bytes, uint64_t extent, uint32_t threads);

/* The host-op library on `threads` threads (rj_host_op_run is this with 1); *used (may be
 * NULL) gets the threads the op ran on. */
struct rj_host_buf;
struct rj_bo;
int rj_host_op_run_threads(const struct rj_host_op *op, const struct rj_host_buf *bufs,
                           uint32_t nbufs, uint32_t threads, uint64_t *bytes, uint32_t *used,
                           rj_err *err);
/* Threads a valid descriptor runs on given `threads` (0: the descriptor is invalid). */
uint32_t rj_host_op_plan_threads(const struct rj_host_op *op, uint32_t threads);
int rj_host_op_step_run_threads(const struct rj_host_step *step, struct rj_bo *const *bos,
                                uint32_t nbos, uint32_t threads, uint64_t *bytes, uint32_t *used,
                                rj_err *err);
/* A host step (any kind) on `threads` threads: rj_host_step_run with a thread count. */
int rj_host_step_run_threads(const struct rj_host_step *step, struct rj_bo *const *bos,
                             uint32_t nbos, uint32_t threads, uint64_t *bytes, uint32_t *used,
                             rj_err *err);

#endif /* RJ_HOST_POOL_H */
