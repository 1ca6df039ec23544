/* See quant_gemv.h. Compiled for the baseline target; the AVX2 and AVX-512 functions carry
 * their own target attributes and run only after CPUID said the CPU has them. */
#include "quant_gemv.h"

#include "cpu_features.h"
#include "quant_internal.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Activation scratch of one call, per row r of x: the int8 values of its blocks (nbp * 32
 * bytes, nbp = blocks rounded up to even, the padding block zero) and, per pair of blocks,
 * 32 floats: lanes 0-7 d_x of the pair's first block, 8-15 of its second, 16-23 s_x / 8 of
 * the first, 24-31 of the second (the AVX-512 variant multiplies them as they lie; the
 * others read lane 0 and 16 of each half). */
typedef struct {
    int8_t *q;
    float *sc;
    int64_t nbp;
} act_t;

static inline const int8_t *act_q(const act_t *a, int64_t r) { return a->q + (size_t)r * (size_t)a->nbp * QUANT_BLOCK; }
static inline const float *act_sc(const act_t *a, int64_t r) { return a->sc + (size_t)r * (size_t)(a->nbp / 2) * 32; }

int quant_block_bytes(int type) {
    switch (type) {
    case QUANT_GGML_Q4_0: return 2 + QUANT_BLOCK / 2;
    case QUANT_GGML_Q4_1: return 4 + QUANT_BLOCK / 2;
    case QUANT_GGML_Q8_0: return 2 + QUANT_BLOCK;
    case QUANT_GGML_Q4_K: return 4 + 12 + QUANT_KBLOCK / 2;
    case QUANT_GGML_Q5_K: return 4 + 12 + QUANT_KBLOCK / 8 + QUANT_KBLOCK / 2;
    case QUANT_GGML_Q6_K: return QUANT_KBLOCK / 2 + QUANT_KBLOCK / 4 + QUANT_KBLOCK / 16 + 2;
    default: return 0;
    }
}

int quant_block_weights(int type) {
    if (type == QUANT_GGML_Q4_K || type == QUANT_GGML_Q5_K || type == QUANT_GGML_Q6_K) return QUANT_KBLOCK;
    return quant_block_bytes(type) ? QUANT_BLOCK : 0;
}

void *quant_scratch(size_t bytes) {
    static __thread void *buf;
    static __thread size_t cap;
    if (bytes <= cap) return buf;
    const size_t want = (bytes + 4095) / 4096 * 4096;
    void *p = aligned_alloc(64, want);
    if (!p) return NULL;
    free(buf);
    buf = p;
    cap = want;
    return buf;
}

/* Per block of weights: dot = a * d_x * sum(q_w q_x) + c * s_x (see the header). */
static inline void block_coeffs_c(int type, const uint8_t *blk, float *a, float *c) {
    *a = quant_half_to_float(blk);
    *c = type == QUANT_GGML_Q4_1 ? quant_half_to_float(blk + 2) : type == QUANT_GGML_Q4_0 ? -8.0f * *a : 0.0f;
}

/* Quantizes m rows of x into a's buffers: per block d = max|x| / 127, q = rint(x / d). */
static void quantize_rows(const float *x, int64_t x_stride, int64_t m, int64_t k, act_t *a) {
    const int64_t nb = k / QUANT_BLOCK;
    for (int64_t r = 0; r < m; r++) {
        const float *xr = x + (size_t)r * (size_t)x_stride;
        int8_t *q = (int8_t *)act_q(a, r);
        float *sc = (float *)act_sc(a, r);
        for (int64_t b = 0; b < a->nbp; b++) {
            float d = 0.0f, s = 0.0f;
            if (b < nb) {
                float amax = 0.0f;
                for (int i = 0; i < QUANT_BLOCK; i++) amax = fmaxf(amax, fabsf(xr[b * QUANT_BLOCK + i]));
                d = amax / 127.0f;
                const float id = d != 0.0f ? 1.0f / d : 0.0f;
                int sum = 0;
                for (int i = 0; i < QUANT_BLOCK; i++) {
                    const int v = (int)nearbyintf(xr[b * QUANT_BLOCK + i] * id);
                    q[b * QUANT_BLOCK + i] = (int8_t)v;
                    sum += v;
                }
                s = d * (float)sum;
            } else {
                memset(q + b * QUANT_BLOCK, 0, QUANT_BLOCK);
            }
            float *lane = sc + (b / 2) * 32 + (b % 2) * 8;
            for (int i = 0; i < 8; i++) { lane[i] = d; lane[16 + i] = s * 0.125f; }
        }
    }
}

/* ---- plain C ---------------------------------------------------------------------- */

