/* See paged_attention.h. The kernel body is paged_attention_impl.h, included once per
 * instruction set below: AVX2 + FMA is the baseline every supported CPU runs; AVX-512
 * (F + BW) doubles the vector width and the register file where CPUID reports it. Each
 * variant carries its own target attribute, so the file builds for the baseline target and
 * the entry point picks a variant per call (cpu_features.c). */
#include "paged_attention.h"

#include <math.h>
#include <stdlib.h>

#include "cpu_features.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "avx2_math.h"

/* Scores are computed 4 (AVX2) or 8 (AVX-512) keys at a time: a sequence's row table is
 * padded to a multiple of 8 by repeating its last row, so the score loop has no remainder;
 * the padded scores are computed and never used. */
#define KEY_PAD 8
/* Every helper is inlined: they take accumulator arrays by pointer, which otherwise keeps
 * the arrays in memory instead of registers. */
#define ALWAYS_INLINE __attribute__((always_inline))
#define MAX_GROUP_BLOCK 3 /* query heads per pass: 3 x 4 accumulators fit AVX2's registers */
/* The keys are scattered over cache blocks and the batch's cache (per layer) is far bigger
 * than L2, so without help the loads wait on a miss for every K and V row (profiled: most of
 * the time). Two kinds of prefetch keep the rows coming: each loop asks for its own rows this
 * many keys ahead (rows[] is padded with repeats of the last row, so no bound check), and
 * each pass asks into L2 for the rows the next pass reads (the score pass for the V rows, a
 * value pass for the next KV head's K rows or the next sequence's), one row per key it
 * handles, so the requests are spread over the pass rather than issued in a burst. */
#define PREFETCH_KEYS 16 /* 8 and 32 measured the same */

/* Asks for the cache lines of elems elements (float32 or bf16) at element idx of base, into
 * L1 (hint 0) or L2 (hint 1). */
static inline ALWAYS_INLINE void prefetch_span(const void *base, int64_t idx, int bf16, int64_t elems, int hint) {
    const char *p = (const char *)base + idx * (bf16 ? 2 : 4);
    for (int64_t b = 0; b < elems * (bf16 ? 2 : 4); b += 64) {
        if (hint == 0)
            _mm_prefetch(p + b, _MM_HINT_T0);
        else
            _mm_prefetch(p + b, _MM_HINT_T1);
    }
}

/* In place: s[i] = cap * tanh(s[i] / cap) (Gemma 2's soft-cap), tanh(x) = sign(x) (1 - e) / (1 + e) with
 * e = e^(-2|x|) <= 1, so the exp never overflows; the tail in tanhf. */
static AVX2 void softcap_scores(float *s, int64_t n, float cap) {
    const __m256 vcap = _mm256_set1_ps(cap), inv = _mm256_set1_ps(1.0f / cap), one = _mm256_set1_ps(1.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + i), inv);
        __m256 e = exp_clamped(_mm256_mul_ps(_mm256_or_ps(x, sign), _mm256_set1_ps(2.0f)));  /* e^(-2|x|) */
        __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
        _mm256_storeu_ps(s + i, _mm256_mul_ps(_mm256_or_ps(t, _mm256_and_ps(x, sign)), vcap));
    }
    for (; i < n; i++) s[i] = cap * tanhf(s[i] / cap);
}

/* In place: s[i] = e^(s[i] - max s), n >= 1; returns 1 / sum of them (the softmax is s times it). */
static AVX2 float exp_scores(float *s, int64_t n) {
    __m256 vmax = _mm256_set1_ps(-__builtin_inff());
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + i));
    float m = hmax(vmax);
    for (; i < n; i++) m = s[i] > m ? s[i] : m;
    __m256 vm = _mm256_set1_ps(m), vsum = _mm256_setzero_ps();
    for (i = 0; i + LANES <= n; i += LANES) {
        __m256 e = exp_clamped(_mm256_sub_ps(_mm256_loadu_ps(s + i), vm));
        _mm256_storeu_ps(s + i, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float sum = hsum(vsum);
    if (i < n) {  /* the tail through one padded vector, so every score uses the same exp */
        float tail[LANES];
        for (int t = 0; t < LANES; t++) tail[t] = i + t < n ? s[i + t] - m : -87.0f;
        _mm256_storeu_ps(tail, exp_clamped(_mm256_loadu_ps(tail)));
        for (int t = 0; i + t < n; t++) {
            s[i + t] = tail[t];
            sum += tail[t];
        }
    }
    return 1.0f / sum;
}

/* ---- AVX2: chunks of 16 elements, scores 4 keys at a time (3 heads x 4 keys = 12 of the 16
 * registers). A bf16 chunk's 32-bit words each hold elements 2i (low half) and 2i + 1. */

static inline AVX2 ALWAYS_INLINE void load_chunk_avx2(const void *base, int64_t idx, int bf16, __m256 *lo, __m256 *hi) {
    if (bf16) {
        __m256i raw = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + idx));
        *lo = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
        *hi = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32((int)0xffff0000u)));
    } else {
        *lo = _mm256_loadu_ps((const float *)base + idx);
        *hi = _mm256_loadu_ps((const float *)base + idx + LANES);
    }
}

