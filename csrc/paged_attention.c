/* See paged_attention.h. The AVX2 functions carry their own target attribute; the entry
 * point refuses every call on a CPU without AVX2/FMA (cpu_kernels_supported). */
#include "paged_attention.h"

#include <stdlib.h>

#include "cpu_features.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "avx2_math.h"

static inline AVX2 __m256 load_kv(const void *base, int64_t idx, int bf16) {
    return bf16 ? load_bf16x8((const uint16_t *)base + idx) : _mm256_loadu_ps((const float *)base + idx);
}

/* In place: s[0..n) = softmax(s); returns nothing, n >= 1. */
static AVX2 void softmax(float *s, int64_t n) {
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
    __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (i = 0; i + LANES <= n; i += LANES) _mm256_storeu_ps(s + i, _mm256_mul_ps(_mm256_loadu_ps(s + i), inv));
    for (; i < n; i++) s[i] *= 1.0f / sum;
}

/* out[c .. c + 8W) = sum_j p[j] * V_j[c .. c + 8W), V_j at element rows[j] + v_off, for W
 * (a constant at each call site, so the accumulators stay in registers) vectors. */
static inline AVX2 __attribute__((always_inline)) void weighted_sum(
    const void *cache, int bf16, const int64_t *rows, int64_t v_off, int64_t n, const float *p, int64_t c,
    const int W, float *out) {
    __m256 acc[8];
    UNROLL for (int w = 0; w < W; w++) acc[w] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j++) {
        __m256 pj = _mm256_set1_ps(p[j]);
        UNROLL for (int w = 0; w < W; w++)
            acc[w] = _mm256_fmadd_ps(pj, load_kv(cache, rows[j] + v_off + c + w * LANES, bf16), acc[w]);
    }
    UNROLL for (int w = 0; w < W; w++) _mm256_storeu_ps(out + c + w * LANES, acc[w]);
}

/* One sequence and one KV head: `group` query heads (q, contiguous, group * D floats),
 * key j's K at element rows[j] + k_off and its V at rows[j] + v_off, for j < n. */
static inline AVX2 __attribute__((always_inline)) void attend(
    const float *q, int64_t group, int64_t d, const void *cache, const int bf16, const int64_t *rows, int64_t n,
    int64_t k_off, int64_t v_off, float scale, float *scores, float *out) {
    for (int64_t j = 0; j < n; j++) {
        const int64_t k = rows[j] + k_off;
        for (int64_t h = 0; h < group; h++) {
            const float *qh = q + h * d;
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            int64_t c = 0;
            for (; c + 2 * LANES <= d; c += 2 * LANES) {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + c), load_kv(cache, k + c, bf16), a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + c + LANES), load_kv(cache, k + c + LANES, bf16), a1);
            }
            if (c < d) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + c), load_kv(cache, k + c, bf16), a0);
            scores[h * n + j] = hsum(_mm256_add_ps(a0, a1)) * scale;
        }
    }
    for (int64_t h = 0; h < group; h++) {
        float *p = scores + h * n, *o = out + h * d;
        softmax(p, n);
        int64_t c = 0;
        for (; c + 8 * LANES <= d; c += 8 * LANES) weighted_sum(cache, bf16, rows, v_off, n, p, c, 8, o);
        for (; c < d; c += LANES) weighted_sum(cache, bf16, rows, v_off, n, p, c, 1, o);
    }
}

/* The two cache dtypes as separate functions, so the dtype test leaves the inner loops. */
static AVX2 void attend_f32(const float *q, int64_t group, int64_t d, const void *cache, const int64_t *rows,
                            int64_t n, int64_t k_off, int64_t v_off, float scale, float *scores, float *out) {
    attend(q, group, d, cache, 0, rows, n, k_off, v_off, scale, scores, out);
}

static AVX2 void attend_bf16(const float *q, int64_t group, int64_t d, const void *cache, const int64_t *rows,
                             int64_t n, int64_t k_off, int64_t v_off, float scale, float *scores, float *out) {
    attend(q, group, d, cache, 1, rows, n, k_off, v_off, scale, scores, out);
}

int paged_decode_attention(const float *q, int64_t q_stride, const void *kv_cache, int kv_dtype,
                           int64_t num_blocks, int64_t block_size, const int64_t *block_table,
                           int64_t max_blocks, const int64_t *seq_lens, int64_t num_seqs,
                           int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t window,
                           float scale, float *out) {
    if (!cpu_kernels_supported() || (kv_dtype != PAGED_ATTN_F32 && kv_dtype != PAGED_ATTN_BF16)
        || num_seqs < 0 || num_kv_heads <= 0 || num_heads % num_kv_heads || head_dim <= 0
        || head_dim % LANES || head_dim > PAGED_ATTN_MAX_HEAD_DIM || block_size <= 0 || max_blocks <= 0
        || q_stride < num_heads * head_dim)
        return -1;
    int64_t longest = 0;
    for (int64_t s = 0; s < num_seqs; s++) {
        if (seq_lens[s] < 1 || seq_lens[s] > max_blocks * block_size) return -1;
        longest = seq_lens[s] > longest ? seq_lens[s] : longest;
    }
    const int64_t group = num_heads / num_kv_heads, slot_elems = 2 * num_kv_heads * head_dim;
    void (*const run)(const float *, int64_t, int64_t, const void *, const int64_t *, int64_t, int64_t, int64_t,
                      float, float *, float *) = kv_dtype == PAGED_ATTN_BF16 ? attend_bf16 : attend_f32;
    int64_t *rows = malloc((size_t)(longest ? longest : 1) * sizeof *rows);
    float *scores = malloc((size_t)(longest ? longest : 1) * (size_t)group * sizeof *scores);
    int rc = rows && scores ? 0 : -2;
    for (int64_t s = 0; s < num_seqs && rc == 0; s++) {
        const int64_t len = seq_lens[s];
        const int64_t start = window > 0 && len > window ? len - window : 0, n = len - start;
        const int64_t *table = block_table + s * max_blocks;
        for (int64_t j = 0; j < n; j++) {
            const int64_t pos = start + j, block = table[pos / block_size];
            if (block < 0 || block >= num_blocks) {
                rc = -1;
                break;
            }
            rows[j] = (block * block_size + pos % block_size) * slot_elems;
        }
        for (int64_t g = 0; g < num_kv_heads && rc == 0; g++)
            run(q + s * q_stride + g * group * head_dim, group, head_dim, kv_cache, rows, n,
                   g * head_dim, (num_kv_heads + g) * head_dim, scale, scores,
                   out + s * num_heads * head_dim + g * group * head_dim);
    }
    free(rows);
    free(scores);
    return rc;
}
#else
int paged_decode_attention(const float *q, int64_t q_stride, const void *kv_cache, int kv_dtype,
                           int64_t num_blocks, int64_t block_size, const int64_t *block_table,
                           int64_t max_blocks, const int64_t *seq_lens, int64_t num_seqs,
                           int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t window,
                           float scale, float *out) {
    (void)q; (void)q_stride; (void)kv_cache; (void)kv_dtype; (void)num_blocks; (void)block_size;
    (void)block_table; (void)max_blocks; (void)seq_lens; (void)num_seqs; (void)num_heads;
    (void)num_kv_heads; (void)head_dim; (void)window; (void)scale; (void)out;
    return -1;
}
#endif
