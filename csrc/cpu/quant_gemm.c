/* The batched half of quant_gemv.h for Q4_0, Q4_1 and Q8_0 on AVX-512 VNNI (AVX2 below): a tiled
 * int8 GEMM.
 *
 * Why: the GEMV kernel keeps one row of W in lanes and reduces each block's products across
 * lanes, once per row of x; at 64 rows that reduction, not the multiply, was the time (2x
 * oneDNN's bf16 GEMM). Here the output features are the lanes instead (an outer product), so
 * no reduction is left:
 *
 * - W is taken TILE (32) output rows at a time and repacked once per call into a scratch tile:
 *   per block, 8 groups of 4 consecutive weights, each group as two registers of 16 rows x 4
 *   unsigned bytes (vpdpbusd's layout), beside the block's 32 scales (and Q4_1's mins) as
 *   floats. The nibbles need no reordering: dword i of a Q4 block's quants holds weights
 *   4i..4i+3 in its low nibbles and 16+4i.. in its high ones, so a 16x4-dword transpose per
 *   block (in 128-bit lanes) and a mask or a shift give the groups in natural order.
 * - Every row of x then multiplies the tile: per row and group, one broadcast dword of its
 *   int8 block (x is quantized per 32-block as for the GEMV) and one vpdpbusd per 16 outputs;
 *   per block, one convert and two FMAs (scale d_w d_x; Q4_1's min term m_w s_x) per 16
 *   outputs. R rows at once share each tile load.
 * - Q4_0 and Q8_0 weights are unsigned with an offset (q_w - 8; Q8_0 as q_w + 128, its sign
 *   bit flipped), so each block's int32 sum starts at -offset * sum(q_x) instead of 0: exact.
 *
 * Compiled for the baseline target; the functions carry their target attributes and run only
 * after quant_gemv checked CPUID. */
#include "quant_gemm.h"

#include "parallel.h"
#include "quant_types.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "quant_tile.h"

#define AVX512G __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define TILE 32                            /* output rows of W per tile: two registers of 16 */
#define GROUPS (QUANT_BLOCK / 4)           /* vpdpbusd groups of 4 weights per block */
#define TB_W (GROUPS * 2 * 64)             /* a tile block's weight bytes */
#define TB_BYTES (TB_W + 2 * TILE * 4)     /* ... then 32 scales and 32 mins as floats */
#define RMAX 4                             /* rows of x per micro-kernel call (6 measured no faster) */
#define UNROLL _Pragma("GCC unroll 8")

_Static_assert(TILE == QUANT_GEMM_TILE, "the tile the header names");

size_t quant_gemm_tile_bytes(int64_t k) { return (size_t)(k / QUANT_BLOCK) * TB_BYTES; }

/* One repacked tile per thread (par_max_threads: the tiles of W split over the pool), then the
 * rows' block sums. */
size_t quant_gemm_work_bytes(int64_t m, int64_t k) {
    return (size_t)par_max_threads() * quant_gemm_tile_bytes(k) + (size_t)m * (size_t)(k / QUANT_BLOCK) * sizeof(int32_t);
}

static const uint8_t zero_block[64];

