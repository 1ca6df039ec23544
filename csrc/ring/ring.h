/*
 * ring.h - a single-producer single-consumer byte ring in a shared-memory segment.
 *
 * One segment carries one direction. The creator initialises the header; the peer maps the
 * same file descriptor and checks magic, version and capacity before using it. The layout is
 * the contract between the two processes and between versions of this code.
 *
 * Segment layout. A "line" is RING_LINE = 128 bytes: two 64-byte cache lines, so that the
 * adjacent-line prefetcher never makes the producer's and the consumer's words share a pair.
 *
 *   offset
 *      0  +--------------------------------------------------------------------------+
 *         | magic u64 | version u32 | header_size u32 | capacity u64 | flags u64   | line 0
 *         | creator_pid u32 | _pad0                                                | read-only
 *    128  +--------------------------------------------------------------------------+ after init
 *         | tail u64: bytes ever published                | _pad1                    | line 1
 *         |   written by the producer only                |                          |
 *    256  +--------------------------------------------------------------------------+
 *         | head u64: bytes ever consumed                 | _pad2                    | line 2
 *         |   written by the consumer only                |                          |
 *    384  +--------------------------------------------------------------------------+
 *         | consumer_waiting u32 (consumer) | data_seq u32 (futex; producer bumps)  | line 3
 *    512  +--------------------------------------------------------------------------+
 *         | producer_waiting u32 (producer) | space_seq u32 (futex; consumer bumps) | line 4
 *    640  +--------------------------------------------------------------------------+
 *         | closed u32 (either side sets it once) | _pad5                            | line 5
 *    768  +--------------------------------------------------------------------------+
 *         | _reserved (zero)                                                         |
 *   1024  +--------------------------------------------------------------------------+
 *         | data: `capacity` bytes of records, index = counter & (capacity - 1)      |
 *         +--------------------------------------------------------------------------+
 *
 * head and tail are monotonic 64-bit byte counters (they never wrap in practice); the bytes
 * in use are tail - head <= capacity.
 *
 * Record (8-byte aligned; the next record starts at align8(8 + length)):
 *
 *   +--------------+--------------+---------------------------+----------------+
 *   | length u32   | type u32     | payload: length bytes     | 0-7 bytes slack|
 *   +--------------+--------------+---------------------------+----------------+
 *
 *   RING_REC_MSG         a whole message
 *   RING_REC_PAD         fills the ring from here to its end; length = capacity - index - 8.
 *                        Written when the next record would not fit before the end.
 *   RING_REC_FRAG_FIRST  first piece of a message too big for one record; its payload starts
 *                        with the message's total length (u64, little-endian)
 *   RING_REC_FRAG_MORE   a middle piece
 *   RING_REC_FRAG_LAST   the last piece
 *
 * Capacity rules: a power of two, RING_MIN_CAPACITY <= capacity <= RING_MAX_CAPACITY. A record
 * (header included) is at most capacity / 2 bytes, so it always fits in an empty ring whatever
 * the index. A message whose record would be larger travels as fragments of at most
 * capacity / 4 bytes each, so message size is bounded only by the reader's limit.
 *
 * Who writes what: the producer writes records and `tail`; the consumer writes `head`; each
 * side writes its own *_waiting word and bumps the other side's *_seq word when waking it.
 * The reader trusts nothing: each record header is read once, and its length and type are
 * checked against the capacity and the published tail before any payload byte is used.
 */
#ifndef RINGLLM_RING_H
#define RINGLLM_RING_H

#include <stdatomic.h>
#include <stdint.h>

/*
 * The Python binding (shm_transport/_build_ring.py) hands cffi exactly the text between each
 * "cffi-cdef: begin" and "cffi-cdef: end" marker below, with every #define's value replaced by
 * "..." (cffi then takes the values from this header when it compiles). So this header is the
 * one source of truth: keep those parts plain declarations cffi can parse (no _Atomic, no
 * macros with arguments, no expressions in enums beyond integer literals).
 */

/* cffi-cdef: begin */
#define RING_MAGIC 0x314D4C4C474E4952ULL /* "RINGLLM1" little-endian */
#define RING_VERSION 1u
#define RING_LINE 128u
#define RING_HEADER_SIZE 1024u
#define RING_MIN_CAPACITY 4096ull
#define RING_MAX_CAPACITY (1ull << 32)
#define RING_RECORD_HEADER 8u

enum ring_record_type {
    RING_REC_MSG = 1,
    RING_REC_PAD = 2,
    RING_REC_FRAG_FIRST = 3,
    RING_REC_FRAG_MORE = 4,
    RING_REC_FRAG_LAST = 5,
};

