/*
 * ring.c - the segment: sizing, mapping, header init/check and close (see ring.h).
 * producer.c and consumer.c hold the two ends.
 *
 * Memory-ordering summary (details at each access):
 *   producer: write header + payload (plain stores) -> store tail (release)
 *             -> full fence -> load consumer_waiting (relaxed) -> wake if set
 *   consumer: load tail (acquire) -> read records -> store head (release)
 *             -> full fence -> load producer_waiting (relaxed) -> wake if set
 *   sleeper:  store *_waiting (relaxed) -> full fence -> load *_seq (acquire)
 *             -> re-check tail/head -> futex_wait(*_seq) or return "armed"
 * The two full fences make the Dekker pair: either the sleeper sees the new tail/head, or the
 * waker sees *_waiting set and bumps *_seq before FUTEX_WAKE, so no wake-up is lost.
 */
#define _GNU_SOURCE
#include "ring.h"
#include "ring_atomic.h"
#include "ring_internal.h"
#include "ring_wake.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---------------------------------------------------------------- segment */

uint64_t ring_segment_size(uint64_t capacity) { return RING_HEADER_SIZE + capacity; }

int ring_capacity_ok(uint64_t capacity)
{
    return capacity >= RING_MIN_CAPACITY && capacity <= RING_MAX_CAPACITY &&
           (capacity & (capacity - 1)) == 0;
}

void *ring_map(int fd, uint64_t size, int *err)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        *err = errno;
        return NULL;
    }
    *err = 0;
    return p;
}

int ring_unmap(void *base, uint64_t size) { return munmap(base, size) == 0 ? 0 : -errno; }

int ring_init(void *base, uint64_t capacity, uint32_t creator_pid)
{
    struct ring_header *h = base;
    if (!ring_capacity_ok(capacity))
        return RING_E_CAPACITY;
    memset(h, 0, sizeof *h);
    h->version = RING_VERSION;
    h->header_size = RING_HEADER_SIZE;
    h->capacity = capacity;
    h->creator_pid = creator_pid;
    /* Relaxed: nobody else maps the segment yet (the peer gets the fd later, through exec). */
    RING_STORE_RELAXED(&h->tail, 0);
    RING_STORE_RELAXED(&h->head, 0);
    /* Release: the fields above are complete before anyone can see a valid magic. */
    RING_STORE_RELEASE(&h->magic, RING_MAGIC);
    return RING_OK;
}

int ring_check(const void *base, uint64_t size, uint64_t capacity)
{
    struct ring_header *h = (struct ring_header *)base;
    if (size < RING_HEADER_SIZE)
        return RING_E_CAPACITY;
    /* Acquire: pairs with the release in ring_init, so the fields below are initialised. */
    if (RING_LOAD_ACQUIRE(&h->magic) != RING_MAGIC)
        return RING_E_MAGIC;
    if (h->version != RING_VERSION || h->header_size != RING_HEADER_SIZE)
        return RING_E_VERSION;
    if (h->capacity != capacity || !ring_capacity_ok(capacity) ||
        size < ring_segment_size(capacity))
        return RING_E_CAPACITY;
    return RING_OK;
}

void *ring_end_new(size_t size, void *base, int data_efd, int space_efd, int producer,
                   int (*check)(struct ring_end *e))
{
    struct ring_header *h = base;
    struct ring_end *e = calloc(1, size);
    if (!e)
        return NULL;
    e->hdr = h;
    e->data = (unsigned char *)base + RING_HEADER_SIZE;
    e->cap = h->capacity;
    e->mask = h->capacity - 1;
    e->data_efd = data_efd;
    e->space_efd = space_efd;
    /* A producer sleeps for space and wakes a consumer sleeping for data, and vice versa. */
    e->waiting = producer ? &h->producer_waiting : &h->consumer_waiting;
    e->seq = producer ? &h->space_seq : &h->data_seq;
    e->peer_waiting = producer ? &h->consumer_waiting : &h->producer_waiting;
    e->peer_seq = producer ? &h->data_seq : &h->space_seq;
    e->peer_efd = producer ? data_efd : space_efd;
    e->check = check;
    e->count_late = !producer;
    return e;
}

int ring_is_closed(const void *base)
{
    struct ring_header *h = (struct ring_header *)base;
    /* Acquire: a close is seen together with everything published before it. */
    return RING_LOAD_ACQUIRE(&h->closed) != 0;
}

void ring_close(void *base, int data_efd, int space_efd)
{
    struct ring_header *h = base;
    /* Release: records published before the close stay visible to whoever sees closed. */
    RING_STORE_RELEASE(&h->closed, 1);
    /* Full fence: closed must be visible before we decide the sleepers need waking. */
    RING_FENCE_FULL();
    /* Wake both sides unconditionally: a close is rare and a sleeper must not miss it. */
    ring_wake_word(&h->data_seq, RING_WAIT_FUTEX | RING_WAIT_EVENTFD, data_efd);
    ring_wake_word(&h->space_seq, RING_WAIT_FUTEX | RING_WAIT_EVENTFD, space_efd);
}

