/* Cube-layout pack/unpack (see rj_layout.h). Plain loops; the innermost copy is one run of
 * contiguous bytes (a cube atom or a weight block row), so memcpy does the work. */
#include <string.h>

#include "rj_layout.h"

static int mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

static uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

/* The fields every layout struct starts its checks with (after its NULL check). */
static int check_common(uint32_t reserved, uint32_t esize, const char *what, rj_err *err)
{
    if (reserved)
        return rj_fail(err, RJ_EINVAL, "%s: reserved field must be zero", what);
    if (esize != 1 && esize != 2 && esize != 4)
        return rj_fail(err, RJ_EINVAL, "%s: element size %u bytes is not 1, 2 or 4", what, esize);
    return 0;
}

/* Validate a cube layout and resolve its strides and extent. */
static int cube_geometry(const rj_cube_layout *l, uint64_t *line, uint64_t *surf, uint64_t *bytes,
                         rj_err *err)
{
    if (!l)
        return rj_fail(err, RJ_EINVAL, "cube layout: NULL layout");
    int rc = check_common(l->reserved, l->esize, "cube layout", err);
    if (rc)
        return rc;
    if (!l->height || !l->width || !l->channels || !l->c2)
        return rj_fail(err, RJ_EINVAL,
                       "cube layout: height %u, width %u, channels %u and c2 %u must all be >= 1",
                       l->height, l->width, l->channels, l->c2);
    uint64_t atom = (uint64_t)l->c2 * l->esize, row, plane;
    if (!mul_ok(l->width, atom, &row))
        return rj_fail(err, RJ_EINVAL, "cube layout: a row of %u positions overflows", l->width);
    *line = l->line_stride ? l->line_stride : row;
    if (*line < row || *line % atom)
        return rj_fail(err, RJ_EINVAL,
                       "cube layout: line stride %llu B must be a multiple of the %llu-byte atom and "
                       "hold %u positions", (unsigned long long)*line, (unsigned long long)atom,
                       l->width);
    if (!mul_ok(l->height, *line, &plane))
        return rj_fail(err, RJ_EINVAL, "cube layout: %u lines overflow", l->height);
    *surf = l->surf_stride ? l->surf_stride : plane;
    if (*surf < plane || *surf % atom)
        return rj_fail(err, RJ_EINVAL,
                       "cube layout: surface stride %llu B must be a multiple of the %llu-byte atom "
                       "and hold %u lines of %llu B", (unsigned long long)*surf,
                       (unsigned long long)atom, l->height, (unsigned long long)*line);
    uint64_t groups = ceil_div(l->channels, l->c2), head;
    if (!mul_ok(groups - 1, *surf, &head) || __builtin_add_overflow(head, plane, bytes))
        return rj_fail(err, RJ_EINVAL, "cube layout: %llu channel groups overflow",
                       (unsigned long long)groups);
    return 0;
}

static int dense_bytes(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t *out)
{
    return mul_ok(a, b, out) && mul_ok(*out, c, out) && mul_ok(*out, d, out);
}

int rj_cube_bytes(const rj_cube_layout *l, uint64_t *out, rj_err *err)
{
    uint64_t line = 0, surf = 0, bytes = 0;
    int rc = cube_geometry(l, &line, &surf, &bytes, err);
    if (out)
        *out = rc ? 0 : bytes;
    return rc;
}

static int size_check(const char *what, const char *side, uint64_t have, uint64_t need, rj_err *err)
{
    if (have < need)
        return rj_fail(err, RJ_EINVAL, "%s: the %s buffer holds %llu bytes, the layout needs %llu",
                       what, side, (unsigned long long)have, (unsigned long long)need);
    return 0;
}

/* What every pack/unpack checks before it touches memory: the row-major size did not overflow
 * (plain_ok), both buffers exist and hold what the copy reads and writes (plain bytes row-major,
 * cube bytes in the layout). A pack then zeroes its part of the cube (padding no run writes)
 * just before it fills it. */
static int check_buffers(const char *what, int plain_ok, uint64_t plain, uint64_t cube,
                         const void *src, uint64_t src_size, void *dst, uint64_t dst_size, int pack,
                         rj_err *err)
{
    if (!plain_ok)
        return rj_fail(err, RJ_EINVAL, "%s: the row-major tensor size overflows", what);
    if (!src || !dst)
        return rj_fail(err, RJ_EINVAL, "%s: NULL buffer", what);
    int rc = size_check(what, "source", src_size, pack ? plain : cube, err);
    if (!rc)
        rc = size_check(what, "destination", dst_size, pack ? cube : plain, err);
    return rc;
}