static int8_t weight_q(int type, const uint8_t *blk, int i) {
    if (type == QUANT_GGML_Q8_0) return (int8_t)blk[2 + i];
    const uint8_t *qs = blk + (type == QUANT_GGML_Q4_1 ? 4 : 2);
    return (int8_t)(i < 16 ? qs[i] & 0x0f : qs[i - 16] >> 4);
}

static void gemv_c(int type, const act_t *act, int64_t m, const uint8_t *w, int64_t n, int64_t k, float *y) {
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
                const float *sc = act_sc(act, r) + (b / 2) * 32 + (b % 2) * 8;
                int isum = 0;
                for (int i = 0; i < QUANT_BLOCK; i++) isum += wq[i] * xq[i];
                acc[r] += a * sc[0] * (float)isum + c * sc[16] * 8.0f;
            }
        }
        for (int64_t r = 0; r < m; r++) y[(size_t)r * (size_t)n + (size_t)j] = acc[r];
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

static inline AVX2Q __attribute__((always_inline)) void gemv_avx2_m(
    const int type, const act_t *act, const int M, const uint8_t *w, int64_t n, int64_t k, float *y) {
    const int64_t nb = k / QUANT_BLOCK;
    const size_t bb = (size_t)quant_block_bytes(type);
    const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0f);
    for (int64_t j = 0; j < n; j++) {
        __m256 acc[QUANT_GEMV_MAX_M];
        float accc[QUANT_GEMV_MAX_M];
        UNROLL_M for (int r = 0; r < M; r++) { acc[r] = _mm256_setzero_ps(); accc[r] = 0.0f; }
        const uint8_t *blk = w + (size_t)j * (size_t)nb * bb;
        for (int64_t b = 0; b < nb; b++, blk += bb) {
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
                const float *sc = act_sc(act, r) + (b / 2) * 32 + (b % 2) * 8;
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(a * sc[0]), acc[r]);
                if (type != QUANT_GGML_Q8_0) accc[r] += c * sc[16];
            }
        }
        UNROLL_M for (int r = 0; r < M; r++) y[(size_t)r * (size_t)n + (size_t)j] = hsum8(acc[r]) + 8.0f * accc[r];
    }
}

/* ---- AVX-512 VNNI: two blocks per register ---------------------------------------- */

static inline AVX512Q __attribute__((always_inline)) __m512 pair_coeff(float lo, float hi) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(lo)),
                                               _mm256_castps_pd(_mm256_set1_ps(hi)), 1));
}

static inline AVX512Q __attribute__((always_inline)) void gemv_avx512_m(
    const int type, const act_t *act, const int M, const uint8_t *w, int64_t n, int64_t k, float *y) {
    const int64_t nb = k / QUANT_BLOCK;
    const size_t bb = (size_t)quant_block_bytes(type);
    const size_t qoff = type == QUANT_GGML_Q4_1 ? 4 : 2;
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i dup = _mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0); /* [a, b] -> [a, a, b, b] */
    for (int64_t j = 0; j < n; j++) {
        __m512 acc[QUANT_GEMV_MAX_M], accc[QUANT_GEMV_MAX_M];
        UNROLL_M for (int r = 0; r < M; r++) { acc[r] = _mm512_setzero_ps(); accc[r] = _mm512_setzero_ps(); }
        const uint8_t *blk = w + (size_t)j * (size_t)nb * bb;
        for (int64_t b = 0; b < nb; b += 2, blk += 2 * bb) {
            const int two = b + 1 < nb; /* the row's last block may have no partner */
            const float a0 = half_f16c(blk), a1 = two ? half_f16c(blk + bb) : 0.0f;
            __m512i u;
            __mmask64 neg = 0;
            __m512 cv = _mm512_setzero_ps();
            if (type == QUANT_GGML_Q8_0) {
                const __m256i w0 = _mm256_loadu_si256((const __m256i *)(blk + 2));
                const __m256i w1 = two ? _mm256_loadu_si256((const __m256i *)(blk + bb + 2)) : _mm256_setzero_si256();
                const __m512i wv = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
                u = _mm512_abs_epi8(wv);
                neg = _mm512_movepi8_mask(wv);
            } else {
                const __m128i q0 = _mm_loadu_si128((const __m128i *)(blk + qoff));
                const __m128i q1 = two ? _mm_loadu_si128((const __m128i *)(blk + bb + qoff)) : _mm_setzero_si128();
                const __m512i aabb = _mm512_permutexvar_epi64(
                    dup, _mm512_castsi256_si512(_mm256_set_m128i(q1, q0)));
                u = _mm512_and_si512(_mm512_mask_srli_epi16(aabb, 0xFF00FF00u, aabb, 4), low4);
                if (type == QUANT_GGML_Q4_1)
                    cv = pair_coeff(half_f16c(blk + 2), two ? half_f16c(blk + bb + 2) : 0.0f);
                else
                    cv = pair_coeff(-8.0f * a0, -8.0f * a1);
            }
            const __m512 av = pair_coeff(a0, a1);
            UNROLL_M for (int r = 0; r < M; r++) {
                __m512i xv = _mm512_loadu_si512((const void *)(act_q(act, r) + b * QUANT_BLOCK));
                if (type == QUANT_GGML_Q8_0) xv = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
                const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, xv);
                const float *sc = act_sc(act, r) + (b / 2) * 32;
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(p), _mm512_loadu_ps(sc)), av, acc[r]);
                if (type != QUANT_GGML_Q8_0) accc[r] = _mm512_fmadd_ps(cv, _mm512_loadu_ps(sc + 16), accc[r]);
            }
        }
        UNROLL_M for (int r = 0; r < M; r++)
            y[(size_t)r * (size_t)n + (size_t)j] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], accc[r]));
    }
}

