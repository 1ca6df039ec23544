/* Token bitmask of structured outputs applied to float32 logits (engine/structured_output/bitmask.py).
 *
 * bitmask row i (``words`` int32 words) belongs to logits row rows[i]; bit t % 32 of word t / 32 set
 * means token t is allowed. Every token t < vocab whose bit is clear gets -inf. A word with all 32
 * bits set (inside a JSON string, most of them) costs one compare, so a step pays for what the
 * grammar forbids, not for the vocabulary. */
#ifndef RINGLLM_TOKEN_BITMASK_H
#define RINGLLM_TOKEN_BITMASK_H

#include <stdint.h>

void ringllm_apply_token_bitmask_f32(float *logits, int64_t row_stride, const int32_t *bitmask, int64_t words,
                                     const int64_t *rows, int64_t n_rows, int64_t vocab);

#endif
