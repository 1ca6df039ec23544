/* The K-quant half of quant_gemv.h: GGUF Q4_K, Q5_K and Q6_K super-blocks of 256 weights.
 *
 * One super-block, byte offsets:
 *   Q4_K (144): d f16 @0, dmin f16 @2, scales[12] @4 (8 six-bit scales, 8 six-bit mins), qs[128] @16
 *   Q5_K (176): d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48
 *   Q6_K (210): ql[128] @0, qh[64] @128, scales[16] int8 @192, d f16 @208
 * Weight i, with s = i / 32 and l = i % 32 (Q6_K: h = i / 128, g = i % 128 / 32):
 *   Q4_K: q = qs[32 (s / 2) + l] >> 4 (s % 2) & 15                 w = d sc[s] q - dmin m[s]
 *   Q5_K: q = the same | (qh[l] >> s & 1) << 4
 *   Q6_K: q = (ql[64 h + 32 (g % 2) + l] >> 4 (g / 2) & 15 | (qh[32 h + l] >> 2 g & 3) << 4) - 32
 *                                                                   w = d scales[i / 16] q
 * Every type is read into one form: unsigned u_i (0..63); per group g of 16 weights two int16
 * S_g and N_g; two floats D and M; w_i = D S_g u_i - M N_g. (Q4_K, Q5_K: D = d, S_g = sc[g/2],
 * M = dmin, N_g = m[g/2]. Q6_K: u = q + 32, S_g = N_g = scales[g], M = 32 d.)
 *
 * x is quantized per row and super-block as llama.cpp's Q8_K: dx = max|x| / 127,
 * q_x = rint(x / dx) and b_g = the sum of q_x over group g. Then
 *   sum_i w_i x_i = dx (D sum_g S_g sum_{i in g} u_i q_xi - M sum_g N_g b_g),
 * whose inner sums are int8 products (u_i * q_xi fits a pmaddubsw pair: 2 * 63 * 127 < 2^15)
 * weighted by S_g in int16 madds: all integer until one float per row and super-block. */
#include "quant_kquants.h"

#include "parallel.h"
#include "quant_gemv.h"
#include "quant_half.h"
#include "quant_kblock.h"
#include "quant_kgemm.h"
#include "quant_scratch.h"

#include <math.h>

#define QK 256
#define NG (QK / 16)

static void quantize_rows_c(const float *x, int64_t x_stride, int64_t m, const actk_t *a) {
    for (int64_t r = 0; r < m; r++) {
        for (int64_t b = 0; b < a->nsb; b++) {
            const float *xb = x + (size_t)r * (size_t)x_stride + (size_t)b * QK;
            const size_t at = (size_t)(r * a->nsb + b);
            float amax = 0.0f;
            for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(xb[i]));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            for (int g = 0; g < NG; g++) {
                int sum = 0;
                for (int i = 16 * g; i < 16 * g + 16; i++) {
                    const int v = (int)nearbyintf(xb[i] * id);
                    a->q[at * QK + (size_t)i] = (int8_t)v;
                    sum += v;
                }
                a->bs[at * NG + (size_t)g] = (int16_t)sum;
            }
            a->d[at] = d;
        }
    }
}

/* ---- plain C ---------------------------------------------------------------------- */

typedef struct {
    uint8_t u[QK];
    int16_t s[NG], nm[NG];
    float d, m;
} kblock_t;

