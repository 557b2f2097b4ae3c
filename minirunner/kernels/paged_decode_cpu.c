/* Paged decode attention on a CPU in float32: one query token per sequence, each sequence's keys read
 * through its block table and only up to its length (paged_decode_cpu.py builds and calls it; its torch
 * twin is paged_attention_ref.paged_decode_ref).
 *
 * kv [num_blocks, 2, block_size, num_kv_heads, head_dim] (K then V in each block), q and out
 * [num_seqs, num_q_heads, head_dim], block_tables int32 [num_seqs, >= table_stride] (row stride
 * table_stride, table_width columns), seq_lens int32 [num_seqs]: keys of sequence s are its first
 * seq_lens[s] tokens, never more than its table's columns hold; a row of length 0 (padding) gets
 * zeros. Query head hq reads kv head hq / (num_q_heads / num_kv_heads). The softmax runs online over
 * chunks of CHUNK keys (running max, rescaled sum and output), so no score buffer grows with the
 * sequence. Before reading anything, every block id a sequence reads is checked against num_blocks (the
 * cache's first dimension): a bad one is reported in bad[0..2] (sequence, column, id) and nothing is
 * computed, so a bookkeeping bug raises in Python instead of reading outside the cache. */
#include <math.h>
#include <stdint.h>

#define CHUNK 64

/* The kernel for any head_dim; inlined below with head_dim a constant for the common sizes, so the
 * compiler unrolls the head_dim loops and keeps the output row in registers. */
/* The keys sequence s reads: its length, clamped to [0, the columns its table was given]. */
static inline int64_t keys_read(const int32_t *seq_lens, int64_t s, int64_t block_size, int64_t table_width) {
    const int64_t len = seq_lens[s];
    return len < 0 ? 0 : (len > table_width * block_size ? table_width * block_size : len);
}

static inline __attribute__((always_inline)) void
attend(const float *q, const float *kv, const int32_t *block_tables, const int32_t *seq_lens, float *out,
       int64_t num_seqs, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
       int64_t table_stride, int64_t table_width, float scale) {
    const int64_t group = num_q_heads / num_kv_heads;
    const int64_t row = num_kv_heads * head_dim; /* one token's K (or V) in a block */
    const int64_t block = 2 * block_size * row;  /* one block: its K rows, then its V rows */
    float scores[CHUNK];
    float acc[head_dim];
    for (int64_t s = 0; s < num_seqs; s++) {
        const int64_t len = keys_read(seq_lens, s, block_size, table_width);
        const int32_t *table = block_tables + s * table_stride;
        for (int64_t hq = 0; hq < num_q_heads; hq++) {
            const int64_t h = hq / group;
            const float *qv = q + (s * num_q_heads + hq) * head_dim;
            float m = -INFINITY, l = 0.0f;
            for (int64_t d = 0; d < head_dim; d++) acc[d] = 0.0f;
            for (int64_t t0 = 0; t0 < len; t0 += CHUNK) {
                const int64_t n = len - t0 < CHUNK ? len - t0 : CHUNK;
                float chunk_max = -INFINITY;
                for (int64_t i = 0; i < n; i++) {
                    const int64_t t = t0 + i;
                    const float *k = kv + table[t / block_size] * block + (t % block_size) * row + h * head_dim;
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int64_t d = 0; d < head_dim; d++) dot += qv[d] * k[d];
                    scores[i] = dot * scale;
                    chunk_max = scores[i] > chunk_max ? scores[i] : chunk_max;
                }
                const float m_new = chunk_max > m ? chunk_max : m;
                const float rescale = expf(m - m_new); /* 0 on the first chunk (m = -inf) */
                l *= rescale;
                for (int64_t d = 0; d < head_dim; d++) acc[d] *= rescale;
                for (int64_t i = 0; i < n; i++) {
                    const int64_t t = t0 + i;
                    const float *v = kv + table[t / block_size] * block + (block_size + t % block_size) * row
                                     + h * head_dim;
                    const float p = expf(scores[i] - m_new);
                    l += p;
#pragma omp simd
                    for (int64_t d = 0; d < head_dim; d++) acc[d] += p * v[d];
                }
                m = m_new;
            }
            float *o = out + (s * num_q_heads + hq) * head_dim;
            const float inv = len > 0 ? 1.0f / l : 0.0f;
            for (int64_t d = 0; d < head_dim; d++) o[d] = acc[d] * inv;
        }
    }
}

/* 0, or 1 with bad = (sequence, column, block id) of the first block id outside [0, num_blocks). */
int64_t paged_decode_f32(const float *q, const float *kv, const int32_t *block_tables, const int32_t *seq_lens,
                         float *out, int64_t num_seqs, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                         int64_t block_size, int64_t table_stride, int64_t table_width, float scale,
                         int64_t num_blocks, int64_t *bad) {
    for (int64_t s = 0; s < num_seqs; s++) {
        const int64_t columns = (keys_read(seq_lens, s, block_size, table_width) + block_size - 1) / block_size;
        const int32_t *table = block_tables + s * table_stride;
        for (int64_t c = 0; c < columns; c++) {
            if (table[c] < 0 || table[c] >= num_blocks) {
                bad[0] = s;
                bad[1] = c;
                bad[2] = table[c];
                return 1;
            }
        }
    }
#define ATTEND(D) attend(q, kv, block_tables, seq_lens, out, num_seqs, num_q_heads, num_kv_heads, D, block_size, \
                         table_stride, table_width, scale)
    if (head_dim == 64)
        ATTEND(64);
    else if (head_dim == 128)
        ATTEND(128);
    else
        ATTEND(head_dim);
#undef ATTEND
    return 0;
}
