#ifndef RJ_HALF_H
#define RJ_HALF_H
/* IEEE binary16 <-> binary32: the one converter of the C core (runtime host steps, host ops,
 * simulator). Round-half-to-even, as the DPU output converter rounds (conformance case 06 pins
 * half-to-even on 85 exact ties; notes: encodings/dpu-lut-activation.md "Two-operand EW").
 * F16C implements exactly that rounding and is used when the build enables it (x86 builds
 * do, see build_ffi.py); the portable version reproduces it bit for bit (subnormals, inf and
 * NaN, whose payload is kept and made quiet, included) and stays compiled so
 * rj_sim_f16_selftest can compare the two. */
#include <stdint.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline uint32_t rj_half_bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float rj_half_float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float rj_f16_to_f32_soft(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    if (exp == 0x1Fu) /* inf / NaN: keep the payload, force quiet */
        return rj_half_float_of(sign | 0x7F800000u | (man << 13) | (man ? 0x00400000u : 0u));
    if (exp == 0) {
        if (man == 0)
            return rj_half_float_of(sign);
        /* subnormal: value = man * 2^-24, exact in fp32 */
        float v = (float)man * rj_half_float_of(0x33800000u); /* 2^-24 */
        return rj_half_float_of(sign | rj_half_bits_of(v));
    }
    return rj_half_float_of(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t rj_f32_to_f16_soft(float f)
{
    uint32_t x = rj_half_bits_of(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t absx = x & 0x7FFFFFFFu;
    if (absx >= 0x7F800000u) /* inf or NaN */
        return (uint16_t)(sign | 0x7C00u | (absx > 0x7F800000u ? 0x200u | ((absx >> 13) & 0x3FFu) : 0u));
    if (absx >= 0x477FF000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7C00u);
    if (absx < 0x38800000u) { /* below the smallest normal half (2^-14): subnormal or zero */
        if (absx < 0x33000000u) /* < 2^-25: rounds to zero (2^-25 itself ties to even = 0) */
            return sign;
        uint32_t exp = absx >> 23;
        uint32_t man = (absx & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126u - exp; /* 14..24 */
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((absx >> 13) - (112u << 10));
    uint32_t rem = absx & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

static inline float rj_h2f(uint16_t h)
{
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return rj_f16_to_f32_soft(h);
#endif
}

static inline uint16_t rj_f2h(float f)
{
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    return rj_f32_to_f16_soft(f);
#endif
}

#endif /* RJ_HALF_H */
