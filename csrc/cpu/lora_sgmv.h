/* Multi-LoRA shrink and expand in one call: vLLM's punica SGMV (segmented gather matrix-vector)
 * for float32 on the CPU (engine/kernels/lora_sgmv.py, engine/lora/layer.py).
 *
 * A step's rows are grouped by adapter slot into segments: segment g runs slot seg_slot[g] on
 * rows rows[seg_start[g] .. seg_start[g + 1]) of x and y. For each such row i, slot s, with
 * w = width[s] columns of the slot's shrink in use (0: the slot skips this projection):
 *   y[i, :] += (x[i, :] @ a_t[s, :, :w]) @ b_t[s, :w, :]
 * a_t is [slots, in, cols] and b_t [slots, cols, out], float32, contiguous (as LoRAWeights holds
 * them). The projection has num_parts parts side by side (fused q/k/v, gate/up), part p writing
 * parts[p] output columns; a slot's rank is r = w / num_parts and part p's shrink columns
 * [p r, (p + 1) r) feed only part p's output columns (the rest of b_t's rows are zeros), so the
 * expand skips the zero blocks: num_parts times fewer multiply-adds than a dense expand.
 *
 * Each row's sums run in one fixed order whatever the other rows, the tiling or the threads
 * (batch invariant). Variants: AVX-512, AVX2 + FMA, plain C; the best this CPU runs, capped by
 * max_isa (a LORA_SGMV_ISA_* value; tests force each). */
#ifndef RINGLLM_LORA_SGMV_H
#define RINGLLM_LORA_SGMV_H

#include <stdint.h>

#define LORA_SGMV_ISA_C 0
#define LORA_SGMV_ISA_AVX2 1
#define LORA_SGMV_ISA_AVX512 2

/* The best variant this CPU runs (a LORA_SGMV_ISA_* value). */
int lora_sgmv_best_isa(void);

/* y += the update above, in place. x is [n, in] with row stride x_stride floats, y is [n, out]
 * with row stride y_stride (either may be a view of a wider buffer); out = sum of parts. Every
 * row index must be in [0, n), every slot in [0, slots), every width in [0, cols] and a multiple
 * of num_parts: -1 otherwise, before anything is written; else 0. A row must also appear at most
 * once (not checked: the threads split the rows, and each row is written by one of them). */
int lora_sgmv(const float *x, int64_t x_stride, float *y, int64_t y_stride, int64_t n, const int32_t *rows,
              const int32_t *seg_slot, const int32_t *seg_start, int64_t segments, const float *a_t,
              const float *b_t, const int32_t *width, int64_t slots, int64_t in, int64_t cols,
              const int32_t *parts, int64_t num_parts, int max_isa);

#endif
