/*
 * ring_internal.h - helpers shared by the ring's C files (not part of the layout contract).
 */
#ifndef RINGLLM_RING_INTERNAL_H
#define RINGLLM_RING_INTERNAL_H

#include "ring.h"

#include <stddef.h>
#include <stdint.h>

#define ALIGN8(x) (((x) + 7u) & ~(uint64_t)7u)
#define SPIN_CHECK_EVERY 64 /* spin iterations between two looks at the clock */

/* Counters every end keeps, in the order ring_*_stats reports them. */
enum { RING_STAT_SLEEPS, RING_STAT_TIMEOUTS, RING_STAT_WAKES, RING_STAT_OTHER, RING_NSTATS };

/*
 * What the producer and the consumer ends have in common; each embeds one as its first member.
 * `waiting`/`seq` are the header words this end sleeps on (its own *_waiting word, and the
 * futex word the other side bumps); `peer_waiting`/`peer_seq`/`peer_efd` are the ones it uses
 * to wake the other side after publishing.
 */
struct ring_end {
    struct ring_header *hdr;
    unsigned char *data;
    uint64_t cap, mask;
    int data_efd;  /* the consumer's eventfd (written by the producer) */
    int space_efd; /* the producer's eventfd (written by the consumer) */
    int corrupt;
    _Atomic uint32_t *waiting, *seq;
    _Atomic uint32_t *peer_waiting, *peer_seq;
    int peer_efd;
    /* RING_READY when the wait is over, RING_CLOSED when it never will be, 0 to keep waiting.
     * Does its own acquire loads: a READY end may go on to use the bytes it waited for. */
    int (*check)(struct ring_end *e);
    int count_late; /* consumer: count timeouts that find data already there */
    uint64_t stats[RING_NSTATS]; /* sleeps, timeouts, wakes sent, and full (producer) or late
                                    (consumer: data was there when a futex wait timed out) */
};

/* ring.c: allocate (zeroed) an end of `size` bytes whose first member is a struct ring_end, and
 * fill in that common part for the ring mapped at `base`. NULL when out of memory. */
void *ring_end_new(size_t size, void *base, int data_efd, int space_efd, int producer,
                   int (*check)(struct ring_end *e));

/* wake.c: the wait and wake-up protocol, the same for both ends (see ring.c's summary).
 *   ring_end_wait     spin spin_ns, then sleep on the futex, until check() says READY or CLOSED,
 *                     or timeout_ns passes (RING_TIMEOUT); RING_WOKEN on EINTR or a spurious wake.
 *   ring_end_arm      the eventfd form: announce "wake me by eventfd", then re-check; 1 when the
 *                     wait is already over and nothing is armed.
 *   ring_end_disarm   withdraw the announcement.
 *   ring_end_publish  release-store our counter (tail or head), then wake the peer only if it
 *                     announced it sleeps. */
int ring_end_wait(struct ring_end *e, int64_t spin_ns, int64_t timeout_ns);
int ring_end_arm(struct ring_end *e);
void ring_end_disarm(struct ring_end *e);
void ring_end_publish(struct ring_end *e, _Atomic uint64_t *counter, uint64_t value);

#endif /* RINGLLM_RING_INTERNAL_H */
