#ifndef RJ_LAYOUT_H
#define RJ_LAYOUT_H
/* Host-side pack/unpack between row-major arrays and the NPU cube layouts: the C twin of
 * rockjit/lowering/layouts.py, byte for byte (tests/lowering/test_layouts_c.py).
 *
 * The NPU has no on-chip layout conversion (notes: matmul-as-conv.md), so the runtime's host
 * steps scatter inputs into these layouts and gather outputs back. Elements are copied as raw
 * little-endian bytes (1, 2 or 4 per element), so one routine serves every datatype.
 *
 * Feature/output cube (notes: encodings/tile-layouts.md): row-major [H][W][C] <->
 *   byte(h, w, c) = (c / c2) * surf_stride + h * line_stride + w * c2 * esize + (c % c2) * esize
 * Direct-conv / matmul weights (conformance 01, 04): [N][K][KH][KW] <->
 *   [N/n_group][K/k_group][KH][KW][n_group][k_group], N and K zero-padded to whole groups
 * Depthwise weights (conformance 09, notes: depthwise-conv.md): [C][KH][KW] <-> [C/G][KH][KW][G]
 * Packing zero-fills every padding byte of the layout's extent. */
#include <stdint.h>

#include "rj_err.h"

typedef struct rj_cube_layout {
    uint32_t height;
    uint32_t width;
    uint32_t channels;
    uint32_t c2;           /* channels per atom */
    uint32_t esize;        /* bytes per element: 1, 2 or 4 */
    uint32_t reserved;     /* must be zero */
    uint64_t line_stride;  /* bytes between rows; 0 = dense (width * c2 * esize) */
    uint64_t surf_stride;  /* bytes between channel groups; 0 = dense (height * line_stride) */
} rj_cube_layout;

typedef struct rj_weight_layout {
    uint32_t kernels;
    uint32_t channels;
    uint32_t kh;
    uint32_t kw;
    uint32_t n_group;
    uint32_t k_group;
    uint32_t esize;
    uint32_t reserved;     /* must be zero */
} rj_weight_layout;

typedef struct rj_dw_weight_layout {
    uint32_t channels;
    uint32_t kh;
    uint32_t kw;
    uint32_t group;
    uint32_t esize;
    uint32_t reserved;     /* must be zero */
} rj_dw_weight_layout;

/* Bytes the layout spans (0 and an error when the layout is invalid). */
int rj_cube_bytes(const rj_cube_layout *l, uint64_t *out, rj_err *err);
int rj_weight_bytes(const rj_weight_layout *l, uint64_t *out, rj_err *err);
int rj_dw_weight_bytes(const rj_dw_weight_layout *l, uint64_t *out, rj_err *err);

/* src/dst sizes are checked against the layout; 0 or a negative RJ_E* code. */
int rj_cube_pack(const rj_cube_layout *l, const void *src, uint64_t src_size,
                 void *dst, uint64_t dst_size, rj_err *err);
int rj_cube_unpack(const rj_cube_layout *l, const void *src, uint64_t src_size,
                   void *dst, uint64_t dst_size, rj_err *err);
int rj_weight_pack(const rj_weight_layout *l, const void *src, uint64_t src_size,
                   void *dst, uint64_t dst_size, rj_err *err);
int rj_weight_unpack(const rj_weight_layout *l, const void *src, uint64_t src_size,
                     void *dst, uint64_t dst_size, rj_err *err);
int rj_dw_weight_pack(const rj_dw_weight_layout *l, const void *src, uint64_t src_size,
                      void *dst, uint64_t dst_size, rj_err *err);
int rj_dw_weight_unpack(const rj_dw_weight_layout *l, const void *src, uint64_t src_size,
                        void *dst, uint64_t dst_size, rj_err *err);

/* The same copies in parts, for several threads: the outer blocks (a cube's lines, a weight
 * layout's kernel groups, a depthwise layout's channel groups; rj_*_blocks) are cut into
 * `nparts` contiguous runs and part `part` copies one of them (pack = 1: row-major -> layout).
 * The parts of one copy write disjoint bytes (a pack zero-fills only its own) and together
 * exactly what the whole call writes, the same bits. Each part runs the full checks. */
uint64_t rj_cube_blocks(const rj_cube_layout *l);
uint64_t rj_weight_blocks(const rj_weight_layout *l);
uint64_t rj_dw_weight_blocks(const rj_dw_weight_layout *l);
int rj_cube_convert_part(const rj_cube_layout *l, int pack, const void *src, uint64_t src_size,
                         void *dst, uint64_t dst_size, uint32_t part, uint32_t nparts, rj_err *err);
int rj_weight_convert_part(const rj_weight_layout *l, int pack, const void *src, uint64_t src_size,
                           void *dst, uint64_t dst_size, uint32_t part, uint32_t nparts, rj_err *err);
int rj_dw_weight_convert_part(const rj_dw_weight_layout *l, int pack, const void *src,
                              uint64_t src_size, void *dst, uint64_t dst_size, uint32_t part,
                              uint32_t nparts, rj_err *err);

#endif /* RJ_LAYOUT_H */
