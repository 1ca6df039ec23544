/* See quant_moe.h. The inner kernels are quant_gemv.c's and quant_kquants.c's GEMVs and the tiled
 * GEMMs (quant_gemm.c, quant_kgemm.c), called a slice of W at a time; this file only lays out the
 * rows and splits the work. */
#include "quant_moe.h"

#include "parallel.h"
#include "quant_gemm.h"
#include "quant_gemv.h"
#include "quant_gemv_rows.h"
#include "quant_kquants.h"
#include "quant_scratch.h"
#include "quant_types.h"

#include <string.h>

/* Output rows of W per work unit of a GEMV pass when several threads share the work (units are
 * numbered expert by expert, output rows within, and each thread takes a contiguous share): fine
 * enough that the shares even out. One thread takes a whole pass over W per unit, as quant_gemv. */
#define GEMV_UNIT 64

/* One active expert: its rows r0 .. r0 + m - 1 in grouped order, whether they run the tiled GEMM
 * (else GEMV passes of `pass` rows, the last may take fewer), and the index of its first work unit. */
typedef struct {
    int64_t e, r0, m, pass, first_unit;
    int tiled;
} group_t;

static inline int64_t passes_of(const group_t *g) { return (g->m + g->pass - 1) / g->pass; }

/* Both activation layouts; the type's block size says which one is filled. */
typedef struct {
    act_t a;   /* 32-weight blocks */
    actk_t ak; /* K-quant super-blocks */
    int32_t *xsum;
} acts_t;

static inline size_t up64(size_t b) { return (b + 63) / 64 * 64; }

static int64_t units_of(const group_t *g, int64_t n, int64_t gemv_rows) {
    if (g->tiled) return (n + QUANT_GEMM_TILE - 1) / QUANT_GEMM_TILE;
    return passes_of(g) * ((n + gemv_rows - 1) / gemv_rows);
}

/* Work unit u of group g (u counted from the group's first): a tile of W's rows for all of g's rows
 * (tiled), or gemv_rows of W's rows for one pass of up to g->pass of g's rows. */
static void run_unit(int type, int isa, const acts_t *x, const group_t *g, int64_t u, const uint8_t *we, int64_t n,
                     int64_t k, int64_t gemv_rows, void *tile, float *yg) {
    const size_t row_bytes = (size_t)(k / quant_block_weights(type)) * (size_t)quant_block_bytes(type);
    const int kquant = quant_block_weights(type) == QUANT_KBLOCK;
    float *y = yg + (size_t)g->r0 * (size_t)n;
#if defined(__x86_64__) && defined(__GNUC__)
    if (g->tiled) {
        const int64_t j0 = u * QUANT_GEMM_TILE, cnt = n - j0 < QUANT_GEMM_TILE ? n - j0 : QUANT_GEMM_TILE;
        if (kquant) {
            const actk_t ak = actk_from_row(&x->ak, g->r0);
            quant_kgemm_avx512_rows(type, &ak, g->m, we, n, j0, cnt, tile, y);
            return;
        }
        const act_t a = act_from_row(&x->a, g->r0);
        (isa == QUANT_ISA_AVX512_VNNI ? quant_gemm_avx512_rows : quant_gemm_avx2_rows)(
            type, a.q, (size_t)a.nbp * QUANT_BLOCK, a.d, a.s, x->xsum + (size_t)g->r0 * (size_t)(k / QUANT_BLOCK),
            (size_t)a.nbs, g->m, we, n, k, j0, cnt, tile, y);
        return;
    }
#else
    (void)tile;
#endif
    const int64_t passes = passes_of(g);
    const int64_t r = u % passes * g->pass, j0 = u / passes * gemv_rows;
    const int64_t m = g->m - r < g->pass ? g->m - r : g->pass;
    const int64_t cnt = n - j0 < gemv_rows ? n - j0 : gemv_rows;
    y += (size_t)r * (size_t)n + (size_t)j0;
    if (kquant) {
        const actk_t ak = actk_from_row(&x->ak, g->r0 + r);
        quant_k_gemv_slice(type, isa, &ak, m, we + (size_t)j0 * row_bytes, cnt, y, n);
    } else {
        const act_t a = act_from_row(&x->a, g->r0 + r);
        quant_gemv_slice(type, isa, &a, m, we + (size_t)j0 * row_bytes, cnt, k, y, n);
    }
}

/* Pair order[i] is the i-th in expert order (stable); off[e] is expert e's first; returns the
 * number of active experts, as groups. */
static int64_t group_pairs(int type, int isa, const int64_t *experts, int64_t pairs, int64_t num_experts,
                           int64_t k, int64_t *off, int64_t *order, group_t *groups) {
    memset(off, 0, (size_t)(num_experts + 1) * sizeof(int64_t));
    for (int64_t p = 0; p < pairs; p++) off[experts[p] + 1]++;
    int64_t ng = 0;
    for (int64_t e = 0; e < num_experts; e++) {
        const int64_t m = off[e + 1];
        off[e + 1] += off[e];
        if (!m) continue;
        group_t *g = &groups[ng++];
        g->e = e;
        g->r0 = off[e];
        g->m = m;
        g->tiled = quant_gemm_runs(type, isa, m, k);
        g->pass = quant_gemv_pass_rows(type, isa, m);
    }
    for (int64_t p = 0; p < pairs; p++) order[off[experts[p]]++] = p;
    return ng;
}

