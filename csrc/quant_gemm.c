/* The batched half of quant_gemv.h for Q4_0, Q4_1 and Q8_0 on AVX-512 VNNI: a tiled int8 GEMM.
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
#include "quant_gemv.h"

#include "quant_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX512G __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define TILE 32                            /* output rows of W per tile: two registers of 16 */
#define GROUPS (QUANT_BLOCK / 4)           /* vpdpbusd groups of 4 weights per block */
#define TB_W (GROUPS * 2 * 64)             /* a tile block's weight bytes */
#define TB_BYTES (TB_W + 2 * TILE * 4)     /* ... then 32 scales and 32 mins as floats */
#define RMAX 4                             /* rows of x per micro-kernel call */
#define UNROLL _Pragma("GCC unroll 8")

size_t quant_gemm_work_bytes(int64_t m, int64_t k) {
    const int64_t nb = k / QUANT_BLOCK;
    return (size_t)nb * TB_BYTES + (size_t)m * (size_t)nb * sizeof(int32_t);
}

static const uint8_t zero_block[64];

/* A 16x4-dword transpose in 128-bit lanes: z[i] holds rows 4c + i in lane c; o[d] lane l = row
 * l's dword d. */
static inline AVX512G __attribute__((always_inline)) void transpose4(const __m512i z[4], __m512i o[4]) {
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    o[0] = _mm512_unpacklo_epi64(t0, t2);
    o[1] = _mm512_unpackhi_epi64(t0, t2);
    o[2] = _mm512_unpacklo_epi64(t1, t3);
    o[3] = _mm512_unpackhi_epi64(t1, t3);
}

static inline AVX512G __attribute__((always_inline)) __m512i load_rows(const uint8_t *const src[16], int i, int off) {
    __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(src[i] + off)));
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(src[4 + i] + off)), 1);
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(src[8 + i] + off)), 2);
    return _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(src[12 + i] + off)), 3);
}

/* W rows [0, cnt) (cnt <= TILE; rows beyond are zeros) of nb blocks each into the tile. */
static AVX512G void repack_tile(const int type, const uint8_t *w, size_t row_bytes, int64_t nb, int cnt,
                                uint8_t *tile) {
    const size_t bb = (size_t)quant_block_bytes(type);
    const int qoff = type == QUANT_GGML_Q4_1 ? 4 : 2;
    const __m512i low4 = _mm512_set1_epi8(0x0f), flip = _mm512_set1_epi8((char)0x80);
    const __m512i offs = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int)row_bytes)); /* rows < 2^31 / 16 bytes: checked */
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *tb = tile + (size_t)b * TB_BYTES;
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

void quant_gemm_avx512(int type, const int8_t *xq, size_t q_stride, const float *xd, const float *xs, size_t s_stride,
                       int64_t m, const uint8_t *w, int64_t n, int64_t k, void *work, float *y) {
    const int64_t nb = k / QUANT_BLOCK;
    const size_t row_bytes = (size_t)nb * (size_t)quant_block_bytes(type);
    uint8_t *tile = (uint8_t *)work;
    int32_t *xsum = (int32_t *)(tile + (size_t)nb * TB_BYTES); /* row r's block b: sum of its q_x */
    if (type != QUANT_GGML_Q4_1) {
        for (int64_t r = 0; r < m; r++) {
            for (int64_t b = 0; b < nb; b++) {
                const int8_t *q = xq + (size_t)r * q_stride + (size_t)b * QUANT_BLOCK;
                int32_t s = 0;
                for (int i = 0; i < QUANT_BLOCK; i++) s += q[i];
                xsum[(size_t)r * (size_t)nb + (size_t)b] = s;
            }
        }
    }
    tile_fn *const *fns = type == QUANT_GGML_Q4_0 ? tile_q4_0 : type == QUANT_GGML_Q4_1 ? tile_q4_1 : tile_q8_0;
    for (int64_t j0 = 0; j0 < n; j0 += TILE) {
        const int cnt = n - j0 < TILE ? (int)(n - j0) : TILE;
        repack_tile(type, w + (size_t)j0 * row_bytes, row_bytes, nb, cnt, tile);
        const __mmask16 m0 = lanes_below(cnt), m1 = lanes_below(cnt - 16);
        for (int64_t r0 = 0; r0 < m; r0 += RMAX) {
            const int rr = m - r0 < RMAX ? (int)(m - r0) : RMAX;
            fns[rr - 1](tile, nb, xq + (size_t)r0 * q_stride, q_stride, xd + (size_t)r0 * s_stride,
                        xs + (size_t)r0 * s_stride, xsum + (size_t)r0 * (size_t)nb, s_stride,
                        y + (size_t)r0 * (size_t)n + (size_t)j0, (size_t)n, m0, m1);
        }
    }
}
#else
size_t quant_gemm_work_bytes(int64_t m, int64_t k) { (void)m; (void)k; return 0; }

void quant_gemm_avx512(int type, const int8_t *xq, size_t q_stride, const float *xd, const float *xs, size_t s_stride,
                       int64_t m, const uint8_t *w, int64_t n, int64_t k, void *work, float *y) {
    (void)type; (void)xq; (void)q_stride; (void)xd; (void)xs; (void)s_stride; (void)m; (void)w; (void)n; (void)k;
    (void)work; (void)y;
}
#endif
