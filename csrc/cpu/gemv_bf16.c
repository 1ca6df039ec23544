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

/* The dense row-major layout: one weight row at a time, front to back (one sequential
 * stream, as the packed layout is), against M rows of x from L1; four accumulators per row
 * of x hide the FMA latency, and the row's tail (k % 32, in steps of 8) folds into them. */
static inline AVX2 __attribute__((always_inline)) void run_dense(
    const float *x, const uint16_t *w, float *y, const int M, int64_t n, int64_t k) {
    for (int64_t j = 0; j < n; j++) {
        const uint16_t *p = w + (size_t)j * (size_t)k;
        __m256 a[GEMV_BF16_MAX_M][4];
        UNROLL for (int m = 0; m < M; m++)
            UNROLL for (int u = 0; u < 4; u++) a[m][u] = _mm256_setzero_ps();
        int64_t c = 0;
        for (; c + 32 <= k; c += 32) {
            _mm_prefetch((const char *)(p + c) + PREFETCH_AHEAD, _MM_HINT_T0);
            __m256 b[4];
            UNROLL for (int u = 0; u < 4; u++) b[u] = load_bf16x8(p + c + 8 * u);
            UNROLL for (int m = 0; m < M; m++)
                UNROLL for (int u = 0; u < 4; u++)
                    a[m][u] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (size_t)m * k + c + 8 * u), b[u], a[m][u]);
        }
        for (int u = 0; c < k; c += 8, u++) {
            const __m256 b = load_bf16x8(p + c);
            UNROLL for (int m = 0; m < M; m++)
                a[m][u] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (size_t)m * k + c), b, a[m][u]);
        }
        UNROLL for (int m = 0; m < M; m++)
            y[(size_t)m * n + j] = hsum(_mm256_add_ps(_mm256_add_ps(a[m][0], a[m][1]), _mm256_add_ps(a[m][2], a[m][3])));
    }
}

#define RUNS(M) \
    static AVX2 void run##M(const float *x, const uint16_t *w, float *y, int64_t n, int64_t k) { run(x, w, y, M, n, k); } \
    static AVX2 void dense##M(const float *x, const uint16_t *w, float *y, int64_t n, int64_t k) { \
        run_dense(x, w, y, M, n, k); \
    }
RUNS(1) RUNS(2) RUNS(3) RUNS(4)

typedef void (*gemv_fn)(const float *, const uint16_t *, float *, int64_t, int64_t);

static int dispatch(const gemv_fn fns[GEMV_BF16_MAX_M], const float *x, const uint16_t *w, float *y,
                    int64_t m, int64_t n, int64_t k) {
    if (m < 1 || m > GEMV_BF16_MAX_M || n % GEMV_BF16_ROWS || k % GEMV_BF16_COLS || n <= 0 || k <= 0
        || !cpu_kernels_supported())
        return -1;
    fns[m - 1](x, w, y, n, k);
    return 0;
}

int gemv_bf16(const float *x, const uint16_t *w, float *y, int64_t m, int64_t n, int64_t k) {
    static const gemv_fn fns[GEMV_BF16_MAX_M] = {run1, run2, run3, run4};
    return dispatch(fns, x, w, y, m, n, k);
}

int gemv_bf16_dense(const float *x, const uint16_t *w, float *y, int64_t m, int64_t n, int64_t k) {
    static const gemv_fn fns[GEMV_BF16_MAX_M] = {dense1, dense2, dense3, dense4};
    return dispatch(fns, x, w, y, m, n, k);
}
#else
int gemv_bf16(const float *x, const uint16_t *w, float *y, int64_t m, int64_t n, int64_t k) {
    (void)x; (void)w; (void)y; (void)m; (void)n; (void)k;
    return -1;
}

int gemv_bf16_dense(const float *x, const uint16_t *w, float *y, int64_t m, int64_t n, int64_t k) {
    return gemv_bf16(x, w, y, m, n, k);
}
#endif

void gemv_bf16_pack(const uint16_t *src, uint16_t *dst, int64_t n, int64_t k) {
    for (int64_t j = 0; j < n; j += GEMV_BF16_ROWS)
        for (int64_t c = 0; c < k; c += GEMV_BF16_COLS)
            for (int r = 0; r < GEMV_BF16_ROWS; r++)
                for (int e = 0; e < GEMV_BF16_COLS; e++)
                    *dst++ = src[(size_t)(j + r) * (size_t)k + (size_t)(c + e)];
}