static void decode_c(int type, const uint8_t *b, kblock_t *o) {
    if (type == QUANT_GGML_Q6_K) {
        for (int i = 0; i < QK; i++) {
            const int h = i / 128, g = i % 128 / 32, l = i % 32;
            o->u[i] = (uint8_t)(((b[64 * h + 32 * (g % 2) + l] >> (4 * (g / 2))) & 15)
                                | ((b[128 + 32 * h + l] >> (2 * g)) & 3) << 4);
        }
        for (int g = 0; g < NG; g++) o->s[g] = o->nm[g] = (int8_t)b[192 + g];
        o->d = quant_half_to_float(b + 208);
        o->m = 32.0f * o->d;
        return;
    }
    uint8_t sc[8], mn[8];
    k4_scales(b + 4, sc, mn);
    const uint8_t *qs = b + (type == QUANT_GGML_Q5_K ? 48 : 16);
    for (int i = 0; i < QK; i++) {
        const int s = i / 32, l = i % 32;
        o->u[i] = (uint8_t)((qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 15);
        if (type == QUANT_GGML_Q5_K) o->u[i] |= (uint8_t)(((b[16 + l] >> s) & 1) << 4);
    }
    for (int g = 0; g < NG; g++) { o->s[g] = sc[g / 2]; o->nm[g] = mn[g / 2]; }
    o->d = quant_half_to_float(b);
    o->m = quant_half_to_float(b + 2);
}

/* y[r * ldy + j] for j < n: a thread takes a slice of W's rows (quant_gemv.c's gemv_c). */
static void gemv_c(int type, const actk_t *a, int64_t m, const uint8_t *w, int64_t n, float *y, int64_t ldy) {
    const size_t bb = (size_t)quant_block_bytes(type);
    kblock_t blk;
    for (int64_t j = 0; j < n; j++) {
        float acc[QUANT_GEMV_MAX_M] = {0};
        for (int64_t b = 0; b < a->nsb; b++) {
            decode_c(type, w + ((size_t)j * (size_t)a->nsb + (size_t)b) * bb, &blk);
            for (int64_t r = 0; r < m; r++) {
                const size_t at = (size_t)(r * a->nsb + b);
                const int8_t *xq = a->q + at * QK;
                int32_t isum = 0, nsum = 0;
                for (int g = 0; g < NG; g++) {
                    int32_t gs = 0;
                    for (int i = 16 * g; i < 16 * g + 16; i++) gs += blk.u[i] * xq[i];
                    isum += blk.s[g] * gs;
                    nsum += blk.nm[g] * a->bs[at * NG + (size_t)g];
                }
                acc[r] += a->d[at] * (blk.d * (float)isum - blk.m * (float)nsum);
            }
        }
        for (int64_t r = 0; r < m; r++) y[(size_t)r * (size_t)ldy + (size_t)j] = acc[r];
    }
}

/* A SIMD kernel of M rows: y[r * ldy + j] for W's n rows from w. */
typedef void (*kfn_t)(const actk_t *, const uint8_t *, int64_t, float *, int64_t);

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2K __attribute__((target("avx2,fma,f16c")))
#define AVX512K __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vnni")))
#define INLINE __attribute__((always_inline)) inline
#define UNROLL_M _Pragma("GCC unroll 8")

/* The same rounding as quantize_rows_c: vcvtps2dq rounds to nearest even, as nearbyintf does
 * in the default rounding mode. */
static AVX2K void quantize_rows_avx2(const float *x, int64_t x_stride, int64_t m, const actk_t *a) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undo packs' lane interleave */
    for (int64_t r = 0; r < m; r++) {
        for (int64_t b = 0; b < a->nsb; b++) {
            const float *xb = x + (size_t)r * (size_t)x_stride + (size_t)b * QK;
            const size_t at = (size_t)(r * a->nsb + b);
            __m256 mx = _mm256_setzero_ps();
            for (int i = 0; i < QK; i += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(xb + i), absmask));
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
            const float d = _mm_cvtss_f32(h) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            const __m256 idv = _mm256_set1_ps(id);
            for (int i = 0; i < QK; i += 32) {
                __m256i v[4];
                for (int t = 0; t < 4; t++) v[t] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 8 * t), idv));
                for (int g = 0; g < 2; g++) {
                    __m256i s = _mm256_add_epi32(v[2 * g], v[2 * g + 1]);
                    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
                    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
                    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
                    a->bs[at * NG + (size_t)(i / 16 + g)] = (int16_t)_mm_cvtsi128_si32(s4);
                }
                const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
                _mm256_storeu_si256((__m256i *)(a->q + at * QK + (size_t)i), _mm256_permutevar8x32_epi32(p, order));
            }
            a->d[at] = d;
        }
    }
}

static INLINE AVX2K __m256i dup_pairs16(const uint8_t *v8) {
    const __m128i v = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)v8));
    return _mm256_set_m128i(_mm_unpackhi_epi16(v, v), _mm_unpacklo_epi16(v, v));
}

static INLINE AVX2K float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* ---- AVX2: 32 weights (two groups) per register ------------------------------------ */

/* Chunk c (weights 32c..32c+31) of a super-block as unsigned bytes, and its S_g per int16 lane. */
static INLINE AVX2K __m256i chunk_avx2(const int type, const uint8_t *blk, const int c, __m256i qh, __m256i *s,
                                       const uint8_t *sc) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    if (type == QUANT_GGML_Q6_K) {
        const int h = c / 4, g = c % 4;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (g % 2)));
        const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (g / 2))), low4);
        const __m256i hi = _mm256_slli_epi16(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g)), 4);
        const int8_t *s8 = (const int8_t *)blk + 192;
        *s = _mm256_set_m128i(_mm_set1_epi16(s8[2 * c + 1]), _mm_set1_epi16(s8[2 * c]));
        return _mm256_or_si256(lo, _mm256_and_si256(hi, _mm256_set1_epi8(0x30)));
    }
    const uint8_t *qs = blk + (type == QUANT_GGML_Q5_K ? 48 : 16) + 32 * (c / 2);
    __m256i u = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)qs), _mm_cvtsi32_si128(4 * (c % 2))),
                                 low4);
    if (type == QUANT_GGML_Q5_K) {
        const __m256i bit = _mm256_set1_epi8((char)(1 << c));
        u = _mm256_or_si256(u, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), _mm256_set1_epi8(16)));
    }
    *s = _mm256_set1_epi16(sc[c]);
    return u;
}

