/* The decode-attention kernel body, written once and included by paged_attention.c once per
 * instruction set (AVX2, AVX-512), after it defines the vector vocabulary below. Keeping one
 * body means the two paths can only differ in vector width and register blocking, and the
 * tests that force the AVX2 path on an AVX-512 CPU check the same algorithm twice.
 *
 * Expected definitions: ISA (a name suffix), VTARGET (target attribute), V (vector type), VL
 * (floats per vector), QK_KEYS (keys per score block), vzero/vfma/vloadu/vbcast, and
 * load_chunk/load_tail/reduce_scores/store_chunk/permute_q (see paged_attention.c).
 *
 * Why it is shaped this way (head_dim 64, 3 query heads per KV head on the default model):
 * - K and V are read in chunks of CH = 2 * VL elements. A bf16 chunk becomes two float vectors
 *   with one shift and one AND (its even and its odd elements) instead of a widening shuffle
 *   per vector; the query is stored in the same even/odd order once per sequence, and the
 *   output is put back in order once per head, so the order never costs in the key loops.
 * - Scores: each K chunk is loaded once for up to 3 query heads, and QK_KEYS keys are summed
 *   in separate accumulators whose horizontal sums are done together (one reduction per
 *   QK_KEYS scores instead of one per score, which dominated the first version).
 * - Weighted sum: each V chunk is loaded once for up to 3 query heads; a pass covers 2 chunks
 *   so the 3 x 4 accumulators stay in registers even with AVX2's 16.
 */
#define PA_CAT2(a, b) a##_##b
#define PA_CAT(a, b) PA_CAT2(a, b)
#define FN(name) PA_CAT(name, ISA)
#define CH (2 * VL)
#define PA_INLINE static inline VTARGET __attribute__((always_inline))

/* scores[h * stride + i] = scale * q_h . K_i for QK_KEYS keys (K_i at rows[i] + k_off) and HB
 * query heads (qp + h * dp, in chunk order, zero past d). */
PA_INLINE void FN(score_block)(const float *qp, int64_t dp, int64_t d, const void *cache, const int bf16,
                               const int64_t *rows, int64_t k_off, int64_t v_off, float scale, const int HB,
                               float *scores, int64_t stride) {
    V acc[MAX_GROUP_BLOCK][QK_KEYS];
    UNROLL for (int h = 0; h < HB; h++) UNROLL for (int i = 0; i < QK_KEYS; i++) acc[h][i] = vzero();
    UNROLL for (int i = 0; i < QK_KEYS; i++) {
        prefetch_span(cache, rows[i + PREFETCH_KEYS] + k_off, bf16, d, 0);
        prefetch_span(cache, rows[i] + v_off, bf16, d, 1);
    }
    int64_t c = 0;
    for (; c + CH <= d; c += CH) {
        UNROLL for (int i = 0; i < QK_KEYS; i++) {
            V lo, hi;
            load_chunk(cache, rows[i] + k_off + c, bf16, &lo, &hi);
            UNROLL for (int h = 0; h < HB; h++) {
                acc[h][i] = vfma(vloadu(qp + h * dp + c), lo, acc[h][i]);
                acc[h][i] = vfma(vloadu(qp + h * dp + c + VL), hi, acc[h][i]);
            }
        }
    }
    if (c < d) {
        UNROLL for (int i = 0; i < QK_KEYS; i++) {
            V lo, hi;
            load_tail(cache, rows[i] + k_off + c, bf16, (int)(d - c), &lo, &hi);
            UNROLL for (int h = 0; h < HB; h++) {
                acc[h][i] = vfma(vloadu(qp + h * dp + c), lo, acc[h][i]);
                acc[h][i] = vfma(vloadu(qp + h * dp + c + VL), hi, acc[h][i]);
            }
        }
    }
    UNROLL for (int h = 0; h < HB; h++) reduce_scores(acc[h], scale, scores + h * stride);
}

