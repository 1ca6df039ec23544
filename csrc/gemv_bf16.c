/* See gemv_bf16.h. Compiled for the baseline target; the AVX2 functions carry their own
 * target attribute and run only after cpu_kernels_supported() said yes. */
#include "gemv_bf16.h"

#include "cpu_features.h"

#include <stddef.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include "avx2_math.h"
/* Bytes ahead of the current read to prefetch: measured on Zen3, 1-2 KiB is the plateau
 * (no prefetch: 15.7 GB/s; 1 KiB: 18.9 GB/s at one row). */
#define PREFETCH_AHEAD 1024

/* One block of ROWS output rows for M input rows, using rows [r0, r0 + R) of the block.
 * M and R are compile-time constants at every call site, so the accumulators stay in
 * registers (M * R + R + 1 <= 16 ymm). */
static inline AVX2 __attribute__((always_inline)) void block(
    const float *x, const uint16_t *w, float *y, const int M, const int R, int r0, int64_t n, int64_t k) {
    __m256 acc[GEMV_BF16_MAX_M][GEMV_BF16_ROWS];
    UNROLL for (int m = 0; m < M; m++)
        UNROLL for (int r = 0; r < R; r++) acc[m][r] = _mm256_setzero_ps();
    const uint16_t *p = w + (size_t)r0 * GEMV_BF16_COLS;
    for (int64_t c = 0; c < k; c += GEMV_BF16_COLS, p += GEMV_BF16_ROWS * GEMV_BF16_COLS) {
        _mm_prefetch((const char *)p + PREFETCH_AHEAD, _MM_HINT_T0);
        __m256 b[GEMV_BF16_ROWS];
        UNROLL for (int r = 0; r < R; r++) b[r] = load_bf16x8(p + r * GEMV_BF16_COLS);
        UNROLL for (int m = 0; m < M; m++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)m * k + c);
            UNROLL for (int r = 0; r < R; r++) acc[m][r] = _mm256_fmadd_ps(xv, b[r], acc[m][r]);
        }
    }
    UNROLL for (int m = 0; m < M; m++)
        UNROLL for (int r = 0; r < R; r++) y[(size_t)m * n + r0 + r] = hsum(acc[m][r]);
}

/* M rows of x against the whole matrix. Up to 2 rows of x take the block's 4 weight rows
 * at once; 3-4 rows of x take them 2 at a time (the second pass over a 4.6 KiB block is
 * served from L1), keeping every accumulator in a register. */
static inline AVX2 __attribute__((always_inline)) void run(
    const float *x, const uint16_t *w, float *y, const int M, int64_t n, int64_t k) {
    const size_t block_elems = (size_t)GEMV_BF16_ROWS * (size_t)k;
    for (int64_t j = 0; j < n; j += GEMV_BF16_ROWS, w += block_elems, y += GEMV_BF16_ROWS) {
        if (M <= 2) {
            block(x, w, y, M, GEMV_BF16_ROWS, 0, n, k);
        } else {
            block(x, w, y, M, GEMV_BF16_ROWS / 2, 0, n, k);
            block(x, w, y, M, GEMV_BF16_ROWS / 2, GEMV_BF16_ROWS / 2, n, k);
        }
    }
}

static AVX2 void run1(const float *x, const uint16_t *w, float *y, int64_t n, int64_t k) { run(x, w, y, 1, n, k); }
static AVX2 void run2(const float *x, const uint16_t *w, float *y, int64_t n, int64_t k) { run(x, w, y, 2, n, k); }
static AVX2 void run3(const float *x, const uint16_t *w, float *y, int64_t n, int64_t k) { run(x, w, y, 3, n, k); }
static AVX2 void run4(const float *x, const uint16_t *w, float *y, int64_t n, int64_t k) { run(x, w, y, 4, n, k); }

int gemv_bf16(const float *x, const uint16_t *w, float *y, int64_t m, int64_t n, int64_t k) {
    if (m < 1 || m > GEMV_BF16_MAX_M || n % GEMV_BF16_ROWS || k % GEMV_BF16_COLS || n <= 0 || k <= 0
        || !cpu_kernels_supported())
        return -1;
    switch (m) {
    case 1: run1(x, w, y, n, k); break;
    case 2: run2(x, w, y, n, k); break;
    case 3: run3(x, w, y, n, k); break;
    default: run4(x, w, y, n, k); break;
    }
    return 0;
}
#else
int gemv_bf16(const float *x, const uint16_t *w, float *y, int64_t m, int64_t n, int64_t k) {
    (void)x; (void)w; (void)y; (void)m; (void)n; (void)k;
    return -1;
}
#endif

void gemv_bf16_pack(const uint16_t *src, uint16_t *dst, int64_t n, int64_t k) {
    for (int64_t j = 0; j < n; j += GEMV_BF16_ROWS)
        for (int64_t c = 0; c < k; c += GEMV_BF16_COLS)
            for (int r = 0; r < GEMV_BF16_ROWS; r++)
                for (int e = 0; e < GEMV_BF16_COLS; e++)
                    *dst++ = src[(size_t)(j + r) * (size_t)k + (size_t)(c + e)];
}