/* The last chunk of a row whose length is 8 mod 16: only 8 elements are read (valid is 8). */
static inline AVX2 ALWAYS_INLINE void load_tail_avx2(const void *base, int64_t idx, int bf16, int valid, __m256 *lo,
                                       __m256 *hi) {
    (void)valid;
    if (bf16) {
        __m256i raw = _mm256_set_m128i(_mm_setzero_si128(),
                                       _mm_loadu_si128((const __m128i *)((const uint16_t *)base + idx)));
        *lo = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
        *hi = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32((int)0xffff0000u)));
    } else {
        *lo = _mm256_loadu_ps((const float *)base + idx);
        *hi = _mm256_setzero_ps();
    }
}

/* dst[i] = scale * (sum of a[i]'s lanes), i < 4: three hadds serve four scores. */
static inline AVX2 ALWAYS_INLINE void reduce_scores_avx2(const __m256 *a, float scale, float *dst) {
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    _mm_storeu_ps(dst, _mm_mul_ps(r, _mm_set1_ps(scale)));
}

/* valid (>= 8) floats of one chunk, times scale, from chunk order (src) to element order (dst). */
static inline AVX2 ALWAYS_INLINE void store_chunk_avx2(const float *src, int bf16, float scale, float *dst,
                                                       int64_t valid) {
    __m256 lo = _mm256_mul_ps(_mm256_loadu_ps(src), _mm256_set1_ps(scale));
    __m256 hi = _mm256_mul_ps(_mm256_loadu_ps(src + LANES), _mm256_set1_ps(scale));
    if (bf16) {
        __m256 a = _mm256_unpacklo_ps(lo, hi), b = _mm256_unpackhi_ps(lo, hi);
        lo = _mm256_permute2f128_ps(a, b, 0x20);
        hi = _mm256_permute2f128_ps(a, b, 0x31);
    }
    _mm256_storeu_ps(dst, lo);
    if (valid >= 2 * LANES) _mm256_storeu_ps(dst + LANES, hi);
}

/* valid (>= 8) floats of a query chunk into chunk order, zero-padded to 16. */
static inline AVX2 ALWAYS_INLINE void permute_q_avx2(const float *q, int64_t valid, int bf16, float *dst) {
    __m256 x = _mm256_loadu_ps(q), y = valid >= 2 * LANES ? _mm256_loadu_ps(q + LANES) : _mm256_setzero_ps();
    if (bf16) {
        __m256 even = _mm256_shuffle_ps(x, y, _MM_SHUFFLE(2, 0, 2, 0));
        __m256 odd = _mm256_shuffle_ps(x, y, _MM_SHUFFLE(3, 1, 3, 1));
        x = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), _MM_SHUFFLE(3, 1, 2, 0)));
        y = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), _MM_SHUFFLE(3, 1, 2, 0)));
    }
    _mm256_storeu_ps(dst, x);
    _mm256_storeu_ps(dst + LANES, y);
}

#define ISA avx2
#define VTARGET AVX2
#define V __m256
#define VL LANES
#define QK_KEYS 4
#define vzero _mm256_setzero_ps
#define vfma _mm256_fmadd_ps
#define vloadu _mm256_loadu_ps
#define vstoreu _mm256_storeu_ps
#define vbcast _mm256_broadcast_ss
#define load_chunk load_chunk_avx2
#define load_tail load_tail_avx2
#define reduce_scores reduce_scores_avx2
#define store_chunk store_chunk_avx2
#define permute_q permute_q_avx2
#include "paged_attention_impl.h"
#undef ISA
#undef VTARGET
#undef V
#undef VL
#undef QK_KEYS
#undef vzero
#undef vfma
#undef vloadu
#undef vstoreu
#undef vbcast
#undef load_chunk
#undef load_tail
#undef reduce_scores
#undef store_chunk
#undef permute_q

/* ---- AVX-512: chunks of 32 elements, scores 8 keys at a time (24 of the 32 registers);
 * tails (head dims of 8, 16 or 24 mod 32) through masked loads, which never fault. */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma")))
#define ZL 16

static inline AVX512 ALWAYS_INLINE __mmask16 first_lanes(int64_t k) {
    return k >= ZL ? (__mmask16)0xffff : k <= 0 ? (__mmask16)0 : (__mmask16)((1u << k) - 1);
}