/* Return codes. Non-negative values are successes. */
enum ring_status {
    RING_OK = 0,
    RING_TIMEOUT = 0,      /* waits: nothing happened before the timeout */
    RING_READY = 1,        /* waits: data (or space) is there */
    RING_WOKEN = 2,        /* waits: woken or interrupted (EINTR) without data; caller re-checks */
    RING_FULL = -1,        /* producer: not enough free space now */
    RING_CLOSED = -2,      /* the ring was closed (orderly end) */
    RING_E_CORRUPT = -3,   /* the peer wrote something impossible; the ring is unusable */
    RING_E_TOO_BIG = -4,   /* claim: a record larger than capacity / 2 */
    RING_E_MAGIC = -5,     /* attach: not a ring segment */
    RING_E_VERSION = -6,   /* attach: a ring of another layout version */
    RING_E_CAPACITY = -7,  /* bad capacity, or segment smaller than header + capacity */
};
/* cffi-cdef: end */

/* The header, exactly as drawn above. Explicit padding; offsets are checked at compile time. */
struct ring_header {
    /* line 0: written by the creator before the peer exists, read-only afterwards */
    _Atomic uint64_t magic;          /* RING_MAGIC, stored last (release) by ring_init */
    uint32_t version;                /* RING_VERSION */
    uint32_t header_size;            /* RING_HEADER_SIZE: where the data starts */
    uint64_t capacity;               /* data bytes, a power of two */
    uint64_t flags;                  /* reserved, zero */
    uint32_t creator_pid;            /* for diagnostics only */
    uint8_t _pad0[RING_LINE - 36];
    /* line 1: producer-owned */
    _Atomic uint64_t tail;
    uint8_t _pad1[RING_LINE - 8];
    /* line 2: consumer-owned */
    _Atomic uint64_t head;
    uint8_t _pad2[RING_LINE - 8];
    /* line 3: the consumer's sleep */
    _Atomic uint32_t consumer_waiting; /* RING_WAIT_* bits while the consumer may sleep */
    _Atomic uint32_t data_seq;         /* futex word: bumped by the producer to wake it */
    uint8_t _pad3[RING_LINE - 8];
    /* line 4: the producer's sleep (backpressure) */
    _Atomic uint32_t producer_waiting; /* RING_WAIT_* bits while the producer may sleep */
    _Atomic uint32_t space_seq;        /* futex word: bumped by the consumer to wake it */
    uint8_t _pad4[RING_LINE - 8];
    /* line 5: orderly end */
    _Atomic uint32_t closed;           /* 0, then 1 forever once either side closes */
    uint8_t _pad5[RING_LINE - 4];
    uint8_t _reserved[RING_HEADER_SIZE - 6 * RING_LINE];
};

_Static_assert(sizeof(struct ring_header) == RING_HEADER_SIZE, "header size");
_Static_assert(__builtin_offsetof(struct ring_header, tail) == 1 * RING_LINE, "tail line");
_Static_assert(__builtin_offsetof(struct ring_header, head) == 2 * RING_LINE, "head line");
_Static_assert(__builtin_offsetof(struct ring_header, consumer_waiting) == 3 * RING_LINE, "line 3");
_Static_assert(__builtin_offsetof(struct ring_header, producer_waiting) == 4 * RING_LINE, "line 4");
_Static_assert(__builtin_offsetof(struct ring_header, closed) == 5 * RING_LINE, "line 5");

/* cffi-cdef: begin */
/* Which wake-up a sleeper wants (values of consumer_waiting / producer_waiting). */
#define RING_WAIT_FUTEX 1u
#define RING_WAIT_EVENTFD 2u

typedef struct ring_producer ring_producer;
typedef struct ring_consumer ring_consumer;

/* Segment. ring_init writes an empty ring's header (creator); ring_check validates magic, version
 * and capacity of a mapped segment (peer) and returns RING_OK or RING_E_*. ring_close marks the
 * ring closed for good and wakes every sleeper on both sides (futex and eventfd). */
uint64_t ring_segment_size(uint64_t capacity);
int ring_capacity_ok(uint64_t capacity);
void *ring_map(int fd, uint64_t size, int *err);
int ring_unmap(void *base, uint64_t size);
int ring_init(void *base, uint64_t capacity, uint32_t creator_pid);
int ring_check(const void *base, uint64_t size, uint64_t capacity);
int ring_is_closed(const void *base);
void ring_close(void *base, int data_efd, int space_efd);

