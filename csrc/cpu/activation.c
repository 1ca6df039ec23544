/* See activation.h. float32 bodies in AVX2, bf16 bodies in AVX-512 BF16 (the CPUs whose native
 * bf16 GEMMs make a model run its activations in bf16), each behind a target attribute and
 * refused on other CPUs. The bf16 versions compute in float32 and round where transformers'
 * bf16 modules round, so a bf16 model's output stays transformers' own. */
#include "activation.h"

#include "cpu_features.h"
#include "parallel.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <math.h>

#include "avx2_math.h"
#include "avx512_math.h"

static AVX2 void rms_norm_rows(const float *x, float *residual, const float *w, float *y, int64_t rows,
                               int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols, *src = (float *)xr;
        if (residual) {  /* residual += x, then normalise the sum */
            src = residual + r * cols;
            for (int64_t c = 0; c < cols; c += LANES)
                _mm256_storeu_ps(src + c, _mm256_add_ps(_mm256_loadu_ps(src + c), _mm256_loadu_ps(xr + c)));
        }
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int64_t c = 0;
        for (; c + 2 * LANES <= cols; c += 2 * LANES) {
            __m256 v0 = _mm256_loadu_ps(src + c), v1 = _mm256_loadu_ps(src + c + LANES);
            a0 = _mm256_fmadd_ps(v0, v0, a0);
            a1 = _mm256_fmadd_ps(v1, v1, a1);
        }
        if (c < cols) {
            __m256 v0 = _mm256_loadu_ps(src + c);
            a0 = _mm256_fmadd_ps(v0, v0, a0);
        }
        const __m256 inv = _mm256_set1_ps(1.0f / sqrtf(hsum(_mm256_add_ps(a0, a1)) / (float)cols + eps));
        for (c = 0; c < cols; c += LANES)
            _mm256_storeu_ps(yr + c, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(src + c), inv),
                                                   _mm256_loadu_ps(w + c)));
    }
}

/* silu(a) = a / (1 + e^-a); exp_clamped keeps both tails finite. */
static AVX2 void silu_and_mul_rows(const float *x, float *y, int64_t rows, int64_t d) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (int64_t r = 0; r < rows; r++) {
        const float *gate = x + r * 2 * d, *up = gate + d;
        float *out = y + r * d;
        for (int64_t c = 0; c < d; c += LANES) {
            __m256 a = _mm256_loadu_ps(gate + c);
            __m256 s = _mm256_div_ps(a, _mm256_add_ps(one, exp_clamped(_mm256_sub_ps(zero, a))));
            _mm256_storeu_ps(out + c, _mm256_mul_ps(s, _mm256_loadu_ps(up + c)));
        }
    }
}

/* bf16: residual = bf16(residual + x); y = bf16(w * bf16(s * inv)), transformers' LlamaRMSNorm
 * (normalise in float32, round, then scale by the bf16 weight and round again). */
static AVX512BF16 void rms_norm_rows_bf16(const uint16_t *x, uint16_t *residual, const uint16_t *w, uint16_t *y,
                                          int64_t rows, int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *src = x + r * cols;
        uint16_t *yr = y + r * cols;
        if (residual) {
            uint16_t *hr = residual + r * cols;
            for (int64_t c = 0; c < cols; c += LANES16)
                store_bf16x16(hr + c, _mm512_add_ps(load_bf16x16(hr + c), load_bf16x16(src + c)));
            src = hr;
        }
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        int64_t c = 0;
        for (; c + 2 * LANES16 <= cols; c += 2 * LANES16) {
            __m512 v0 = load_bf16x16(src + c), v1 = load_bf16x16(src + c + LANES16);
            a0 = _mm512_fmadd_ps(v0, v0, a0);
            a1 = _mm512_fmadd_ps(v1, v1, a1);
        }
        if (c < cols) {
            __m512 v0 = load_bf16x16(src + c);
            a0 = _mm512_fmadd_ps(v0, v0, a0);
        }
        const float mean_sq = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) / (float)cols;
        const __m512 inv = _mm512_set1_ps(1.0f / sqrtf(mean_sq + eps));
        for (c = 0; c < cols; c += LANES16) {
            __m512 n = round_bf16x16(_mm512_mul_ps(load_bf16x16(src + c), inv));
            store_bf16x16(yr + c, _mm512_mul_ps(n, load_bf16x16(w + c)));
        }
    }
}

