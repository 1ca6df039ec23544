/* See lora_sgmv.h. Compiled for the baseline target; the AVX2 and AVX-512 functions carry their
 * own target attributes and run only after CPUID said the CPU has them.
 *
 * Why a kernel: per projection, torch ran a gather, two batched float32 GEMMs on shapes such as
 * 64 x 576 x 48 (MKL far from its peak there), a mask multiply and an index-add, 120 projections
 * a step of the default model; here one call does every slot's shrink and expand with no
 * intermediate tensor, 3-4x faster a projection at 64 rows over 4 slots (benchmarks/RESULTS.md).
 *
 * Layout of the work: a segment's rows are taken TILE at a time. For a tile, the shrink computes
 * up to CHUNK of the slot's columns for all TILE rows into a small stack buffer, then the expand
 * adds those columns' contribution to each part's output columns; the next CHUNK follows (ranks
 * above CHUNK / parts). Row tiles are independent, so threads split the tiles. */
#include "lora_sgmv.h"

#include "cpu_features.h"
#include "parallel.h"

#include <stddef.h>

/* Rows per tile: each weight vector loaded feeds TILE rows' FMAs. At one row the shrink and the
 * expand are a load per FMA (load-port bound, as a GEMV is); at 4, four FMAs per load, and TILE x 4
 * AVX-512 accumulators (+ 4 weight vectors + 1 broadcast) still fit the 32 registers. */
#define TILE 4
/* Shrink columns held per tile between shrink and expand: [TILE][CHUNK] floats (1 KiB) on the
 * stack whatever the rank; 64 = 4 zmm, so up to rank 16 on 3 parts is one AVX-512 pass over x. */
#define CHUNK 64
/* The most vectors per row of any variant's kernels (AVX-512's; see the variants below). */
#define MAX_NV 4

/* One variant's kernels for T = 1..TILE rows and NV = 1..max_nv vectors per row; T and NV are
 * compile-time constants inside each, so the accumulators live in registers.
 * shrink: s[t * CHUNK + c] = sum_k xr[t][k] a[k * lda + c] for c < cn <= NV * lanes.
 * expand: yr[t][j] += sum_{c < cw} s[t * CHUNK + c] b[c * ldb + j] for j < nj, in steps of
 *         NV * lanes columns (the last vector of a step masked to what is left). */
typedef void (*shrink_fn)(const float *const *xr, int64_t in, const float *a, int64_t lda, int cn, float *s);
typedef void (*expand_fn)(float *const *yr, const float *b, int64_t ldb, int64_t nj, const float *s, int cw);

struct variant {
    int lanes;  /* floats per vector */
    int max_nv; /* vectors per row in one step: TILE * max_nv accumulators fit the registers */
    shrink_fn shrink[TILE][MAX_NV];
    expand_fn expand[TILE][MAX_NV];
};

/* ---------------------------------------------------------------- plain C (any CPU; tests) */

static void shrink_c(const int T, const float *const *xr, int64_t in, const float *a, int64_t lda, int cn, float *s) {
    for (int t = 0; t < T; t++)
        for (int c = 0; c < cn; c++) s[t * CHUNK + c] = 0.0f;
    for (int64_t k = 0; k < in; k++, a += lda)
        for (int t = 0; t < T; t++) {
            const float xv = xr[t][k];
            for (int c = 0; c < cn; c++) s[t * CHUNK + c] += xv * a[c];
        }
}

static void expand_c(const int T, float *const *yr, const float *b, int64_t ldb, int64_t nj, const float *s, int cw) {
    for (int c = 0; c < cw; c++, b += ldb)
        for (int t = 0; t < T; t++) {
            const float sv = s[t * CHUNK + c];
            for (int64_t j = 0; j < nj; j++) yr[t][j] += sv * b[j];
        }
}

#define INSTANCE_C(T)                                                                                         \
    static void shrink_c_##T(const float *const *xr, int64_t in, const float *a, int64_t lda, int cn,         \
                             float *s) { shrink_c(T, xr, in, a, lda, cn, s); }                                \
    static void expand_c_##T(float *const *yr, const float *b, int64_t ldb, int64_t nj, const float *s,       \
                             int cw) { expand_c(T, yr, b, ldb, nj, s, cw); }
INSTANCE_C(1) INSTANCE_C(2) INSTANCE_C(3) INSTANCE_C(4)

/* One "vector" of CHUNK floats: the plain loops take any width in one call. */
static const struct variant variant_c = {
    CHUNK, 1,
    {{shrink_c_1}, {shrink_c_2}, {shrink_c_3}, {shrink_c_4}},
    {{expand_c_1}, {expand_c_2}, {expand_c_3}, {expand_c_4}},
};

