/* Reading GGUF K-quant super-blocks (Q4_K, Q5_K, Q6_K; the layout is in quant_kquants.c's header
 * comment), shared by the GEMV (quant_kquants.c) and the tiled GEMM (quant_kgemm.c): the weights'
 * side only (the activations' is quant_kgemm.h); not part of the cffi interface. */
#ifndef RINGLLM_QUANT_KBLOCK_H
#define RINGLLM_QUANT_KBLOCK_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "quant_types.h"

/* The 8 six-bit scales and mins of Q4_K/Q5_K's 12 scale bytes s: for j < 4, sc[j] = s[j] & 63,
 * mn[j] = s[j + 4] & 63, sc[j + 4] = s[j + 8] & 15 | s[j] >> 6 << 4, mn[j + 4] = s[j + 8] >> 4 |
 * s[j + 4] >> 6 << 4; four bytes at a time in 32-bit words (x86 is little-endian). */
static inline void k4_scales(const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    uint32_t a, b, c, v[2];
    memcpy(&a, s, 4);
    memcpy(&b, s + 4, 4);
    memcpy(&c, s + 8, 4);
    v[0] = a & 0x3f3f3f3fu;
    v[1] = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u);
    memcpy(sc, v, 8);
    v[0] = b & 0x3f3f3f3fu;
    v[1] = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u);
    memcpy(mn, v, 8);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define KBLOCK_F16C __attribute__((target("avx2,fma,f16c"), always_inline))
#define KBLOCK_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vnni"), always_inline))
/* Loops over a super-block's chunks unrolled, so arrays of registers indexed by them stay in
 * registers and a chunk's shifts are constants: at -O2 GCC kept them as loops, u[] and the scales
 * went through the stack (a store and a reload per chunk in the GEMV's inner loop) and AVX2's
 * shifts were computed. Unrolled, the Q4_K GEMV went from 20.4 to 27.9 GB/s on one Zen5 thread
 * (its AVX2 path on the same core 16.5 -> 27.5; Q6_K 27.9 -> 33.5 and 18.6 -> 25.2). */
#define KBLOCK_UNROLL _Pragma("GCC unroll 8")

static inline KBLOCK_F16C float half_f16c(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

static inline KBLOCK_AVX512 __m512i halves8(int lo, int hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi8((char)lo)), _mm256_set1_epi8((char)hi), 1);
}

static inline KBLOCK_AVX512 __m512i halves16(int lo, int hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)lo)), _mm256_set1_epi16((short)hi), 1);
}

/* A super-block's 256 weights as unsigned u (0..63, in the file's weight order): u[c] holds
 * weights 64c .. 64c + 63. */
static inline KBLOCK_AVX512 void kblock_u_avx512(const int type, const uint8_t *blk, __m512i u[4]) {
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    if (type == QUANT_GGML_Q6_K) {
        KBLOCK_UNROLL for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512((const void *)(blk + 64 * h));
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
            KBLOCK_UNROLL for (int half = 0; half < 2; half++) {
                const __m512i lo = _mm512_and_si512(half ? _mm512_srli_epi16(ql, 4) : ql, low4);
                const __m512i hi = _mm512_slli_epi16(_mm512_srlv_epi16(qh, halves16(4 * half, 4 * half + 2)), 4);
                u[2 * h + half] = _mm512_or_si512(lo, _mm512_and_si512(hi, _mm512_set1_epi8(0x30)));
            }
        }
        return;
    }
    const uint8_t *qs = blk + (type == QUANT_GGML_Q5_K ? 48 : 16);
    const __m512i qh = type == QUANT_GGML_Q5_K ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)))
                                               : _mm512_setzero_si512();
    KBLOCK_UNROLL for (int c = 0; c < 4; c++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        u[c] = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1), low4);
        if (type == QUANT_GGML_Q5_K)
            u[c] = _mm512_mask_add_epi8(u[c], _mm512_test_epi8_mask(qh, halves8(1 << (2 * c), 1 << (2 * c + 1))), u[c],
                                        _mm512_set1_epi8(16));
    }
}
#endif

#endif
