/* quant_gemm.c's tiled int8 GEMM, which quant_gemv.c runs for batches; not part of the cffi
 * interface. */
#ifndef RINGLLM_QUANT_GEMM_H
#define RINGLLM_QUANT_GEMM_H

#include <stddef.h>
#include <stdint.h>

/* quant_gemm.c, the batched path of Q4_0, Q4_1 and Q8_0 on AVX-512 VNNI or AVX2 (the CPU checked
 * by the caller): y [m, n] from x already quantized to int8 blocks (row r's block b at
 * xq[r q_stride + 32 b], its d_x and s_x at xd / xs[r s_stride + b]). work is 64-byte aligned
 * scratch of quant_gemm_work_bytes(m, k) bytes. */
size_t quant_gemm_work_bytes(int64_t m, int64_t k);
void quant_gemm_avx512(int type, const int8_t *xq, size_t q_stride, const float *xd, const float *xs, size_t s_stride,
                       int64_t m, const uint8_t *w, int64_t n, int64_t k, void *work, float *y);
void quant_gemm_avx2(int type, const int8_t *xq, size_t q_stride, const float *xd, const float *xs, size_t s_stride,
                     int64_t m, const uint8_t *w, int64_t n, int64_t k, void *work, float *y);

#endif
