/* Dynamic W8A8 small-batch matmuls: int8 weights with one float scale per output channel
 * (quantized once from a float matrix), activations quantized per call with one scale per
 * row (per token), int8 dot products, float32 output:
 *   y[r, j] = s_x[r] s_w[j] sum_i q_x[r, i] q_w[j, i],   s = max|row| / 127, q = rint(v / s)
 * (the weights are quantized once, in Python: engine/kernels/int8_linear.py).
 * The AVX-512 VNNI variant (vpdpbusd multiplies unsigned by signed bytes) feeds q_x + 128 and
 * takes 128 sum_i q_w[j, i] (wsum, computed once with the weights) back off; the AVX2 variant
 * moves q_w's sign onto q_x and multiplies |q_w| (vpmaddubsw; |q| <= 127, so a pair cannot
 * saturate); plain C otherwise. Chosen by CPUID, capped by max_isa (QUANT_ISA_* values). */
#ifndef RINGLLM_INT8_GEMV_H
#define RINGLLM_INT8_GEMV_H

#include <stdint.h>

#define INT8_GEMV_MAX_M 8

/* y[r, j] as above for r < m <= INT8_GEMV_MAX_M; x is [m, k] float32 with row stride x_stride,
 * y is [m, n] float32 row-major. Returns 0; -1 for bad sizes; -2 when scratch memory ran out.
 * The int8 copy of x lives in a per-thread buffer reused by the next call. */
int int8_gemv(const float *x, int64_t x_stride, int64_t m, const int8_t *q, const float *scale, const int32_t *wsum,
              int64_t n, int64_t k, int max_isa, float *y);

#endif