/* Blocks [b0, b1) of `n` for part `part` of `nparts`: contiguous, in order, covering all. */
static int part_range(uint64_t n, uint32_t part, uint32_t nparts, uint64_t *b0, uint64_t *b1,
                      const char *what, rj_err *err)
{
    if (!nparts || part >= nparts)
        return rj_fail(err, RJ_EINVAL, "%s: part %u of %u does not exist", what, part, nparts);
    *b0 = n * part / nparts;
    *b1 = n * (part + 1) / nparts;
    return 0;
}

/* One run of n bytes between offset plain of the row-major tensor and offset cube of the
 * layout, in the copy's direction. */
static inline void move(uint8_t *d, const uint8_t *s, uint64_t cube, uint64_t plain, uint64_t n,
                        int pack)
{
    if (pack)
        memcpy(d + cube, s + plain, n);
    else
        memcpy(d + plain, s + cube, n);
}

/* pack = 1: row-major -> cube; pack = 0: cube -> row-major; lines [h0, h1) of part `part`. */
static int cube_copy(const rj_cube_layout *l, const void *src, uint64_t src_size, void *dst,
                     uint64_t dst_size, int pack, uint32_t part, uint32_t nparts, rj_err *err)
{
    const char *what = pack ? "rj_cube_pack" : "rj_cube_unpack";
    uint64_t line = 0, surf = 0, bytes = 0, plain = 0, hs = 0, he = 0;
    int rc = cube_geometry(l, &line, &surf, &bytes, err);
    if (rc)
        return rc;
    const int plain_ok = dense_bytes(l->height, l->width, l->channels, l->esize, &plain);
    rc = check_buffers(what, plain_ok, plain, bytes, src, src_size, dst, dst_size, pack, err);
    if (!rc)
        rc = part_range(l->height, part, nparts, &hs, &he, what, err);
    if (rc)
        return rc;

    const uint8_t *s = src;
    uint8_t *d = dst;
    const uint64_t e = l->esize, c2 = l->c2, C = l->channels, W = l->width;
    const uint64_t groups = ceil_div(C, c2);
    const uint64_t last = (C - (groups - 1) * c2) * e;   /* live bytes of the last atom */
    if (pack) {
        /* the part's lines of every group, and (last part) the gaps between the groups'
         * surfaces: the parts together zero the layout's whole extent */
        for (uint64_t g = 0; g < groups; g++) {
            memset(d + g * surf + hs * line, 0, (he - hs) * line);
            if (he == l->height && g + 1 < groups)
                memset(d + g * surf + l->height * line, 0, surf - l->height * line);
        }
    }
    /* Blocks of HB lines: within a block each channel group's atoms are read as one run of
     * whole cache lines and the block's rows (hot in L1) are written piecewise. Walking a
     * whole group's surface per pass (or every group per position) instead thrashes one L1
     * set when the surface stride is a multiple of 4 KiB. A block spans up to 64 KiB of rows
     * (at least 8 lines, at most 64): the longer each group's run, the fewer short streams
     * the cache's prefetchers must follow at once (Whisper's 1500 x 512 fp16 output cube:
     * 64 groups of 128-byte runs at 8 lines; ~1.5-2x faster at 64). */
    const uint64_t row_bytes = W * C * e;
    uint64_t HB = row_bytes ? (64u << 10) / row_bytes : 64;
    HB = HB < 8 ? 8 : HB > 64 ? 64 : HB;
    for (uint64_t h0 = hs; h0 < he; h0 += HB) {
        const uint64_t h1 = h0 + HB < he ? h0 + HB : he;
        for (uint64_t g = 0; g < groups; g++) {
            const uint64_t run = g + 1 < groups ? c2 * e : last;
            for (uint64_t h = h0; h < h1; h++) {
                const uint64_t atom = g * surf + h * line, p = (h * W * C + g * c2) * e;
                if (run == 16) {   /* a constant size: the compiler moves it inline */
                    for (uint64_t w = 0; w < W; w++)
                        move(d, s, atom + w * 16, p + w * C * e, 16, pack);
                } else {
                    for (uint64_t w = 0; w < W; w++)
                        move(d, s, atom + w * c2 * e, p + w * C * e, run, pack);
                }
            }
        }
    }
    return 0;
}

int rj_cube_pack(const rj_cube_layout *l, const void *src, uint64_t src_size, void *dst,
                 uint64_t dst_size, rj_err *err)
{
    return cube_copy(l, src, src_size, dst, dst_size, 1, 0, 1, err);
}

int rj_cube_unpack(const rj_cube_layout *l, const void *src, uint64_t src_size, void *dst,
                   uint64_t dst_size, rj_err *err)
{
    return cube_copy(l, src, src_size, dst, dst_size, 0, 0, 1, err);
}

/* ---- direct-conv / matmul weights ------------------------------------------------------- */

