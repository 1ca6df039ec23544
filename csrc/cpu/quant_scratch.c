/* See quant_scratch.h. */
#include "quant_scratch.h"

#include <stdlib.h>

void *quant_scratch(size_t bytes) {
    static __thread void *buf;
    static __thread size_t cap;
    if (bytes <= cap) return buf;
    const size_t want = (bytes + 4095) / 4096 * 4096;
    void *p = aligned_alloc(64, want);
    if (!p) return NULL;
    free(buf);
    buf = p;
    cap = want;
    return buf;
}