#if defined(__x86_64__) && defined(__GNUC__)
#include "avx2_math.h"

#define AVX512 __attribute__((target("avx512f,avx2,fma")))
#define ALWAYS __attribute__((always_inline))

/* ---------------------------------------------------------------- AVX-512: 16 floats a vector */

static inline AVX512 ALWAYS __mmask16 first16(int64_t n) {
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

/* Row k of a_t (NV vectors) times T broadcast x values, into acc. The masked load of the last
 * vector keeps the read inside the slot's columns (a_t's rows are cols long, not a multiple of 16
 * in general, and the last row of the last slot ends the tensor). */
static inline AVX512 ALWAYS void shrink_k_512(const int T, const int NV, const float *const *xr, int64_t k,
                                              const float *a, __mmask16 last, __m512 (*acc)[MAX_NV]) {
    __m512 av[MAX_NV];
    UNROLL for (int v = 0; v < NV; v++) av[v] =
        v < NV - 1 ? _mm512_loadu_ps(a + 16 * v) : _mm512_maskz_loadu_ps(last, a + 16 * v);
    UNROLL for (int t = 0; t < T; t++) {
        const __m512 xv = _mm512_set1_ps(xr[t][k]);
        UNROLL for (int v = 0; v < NV; v++) acc[t][v] = _mm512_fmadd_ps(xv, av[v], acc[t][v]);
    }
}

/* At NV = 1 (a one-part projection of rank <= 16: o_proj, down_proj) the T chains of dependent
 * FMAs are fewer than FMA latency x pipes (~8) keeps busy, so H = 2 sets of accumulators take
 * the even and the odd k, added at the end (a fixed order per width: still batch invariant). */
static inline AVX512 ALWAYS void shrink_512(const int T, const int NV, const float *const *xr, int64_t in,
                                            const float *a, int64_t lda, int cn, float *s) {
    const int H = NV == 1 ? 2 : 1;
    const __mmask16 last = first16(cn - 16 * (NV - 1));
    __m512 acc[2][TILE][MAX_NV];
    UNROLL for (int h = 0; h < H; h++) UNROLL for (int t = 0; t < T; t++) UNROLL for (int v = 0; v < NV; v++)
        acc[h][t][v] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + H <= in; k += H)
        UNROLL for (int h = 0; h < H; h++) shrink_k_512(T, NV, xr, k + h, a + (k + h) * lda, last, acc[h]);
    for (; k < in; k++) shrink_k_512(T, NV, xr, k, a + k * lda, last, acc[0]);
    /* lanes past cn are zeros and stay inside the tile's CHUNK-wide row of s */
    UNROLL for (int t = 0; t < T; t++) UNROLL for (int v = 0; v < NV; v++)
        _mm512_storeu_ps(s + t * CHUNK + 16 * v, H == 2 ? _mm512_add_ps(acc[0][t][v], acc[1][t][v]) : acc[0][t][v]);
}

/* Per step of NV vectors of output columns: y loaded once into registers, every shrink column c
 * adds s[t][c] * b_t's row c (NV vectors loaded once for T rows), y stored once. */
static inline AVX512 ALWAYS void expand_512(const int T, const int NV, float *const *yr, const float *b, int64_t ldb,
                                            int64_t nj, const float *s, int cw) {
    for (int64_t j = 0; j < nj; j += 16 * NV) {
        const __mmask16 last = first16(nj - j - 16 * (NV - 1));
        __m512 acc[TILE][MAX_NV];
        UNROLL for (int t = 0; t < T; t++) UNROLL for (int v = 0; v < NV; v++) acc[t][v] =
            _mm512_maskz_loadu_ps(v < NV - 1 ? (__mmask16)0xffff : last, yr[t] + j + 16 * v);
        const float *bc = b + j;
        for (int c = 0; c < cw; c++, bc += ldb) {
            __m512 bv[MAX_NV];
            UNROLL for (int v = 0; v < NV; v++) bv[v] =
                _mm512_maskz_loadu_ps(v < NV - 1 ? (__mmask16)0xffff : last, bc + 16 * v);
            UNROLL for (int t = 0; t < T; t++) {
                const __m512 sv = _mm512_set1_ps(s[t * CHUNK + c]);
                UNROLL for (int v = 0; v < NV; v++) acc[t][v] = _mm512_fmadd_ps(sv, bv[v], acc[t][v]);
            }
        }
        UNROLL for (int t = 0; t < T; t++) UNROLL for (int v = 0; v < NV; v++)
            _mm512_mask_storeu_ps(yr[t] + j + 16 * v, v < NV - 1 ? (__mmask16)0xffff : last, acc[t][v]);
    }
}

