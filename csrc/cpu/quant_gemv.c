/* See quant_gemv.h. Compiled for the baseline target; the AVX2 and AVX-512 functions carry
 * their own target attributes and run only after CPUID said the CPU has them. */
#include "quant_gemv.h"

#include "cpu_features.h"
#include "parallel.h"
#include "quant_gemm.h"
#include "quant_gemv_ordered.h"
#include "quant_gemv_rows.h"
#include "quant_half.h"
#include "quant_kquants.h"
#include "quant_scratch.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Per block of weights: dot = a * d_x * sum(q_w q_x) + c * s_x (see the header). */
static inline void block_coeffs_c(int type, const uint8_t *blk, float *a, float *c) {
    *a = quant_half_to_float(blk);
    *c = type == QUANT_GGML_Q4_1 ? quant_half_to_float(blk + 2) : type == QUANT_GGML_Q4_0 ? -8.0f * *a : 0.0f;
}

/* Quantizes m rows of x into a's buffers: per block d = max|x| / 127, q = rint(x / d). */
static void quantize_rows_c(const float *x, int64_t x_stride, int64_t m, int64_t k, const act_t *a) {
    const int64_t nb = k / QUANT_BLOCK;
    for (int64_t r = 0; r < m; r++) {
        const float *xr = x + (size_t)r * (size_t)x_stride;
        int8_t *q = (int8_t *)act_q(a, r);
        float *d = (float *)act_d(a, r), *s = (float *)act_s(a, r);
        for (int64_t b = 0; b < nb; b++) {
            float amax = 0.0f;
            for (int i = 0; i < QUANT_BLOCK; i++) amax = fmaxf(amax, fabsf(xr[b * QUANT_BLOCK + i]));
            d[b] = amax / 127.0f;
            const float id = d[b] != 0.0f ? 1.0f / d[b] : 0.0f;
            int sum = 0;
            for (int i = 0; i < QUANT_BLOCK; i++) {
                const int v = (int)nearbyintf(xr[b * QUANT_BLOCK + i] * id);
                q[b * QUANT_BLOCK + i] = (int8_t)v;
                sum += v;
            }
            s[b] = d[b] * (float)sum;
        }
        memset(q + nb * QUANT_BLOCK, 0, (size_t)(a->nbp - nb) * QUANT_BLOCK);
        for (int64_t b = nb; b < a->nbs; b++) d[b] = s[b] = 0.0f;
    }
}

/* ---- plain C ---------------------------------------------------------------------- */

static int8_t weight_q(int type, const uint8_t *blk, int i) {
    if (type == QUANT_GGML_Q8_0) return (int8_t)blk[2 + i];
    const uint8_t *qs = blk + (type == QUANT_GGML_Q4_1 ? 4 : 2);
    return (int8_t)(i < 16 ? qs[i] & 0x0f : qs[i - 16] >> 4);
}

/* y[r * ldy + j] for j < n, r < m: the GEMVs' output rows of W are independent, so a thread
 * takes a slice of them (w and y offset to its first row, ldy the full row stride of y). */
