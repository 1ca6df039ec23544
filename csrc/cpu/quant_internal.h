/* What quant_gemv.c (32-weight blocks) and quant_kquants.c (256-weight K-quant super-blocks)
 * share; not part of the cffi interface. */
#ifndef RINGLLM_QUANT_INTERNAL_H
#define RINGLLM_QUANT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* A 64-byte aligned buffer of at least `bytes`, owned by the calling thread and reused by its
 * next call (grow-only): a decode step calls the kernels ~200 times, and a malloc/free pair
 * per call cost more than quantizing x. NULL when memory ran out. */
void *quant_scratch(size_t bytes);

/* IEEE half to float, exact (the baseline paths' conversion; SIMD paths use F16C). */
static inline float quant_half_to_float(const uint8_t *p) {
    const uint32_t h = (uint32_t)p[0] | ((uint32_t)p[1] << 8);
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal half: a normal float */
        int e = -1;
        uint32_t mm = man;
        do { e++; mm <<= 1; } while (!(mm & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((mm & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The K-quant half of quant_gemv / quant_dequantize (types Q4_K, Q5_K, Q6_K; k % 256 == 0,
 * checked by the caller). isa is already capped. Returns 0, or -2 when scratch ran out. */
int quant_k_gemv(int type, const float *x, int64_t x_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k,
                 int isa, float *y);
void quant_k_dequantize(int type, const uint8_t *w, int64_t n, int64_t k, float *out);
/* All m rows of a K-quant quant_gemv on quant_kgemm.c's tiled GEMM (AVX-512 VNNI, checked by the
 * caller). Returns 0, or -2 when scratch ran out. */
int quant_k_gemm(int type, const float *x, int64_t x_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k,
                 float *y);

/* quant_gemm.c, the batched path of Q4_0, Q4_1 and Q8_0 on AVX-512 VNNI or AVX2 (the CPU checked
 * by the caller): y [m, n] from x already quantized to int8 blocks (row r's block b at
 * xq[r q_stride + 32 b], its d_x and s_x at xd / xs[r s_stride + b]). work is 64-byte aligned
 * scratch of quant_gemm_work_bytes(m, k) bytes. */
size_t quant_gemm_work_bytes(int64_t m, int64_t k);
void quant_gemm_avx512(int type, const int8_t *xq, size_t q_stride, const float *xd, const float *xs, size_t s_stride,
                       int64_t m, const uint8_t *w, int64_t n, int64_t k, void *work, float *y);
void quant_gemm_avx2(int type, const int8_t *xq, size_t q_stride, const float *xd, const float *xs, size_t s_stride,
                     int64_t m, const uint8_t *w, int64_t n, int64_t k, void *work, float *y);

/* quant_gemv_ordered.c: y [m, n] with quant_gemm_avx512's arithmetic, row for row, without its
 * repacking (the small row counts of quant_gemv_row_invariant; AVX-512 VNNI checked by the
 * caller); x as for quant_gemm_avx512, xsum scratch of m * (k / 32) int32. */
void quant_gemv_gemm_order_avx512(int type, const int8_t *xq, size_t q_stride, const float *xd, const float *xs,
                                  size_t s_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k, int32_t *xsum,
                                  float *y);

#endif
