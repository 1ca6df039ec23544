/* quant_kgemm.c's tiled K-quant GEMM and the Q8_K activation layout it shares with the K-quant
 * GEMV (quant_kquants.c); not part of the cffi interface. */
#ifndef RINGLLM_QUANT_KGEMM_H
#define RINGLLM_QUANT_KGEMM_H

#include <stddef.h>
#include <stdint.h>

/* Activation scratch of one call, x quantized as llama.cpp's Q8_K: row r's super-block b has its
 * int8 values at q[(r nsb + b) 256], its 16 group sums at bs[(r nsb + b) 16] and its dx at
 * d[r nsb + b]. */
typedef struct {
    int8_t *q;
    int16_t *bs;
    float *d;
    int64_t nsb;
} actk_t;

/* Rows r0.. of a as an actk_t of their own. */
static inline actk_t actk_from_row(const actk_t *a, int64_t r0) {
    actk_t o = *a;
    const size_t blocks = (size_t)r0 * (size_t)a->nsb;
    o.q += blocks * 256;
    o.bs += blocks * 16;
    o.d += blocks;
    return o;
}

/* quant_kgemm.c, the batched path on AVX-512 VNNI (the CPU checked by the caller): y [m, n] from x
 * already quantized into a. work is 64-byte aligned scratch of quant_kgemm_work_bytes(k) bytes. */
size_t quant_kgemm_work_bytes(int64_t k);
void quant_kgemm_avx512(int type, const actk_t *a, int64_t m, const uint8_t *w, int64_t n, void *work, float *y);
/* quant_kgemm_avx512's work on one thread: W's output rows [first, first + count) (first a
 * multiple of QUANT_KGEMM_TILE) into y's columns, repacked a tile at a time into `tile`
 * (quant_kgemm_tile_bytes(k) bytes, 64-byte aligned). */
#define QUANT_KGEMM_TILE 32
size_t quant_kgemm_tile_bytes(int64_t k);
void quant_kgemm_avx512_rows(int type, const actk_t *a, int64_t m, const uint8_t *w, int64_t n, int64_t first,
                             int64_t count, void *tile, float *y);

#endif
