/* A GEMV with the tiled GEMM's arithmetic (quant_gemm.c), for quant_gemv_row_invariant's
 * small row counts on AVX-512 VNNI: Q4_0, Q4_1 and Q8_0.
 *
 * Why: a row's result must not depend on how many rows share the call (deterministic runs),
 * so below the GEMM's threshold the rows must come out bit for bit as the GEMM computes them.
 * Running the GEMM itself at one row repacks every weight tile per call, ~3x the GEMV's time
 * in a decode step. The GEMM computes, per output j and row r, in block order b:
 *   acc = fma((float)isum_b, d_w,b * d_x,b, acc)          (then Q4_1: acc = fma(m_w,b, s_x,b, acc))
 * with isum_b the block's exact int32 dot product (Q4_0's and Q8_0's offsets folded in exactly).
 * The int32 sums are exact whatever their order, so only this float chain must be the same:
 * here 16 outputs are the lanes as in the GEMM, each one's block dot is a vpdpbusd over the
 * file's own blocks (two outputs a register), reduced across lanes in int32, then the same two
 * FMAs. Checked against the GEMM bit for bit in tests/unit/test_deterministic.py.
 *
 * Compiled for the baseline target; the functions carry their target attributes and run only
 * after the caller checked CPUID. */
#include "quant_gemv_ordered.h"

#include "quant_types.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX512O __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vnni")))
#define RMAX 4 /* rows of x sharing one unpacking of the weights */

static const int32_t even_lanes[16] = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
static const int32_t odd_lanes[16] = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};

/* a + b's lanes pairwise summed: a's pair sums in lanes 0-7, b's in 8-15. */
static inline AVX512O __attribute__((always_inline)) __m512i fold(__m512i a, __m512i b, __m512i ev, __m512i od) {
    return _mm512_add_epi32(_mm512_permutex2var_epi32(a, ev, b), _mm512_permutex2var_epi32(a, od, b));
}

/* d[q]: lanes 0-7 output 2q's partial sums, 8-15 output 2q + 1's; returns lane l = output l's sum. */
static inline AVX512O __attribute__((always_inline)) __m512i reduce16(const __m512i d[8], __m512i ev, __m512i od) {
    const __m512i e0 = fold(d[0], d[1], ev, od), e1 = fold(d[2], d[3], ev, od);
    const __m512i e2 = fold(d[4], d[5], ev, od), e3 = fold(d[6], d[7], ev, od);
    return fold(fold(e0, e1, ev, od), fold(e2, e3, ev, od), ev, od);
}

static inline AVX512O __attribute__((always_inline)) void ordered_rows(
    const int type, const int R, const int8_t *xq, size_t q_stride, const float *xd, const float *xs, size_t s_stride,
    const int32_t *xsum, int64_t nb, const uint8_t *w, size_t row_bytes, int64_t j0, int cnt, float *y, size_t n) {
    const size_t n_rows = n; /* y's row length is W's row count */
    const size_t bb = (size_t)quant_block_bytes(type);
    const size_t qoff = type == QUANT_GGML_Q4_1 ? 4 : 2;
    const __m512i ev = _mm512_loadu_si512((const void *)even_lanes), od = _mm512_loadu_si512((const void *)odd_lanes);
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i offs = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int)row_bytes)); /* rows < 2^31 / 16 bytes: checked */
    const __mmask16 live = cnt >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cnt) - 1);
    const uint8_t *rows[16];
    for (int l = 0; l < 16; l++) rows[l] = w + (size_t)(j0 + (l < cnt ? l : cnt - 1)) * row_bytes; /* a short tile repeats its last row */
    /* The next tile's rows, fetched while this one computes: 16 rows read side by side are 16
     * streams, more than the hardware prefetcher follows (the 30 MB vocabulary head took 3.5x the
     * GEMV's time without this). A prefetch never faults, so the rows past W's end that a short
     * last tile names are harmless. */
    const uint8_t *next = w + (size_t)(j0 + 16 < (int64_t)n_rows ? j0 + 16 : j0) * row_bytes;
    __m512 acc[RMAX];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const size_t at = (size_t)b * bb;
        for (int l = 0; l < 16; l++) _mm_prefetch((const char *)(next + (size_t)l * row_bytes + at), _MM_HINT_T0);
        __m512i u[8];
        __mmask64 neg[8];
        for (int q = 0; q < 8; q++) {
            const uint8_t *w0 = rows[2 * q] + at, *w1 = rows[2 * q + 1] + at;
            if (type == QUANT_GGML_Q8_0) {
                const __m512i wv = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(w0 + 2))),
                    _mm256_loadu_si256((const __m256i *)(w1 + 2)), 1);
                u[q] = _mm512_abs_epi8(wv);
                neg[q] = _mm512_movepi8_mask(wv);
            } else { /* [lo nibbles, hi nibbles] of each: weights 0-15 then 16-31, as x's block */
                const __m128i a = _mm_loadu_si128((const __m128i *)(w0 + qoff)), c = _mm_loadu_si128((const __m128i *)(w1 + qoff));
                const __m512i aacc = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(a, a)), _mm256_set_m128i(c, c), 1);
                u[q] = _mm512_and_si512(_mm512_mask_srli_epi16(aacc, 0xFF00FF00u, aacc, 4), low4);
                neg[q] = 0;
            }
        }
        /* each output's block header: its f16 d, then Q4_1's f16 m */
        const __m512i raw = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offs, w + (size_t)j0 * row_bytes + at, 1);
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw));
        const __m512 cw = type == QUANT_GGML_Q4_1 ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(raw, 16)))
                                                  : _mm512_setzero_ps();
        for (int r = 0; r < R; r++) {
            const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xq + (size_t)r * q_stride + 32 * (size_t)b)));
            __m512i d[8];
            for (int q = 0; q < 8; q++) {
                const __m512i xs8 = type == QUANT_GGML_Q8_0 ? _mm512_mask_sub_epi8(xv, neg[q], _mm512_setzero_si512(), xv) : xv;
                d[q] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[q], xs8);
            }
            __m512i is = reduce16(d, ev, od);
            if (type == QUANT_GGML_Q4_0) is = _mm512_sub_epi32(is, _mm512_set1_epi32(8 * xsum[(size_t)r * (size_t)nb + (size_t)b]));
            const __m512 dx = _mm512_set1_ps(xd[(size_t)r * s_stride + (size_t)b]);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, dx), acc[r]);
            if (type == QUANT_GGML_Q4_1) acc[r] = _mm512_fmadd_ps(cw, _mm512_set1_ps(xs[(size_t)r * s_stride + (size_t)b]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + (size_t)r * n + (size_t)j0, live, acc[r]);
}