static int weight_geometry(const rj_weight_layout *l, uint64_t *np, uint64_t *kp, uint64_t *bytes,
                           rj_err *err)
{
    if (!l)
        return rj_fail(err, RJ_EINVAL, "weight layout: NULL layout");
    int rc = check_common(l->reserved, l->esize, "weight layout", err);
    if (rc)
        return rc;
    if (!l->kernels || !l->channels || !l->kh || !l->kw || !l->n_group || !l->k_group)
        return rj_fail(err, RJ_EINVAL,
                       "weight layout: kernels %u, channels %u, kernel %ux%u and groups %u/%u must "
                       "all be >= 1", l->kernels, l->channels, l->kh, l->kw, l->n_group,
                       l->k_group);
    *np = ceil_div(l->kernels, l->n_group) * l->n_group;
    *kp = ceil_div(l->channels, l->k_group) * l->k_group;
    uint64_t taps = (uint64_t)l->kh * l->kw;
    if (!dense_bytes(*np, *kp, taps, l->esize, bytes))
        return rj_fail(err, RJ_EINVAL, "weight layout: size overflows");
    return 0;
}

int rj_weight_bytes(const rj_weight_layout *l, uint64_t *out, rj_err *err)
{
    uint64_t np = 0, kp = 0, bytes = 0;
    int rc = weight_geometry(l, &np, &kp, &bytes, err);
    if (out)
        *out = rc ? 0 : bytes;
    return rc;
}

/* Kernel groups [b0, b1) of part `part`: each group's cube bytes are one contiguous block. */
static int weight_copy(const rj_weight_layout *l, const void *src, uint64_t src_size, void *dst,
                       uint64_t dst_size, int pack, uint32_t part, uint32_t nparts, rj_err *err)
{
    const char *what = pack ? "rj_weight_pack" : "rj_weight_unpack";
    uint64_t np = 0, kp = 0, bytes = 0, plain = 0, b0 = 0, b1 = 0;
    int rc = weight_geometry(l, &np, &kp, &bytes, err);
    if (rc)
        return rc;
    const int plain_ok = dense_bytes(l->kernels, l->channels, (uint64_t)l->kh * l->kw, l->esize,
                                     &plain);
    rc = check_buffers(what, plain_ok, plain, bytes, src, src_size, dst, dst_size, pack, err);
    if (!rc)
        rc = part_range(np / l->n_group, part, nparts, &b0, &b1, what, err);
    if (rc)
        return rc;

    const uint8_t *s = src;
    uint8_t *d = dst;
    const uint64_t e = l->esize, N = l->kernels, K = l->channels, KH = l->kh, KW = l->kw;
    const uint64_t ng = l->n_group, kg = l->k_group, taps = KH * KW, kb = kp / kg;
    const uint64_t block = kp * taps * ng * e, n0 = b0 * ng, n1 = b1 * ng < N ? b1 * ng : N;
    if (pack)
        memset(d + b0 * block, 0, (b1 - b0) * block);
    if (taps == 1) {
        /* 1x1 kernels (every matmul): a kernel's channels inside one K group are one run */
        for (uint64_t n = n0; n < n1; n++) {
            for (uint64_t k = 0; k < K; k += kg) {
                const uint64_t run = (K - k < kg ? K - k : kg) * e;
                const uint64_t cube = (((n / ng) * kb + k / kg) * ng * kg + (n % ng) * kg) * e;
                const uint64_t p = (n * K + k) * e;
                move(d, s, cube, p, run, pack);
            }
        }
        return 0;
    }
    for (uint64_t n = n0; n < n1; n++) {
        for (uint64_t k = 0; k < K; k++) {
            const uint64_t block0 = ((n / ng) * kb + k / kg) * taps;
            const uint64_t inner = (n % ng) * kg + k % kg;
            for (uint64_t t = 0; t < taps; t++) {
                const uint64_t cube = ((block0 + t) * ng * kg + inner) * e;
                const uint64_t p = ((n * K + k) * taps + t) * e;
                move(d, s, cube, p, e, pack);
            }
        }
    }
    return 0;
}

int rj_weight_pack(const rj_weight_layout *l, const void *src, uint64_t src_size, void *dst,
                   uint64_t dst_size, rj_err *err)
{
    return weight_copy(l, src, src_size, dst, dst_size, 1, 0, 1, err);
}

int rj_weight_unpack(const rj_weight_layout *l, const void *src, uint64_t src_size, void *dst,
                     uint64_t dst_size, rj_err *err)
{
    return weight_copy(l, src, src_size, dst, dst_size, 0, 0, 1, err);
}

/* ---- depthwise weights ---------------------------------------------------------------- */

