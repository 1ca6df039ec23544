/* RMSNorm, SiLU-and-multiply and RoPE in float32 and bf16 for CPUs, one call per op.
 *
 * At batch 1-4 these ops touch a few KiB, and torch spends its time in dispatch: RMSNorm
 * decomposes into 5-6 ATen ops (~50 us per call here, 61 calls per step of a 30-layer
 * model), SwiGLU's silu and multiply into two. One C call each costs a few microseconds.
 * At prefill sizes in bf16 the same decomposition costs passes over memory instead: each
 * ATen op widens to float32 and rounds back, and the three ops took ~30% of a 2048-token
 * step (benchmarks/RESULTS.md, "Kernel choices"). One pass each here.
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

/* The same two in bf16 (bit patterns as uint16_t), computed in float32 and rounded to
 * nearest even where transformers' bf16 modules round: the residual sum; the normalised
 * row before and after the weight; silu(gate) before and after the multiply. These need
 * AVX-512 BF16 (cpu_avx512_bf16_supported) and widths % 16 == 0. */
int rms_norm_bf16(const uint16_t *x, uint16_t *residual, const uint16_t *w, uint16_t *y, int64_t rows,
                  int64_t cols, float eps);
int silu_and_mul_bf16(const uint16_t *x, uint16_t *y, int64_t rows, int64_t d);

/* RoPE in place on the first heads * head_dim columns of each of rows rows (row_stride
 * elements apart; float32, or bf16 when bf16 != 0) of a fused q/k/v projection, whose head
 * rows hold rotary pairs adjacent ((2i, 2i + 1), see engine/models/llama.py). cos_sin is
 * float32 [max_positions, head_dim / 2, 2]: (cos, sin) of position p's pair i. Each pair is
 * rotated in float32 and rounded once. head_dim % 8 == 0 in float32; in bf16
 * head_dim % 16 == 0 and AVX-512 BF16. Returns 0, or -1 for unsupported
 * sizes or CPU, or a position outside [0, max_positions) (then nothing is written). */
int rotary_in_place(void *qkv, int bf16, int64_t row_stride, int64_t rows, const int64_t *positions,
                    const float *cos_sin, int64_t max_positions, int64_t heads, int64_t head_dim);

#endif