static INLINE AVX2K void gemv_avx2_m(const int type, const actk_t *a, const int M, const uint8_t *w, int64_t n,
                                     float *y, int64_t ldy) {
    const size_t bb = (size_t)quant_block_bytes(type);
    for (int64_t j = 0; j < n; j++) {
        __m256 acc[QUANT_GEMV_MAX_M];
        UNROLL_M for (int r = 0; r < M; r++) acc[r] = _mm256_setzero_ps();
        const uint8_t *blk = w + (size_t)j * (size_t)a->nsb * bb;
        for (int64_t b = 0; b < a->nsb; b++, blk += bb) {
            uint8_t sc[8], mn[8];
            __m256i nm, qh = _mm256_setzero_si256();
            float dd, dm;
            if (type == QUANT_GGML_Q6_K) {
                nm = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
                dd = half_f16c(blk + 208);
                dm = 32.0f * dd;
            } else {
                k4_scales(blk + 4, sc, mn);
                nm = dup_pairs16(mn);
                dd = half_f16c(blk);
                dm = half_f16c(blk + 2);
                if (type == QUANT_GGML_Q5_K) qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
            }
            __m256i ia[QUANT_GEMV_MAX_M];
            UNROLL_M for (int r = 0; r < M; r++) ia[r] = _mm256_setzero_si256();
            KBLOCK_UNROLL for (int c = 0; c < 8; c++) {
                if (type == QUANT_GGML_Q6_K && c % 4 == 0)
                    qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * (c / 4)));
                __m256i s;
                const __m256i u = chunk_avx2(type, blk, c, qh, &s, sc);
                UNROLL_M for (int r = 0; r < M; r++) {
                    const __m256i xv = _mm256_loadu_si256((const __m256i *)(a->q + (size_t)(r * a->nsb + b) * QK + 32 * c));
                    ia[r] = _mm256_add_epi32(ia[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), s));
                }
            }
            UNROLL_M for (int r = 0; r < M; r++) {
                const size_t at = (size_t)(r * a->nsb + b);
                const __m256i nb = _mm256_madd_epi16(nm, _mm256_loadu_si256((const __m256i *)(a->bs + at * NG)));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[r]), _mm256_set1_ps(dd * a->d[at]), acc[r]);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(nb), _mm256_set1_ps(-dm * a->d[at]), acc[r]);
            }
        }
        UNROLL_M for (int r = 0; r < M; r++) y[(size_t)r * (size_t)ldy + (size_t)j] = hsum8(acc[r]);
    }
}

/* ---- AVX-512 VNNI: 64 weights (four groups) per register --------------------------- */

/* S per int16 lane of chunk c of Q4_K/Q5_K: lanes 0-15 sub-block 2c, 16-31 sub-block 2c + 1. */
static const int16_t k4_sub_lanes[4][32] = {
#define LANES(c) {2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, \
    2 * c, 2 * c, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, \
    2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1}
    LANES(0), LANES(1), LANES(2), LANES(3)
#undef LANES
};

/* S_g per int16 lane of chunk c of Q6_K: lane t holds group 4c + t / 8. */
static const int16_t q6_group_lanes[4][32] = {
#define LANES(c) {4 * c, 4 * c, 4 * c, 4 * c, 4 * c, 4 * c, 4 * c, 4 * c, \
    4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 1, \
    4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 2, \
    4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 3}
    LANES(0), LANES(1), LANES(2), LANES(3)
#undef LANES
};

