/* Decode attention read straight from the paged KV cache, for CPUs.
 *
 * torch's route for a decode step gathers every sequence's cache blocks into a padded
 * dense tensor (a copy of the whole context per layer, plus a dtype conversion when the
 * cache is bf16), then runs masked SDPA over the padding. At batch 64 that was ~22% of a
 * step. Here each (sequence, KV head) pair walks its own blocks once: scores for the
 * query heads that share the KV head, a softmax, and the weighted sum of V, all in
 * float32, reading K and V where they lie (float32 or bf16).
 *
 * Cache layout (engine/models/attention.py): [num_blocks, block_size, 2 * Hkv * D], a
 * slot holding the token's K heads then its V heads. Query head h uses KV head
 * h / (H / Hkv), as in grouped-query attention.
 */
#ifndef RINGLLM_PAGED_ATTENTION_H
#define RINGLLM_PAGED_ATTENTION_H

#include <stdint.h>

#define PAGED_ATTN_F32 0
#define PAGED_ATTN_BF16 1
#define PAGED_ATTN_MAX_HEAD_DIM 256

/* out[s, h*D:(h+1)*D] = softmax(scale * q_h . K[s]) V[s] over keys [start, seq_lens[s]),
 * start = seq_lens[s] - window (or 0 when window <= 0 or that is negative); softcap > 0 caps
 * each score as softcap * tanh(score / softcap) before the softmax (Gemma 2), 0 leaves them.
 * q: float32 rows with a stride of q_stride floats; block_table: [num_seqs, max_blocks].
 * allow_avx512: 0 keeps the AVX2 variant even where the CPU has AVX-512 (for tests of that path).
 * Returns 0; -1 for an invalid argument (bad sizes, a block id outside [0, num_blocks),
 * a sequence longer than its table); -2 when scratch memory could not be allocated. */
int paged_decode_attention(const float *q, int64_t q_stride, const void *kv_cache, int kv_dtype,
                           int64_t num_blocks, int64_t block_size, const int64_t *block_table,
                           int64_t max_blocks, const int64_t *seq_lens, int64_t num_seqs,
                           int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t window,
                           float scale, float softcap, int allow_avx512, float *out);

#endif
