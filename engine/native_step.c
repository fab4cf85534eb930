/* The model's pass in one call, in C: decode steps (the soup pot) and prompts (the wok).
 *
 * Why: a batch-1 decode step of a small model is ~150 small operations between a few weight
 * streams. Run one torch op at a time, each pays Python and dispatch (a few microseconds), which
 * on the chef is most of the step; torch's fp32 GEMV streams the weights at well under what one
 * core can read, and its GEMM at many rows reaches about 70% of a kernel shaped for these
 * matrices. Here a pass is one call: every layer's norm, projections, RoPE, K/V write, attention
 * and MLP, then the LM head for the rows that sample, over buffers made once. engine/native.py
 * builds this file with the machine's C compiler (-O3 -march=native), loads it with ctypes and
 * hands it pointers to the model's own weights and KV seats; nothing is copied.
 *
 * The math is the model's (engine/model.py, engine/attention.py, engine/layers.py), row for row:
 * tests/test_native.py holds it to the eager forward and to transformers.
 *
 * Layouts (as the model keeps them):
 *   float32 weight    (in, out) row-major, used as y = x @ W          -> gemm_kmajor
 *   int8 weight       q (out, in) row-major, scale (out,) float32     -> gemm_int8
 *   KV seats, a layer (S, Hkv, T, D); row b sits in seat seat[b] and writes slot pos[b]
 *   RoPE tables       cos, sin (ctx, D), sin's first half negated (rotate_half folded in)
 *
 * Every output element of a product is summed over k in the same order whatever the batch, so a
 * decode row's logits are the same bits alone or beside other rows.
 *
 * Included pieces: native_products.h (the products), native_crew.h (the threads),
 * native_attention.h (attention).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512VNNI__)
#include <immintrin.h> /* the int8 products' VNNI dot */
#endif

#ifndef QTILE /* prompt rows whose attention shares one pass over the keys */
#define QTILE 32
#endif

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));
static inline v16 ld(const float *p) { return *(const v16u *)p; }
static inline void st(float *p, v16 v) { *(v16u *)p = v; }
static inline v16 splat(float f) { return (v16){f, f, f, f, f, f, f, f, f, f, f, f, f, f, f, f}; }
static inline float hsum(v16 v) { /* a pairwise tree: four vector adds, not fifteen scalar ones */
    typedef float v8 __attribute__((vector_size(32)));
    typedef float v4 __attribute__((vector_size(16)));
    const v8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    const v4 c = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (c[0] + c[2]) + (c[1] + c[3]);
}

/* expf on 16 lanes for x <= 0 (softmax's exponents): x = n ln2 + r with |r| <= ln2 / 2, e^r from
 * Cephes' degree-6 polynomial, 2^n put in the exponent bits. Within 2 ulp of expf; 0 below -87. */
typedef int32_t v16i __attribute__((vector_size(64)));
static inline v16 pick(v16i mask, v16 a, v16 b) { return (v16)(((v16i)a & mask) | ((v16i)b & ~mask)); }
static inline v16 exp16(v16 x) {
    const v16i low = x < splat(-87.0f); /* all ones where x is below the range */
    x = (v16)(((v16i)x & ~low) | ((v16i)splat(-87.0f) & low));
    const v16 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x / ln2) */
    const v16 r = (x - n * 0.693359375f) + n * 2.12194440e-4f;            /* ln2 in two parts */
    v16 p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f, p = p * r + 8.3334519073e-3f, p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f, p = p * r + 5.0000001201e-1f;
    const v16 e = p * r * r + r + 1.0f;
    const v16i bits = (__builtin_convertvector(n, v16i) + 127) << 23;
    return e * (v16)bits;
}

/* ---- what Python hands over (engine/native.py mirrors these structs with ctypes) ---------- */
typedef struct {
    const void *w;       /* float32 (in, out) or int8 (out, in) */
    const float *scale;  /* int8: (out,) float32; NULL for float32 */
    const int32_t *rowsum; /* int8: (out,) the sum of each row of q */
    const float *bias;   /* (out,) or NULL */
} Linear;

