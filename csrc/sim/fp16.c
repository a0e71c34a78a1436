/* The simulator's fp16 entry points (sim_internal.h) over the C core's one converter,
 * rj_half.h, plus vector forms and the selftest of the portable path against F16C. */
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "rj_half.h"
#include "sim_internal.h"

float rj_f16_to_f32(uint16_t h)
{
    return rj_h2f(h);
}

uint16_t rj_f32_to_f16(float f)
{
    return rj_f2h(f);
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
        float a = rj_f16_to_f32_soft((uint16_t)h);
        float b = rj_f16_to_f32((uint16_t)h);
        if (rj_half_bits_of(a) != rj_half_bits_of(b))
            return -(int)h - 1;
        /* NaN payloads may legitimately differ in the quiet bit; skip them on the way back */
        if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu))
            continue;
        if (rj_f32_to_f16_soft(a) != (uint16_t)h || rj_f32_to_f16(a) != (uint16_t)h)
            return -(int)h - 1;
    }
    /* round-half-to-even at ties, and both roundings agree, on a spread of fp32 inputs */
    uint32_t x = 0x12345678u;
    for (int i = 0; i < 2000000; i++) {
        x = x * 1664525u + 1013904223u;
        float f = rj_half_float_of(x);
        uint16_t s = rj_f32_to_f16_soft(f), hw = rj_f32_to_f16(f);
        if ((s & 0x7C00u) == 0x7C00u && (s & 0x3FFu) && (hw & 0x7C00u) == 0x7C00u && (hw & 0x3FFu))
            continue; /* both NaN */
        if (s != hw)
            return 1 + i;
    }
    return 0;
}