static int dw_geometry(const rj_dw_weight_layout *l, uint64_t *cp, uint64_t *bytes, rj_err *err)
{
    if (!l)
        return rj_fail(err, RJ_EINVAL, "depthwise weight layout: NULL layout");
    int rc = check_common(l->reserved, l->esize, "depthwise weight layout", err);
    if (rc)
        return rc;
    if (!l->channels || !l->kh || !l->kw || !l->group)
        return rj_fail(err, RJ_EINVAL,
                       "depthwise weight layout: channels %u, kernel %ux%u and group %u must all "
                       "be >= 1", l->channels, l->kh, l->kw, l->group);
    *cp = ceil_div(l->channels, l->group) * l->group;
    if (!dense_bytes(*cp, l->kh, l->kw, l->esize, bytes))
        return rj_fail(err, RJ_EINVAL, "depthwise weight layout: size overflows");
    return 0;
}

int rj_dw_weight_bytes(const rj_dw_weight_layout *l, uint64_t *out, rj_err *err)
{
    uint64_t cp = 0, bytes = 0;
    int rc = dw_geometry(l, &cp, &bytes, err);
    if (out)
        *out = rc ? 0 : bytes;
    return rc;
}

/* Channel groups [b0, b1) of part `part`: each group's cube bytes are one contiguous block. */
static int dw_copy(const rj_dw_weight_layout *l, const void *src, uint64_t src_size, void *dst,
                   uint64_t dst_size, int pack, uint32_t part, uint32_t nparts, rj_err *err)
{
    const char *what = pack ? "rj_dw_weight_pack" : "rj_dw_weight_unpack";
    uint64_t cp = 0, bytes = 0, plain = 0, b0 = 0, b1 = 0;
    int rc = dw_geometry(l, &cp, &bytes, err);
    if (rc)
        return rc;
    const int plain_ok = dense_bytes(l->channels, l->kh, l->kw, l->esize, &plain);
    rc = check_buffers(what, plain_ok, plain, bytes, src, src_size, dst, dst_size, pack, err);
    if (!rc)
        rc = part_range(cp / l->group, part, nparts, &b0, &b1, what, err);
    if (rc)
        return rc;

    const uint8_t *s = src;
    uint8_t *d = dst;
    const uint64_t e = l->esize, G = l->group, taps = (uint64_t)l->kh * l->kw;
    const uint64_t block = taps * G * e, c0 = b0 * G, c1 = b1 * G < l->channels ? b1 * G : l->channels;
    if (pack)
        memset(d + b0 * block, 0, (b1 - b0) * block);
    for (uint64_t c = c0; c < c1; c++) {
        for (uint64_t t = 0; t < taps; t++) {
            const uint64_t cube = (((c / G) * taps + t) * G + c % G) * e;
            const uint64_t p = (c * taps + t) * e;
            move(d, s, cube, p, e, pack);
        }
    }
    return 0;
}

int rj_dw_weight_pack(const rj_dw_weight_layout *l, const void *src, uint64_t src_size, void *dst,
                      uint64_t dst_size, rj_err *err)
{
    return dw_copy(l, src, src_size, dst, dst_size, 1, 0, 1, err);
}

int rj_dw_weight_unpack(const rj_dw_weight_layout *l, const void *src, uint64_t src_size,
                        void *dst, uint64_t dst_size, rj_err *err)
{
    return dw_copy(l, src, src_size, dst, dst_size, 0, 0, 1, err);
}

/* ---- parts ---------------------------------------------------------------------------- */

uint64_t rj_cube_blocks(const rj_cube_layout *l) { return l ? l->height : 0; }

uint64_t rj_weight_blocks(const rj_weight_layout *l)
{
    return l && l->n_group ? ceil_div(l->kernels, l->n_group) : 0;
}

uint64_t rj_dw_weight_blocks(const rj_dw_weight_layout *l)
{
    return l && l->group ? ceil_div(l->channels, l->group) : 0;
}

int rj_cube_convert_part(const rj_cube_layout *l, int pack, const void *src, uint64_t src_size,
                         void *dst, uint64_t dst_size, uint32_t part, uint32_t nparts, rj_err *err)
{
    return cube_copy(l, src, src_size, dst, dst_size, pack != 0, part, nparts, err);
}

int rj_weight_convert_part(const rj_weight_layout *l, int pack, const void *src, uint64_t src_size,
                           void *dst, uint64_t dst_size, uint32_t part, uint32_t nparts, rj_err *err)
{
    return weight_copy(l, src, src_size, dst, dst_size, pack != 0, part, nparts, err);
}

int rj_dw_weight_convert_part(const rj_dw_weight_layout *l, int pack, const void *src,
                              uint64_t src_size, void *dst, uint64_t dst_size, uint32_t part,
                              uint32_t nparts, rj_err *err)
{
    return dw_copy(l, src, src_size, dst, dst_size, pack != 0, part, nparts, err);
}
