/*
 * wake.c - futex and eventfd wake-ups, and the process helpers the transport needs
 * (parent-death signal, child subreaper).
 */
#define _GNU_SOURCE
#include "ring.h"
#include "ring_atomic.h"
#include "ring_internal.h"
#include "ring_wake.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

uint64_t ring_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int ring_futex_wait(_Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns)
{
    struct timespec ts;
    if (timeout_ns < 0)
        timeout_ns = 0;
    ts.tv_sec = (time_t)(timeout_ns / 1000000000);
    ts.tv_nsec = (long)(timeout_ns % 1000000000);
    /* FUTEX_WAIT (shared): the kernel compares *word with `expected` under its own lock, so a
     * bump that happened after we read `expected` makes this return -EAGAIN at once. */
    long r = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, &ts, NULL, 0);
    return r == 0 ? 0 : -errno;
}

void ring_wake_word(_Atomic uint32_t *word, uint32_t how, int efd)
{
    /* Acq_rel: the bump is ordered after everything we published (so a sleeper that reads the
     * new value also sees the data), and a sleeper that read the old value gets -EAGAIN. */
    RING_FETCH_ADD_ACQ_REL(word, 1);
    if (how & RING_WAIT_FUTEX)
        syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    if ((how & RING_WAIT_EVENTFD) && efd >= 0) {
        uint64_t one = 1;
        /* Non-blocking eventfd: EAGAIN only when the counter is saturated, i.e. already set. */
        ssize_t w = write(efd, &one, sizeof one);
        (void)w;
    }
}

/* ---------------------------------------------------------------- waiting, for both ends */

int ring_end_wait(struct ring_end *e, int64_t spin_ns, int64_t timeout_ns)
{
    uint64_t start = ring_now_ns(), deadline;
    int spins = 0, rc;

    if (timeout_ns < 0)
        timeout_ns = 0;
    if (spin_ns > timeout_ns)
        spin_ns = timeout_ns;
    deadline = start + (uint64_t)spin_ns;
    for (;;) {
        rc = e->check(e); /* acquire loads of tail/head (and closed): see the check functions */
        if (rc)
            return rc;
        if (spin_ns == 0 || (++spins % SPIN_CHECK_EVERY == 0 && ring_now_ns() >= deadline))
            break;
        RING_CPU_RELAX();
    }
    uint64_t now = ring_now_ns();
    if (now >= start + (uint64_t)timeout_ns)
        return RING_TIMEOUT;
    /* Relaxed store, then the full fence orders it before the re-check below (Dekker): either
     * we see what the other side published, or it sees our flag and bumps our seq word. */
    RING_STORE_RELAXED(e->waiting, RING_WAIT_FUTEX);
    RING_FENCE_FULL();
    /* Acquire: if we see the other side's bump we also see the tail/head it stored before it. */
    uint32_t seq = RING_LOAD_ACQUIRE(e->seq);
    rc = RING_WOKEN;
    if (!e->check(e)) {
        e->stats[RING_STAT_SLEEPS]++;
        int err = ring_futex_wait(e->seq, seq, (int64_t)(start + (uint64_t)timeout_ns - now));
        if (err == -ETIMEDOUT) {
            e->stats[RING_STAT_TIMEOUTS]++;
            rc = RING_TIMEOUT;
            if (e->count_late && e->check(e) == RING_READY)
                e->stats[RING_STAT_OTHER]++; /* ready when the timeout fired: a missed wake-up */
        }
    }
    /* Relaxed: a stale "waiting" seen by the other side only costs it a spurious wake. */
    RING_STORE_RELAXED(e->waiting, 0);
    int now_rc = e->check(e);
    return now_rc ? now_rc : rc;
}

int ring_end_arm(struct ring_end *e)
{
    /* Relaxed store ordered by the full fence: the same Dekker pair as ring_end_wait. */
    RING_STORE_RELAXED(e->waiting, RING_WAIT_EVENTFD);
    RING_FENCE_FULL();
    if (e->check(e)) {
        RING_STORE_RELAXED(e->waiting, 0); /* relaxed: see ring_end_wait */
        return 1;
    }
    e->stats[RING_STAT_SLEEPS]++;
    return 0;
}

void ring_end_disarm(struct ring_end *e)
{
    /* Relaxed: a stale value only costs the other side a spurious eventfd write. */
    RING_STORE_RELAXED(e->waiting, 0);
}

void ring_end_publish(struct ring_end *e, _Atomic uint64_t *counter, uint64_t value)
{
    /* Release: the producer's record headers and payloads (for tail), or the consumer's reads
     * of the records it gives back (for head), complete before the other side, which
     * acquire-loads the counter, may read them (or overwrite them). */
    RING_STORE_RELEASE(counter, value);
    /* Full fence (Dekker): the counter is globally visible before we read the peer's waiting
     * word; a sleeper does the mirror image before re-checking the counter and sleeping. */
    RING_FENCE_FULL();
    /* Relaxed: ordered by the fence above; a stale 1 only costs a spurious wake. */
    uint32_t waiting = RING_LOAD_RELAXED(e->peer_waiting);
    if (waiting) {
        e->stats[RING_STAT_WAKES]++;
        ring_wake_word(e->peer_seq, waiting, e->peer_efd);
    }
}

/* ---------------------------------------------------------------- process helpers */

int ring_set_pdeathsig(int sig)
{
    return prctl(PR_SET_PDEATHSIG, (unsigned long)sig, 0UL, 0UL, 0UL) == 0 ? 0 : -errno;
}

int ring_set_child_subreaper(int on)
{
    return prctl(PR_SET_CHILD_SUBREAPER, (unsigned long)(on != 0), 0UL, 0UL, 0UL) == 0 ? 0 : -errno;
}