typedef struct {
    const float *norm1_w, *norm1_b, *norm2_w, *norm2_b; /* biases: LayerNorm only */
    Linear qkv, out, up, down;
} Layer;

typedef struct {
    int d, n_layers, n_heads, n_kv_heads, head_dim, ffn, vocab, max_context;
    int layer_norm;   /* 0: RMSNorm, 1: LayerNorm with bias */
    int act;          /* 0: silu, 1: gelu (erf), 2: gelu (tanh) */
    int gated;        /* SwiGLU: the up projection is gate | up */
    int rope;         /* 1: RoPE tables, 0: learned positions (wpe) */
    int int8;         /* the Linear weights are int8 */
    float eps;
    const float *embed;      /* (V, d) or NULL */
    const float *embed_cols; /* tied float32: the LM head (d, V), a token's embedding is a column */
    const float *wpe;        /* (ctx, d) or NULL */
    const float *rope_cos, *rope_sin; /* (ctx, D) */
    const float *final_w, *final_b;
    Linear lm_head;
    const Layer *layers;
} Model;

#include "native_products.h"

#include "native_crew.h"

typedef struct {
    const Model *m;
    const Linear *L;
    int B, K, N;
    const float *x;
    float *y;
    const uint8_t *xu;
    const float *sx;
} LinearJob;

/* Share t of T of one product: a run of 64-column panels (float32) or of 4-row groups (int8). */
static void linear_share(const void *job, int t, int T) {
    const LinearJob *j = job;
    int a, b;
    if (j->m->int8) {
        crew_share((j->N + 3) / 4, t, T, &a, &b);
        const int n1 = 4 * b < j->N ? 4 * b : j->N;
        int8_span(j->B, j->K, 4 * a, n1, j->xu, j->sx, (const int8_t *)j->L->w, j->L->scale, j->L->rowsum, j->y, j->N);
    } else {
        crew_share((j->N + 63) / 64, t, T, &a, &b);
        const int n0 = 64 * a, n1 = 64 * b < j->N ? 64 * b : j->N;
        if (n1 > n0) gemm_kmajor(j->B, j->K, n1 - n0, j->x, j->K, (const float *)j->L->w + n0, j->N, j->y + n0, j->N);
    }
}

/* y (B, N) = x (B, K) @ W (+ bias), on T threads (native_crew.h) */
static void linear(const Model *m, const Linear *L, int B, int K, int N, const float *x, float *y, uint8_t *xu,
                   float *sx, int T) {
    if (m->int8) quantize_rows(B, K, x, xu, sx); /* once, before the rows are shared */
    const LinearJob job = {m, L, B, K, N, x, y, xu, sx};
    crew_run(T, linear_share, &job);
    if (L->bias)
        for (int b = 0; b < B; b++)
            for (int n = 0; n < N; n++) y[(size_t)b * N + n] += L->bias[n];
}

/* ---- the small operations ------------------------------------------------------------------ */
static void norm(const Model *m, int B, const float *x, const float *w, const float *bias, float *y) {
    const int d = m->d;
    for (int b = 0; b < B; b++) {
        const float *xb = x + (size_t)b * d;
        float *yb = y + (size_t)b * d;
        if (m->layer_norm) { /* F.layer_norm: biased variance */
            float mean = 0.0f, var = 0.0f;
            for (int i = 0; i < d; i++) mean += xb[i];
            mean /= d;
            for (int i = 0; i < d; i++) var += (xb[i] - mean) * (xb[i] - mean);
            const float inv = 1.0f / sqrtf(var / d + m->eps);
            for (int i = 0; i < d; i++) yb[i] = (xb[i] - mean) * inv * w[i] + bias[i];
        } else { /* x * rsqrt(mean(x^2) + eps) * w */
            float ss = 0.0f;
            for (int i = 0; i < d; i++) ss += xb[i] * xb[i];
            const float inv = 1.0f / sqrtf(ss / d + m->eps);
            for (int i = 0; i < d; i++) yb[i] = xb[i] * inv * w[i];
        }
    }
}

