/*
 * ring_atomic.h - every atomic operation on the shared segment goes through these macros.
 *
 * One place to read the memory model of the ring (in the spirit of liburing's barrier.h).
 * The words they touch are C11 _Atomic objects living in shared memory; lock-free 32- and
 * 64-bit atomics are address-free, so they work across processes (C11 7.17.5, and gcc on
 * x86-64/aarch64, the only targets we build for).
 *
 * Every call site carries a comment saying why it needs that ordering.
 */
#ifndef RINGLLM_RING_ATOMIC_H
#define RINGLLM_RING_ATOMIC_H

#include <stdatomic.h>

/* A load that may see a stale value: only a hint, or a word only this side writes. */
#define RING_LOAD_RELAXED(p) atomic_load_explicit((p), memory_order_relaxed)
/* A store nobody orders other accesses against (our own private-ish words, hints). */
#define RING_STORE_RELAXED(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)
/* Pairs with RING_STORE_RELEASE: everything written before the release store is visible after. */
#define RING_LOAD_ACQUIRE(p) atomic_load_explicit((p), memory_order_acquire)
/* Publishes every write sequenced before it to a thread that acquire-loads the new value. */
#define RING_STORE_RELEASE(p, v) atomic_store_explicit((p), (v), memory_order_release)
/* A read-modify-write that both publishes and observes (wake-up sequence counters). */
#define RING_FETCH_ADD_ACQ_REL(p, v) atomic_fetch_add_explicit((p), (v), memory_order_acq_rel)
#define RING_FETCH_OR_ACQ_REL(p, v) atomic_fetch_or_explicit((p), (v), memory_order_acq_rel)
/*
 * Full fence: orders an earlier store before a later load (the one reordering x86 allows).
 * This is the Dekker half of every wake-up: "I published / I am going to sleep" must be
 * globally visible before "is the other side asleep? / did anything get published?".
 */
#define RING_FENCE_FULL() atomic_thread_fence(memory_order_seq_cst)

/* A polite spin-wait hint to the CPU (and to an SMT sibling). */
#if defined(__x86_64__) || defined(__i386__)
#define RING_CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define RING_CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define RING_CPU_RELAX() atomic_signal_fence(memory_order_seq_cst)
#endif

#endif /* RINGLLM_RING_ATOMIC_H */
