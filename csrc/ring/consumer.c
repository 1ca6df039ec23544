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
    struct ring_end e; /* first member: a ring_end * is a ring_consumer * */
    uint64_t head;     /* private copy of hdr->head (we are its only writer) */
    uint64_t read_pos; /* end of the records handed out by ring_read, released by ring_release */
    uint64_t batch_bytes; /* ring_read stops once a batch holds this many bytes (0: no limit) */
};

/* ---------------------------------------------------------------- consumer */

static inline int data_ready(ring_consumer *c)
{
    /* Acquire: if we go on to read, the records below tail must be complete. */
    return RING_LOAD_ACQUIRE(&c->e.hdr->tail) != c->read_pos;
}

/* Our wait is over when records past those handed out are published, or the ring closed (and
 * nothing was published before the close). */
static int data_check(struct ring_end *e)
{
    ring_consumer *c = (ring_consumer *)e;
    if (data_ready(c))
        return RING_READY;
    /* Acquire: see ring_is_closed; then look again for what was published before the close. */
    if (RING_LOAD_ACQUIRE(&e->hdr->closed))
        return data_ready(c) ? RING_READY : RING_CLOSED;
    return 0;
}

ring_consumer *ring_consumer_new(void *base, int data_efd, int space_efd)
{
    ring_consumer *c = ring_end_new(sizeof *c, base, data_efd, space_efd, 0, data_check);
    if (!c)
        return NULL;
    /* Acquire: resume where an earlier consumer handle stopped. */
    c->head = c->read_pos = RING_LOAD_ACQUIRE(&c->e.hdr->head);
    return c;
}

void ring_consumer_free(ring_consumer *c) { free(c); }

int ring_read(ring_consumer *c, uint64_t *records, int max_records)
{
    uint64_t pos = c->read_pos, tail, avail, batch = 0;
    int n = 0;

    if (c->e.corrupt)
        return RING_E_CORRUPT;
    /* Acquire: pairs with the producer's release of tail; every record below it is complete. */
    tail = RING_LOAD_ACQUIRE(&c->e.hdr->tail);
    avail = tail - pos;
    if (avail > c->e.cap || (avail & 7u))
        goto corrupt;
    while (avail > 0 && n < max_records) {
        uint64_t idx = pos & c->e.mask;
        /* Volatile: the header is read exactly once; everything below checks this copy. */
        uint64_t word = *(const volatile uint64_t *)(const void *)(c->e.data + idx);
        uint64_t length = word & 0xffffffffu;
        uint32_t type = (uint32_t)(word >> 32);
        uint64_t rec;
        if (type == RING_REC_PAD) {
            rec = c->e.cap - idx;
            if (idx == 0 || length != rec - RING_RECORD_HEADER || rec > avail)
                goto corrupt;
        } else {
            if (type < RING_REC_MSG || type > RING_REC_FRAG_LAST || type == RING_REC_PAD)
                goto corrupt;
            rec = ALIGN8(RING_RECORD_HEADER + length);
            if (rec > c->e.cap / 2 || idx + rec > c->e.cap || rec > avail)
                goto corrupt;
            records[2 * n] = idx + RING_RECORD_HEADER;
            records[2 * n + 1] = length | ((uint64_t)type << 32);
            n++;
            batch += rec;
        }
        pos += rec;
        avail -= rec;
        if (c->batch_bytes && batch >= c->batch_bytes)
            break; /* a byte budget per batch: the reader decodes (and holds) a bounded amount */
    }
    c->read_pos = pos;
    return n;
corrupt:
    c->e.corrupt = 1;
    return RING_E_CORRUPT;
}

void ring_set_batch_bytes(ring_consumer *c, uint64_t bytes) { c->batch_bytes = bytes; }

void ring_release(ring_consumer *c)
{
    if (c->read_pos == c->head)
        return;
    c->head = c->read_pos;
    /* Release store of head (our reads of the released records are complete before the
     * producer may overwrite them), then wake the producer only if it announced it sleeps. */
    ring_end_publish(&c->e, &c->e.hdr->head, c->head);
}

int ring_wait_data(ring_consumer *c, int64_t spin_ns, int64_t timeout_ns)
{
    return ring_end_wait(&c->e, spin_ns, timeout_ns);
}

int ring_arm_data(ring_consumer *c) { return ring_end_arm(&c->e); }

void ring_disarm_data(ring_consumer *c) { ring_end_disarm(&c->e); }

void ring_kick(ring_consumer *c)
{
    /* Wake our own sleeping reader (another thread) without publishing anything. */
    ring_wake_word(&c->e.hdr->data_seq, RING_WAIT_FUTEX | RING_WAIT_EVENTFD, c->e.data_efd);
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

void ring_consumer_stats(const ring_consumer *c, uint64_t out[4])
{
    memcpy(out, c->e.stats, sizeof c->e.stats); /* sleeps, timeouts, wakes, late */
}
