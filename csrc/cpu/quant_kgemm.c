/* The batched half of quant_kquants.c for Q4_K, Q5_K and Q6_K on AVX-512 VNNI: a tiled int8 GEMM.
 *
 * Why: the K-quant GEMV reads W once per 8 rows of x and reduces each super-block's products
 * across lanes, so a 64-row step read W eight times and spent its time in reductions (3x the
 * Q4_1 GEMM's time on the same shape). This is quant_gemm.c's outer product on super-blocks:
 * output features are the lanes, W is read once per call, nothing is reduced across lanes.
 *
 * W is taken TILE (32) output rows at a time and repacked once per call into one ktile_t per
 * super-block (below): u as 64 groups of 4 consecutive weights, each two registers of 16 rows x
 * 4 unsigned bytes (0..63: quant_kquants.c's u, vpdpbusd's layout; a 16x4-dword transpose of the
 * decoded super-block, quant_tile.h), beside each row's scales, mins, D and M. x is quantized per
 * row and super-block as for the GEMV (Q8_K: dx, q_x, group sums b_g), and
 *   y = sum_b dx (D sum_s S_s sum_{i in s} u_i q_xi - M sum_p (N_2p b_2p + N_2p+1 b_2p+1))
 * with scale groups s (Q4_K/Q5_K: 8 of 32 weights; Q6_K: 16 of 16) and 8 pairs p of the 16 groups
 * of 16. The u q_x sums are vpdpbusd (u8 x s8; |sum| <= 32 * 63 * 127 < 2^31), the mins one
 * vpdpwssd per pair. Each scale group costs one convert and one FMA per 16 outputs beside its
 * vpdpbusd's (Q4_K: 8 of those per 32 weights, as Q4_1's per block).
 *
 * No AVX2 variant: the same tile on vpmaddubsw (int16 sums widened per scale group by vpmaddwd
 * with S, or per group with float scales) ran no faster than the GEMV's passes on the Zen4
 * (Q4_K 1536->576 x64: 1076-1138 vs 1113-1124 us, forced to AVX2), whose 256-weight blocks
 * already reduce across lanes once per output row, so AVX2 batches keep the passes.
 *
 * Compiled for the baseline target; the functions carry their target attributes and run only
 * after quant_gemv checked CPUID. */
#include "parallel.h"
#include "quant_kgemm.h"

#include "quant_kblock.h"
#include "quant_types.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "quant_tile.h"

#define AVX512KG __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define QK QUANT_KBLOCK
#define TILE 32
#define RMAX 4
#define UNROLL _Pragma("GCC unroll 16")

/* One super-block of a tile. */
typedef struct {
    uint8_t u[QK / 4][2][64]; /* group g of 4 weights, rows 16 h .. 16 h + 15, 4 bytes a row */
    float sc[16][TILE];       /* D S_s */
    int32_t nm[8][TILE];      /* (N_2p, N_2p+1) as int16 pairs */
    float mm[TILE];           /* M */
} __attribute__((aligned(64))) ktile_t;

_Static_assert(TILE == QUANT_KGEMM_TILE, "the tile the header names");

size_t quant_kgemm_tile_bytes(int64_t k) { return (size_t)(k / QK) * sizeof(ktile_t); }

/* One repacked tile per thread: the tiles of W split over the pool (parallel.h). */
size_t quant_kgemm_work_bytes(int64_t k) { return (size_t)par_max_threads() * quant_kgemm_tile_bytes(k); }

/* Row j's super-block blk (NULL: a row past W's end, all zeros) into tile column j < TILE: all but u.
 * The scales go from the block (Q6_K) or from registers (Q4_K's unpacked 6-bit scales, as one
 * 64-bit word each) straight into the tile, never through a small array on the stack: a vector
 * load of scalars just stored there cannot be forwarded, and that stall was half of the repack
 * (Zen5, Q4_K at 16 rows of x). */
