/* What the hand-written CPU kernels (gemv_bf16.c, paged_attention.c, activation.c) need from the CPU. */
#ifndef RINGLLM_CPU_FEATURES_H
#define RINGLLM_CPU_FEATURES_H

/* 1 when this CPU has AVX2 and FMA, the kernels' only requirement; else 0 (they then
 * refuse every call and the Python side keeps torch's path). */
int cpu_kernels_supported(void);

/* 1 when the CPU also has AVX-512 F and BW, which paged_attention.c's wider variant uses. */
int cpu_avx512_supported(void);

/* 1 when the CPU also has AVX-512 VL and BF16 (Cooper Lake, Sapphire Rapids, Zen 4 and later):
 * the bf16 activation kernels' requirement, and the CPUs where a bf16 model runs its
 * activations in bf16 at all. */
int cpu_avx512_bf16_supported(void);

#endif
