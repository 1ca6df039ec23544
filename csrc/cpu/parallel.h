/* Splitting a kernel's independent outputs over the model's threads, in torch's own pool.
 *
 * Why: at a realistic size (1.56B, Q4_0) a decode step is ~100 ms of GEMV that one core runs at
 * ~9 GB/s while the other idles; llama.cpp reads ~24 GB/s on two. The kernels are built with
 * -fopenmp and link libgomp.so.1, the soname torch's own libgomp carries, so the process holds one
 * OpenMP runtime: one pool of threads, sized by torch.set_num_threads (omp_set_num_threads) or
 * OMP_NUM_THREADS, which torch's GEMMs and these kernels take turns on; nothing oversubscribes.
 * The EngineCore sets OMP_WAIT_POLICY=PASSIVE (engine/torch_env.py): an idle worker sleeps on a
 * futex rather than spinning on a core the frontend needs, so each parallel region pays a wake-up
 * (~12 us at best here, more on a loaded host). Work below PAR_MIN_BYTES therefore stays on the
 * calling thread, and a model of a few ms per step gets one thread anyway (engine/config.py).
 *
 * Use:   const int t = par_threads(bytes_touched, units);
 *        #pragma omp parallel num_threads(t) if (t > 1)
 *        { int64_t first, count; par_slice(units, align, &first, &count); ... }
 */
#ifndef RINGLLM_PARALLEL_H
#define RINGLLM_PARALLEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* Below this many bytes read by a call, one thread finishes before a second one would wake:
 * ~50 us of reading at the ~10 GB/s one core streams, several wake-ups' worth. */
#define PAR_MIN_BYTES (512 * 1024)

/* Threads for a call over `units` independent pieces that touches `bytes`: 1 when small, when
 * already inside a parallel region, or without OpenMP; else the pool's size (at most `units`). */
static inline int par_threads(size_t bytes, int64_t units) {
#ifdef _OPENMP
    if (bytes < PAR_MIN_BYTES || units < 2 || omp_in_parallel()) return 1;
    const int t = omp_get_max_threads();
    return (int64_t)t < units ? t : (int)units;
#else
    (void)bytes; (void)units;
    return 1;
#endif
}

/* The most threads par_threads can return on this thread: per-thread work areas are sized by it. */
static inline int par_max_threads(void) {
#ifdef _OPENMP
    return omp_in_parallel() ? 1 : omp_get_max_threads();
#else
    return 1;
#endif
}

/* The index of the calling thread in its region (0 outside one). */
static inline int par_thread(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* The calling thread's contiguous share of `units` inside a parallel region: first and count,
 * each share a multiple of `align` units but the last (the whole range outside a region). */
static inline void par_slice(int64_t units, int64_t align, int64_t *first, int64_t *count) {
#ifdef _OPENMP
    const int64_t t = omp_get_num_threads(), i = omp_get_thread_num();
#else
    const int64_t t = 1, i = 0;
#endif
    const int64_t chunks = (units + align - 1) / align, per = chunks / t, extra = chunks % t;
    const int64_t c0 = i * per + (i < extra ? i : extra), c1 = c0 + per + (i < extra ? 1 : 0);
    const int64_t u0 = c0 * align, u1 = c1 * align < units ? c1 * align : units;
    *first = u0;
    *count = u1 > u0 ? u1 - u0 : 0;
}

/* BODY with `first` and `count` (int64_t) bound to the calling thread's share of `units`
 * (par_slice), run over par_threads(bytes, units) threads; BODY is skipped for an empty share. */
#define PAR_SLICES(bytes, units, align, first, count, BODY)                      \
    do {                                                                       \
        const int par_t_ = par_threads((bytes), (units));                      \
        _Pragma("omp parallel num_threads(par_t_) if (par_t_ > 1)")            \
        {                                                                      \
            int64_t first, count;                                              \
            par_slice((units), (align), &first, &count);                       \
            if (count) { BODY; }                                               \
        }                                                                      \
    } while (0)

#endif