/* W rows [0, cnt) (cnt <= TILE; rows beyond are zeros) of nb blocks each into the tile. */
static AVX512G void repack_tile(const int type, const uint8_t *w, size_t row_bytes, int64_t nb, int cnt,
                                int ahead, uint8_t *tile) {
    const size_t bb = (size_t)quant_block_bytes(type);
    const int qoff = type == QUANT_GGML_Q4_1 ? 4 : 2;
    const __m512i low4 = _mm512_set1_epi8(0x0f), flip = _mm512_set1_epi8((char)0x80);
    const __m512i offs = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int)row_bytes)); /* rows < 2^31 / 16 bytes: checked */
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *tb = tile + (size_t)b * TB_BYTES;
        tile_prefetch_ahead(w, row_bytes, TILE, (size_t)b * bb, bb, ahead);
        float *dw = (float *)(tb + TB_W), *cw = dw + TILE;
        for (int h = 0; h < 2; h++) {
            const uint8_t *src[16];
            for (int l = 0; l < 16; l++) {
                const int j = 16 * h + l;
                src[l] = j < cnt ? w + (size_t)j * row_bytes + (size_t)b * bb : zero_block;
            }
            /* a dword at each row's block start: its f16 d, then Q4_1's f16 m (else quant bytes) */
            const int live = cnt - 16 * h;
            const __mmask16 lm = live >= 16 ? (__mmask16)0xFFFF : live <= 0 ? 0 : (__mmask16)((1u << live) - 1);
            const __m512i raw = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), lm, offs,
                                                            w + (size_t)(16 * h) * row_bytes + (size_t)b * bb, 1);
            _mm512_store_ps(dw + 16 * h, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw)));
            _mm512_store_ps(cw + 16 * h, type == QUANT_GGML_Q4_1 ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(raw, 16)))
                                                                 : _mm512_setzero_ps());
            for (int part = 0; part < (type == QUANT_GGML_Q8_0 ? 2 : 1); part++) {
                __m512i z[4], o[4];
                UNROLL for (int i = 0; i < 4; i++) z[i] = load_rows(src, i, qoff + 16 * part);
                transpose4(z, o);
                UNROLL for (int d = 0; d < 4; d++) {
                    if (type == QUANT_GGML_Q8_0) {
                        _mm512_store_si512((void *)(tb + (size_t)(2 * (4 * part + d) + h) * 64), _mm512_xor_si512(o[d], flip));
                    } else {
                        _mm512_store_si512((void *)(tb + (size_t)(2 * d + h) * 64), _mm512_and_si512(o[d], low4));
                        _mm512_store_si512((void *)(tb + (size_t)(2 * (4 + d) + h) * 64),
                                           _mm512_and_si512(_mm512_srli_epi16(o[d], 4), low4));
                    }
                }
            }
        }
    }
}

/* y[r, 0:32] (masks m0, m1 for a short tile) for R rows of x against one repacked tile. */
static inline AVX512G __attribute__((always_inline)) void tile_rows(
    const int type, const int R, const uint8_t *tile, int64_t nb, const int8_t *xq, size_t q_stride,
    const float *xd, const float *xs, const int32_t *xsum, size_t s_stride, float *y, size_t n, __mmask16 m0,
    __mmask16 m1) {
    const int off = type == QUANT_GGML_Q4_0 ? 8 : 128; /* Q4_0 / Q8_0 weight offset */
    __m512 acc[RMAX][2];
    UNROLL for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *tb = tile + (size_t)b * TB_BYTES;
        __m512i is[RMAX][2];
        UNROLL for (int r = 0; r < R; r++)
            is[r][0] = is[r][1] = type == QUANT_GGML_Q4_1 ? _mm512_setzero_si512()
                                                          : _mm512_set1_epi32(-off * xsum[(size_t)r * (size_t)nb + (size_t)b]);
        const int8_t *xb = xq + (size_t)b * QUANT_BLOCK;
        UNROLL for (int g = 0; g < GROUPS; g++) {
            const __m512i w0 = _mm512_load_si512((const void *)(tb + (size_t)g * 128));
            const __m512i w1 = _mm512_load_si512((const void *)(tb + (size_t)g * 128 + 64));
            UNROLL for (int r = 0; r < R; r++) {
                int32_t xv;
                memcpy(&xv, xb + (size_t)r * q_stride + 4 * g, 4);
                const __m512i x4 = _mm512_set1_epi32(xv);
                is[r][0] = _mm512_dpbusd_epi32(is[r][0], w0, x4);
                is[r][1] = _mm512_dpbusd_epi32(is[r][1], w1, x4);
            }
        }
        const __m512 dw0 = _mm512_load_ps((const float *)(tb + TB_W)), dw1 = _mm512_load_ps((const float *)(tb + TB_W) + 16);
        UNROLL for (int r = 0; r < R; r++) {
            const __m512 dx = _mm512_set1_ps(xd[(size_t)r * s_stride + (size_t)b]);
            acc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[r][0]), _mm512_mul_ps(dw0, dx), acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[r][1]), _mm512_mul_ps(dw1, dx), acc[r][1]);
        }
        if (type == QUANT_GGML_Q4_1) {
            const __m512 cw0 = _mm512_load_ps((const float *)(tb + TB_W) + TILE);
            const __m512 cw1 = _mm512_load_ps((const float *)(tb + TB_W) + TILE + 16);
            UNROLL for (int r = 0; r < R; r++) {
                const __m512 sx = _mm512_set1_ps(xs[(size_t)r * s_stride + (size_t)b]);
                acc[r][0] = _mm512_fmadd_ps(cw0, sx, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(cw1, sx, acc[r][1]);
            }
        }
    }
    UNROLL for (int r = 0; r < R; r++) {
        _mm512_mask_storeu_ps(y + (size_t)r * n, m0, acc[r][0]);
        _mm512_mask_storeu_ps(y + (size_t)r * n + 16, m1, acc[r][1]);
    }
}

