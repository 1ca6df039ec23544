/*
 * ring_wake.h - sleeping and waking across processes: shared futexes and eventfds.
 *
 * Futexes are shared (no FUTEX_PRIVATE_FLAG): the two sides are different processes mapping
 * the same segment. Every wait has a timeout and returns on EINTR, so a dead peer is noticed
 * and a signal (Ctrl-C) reaches Python promptly; the caller re-checks and loops.
 */
#ifndef RINGLLM_RING_WAKE_H
#define RINGLLM_RING_WAKE_H

#include <stdatomic.h>
#include <stdint.h>

/* CLOCK_MONOTONIC in nanoseconds (vDSO, no system call). */
uint64_t ring_now_ns(void);

/* Sleep while *word == expected, at most timeout_ns. 0 when woken, else -errno
 * (-EAGAIN: the word had already changed, -ETIMEDOUT, -EINTR). */
int ring_futex_wait(_Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns);

/* Wake whoever sleeps on `word` in the ways `how` asks (RING_WAIT_* bits): bump the word,
 * FUTEX_WAKE it, and/or write 1 to eventfd `efd` (ignored when efd < 0). */
void ring_wake_word(_Atomic uint32_t *word, uint32_t how, int efd);

#endif /* RINGLLM_RING_WAKE_H */
