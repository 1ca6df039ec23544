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

/* The pieces of those for a caller that lays out rows and splits work itself (quant_moe.c; x86-64
 * only): row r's block sums of q_x (Q4_0's and Q8_0's offset terms: xsum[r nb + b]), and the
 * work of one thread: W's output rows [first, first + count) (first a multiple of QUANT_GEMM_TILE)
 * into y's columns, repacked a tile at a time into `tile` (quant_gemm_tile_bytes(k) bytes,
 * 64-byte aligned), for the m rows of x whose block sums are at xsum. */
#define QUANT_GEMM_TILE 32
size_t quant_gemm_tile_bytes(int64_t k);
void quant_gemm_block_sums(const int8_t *xq, size_t q_stride, int64_t m, int64_t nb, int32_t *xsum);
void quant_gemm_avx512_rows(int type, const int8_t *xq, size_t q_stride, const float *xd, const float *xs,
                            const int32_t *xsum, size_t s_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k,
                            int64_t first, int64_t count, void *tile, float *y);
void quant_gemm_avx2_rows(int type, const int8_t *xq, size_t q_stride, const float *xd, const float *xs,
                          const int32_t *xsum, size_t s_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k,
                          int64_t first, int64_t count, void *tile, float *y);

#endif
