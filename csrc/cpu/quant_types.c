/* See quant_types.h. */
#include "quant_types.h"

int quant_block_bytes(int type) {
    switch (type) {
    case QUANT_GGML_Q4_0: return 2 + QUANT_BLOCK / 2;
    case QUANT_GGML_Q4_1: return 4 + QUANT_BLOCK / 2;
    case QUANT_GGML_Q8_0: return 2 + QUANT_BLOCK;
    case QUANT_GGML_Q4_K: return 4 + 12 + QUANT_KBLOCK / 2;
    case QUANT_GGML_Q5_K: return 4 + 12 + QUANT_KBLOCK / 8 + QUANT_KBLOCK / 2;
    case QUANT_GGML_Q6_K: return QUANT_KBLOCK / 2 + QUANT_KBLOCK / 4 + QUANT_KBLOCK / 16 + 2;
    default: return 0;
    }
}

int quant_block_weights(int type) {
    if (type == QUANT_GGML_Q4_K || type == QUANT_GGML_Q5_K || type == QUANT_GGML_Q6_K) return QUANT_KBLOCK;
    return quant_block_bytes(type) ? QUANT_BLOCK : 0;
}