static inline AVX512 ALWAYS_INLINE void load_chunk_avx512(const void *base, int64_t idx, int bf16, __m512 *lo,
                                                          __m512 *hi) {
    if (bf16) {
        __m512i raw = _mm512_loadu_si512((const void *)((const uint16_t *)base + idx));
        *lo = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
        *hi = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32((int)0xffff0000u)));
    } else {
        *lo = _mm512_loadu_ps((const float *)base + idx);
        *hi = _mm512_loadu_ps((const float *)base + idx + ZL);
    }
}

static inline AVX512 ALWAYS_INLINE void load_tail_avx512(const void *base, int64_t idx, int bf16, int valid, __m512 *lo,
                                           __m512 *hi) {
    if (bf16) {
        __m512i raw = _mm512_maskz_loadu_epi16((__mmask32)((1u << valid) - 1), (const uint16_t *)base + idx);
        *lo = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
        *hi = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32((int)0xffff0000u)));
    } else {
        *lo = _mm512_maskz_loadu_ps(first_lanes(valid), (const float *)base + idx);
        *hi = _mm512_maskz_loadu_ps(first_lanes(valid - ZL), (const float *)base + idx + ZL);
    }
}

/* dst[i] = scale * (sum of a[i]'s lanes), i < 8: halve the lanes while pairing up vectors
 * (128-bit blocks, then floats), so 8 vectors need 7 adds instead of 8 full reductions. */
static inline AVX512 ALWAYS_INLINE void reduce_scores_avx512(const __m512 *a, float scale, float *dst) {
    __m512 m[4], n[2];
    UNROLL for (int i = 0; i < 4; i++)  /* m[i]: keys 2i, 2i + 1, 8 partial sums each */
        m[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    UNROLL for (int i = 0; i < 2; i++)  /* n[i]: keys 4i .. 4i + 3, one per 128-bit block, 4 partials */
        n[i] = _mm512_add_ps(_mm512_shuffle_f32x4(m[2 * i], m[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(m[2 * i], m[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    /* block b: keys b, b, b + 4, b + 4 (2 partials each), then summed pairwise */
    __m512 r = _mm512_add_ps(_mm512_shuffle_ps(n[0], n[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_ps(n[0], n[1], _MM_SHUFFLE(3, 1, 3, 1)));
    r = _mm512_add_ps(r, _mm512_permute_ps(r, _MM_SHUFFLE(2, 3, 0, 1)));
    r = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0), r);
    _mm256_storeu_ps(dst, _mm256_mul_ps(_mm512_castps512_ps256(r), _mm256_set1_ps(scale)));
}

static inline AVX512 ALWAYS_INLINE void store_chunk_avx512(const float *src, int bf16, float scale, float *dst,
                                                           int64_t valid) {
    __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(src), _mm512_set1_ps(scale));
    __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(src + ZL), _mm512_set1_ps(scale));
    if (bf16) {
        __m512 a = lo;
        lo = _mm512_permutex2var_ps(a, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), hi);
        hi = _mm512_permutex2var_ps(a, _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31),
                                    hi);
    }
    _mm512_mask_storeu_ps(dst, first_lanes(valid), lo);
    _mm512_mask_storeu_ps(dst + ZL, first_lanes(valid - ZL), hi);
}

static inline AVX512 ALWAYS_INLINE void permute_q_avx512(const float *q, int64_t valid, int bf16, float *dst) {
    __m512 x = _mm512_maskz_loadu_ps(first_lanes(valid), q), y = _mm512_maskz_loadu_ps(first_lanes(valid - ZL), q + ZL);
    if (bf16) {
        __m512 even = _mm512_permutex2var_ps(
            x, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), y);
        y = _mm512_permutex2var_ps(x, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), y);
        x = even;
    }
    _mm512_storeu_ps(dst, x);
    _mm512_storeu_ps(dst + ZL, y);
}

#define ISA avx512
#define VTARGET AVX512
#define V __m512
#define VL ZL
#define QK_KEYS 8
#define vzero _mm512_setzero_ps
#define vfma _mm512_fmadd_ps
#define vloadu _mm512_loadu_ps
#define vstoreu _mm512_storeu_ps
#define vbcast(p_) _mm512_set1_ps(*(p_))
#define load_chunk load_chunk_avx512
#define load_tail load_tail_avx512
#define reduce_scores reduce_scores_avx512
#define store_chunk store_chunk_avx512
#define permute_q permute_q_avx512
#include "paged_attention_impl.h"

typedef void (*attend_fn)(const float *, int64_t, int64_t, int64_t, const void *, const int64_t *, int64_t,
                          const int64_t *, int64_t, float, float, float *, float *, float *, float *);

/* rows[j] = element offset of the slot of key start + j of a sequence (block table row
 * table), j < n, then padded with repeats of the last one; -1 for a block id out of range. */