/* bf16: y = bf16(bf16(silu(gate)) * up), as torch's bf16 silu and multiply round. */
static AVX512BF16 void silu_and_mul_rows_bf16(const uint16_t *x, uint16_t *y, int64_t rows, int64_t d) {
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *gate = x + r * 2 * d, *up = gate + d;
        uint16_t *out = y + r * d;
        for (int64_t c = 0; c < d; c += LANES16) {
            __m512 a = load_bf16x16(gate + c);
            /* a / (1 + e^-a) through rcp14 and one Newton step (~2^-23 relative, then rounded to
             * bf16): a 512-bit divide is ~16 cycles a vector here, the whole rest of the loop less */
            __m512 den = _mm512_add_ps(one, exp16_clamped(_mm512_sub_ps(zero, a)));
            __m512 rcp = _mm512_rcp14_ps(den);
            rcp = _mm512_fmadd_ps(rcp, _mm512_fnmadd_ps(den, rcp, one), rcp);
            __m512 s = round_bf16x16(_mm512_mul_ps(a, rcp));
            store_bf16x16(out + c, _mm512_mul_ps(s, load_bf16x16(up + c)));
        }
    }
}

/* RoPE on adjacent (re, im) pairs given interleaved (cos, sin): (re c - im s, im c + re s). */
static inline AVX2 __m256 rotate_pairs8(__m256 v, __m256 cs) {
    const __m256 swapped = _mm256_permute_ps(v, 0xB1);  /* (im, re) in each pair */
    /* fmaddsub: even lanes v c - swapped s, odd lanes v c + swapped s */
    return _mm256_fmaddsub_ps(v, _mm256_moveldup_ps(cs), _mm256_mul_ps(swapped, _mm256_movehdup_ps(cs)));
}

static inline AVX512BF16 __m512 rotate_pairs16(__m512 v, __m512 cs) {
    const __m512 swapped = _mm512_permute_ps(v, 0xB1);
    return _mm512_fmaddsub_ps(v, _mm512_moveldup_ps(cs), _mm512_mul_ps(swapped, _mm512_movehdup_ps(cs)));
}

/* cos_sin row p holds head_dim / 2 (cos, sin) pairs: head_dim floats, one per element rotated. */
static AVX2 void rotary_rows_f32(float *qkv, int64_t row_stride, int64_t rows, const int64_t *positions,
                                 const float *cos_sin, int64_t heads, int64_t head_dim) {
    for (int64_t r = 0; r < rows; r++) {
        const float *cs = cos_sin + positions[r] * head_dim;
        for (int64_t h = 0; h < heads; h++) {
            float *p = qkv + r * row_stride + h * head_dim;
            for (int64_t i = 0; i < head_dim; i += LANES)
                _mm256_storeu_ps(p + i, rotate_pairs8(_mm256_loadu_ps(p + i), _mm256_loadu_ps(cs + i)));
        }
    }
}

static AVX512BF16 void rotary_rows_bf16(uint16_t *qkv, int64_t row_stride, int64_t rows, const int64_t *positions,
                                        const float *cos_sin, int64_t heads, int64_t head_dim) {
    for (int64_t r = 0; r < rows; r++) {
        const float *cs = cos_sin + positions[r] * head_dim;
        for (int64_t h = 0; h < heads; h++) {
            uint16_t *p = qkv + r * row_stride + h * head_dim;
            for (int64_t i = 0; i < head_dim; i += LANES16)
                store_bf16x16(p + i, rotate_pairs16(load_bf16x16(p + i), _mm512_loadu_ps(cs + i)));
        }
    }
}

int rms_norm_f32(const float *x, float *residual, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    if (!cpu_kernels_supported() || rows < 0 || cols <= 0 || cols % LANES) return -1;
    PAR_SLICES((size_t)rows * (size_t)cols * sizeof(float), rows, 1, r0, n,
               rms_norm_rows(x + r0 * cols, residual ? residual + r0 * cols : NULL, w, y + r0 * cols, n, cols, eps));
    return 0;
}

