/* Fused host steps (RJ_HOST_FUSED, rj_host_ops.h): a list of element-wise host ops run in
 * order as one runtime step. Each op is the host-op library's own (checked by
 * rj_host_op_check, run by its kernels), so a fused step computes every bit as the same ops
 * as separate steps would; what it saves is the per-step dispatch of chains of tiny ops. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rj_host_fused.h"

#define FAIL(code, ...) rj_fail(err, code, __VA_ARGS__)

_Static_assert(sizeof(rj_host_fused) == 16, "rj_host_fused is shared with Python and bundles");
_Static_assert(sizeof(rj_host_fused_op) == 464, "rj_host_fused_op is shared with Python and bundles");

static int slot_buf(rj_bo *const *bos, uint32_t nbos, uint32_t bo, uint64_t offset, int slot,
                    rj_host_buf *out, rj_err *err)
{
    out->data = NULL;
    out->size = 0;
    if (bo == RJ_NO_BO) {
        if (offset)
            return FAIL(RJ_EINVAL, "host step fused: slot %d is unused (RJ_NO_BO) but has offset "
                        "%llu; leave it 0", slot, (unsigned long long)offset);
        return RJ_OK;
    }
    if (bo >= nbos || !bos[bo])
        return FAIL(RJ_EINVAL, "host step fused: slot %d names BO %u, but the program has %u BOs",
                    slot, bo, nbos);
    if (offset > bos[bo]->size)
        return FAIL(RJ_EFAULT, "host step fused: slot %d offset %llu is past the end of BO %u "
                    "(%llu bytes)", slot, (unsigned long long)offset, bo,
                    (unsigned long long)bos[bo]->size);
    out->data = bos[bo]->host + offset;
    out->size = bos[bo]->size - offset;
    return RJ_OK;
}

/* The step's records (a malloc'd copy in *ops, nops of them) and slot buffers, every op
 * checked against its slots. */
static int fused_resolve(const rj_host_step *s, rj_bo *const *bos, uint32_t nbos,
                         rj_host_fused_op **ops, uint32_t *nops, rj_host_buf *slots, rj_err *err)
{
    *ops = NULL;
    *nops = 0;
    if (!s)
        return FAIL(RJ_EINVAL, "host step fused: NULL step");
    if (s->rows || s->cols || s->eps != 0.0f)
        return FAIL(RJ_EINVAL, "host step fused: rows, cols and eps are unused and must be 0");
    for (int i = 2; i < 8; i++)
        if (s->param[i])
            return FAIL(RJ_EINVAL, "host step fused: param[%d] = %u is unused and must be 0", i,
                        s->param[i]);
    if (s->src.row_stride || s->dst.row_stride || s->aux.row_stride)
        return FAIL(RJ_EINVAL, "host step fused: operand row strides must be 0 (the records "
                    "carry the strides)");
    rj_host_buf db;
    int rc = slot_buf(bos, nbos, s->aux.bo, s->aux.offset, -1, &db, err);
    if (rc)
        return rc;
    rj_host_fused h;
    if (!db.data || db.size < sizeof h)
        return FAIL(RJ_EFAULT, "host step fused: no room for its descriptor at BO %u offset %llu",
                    s->aux.bo, (unsigned long long)s->aux.offset);
    memcpy(&h, db.data, sizeof h);
    if (h.magic != RJ_HOST_FUSED_MAGIC || h.version != RJ_HOST_FUSED_VERSION || h.reserved)
        return FAIL(RJ_EINVAL, "host step fused: no fused descriptor at BO %u offset %llu (magic "
                    "0x%08x version %u reserved %u): write its bytes before adding the step",
                    s->aux.bo, (unsigned long long)s->aux.offset, h.magic, h.version, h.reserved);
    if (h.nops < 1 || h.nops > RJ_HOST_FUSED_MAX_OPS)
        return FAIL(RJ_EINVAL, "host step fused: %u ops, it takes 1..%u", h.nops,
                    RJ_HOST_FUSED_MAX_OPS);
    uint64_t need = sizeof h + (uint64_t)h.nops * sizeof(rj_host_fused_op);
    if (db.size < need)
        return FAIL(RJ_EFAULT, "host step fused: its %u records need %llu bytes at BO %u offset "
                    "%llu, the BO has %llu left", h.nops, (unsigned long long)need, s->aux.bo,
                    (unsigned long long)s->aux.offset, (unsigned long long)db.size);
    const uint32_t bo[RJ_HOST_FUSED_SLOTS] = {s->dst.bo, s->src.bo, s->param[0], s->param[1]};
    const uint64_t off[RJ_HOST_FUSED_SLOTS] = {s->dst.offset, s->src.offset, s->param64[0],
                                               s->param64[1]};
    for (int k = 0; k < RJ_HOST_FUSED_SLOTS; k++)
        if ((rc = slot_buf(bos, nbos, bo[k], off[k], k, &slots[k], err)))
            return rc;
    if (!slots[0].data)
        return FAIL(RJ_EINVAL, "host step fused: slot 0 (dst) is unused; every op writes there");
    rj_host_fused_op *rec = malloc(h.nops * sizeof(*rec));
    if (!rec)
        return FAIL(RJ_ENOMEM, "host step fused: out of memory for %u records", h.nops);
    memcpy(rec, db.data + sizeof h, h.nops * sizeof(*rec));
    for (uint32_t k = 0; k < h.nops; k++) {
        const rj_host_op *op = &rec[k].op;
        const char *why = NULL;
        if (op->kind != RJ_HOST_COPY && op->kind != RJ_HOST_UNARY && op->kind != RJ_HOST_BINARY &&
            op->kind != RJ_HOST_COMPARE)
            why = "is not an element-wise op (copy, unary, binary, compare)";
        else if (op->ninputs + 1 > RJ_HOST_MAX_OPERANDS)
            why = "has too many inputs";
        else if (rec[k].slot[0] != 0)
            why = "writes a slot other than 0 (dst)";
        for (uint32_t v = 0; !why && v < RJ_HOST_MAX_OPERANDS; v++) {
            uint32_t sl = rec[k].slot[v];
            if (v > op->ninputs ? sl != 0 : sl >= RJ_HOST_FUSED_SLOTS || !slots[sl].data)
                why = v > op->ninputs ? "sets a slot for an operand it does not have"
                                      : "names a slot that is not set";
        }
        if (why) {
            rc = FAIL(RJ_EINVAL, "host step fused: op %u of %u (kind %s) %s", k, h.nops,
                      rj_host_op_kind_name(op->kind), why);
            free(rec);
            return rc;
        }
        rj_host_buf b[RJ_HOST_MAX_OPERANDS];
        for (uint32_t v = 0; v <= op->ninputs; v++)
            b[v] = slots[rec[k].slot[v]];
        if ((rc = rj_host_op_check(op, b, op->ninputs + 1, err))) {
            if (err) {
                char msg[sizeof err->msg];
                snprintf(msg, sizeof msg, "host step fused: op %u of %u: %.980s", k, h.nops,
                         err->msg);
                memcpy(err->msg, msg, sizeof msg);
            }
            free(rec);
            return rc;
        }
    }
    *ops = rec;
    *nops = h.nops;
    return RJ_OK;
}