/* o[h * dp + c0 .. + NC * CH) = sum_j p[h * stride + j] * V_j[c0 ..), in chunk order, for HB
 * heads and NC (1 or 2) chunks, V_j at rows[j] + v_off; with TAIL the last chunk ends at d
 * (a constant, so the key loop carries no test for it). */
PA_INLINE void FN(value_pass)(const float *p, int64_t stride, const void *cache, const int bf16, const int64_t *rows,
                              int64_t n, int64_t v_off, const int64_t *pf_rows, int64_t pf_n, int64_t pf_off,
                              int64_t c0, int64_t d, const int HB, const int NC, const int TAIL, float *o,
                              int64_t dp) {
    V acc[MAX_GROUP_BLOCK][4];
    UNROLL for (int h = 0; h < HB; h++) UNROLL for (int w = 0; w < 2 * NC; w++) acc[h][w] = vzero();
    for (int64_t j = 0; j < n; j++) {
        prefetch_span(cache, rows[j + PREFETCH_KEYS] + v_off + c0, bf16, NC * CH, 0);
        if (j < pf_n) prefetch_span(cache, pf_rows[j] + pf_off + c0, bf16, NC * CH, 1);
        UNROLL for (int ci = 0; ci < NC; ci++) {
            const int64_t c = c0 + ci * CH;
            V lo, hi;
            if (TAIL && ci == NC - 1)
                load_tail(cache, rows[j] + v_off + c, bf16, (int)(d - c), &lo, &hi);
            else
                load_chunk(cache, rows[j] + v_off + c, bf16, &lo, &hi);
            UNROLL for (int h = 0; h < HB; h++) {
                V pj = vbcast(p + h * stride + j);
                acc[h][2 * ci] = vfma(pj, lo, acc[h][2 * ci]);
                acc[h][2 * ci + 1] = vfma(pj, hi, acc[h][2 * ci + 1]);
            }
        }
    }
    UNROLL for (int h = 0; h < HB; h++) UNROLL for (int ci = 0; ci < NC; ci++) {
        float *dst = o + h * dp + c0 + ci * CH;
        vstoreu(dst, acc[h][2 * ci]);
        vstoreu(dst + VL, acc[h][2 * ci + 1]);
    }
}

/* HB (<= 3) query heads of one KV head: their scores over the n keys (rows padded with
 * repeats to a multiple of QK_KEYS), softmax, and the weighted sum of V, into out (in order).
 * The softmax's division by the sum is applied to the d outputs rather than the n weights. */
PA_INLINE void FN(attend_heads)(const float *qp, int64_t dp, int64_t d, const void *cache, const int bf16,
                                const int64_t *rows, int64_t n, int64_t k_off, int64_t v_off,
                                const int64_t *pf_rows, int64_t pf_n, int64_t pf_off, float scale, float softcap,
                                const int HB, float *scores, float *obuf, float *out) {
    const int64_t stride = (n + QK_KEYS - 1) / QK_KEYS * QK_KEYS;
    for (int64_t j = 0; j < n; j += QK_KEYS)
        FN(score_block)(qp, dp, d, cache, bf16, rows + j, k_off, v_off, scale, HB, scores + j, stride);
    float inv_sum[MAX_GROUP_BLOCK];
    if (softcap > 0.0f)
        for (int h = 0; h < HB; h++) softcap_scores(scores + h * stride, n, softcap);
    for (int h = 0; h < HB; h++) inv_sum[h] = exp_scores(scores + h * stride, n);
    int64_t c = 0;
    for (; c + 2 * CH <= d; c += 2 * CH)
        FN(value_pass)(scores, stride, cache, bf16, rows, n, v_off, pf_rows, pf_n, pf_off, c, d, HB, 2, 0, obuf, dp);
    if (dp - c == 2 * CH)
        FN(value_pass)(scores, stride, cache, bf16, rows, n, v_off, pf_rows, pf_n, pf_off, c, d, HB, 2, 1, obuf, dp);
    else if (c < dp && c + CH <= d)
        FN(value_pass)(scores, stride, cache, bf16, rows, n, v_off, pf_rows, pf_n, pf_off, c, d, HB, 1, 0, obuf, dp);
    else if (c < dp)
        FN(value_pass)(scores, stride, cache, bf16, rows, n, v_off, pf_rows, pf_n, pf_off, c, d, HB, 1, 1, obuf, dp);
    for (int h = 0; h < HB; h++)
        for (c = 0; c < dp; c += CH) store_chunk(obuf + h * dp + c, bf16, inv_sum[h], out + h * d + c, d - c);
}