static inline AVX512KG __attribute__((always_inline)) void repack_scales(const int type, const uint8_t *blk,
                                                                                         int j, ktile_t *t) {
    if (!blk) {
        for (int g = 0; g < 16; g++) t->sc[g][j] = 0.0f;
        for (int p = 0; p < 8; p++) t->nm[p][j] = 0;
        t->mm[j] = 0.0f;
    } else if (type == QUANT_GGML_Q6_K) {
        const int8_t *s8 = (const int8_t *)blk + 192;
        const float d = half_f16c(blk + 208);
        for (int g = 0; g < 16; g++) t->sc[g][j] = d * (float)s8[g];
        for (int p = 0; p < 8; p++)
            t->nm[p][j] = (int32_t)((uint32_t)(uint16_t)s8[2 * p] | (uint32_t)(uint16_t)s8[2 * p + 1] << 16);
        t->mm[j] = 32.0f * d;
    } else {
        uint8_t s8[8], mn[8];
        k4_scales(blk + 4, s8, mn);
        uint64_t sv, mv; /* 8-byte loads of the 8-byte stores k4_scales made: forwarded */
        memcpy(&sv, s8, 8);
        memcpy(&mv, mn, 8);
        const float d = half_f16c(blk);
        for (int g = 0; g < 8; g++) t->sc[g][j] = d * (float)(uint8_t)(sv >> (8 * g)); /* 8 scales of 32 */
        for (int p = 0; p < 8; p++) t->nm[p][j] = (int32_t)(((uint32_t)(uint8_t)(mv >> (8 * p))) * 0x10001u); /* a sub-block is 2 groups of 16 */
        t->mm[j] = half_f16c(blk + 2);
    }
}

