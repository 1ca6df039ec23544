/* See int8_gemv.h. Compiled for the baseline target; the AVX2 and AVX-512 functions carry their
 * own target attributes and run only after CPUID said the CPU has them. */
#include "int8_gemv.h"

#include "quant_gemv.h"
#include "quant_scratch.h"

#include <math.h>

/* Per-row symmetric int8: s = max|v| / 127, q = rint(v / s); returns s (0 for a zero row). */
static float quantize_row(const float *v, int64_t k, int8_t *q) {
    float amax = 0.0f;
    for (int64_t i = 0; i < k; i++) amax = fmaxf(amax, fabsf(v[i]));
    const float s = amax / 127.0f, inv = s != 0.0f ? 1.0f / s : 0.0f;
    for (int64_t i = 0; i < k; i++) q[i] = (int8_t)nearbyintf(v[i] * inv);
    return s;
}

static void gemv_c(const int8_t *xq, const float *sx, int64_t m, const int8_t *q, const float *scale, int64_t n,
                   int64_t k, float *y) {
    for (int64_t j = 0; j < n; j++) {
        const int8_t *qj = q + (size_t)j * (size_t)k;
        for (int64_t r = 0; r < m; r++) {
            const int8_t *xr = xq + (size_t)r * (size_t)k;
            int32_t sum = 0;
            for (int64_t i = 0; i < k; i++) sum += xr[i] * qj[i];
            y[(size_t)r * (size_t)n + (size_t)j] = sx[r] * scale[j] * (float)sum;
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2I __attribute__((target("avx2,fma")))
#define AVX512I __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vnni")))
#define UNROLL_M _Pragma("GCC unroll 8")

static inline AVX2I __attribute__((always_inline)) int32_t hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* x rows as signed int8 (AVX2 variant) or as q + 128 (VNNI variant's unsigned operand). */
static AVX2I void quantize_rows_avx2(const float *x, int64_t x_stride, int64_t m, int64_t k, int offset, int8_t *xq,
                                     float *sx) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undo packs' lane interleave */
    const __m256i off = _mm256_set1_epi8((char)offset);
    for (int64_t r = 0; r < m; r++) {
        const float *xr = x + (size_t)r * (size_t)x_stride;
        int8_t *qr = xq + (size_t)r * (size_t)k;
        __m256 mx = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= k; i += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(xr + i), absmask));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        float amax = _mm_cvtss_f32(h);
        for (; i < k; i++) amax = fmaxf(amax, fabsf(xr[i]));
        const float s = amax / 127.0f, inv = s != 0.0f ? 1.0f / s : 0.0f;
        const __m256 iv = _mm256_set1_ps(inv);
        for (i = 0; i + 32 <= k; i += 32) {
            __m256i v[4];
            for (int t = 0; t < 4; t++) v[t] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xr + i + 8 * t), iv));
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            _mm256_storeu_si256((__m256i *)(qr + i), _mm256_add_epi8(_mm256_permutevar8x32_epi32(p, order), off));
        }
        for (; i < k; i++) qr[i] = (int8_t)(uint8_t)((int)nearbyintf(xr[i] * inv) + offset);
        sx[r] = s;
    }
}

static inline AVX2I __attribute__((always_inline)) void gemv_avx2_m(const int8_t *xq, const float *sx, const int M,
                                                                   const int8_t *q, const float *scale, int64_t n,
                                                                   int64_t k, float *y) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t j = 0; j < n; j++) {
        const int8_t *qj = q + (size_t)j * (size_t)k;
        __m256i acc[INT8_GEMV_MAX_M];
        UNROLL_M for (int r = 0; r < M; r++) acc[r] = _mm256_setzero_si256();
        int64_t i = 0;
        for (; i + 32 <= k; i += 32) {
            const __m256i wv = _mm256_loadu_si256((const __m256i *)(qj + i)), u = _mm256_abs_epi8(wv);
            UNROLL_M for (int r = 0; r < M; r++) {
                const __m256i xv = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xq + (size_t)r * (size_t)k + i)), wv);
                acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), ones));
            }
        }
        UNROLL_M for (int r = 0; r < M; r++) {
            int32_t sum = hsum8i(acc[r]);
            for (int64_t t = i; t < k; t++) sum += xq[(size_t)r * (size_t)k + (size_t)t] * qj[t];
            y[(size_t)r * (size_t)n + (size_t)j] = sx[r] * scale[j] * (float)sum;
        }
    }
}

