/* quant_gemv.c's GEMV of Q4_0, Q4_1 and Q8_0 in its two steps (quantize rows of x, then multiply
 * a slice of W's rows) and its choice between GEMV passes and a tiled GEMM, for a caller that lays
 * out rows and splits work itself (quant_moe.c: many experts' rows in one call); not part of the
 * cffi interface. */
#ifndef RINGLLM_QUANT_GEMV_ROWS_H
#define RINGLLM_QUANT_GEMV_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "quant_types.h"

/* x quantized to int8 blocks of 32, per row r: the int8 values of its blocks (nbp * 32 bytes,
 * nbp = blocks rounded up to even, the padding block zero), and d_x and s_x of each block as two
 * float arrays of nbs entries (blocks rounded up to 16, the padding zero), so the AVX-512 variant
 * loads sixteen blocks' scales in one register. Rows follow one another in each array. */
typedef struct {
    int8_t *q;
    float *d, *s;
    int64_t nbp, nbs;
} act_t;

static inline const int8_t *act_q(const act_t *a, int64_t r) { return a->q + (size_t)r * (size_t)a->nbp * QUANT_BLOCK; }
static inline const float *act_d(const act_t *a, int64_t r) { return a->d + (size_t)r * (size_t)a->nbs; }
static inline const float *act_s(const act_t *a, int64_t r) { return a->s + (size_t)r * (size_t)a->nbs; }

/* Rows r0.. of a as an act_t of their own. */
static inline act_t act_from_row(const act_t *a, int64_t r0) {
    act_t o = *a;
    o.q += (size_t)r0 * (size_t)a->nbp * QUANT_BLOCK;
    o.d += (size_t)r0 * (size_t)a->nbs;
    o.s += (size_t)r0 * (size_t)a->nbs;
    return o;
}

/* Bytes of m rows of k in that layout: a multiple of 64. */
static inline size_t act_bytes(int64_t m, int64_t k) {
    const size_t nbp = (size_t)(k / QUANT_BLOCK + 1) / 2 * 2, nbs = (size_t)(k / QUANT_BLOCK + 15) / 16 * 16;
    return (size_t)m * (2 * nbs * sizeof(float) + nbp * QUANT_BLOCK);
}

/* a over act_bytes(m, k) bytes at mem (64-byte aligned): d, s, then q. */
static inline void act_at(uint8_t *mem, int64_t m, int64_t k, act_t *a) {
    a->nbp = (k / QUANT_BLOCK + 1) / 2 * 2;
    a->nbs = (k / QUANT_BLOCK + 15) / 16 * 16;
    const size_t scbytes = (size_t)m * (size_t)a->nbs * sizeof(float);
    a->d = (float *)mem;
    a->s = (float *)(mem + scbytes);
    a->q = (int8_t *)(mem + 2 * scbytes);
}

/* quant_gemv.c: m rows of x (row stride x_stride floats) into a's rows 0..m-1; isa >= QUANT_ISA_AVX2
 * runs the AVX2 quantizer (the same values as the C one). */
void quant_quantize_rows(int isa, const float *x, int64_t x_stride, int64_t m, int64_t k, const act_t *a);

/* quant_gemv.c: y[r * ldy + j] for r < m <= QUANT_GEMV_MAX_M and W's n rows from w, in one pass
 * over them, on one thread (isa already capped to what the CPU runs). */
void quant_gemv_slice(int type, int isa, const act_t *a, int64_t m, const uint8_t *w, int64_t n, int64_t k, float *y,
                      int64_t ldy);

/* quant_gemv.c: the rows of each GEMV pass (the last may take fewer) when quant_gemv runs m rows
 * of this type as passes: at most QUANT_GEMV_MAX_M, fewer on AVX-512 (the passes balanced). */
int64_t quant_gemv_pass_rows(int type, int isa, int64_t m);

/* quant_gemv.c: whether quant_gemv runs m rows of this type on a tiled GEMM (quant_gemm.c,
 * quant_kgemm.c) rather than GEMV passes, for W rows of k and isa already capped. */
int quant_gemm_runs(int type, int isa, int64_t m, int64_t k);

#endif
