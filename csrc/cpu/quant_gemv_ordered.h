/* quant_gemv_ordered.c's GEMV in the tiled GEMM's order of sums, for quant_gemv_row_invariant;
 * not part of the cffi interface. */
#ifndef RINGLLM_QUANT_GEMV_ORDERED_H
#define RINGLLM_QUANT_GEMV_ORDERED_H

#include <stddef.h>
#include <stdint.h>

/* quant_gemv_ordered.c: y [m, n] with quant_gemm_avx512's arithmetic, row for row, without its
 * repacking (the small row counts of quant_gemv_row_invariant; AVX-512 VNNI checked by the
 * caller); x as for quant_gemm_avx512, xsum scratch of m * (k / 32) int32. */
void quant_gemv_gemm_order_avx512(int type, const int8_t *xq, size_t q_stride, const float *xd, const float *xs,
                                  size_t s_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k, int32_t *xsum,
                                  float *y);

#endif
