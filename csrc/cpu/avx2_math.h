/* Small AVX2 helpers shared by the CPU kernels (gemv_bf16.c, paged_attention.c,
 * activation.c). Include only inside `#if defined(__x86_64__) && defined(__GNUC__)`;
 * every function carries the avx2/fma target attribute, so the files themselves build for
 * the baseline target and the kernels run only where cpu_kernels_supported() says so. */
#ifndef RINGLLM_AVX2_MATH_H
#define RINGLLM_AVX2_MATH_H

#include <immintrin.h>
#include <stdint.h>

#define AVX2 __attribute__((target("avx2,fma")))
#define LANES 8
/* Loops over a few rows or vectors with constant bounds: fully unrolled, their
 * accumulators live in registers (at -O2 GCC otherwise keeps them in memory, 2-3x slower). */
#define UNROLL _Pragma("GCC unroll 8")

/* 8 bf16 values (bit patterns) widened to float32: bf16 is the top half of a float32. */
static inline AVX2 __m256 load_bf16x8(const uint16_t *p) {
    __m128i half = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

static inline AVX2 float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(s);
}

static inline AVX2 float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* e^x, Cephes' expf polynomial (relative error ~2e-7) with x clamped to [-87, 87], where
 * the result is still a normal float: softmax weights below e^-87 and silu's tails are
 * then within float rounding of exact. */
/* Cephes' expf: the clamp, the split of x into n ln2 + r (ln2 in two parts) and the polynomial
 * in r, shared by exp_clamped here and avx512_math.h's 16-lane version. */
#define EXP_MAX_ARG 87.0f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO (-2.12194440e-4f)
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

static inline AVX2 __m256 exp_clamped(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-EXP_MAX_ARG)), _mm256_set1_ps(EXP_MAX_ARG));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(EXP_LOG2E), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(EXP_LN2_HI), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(EXP_LN2_LO), x);
    __m256 p = _mm256_set1_ps(EXP_P0);
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(EXP_P1));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(EXP_P2));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(EXP_P3));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(EXP_P4));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(EXP_P5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

#endif