int quant_moe(int type, const float *x, int64_t x_stride, int64_t x_rows, const int64_t *rows,
              const int64_t *experts, int64_t pairs, const uint8_t *w, int64_t num_experts, int64_t n, int64_t k,
              int max_isa, float *y) {
    const int bw = quant_block_weights(type);
    if (bw == 0 || pairs < 1 || x_rows < 1 || num_experts < 1 || n <= 0 || k <= 0 || k % bw || x_stride < k) return -1;
    for (int64_t p = 0; p < pairs; p++)
        if (experts[p] < 0 || experts[p] >= num_experts || rows[p] < 0 || rows[p] >= x_rows) return -1;
    int isa = quant_best_isa();
    if (max_isa < isa) isa = max_isa;
    const int64_t nb = k / QUANT_BLOCK, max_groups = pairs < num_experts ? pairs : num_experts;
    const size_t row_bytes = (size_t)(k / bw) * (size_t)quant_block_bytes(type), expert_bytes = (size_t)n * row_bytes;
    size_t tile_bytes = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (isa >= QUANT_ISA_AVX2) tile_bytes = bw == QUANT_BLOCK ? quant_gemm_tile_bytes(k) : quant_kgemm_tile_bytes(k);
#endif
    /* scratch: off, order, groups; activations; block sums; a tile per thread; y in grouped order */
    const size_t s_off = up64((size_t)(num_experts + 1) * sizeof(int64_t));
    const size_t s_order = up64((size_t)pairs * sizeof(int64_t)), s_groups = up64((size_t)(max_groups + 1) * sizeof(group_t));
    const size_t s_act = bw == QUANT_BLOCK ? act_bytes(pairs, k) : quant_k_act_bytes(pairs, k);
    const size_t s_sums = bw == QUANT_BLOCK ? up64((size_t)pairs * (size_t)nb * sizeof(int32_t)) : 0;
    const size_t s_tiles = (size_t)par_max_threads() * tile_bytes;
    uint8_t *mem = quant_scratch(s_off + s_order + s_groups + s_act + s_sums + s_tiles + (size_t)pairs * (size_t)n * sizeof(float));
    if (!mem) return -2;
    int64_t *off = (int64_t *)mem, *order = (int64_t *)(mem + s_off);
    group_t *groups = (group_t *)(mem + s_off + s_order);
    uint8_t *act_mem = mem + s_off + s_order + s_groups, *tiles = act_mem + s_act + s_sums;
    float *yg = (float *)(tiles + s_tiles);
    acts_t xa;
    memset(&xa, 0, sizeof xa);
    if (bw == QUANT_BLOCK) act_at(act_mem, pairs, k, &xa.a);
    else quant_k_act_at(act_mem, pairs, k, &xa.ak);
    xa.xsum = (int32_t *)(act_mem + s_act);

    const int64_t ng = group_pairs(type, isa, experts, pairs, num_experts, k, off, order, groups);
    int sums = 0;
    size_t bytes = 0; /* W read by the call, for par_threads */
    for (int64_t i = 0; i < ng; i++) {
        sums |= groups[i].tiled && bw == QUANT_BLOCK && type != QUANT_GGML_Q4_1;
        bytes += expert_bytes * (size_t)(groups[i].tiled ? 1 : passes_of(&groups[i]));
    }
    const int threads = par_threads(bytes, ng * ((n + GEMV_UNIT - 1) / GEMV_UNIT));
    const int64_t gemv_rows = threads > 1 ? GEMV_UNIT : n;
    int64_t units = 0;
    for (int64_t i = 0; i < ng; i++) {
        groups[i].first_unit = units;
        units += units_of(&groups[i], n, gemv_rows);
    }
    groups[ng].first_unit = units;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < pairs; i++) {
            const float *xr = x + (size_t)rows[order[i]] * (size_t)x_stride;
            if (bw == QUANT_BLOCK) {
                const act_t a = act_from_row(&xa.a, i);
                quant_quantize_rows(isa, xr, x_stride, 1, k, &a);
#if defined(__x86_64__) && defined(__GNUC__)
                if (sums) quant_gemm_block_sums(a.q, (size_t)a.nbp * QUANT_BLOCK, 1, nb, xa.xsum + (size_t)i * (size_t)nb);
#endif
            } else {
                const actk_t ak = actk_from_row(&xa.ak, i);
                quant_k_quantize_rows(isa, xr, x_stride, 1, &ak);
            }
        }
        void *tile = tiles + (size_t)par_thread() * tile_bytes;
        int64_t g = 0;
#pragma omp for schedule(static) /* a contiguous share: each thread streams through its experts' W */
        for (int64_t u = 0; u < units; u++) {
            while (groups[g + 1].first_unit <= u) g++; /* a thread's units come in increasing order */
            run_unit(type, isa, &xa, &groups[g], u - groups[g].first_unit, w + (size_t)groups[g].e * expert_bytes, n, k,
                     gemv_rows, tile, yg);
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < pairs; i++)
            memcpy(y + (size_t)order[i] * (size_t)n, yg + (size_t)i * (size_t)n, (size_t)n * sizeof(float));
    }
    return 0;
}