static void gemv_c(int type, const act_t *act, int64_t m, const uint8_t *w, int64_t n, int64_t k, float *y,
                   int64_t ldy) {
    const int64_t nb = k / QUANT_BLOCK;
    const size_t bb = (size_t)quant_block_bytes(type);
    for (int64_t j = 0; j < n; j++) {
        float acc[QUANT_GEMV_MAX_M] = {0};
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + ((size_t)j * (size_t)nb + (size_t)b) * bb;
            float a, c;
            block_coeffs_c(type, blk, &a, &c);
            int8_t wq[QUANT_BLOCK];
            for (int i = 0; i < QUANT_BLOCK; i++) wq[i] = weight_q(type, blk, i);
            for (int64_t r = 0; r < m; r++) {
                const int8_t *xq = act_q(act, r) + b * QUANT_BLOCK;
                int isum = 0;
                for (int i = 0; i < QUANT_BLOCK; i++) isum += wq[i] * xq[i];
                acc[r] += a * act_d(act, r)[b] * (float)isum + c * act_s(act, r)[b];
            }
        }
        for (int64_t r = 0; r < m; r++) y[(size_t)r * (size_t)ldy + (size_t)j] = acc[r];
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2Q __attribute__((target("avx2,fma,f16c")))
#define AVX512Q __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vnni")))
#define UNROLL_M _Pragma("GCC unroll 8")

static inline AVX2Q float half_f16c(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

/* ---- AVX2: one block per register ------------------------------------------------- */

static inline AVX2Q __attribute__((always_inline)) float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* Block b of a row of W (at blk) against rows r < M of x: acc[r] += a d_x sum(q_w q_x), accc[r] += c s_x. */
static inline AVX2Q __attribute__((always_inline)) void avx2_block(const int type, const act_t *act, const int M,
                                                                  const uint8_t *blk, int64_t b, __m256 *acc,
                                                                  float *accc) {
    const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0f);
    const float a = half_f16c(blk);
    float c = 0.0f;
    __m256i u; /* unsigned weight bytes; for Q8_0 |q_w|, with q_w's sign moved onto x */
    __m256i sgn = _mm256_setzero_si256();
    if (type == QUANT_GGML_Q8_0) {
        sgn = _mm256_loadu_si256((const __m256i *)(blk + 2));
        u = _mm256_abs_epi8(sgn);
    } else {
        const __m128i v = _mm_loadu_si128((const __m128i *)(blk + (type == QUANT_GGML_Q4_1 ? 4 : 2)));
        u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), low4);
        c = type == QUANT_GGML_Q4_1 ? half_f16c(blk + 2) : -8.0f * a;
    }
    UNROLL_M for (int r = 0; r < M; r++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(act_q(act, r) + b * QUANT_BLOCK));
        if (type == QUANT_GGML_Q8_0) xv = _mm256_sign_epi8(xv, sgn);
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), ones);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(a * act_d(act, r)[b]), acc[r]);
        if (type != QUANT_GGML_Q8_0) accc[r] += c * act_s(act, r)[b];
    }
}

/* With one or two rows of x the sums are one dependent chain of FMAs per row, bound by the FMA's
 * latency rather than by memory: those alternate blocks between two sets of sums (llama.cpp's
 * GEMV keeps several in flight too). From three rows the rows' own chains overlap, the second set
 * stays zero and adds nothing, and registers are kept for the rows. */
static inline AVX2Q __attribute__((always_inline)) void gemv_avx2_m(
    const int type, const act_t *act, const int M, const uint8_t *w, int64_t n, int64_t k, float *y, int64_t ldy) {
    const int64_t nb = k / QUANT_BLOCK;
    const size_t bb = (size_t)quant_block_bytes(type);
    for (int64_t j = 0; j < n; j++) {
        __m256 acc[QUANT_GEMV_MAX_M], acc2[2];
        float accc[QUANT_GEMV_MAX_M], accc2[2];
        UNROLL_M for (int r = 0; r < M; r++) { acc[r] = _mm256_setzero_ps(); accc[r] = 0.0f; }
        acc2[0] = acc2[1] = _mm256_setzero_ps();
        accc2[0] = accc2[1] = 0.0f;
        const uint8_t *blk = w + (size_t)j * (size_t)nb * bb;
        int64_t b = 0;
        if (M <= 2) {
            for (; b + 1 < nb; b += 2, blk += 2 * bb) {
                avx2_block(type, act, M, blk, b, acc, accc);
                avx2_block(type, act, M, blk + bb, b + 1, acc2, accc2);
            }
        }
        for (; b < nb; b++, blk += bb) avx2_block(type, act, M, blk, b, acc, accc);
        UNROLL_M for (int r = 0; r < M; r++) {
            const __m256 sum = M <= 2 ? _mm256_add_ps(acc[r], acc2[r < 2 ? r : 0]) : acc[r];
            y[(size_t)r * (size_t)ldy + (size_t)j] = hsum8(sum) + (M <= 2 ? accc[r] + accc2[r < 2 ? r : 0] : accc[r]);
        }
    }
}