/* The four 64-weight chunks of a super-block (u), their S_g per int16 lane (s), N_g (nm), D, M. */
static INLINE AVX512K void unpack_avx512(const int type, const uint8_t *blk, __m512i *u, __m512i *s, __m256i *nm,
                                         float *dd, float *dm) {
    kblock_u_avx512(type, blk, u);
    if (type == QUANT_GGML_Q6_K) {
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
        KBLOCK_UNROLL for (int c = 0; c < 4; c++)
            s[c] = _mm512_permutexvar_epi16(_mm512_loadu_si512((const void *)q6_group_lanes[c]), _mm512_castsi256_si512(sc));
        *nm = sc;
        *dd = half_f16c(blk + 208);
        *dm = 32.0f * *dd;
        return;
    }
    uint8_t sc[8], mn[8];
    k4_scales(blk + 4, sc, mn);
    const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
    KBLOCK_UNROLL for (int c = 0; c < 4; c++)
        s[c] = _mm512_permutexvar_epi16(_mm512_loadu_si512((const void *)k4_sub_lanes[c]), sc16);
    *nm = dup_pairs16(mn);
    *dd = half_f16c(blk);
    *dm = half_f16c(blk + 2);
}

static INLINE AVX512K void gemv_avx512_m(const int type, const actk_t *a, const int M, const uint8_t *w, int64_t n,
                                         float *y, int64_t ldy) {
    const size_t bb = (size_t)quant_block_bytes(type);
    for (int64_t j = 0; j < n; j++) {
        __m512 acc[QUANT_GEMV_MAX_M];
        UNROLL_M for (int r = 0; r < M; r++) acc[r] = _mm512_setzero_ps();
        const uint8_t *blk = w + (size_t)j * (size_t)a->nsb * bb;
        for (int64_t b = 0; b < a->nsb; b++, blk += bb) {
            __m512i u[4], s[4];
            __m256i nm;
            float dd, dm;
            unpack_avx512(type, blk, u, s, &nm, &dd, &dm);
            UNROLL_M for (int r = 0; r < M; r++) {
                const size_t at = (size_t)(r * a->nsb + b);
                const int8_t *xq = a->q + at * QK;
                __m512i ia = _mm512_setzero_si512();
                KBLOCK_UNROLL for (int c = 0; c < 4; c++)
                    ia = _mm512_dpwssd_epi32(ia, _mm512_maddubs_epi16(u[c], _mm512_loadu_si512((const void *)(xq + 64 * c))),
                                             s[c]);
                const __m256i nb = _mm256_madd_epi16(nm, _mm256_loadu_si256((const __m256i *)(a->bs + at * NG)));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_set1_ps(dd * a->d[at]), acc[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(nb)), _mm512_set1_ps(-dm * a->d[at]),
                                         acc[r]);
            }
        }
        UNROLL_M for (int r = 0; r < M; r++) y[(size_t)r * (size_t)ldy + (size_t)j] = _mm512_reduce_add_ps(acc[r]);
    }
}

/* One entry per (type, rows) so type and M are constants inside: registers, no branches. */
#define INSTANCE(ISA, ATTR, T, TNAME, M) \
    static ATTR void ISA##_##TNAME##_##M(const actk_t *a, const uint8_t *w, int64_t n, float *y, int64_t ldy) { \
        gemv_##ISA##_m(T, a, M, w, n, y, ldy); }
#define INSTANCES(ISA, ATTR, T, TNAME) \
    INSTANCE(ISA, ATTR, T, TNAME, 1) INSTANCE(ISA, ATTR, T, TNAME, 2) INSTANCE(ISA, ATTR, T, TNAME, 3) \
    INSTANCE(ISA, ATTR, T, TNAME, 4) INSTANCE(ISA, ATTR, T, TNAME, 5) INSTANCE(ISA, ATTR, T, TNAME, 6) \
    INSTANCE(ISA, ATTR, T, TNAME, 7) INSTANCE(ISA, ATTR, T, TNAME, 8) \
    static const kfn_t ISA##_##TNAME[QUANT_GEMV_MAX_M] = { \
        ISA##_##TNAME##_1, ISA##_##TNAME##_2, ISA##_##TNAME##_3, ISA##_##TNAME##_4, \
        ISA##_##TNAME##_5, ISA##_##TNAME##_6, ISA##_##TNAME##_7, ISA##_##TNAME##_8};

INSTANCES(avx2, AVX2K, QUANT_GGML_Q4_K, q4_k)
INSTANCES(avx2, AVX2K, QUANT_GGML_Q5_K, q5_k)
INSTANCES(avx2, AVX2K, QUANT_GGML_Q6_K, q6_k)
INSTANCES(avx512, AVX512K, QUANT_GGML_Q4_K, q4_k)
INSTANCES(avx512, AVX512K, QUANT_GGML_Q5_K, q5_k)
INSTANCES(avx512, AVX512K, QUANT_GGML_Q6_K, q6_k)