int silu_and_mul_f32(const float *x, float *y, int64_t rows, int64_t d) {
    if (!cpu_kernels_supported() || rows < 0 || d <= 0 || d % LANES) return -1;
    PAR_SLICES((size_t)rows * (size_t)d * 3 * sizeof(float), rows, 1, r0, n,
               silu_and_mul_rows(x + r0 * 2 * d, y + r0 * d, n, d));
    return 0;
}
int rms_norm_bf16(const uint16_t *x, uint16_t *residual, const uint16_t *w, uint16_t *y, int64_t rows,
                  int64_t cols, float eps) {
    if (!cpu_avx512_bf16_supported() || rows < 0 || cols <= 0 || cols % LANES16) return -1;
    PAR_SLICES((size_t)rows * (size_t)cols * sizeof(uint16_t), rows, 1, r0, n,
               rms_norm_rows_bf16(x + r0 * cols, residual ? residual + r0 * cols : NULL, w, y + r0 * cols, n, cols,
                                  eps));
    return 0;
}

int silu_and_mul_bf16(const uint16_t *x, uint16_t *y, int64_t rows, int64_t d) {
    if (!cpu_avx512_bf16_supported() || rows < 0 || d <= 0 || d % LANES16) return -1;
    PAR_SLICES((size_t)rows * (size_t)d * 3 * sizeof(uint16_t), rows, 1, r0, n,
               silu_and_mul_rows_bf16(x + r0 * 2 * d, y + r0 * d, n, d));
    return 0;
}

int rotary_in_place(void *qkv, int bf16, int64_t row_stride, int64_t rows, const int64_t *positions,
                    const float *cos_sin, int64_t max_positions, int64_t heads, int64_t head_dim) {
    const int64_t lanes = bf16 ? LANES16 : LANES;
    if (!(bf16 ? cpu_avx512_bf16_supported() : cpu_kernels_supported()) || rows < 0 || heads <= 0
        || head_dim <= 0 || head_dim % lanes || row_stride < heads * head_dim)
        return -1;
    for (int64_t r = 0; r < rows; r++)
        if (positions[r] < 0 || positions[r] >= max_positions) return -1;
    const size_t bytes = (size_t)rows * (size_t)(heads * head_dim) * (bf16 ? sizeof(uint16_t) : sizeof(float));
    if (bf16)
        PAR_SLICES(bytes, rows, 1, r0, n, rotary_rows_bf16((uint16_t *)qkv + r0 * row_stride, row_stride, n,
                                                           positions + r0, cos_sin, heads, head_dim));
    else
        PAR_SLICES(bytes, rows, 1, r0, n, rotary_rows_f32((float *)qkv + r0 * row_stride, row_stride, n,
                                                          positions + r0, cos_sin, heads, head_dim));
    return 0;
}
#else
int rms_norm_f32(const float *x, float *residual, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    (void)x; (void)residual; (void)w; (void)y; (void)rows; (void)cols; (void)eps;
    return -1;
}

int silu_and_mul_f32(const float *x, float *y, int64_t rows, int64_t d) {
    (void)x; (void)y; (void)rows; (void)d;
    return -1;
}

int rms_norm_bf16(const uint16_t *x, uint16_t *residual, const uint16_t *w, uint16_t *y, int64_t rows,
                  int64_t cols, float eps) {
    (void)x; (void)residual; (void)w; (void)y; (void)rows; (void)cols; (void)eps;
    return -1;
}

int silu_and_mul_bf16(const uint16_t *x, uint16_t *y, int64_t rows, int64_t d) {
    (void)x; (void)y; (void)rows; (void)d;
    return -1;
}

int rotary_in_place(void *qkv, int bf16, int64_t row_stride, int64_t rows, const int64_t *positions,
                    const float *cos_sin, int64_t max_positions, int64_t heads, int64_t head_dim) {
    (void)qkv; (void)bf16; (void)row_stride; (void)rows; (void)positions; (void)cos_sin; (void)max_positions;
    (void)heads; (void)head_dim;
    return -1;
}
#endif
