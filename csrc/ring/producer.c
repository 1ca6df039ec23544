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
    struct ring_end e;   /* first member: a ring_end * is a ring_producer * */
    uint64_t tail;       /* private copy of hdr->tail (we are its only writer) */
    uint64_t next;       /* end of claimed records; > tail while a claim is uncommitted */
    uint64_t head_cache; /* last head we loaded: at least this much is free, no need to look */
};

/* ---------------------------------------------------------------- producer */

/* Our wait is over when the consumer freed space (head moved past what we last saw) or the
 * ring closed. */
static int space_check(struct ring_end *e)
{
    ring_producer *p = (ring_producer *)e;
    /* Acquire: as in claim_record, bytes below head are free for us to reuse. */
    if (RING_LOAD_ACQUIRE(&e->hdr->head) != p->head_cache)
        return RING_READY;
    /* Relaxed: only decides whether to stop waiting; the acquire in ring_is_closed is not
     * needed for a producer, which reads no data. */
    return RING_LOAD_RELAXED(&e->hdr->closed) ? RING_CLOSED : 0;
}

ring_producer *ring_producer_new(void *base, int data_efd, int space_efd)
{
    ring_producer *p = ring_end_new(sizeof *p, base, data_efd, space_efd, 1, space_check);
    if (!p)
        return NULL;
    /* Acquire: resume after whatever an earlier producer handle published. */
    p->tail = p->next = RING_LOAD_ACQUIRE(&p->e.hdr->tail);
    p->head_cache = RING_LOAD_ACQUIRE(&p->e.hdr->head);
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

    if (p->e.corrupt)
        return RING_E_CORRUPT;
    if (rec > p->e.cap / 2)
        return RING_E_TOO_BIG;
    /* Relaxed: a best-effort stop; a send racing with the close may still land, harmlessly. */
    if (RING_LOAD_RELAXED(&p->e.hdr->closed))
        return RING_CLOSED;
    idx = pos & p->e.mask;
    to_end = p->e.cap - idx;
    need = rec > to_end ? to_end + rec : rec;
    if (pos + need - p->head_cache > p->e.cap) {
        /* Acquire: the consumer finished reading every byte below head before it stored head,
         * so we may overwrite them now. */
        uint64_t head = RING_LOAD_ACQUIRE(&p->e.hdr->head);
        if (head > p->tail || p->tail - head > p->e.cap) {
            p->e.corrupt = 1; /* the consumer claims to have read what was never published */
            return RING_E_CORRUPT;
        }
        p->head_cache = head;
        if (pos + need - head > p->e.cap) {
            p->e.stats[RING_STAT_OTHER]++; /* "full" */
            return RING_FULL;
        }
    }
    if (rec > to_end) {
        put_header(p->e.data + idx, (uint32_t)(to_end - RING_RECORD_HEADER), RING_REC_PAD);
        pos += to_end;
        idx = 0;
    }
    put_header(p->e.data + idx, (uint32_t)length, type);
    *payload = p->e.data + idx + RING_RECORD_HEADER;
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
    if (p->next == p->tail)
        return;
    p->tail = p->next;
    /* Release store of tail (the records written above become visible with it), then wake
     * the consumer only if it announced it sleeps. */
    ring_end_publish(&p->e, &p->e.hdr->tail, p->tail);
}

/* Copy bytes [from, from + n) of the logical message prefix||parts[0]||parts[1]||... to `at`. */
static void gather(unsigned char *at, int prefix, const char *const *parts, const uint64_t *lens,
                   int nparts, uint64_t from, uint64_t n)
{
    if (prefix >= 0) {
        if (from == 0 && n > 0) {
            *at++ = (unsigned char)prefix;
            n--;
        } else {
            from--;
        }
    }
    for (int i = 0; i < nparts && n > 0; i++) {
        if (from >= lens[i]) {
            from -= lens[i];
            continue;
        }
        uint64_t k = lens[i] - from < n ? lens[i] - from : n;
        memcpy(at, parts[i] + from, k);
        at += k;
        n -= k;
        from = 0;
    }
}

int64_t ring_writev(ring_producer *p, int prefix, const char *const *parts, const uint64_t *lens,
                    int nparts, uint64_t done)
{
    uint64_t total = prefix >= 0 ? 1 : 0;
    uint64_t single_max = p->e.cap / 2 - RING_RECORD_HEADER;
    unsigned char *at;
    int rc;

    for (int i = 0; i < nparts; i++)
        total += lens[i];
    if (done > total)
        return RING_E_TOO_BIG;
    if (done == 0 && total <= single_max) {
        /* The common case: one record, all or nothing. */
        rc = claim_record(p, RING_REC_MSG, total, &at);
        if (rc != RING_OK)
            return rc == RING_FULL ? 0 : rc;
        gather(at, prefix, parts, lens, nparts, 0, total);
        ring_commit(p);
        return (int64_t)total;
    }
    /* Fragments of at most capacity/4 bytes, each committed as soon as written so the
     * consumer copies one while we write the next. */
    uint64_t frag_max = p->e.cap / 4 - RING_RECORD_HEADER;
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
        gather(at, prefix, parts, lens, nparts, done, chunk); /* bytes done.. of the message */
        ring_commit(p);
        done += chunk;
    }
    return (int64_t)done;
}

int64_t ring_write(ring_producer *p, int prefix, const char *data, uint64_t length, uint64_t done)
{
    return ring_writev(p, prefix, &data, &length, 1, done);
}

int ring_wait_space(ring_producer *p, int64_t spin_ns, int64_t timeout_ns)
{
    return ring_end_wait(&p->e, spin_ns, timeout_ns);
}

int ring_arm_space(ring_producer *p) { return ring_end_arm(&p->e); }

void ring_disarm_space(ring_producer *p) { ring_end_disarm(&p->e); }

uint64_t ring_free_bytes(ring_producer *p)
{
    /* Acquire: same reason as claim_record; this is a snapshot for callers and tests. */
    uint64_t head = RING_LOAD_ACQUIRE(&p->e.hdr->head);
    return p->e.cap - (p->next - head);
}

void ring_producer_stats(const ring_producer *p, uint64_t out[4])
{
    memcpy(out, p->e.stats, sizeof p->e.stats); /* sleeps, timeouts, wakes, full */
}