typedef void tile_fn(const uint8_t *, int64_t, const int8_t *, size_t, const float *, const float *, const int32_t *,
                     size_t, float *, size_t, __mmask16, __mmask16);

/* One entry per (type, rows) so both are constants inside: registers, no branches. */
#define TILE_INSTANCE(T, TNAME, R)                                                                              \
    static AVX512G void tile_##TNAME##_##R(const uint8_t *tile, int64_t nb, const int8_t *xq, size_t q_stride,      \
                                           const float *xd, const float *xs, const int32_t *xsum, size_t s_stride, \
                                           float *y, size_t n, __mmask16 m0, __mmask16 m1) {                       \
        tile_rows(T, R, tile, nb, xq, q_stride, xd, xs, xsum, s_stride, y, n, m0, m1);                             \
    }
#define TILE_INSTANCES(T, TNAME)                                                                    \
    TILE_INSTANCE(T, TNAME, 1) TILE_INSTANCE(T, TNAME, 2) TILE_INSTANCE(T, TNAME, 3) TILE_INSTANCE(T, TNAME, 4) \
    static tile_fn *const tile_##TNAME[RMAX] = {tile_##TNAME##_1, tile_##TNAME##_2, tile_##TNAME##_3, tile_##TNAME##_4};

TILE_INSTANCES(QUANT_GGML_Q4_0, q4_0)
TILE_INSTANCES(QUANT_GGML_Q4_1, q4_1)
TILE_INSTANCES(QUANT_GGML_Q8_0, q8_0)

static inline __mmask16 lanes_below(int c) { return c >= 16 ? (__mmask16)0xFFFF : c <= 0 ? 0 : (__mmask16)((1u << c) - 1); }

void quant_gemm_avx512_rows(int type, const int8_t *xq, size_t q_stride, const float *xd, const float *xs,
                            const int32_t *xsum, size_t s_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k,
                            int64_t first, int64_t count, void *tile, float *y) {
    const int64_t nb = k / QUANT_BLOCK;
    const size_t row_bytes = (size_t)nb * (size_t)quant_block_bytes(type);
    tile_fn *const *fns = type == QUANT_GGML_Q4_0 ? tile_q4_0 : type == QUANT_GGML_Q4_1 ? tile_q4_1 : tile_q8_0;
    for (int64_t j0 = first; j0 < first + count; j0 += TILE) {
        const int cnt = n - j0 < TILE ? (int)(n - j0) : TILE;
        repack_tile(type, w + (size_t)j0 * row_bytes, row_bytes, nb, cnt, tile_rows_ahead(j0, first, count, TILE), tile);
        const __mmask16 m0 = lanes_below(cnt), m1 = lanes_below(cnt - 16);
        for (int64_t r0 = 0; r0 < m; r0 += RMAX) {
            const int rr = m - r0 < RMAX ? (int)(m - r0) : RMAX;
            fns[rr - 1](tile, nb, xq + (size_t)r0 * q_stride, q_stride, xd + (size_t)r0 * s_stride,
                        xs + (size_t)r0 * s_stride, xsum + (size_t)r0 * (size_t)nb, s_stride,
                        y + (size_t)r0 * (size_t)n + (size_t)j0, (size_t)n, m0, m1);
        }
    }
}

void quant_gemm_avx512(int type, const int8_t *xq, size_t q_stride, const float *xd, const float *xs, size_t s_stride,
                       int64_t m, const uint8_t *w, int64_t n, int64_t k, void *work, float *y) {
    const int64_t nb = k / QUANT_BLOCK;
    const size_t tile_bytes = quant_gemm_tile_bytes(k);
    int32_t *xsum = (int32_t *)((uint8_t *)work + (size_t)par_max_threads() * tile_bytes); /* row r's block b: sum of its q_x */
    if (type != QUANT_GGML_Q4_1) quant_gemm_block_sums(xq, q_stride, m, nb, xsum);
    PAR_SLICES((size_t)n * (size_t)nb * (size_t)quant_block_bytes(type), (n + TILE - 1) / TILE, 1, t0, tc,
               quant_gemm_avx512_rows(type, xq, q_stride, xd, xs, xsum, s_stride, m, w, n, k, t0 * TILE, tc * TILE,
                                      (uint8_t *)work + (size_t)par_thread() * tile_bytes, y));
}