static float activate(int act, float v) {
    if (act == 0) return v / (1.0f + expf(-v));
    if (act == 1) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    const float c = 0.79788456080286536f; /* sqrt(2 / pi) */
    return 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
}

/* SiLU (act 0) or tanh-GELU (act 2) on 16 lanes, both through e^-|y| (exp16's range):
 *   sigmoid(v) = 1 / (1 + t) for v >= 0, t / (1 + t) for v < 0, with t = e^-|v|
 *   tanh(y)    = sign(y) (1 - t) / (1 + t),                     with t = e^-2|y| */
static inline v16 activate16(int act, v16 v) {
    if (act == 0) {
        const v16i neg = v < splat(0.0f);
        const v16 a = (v16)((v16i)v & ~(v16i)splat(-0.0f)), t = exp16(-a);
        const v16 num = (v16)(((v16i)t & neg) | ((v16i)splat(1.0f) & ~neg));
        return v * (num / (1.0f + t));
    }
    const v16 y = 0.79788456080286536f * (v + 0.044715f * v * v * v); /* sqrt(2 / pi) (v + 0.044715 v^3) */
    const v16i yneg = y < splat(0.0f);
    const v16 a = (v16)((v16i)y & ~(v16i)splat(-0.0f)), t = exp16(-2.0f * a);
    v16 th = (1.0f - t) / (1.0f + t);
    th = (v16)((v16i)th ^ (yneg & (v16i)splat(-0.0f)));
    return 0.5f * v * (1.0f + th);
}

