/* What both tiled int8 GEMMs (quant_gemm.c: 32-weight blocks; quant_kgemm.c: K-quant super-blocks)
 * repack W with: the AVX-512 transpose (16 rows of W become, per group of 4 consecutive weights,
 * one register of 16 rows x 4 bytes, the layout vpdpbusd multiplies against a broadcast dword of
 * x), and the prefetch of the next tile's rows (any ISA). Not part of the cffi interface; x86-64
 * with GCC or Clang only. */
#ifndef RINGLLM_QUANT_TILE_H
#define RINGLLM_QUANT_TILE_H

#include <immintrin.h>
#include <stdint.h>

#define QUANT_TILE_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"), always_inline))

/* A 16x4-dword transpose in 128-bit lanes: z[i] holds rows 4c + i in lane c; o[d] lane l = row
 * l's dword d. */
static inline QUANT_TILE_AVX512 void transpose4(const __m512i z[4], __m512i o[4]) {
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    o[0] = _mm512_unpacklo_epi64(t0, t2);
    o[1] = _mm512_unpackhi_epi64(t0, t2);
    o[2] = _mm512_unpacklo_epi64(t1, t3);
    o[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* 16 bytes at off of rows i, 4 + i, 8 + i and 12 + i of src, one per 128-bit lane (transpose4's z[i]). */
static inline QUANT_TILE_AVX512 __m512i load_rows(const uint8_t *const src[16], int i, int off) {
    __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(src[i] + off)));
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(src[4 + i] + off)), 1);
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(src[8 + i] + off)), 2);
    return _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(src[12 + i] + off)), 3);
}

/* Bytes [at, at + len) of the `ahead` rows after the current tile of `tile` rows at w into L2,
 * while this tile is repacked and multiplied. A tile reads its rows side by side, too many
 * streams for the hardware prefetcher: from DRAM the first touch of each row's block stalled the
 * repack (Zen5, 16 rows of x: Q4_0 39% of a call in the repack against 22% multiplying; with the
 * next tile asked for here 277 -> 431 GOPS a thread, 521 -> 799 on two). */
static inline __attribute__((always_inline)) void tile_prefetch_ahead(const uint8_t *w, size_t row_bytes, int tile,
                                                                      size_t at, size_t len, int ahead) {
    for (int j = 0; j < ahead; j++)
        for (size_t line = 0; line < len; line += 64) /* a block's tail line: the next block's start */
            _mm_prefetch((const char *)(w + (size_t)(tile + j) * row_bytes + at + line), _MM_HINT_T1);
}

/* How many rows of the tile after the one at row j0 a thread's share [first, first + count) holds. */
static inline int tile_rows_ahead(int64_t j0, int64_t first, int64_t count, int tile) {
    const int64_t next = first + count - (j0 + tile);
    return next <= 0 ? 0 : next < tile ? (int)next : tile;
}

#endif