/* ---- AVX2: the same tile, 8 outputs per register ------------------------------------ *
 * vpmaddubsw multiplies u8 by s8 and adds pairs into int16. Q4 products stay small
 * (|pair| <= 2 * 15 * 127), so a block's 8 groups add up in int16 (<= 30480) and widen once
 * per block; Q8_0 is kept signed in the tile (|w| times x with w's sign moved onto x: a pair
 * can reach 2 * 128 * 127, so it widens per group). */
#define AVX2G __attribute__((target("avx2,fma,f16c")))
#define RMAX2 3 /* 2 measured slower; at 3 a few accumulators spill */

static inline AVX2G __attribute__((always_inline)) void transpose4_avx2(const __m256i z[4], __m256i o[4]) {
    const __m256i t0 = _mm256_unpacklo_epi32(z[0], z[1]), t1 = _mm256_unpackhi_epi32(z[0], z[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(z[2], z[3]), t3 = _mm256_unpackhi_epi32(z[2], z[3]);
    o[0] = _mm256_unpacklo_epi64(t0, t2);
    o[1] = _mm256_unpackhi_epi64(t0, t2);
    o[2] = _mm256_unpacklo_epi64(t1, t3);
    o[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* repack_tile's layout, built 8 rows at a time; Q8_0's quants stay signed (no offset). */
static AVX2G void repack_tile_avx2(const int type, const uint8_t *w, size_t row_bytes, int64_t nb, int cnt,
                                   int ahead, uint8_t *tile) {
    const size_t bb = (size_t)quant_block_bytes(type);
    const int qoff = type == QUANT_GGML_Q4_1 ? 4 : 2;
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *tb = tile + (size_t)b * TB_BYTES;
        tile_prefetch_ahead(w, row_bytes, TILE, (size_t)b * bb, bb, ahead);
        float *dw = (float *)(tb + TB_W), *cw = dw + TILE;
        for (int q = 0; q < TILE / 8; q++) { /* rows 8q .. 8q + 7: 32 bytes at 32 q in each group's 128 */
            const uint8_t *src[8];
            for (int l = 0; l < 8; l++) {
                const int j = 8 * q + l;
                src[l] = j < cnt ? w + (size_t)j * row_bytes + (size_t)b * bb : zero_block;
                uint16_t h[2];
                memcpy(h, src[l], 4);
                dw[j] = _cvtsh_ss(h[0]);
                cw[j] = type == QUANT_GGML_Q4_1 ? _cvtsh_ss(h[1]) : 0.0f;
            }
            for (int part = 0; part < (type == QUANT_GGML_Q8_0 ? 2 : 1); part++) {
                __m256i z[4], o[4];
                UNROLL for (int i = 0; i < 4; i++)
                    z[i] = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(src[4 + i] + qoff + 16 * part)),
                                            _mm_loadu_si128((const __m128i *)(src[i] + qoff + 16 * part)));
                transpose4_avx2(z, o);
                UNROLL for (int d = 0; d < 4; d++) {
                    if (type == QUANT_GGML_Q8_0) {
                        _mm256_store_si256((__m256i *)(tb + (size_t)(4 * part + d) * 128 + 32 * (size_t)q), o[d]);
                    } else {
                        _mm256_store_si256((__m256i *)(tb + (size_t)d * 128 + 32 * (size_t)q), _mm256_and_si256(o[d], low4));
                        _mm256_store_si256((__m256i *)(tb + (size_t)(4 + d) * 128 + 32 * (size_t)q),
                                           _mm256_and_si256(_mm256_srli_epi16(o[d], 4), low4));
                    }
                }
            }
        }
    }
}

/* tile_rows for 16 outputs (half h of the tile: 2 registers), R rows of x; lanes at or past
 * `live` outputs are not stored. */
static inline AVX2G __attribute__((always_inline)) void tile_rows_avx2(
    const int type, const int R, const uint8_t *tile, int64_t nb, const int8_t *xq, size_t q_stride,
    const float *xd, const float *xs, const int32_t *xsum, size_t s_stride, float *y, size_t n, int live) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[RMAX2][2];
    UNROLL for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *tb = tile + (size_t)b * TB_BYTES;
        __m256i is[RMAX2][2];
        UNROLL for (int r = 0; r < R; r++) is[r][0] = is[r][1] = _mm256_setzero_si256();
        const int8_t *xb = xq + (size_t)b * QUANT_BLOCK;
        for (int g = 0; g < GROUPS; g++) { /* not unrolled: gcc then hoists all loads and spills */
            const __m256i w0 = _mm256_load_si256((const __m256i *)(tb + (size_t)g * 128));
            const __m256i w1 = _mm256_load_si256((const __m256i *)(tb + (size_t)g * 128 + 32));
            const __m256i u0 = type == QUANT_GGML_Q8_0 ? _mm256_abs_epi8(w0) : w0;
            const __m256i u1 = type == QUANT_GGML_Q8_0 ? _mm256_abs_epi8(w1) : w1;
            UNROLL for (int r = 0; r < R; r++) {
                int32_t xv;
                memcpy(&xv, xb + (size_t)r * q_stride + 4 * g, 4);
                const __m256i x4 = _mm256_set1_epi32(xv);
                if (type == QUANT_GGML_Q8_0) {
                    is[r][0] = _mm256_add_epi32(is[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(u0, _mm256_sign_epi8(x4, w0)), ones));
                    is[r][1] = _mm256_add_epi32(is[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(u1, _mm256_sign_epi8(x4, w1)), ones));
                } else {
                    is[r][0] = _mm256_add_epi16(is[r][0], _mm256_maddubs_epi16(u0, x4));
                    is[r][1] = _mm256_add_epi16(is[r][1], _mm256_maddubs_epi16(u1, x4));
                }
            }
        }
        const float *dwp = (const float *)(tb + TB_W);
        const __m256 dw0 = _mm256_loadu_ps(dwp), dw1 = _mm256_loadu_ps(dwp + 8);
        UNROLL for (int r = 0; r < R; r++) {
            __m256i i0 = is[r][0], i1 = is[r][1];
            if (type != QUANT_GGML_Q8_0) {
                i0 = _mm256_madd_epi16(i0, ones);
                i1 = _mm256_madd_epi16(i1, ones);
            }
            if (type == QUANT_GGML_Q4_0) {
                const __m256i c = _mm256_set1_epi32(-8 * xsum[(size_t)r * (size_t)nb + (size_t)b]);
                i0 = _mm256_add_epi32(i0, c);
                i1 = _mm256_add_epi32(i1, c);
            }
            const __m256 dx = _mm256_set1_ps(xd[(size_t)r * s_stride + (size_t)b]);
            acc[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(dw0, dx), acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(dw1, dx), acc[r][1]);
            if (type == QUANT_GGML_Q4_1) {
                const __m256 sx = _mm256_set1_ps(xs[(size_t)r * s_stride + (size_t)b]);
                acc[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(dwp + TILE), sx, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(dwp + TILE + 8), sx, acc[r][1]);
            }
        }
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(live), lane);
    const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(live - 8), lane);
    UNROLL for (int r = 0; r < R; r++) {
        _mm256_maskstore_ps(y + (size_t)r * n, m0, acc[r][0]);
        _mm256_maskstore_ps(y + (size_t)r * n + 8, m1, acc[r][1]);
    }
}

