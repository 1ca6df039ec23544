/*
 * consumer.c - the reading end: validated batch reads, release, and waiting for data (spin,
 * futex, or eventfd arm). The reader trusts nothing in the segment. Ordering: see ring.c.
 */
#define _GNU_SOURCE
#include "ring.h"
#include "ring_atomic.h"
#include "ring_internal.h"
#include "ring_wake.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct ring_consumer {
    struct ring_header *hdr;
    unsigned char *data;
    uint64_t cap, mask;
    uint64_t head;     /* private copy of hdr->head (we are its only writer) */
    uint64_t read_pos; /* end of the records handed out by ring_read, released by ring_release */
    int data_efd;      /* our eventfd, written by the producer when we wait asynchronously */
    int space_efd;     /* the producer's eventfd, written to wake an asyncio producer */
    int corrupt;
    uint64_t sleeps, timeouts, wakes, late;
};

/* ---------------------------------------------------------------- consumer */

ring_consumer *ring_consumer_new(void *base, int data_efd, int space_efd)
{
    struct ring_header *h = base;
    ring_consumer *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->hdr = h;
    c->data = (unsigned char *)base + RING_HEADER_SIZE;
    c->cap = h->capacity;
    c->mask = h->capacity - 1;
    /* Acquire: resume where an earlier consumer handle stopped. */
    c->head = c->read_pos = RING_LOAD_ACQUIRE(&h->head);
    c->data_efd = data_efd;
    c->space_efd = space_efd;
    return c;
}

void ring_consumer_free(ring_consumer *c) { free(c); }

int ring_read(ring_consumer *c, uint64_t *records, int max_records)
{
    uint64_t pos = c->read_pos, tail, avail;
    int n = 0;

    if (c->corrupt)
        return RING_E_CORRUPT;
    /* Acquire: pairs with the producer's release of tail; every record below it is complete. */
    tail = RING_LOAD_ACQUIRE(&c->hdr->tail);
    avail = tail - pos;
    if (avail > c->cap || (avail & 7u))
        goto corrupt;
    while (avail > 0 && n < max_records) {
        uint64_t idx = pos & c->mask;
        /* Volatile: the header is read exactly once; everything below checks this copy. */
        uint64_t word = *(const volatile uint64_t *)(const void *)(c->data + idx);
        uint64_t length = word & 0xffffffffu;
        uint32_t type = (uint32_t)(word >> 32);
        uint64_t rec;
        if (type == RING_REC_PAD) {
            rec = c->cap - idx;
            if (idx == 0 || length != rec - RING_RECORD_HEADER || rec > avail)
                goto corrupt;
        } else {
            if (type < RING_REC_MSG || type > RING_REC_FRAG_LAST || type == RING_REC_PAD)
                goto corrupt;
            rec = ALIGN8(RING_RECORD_HEADER + length);
            if (rec > c->cap / 2 || idx + rec > c->cap || rec > avail)
                goto corrupt;
            records[2 * n] = idx + RING_RECORD_HEADER;
            records[2 * n + 1] = length | ((uint64_t)type << 32);
            n++;
        }
        pos += rec;
        avail -= rec;
    }
    c->read_pos = pos;
    return n;
corrupt:
    c->corrupt = 1;
    return RING_E_CORRUPT;
}

void ring_release(ring_consumer *c)
{
    struct ring_header *h = c->hdr;
    if (c->read_pos == c->head)
        return;
    c->head = c->read_pos;
    /* Release: our reads of the released records complete before the producer, which
     * acquire-loads head, may overwrite them. */
    RING_STORE_RELEASE(&h->head, c->head);
    /* Full fence (Dekker): head is globally visible before we read producer_waiting. */
    RING_FENCE_FULL();
    /* Relaxed: ordered by the fence; a stale 1 only costs a spurious wake. */
    uint32_t waiting = RING_LOAD_RELAXED(&h->producer_waiting);
    if (waiting) {
        c->wakes++;
        ring_wake_word(&h->space_seq, waiting, c->space_efd);
    }
}

static inline int data_ready(ring_consumer *c)
{
    /* Acquire: if we go on to read, the records below tail must be complete. */
    return RING_LOAD_ACQUIRE(&c->hdr->tail) != c->read_pos;
}

