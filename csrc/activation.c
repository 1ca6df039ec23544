/* See activation.h. AVX2 bodies behind a target attribute; refused on other CPUs. */
#include "activation.h"

#include "cpu_features.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <math.h>

#include "avx2_math.h"

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

int rms_norm_f32(const float *x, float *residual, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    if (!cpu_kernels_supported() || rows < 0 || cols <= 0 || cols % LANES) return -1;
    rms_norm_rows(x, residual, w, y, rows, cols, eps);
    return 0;
}

int silu_and_mul_f32(const float *x, float *y, int64_t rows, int64_t d) {
    if (!cpu_kernels_supported() || rows < 0 || d <= 0 || d % LANES) return -1;
    silu_and_mul_rows(x, y, rows, d);
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
#endif
