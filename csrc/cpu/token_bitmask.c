#include "token_bitmask.h"

#include <math.h>

void ringllm_apply_token_bitmask_f32(float *logits, int64_t row_stride, const int32_t *bitmask, int64_t words,
                                     const int64_t *rows, int64_t n_rows, int64_t vocab) {
    int64_t used = (vocab + 31) / 32;
    if (used > words)
        used = words;  /* tokens past the mask are left alone, as xgrammar's kernel does */
    for (int64_t i = 0; i < n_rows; i++) {
        float *row = logits + rows[i] * row_stride;
        const uint32_t *mask = (const uint32_t *)(bitmask + i * words);
        for (int64_t w = 0; w < used; w++) {
            uint32_t m = mask[w];
            if (m == UINT32_MAX)
                continue;
            int64_t base = w * 32;
            int64_t n = vocab - base < 32 ? vocab - base : 32;
            uint32_t forbidden = ~m & (n == 32 ? UINT32_MAX : ((1u << n) - 1u));
            if (forbidden == UINT32_MAX) {
                for (int b = 0; b < 32; b++)
                    row[base + b] = -INFINITY;
                continue;
            }
            while (forbidden) {
                row[base + __builtin_ctz(forbidden)] = -INFINITY;
                forbidden &= forbidden - 1u;
            }
        }
    }
}