int ring_wait_data(ring_consumer *c, int64_t spin_ns, int64_t timeout_ns)
{
    struct ring_header *h = c->hdr;
    uint64_t start = ring_now_ns(), deadline;
    int spins = 0;

    if (timeout_ns < 0)
        timeout_ns = 0;
    if (spin_ns > timeout_ns)
        spin_ns = timeout_ns;
    deadline = start + (uint64_t)spin_ns;
    for (;;) {
        if (data_ready(c))
            return RING_READY;
        /* Acquire: see ring_is_closed. */
        if (RING_LOAD_ACQUIRE(&h->closed))
            return data_ready(c) ? RING_READY : RING_CLOSED;
        if (spin_ns == 0 || (++spins % SPIN_CHECK_EVERY == 0 && ring_now_ns() >= deadline))
            break;
        RING_CPU_RELAX();
    }
    uint64_t now = ring_now_ns();
    if (now >= start + (uint64_t)timeout_ns)
        return RING_TIMEOUT;
    /* Relaxed store, then the full fence orders it before re-reading tail (Dekker). */
    RING_STORE_RELAXED(&h->consumer_waiting, RING_WAIT_FUTEX);
    RING_FENCE_FULL();
    /* Acquire: if we see the producer's bump we also see the tail it stored before it. */
    uint32_t seq = RING_LOAD_ACQUIRE(&h->data_seq);
    int rc = RING_WOKEN;
    if (!data_ready(c) && !RING_LOAD_ACQUIRE(&h->closed)) {
        c->sleeps++;
        int err = ring_futex_wait(&h->data_seq, seq, (int64_t)(start + (uint64_t)timeout_ns - now));
        if (err == -ETIMEDOUT) {
            c->timeouts++;
            rc = RING_TIMEOUT;
            if (data_ready(c))
                c->late++; /* data was there when the timeout fired: a missed wake-up */
        }
    }
    /* Relaxed: a stale "waiting" seen by the producer only costs it a spurious wake. */
    RING_STORE_RELAXED(&h->consumer_waiting, 0);
    if (data_ready(c))
        return RING_READY;
    if (RING_LOAD_ACQUIRE(&h->closed)) /* acquire: see ring_is_closed */
        return data_ready(c) ? RING_READY : RING_CLOSED;
    return rc;
}

int ring_arm_data(ring_consumer *c)
{
    struct ring_header *h = c->hdr;
    /* Relaxed store ordered by the full fence: the same Dekker pair as ring_wait_data. */
    RING_STORE_RELAXED(&h->consumer_waiting, RING_WAIT_EVENTFD);
    RING_FENCE_FULL();
    if (data_ready(c) || RING_LOAD_ACQUIRE(&h->closed)) { /* acquire: see ring_is_closed */
        RING_STORE_RELAXED(&h->consumer_waiting, 0);     /* relaxed: see ring_wait_data */
        return 1;
    }
    c->sleeps++;
    return 0;
}

void ring_disarm_data(ring_consumer *c)
{
    /* Relaxed: a stale value only costs the producer a spurious eventfd write. */
    RING_STORE_RELAXED(&c->hdr->consumer_waiting, 0);
}

void ring_kick(ring_consumer *c)
{
    /* Wake our own sleeping reader (another thread) without publishing anything. */
    ring_wake_word(&c->hdr->data_seq, RING_WAIT_FUTEX | RING_WAIT_EVENTFD, c->data_efd);
}

int ring_next(ring_consumer *c, uint64_t *records, int max_records, int64_t spin_ns, int64_t timeout_ns)
{
    /* One call for the steady state of a reader: give back what the previous call handed out
     * (the caller has decoded it by now), read a batch, and if there is none, wait for one. */
    int n, rc;
    ring_release(c);
    n = ring_read(c, records, max_records);
    if (n != 0 || (spin_ns <= 0 && timeout_ns <= 0))
        return n;
    rc = ring_wait_data(c, spin_ns, timeout_ns);
    if (rc == RING_READY)
        return ring_read(c, records, max_records);
    return rc == RING_CLOSED ? RING_CLOSED : 0;
}

uint64_t ring_used_bytes(ring_consumer *c)
{
    /* Acquire: a snapshot for callers and tests. */
    return RING_LOAD_ACQUIRE(&c->hdr->tail) - c->head;
}

void ring_consumer_stats(const ring_consumer *c, uint64_t out[4])
{
    out[0] = c->sleeps;
    out[1] = c->timeouts;
    out[2] = c->wakes;
    out[3] = c->late;
}
