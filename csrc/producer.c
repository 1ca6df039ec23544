/*
 * producer.c - the writing end: claim/commit, whole-message writes with fragments, and waiting
 * for space (spin, futex, or eventfd arm). Memory ordering: see the summary in ring.c.
 */
#define _GNU_SOURCE
#include "ring.h"
#include "ring_atomic.h"
#include "ring_internal.h"
#include "ring_wake.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct ring_producer {
    struct ring_header *hdr;
    unsigned char *data;
    uint64_t cap, mask;
    uint64_t tail;       /* private copy of hdr->tail (we are its only writer) */
    uint64_t next;       /* end of claimed records; > tail while a claim is uncommitted */
    uint64_t head_cache; /* last head we loaded: at least this much is free, no need to look */
    int data_efd;        /* the consumer's eventfd, written to wake an asyncio consumer */
    int space_efd;       /* our eventfd, written by the consumer when we wait asynchronously */
    int corrupt;
    uint64_t sleeps, timeouts, wakes, full;
};

/* ---------------------------------------------------------------- producer */

ring_producer *ring_producer_new(void *base, int data_efd, int space_efd)
{
    struct ring_header *h = base;
    ring_producer *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->hdr = h;
    p->data = (unsigned char *)base + RING_HEADER_SIZE;
    p->cap = h->capacity;
    p->mask = h->capacity - 1;
    /* Acquire: resume after whatever an earlier producer handle published. */
    p->tail = p->next = RING_LOAD_ACQUIRE(&h->tail);
    p->head_cache = RING_LOAD_ACQUIRE(&h->head);
    p->data_efd = data_efd;
    p->space_efd = space_efd;
    return p;
}

void ring_producer_free(ring_producer *p) { free(p); }

static inline void put_header(unsigned char *at, uint32_t length, uint32_t type)
{
    uint64_t word = (uint64_t)length | ((uint64_t)type << 32);
    memcpy(at, &word, sizeof word); /* plain store: published later by the release of tail */
}

static int claim_record(ring_producer *p, uint32_t type, uint64_t length, unsigned char **payload)
{
    uint64_t rec = ALIGN8(RING_RECORD_HEADER + length);
    uint64_t pos = p->next, idx, to_end, need;

    if (p->corrupt)
        return RING_E_CORRUPT;
    if (rec > p->cap / 2)
        return RING_E_TOO_BIG;
    /* Relaxed: a best-effort stop; a send racing with the close may still land, harmlessly. */
    if (RING_LOAD_RELAXED(&p->hdr->closed))
        return RING_CLOSED;
    idx = pos & p->mask;
    to_end = p->cap - idx;
    need = rec > to_end ? to_end + rec : rec;
    if (pos + need - p->head_cache > p->cap) {
        /* Acquire: the consumer finished reading every byte below head before it stored head,
         * so we may overwrite them now. */
        uint64_t head = RING_LOAD_ACQUIRE(&p->hdr->head);
        if (head > p->tail || p->tail - head > p->cap) {
            p->corrupt = 1; /* the consumer claims to have read what was never published */
            return RING_E_CORRUPT;
        }
        p->head_cache = head;
        if (pos + need - head > p->cap) {
            p->full++;
            return RING_FULL;
        }
    }
    if (rec > to_end) {
        put_header(p->data + idx, (uint32_t)(to_end - RING_RECORD_HEADER), RING_REC_PAD);
        pos += to_end;
        idx = 0;
    }
    put_header(p->data + idx, (uint32_t)length, type);
    *payload = p->data + idx + RING_RECORD_HEADER;
    p->next = pos + rec;
    return RING_OK;
}

int ring_claim(ring_producer *p, uint32_t length, char **payload)
{
    unsigned char *at = NULL;
    int rc = claim_record(p, RING_REC_MSG, length, &at);
    *payload = (char *)at;
    return rc;
}

void ring_commit(ring_producer *p)
{
    struct ring_header *h = p->hdr;
    if (p->next == p->tail)
        return;
    p->tail = p->next;
    /* Release: the record headers and payloads written above are visible before the new tail. */
    RING_STORE_RELEASE(&h->tail, p->tail);
    /* Full fence (Dekker): our tail store is globally visible before we read consumer_waiting;
     * the consumer does the mirror image before re-reading tail and sleeping. */
    RING_FENCE_FULL();
    /* Relaxed: ordered by the fence above; a stale 1 only costs a spurious wake. */
    uint32_t waiting = RING_LOAD_RELAXED(&h->consumer_waiting);
    if (waiting) {
        p->wakes++;
        ring_wake_word(&h->data_seq, waiting, p->data_efd);
    }
}

