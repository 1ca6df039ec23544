/* bf16-weight GEMV for small-batch decode on CPUs without native bf16 matmuls.
 *
 * A decode step at batch 1-4 reads every weight once per token, so its speed is the
 * memory bandwidth divided by the weight bytes. torch on an AVX2-only CPU either runs
 * bf16 matmuls through a slow scalar path or needs float32 weights (twice the bytes).
 * This kernel streams bf16 weights (half the bytes), widens them to float32 in
 * registers (a 16-bit shift: bf16 is the top half of a float32) and accumulates in
 * float32, so the result equals float32 math on the bf16-rounded weights.
 *
 * Weight layout (written by gemv_bf16_pack): for each block of GEMV_BF16_ROWS output
 * rows, for each group of 8 input columns, the 8 values of each of the block's rows:
 * [N / ROWS][K / 8][ROWS][8]. The kernel then reads the weights strictly
 * sequentially, which the hardware prefetcher (plus one software prefetch) keeps fed.
 */
#ifndef RINGLLM_GEMV_BF16_H
#define RINGLLM_GEMV_BF16_H

#include <stdint.h>

#define GEMV_BF16_ROWS 4
#define GEMV_BF16_COLS 8
#define GEMV_BF16_MAX_M 4

/* Reorders a row-major [n, k] bf16 matrix (as uint16 bit patterns) into the blocked
 * layout above. n % GEMV_BF16_ROWS == 0 and k % GEMV_BF16_COLS == 0. */
void gemv_bf16_pack(const uint16_t *src, uint16_t *dst, int64_t n, int64_t k);

/* y[m, j] = sum_i x[m, i] * w[j, i] for m < M <= GEMV_BF16_MAX_M; x is [M, k] and y is
 * [M, n], both row-major float32; w is packed. Returns 0, or -1 for unsupported sizes. */
int gemv_bf16(const float *x, const uint16_t *w, float *y, int64_t m, int64_t n, int64_t k);

/* The same product on a dense row-major [n, k] bf16 matrix, unpacked: for a weight whose rows
 * are also read as rows (a tied LM head is the embedding), so one copy serves both. */
int gemv_bf16_dense(const float *x, const uint16_t *w, float *y, int64_t m, int64_t n, int64_t k);

#endif