typedef void ordered_fn(const int8_t *, size_t, const float *, const float *, size_t, const int32_t *, int64_t,
                        const uint8_t *, size_t, int64_t, int, float *, size_t);

#define ORDERED_INSTANCE(T, TNAME, R)                                                                               \
    static AVX512O void ordered_##TNAME##_##R(const int8_t *xq, size_t q_stride, const float *xd, const float *xs,     \
                                              size_t s_stride, const int32_t *xsum, int64_t nb, const uint8_t *w,      \
                                              size_t row_bytes, int64_t j0, int cnt, float *y, size_t n) {             \
        ordered_rows(T, R, xq, q_stride, xd, xs, s_stride, xsum, nb, w, row_bytes, j0, cnt, y, n);                     \
    }
#define ORDERED_INSTANCES(T, TNAME)                                                                                \
    ORDERED_INSTANCE(T, TNAME, 1) ORDERED_INSTANCE(T, TNAME, 2) ORDERED_INSTANCE(T, TNAME, 3)                      \
    ORDERED_INSTANCE(T, TNAME, 4)                                                                                  \
    static ordered_fn *const ordered_##TNAME[RMAX] = {ordered_##TNAME##_1, ordered_##TNAME##_2, ordered_##TNAME##_3, \
                                                      ordered_##TNAME##_4};

ORDERED_INSTANCES(QUANT_GGML_Q4_0, q4_0)
ORDERED_INSTANCES(QUANT_GGML_Q4_1, q4_1)
ORDERED_INSTANCES(QUANT_GGML_Q8_0, q8_0)

void quant_gemv_gemm_order_avx512(int type, const int8_t *xq, size_t q_stride, const float *xd, const float *xs,
                                  size_t s_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k, int32_t *xsum,
                                  float *y) {
    const int64_t nb = k / QUANT_BLOCK;
    const size_t row_bytes = (size_t)nb * (size_t)quant_block_bytes(type);
    if (type == QUANT_GGML_Q4_0) { /* row r's block b: the sum of its q_x (Q4_0's offset term) */
        for (int64_t r = 0; r < m; r++)
            for (int64_t b = 0; b < nb; b++) {
                int32_t s = 0;
                for (int i = 0; i < QUANT_BLOCK; i++) s += xq[(size_t)r * q_stride + (size_t)b * QUANT_BLOCK + (size_t)i];
                xsum[(size_t)r * (size_t)nb + (size_t)b] = s;
            }
    }
    ordered_fn *const *fns = type == QUANT_GGML_Q4_0 ? ordered_q4_0 : type == QUANT_GGML_Q4_1 ? ordered_q4_1 : ordered_q8_0;
    for (int64_t r0 = 0; r0 < m; r0 += RMAX) {
        const int rr = m - r0 < RMAX ? (int)(m - r0) : RMAX;
        for (int64_t j0 = 0; j0 < n; j0 += 16)
            fns[rr - 1](xq + (size_t)r0 * q_stride, q_stride, xd + (size_t)r0 * s_stride, xs + (size_t)r0 * s_stride,
                        s_stride, xsum + (size_t)r0 * (size_t)nb, nb, w, row_bytes, j0, n - j0 < 16 ? (int)(n - j0) : 16,
                        y + (size_t)r0 * (size_t)n, (size_t)n);
    }
}
#endif