typedef void tile2_fn(const uint8_t *, int64_t, const int8_t *, size_t, const float *, const float *, const int32_t *,
                      size_t, float *, size_t, int);

#define TILE2_INSTANCE(T, TNAME, R)                                                                              \
    static AVX2G void tile2_##TNAME##_##R(const uint8_t *tile, int64_t nb, const int8_t *xq, size_t q_stride,       \
                                          const float *xd, const float *xs, const int32_t *xsum, size_t s_stride,  \
                                          float *y, size_t n, int live) {                                          \
        tile_rows_avx2(T, R, tile, nb, xq, q_stride, xd, xs, xsum, s_stride, y, n, live);                         \
    }
#define TILE2_INSTANCES(T, TNAME)                                                           \
    TILE2_INSTANCE(T, TNAME, 1) TILE2_INSTANCE(T, TNAME, 2) TILE2_INSTANCE(T, TNAME, 3)     \
    static tile2_fn *const tile2_##TNAME[RMAX2] = {tile2_##TNAME##_1, tile2_##TNAME##_2, tile2_##TNAME##_3};

TILE2_INSTANCES(QUANT_GGML_Q4_0, q4_0)
TILE2_INSTANCES(QUANT_GGML_Q4_1, q4_1)
TILE2_INSTANCES(QUANT_GGML_Q8_0, q8_0)