static int fill_rows(const int64_t *table, int64_t start, int64_t n, int64_t block_size, int64_t num_blocks,
                     int64_t slot_elems, int64_t *rows) {
    /* block by block: a division per key cost as much as a tenth of the attention */
    for (int64_t j = 0, pos = start; j < n;) {
        const int64_t block = table[pos / block_size];
        if (block < 0 || block >= num_blocks) return -1;
        for (int64_t slot = pos % block_size; slot < block_size && j < n; slot++, j++, pos++)
            rows[j] = (block * block_size + slot) * slot_elems;
    }
    for (int64_t j = n; j < (n + KEY_PAD - 1) / KEY_PAD * KEY_PAD + PREFETCH_KEYS; j++) rows[j] = rows[n - 1];
    return 0;
}

int paged_decode_attention(const float *q, int64_t q_stride, const void *kv_cache, int kv_dtype,
                           int64_t num_blocks, int64_t block_size, const int64_t *block_table,
                           int64_t max_blocks, const int64_t *seq_lens, int64_t num_seqs,
                           int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t window,
                           float scale, float softcap, int allow_avx512, float *out) {
    if (!cpu_kernels_supported() || (kv_dtype != PAGED_ATTN_F32 && kv_dtype != PAGED_ATTN_BF16)
        || num_seqs < 0 || num_kv_heads <= 0 || num_heads % num_kv_heads || head_dim <= 0
        || head_dim % LANES || head_dim > PAGED_ATTN_MAX_HEAD_DIM || block_size <= 0 || max_blocks <= 0
        || q_stride < num_heads * head_dim || !(softcap >= 0.0f))
        return -1;
    int64_t longest = 1;
    for (int64_t s = 0; s < num_seqs; s++) {
        if (seq_lens[s] < 1 || seq_lens[s] > max_blocks * block_size) return -1;
        longest = seq_lens[s] > longest ? seq_lens[s] : longest;
    }
    if (num_seqs == 0) return 0;
    const int bf16 = kv_dtype == PAGED_ATTN_BF16, wide = allow_avx512 && cpu_avx512_supported();
    const attend_fn run = wide ? (bf16 ? attend_seq_bf16_avx512 : attend_seq_f32_avx512)
                               : (bf16 ? attend_seq_bf16_avx2 : attend_seq_f32_avx2);
    const int64_t slot_elems = 2 * num_kv_heads * head_dim, padded = (longest + KEY_PAD - 1) / KEY_PAD * KEY_PAD;
    const int64_t dp = (head_dim + 2 * ZL - 1) / (2 * ZL) * (2 * ZL); /* covers both variants' chunking */
    /* two row tables: this sequence's and the next one's, which its last pass prefetches */
    int64_t *rows = malloc((size_t)(2 * (padded + PREFETCH_KEYS)) * sizeof *rows);
    float *scratch = malloc((size_t)(num_heads * dp + MAX_GROUP_BLOCK * (padded + dp)) * sizeof *scratch);
    int rc = rows && scratch ? 0 : -2;
    int64_t *cur = rows, *next = rows + padded + PREFETCH_KEYS, n = 0, next_n = 0;
    for (int64_t s = -1; s < num_seqs && rc == 0; s++) {
        if (s + 1 < num_seqs) {
            const int64_t len = seq_lens[s + 1], start = window > 0 && len > window ? len - window : 0;
            next_n = len - start;
            rc = fill_rows(block_table + (s + 1) * max_blocks, start, next_n, block_size, num_blocks, slot_elems,
                           next);
        } else {
            next_n = 0;
        }
        if (rc == 0 && s >= 0)
            run(q + s * q_stride, num_heads, num_kv_heads, head_dim, kv_cache, cur, n, next, next_n, scale, softcap,
                scratch,
                scratch + num_heads * dp, scratch + num_heads * dp + MAX_GROUP_BLOCK * padded,
                out + s * num_heads * head_dim);
        int64_t *t = cur;
        cur = next;
        next = t;
        n = next_n;
    }
    free(rows);
    free(scratch);
    return rc;
}
#else
int paged_decode_attention(const float *q, int64_t q_stride, const void *kv_cache, int kv_dtype,
                           int64_t num_blocks, int64_t block_size, const int64_t *block_table,
                           int64_t max_blocks, const int64_t *seq_lens, int64_t num_seqs,
                           int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t window,
                           float scale, float softcap, int allow_avx512, float *out) {
    (void)q; (void)q_stride; (void)kv_cache; (void)kv_dtype; (void)num_blocks; (void)block_size;
    (void)block_table; (void)max_blocks; (void)seq_lens; (void)num_seqs; (void)num_heads;
    (void)num_kv_heads; (void)head_dim; (void)window; (void)scale; (void)softcap; (void)allow_avx512; (void)out;
    return -1;
}
#endif