/* W rows [0, cnt) (cnt <= TILE; rows beyond are zeros) of nsb super-blocks each into the tile. */
static AVX512KG void repack_ktile(const int type, const uint8_t *w, size_t row_bytes, int64_t nsb, int cnt,
                                  int ahead, ktile_t *tile) {
    const size_t bb = (size_t)quant_block_bytes(type);
    uint8_t rows[16 * QK] __attribute__((aligned(64)));
    const uint8_t *src[16];
    for (int l = 0; l < 16; l++) src[l] = rows + l * QK;
    for (int64_t b = 0; b < nsb; b++) {
        ktile_t *t = tile + b;
        tile_prefetch_ahead(w, row_bytes, TILE, (size_t)b * bb, bb, ahead);
        for (int h = 0; h < 2; h++) {
            for (int l = 0; l < 16; l++) {
                const int j = 16 * h + l;
                const uint8_t *blk = j < cnt ? w + (size_t)j * row_bytes + (size_t)b * bb : NULL;
                __m512i u[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
                if (blk) kblock_u_avx512(type, blk, u);
                repack_scales(type, blk, j, t);
                for (int c = 0; c < 4; c++) _mm512_store_si512((void *)(rows + l * QK + 64 * c), u[c]);
            }
            for (int part = 0; part < QK / 16; part++) { /* 16 bytes (4 groups) of every row at a time */
                __m512i z[4], o[4];
                for (int i = 0; i < 4; i++) z[i] = load_rows(src, i, 16 * part);
                transpose4(z, o);
                for (int d = 0; d < 4; d++) _mm512_store_si512((void *)t->u[4 * part + d][h], o[d]);
            }
        }
    }
}

/* y[r, 0:32] (masks m0, m1 for a short tile) for R rows of x (from row r0 of a) against one tile. */
static inline AVX512KG __attribute__((always_inline)) void ktile_rows(const int type, const int R, const ktile_t *tile,
                                                                       const actk_t *a, int64_t r0, float *y, size_t n,
                                                                       __mmask16 m0, __mmask16 m1) {
    const int ns = type == QUANT_GGML_Q6_K ? 16 : 8, gs = QK / 4 / ns; /* scale groups; groups of 4 in each */
    const int64_t nsb = a->nsb;
    __m512 acc[RMAX][2];
    UNROLL for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const ktile_t *t = tile + b;
        const int8_t *xq[RMAX];
        UNROLL for (int r = 0; r < R; r++) xq[r] = a->q + (size_t)((r0 + r) * nsb + b) * QK;
        __m512 sacc[RMAX][2];
        UNROLL for (int r = 0; r < R; r++) sacc[r][0] = sacc[r][1] = _mm512_setzero_ps();
        for (int s = 0; s < ns; s++) {
            __m512i is[RMAX][2];
            UNROLL for (int r = 0; r < R; r++) is[r][0] = is[r][1] = _mm512_setzero_si512();
            UNROLL for (int g = s * gs; g < s * gs + gs; g++) {
                const __m512i w0 = _mm512_load_si512((const void *)t->u[g][0]);
                const __m512i w1 = _mm512_load_si512((const void *)t->u[g][1]);
                UNROLL for (int r = 0; r < R; r++) {
                    int32_t xv;
                    memcpy(&xv, xq[r] + 4 * g, 4);
                    const __m512i x4 = _mm512_set1_epi32(xv);
                    is[r][0] = _mm512_dpbusd_epi32(is[r][0], w0, x4);
                    is[r][1] = _mm512_dpbusd_epi32(is[r][1], w1, x4);
                }
            }
            const __m512 s0 = _mm512_load_ps(t->sc[s]), s1 = _mm512_load_ps(t->sc[s] + 16);
            UNROLL for (int r = 0; r < R; r++) {
                sacc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[r][0]), s0, sacc[r][0]);
                sacc[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[r][1]), s1, sacc[r][1]);
            }
        }
        __m512i mi[RMAX][2];
        UNROLL for (int r = 0; r < R; r++) mi[r][0] = mi[r][1] = _mm512_setzero_si512();
        UNROLL for (int p = 0; p < 8; p++) {
            const __m512i n0 = _mm512_load_si512((const void *)t->nm[p]);
            const __m512i n1 = _mm512_load_si512((const void *)(t->nm[p] + 16));
            UNROLL for (int r = 0; r < R; r++) {
                int32_t bv; /* the pair (b_2p, b_2p+1) of row r */
                memcpy(&bv, a->bs + (size_t)((r0 + r) * nsb + b) * 16 + 2 * p, 4);
                const __m512i b2 = _mm512_set1_epi32(bv);
                mi[r][0] = _mm512_dpwssd_epi32(mi[r][0], n0, b2);
                mi[r][1] = _mm512_dpwssd_epi32(mi[r][1], n1, b2);
            }
        }
        const __m512 mm0 = _mm512_load_ps(t->mm), mm1 = _mm512_load_ps(t->mm + 16);
        UNROLL for (int r = 0; r < R; r++) {
            const __m512 dx = _mm512_set1_ps(a->d[(size_t)((r0 + r) * nsb + b)]);
            acc[r][0] = _mm512_fmadd_ps(_mm512_fnmadd_ps(_mm512_cvtepi32_ps(mi[r][0]), mm0, sacc[r][0]), dx, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(_mm512_fnmadd_ps(_mm512_cvtepi32_ps(mi[r][1]), mm1, sacc[r][1]), dx, acc[r][1]);
        }
    }
    UNROLL for (int r = 0; r < R; r++) {
        _mm512_mask_storeu_ps(y + (size_t)r * n, m0, acc[r][0]);
        _mm512_mask_storeu_ps(y + (size_t)r * n + 16, m1, acc[r][1]);
    }
}

typedef void ktile_fn(const ktile_t *, const actk_t *, int64_t, float *, size_t, __mmask16, __mmask16);