void quant_gemm_block_sums(const int8_t *xq, size_t q_stride, int64_t m, int64_t nb, int32_t *xsum) {
    for (int64_t r = 0; r < m; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const int8_t *q = xq + (size_t)r * q_stride + (size_t)b * QUANT_BLOCK;
            int32_t s = 0;
            for (int i = 0; i < QUANT_BLOCK; i++) s += q[i];
            xsum[(size_t)r * (size_t)nb + (size_t)b] = s;
        }
    }
}

void quant_gemm_avx2_rows(int type, const int8_t *xq, size_t q_stride, const float *xd, const float *xs,
                          const int32_t *xsum, size_t s_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k,
                          int64_t first, int64_t count, void *tile, float *y) {
    const int64_t nb = k / QUANT_BLOCK;
    const size_t row_bytes = (size_t)nb * (size_t)quant_block_bytes(type);
    tile2_fn *const *fns = type == QUANT_GGML_Q4_0 ? tile2_q4_0 : type == QUANT_GGML_Q4_1 ? tile2_q4_1 : tile2_q8_0;
    for (int64_t j0 = first; j0 < first + count; j0 += TILE) {
        const int cnt = n - j0 < TILE ? (int)(n - j0) : TILE;
        repack_tile_avx2(type, w + (size_t)j0 * row_bytes, row_bytes, nb, cnt, tile_rows_ahead(j0, first, count, TILE), tile);
        for (int h = 0; 16 * h < cnt; h++) {
            for (int64_t r0 = 0; r0 < m; r0 += RMAX2) {
                const int rr = m - r0 < RMAX2 ? (int)(m - r0) : RMAX2;
                fns[rr - 1]((const uint8_t *)tile + 64 * h, nb, xq + (size_t)r0 * q_stride, q_stride,
                            xd + (size_t)r0 * s_stride, xs + (size_t)r0 * s_stride, xsum + (size_t)r0 * (size_t)nb,
                            s_stride, y + (size_t)r0 * (size_t)n + (size_t)j0 + 16 * (size_t)h, (size_t)n, cnt - 16 * h);
            }
        }
    }
}

void quant_gemm_avx2(int type, const int8_t *xq, size_t q_stride, const float *xd, const float *xs, size_t s_stride,
                     int64_t m, const uint8_t *w, int64_t n, int64_t k, void *work, float *y) {
    const int64_t nb = k / QUANT_BLOCK;
    const size_t tile_bytes = quant_gemm_tile_bytes(k);
    int32_t *xsum = (int32_t *)((uint8_t *)work + (size_t)par_max_threads() * tile_bytes);
    if (type == QUANT_GGML_Q4_0) quant_gemm_block_sums(xq, q_stride, m, nb, xsum);
    PAR_SLICES((size_t)n * (size_t)nb * (size_t)quant_block_bytes(type), (n + TILE - 1) / TILE, 1, t0, tc,
               quant_gemm_avx2_rows(type, xq, q_stride, xd, xs, xsum, s_stride, m, w, n, k, t0 * TILE, tc * TILE,
                                    (uint8_t *)work + (size_t)par_thread() * tile_bytes, y));
}
#else
size_t quant_gemm_work_bytes(int64_t m, int64_t k) { (void)m; (void)k; return 0; }

void quant_gemm_avx512(int type, const int8_t *xq, size_t q_stride, const float *xd, const float *xs, size_t s_stride,
                       int64_t m, const uint8_t *w, int64_t n, int64_t k, void *work, float *y) {
    (void)type; (void)xq; (void)q_stride; (void)xd; (void)xs; (void)s_stride; (void)m; (void)w; (void)n; (void)k;
    (void)work; (void)y;
}

void quant_gemm_avx2(int type, const int8_t *xq, size_t q_stride, const float *xd, const float *xs, size_t s_stride,
                     int64_t m, const uint8_t *w, int64_t n, int64_t k, void *work, float *y) {
    quant_gemm_avx512(type, xq, q_stride, xd, xs, s_stride, m, w, n, k, work, y);
}
#endif