/* ---- AVX-512 VNNI: two blocks per register, sixteen blocks' scales per register --- */

/* Lanes of a pair's coefficient: pair p of a group of 16 blocks takes block 2p in lanes 0-7
 * and block 2p + 1 in lanes 8-15. */
static const int32_t pair_lanes[8][16] = {
#define PAIR(p) {2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, \
    2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1}
    PAIR(0), PAIR(1), PAIR(2), PAIR(3), PAIR(4), PAIR(5), PAIR(6), PAIR(7)
#undef PAIR
};

/* Per group of 16 blocks of a row of W: the f16 scales (and Q4_1's mins) of all 16 come in one
 * gather and one conversion; per row r of x, coef = a_b d_xb for the 16 blocks, and the
 * offset terms c_b s_xb go into their own accumulator in the same 16 lanes. Per pair of
 * blocks, one vpdpbusd and one permute of coef. */
static inline AVX512Q __attribute__((always_inline)) void gemv_avx512_m(
    const int type, const act_t *act, const int M, const uint8_t *w, int64_t n, int64_t k, float *y, int64_t ldy) {
    const int64_t nb = k / QUANT_BLOCK;
    const int bb = quant_block_bytes(type);
    const size_t qoff = type == QUANT_GGML_Q4_1 ? 4 : 2;
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i dup = _mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0); /* [a, b] -> [a, a, b, b] */
    const __m512i offs = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(bb));
    for (int64_t j = 0; j < n; j++) {
        __m512 acc[QUANT_GEMV_MAX_M], accc[QUANT_GEMV_MAX_M];
        UNROLL_M for (int r = 0; r < M; r++) { acc[r] = _mm512_setzero_ps(); accc[r] = _mm512_setzero_ps(); }
        const uint8_t *row = w + (size_t)j * (size_t)nb * (size_t)bb;
        for (int64_t g = 0; g < nb; g += 16) {
            const int cnt = nb - g < 16 ? (int)(nb - g) : 16;
            const uint8_t *blk = row + (size_t)g * (size_t)bb;
            /* a dword at each block's start: its f16 d, then Q4_1's f16 m (else quant bytes) */
            const __m512i raw = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), (__mmask16)((1u << cnt) - 1), offs,
                                                            blk, 1);
            const __m512 av = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw));
            const __m512 cv = type == QUANT_GGML_Q4_1 ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(raw, 16)))
                                                      : _mm512_mul_ps(av, _mm512_set1_ps(-8.0f));
            __m512 coef[QUANT_GEMV_MAX_M];
            UNROLL_M for (int r = 0; r < M; r++) {
                coef[r] = _mm512_mul_ps(av, _mm512_loadu_ps(act_d(act, r) + g));
                if (type != QUANT_GGML_Q8_0) accc[r] = _mm512_fmadd_ps(cv, _mm512_loadu_ps(act_s(act, r) + g), accc[r]);
            }
            for (int p = 0; 2 * p < cnt; p++, blk += 2 * bb) {
                const int two = 2 * p + 1 < cnt; /* the row's last block may have no partner */
                __m512i u;
                __mmask64 neg = 0;
                if (type == QUANT_GGML_Q8_0) {
                    const __m256i w0 = _mm256_loadu_si256((const __m256i *)(blk + 2));
                    const __m256i w1 = two ? _mm256_loadu_si256((const __m256i *)(blk + bb + 2)) : _mm256_setzero_si256();
                    const __m512i wv = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
                    u = _mm512_abs_epi8(wv);
                    neg = _mm512_movepi8_mask(wv);
                } else {
                    const __m128i q0 = _mm_loadu_si128((const __m128i *)(blk + qoff));
                    const __m128i q1 = two ? _mm_loadu_si128((const __m128i *)(blk + bb + qoff)) : _mm_setzero_si128();
                    const __m512i aabb = _mm512_permutexvar_epi64(dup, _mm512_castsi256_si512(_mm256_set_m128i(q1, q0)));
                    u = _mm512_and_si512(_mm512_mask_srli_epi16(aabb, 0xFF00FF00u, aabb, 4), low4);
                }
                const __m512i lanes = _mm512_loadu_si512((const void *)pair_lanes[p]);
                UNROLL_M for (int r = 0; r < M; r++) {
                    __m512i xv = _mm512_loadu_si512((const void *)(act_q(act, r) + (g + 2 * p) * QUANT_BLOCK));
                    if (type == QUANT_GGML_Q8_0) xv = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
                    const __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, xv);
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_permutexvar_ps(lanes, coef[r]), acc[r]);
                }
            }
        }
        UNROLL_M for (int r = 0; r < M; r++)
            y[(size_t)r * (size_t)ldy + (size_t)j] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], accc[r]));
    }
}