/* One entry per (type, rows) so type and M are constants inside: registers, no branches. */
#define INSTANCE(ISA, ATTR, T, TNAME, M) \
    static ATTR void ISA##_##TNAME##_##M(const act_t *a, const uint8_t *w, int64_t n, int64_t k, float *y) { \
        gemv_##ISA##_m(T, a, M, w, n, k, y); }
#define INSTANCES(ISA, ATTR, T, TNAME) \
    INSTANCE(ISA, ATTR, T, TNAME, 1) INSTANCE(ISA, ATTR, T, TNAME, 2) INSTANCE(ISA, ATTR, T, TNAME, 3) \
    INSTANCE(ISA, ATTR, T, TNAME, 4) INSTANCE(ISA, ATTR, T, TNAME, 5) INSTANCE(ISA, ATTR, T, TNAME, 6) \
    INSTANCE(ISA, ATTR, T, TNAME, 7) INSTANCE(ISA, ATTR, T, TNAME, 8) \
    static void (*const ISA##_##TNAME[QUANT_GEMV_MAX_M])(const act_t *, const uint8_t *, int64_t, int64_t, float *) = { \
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

static int gemv_simd(int type, int isa, const act_t *act, int64_t m, const uint8_t *w, int64_t n, int64_t k,
                     float *y) {
    const int t = type == QUANT_GGML_Q4_0 ? 0 : type == QUANT_GGML_Q4_1 ? 1 : 2;
    if (isa == QUANT_ISA_AVX512_VNNI) {
        const void *fns[3] = {avx512_q4_0, avx512_q4_1, avx512_q8_0};
        ((void (*const *)(const act_t *, const uint8_t *, int64_t, int64_t, float *))fns[t])[m - 1](act, w, n, k, y);
        return 1;
    }
    if (isa == QUANT_ISA_AVX2) {
        const void *fns[3] = {avx2_q4_0, avx2_q4_1, avx2_q8_0};
        ((void (*const *)(const act_t *, const uint8_t *, int64_t, int64_t, float *))fns[t])[m - 1](act, w, n, k, y);
        return 1;
    }
    return 0;
}
#else
int quant_best_isa(void) { return QUANT_ISA_C; }

static int gemv_simd(int type, int isa, const act_t *act, int64_t m, const uint8_t *w, int64_t n, int64_t k,
                     float *y) {
    (void)type; (void)isa; (void)act; (void)m; (void)w; (void)n; (void)k; (void)y;
    return 0;
}
#endif

int quant_gemv(int type, const float *x, int64_t x_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k,
               int max_isa, float *y) {
    const int bw = quant_block_weights(type);
    if (bw == 0 || m < 1 || m > QUANT_GEMV_MAX_M || n <= 0 || k <= 0 || k % bw || x_stride < k) return -1;
    int isa = quant_best_isa();
    if (max_isa < isa) isa = max_isa;
    if (bw == QUANT_KBLOCK) return quant_k_gemv(type, x, x_stride, m, w, n, k, isa, y);
    act_t act;
    act.nbp = (k / QUANT_BLOCK + 1) / 2 * 2;
    const size_t qbytes = (size_t)m * (size_t)act.nbp * QUANT_BLOCK;
    const size_t scbytes = (size_t)m * (size_t)(act.nbp / 2) * 32 * sizeof(float);
    void *mem = quant_scratch(qbytes + scbytes);
    if (!mem) return -2;
    act.sc = (float *)mem;
    act.q = (int8_t *)mem + scbytes;
    quantize_rows(x, x_stride, m, k, &act);
    if (!gemv_simd(type, isa, &act, m, w, n, k, y)) gemv_c(type, &act, m, w, n, k, y);
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
