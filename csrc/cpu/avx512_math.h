/* AVX-512 helpers for the bf16 CPU kernels (activation.c). Include only inside
 * `#if defined(__x86_64__) && defined(__GNUC__)`; every function carries the target attribute,
 * so the files build for the baseline target and these run only where
 * cpu_avx512_bf16_supported() says so. bf16 arithmetic is done in float32: a bf16 value is
 * the top half of a float32, and AVX512_BF16's vcvtneps2bf16 rounds back to nearest even in
 * one instruction (NaNs stay NaN), as torch's conversion does. */
#ifndef RINGLLM_AVX512_MATH_H
#define RINGLLM_AVX512_MATH_H

#include <immintrin.h>
#include <stdint.h>

#include "avx2_math.h"  /* the exp constants */

#define AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#define LANES16 16

static inline AVX512BF16 __m512 load_bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static inline AVX512BF16 __m256i to_bf16x16(__m512 v) {
    return (__m256i)_mm512_cvtneps_pbh(v);
}

static inline AVX512BF16 void store_bf16x16(uint16_t *p, __m512 v) {
    _mm256_storeu_si256((__m256i *)p, to_bf16x16(v));
}

/* v rounded to bf16 and widened back: the value a bf16 tensor would hold between two ops. */
static inline AVX512BF16 __m512 round_bf16x16(__m512 v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16x16(v)), 16));
}

/* e^x, avx2_math.h's exp_clamped (the same constants) on 16 lanes. */
static inline AVX512BF16 __m512 exp16_clamped(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-EXP_MAX_ARG)), _mm512_set1_ps(EXP_MAX_ARG));
    __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(EXP_LOG2E), _mm512_set1_ps(0.5f)),
                                     _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(EXP_LN2_HI), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(EXP_LN2_LO), x);
    __m512 p = _mm512_set1_ps(EXP_P0);
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(EXP_P1));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(EXP_P2));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(EXP_P3));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(EXP_P4));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(EXP_P5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

#endif
