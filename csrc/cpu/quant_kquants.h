/* quant_kquants.c's entry points, which quant_gemv.c dispatches the K-quants to; not part of the
 * cffi interface. */
#ifndef RINGLLM_QUANT_KQUANTS_H
#define RINGLLM_QUANT_KQUANTS_H

#include <stdint.h>

/* The K-quant half of quant_gemv / quant_dequantize (types Q4_K, Q5_K, Q6_K; k % 256 == 0,
 * checked by the caller). isa is already capped. Returns 0, or -2 when scratch ran out. */
int quant_k_gemv(int type, const float *x, int64_t x_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k,
                 int isa, float *y);
void quant_k_dequantize(int type, const uint8_t *w, int64_t n, int64_t k, float *out);
/* All m rows of a K-quant quant_gemv on quant_kgemm.c's tiled GEMM (AVX-512 VNNI, checked by the
 * caller). Returns 0, or -2 when scratch ran out. */
int quant_k_gemm(int type, const float *x, int64_t x_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k,
                 float *y);

#endif
