/* RMSNorm and SiLU-and-multiply in float32 for CPUs, one call per op.
 *
 * At batch 1-4 these ops touch a few KiB, and torch spends its time in dispatch: RMSNorm
 * decomposes into 5-6 ATen ops (~50 us per call here, 61 calls per step of a 30-layer
 * model), SwiGLU's silu and multiply into two. One C call each costs a few microseconds.
 */
#ifndef RINGLLM_ACTIVATION_H
#define RINGLLM_ACTIVATION_H

#include <stdint.h>

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for rows r < rows, cols % 8 == 0; x and y are
 * row-major [rows, cols] (y may be x). When residual is not NULL it is added first and
 * the sum is written back into it: residual += x; y = norm(residual), as a decoder layer's
 * skip connection needs. Returns 0, or -1 for unsupported sizes or CPU. */
int rms_norm_f32(const float *x, float *residual, const float *w, float *y, int64_t rows, int64_t cols, float eps);

/* y[r, i] = silu(x[r, i]) * x[r, d + i] for x [rows, 2d], y [rows, d], d % 8 == 0.
 * Returns 0, or -1 for unsupported sizes or CPU. */
int silu_and_mul_f32(const float *x, float *y, int64_t rows, int64_t d);

#endif