/* ---------------------------------------------------------------- AVX2 + FMA: 8 floats a vector */

static inline AVX2 ALWAYS __m256i first8(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n >= 8 ? 8 : (int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* As shrink_k_512 on 8-float vectors; the masked load only where the last vector is partial
 * (vmaskmov is slower than a plain load). */
static inline AVX2 ALWAYS void shrink_k_256(const int T, const int NV, const float *const *xr, int64_t k,
                                            const float *a, int full, __m256i last, __m256 (*acc)[MAX_NV]) {
    __m256 av[MAX_NV];
    UNROLL for (int v = 0; v < NV; v++) av[v] =
        v < NV - 1 || full ? _mm256_loadu_ps(a + 8 * v) : _mm256_maskload_ps(a + 8 * v, last);
    UNROLL for (int t = 0; t < T; t++) {
        const __m256 xv = _mm256_broadcast_ss(xr[t] + k);
        UNROLL for (int v = 0; v < NV; v++) acc[t][v] = _mm256_fmadd_ps(xv, av[v], acc[t][v]);
    }
}

/* As shrink_512 on 16 ymm registers: NV <= 2, so at most 8 accumulators (two sets of 4 at
 * NV = 1) + 2 weight vectors + 1 broadcast. */
static inline AVX2 ALWAYS void shrink_256(const int T, const int NV, const float *const *xr, int64_t in,
                                          const float *a, int64_t lda, int cn, float *s) {
    const int H = NV == 1 ? 2 : 1, full = cn >= 8 * NV;
    const __m256i last = first8(cn - 8 * (NV - 1));
    __m256 acc[2][TILE][MAX_NV];
    UNROLL for (int h = 0; h < H; h++) UNROLL for (int t = 0; t < T; t++) UNROLL for (int v = 0; v < NV; v++)
        acc[h][t][v] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + H <= in; k += H)
        UNROLL for (int h = 0; h < H; h++) shrink_k_256(T, NV, xr, k + h, a + (k + h) * lda, full, last, acc[h]);
    for (; k < in; k++) shrink_k_256(T, NV, xr, k, a + k * lda, full, last, acc[0]);
    UNROLL for (int t = 0; t < T; t++) UNROLL for (int v = 0; v < NV; v++)
        _mm256_storeu_ps(s + t * CHUNK + 8 * v, H == 2 ? _mm256_add_ps(acc[0][t][v], acc[1][t][v]) : acc[0][t][v]);
}

static inline AVX2 ALWAYS void expand_256(const int T, const int NV, float *const *yr, const float *b, int64_t ldb,
                                          int64_t nj, const float *s, int cw) {
    for (int64_t j = 0; j < nj; j += 8 * NV) {
        const int full = nj - j >= 8 * NV;
        const __m256i last = first8(nj - j - 8 * (NV - 1));
        __m256 acc[TILE][MAX_NV];
        UNROLL for (int t = 0; t < T; t++) UNROLL for (int v = 0; v < NV; v++) acc[t][v] =
            v < NV - 1 || full ? _mm256_loadu_ps(yr[t] + j + 8 * v) : _mm256_maskload_ps(yr[t] + j + 8 * v, last);
        const float *bc = b + j;
        for (int c = 0; c < cw; c++, bc += ldb) {
            __m256 bv[MAX_NV];
            UNROLL for (int v = 0; v < NV; v++) bv[v] =
                v < NV - 1 || full ? _mm256_loadu_ps(bc + 8 * v) : _mm256_maskload_ps(bc + 8 * v, last);
            UNROLL for (int t = 0; t < T; t++) {
                const __m256 sv = _mm256_broadcast_ss(s + t * CHUNK + c);
                UNROLL for (int v = 0; v < NV; v++) acc[t][v] = _mm256_fmadd_ps(sv, bv[v], acc[t][v]);
            }
        }
        UNROLL for (int t = 0; t < T; t++) UNROLL for (int v = 0; v < NV; v++) {
            if (v < NV - 1 || full) _mm256_storeu_ps(yr[t] + j + 8 * v, acc[t][v]);
            else _mm256_maskstore_ps(yr[t] + j + 8 * v, last, acc[t][v]);
        }
    }
}

#define INSTANCE(ISA, ATTR, T, NV)                                                                            \
    static ATTR void shrink_##ISA##_##T##_##NV(const float *const *xr, int64_t in, const float *a, int64_t lda, \
                                               int cn, float *s) { shrink_##ISA(T, NV, xr, in, a, lda, cn, s); } \
    static ATTR void expand_##ISA##_##T##_##NV(float *const *yr, const float *b, int64_t ldb, int64_t nj,      \
                                               const float *s, int cw) { expand_##ISA(T, NV, yr, b, ldb, nj, s, cw); }
#define INSTANCES_512(T) INSTANCE(512, AVX512, T, 1) INSTANCE(512, AVX512, T, 2) INSTANCE(512, AVX512, T, 3) \
    INSTANCE(512, AVX512, T, 4)
#define INSTANCES_256(T) INSTANCE(256, AVX2, T, 1) INSTANCE(256, AVX2, T, 2)
INSTANCES_512(1) INSTANCES_512(2) INSTANCES_512(3) INSTANCES_512(4)
INSTANCES_256(1) INSTANCES_256(2) INSTANCES_256(3) INSTANCES_256(4)

#define ROW_512(F, T) {F##_512_##T##_1, F##_512_##T##_2, F##_512_##T##_3, F##_512_##T##_4}
#define ROW_256(F, T) {F##_256_##T##_1, F##_256_##T##_2}
static const struct variant variant_512 = {
    16, 4,
    {ROW_512(shrink, 1), ROW_512(shrink, 2), ROW_512(shrink, 3), ROW_512(shrink, 4)},
    {ROW_512(expand, 1), ROW_512(expand, 2), ROW_512(expand, 3), ROW_512(expand, 4)},
};
static const struct variant variant_256 = {
    8, 2,
    {ROW_256(shrink, 1), ROW_256(shrink, 2), ROW_256(shrink, 3), ROW_256(shrink, 4)},
    {ROW_256(expand, 1), ROW_256(expand, 2), ROW_256(expand, 3), ROW_256(expand, 4)},
};
#endif

int lora_sgmv_best_isa(void) {
    if (cpu_avx512_supported()) return LORA_SGMV_ISA_AVX512;
    return cpu_kernels_supported() ? LORA_SGMV_ISA_AVX2 : LORA_SGMV_ISA_C;
}

static const struct variant *pick(int max_isa) {
    const int isa = lora_sgmv_best_isa() < max_isa ? lora_sgmv_best_isa() : max_isa;
#if defined(__x86_64__) && defined(__GNUC__)
    if (isa == LORA_SGMV_ISA_AVX512) return &variant_512;
    if (isa == LORA_SGMV_ISA_AVX2) return &variant_256;
#else
    (void)isa;
#endif
    return &variant_c;
}

/* ---------------------------------------------------------------- driver (any variant) */

struct sgmv {
    const struct variant *v;
    const float *x, *a_t, *b_t;
    float *y;
    int64_t x_stride, y_stride, in, cols, out, num_parts;
    const int32_t *rows, *seg_slot, *seg_start, *width, *parts;
    int64_t segments;
};

/* nv vectors cover n <= lanes * max_nv columns */
static int vectors(const struct variant *v, int64_t n) { return (int)((n + v->lanes - 1) / v->lanes); }

/* T rows (xr, yr) of one slot: its a_t [in, cols] and b_t [cols, out], w columns, rank r. */
static void run_tile(const struct sgmv *p, const int T, const float *const *xr, float *const *yr, const float *a,
                     const float *b, int w) {
    const struct variant *v = p->v;
    const int step = v->lanes * v->max_nv, r = (int)(w / p->num_parts);
    float s[TILE * CHUNK];
    for (int c0 = 0; c0 < w; c0 += CHUNK) {
        const int cn = w - c0 < CHUNK ? w - c0 : CHUNK;
        for (int g = 0; g < cn; g += step) {
            const int gn = cn - g < step ? cn - g : step;
            v->shrink[T - 1][vectors(v, gn) - 1](xr, p->in, a + c0 + g, p->cols, gn, s + g);
        }
        int64_t j0 = 0; /* part q's first output column */
        for (int q = 0; q < p->num_parts; j0 += p->parts[q++]) {
            /* part q's shrink columns [q r, (q + 1) r) inside this chunk; the others' rows of
             * b_t are zeros in part q's output columns, so they are skipped */
            const int lo = q * r > c0 ? q * r : c0, hi = (q + 1) * r < c0 + cn ? (q + 1) * r : c0 + cn;
            if (lo >= hi) continue;
            const int64_t n = p->parts[q], full = n - n % step;
            float *yq[TILE];
            for (int t = 0; t < T; t++) yq[t] = yr[t] + j0;
            const float *bq = b + (size_t)lo * (size_t)p->out + (size_t)j0;
            if (full) v->expand[T - 1][v->max_nv - 1](yq, bq, p->out, full, s + (lo - c0), hi - lo);
            if (n > full) {
                for (int t = 0; t < T; t++) yq[t] += full;
                v->expand[T - 1][vectors(v, n - full) - 1](yq, bq + full, p->out, n - full, s + (lo - c0), hi - lo);
            }
        }
    }
}

/* Tiles [first, first + count) of the call, numbered over the segments in order (a segment of
 * len rows whose slot has a width holds ceil(len / TILE) tiles; one of width 0 holds none). */
static void run_tiles(const struct sgmv *p, int64_t first, int64_t count) {
    const int64_t end = first + count;
    int64_t tile = 0;
    for (int64_t g = 0; g < p->segments && tile < end; g++) {
        const int32_t slot = p->seg_slot[g], w = p->width[slot];
        const int64_t i0 = p->seg_start[g], len = p->seg_start[g + 1] - i0;
        const int64_t tiles = w ? (len + TILE - 1) / TILE : 0;
        const float *a = p->a_t + (size_t)slot * (size_t)p->in * (size_t)p->cols;
        const float *b = p->b_t + (size_t)slot * (size_t)p->cols * (size_t)p->out;
        for (int64_t i = tile < first ? first - tile : 0; i < tiles && tile + i < end; i++) {
            const int T = len - i * TILE < TILE ? (int)(len - i * TILE) : TILE;
            const float *xr[TILE];
            float *yr[TILE];
            for (int t = 0; t < T; t++) {
                const int64_t row = p->rows[i0 + i * TILE + t];
                xr[t] = p->x + (size_t)row * (size_t)p->x_stride;
                yr[t] = p->y + (size_t)row * (size_t)p->y_stride;
            }
            run_tile(p, T, xr, yr, a, b, w);
        }
        tile += tiles;
    }
}

/* The bounds lora_sgmv.h states (row uniqueness excepted), before anything is written;
 * sets *out to the sum of parts. O(rows + segments + parts): nothing next to the products. */
static int check(const struct sgmv *p, int64_t n, int64_t slots, int64_t *out) {
    if (n < 0 || p->in < 1 || p->cols < 0 || p->num_parts < 1 || p->segments < 0 || slots < 1 ||
        p->x_stride < p->in)
        return -1;
    int64_t sum = 0;
    for (int64_t q = 0; q < p->num_parts; q++) {
        if (p->parts[q] < 0) return -1;
        sum += p->parts[q];
    }
    if (p->y_stride < sum) return -1;
    for (int64_t g = 0; g < p->segments; g++) {
        const int32_t slot = p->seg_slot[g];
        if (slot < 0 || slot >= slots) return -1;
        const int32_t w = p->width[slot];
        if (w < 0 || w > p->cols || w % p->num_parts) return -1;
        if (p->seg_start[g] < 0 || p->seg_start[g + 1] < p->seg_start[g]) return -1;
        for (int64_t i = p->seg_start[g]; i < p->seg_start[g + 1]; i++)
            if (p->rows[i] < 0 || p->rows[i] >= n) return -1;
    }
    *out = sum;
    return 0;
}

int lora_sgmv(const float *x, int64_t x_stride, float *y, int64_t y_stride, int64_t n, const int32_t *rows,
              const int32_t *seg_slot, const int32_t *seg_start, int64_t segments, const float *a_t,
              const float *b_t, const int32_t *width, int64_t slots, int64_t in, int64_t cols,
              const int32_t *parts, int64_t num_parts, int max_isa) {
    struct sgmv p = {.v = pick(max_isa), .x = x, .a_t = a_t, .b_t = b_t, .y = y, .x_stride = x_stride,
                     .y_stride = y_stride, .in = in, .cols = cols, .num_parts = num_parts, .rows = rows,
                     .seg_slot = seg_slot, .seg_start = seg_start, .width = width, .parts = parts,
                     .segments = segments};
    if (check(&p, n, slots, &p.out)) return -1;
    /* the bytes a call reads, for par_threads: each segment's a_t columns and expand blocks, and
     * its rows of x and y; the units are tiles */
    size_t bytes = 0;
    int64_t tiles = 0;
    for (int64_t g = 0; g < segments; g++) {
        const int64_t w = width[seg_slot[g]], len = seg_start[g + 1] - seg_start[g];
        if (!w) continue;
        bytes += sizeof(float) * (size_t)(w * in + w / num_parts * p.out + len * (in + 2 * p.out));
        tiles += (len + TILE - 1) / TILE;
    }
    /* threads own disjoint tiles, so disjoint rows of y (each row is in one segment) */
    PAR_SLICES(bytes, tiles, 1, first, count, run_tiles(&p, first, count));
    return 0;
}
