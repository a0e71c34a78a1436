#ifndef RJ_HOST_FUSED_H
#define RJ_HOST_FUSED_H
/* Internal to the runtime: fused host steps (RJ_HOST_FUSED, rj_host_ops.h) and the piece of
 * the host-op library they are built from (one op checked and planned on given buffers). */
#include "runtime/rj_host_ops.h"
#include "runtime/rj_runtime.h"

/* Check `op` against `bufs` and plan it; *out then runs it (rj_host_prepared_run). */
int rj_host_prepare_op(const rj_host_op *op, const rj_host_buf *bufs, uint32_t nbufs,
                       rj_host_prepared **out, rj_err *err);
/* Append `next` to the chain of `p`: running p runs every op of the chain, in order, on one
 * thread; freeing p frees them all. */
void rj_host_prepared_chain(rj_host_prepared *p, rj_host_prepared *next);

/* A fused step checked and, unless check_only, run (the unprepared path). */
int rj_host_fused_exec(const rj_host_step *s, rj_bo *const *bos, uint32_t nbos, int check_only,
                       uint64_t *bytes, rj_err *err);
/* A fused step resolved, checked and planned once: a chain of prepared ops. */
int rj_host_fused_prepare(const rj_host_step *s, rj_bo *const *bos, uint32_t nbos,
                          rj_host_prepared **out, rj_err *err);

#endif /* RJ_HOST_FUSED_H */