int rj_host_fused_exec(const rj_host_step *s, rj_bo *const *bos, uint32_t nbos, int check_only,
                       uint64_t *bytes, rj_err *err)
{
    if (bytes)
        *bytes = 0;
    rj_host_fused_op *rec;
    uint32_t n;
    rj_host_buf slots[RJ_HOST_FUSED_SLOTS];
    int rc = fused_resolve(s, bos, nbos, &rec, &n, slots, err);
    if (rc || check_only) {
        free(rec);
        return rc;
    }
    uint64_t total = 0;
    for (uint32_t k = 0; k < n && !rc; k++) {
        rj_host_buf b[RJ_HOST_MAX_OPERANDS];
        for (uint32_t v = 0; v <= rec[k].op.ninputs; v++)
            b[v] = slots[rec[k].slot[v]];
        uint64_t moved = 0;
        rc = rj_host_op_run(&rec[k].op, b, rec[k].op.ninputs + 1, &moved, err);
        total += moved;
    }
    free(rec);
    if (!rc && bytes)
        *bytes = total;
    return rc;
}

int rj_host_fused_prepare(const rj_host_step *s, rj_bo *const *bos, uint32_t nbos,
                          rj_host_prepared **out, rj_err *err)
{
    *out = NULL;
    rj_host_fused_op *rec;
    uint32_t n;
    rj_host_buf slots[RJ_HOST_FUSED_SLOTS];
    int rc = fused_resolve(s, bos, nbos, &rec, &n, slots, err);
    if (rc)
        return rc;
    rj_host_prepared *head = NULL;
    for (uint32_t k = 0; k < n && !rc; k++) {
        rj_host_buf b[RJ_HOST_MAX_OPERANDS];
        for (uint32_t v = 0; v <= rec[k].op.ninputs; v++)
            b[v] = slots[rec[k].slot[v]];
        rj_host_prepared *p = NULL;
        rc = rj_host_prepare_op(&rec[k].op, b, rec[k].op.ninputs + 1, &p, err);
        if (!rc) {
            if (head)
                rj_host_prepared_chain(head, p);
            else
                head = p;
        }
    }
    free(rec);
    if (rc) {
        rj_host_prepared_free(head);
        return rc;
    }
    *out = head;
    return RJ_OK;
}
