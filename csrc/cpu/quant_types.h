/* The GGUF block types the quantized kernels read (their ids, block sizes and bytes) and the
 * kernel variants a call may be capped to: what every quant_*.c file shares, and nothing else.
 * Part of the cffi interface (engine/kernels/quant.py reads the sizes). */
#ifndef RINGLLM_QUANT_TYPES_H
#define RINGLLM_QUANT_TYPES_H

/* GGML type ids, as gguf.GGMLQuantizationType numbers them. */
#define QUANT_GGML_Q4_0 2
#define QUANT_GGML_Q4_1 3
#define QUANT_GGML_Q8_0 8
#define QUANT_GGML_Q4_K 12
#define QUANT_GGML_Q5_K 13
#define QUANT_GGML_Q6_K 14
#define QUANT_BLOCK 32
#define QUANT_KBLOCK 256

/* max_isa values: the most a call may use. */
#define QUANT_ISA_C 0
#define QUANT_ISA_AVX2 1
#define QUANT_ISA_AVX512_VNNI 2

/* Bytes of one block of this type, or 0 for a type the kernels lack. */
int quant_block_bytes(int type);

/* Weights in one block of this type: QUANT_BLOCK, QUANT_KBLOCK for the K-quants, 0 if unknown. */
int quant_block_weights(int type);

#endif