int64_t ring_write(ring_producer *p, int prefix, const char *data, uint64_t length, uint64_t done)
{
    uint64_t total = length + (prefix >= 0 ? 1 : 0);
    uint64_t single_max = p->cap / 2 - RING_RECORD_HEADER;
    unsigned char *at;
    int rc;

    if (done > total)
        return RING_E_TOO_BIG;
    if (done == 0 && total <= single_max) {
        /* The common case: one record, all or nothing. */
        rc = claim_record(p, RING_REC_MSG, total, &at);
        if (rc != RING_OK)
            return rc == RING_FULL ? 0 : rc;
        if (prefix >= 0) {
            *at++ = (unsigned char)prefix;
        }
        memcpy(at, data, length);
        ring_commit(p);
        return (int64_t)total;
    }
    /* Fragments of at most capacity/4 bytes, each committed as soon as written so the
     * consumer copies one while we write the next. */
    uint64_t frag_max = p->cap / 4 - RING_RECORD_HEADER;
    while (done < total) {
        uint64_t lead = done == 0 ? 8 : 0; /* FRAG_FIRST carries the total length */
        uint64_t chunk = total - done;
        uint32_t type;
        if (chunk > frag_max - lead)
            chunk = frag_max - lead;
        if (done == 0)
            type = RING_REC_FRAG_FIRST;
        else if (done + chunk == total)
            type = RING_REC_FRAG_LAST;
        else
            type = RING_REC_FRAG_MORE;
        rc = claim_record(p, type, lead + chunk, &at);
        if (rc != RING_OK)
            return rc == RING_FULL ? (int64_t)done : rc;
        if (lead) {
            memcpy(at, &total, 8);
            at += 8;
        }
        /* Byte `done` of the logical message prefix||data. */
        uint64_t n = chunk;
        if (prefix >= 0 && done == 0) {
            *at++ = (unsigned char)prefix;
            memcpy(at, data, n - 1);
        } else {
            memcpy(at, data + (done - (prefix >= 0 ? 1 : 0)), n);
        }
        ring_commit(p);
        done += chunk;
    }
    return (int64_t)done;
}

static inline int space_moved(ring_producer *p)
{
    /* Acquire: as in claim_record, bytes below head are free for us to reuse. */
    return RING_LOAD_ACQUIRE(&p->hdr->head) != p->head_cache;
}

int ring_wait_space(ring_producer *p, int64_t spin_ns, int64_t timeout_ns)
{
    struct ring_header *h = p->hdr;
    uint64_t start = ring_now_ns(), deadline;
    int spins = 0;

    if (timeout_ns < 0)
        timeout_ns = 0;
    if (spin_ns > timeout_ns)
        spin_ns = timeout_ns;
    deadline = start + (uint64_t)spin_ns;
    for (;;) {
        if (space_moved(p))
            return RING_READY;
        /* Relaxed: only decides whether to stop waiting; the acquire in ring_is_closed is
         * not needed for a producer, which reads no data. */
        if (RING_LOAD_RELAXED(&h->closed))
            return RING_CLOSED;
        if (++spins % SPIN_CHECK_EVERY == 0 && ring_now_ns() >= deadline)
            break;
        if (spin_ns == 0)
            break;
        RING_CPU_RELAX();
    }
    uint64_t now = ring_now_ns();
    if (now >= start + (uint64_t)timeout_ns)
        return RING_TIMEOUT;
    /* Relaxed store, then the full fence orders it before the re-check below (Dekker). */
    RING_STORE_RELAXED(&h->producer_waiting, RING_WAIT_FUTEX);
    RING_FENCE_FULL();
    /* Acquire: if we see the consumer's bump, we also see the head it stored before it. */
    uint32_t seq = RING_LOAD_ACQUIRE(&h->space_seq);
    int rc = RING_WOKEN;
    if (!space_moved(p) && !RING_LOAD_RELAXED(&h->closed)) {
        p->sleeps++;
        int err = ring_futex_wait(&h->space_seq, seq, (int64_t)(start + (uint64_t)timeout_ns - now));
        if (err == -ETIMEDOUT) {
            p->timeouts++;
            rc = RING_TIMEOUT;
        }
    }
    /* Relaxed: a stale "waiting" seen by the consumer only costs it a spurious wake. */
    RING_STORE_RELAXED(&h->producer_waiting, 0);
    if (space_moved(p))
        return RING_READY;
    if (RING_LOAD_RELAXED(&h->closed))
        return RING_CLOSED;
    return rc;
}

int ring_arm_space(ring_producer *p)
{
    struct ring_header *h = p->hdr;
    /* Relaxed store ordered by the full fence: the same Dekker pair as ring_wait_space. */
    RING_STORE_RELAXED(&h->producer_waiting, RING_WAIT_EVENTFD);
    RING_FENCE_FULL();
    if (space_moved(p) || RING_LOAD_RELAXED(&h->closed)) {
        RING_STORE_RELAXED(&h->producer_waiting, 0); /* relaxed: see ring_wait_space */
        return 1;
    }
    p->sleeps++;
    return 0;
}

void ring_disarm_space(ring_producer *p)
{
    /* Relaxed: a stale value only costs the consumer a spurious eventfd write. */
    RING_STORE_RELAXED(&p->hdr->producer_waiting, 0);
}

uint64_t ring_free_bytes(ring_producer *p)
{
    /* Acquire: same reason as claim_record; this is a snapshot for callers and tests. */
    uint64_t head = RING_LOAD_ACQUIRE(&p->hdr->head);
    return p->cap - (p->next - head);
}

void ring_producer_stats(const ring_producer *p, uint64_t out[4])
{
    out[0] = p->sleeps;
    out[1] = p->timeouts;
    out[2] = p->wakes;
    out[3] = p->full;
}