/* The SIMD kernel of m rows of this type and variant; NULL for the plain C one. */
static kfn_t kernel_for(int type, int isa, int64_t m) {
    if (isa < QUANT_ISA_AVX2) return NULL;
    const int t = type == QUANT_GGML_Q4_K ? 0 : type == QUANT_GGML_Q5_K ? 1 : 2;
    const kfn_t *const *fns = isa == QUANT_ISA_AVX512_VNNI ? (const kfn_t *const[3]){avx512_q4_k, avx512_q5_k, avx512_q6_k}
                                                           : (const kfn_t *const[3]){avx2_q4_k, avx2_q5_k, avx2_q6_k};
    return fns[t][m - 1];
}

static void quantize_rows(int isa, const float *x, int64_t x_stride, int64_t m, const actk_t *a) {
    if (isa >= QUANT_ISA_AVX2) quantize_rows_avx2(x, x_stride, m, a);
    else quantize_rows_c(x, x_stride, m, a);
}
#else
static kfn_t kernel_for(int type, int isa, int64_t m) {
    (void)type; (void)isa; (void)m;
    return NULL;
}

static void quantize_rows(int isa, const float *x, int64_t x_stride, int64_t m, const actk_t *a) {
    (void)isa;
    quantize_rows_c(x, x_stride, m, a);
}
#endif

size_t quant_k_act_bytes(int64_t m, int64_t k) {
    const size_t blocks = (size_t)m * (size_t)(k / QK);
    return (blocks * (QK + NG * sizeof(int16_t) + sizeof(float)) + 63) / 64 * 64;
}

void quant_k_act_at(uint8_t *mem, int64_t m, int64_t k, actk_t *a) {
    a->nsb = k / QK;
    const size_t blocks = (size_t)m * (size_t)a->nsb;
    a->q = (int8_t *)mem;
    a->bs = (int16_t *)(mem + blocks * QK);
    a->d = (float *)(mem + blocks * (QK + NG * sizeof(int16_t)));
}

void quant_k_quantize_rows(int isa, const float *x, int64_t x_stride, int64_t m, const actk_t *a) {
    quantize_rows(isa, x, x_stride, m, a);
}

void quant_k_gemv_slice(int type, int isa, const actk_t *a, int64_t m, const uint8_t *w, int64_t n, float *y,
                        int64_t ldy) {
    const kfn_t kernel = kernel_for(type, isa, m);
    if (kernel) kernel(a, w, n, y, ldy);
    else gemv_c(type, a, m, w, n, y, ldy);
}

/* a's arrays for m rows of k in the calling thread's scratch, then `extra` bytes at a 64-byte
 * boundary: returned, or NULL when memory ran out. */
static uint8_t *act_scratch(int64_t m, int64_t k, size_t extra, actk_t *a) {
    const size_t abytes = quant_k_act_bytes(m, k);
    uint8_t *mem = quant_scratch(abytes + extra);
    if (!mem) return NULL;
    quant_k_act_at(mem, m, k, a);
    return mem + abytes;
}

int quant_k_gemv(int type, const float *x, int64_t x_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k,
                 int isa, float *y) {
    actk_t a;
    if (!act_scratch(m, k, 0, &a)) return -2;
    quantize_rows(isa, x, x_stride, m, &a);
    const size_t row_bytes = (size_t)a.nsb * (size_t)quant_block_bytes(type);
    PAR_SLICES((size_t)n * row_bytes, n, 16, j0, cnt,
               quant_k_gemv_slice(type, isa, &a, m, w + (size_t)j0 * row_bytes, cnt, y + j0, n));
    return 0;
}

#if defined(__x86_64__) && defined(__GNUC__)
int quant_k_gemm(int type, const float *x, int64_t x_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k,
                 float *y) {
    actk_t a;
    uint8_t *work = act_scratch(m, k, quant_kgemm_work_bytes(k), &a);
    if (!work) return -2;
    quantize_rows_avx2(x, x_stride, m, &a);
    quant_kgemm_avx512(type, &a, m, w, n, work, y);
    return 0;
}
#endif

/* The gguf package's float32 arithmetic, operation for operation: (d sc) q - (dmin m) and (d scale) q. */
void quant_k_dequantize(int type, const uint8_t *w, int64_t n, int64_t k, float *out) {
    const size_t bb = (size_t)quant_block_bytes(type), blocks = (size_t)n * (size_t)(k / QK);
    kblock_t blk;
    for (size_t b = 0; b < blocks; b++, w += bb, out += QK) {
        decode_c(type, w, &blk);
        for (int i = 0; i < QK; i++) {
            const float dl = blk.d * (float)blk.s[i / 16];
            out[i] = type == QUANT_GGML_Q6_K ? dl * (float)((int)blk.u[i] - 32)
                                             : dl * (float)blk.u[i] - blk.m * (float)blk.nm[i / 16];
        }
    }
}