/* One sequence, all heads: q (num_heads * d floats, in order) -> out. Scratch: qp (num_heads * dp),
 * scores (3 * n rounded up to QK_KEYS), obuf (3 * dp). next_rows/next_n: the next sequence's
 * keys, whose first K rows the last value passes prefetch (next_n 0: none). */
PA_INLINE void FN(attend_seq)(const float *q, int64_t num_heads, int64_t num_kv_heads, int64_t d,
                              const void *cache, const int bf16, const int64_t *rows, int64_t n,
                              const int64_t *next_rows, int64_t next_n, float scale, float softcap, float *qp,
                              float *scores,
                              float *obuf, float *out) {
    const int64_t group = num_heads / num_kv_heads, dp = (d + CH - 1) / CH * CH;
    for (int64_t h = 0; h < num_heads; h++)
        for (int64_t c = 0; c < dp; c += CH) permute_q(q + h * d + c, d - c, bf16, qp + h * dp + c);
    for (int64_t g = 0; g < num_kv_heads; g++) {
        const int64_t k_off = g * d, v_off = (num_kv_heads + g) * d;
        const int last = g + 1 == num_kv_heads;
        const int64_t *pf_rows = last ? next_rows : rows, pf_n = last ? next_n : n, pf_off = last ? 0 : k_off + d;
        for (int64_t h0 = 0; h0 < group; h0 += MAX_GROUP_BLOCK) {
            const int64_t h = g * group + h0, left = group - h0;
            const float *qh = qp + h * dp;
            if (left >= 3)
                FN(attend_heads)(qh, dp, d, cache, bf16, rows, n, k_off, v_off, pf_rows, pf_n, pf_off, scale,
                                 softcap, 3,
                                 scores, obuf, out + h * d);
            else if (left == 2)
                FN(attend_heads)(qh, dp, d, cache, bf16, rows, n, k_off, v_off, pf_rows, pf_n, pf_off, scale,
                                 softcap, 2,
                                 scores, obuf, out + h * d);
            else
                FN(attend_heads)(qh, dp, d, cache, bf16, rows, n, k_off, v_off, pf_rows, pf_n, pf_off, scale,
                                 softcap, 1,
                                 scores, obuf, out + h * d);
        }
    }
}

/* The two cache dtypes as separate functions, so the dtype test leaves the inner loops. */
static VTARGET void FN(attend_seq_f32)(const float *q, int64_t num_heads, int64_t num_kv_heads, int64_t d,
                                       const void *cache, const int64_t *rows, int64_t n, const int64_t *next_rows,
                                       int64_t next_n, float scale, float softcap, float *qp, float *scores,
                                       float *obuf, float *out) {
    FN(attend_seq)(q, num_heads, num_kv_heads, d, cache, 0, rows, n, next_rows, next_n, scale, softcap, qp, scores,
                   obuf, out);
}

static VTARGET void FN(attend_seq_bf16)(const float *q, int64_t num_heads, int64_t num_kv_heads, int64_t d,
                                        const void *cache, const int64_t *rows, int64_t n, const int64_t *next_rows,
                                        int64_t next_n, float scale, float softcap, float *qp, float *scores,
                                        float *obuf, float *out) {
    FN(attend_seq)(q, num_heads, num_kv_heads, d, cache, 1, rows, n, next_rows, next_n, scale, softcap, qp, scores,
                   obuf, out);
}

#undef PA_INLINE
#undef CH
#undef FN
#undef PA_CAT
#undef PA_CAT2