/* xq holds q_x + 128 as unsigned bytes; the masked tail loads zeros on both sides. */
static inline AVX512I __attribute__((always_inline)) void gemv_avx512_m(const int8_t *xq, const float *sx, const int M,
                                                                       const int8_t *q, const float *scale,
                                                                       const int32_t *wsum, int64_t n, int64_t k,
                                                                       float *y) {
    for (int64_t j = 0; j < n; j++) {
        const int8_t *qj = q + (size_t)j * (size_t)k;
        __m512i acc[INT8_GEMV_MAX_M];
        UNROLL_M for (int r = 0; r < M; r++) acc[r] = _mm512_setzero_si512();
        for (int64_t i = 0; i < k; i += 64) {
            const __mmask64 live = k - i >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (k - i)) - 1);
            const __m512i wv = _mm512_maskz_loadu_epi8(live, qj + i);
            UNROLL_M for (int r = 0; r < M; r++)
                acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_maskz_loadu_epi8(live, xq + (size_t)r * (size_t)k + i), wv);
        }
        UNROLL_M for (int r = 0; r < M; r++)
            y[(size_t)r * (size_t)n + (size_t)j] =
                sx[r] * scale[j] * (float)(_mm512_reduce_add_epi32(acc[r]) - 128 * wsum[j]);
    }
}

typedef void (*avx2_fn)(const int8_t *, const float *, const int8_t *, const float *, int64_t, int64_t, float *);
typedef void (*avx512_fn)(const int8_t *, const float *, const int8_t *, const float *, const int32_t *, int64_t,
                          int64_t, float *);
#define INSTANCE(M) \
    static AVX2I void avx2_##M(const int8_t *xq, const float *sx, const int8_t *q, const float *sc, int64_t n, \
                               int64_t k, float *y) { gemv_avx2_m(xq, sx, M, q, sc, n, k, y); } \
    static AVX512I void avx512_##M(const int8_t *xq, const float *sx, const int8_t *q, const float *sc, \
                                   const int32_t *ws, int64_t n, int64_t k, float *y) { \
        gemv_avx512_m(xq, sx, M, q, sc, ws, n, k, y); }
INSTANCE(1) INSTANCE(2) INSTANCE(3) INSTANCE(4) INSTANCE(5) INSTANCE(6) INSTANCE(7) INSTANCE(8)
static const avx2_fn avx2_fns[INT8_GEMV_MAX_M] = {avx2_1, avx2_2, avx2_3, avx2_4, avx2_5, avx2_6, avx2_7, avx2_8};
static const avx512_fn avx512_fns[INT8_GEMV_MAX_M] = {avx512_1, avx512_2, avx512_3, avx512_4,
                                                      avx512_5, avx512_6, avx512_7, avx512_8};

static int run_simd(int isa, const float *x, int64_t x_stride, int64_t m, int8_t *xq, float *sx, const int8_t *q,
                    const float *scale, const int32_t *wsum, int64_t n, int64_t k, float *y) {
    if (isa == QUANT_ISA_AVX512_VNNI) {
        quantize_rows_avx2(x, x_stride, m, k, 128, xq, sx);
        avx512_fns[m - 1](xq, sx, q, scale, wsum, n, k, y);
        return 1;
    }
    if (isa == QUANT_ISA_AVX2) {
        quantize_rows_avx2(x, x_stride, m, k, 0, xq, sx);
        avx2_fns[m - 1](xq, sx, q, scale, n, k, y);
        return 1;
    }
    return 0;
}
#else
static int run_simd(int isa, const float *x, int64_t x_stride, int64_t m, int8_t *xq, float *sx, const int8_t *q,
                    const float *scale, const int32_t *wsum, int64_t n, int64_t k, float *y) {
    (void)isa; (void)x; (void)x_stride; (void)m; (void)xq; (void)sx; (void)q; (void)scale; (void)wsum; (void)n;
    (void)k; (void)y;
    return 0;
}
#endif

int int8_gemv(const float *x, int64_t x_stride, int64_t m, const int8_t *q, const float *scale, const int32_t *wsum,
              int64_t n, int64_t k, int max_isa, float *y) {
    if (m < 1 || m > INT8_GEMV_MAX_M || n <= 0 || k <= 0 || x_stride < k) return -1;
    int isa = quant_best_isa();
    if (max_isa < isa) isa = max_isa;
    uint8_t *mem = quant_scratch((size_t)m * (sizeof(float) + (size_t)k));
    if (!mem) return -2;
    float *sx = (float *)mem;
    int8_t *xq = (int8_t *)(mem + (size_t)m * sizeof(float));
    if (!run_simd(isa, x, x_stride, m, xq, sx, q, scale, wsum, n, k, y)) {
        for (int64_t r = 0; r < m; r++) sx[r] = quantize_row(x + (size_t)r * (size_t)x_stride, k, xq + (size_t)r * (size_t)k);
        gemv_c(xq, sx, m, q, scale, n, k, y);
    }
    return 0;
}
