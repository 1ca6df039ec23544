#include "cpu_features.h"

int cpu_kernels_supported(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

int cpu_avx512_supported(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    return cpu_kernels_supported() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#else
    return 0;
#endif
}

int cpu_avx512_bf16_supported(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    return cpu_avx512_supported() && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}