/* Rotate each (i, i + D/2) pair of one head: x cos + swap_halves(x) sin, sin's sign folded in. */
static void rope_head(float *h, const float *cos, const float *sin, int D) {
    const int half = D / 2;
    for (int i = 0; i < half; i++) {
        const float a = h[i], b = h[i + half];
        h[i] = a * cos[i] + b * sin[i];
        h[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

#include "native_attention.h"

/* Floats of scratch a group of B rows needs (engine/native.py allocates it). */
long twopot_scratch_floats(const Model *m, int B, int seat_len) {
    const long qkv = (long)(m->n_heads + 2 * m->n_kv_heads) * m->head_dim;
    const long up = (m->gated ? 2L : 1L) * m->ffn;
    const long G = m->n_heads / m->n_kv_heads;
    long widest = m->d > m->ffn ? m->d : m->ffn;
    widest = widest > (long)m->n_heads * m->head_dim ? widest : (long)m->n_heads * m->head_dim;
    return B * (2L * m->d + qkv + (long)m->n_heads * m->head_dim + up + m->ffn) + QTILE * G * seat_len +
           16L * m->head_dim + B + (B * widest + 3) / 4;
}

/* One group of at most `cap` rows through every layer: row b feeds token tok[b] at position pos[b]
 * of the sequence in seat seat[b]. Each row writes its K/V into slot pos[b] before it attends to
 * slots 0..pos[b], so rows of one seat in ascending positions -- a prompt chunk -- see each other
 * causally, exactly as if they had been fed one step at a time. Leaves the rows' hidden states in x. */
static void layers_pass(const Model *m, int B, const int64_t *tok, const int64_t *pos, const int64_t *seat,
                        float *const *k_seats, float *const *v_seats, int seat_len, float *scratch, int cap, int T) {
    const int d = m->d, H = m->n_heads, Hkv = m->n_kv_heads, D = m->head_dim, G = H / Hkv, F = m->ffn;
    const int qd = H * D, kvd = Hkv * D, nqkv = qd + 2 * kvd, nup = m->gated ? 2 * F : F;
    /* scratch, laid out for `cap` rows: x, h (cap, d), qkv, att, up, act, scores (G, seat_len), sx, xu */
    float *x = scratch, *h = x + (size_t)cap * d, *qkv = h + (size_t)cap * d, *att = qkv + (size_t)cap * nqkv;
    float *up = att + (size_t)cap * qd, *act = up + (size_t)cap * nup, *scores = act + (size_t)cap * F;
    float *kt = scores + (size_t)QTILE * G * seat_len; /* a block of 16 keys, transposed (D, 16) */
    float *sx = kt + (size_t)16 * D;                   /* int8: each row's activation scale */
    uint8_t *xu = (uint8_t *)(sx + cap);               /* int8: the rows rounded to 8 bits, cap * max(d, qd, F) */
    int run_at[B + 1]; /* attention: where each run of rows starts (a decode row, or a chunk of <= QTILE) */
    int missed[CREW_MAX] = {0};

    for (int b = 0; b < B; b++) { /* the embedding, plus GPT-2's learned position */
        float *xb = x + (size_t)b * d;
        if (m->embed)
            memcpy(xb, m->embed + (size_t)tok[b] * d, sizeof(float) * d);
        else
            for (int i = 0; i < d; i++) xb[i] = m->embed_cols[(size_t)i * m->vocab + tok[b]];
        if (!m->rope)
            for (int i = 0; i < d; i++) xb[i] += m->wpe[(size_t)pos[b] * d + i];
    }
    for (int l = 0; l < m->n_layers; l++) {
        const Layer *L = m->layers + l;
        norm(m, B, x, L->norm1_w, L->norm1_b, h);
        linear(m, &L->qkv, B, d, nqkv, h, qkv, xu, sx, T); /* (B, q | k | v) */
        for (int b = 0; b < B; b++) { /* RoPE, then this token's K/V into its seat, slot pos[b] */
            float *row = qkv + (size_t)b * nqkv;
            const size_t p = (size_t)pos[b], st_ = (size_t)seat[b];
            if (m->rope)
                for (int hh = 0; hh < H + Hkv; hh++) /* q heads then k heads, side by side */
                    rope_head(row + (size_t)hh * D, m->rope_cos + p * D, m->rope_sin + p * D, D);
            for (int kh = 0; kh < Hkv; kh++) {
                const size_t at = ((st_ * Hkv + kh) * seat_len + p) * D;
                memcpy(k_seats[l] + at, row + qd + (size_t)kh * D, sizeof(float) * D);
                memcpy(v_seats[l] + at, row + qd + kvd + (size_t)kh * D, sizeof(float) * D);
            }
        }
        /* Attention. A row reads only slots up to its own position, all written by now. Rows of one
         * seat at consecutive positions (a prompt chunk) go QTILE at a time through attend_chunk. */
        int runs = 0;
        for (int b = 0; b < B; runs++) {
            run_at[runs] = b++;
            while (b - run_at[runs] < QTILE && b < B && seat[b] == seat[b - 1] && pos[b] == pos[b - 1] + 1) b++;
        }
        run_at[runs] = B;
        const AttendJob job = {m, l, pos, seat, k_seats, v_seats, seat_len, qkv, att, run_at, runs * Hkv, scores, kt, missed};
        attention(&job, T);
        linear(m, &L->out, B, qd, d, att, h, xu, sx, T);
        for (size_t i = 0; i < (size_t)B * d; i++) x[i] += h[i];
        norm(m, B, x, L->norm2_w, L->norm2_b, h);
        linear(m, &L->up, B, d, nup, h, up, xu, sx, T);
        for (int b = 0; b < B; b++) {
            const float *ub = up + (size_t)b * nup;
            float *ab = act + (size_t)b * F;
            int i = 0;
            if (m->act != 1) /* SiLU and tanh-GELU sixteen at a time; erf-GELU stays scalar */
                for (; i + 16 <= F; i += 16) st(ab + i, m->gated ? activate16(m->act, ld(ub + i)) * ld(ub + F + i)
                                                                   : activate16(m->act, ld(ub + i)));
            for (; i < F; i++) ab[i] = m->gated ? activate(m->act, ub[i]) * ub[F + i] : activate(m->act, ub[i]);
        }
        linear(m, &L->down, B, F, d, act, h, xu, sx, T);
        for (size_t i = 0; i < (size_t)B * d; i++) x[i] += h[i];
    }
}

/* One pass of B rows (any mix of decode rows and prompt chunks), `cap` rows at a time: scratch holds
 * twopot_scratch_floats(m, cap, seat_len). A group runs every layer before the next group starts,
 * so a later group's rows find the earlier ones' K/V in the seats: a 512-token prompt at cap 64 is
 * eight chunks of chunked prefill. Logits (n_out, V) are made only for rows out[0] < out[1] < ...
 * (the rows that sample); out NULL: every row, logits (B, V). The products and attention run on `threads` threads
 * (native_crew.h), the rest on the caller's.
 * Returns 0, or 1 if a position, seat or token is out of range (nothing is written then). */
int twopot_step(const Model *m, int B, const int64_t *tok, const int64_t *pos, const int64_t *seat, int seats,
                float *const *k_seats, float *const *v_seats, int seat_len, int n_out, const int64_t *out,
                float *logits, float *scratch, int cap, int threads) {
    for (int b = 0; b < B; b++)
        if (pos[b] < 0 || pos[b] >= seat_len || pos[b] >= m->max_context || tok[b] < 0 || tok[b] >= m->vocab ||
            seat[b] < 0 || seat[b] >= seats)
            return 1;
    for (int i = 0; i < (out ? n_out : 0); i++)
        if (out[i] < 0 || out[i] >= B || (i && out[i] <= out[i - 1])) return 1;
    const int d = m->d, T = crew_begin(threads);
    float *x = scratch, *h = x + (size_t)cap * d;
    int next = 0; /* the next output row's index into out */
    for (int g0 = 0; g0 < B; g0 += cap) {
        const int n = B - g0 < cap ? B - g0 : cap;
        layers_pass(m, n, tok + g0, pos + g0, seat + g0, k_seats, v_seats, seat_len, scratch, cap, T);
        /* the group's sampling rows, packed to the front of x, through the final norm and the LM head */
        int r = 0;
        if (!out)
            r = n;
        else
            for (; next < n_out && out[next] < g0 + n; next++, r++)
                if (out[next] - g0 != r) memmove(x + (size_t)r * d, x + (size_t)(out[next] - g0) * d, sizeof(float) * d);
        if (!r) continue;
        float *sx = h + (size_t)cap * d; /* h's rows are free again: the LM head's own scratch follows */
        norm(m, r, x, m->final_w, m->final_b, h);
        linear(m, &m->lm_head, r, d, m->vocab, h, logits + (size_t)(out ? next - r : g0) * m->vocab,
               (uint8_t *)(sx + r), sx, T);
    }
    crew_end(T);
    return 0;
}

/* The float32 product alone, for the bench's kernel ceilings and the tests. */
void twopot_gemm_f32(int B, int K, int N, const float *x, const float *w, float *y) {
    gemm_kmajor(B, K, N, x, K, w, N, y, N);
}

/* The int8 product alone: the model's forward runs its few-row int8 products here too
 * (engine/int8_op.py), so a row gets the same numbers in every pass. xu: B * K bytes, sx: B floats. */
void twopot_gemm_int8(int B, int K, int N, const float *x, const int8_t *q, const float *scale,
                      const int32_t *rowsum, float *y, uint8_t *xu, float *sx) {
    gemm_int8(B, K, N, x, q, scale, rowsum, y, N, xu, sx);
}
