/* One projection of a mixture-of-experts layer for all of a step's (row, expert) pairs in one
 * call, on the experts' GGUF blocks (the types quant_gemv runs).
 *
 * Why: a decode step of a Qwen3-MoE (top-8, 24 layers) called quant_gemv twice per chosen expert
 * and layer, ~400 calls a token from Python, each with its own argument checks, activation
 * quantization and fork/join of the thread pool. Here a layer's gate/up (or down) is one call:
 * the pairs are grouped by expert (a counting sort), every pair's row of x is quantized once, and
 * the work is split over the pool (parallel.h) by expert x output rows, so each active expert's
 * weights are read once for all the rows routed to it and an expert no pair chose is not read.
 *
 * Each expert's rows run what quant_gemv runs for that many rows (the GEMV passes or the tiled
 * GEMM, quant_gemv_rows.h quant_gemm_runs), on the same inner kernels, so every output is the
 * value quant_gemv gives for that expert's rows alone, bit for bit.
 */
#ifndef RINGLLM_QUANT_MOE_H
#define RINGLLM_QUANT_MOE_H

#include <stdint.h>

/* y[p, j] = sum_i x[rows[p], i] * W_e[j, i] with e = experts[p], for p < pairs: x is [x_rows, k]
 * float32 (row stride x_stride floats), y is [pairs, n] float32 row-major in pair order, and w
 * holds num_experts experts' n rows of k / quant_block_weights(type) blocks each, one expert
 * after another (a GGUF file's ffn_*_exps tensor). max_isa caps the kernels' variant. Returns 0;
 * -1 for bad sizes, type, rows or experts; -2 when scratch memory ran out. */
int quant_moe(int type, const float *x, int64_t x_stride, int64_t x_rows, const int64_t *rows,
              const int64_t *experts, int64_t pairs, const uint8_t *w, int64_t num_experts, int64_t n, int64_t k,
              int max_isa, float *y);

#endif