/* One entry per (type, rows) so both are constants inside: registers, no branches. */
#define KTILE_INSTANCE(T, TNAME, R)                                                                               \
    static AVX512KG void ktile_##TNAME##_##R(const ktile_t *tile, const actk_t *a, int64_t r0, float *y, size_t n, \
                                             __mmask16 m0, __mmask16 m1) {                                        \
        ktile_rows(T, R, tile, a, r0, y, n, m0, m1);                                                              \
    }
#define KTILE_INSTANCES(T, TNAME)                                                                                 \
    KTILE_INSTANCE(T, TNAME, 1) KTILE_INSTANCE(T, TNAME, 2) KTILE_INSTANCE(T, TNAME, 3) KTILE_INSTANCE(T, TNAME, 4) \
    static ktile_fn *const ktile_##TNAME[RMAX] = {ktile_##TNAME##_1, ktile_##TNAME##_2, ktile_##TNAME##_3,        \
                                                  ktile_##TNAME##_4};

KTILE_INSTANCES(QUANT_GGML_Q4_K, q4_k)
KTILE_INSTANCES(QUANT_GGML_Q5_K, q5_k)
KTILE_INSTANCES(QUANT_GGML_Q6_K, q6_k)

static inline __mmask16 lanes_below(int c) { return c >= 16 ? (__mmask16)0xFFFF : c <= 0 ? 0 : (__mmask16)((1u << c) - 1); }

void quant_kgemm_avx512_rows(int type, const actk_t *a, int64_t m, const uint8_t *w, int64_t n, int64_t first,
                             int64_t count, void *tile, float *y) {
    const size_t row_bytes = (size_t)a->nsb * (size_t)quant_block_bytes(type);
    ktile_fn *const *fns = type == QUANT_GGML_Q4_K ? ktile_q4_k : type == QUANT_GGML_Q5_K ? ktile_q5_k : ktile_q6_k;
    for (int64_t j0 = first; j0 < first + count; j0 += TILE) {
        const int cnt = n - j0 < TILE ? (int)(n - j0) : TILE;
        repack_ktile(type, w + (size_t)j0 * row_bytes, row_bytes, a->nsb, cnt, tile_rows_ahead(j0, first, count, TILE),
                     (ktile_t *)tile);
        const __mmask16 m0 = lanes_below(cnt), m1 = lanes_below(cnt - 16);
        for (int64_t r0 = 0; r0 < m; r0 += RMAX) {
            const int rr = m - r0 < RMAX ? (int)(m - r0) : RMAX;
            fns[rr - 1]((const ktile_t *)tile, a, r0, y + (size_t)r0 * (size_t)n + (size_t)j0, (size_t)n, m0, m1);
        }
    }
}

void quant_kgemm_avx512(int type, const actk_t *a, int64_t m, const uint8_t *w, int64_t n, void *work, float *y) {
    const size_t row_bytes = (size_t)a->nsb * (size_t)quant_block_bytes(type), tile_bytes = quant_kgemm_tile_bytes(a->nsb * QK);
    PAR_SLICES((size_t)n * row_bytes, (n + TILE - 1) / TILE, 1, t0, tc,
               quant_kgemm_avx512_rows(type, a, m, w, n, t0 * TILE, tc * TILE,
                                       (uint8_t *)work + (size_t)par_thread() * tile_bytes, y));
}

#else
size_t quant_kgemm_work_bytes(int64_t k) { (void)k; return 0; }

size_t quant_kgemm_tile_bytes(int64_t k) { (void)k; return 0; }

void quant_kgemm_avx512_rows(int type, const actk_t *a, int64_t m, const uint8_t *w, int64_t n, int64_t first,
                             int64_t count, void *tile, float *y) {
    (void)type; (void)a; (void)m; (void)w; (void)n; (void)first; (void)count; (void)tile; (void)y;
}

void quant_kgemm_avx512(int type, const actk_t *a, int64_t m, const uint8_t *w, int64_t n, void *work, float *y) {
    (void)type; (void)a; (void)m; (void)w; (void)n; (void)work; (void)y;
}
#endif
