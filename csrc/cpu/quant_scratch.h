/* The per-thread activation scratch of the quantized and int8 kernels (quant_scratch.c);
 * not part of the cffi interface. */
#ifndef RINGLLM_QUANT_SCRATCH_H
#define RINGLLM_QUANT_SCRATCH_H

#include <stddef.h>

/* A 64-byte aligned buffer of at least `bytes`, owned by the calling thread and reused by its
 * next call (grow-only): a decode step calls the kernels ~200 times, and a malloc/free pair
 * per call cost more than quantizing x. NULL when memory ran out. */
void *quant_scratch(size_t bytes);

#endif
