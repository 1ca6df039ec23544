/* What the hand-written CPU kernels (gemv_bf16.c, paged_attention.c) need from the CPU. */
#ifndef RINGLLM_CPU_FEATURES_H
#define RINGLLM_CPU_FEATURES_H

/* 1 when this CPU has AVX2 and FMA, the kernels' only requirement; else 0 (they then
 * refuse every call and the Python side keeps torch's path). */
int cpu_kernels_supported(void);

/* 1 when the CPU also has AVX-512 F and BW, which paged_attention.c's wider variant uses. */
int cpu_avx512_supported(void);

#endif
