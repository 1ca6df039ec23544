/* quant_kquants.c's entry points, which quant_gemv.c dispatches the K-quants to; not part of the
 * cffi interface. */
#ifndef RINGLLM_QUANT_KQUANTS_H
#define RINGLLM_QUANT_KQUANTS_H

#include <stddef.h>
#include <stdint.h>

#include "quant_kgemm.h"

/* The K-quant half of quant_gemv / quant_dequantize (types Q4_K, Q5_K, Q6_K; k % 256 == 0,
 * checked by the caller). isa is already capped. Returns 0, or -2 when scratch ran out. */
int quant_k_gemv(int type, const float *x, int64_t x_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k,
                 int isa, float *y);
void quant_k_dequantize(int type, const uint8_t *w, int64_t n, int64_t k, float *out);
/* All m rows of a K-quant quant_gemv on quant_kgemm.c's tiled GEMM (AVX-512 VNNI, checked by the
 * caller). Returns 0, or -2 when scratch ran out. */
int quant_k_gemm(int type, const float *x, int64_t x_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k,
                 float *y);

/* The two steps of quant_k_gemv for a caller that lays out rows and splits work itself
 * (quant_moe.c): the bytes of m rows of k as an actk_t (a multiple of 64) and its arrays over
 * them (mem 64-byte aligned); m rows of x quantized into a's rows 0..m-1; y[r * ldy + j] for
 * r < m <= QUANT_GEMV_MAX_M and W's n rows from w, one pass over them, on one thread. */
size_t quant_k_act_bytes(int64_t m, int64_t k);
void quant_k_act_at(uint8_t *mem, int64_t m, int64_t k, actk_t *a);
void quant_k_quantize_rows(int isa, const float *x, int64_t x_stride, int64_t m, const actk_t *a);
void quant_k_gemv_slice(int type, int isa, const actk_t *a, int64_t m, const uint8_t *w, int64_t n, float *y,
                        int64_t ldy);

#endif