/* The same values as quantize_rows_c: vcvtps2dq rounds to nearest even, as nearbyintf does in
 * the default rounding mode. */
static AVX2Q void quantize_rows_avx2(const float *x, int64_t x_stride, int64_t m, int64_t k, const act_t *a) {
    const int64_t nb = k / QUANT_BLOCK;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undo packs' lane interleave */
    for (int64_t r = 0; r < m; r++) {
        const float *xr = x + (size_t)r * (size_t)x_stride;
        int8_t *q = (int8_t *)act_q(a, r);
        float *d = (float *)act_d(a, r), *s = (float *)act_s(a, r);
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = xr + b * QUANT_BLOCK;
            __m256 v[4];
            __m256 mx = _mm256_setzero_ps();
            for (int t = 0; t < 4; t++) {
                v[t] = _mm256_loadu_ps(xb + 8 * t);
                mx = _mm256_max_ps(mx, _mm256_and_ps(v[t], absmask));
            }
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
            d[b] = _mm_cvtss_f32(h) / 127.0f;
            const __m256 id = _mm256_set1_ps(d[b] != 0.0f ? 1.0f / d[b] : 0.0f);
            __m256i qi[4];
            for (int t = 0; t < 4; t++) qi[t] = _mm256_cvtps_epi32(_mm256_mul_ps(v[t], id));
            __m256i sum = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            s[b] = d[b] * (float)_mm_cvtsi128_si32(s4);
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
            _mm256_storeu_si256((__m256i *)(q + b * QUANT_BLOCK), _mm256_permutevar8x32_epi32(p, order));
        }
        memset(q + nb * QUANT_BLOCK, 0, (size_t)(a->nbp - nb) * QUANT_BLOCK);
        for (int64_t b = nb; b < a->nbs; b++) d[b] = s[b] = 0.0f;
    }
}

