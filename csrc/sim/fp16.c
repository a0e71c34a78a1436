/* IEEE binary16 <-> binary32 conversion for the simulator.
 *
 * The NPU's fp16 feature/weight data is IEEE half precision and the DPU output converter
 * rounds fp32 to fp16 with round-half-to-even (conformance case 06 pins half-to-even on 85
 * exact ties; notes: encodings/dpu-lut-activation.md "Two-operand EW"). F16C implements
 * exactly that rounding, so it is used where the compiler targets it; the portable
 * fallback reproduces it bit for bit (subnormals, inf and NaN included). */
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "sim_internal.h"

static inline uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static float f16_to_f32_soft(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    if (exp == 0x1Fu) /* inf / NaN: keep the payload, force quiet */
        return float_of(sign | 0x7F800000u | (man << 13) | (man ? 0x00400000u : 0u));
    if (exp == 0) {
        if (man == 0)
            return float_of(sign);
        /* subnormal: value = man * 2^-24, exact in fp32 */
        float v = (float)man * float_of(0x33800000u); /* 2^-24 */
        return float_of(sign | bits_of(v));
    }
    return float_of(sign | ((exp + 112u) << 23) | (man << 13));
}

static uint16_t f32_to_f16_soft(float f)
{
    uint32_t x = bits_of(f);
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

float rj_f16_to_f32(uint16_t h)
{
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return f16_to_f32_soft(h);
#endif
}

uint16_t rj_f32_to_f16(float f)
{
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    return f32_to_f16_soft(f);
#endif
}

void rj_f16_to_f32_n(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; i++)
        dst[i] = rj_f16_to_f32(src[i]);
}

void rj_f32_to_f16_n(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(void *)(dst + i), h);
    }
#endif
    for (; i < n; i++)
        dst[i] = rj_f32_to_f16(src[i]);
}

/* The portable paths stay compiled (and testable through rj_sim_f16_selftest) even when
 * F16C is available, so a build without F16C cannot drift from the hardware rounding. */
int rj_sim_f16_selftest(void)
{
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float a = f16_to_f32_soft((uint16_t)h);
        float b = rj_f16_to_f32((uint16_t)h);
        if (bits_of(a) != bits_of(b))
            return -(int)h - 1;
        /* NaN payloads may legitimately differ in the quiet bit; skip them on the way back */
        if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu))
            continue;
        if (f32_to_f16_soft(a) != (uint16_t)h || rj_f32_to_f16(a) != (uint16_t)h)
            return -(int)h - 1;
    }
    /* round-half-to-even at ties, and both roundings agree, on a spread of fp32 inputs */
    uint32_t x = 0x12345678u;
    for (int i = 0; i < 2000000; i++) {
        x = x * 1664525u + 1013904223u;
        float f = float_of(x);
        uint16_t s = f32_to_f16_soft(f), hw = rj_f32_to_f16(f);
        if ((s & 0x7C00u) == 0x7C00u && (s & 0x3FFu) && (hw & 0x7C00u) == 0x7C00u && (hw & 0x3FFu))
            continue; /* both NaN */
        if (s != hw)
            return 1 + i;
    }
    return 0;
}
