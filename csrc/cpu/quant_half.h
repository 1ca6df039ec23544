/* The IEEE half scales of GGUF blocks read as floats, for the baseline (non-F16C) paths of
 * quant_gemv.c and quant_kquants.c; not part of the cffi interface. */
#ifndef RINGLLM_QUANT_HALF_H
#define RINGLLM_QUANT_HALF_H

#include <stdint.h>
#include <string.h>

/* IEEE half to float, exact (the baseline paths' conversion; SIMD paths use F16C). */
static inline float quant_half_to_float(const uint8_t *p) {
    const uint32_t h = (uint32_t)p[0] | ((uint32_t)p[1] << 8);
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal half: a normal float */
        int e = -1;
        uint32_t mm = man;
        do { e++; mm <<= 1; } while (!(mm & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((mm & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#endif