/* One entry per (type, rows) so type and M are constants inside: registers, no branches. */
typedef void gemv_fn(const act_t *, const uint8_t *, int64_t, int64_t, float *, int64_t);
#define INSTANCE(ISA, ATTR, T, TNAME, M) \
    static ATTR void ISA##_##TNAME##_##M(const act_t *a, const uint8_t *w, int64_t n, int64_t k, float *y, \
                                         int64_t ldy) { gemv_##ISA##_m(T, a, M, w, n, k, y, ldy); }
#define INSTANCES(ISA, ATTR, T, TNAME) \
    INSTANCE(ISA, ATTR, T, TNAME, 1) INSTANCE(ISA, ATTR, T, TNAME, 2) INSTANCE(ISA, ATTR, T, TNAME, 3) \
    INSTANCE(ISA, ATTR, T, TNAME, 4) INSTANCE(ISA, ATTR, T, TNAME, 5) INSTANCE(ISA, ATTR, T, TNAME, 6) \
    INSTANCE(ISA, ATTR, T, TNAME, 7) INSTANCE(ISA, ATTR, T, TNAME, 8) \
    static gemv_fn *const ISA##_##TNAME[QUANT_GEMV_MAX_M] = { \
        ISA##_##TNAME##_1, ISA##_##TNAME##_2, ISA##_##TNAME##_3, ISA##_##TNAME##_4, \
        ISA##_##TNAME##_5, ISA##_##TNAME##_6, ISA##_##TNAME##_7, ISA##_##TNAME##_8};

INSTANCES(avx2, AVX2Q, QUANT_GGML_Q4_0, q4_0)
INSTANCES(avx2, AVX2Q, QUANT_GGML_Q4_1, q4_1)
INSTANCES(avx2, AVX2Q, QUANT_GGML_Q8_0, q8_0)
INSTANCES(avx512, AVX512Q, QUANT_GGML_Q4_0, q4_0)
INSTANCES(avx512, AVX512Q, QUANT_GGML_Q4_1, q4_1)
INSTANCES(avx512, AVX512Q, QUANT_GGML_Q8_0, q8_0)

int quant_best_isa(void) {
    if (cpu_avx512_supported() && __builtin_cpu_supports("avx512vnni")) return QUANT_ISA_AVX512_VNNI;
    if (cpu_kernels_supported() && __builtin_cpu_supports("f16c")) return QUANT_ISA_AVX2;
    return QUANT_ISA_C;
}

/* The SIMD kernel of m rows of this type and variant; NULL for the plain C one. */
static gemv_fn *gemv_kernel(int type, int isa, int64_t m) {
    const int t = type == QUANT_GGML_Q4_0 ? 0 : type == QUANT_GGML_Q4_1 ? 1 : 2;
    gemv_fn *const *avx512[3] = {avx512_q4_0, avx512_q4_1, avx512_q8_0}, *const *avx2[3] = {avx2_q4_0, avx2_q4_1, avx2_q8_0};
    return isa == QUANT_ISA_AVX512_VNNI ? avx512[t][m - 1] : isa == QUANT_ISA_AVX2 ? avx2[t][m - 1] : NULL;
}

static void quantize_rows(int isa, const float *x, int64_t x_stride, int64_t m, int64_t k, const act_t *a) {
    if (isa >= QUANT_ISA_AVX2) quantize_rows_avx2(x, x_stride, m, k, a);
    else quantize_rows_c(x, x_stride, m, k, a);
}
#else
typedef void gemv_fn(const act_t *, const uint8_t *, int64_t, int64_t, float *, int64_t);

int quant_best_isa(void) { return QUANT_ISA_C; }

static gemv_fn *gemv_kernel(int type, int isa, int64_t m) {
    (void)type; (void)isa; (void)m;
    return NULL;
}

static void quantize_rows(int isa, const float *x, int64_t x_stride, int64_t m, int64_t k, const act_t *a) {
    (void)isa;
    quantize_rows_c(x, x_stride, m, k, a);
}
#endif

void quant_quantize_rows(int isa, const float *x, int64_t x_stride, int64_t m, int64_t k, const act_t *a) {
    quantize_rows(isa, x, x_stride, m, k, a);
}

void quant_gemv_slice(int type, int isa, const act_t *a, int64_t m, const uint8_t *w, int64_t n, int64_t k, float *y,
                      int64_t ldy) {
    gemv_fn *const kernel = gemv_kernel(type, isa, m);
    if (kernel) kernel(a, w, n, k, y, ldy);
    else gemv_c(type, a, m, w, n, k, y, ldy);
}

/* Rows r < m <= QUANT_GEMV_MAX_M of quant_gemv, in one pass over W. */
static int gemv_pass(int type, int isa, const float *x, int64_t x_stride, int64_t m, const uint8_t *w, int64_t n,
                     int64_t k, float *y) {
    if (quant_block_weights(type) == QUANT_KBLOCK) return quant_k_gemv(type, x, x_stride, m, w, n, k, isa, y);
    act_t act;
    uint8_t *mem = quant_scratch(act_bytes(m, k));
    if (!mem) return -2;
    act_at(mem, m, k, &act);
    quantize_rows(isa, x, x_stride, m, k, &act);
    const size_t row_bytes = (size_t)(k / QUANT_BLOCK) * (size_t)quant_block_bytes(type);
    PAR_SLICES((size_t)n * row_bytes, n, 16, j0, cnt,
               quant_gemv_slice(type, isa, &act, m, w + (size_t)j0 * row_bytes, cnt, k, y + j0, n));
    return 0;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* All m rows of quant_gemv in quant_gemm.c's tiled GEMM (AVX-512 VNNI or AVX2, 32-weight blocks). */
static int gemm_all_rows(int type, int isa, const float *x, int64_t x_stride, int64_t m, const uint8_t *w, int64_t n,
                         int64_t k, float *y) {
    act_t act;
    const size_t abytes = act_bytes(m, k); /* a multiple of 64 */
    uint8_t *mem = quant_scratch(abytes + quant_gemm_work_bytes(m, k));
    if (!mem) return -2;
    act_at(mem, m, k, &act);
    quantize_rows_avx2(x, x_stride, m, k, &act);
    (isa == QUANT_ISA_AVX512_VNNI ? quant_gemm_avx512 : quant_gemm_avx2)(
        type, act.q, (size_t)act.nbp * QUANT_BLOCK, act.d, act.s, (size_t)act.nbs, m, w, n, k, mem + abytes, y);
    return 0;
}

/* All m rows of quant_gemv_row_invariant below the GEMM's threshold, on AVX-512 VNNI: the GEMM's
 * arithmetic, the GEMV's reading of W (quant_gemv_ordered.c). */
static int gemm_order_rows(int type, const float *x, int64_t x_stride, int64_t m, const uint8_t *w, int64_t n,
                           int64_t k, float *y) {
    act_t act;
    const size_t abytes = act_bytes(m, k);
    uint8_t *mem = quant_scratch(abytes + (size_t)m * (size_t)(k / QUANT_BLOCK) * sizeof(int32_t));
    if (!mem) return -2;
    act_at(mem, m, k, &act);
    quantize_rows_avx2(x, x_stride, m, k, &act);
    quant_gemv_gemm_order_avx512(type, act.q, (size_t)act.nbp * QUANT_BLOCK, act.d, act.s, (size_t)act.nbs, m, w, n, k,
                                 (int32_t *)(mem + abytes), y);
    return 0;
}
#endif

/* The AVX-512 GEMV of 32-weight blocks keeps three registers per row of x (sums, offset sums,
 * coefficients) beside its own eight or so: past six rows of the 32 it spills, and an 8-row pass
 * costs ~2.2-2.5x a 6-row one, more than two 4-row passes (benchmarks/RESULTS.md, "Quantized
 * kernels, per call"). So there a pass takes at most six rows, and the passes of a call are
 * balanced (8 rows: 4 + 4). Rows are independent sums: the split changes no value. */
#define AVX512_PASS_MAX_M 6

int64_t quant_gemv_pass_rows(int type, int isa, int64_t m) {
    const int64_t most = isa == QUANT_ISA_AVX512_VNNI && quant_block_weights(type) == QUANT_BLOCK ? AVX512_PASS_MAX_M
                                                                                                  : QUANT_GEMV_MAX_M;
    const int64_t passes = (m + most - 1) / most;
    return (m + passes - 1) / passes;
}

_Static_assert(QUANT_KGEMM_MIN_M == QUANT_GEMV_MAX_M + 1, "the K-quant GEMM starts past one GEMV pass");

int quant_gemm_runs(int type, int isa, int64_t m, int64_t k) {
#if defined(__x86_64__) && defined(__GNUC__)
    const int bw = quant_block_weights(type);
    const int64_t row_bytes = k / bw * quant_block_bytes(type);
    if (bw == QUANT_BLOCK) /* row_bytes: the AVX-512 gathers' offsets */
        return isa >= QUANT_ISA_AVX2 && row_bytes <= INT32_MAX / 16 && m >= QUANT_GEMM_MIN_M;
    return isa == QUANT_ISA_AVX512_VNNI && m >= QUANT_KGEMM_MIN_M;
#else
    (void)type; (void)isa; (void)m; (void)k;
    return 0;
#endif
}

int quant_gemv(int type, const float *x, int64_t x_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k,
               int max_isa, float *y) {
    const int bw = quant_block_weights(type);
    if (bw == 0 || m < 1 || n <= 0 || k <= 0 || k % bw || x_stride < k) return -1;
    int isa = quant_best_isa();
    if (max_isa < isa) isa = max_isa;
#if defined(__x86_64__) && defined(__GNUC__)
    if (quant_gemm_runs(type, isa, m, k))
        return bw == QUANT_BLOCK ? gemm_all_rows(type, isa, x, x_stride, m, w, n, k, y)
                                 : quant_k_gemm(type, x, x_stride, m, w, n, k, y);
#endif
    const int64_t per = quant_gemv_pass_rows(type, isa, m);
    for (int64_t r = 0; r < m; r += per) {
        const int rc = gemv_pass(type, isa, x + (size_t)r * (size_t)x_stride, x_stride, m - r < per ? m - r : per, w,
                                 n, k, y + (size_t)r * (size_t)n);
        if (rc) return rc;
    }
    return 0;
}

int quant_gemv_row_invariant(int type, const float *x, int64_t x_stride, int64_t m, const uint8_t *w, int64_t n,
                             int64_t k, float *y) {
    const int bw = quant_block_weights(type);
    if (bw == 0 || m < 1 || n <= 0 || k <= 0 || k % bw || x_stride < k) return -1;
    const int isa = quant_best_isa();
#if defined(__x86_64__) && defined(__GNUC__)
    const int64_t row_bytes = k / bw * quant_block_bytes(type);
    if (isa == QUANT_ISA_AVX512_VNNI && bw == QUANT_BLOCK && row_bytes <= INT32_MAX / 16 && m < QUANT_GEMM_MIN_M)
        return gemm_order_rows(type, x, x_stride, m, w, n, k, y);
    if (isa >= QUANT_ISA_AVX2 && bw == QUANT_BLOCK && row_bytes <= INT32_MAX / 16)
        return gemm_all_rows(type, isa, x, x_stride, m, w, n, k, y);
    if (isa == QUANT_ISA_AVX512_VNNI && bw == QUANT_KBLOCK) return quant_k_gemm(type, x, x_stride, m, w, n, k, y);
#endif
    for (int64_t r = 0; r < m; r++) {
        const int rc = gemv_pass(type, isa, x + (size_t)r * (size_t)x_stride, x_stride, 1, w, n, k, y + (size_t)r * (size_t)n);
        if (rc) return rc;
    }
    return 0;
}

int quant_dequantize(int type, const uint8_t *w, int64_t n, int64_t k, float *out) {
    const int bw = quant_block_weights(type);
    if (bw == 0 || n <= 0 || k <= 0 || k % bw) return -1;
    if (bw == QUANT_KBLOCK) {
        quant_k_dequantize(type, w, n, k, out);
        return 0;
    }
    const size_t bb = (size_t)quant_block_bytes(type);
    const size_t blocks = (size_t)n * (size_t)(k / QUANT_BLOCK);
    for (size_t b = 0; b < blocks; b++, w += bb, out += QUANT_BLOCK) {
        float a, c;
        block_coeffs_c(type, w, &a, &c);
        if (type == QUANT_GGML_Q8_0) {
            for (int i = 0; i < QUANT_BLOCK; i++) out[i] = a * (float)(int8_t)w[2 + i];
            continue;
        }
        const uint8_t *qs = w + (type == QUANT_GGML_Q4_1 ? 4 : 2);
        if (type == QUANT_GGML_Q4_1) {
            for (int i = 0; i < 16; i++) { out[i] = a * (float)(qs[i] & 0x0f) + c; out[i + 16] = a * (float)(qs[i] >> 4) + c; }
        } else {
            for (int i = 0; i < 16; i++) { out[i] = a * (float)((qs[i] & 0x0f) - 8); out[i + 16] = a * (float)((qs[i] >> 4) - 8); }
        }
    }
    return 0;
}