/* Producer end (one thread). data_efd: the consumer's eventfd, written when it sleeps in
 * asyncio; space_efd: ours, written by the consumer when we wait for space asynchronously.
 *   ring_claim   reserve one record of `length` payload bytes (PAD first if it would wrap) and
 *                point *payload at it; RING_FULL when there is no room now, RING_E_TOO_BIG
 *                above capacity/2. Several claims may precede one commit.
 *   ring_commit  publish everything claimed (release store of tail), then wake the consumer
 *                only if it announced it sleeps (no system call otherwise).
 *   ring_write   claim + copy + commit of the message prefix||data (prefix < 0: none), from
 *                byte `done` on. Returns the new progress: == total when complete. A message
 *                that fits one record is all or nothing; a larger one goes out as FRAG records,
 *                as far as space allows, and the caller continues it later from the progress.
 *   ring_writev  the same for the message prefix||parts[0]||...||parts[nparts-1] (lens[i] bytes
 *                each), gathered straight into the ring: one copy of each part.
 *   ring_wait_space  spin spin_ns, then sleep on the futex, until the consumer frees space
 *                (RING_READY), the ring closes (RING_CLOSED), or timeout_ns (RING_TIMEOUT).
 *                Also returns RING_WOKEN on EINTR or a spurious wake: the caller re-checks.
 *   ring_arm_space / ring_disarm_space  the asyncio form: announce "wake me by eventfd", then
 *                re-check; 1 means space (or a close) is already there and nothing is armed. */
ring_producer *ring_producer_new(void *base, int data_efd, int space_efd);
void ring_producer_free(ring_producer *p);
int ring_claim(ring_producer *p, uint32_t length, char **payload);
void ring_commit(ring_producer *p);
int64_t ring_write(ring_producer *p, int prefix, const char *data, uint64_t length, uint64_t done);
int64_t ring_writev(ring_producer *p, int prefix, const char *const *parts, const uint64_t *lens,
                    int nparts, uint64_t done);
int ring_wait_space(ring_producer *p, int64_t spin_ns, int64_t timeout_ns);
int ring_arm_space(ring_producer *p);
void ring_disarm_space(ring_producer *p);
uint64_t ring_free_bytes(ring_producer *p);
void ring_producer_stats(const ring_producer *p, uint64_t out[4]); /* sleeps, timeouts, wakes, full */

/* Consumer end (one thread). data_efd: ours; space_efd: the producer's.
 *   ring_read    validate and hand out up to max_records published records (PADs skipped):
 *                records[2i] = payload offset in the data area, records[2i+1] = length |
 *                type << 32. Returns the count, or RING_E_CORRUPT (sticky) for anything this
 *                code never writes. The bytes stay ours until ring_release. A batch also
 *                ends once it holds batch_bytes (ring_set_batch_bytes; 0, the default: no
 *                limit) of records, so a reader that fell behind does not decode, and hold,
 *                many large messages at once.
 *   ring_release give back everything handed out (release store of head), then wake the
 *                producer only if it announced it sleeps.
 *   ring_next    the reader's steady state in one call: release, read, and if nothing was
 *                there, wait (as ring_wait_data) and read again. 0 on timeout or wake-up,
 *                RING_CLOSED once closed and drained.
 *   ring_wait_data / ring_arm_data / ring_disarm_data  as for space, waiting for data.
 *   ring_kick    wake our own sleeping reader (another thread) without publishing anything. */
ring_consumer *ring_consumer_new(void *base, int data_efd, int space_efd);
void ring_consumer_free(ring_consumer *c);
int ring_read(ring_consumer *c, uint64_t *records, int max_records);
void ring_set_batch_bytes(ring_consumer *c, uint64_t bytes);
void ring_release(ring_consumer *c);
int ring_next(ring_consumer *c, uint64_t *records, int max_records, int64_t spin_ns, int64_t timeout_ns);
int ring_wait_data(ring_consumer *c, int64_t spin_ns, int64_t timeout_ns);
int ring_arm_data(ring_consumer *c);
void ring_disarm_data(ring_consumer *c);
void ring_kick(ring_consumer *c);
void ring_consumer_stats(const ring_consumer *c, uint64_t out[4]); /* sleeps, timeouts, wakes, late */

/* Process helpers (wake.c): prctl PR_SET_PDEATHSIG and PR_SET_CHILD_SUBREAPER; 0 or -errno. */
int ring_set_pdeathsig(int sig);
int ring_set_child_subreaper(int on);
/* cffi-cdef: end */

#endif /* RINGLLM_RING_H */
