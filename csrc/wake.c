/*
 * wake.c - futex and eventfd wake-ups, and the process helpers the transport needs
 * (parent-death signal, child subreaper).
 */
#define _GNU_SOURCE
#include "ring.h"
#include "ring_atomic.h"
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

int ring_set_pdeathsig(int sig)
{
    return prctl(PR_SET_PDEATHSIG, (unsigned long)sig, 0UL, 0UL, 0UL) == 0 ? 0 : -errno;
}

int ring_set_child_subreaper(int on)
{
    return prctl(PR_SET_CHILD_SUBREAPER, (unsigned long)(on != 0), 0UL, 0UL, 0UL) == 0 ? 0 : -errno;
}
