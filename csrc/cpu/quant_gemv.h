/* Small-batch matmuls straight on GGUF block-quantized weights (Q4_0, Q4_1, Q8_0; the
 * K-quants Q4_K, Q5_K, Q6_K in quant_kquants.c, whose header comment has their layout).
 *
 * A decode step at a few rows reads every weight once per token, so its speed is the
 * memory bandwidth divided by the weight bytes: a Q4_1 weight is 5 bits, bf16 is 16. The
 * kernel reads the GGUF's own blocks (no repacking: a row of W is K / 32 blocks, rows one
 * after another, as in the file), dequantizes them in registers and multiplies with int8
 * dot products. Each row of x is first quantized to int8 blocks of 32 (scale d = max|x| /
 * 127 and d * sum(q) per block, as llama.cpp's Q8_1): per block the dot product is then
 *   Q8_0:  d_w d_x sum(q_w q_x)
 *   Q4_0:  d_w (d_x sum(q_w q_x) - 8 s_x)          (w = d_w (q_w - 8))
 *   Q4_1:  d_w d_x sum(q_w q_x) + m_w s_x           (w = d_w q_w + m_w)
 * with s_x = d_x sum(q_x). All rows of x are multiplied with a weight block while it is in
 * registers, so W is read once per pass of up to QUANT_GEMV_MAX_M rows (6 for these types on
 * AVX-512, whose pass spills registers beyond: quant_gemv.c).
 *
 * Batches: on AVX-512 VNNI and AVX2, Q4_0, Q4_1 and Q8_0 from QUANT_GEMM_MIN_M rows run a tiled
 * int8 GEMM instead (quant_gemm.c: W repacked per call, 32 output rows at a time, into
 * vpdpbusd's layout, then every row of x multiplies it), which reads W once per call at any
 * row count; so do Q4_K, Q5_K and Q6_K on AVX-512 VNNI from QUANT_KGEMM_MIN_M rows
 * (quant_kgemm.c, the same tile on super-blocks).
 *
 * Variants: AVX-512 (F, BW, VNNI: vpdpbusd, two blocks per register), AVX2 (vpmaddubsw),
 * plain C; the best one the CPU has, chosen by CPUID, capped by max_isa so tests run each.
 */
#ifndef RINGLLM_QUANT_GEMV_H
#define RINGLLM_QUANT_GEMV_H

#include <stdint.h>

#include "quant_types.h"

#define QUANT_GEMV_MAX_M 8
/* From this many rows, Q4_0, Q4_1 and Q8_0 on AVX-512 VNNI or AVX2 (the K-quants on AVX-512 VNNI)
 * run the tiled GEMM (quant_gemm.c, quant_kgemm.c), which reads W once per call whatever the
 * rows. A W streamed from memory once took the GEMV's passes up to 15 rows, while the GEMM's
 * repack stalled on each row's first touch; with the next tile prefetched (quant_tile.h) the GEMM
 * is faster from here at every size (Zen5, two threads, Q4_0 MLP-sized W from DRAM: 4 rows 4.8
 * -> 3.8 ms, 8 rows 8.2 -> 4.5 ms; forced AVX2 7.5 -> 6.3, 13.7 -> 8.9). */
#define QUANT_GEMM_MIN_M 4
/* The K-quants' GEMM repacks more per weight (a decode and per-group scales), ~130 us a call at
 * 1536->576 on the Zen4, so it starts where the GEMV would take a second pass over W: up to 8
 * rows one pass was faster (148-157 against 160-183 us at 8 rows), from 12 the GEMM (177-199
 * against 231-257). */
#define QUANT_KGEMM_MIN_M 9 /* QUANT_GEMV_MAX_M + 1 (cffi reads literal #defines only) */

/* The best variant this CPU runs (a QUANT_ISA_* value). */
int quant_best_isa(void);

/* y[r, j] = sum_i x[r, i] * W[j, i] for r < m; x is [m, k] float32 (row stride x_stride
 * floats), y is [m, n] float32 row-major; w holds W's n rows of k / quant_block_weights(type)
 * blocks. W is read once per QUANT_GEMV_MAX_M rows of x (all of them multiply a weight block
 * while it is in registers), or once per call on the GEMM path (see above). Returns 0; -1 for bad sizes or type; -2 when scratch memory ran
 * out. The int8 copy of x lives in a per-thread buffer reused by the next call. */
int quant_gemv(int type, const float *x, int64_t x_stride, int64_t m, const uint8_t *w, int64_t n, int64_t k,
               int max_isa, float *y);

/* quant_gemv whose row r of y never depends on the other rows of x (batch invariance, for
 * deterministic runs): the GEMV and the tiled GEMM sum a row's blocks in different orders, and
 * quant_gemv picks one by the row count. Here every m, 1 included, computes what the tiled GEMM
 * computes where one runs this type on this CPU (its rows are independent tiles): below the
 * GEMM's threshold, on AVX-512 VNNI, a GEMV with the GEMM's order of sums (quant_gemv_ordered.c),
 * elsewhere the GEMM itself; one GEMV pass per row where no GEMM runs. Same returns as quant_gemv. */
int quant_gemv_row_invariant(int type, const float *x, int64_t x_stride, int64_t m, const uint8_t *w, int64_t n,
                             int64_t k, float *y);

/* The dense float32 [n, k] matrix of w (for steps too large for the GEMV). Returns 0 or -1. */
int quant_dequantize(int type, const uint8_t *w, int64_t n, int64_t k, float *out);

#endif
