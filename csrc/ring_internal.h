/*
 * ring_internal.h - helpers shared by the ring's C files (not part of the layout contract).
 */
#ifndef RINGLLM_RING_INTERNAL_H
#define RINGLLM_RING_INTERNAL_H

#define ALIGN8(x) (((x) + 7u) & ~(uint64_t)7u)
#define SPIN_CHECK_EVERY 64 /* spin iterations between two looks at the clock */

#endif /* RINGLLM_RING_INTERNAL_H */
