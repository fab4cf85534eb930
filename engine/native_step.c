/* The soup pot in one call: a whole pure-decode step of our Transformer, in C.
 *
 * Why: a batch-1 decode step of a small model is ~150 small operations between a few weight
 * streams. Run one torch op at a time, each pays Python and dispatch (a few microseconds), which
 * on the chef is most of the step; and torch's fp32 GEMV streams the weights at well under what one
 * core can read. Here the step is one call: every layer's norm, projections, RoPE, K/V write,
 * attention and MLP, then the LM head, over buffers made once. engine/native.py builds this file
 * with the machine's C compiler (-O3 -march=native), loads it with ctypes and hands it pointers
 * to the model's own weights and KV seats; nothing is copied.
 *
 * The math is the model's (engine/model.py, engine/attention.py, engine/layers.py), row for row:
 * tests/test_native.py holds it to the eager forward and to transformers.
 *
 * Layouts (as the model keeps them):
 *   float32 weight    (in, out) row-major, used as y = x @ W          -> gemm_kmajor
 *   int8 weight       q (out, in) row-major, scale (out,) float32     -> gemm_int8
 *   KV seats, a layer (S, Hkv, T, D); decode row b sits in seat b and writes slot pos[b]
 *   RoPE tables       cos, sin (ctx, D), sin's first half negated (rotate_half folded in)
 *
 * Every output element is summed over k in the same order whatever the batch, so a row's logits
 * are the same bits alone or beside other rows.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512VNNI__)
#include <immintrin.h> /* the int8 products' VNNI dot */
#endif

#ifndef NPANEL
#define NPANEL 1024
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

/* Software prefetch into L2, PREFETCH_ROWS weight rows ahead of the rows being read. One core
 * keeps only so many cache misses in flight; asking early keeps the memory bus busy
 * (docs/benchmarks/native-cpu.md has what it gains). */
#ifndef PREFETCH_ROWS
#define PREFETCH_ROWS 8
#endif
#ifndef INT8_PREFETCH_ROWS /* int8 rows are read one after another: a row is a quarter of a float row */
#define INT8_PREFETCH_ROWS 16
#endif
static inline void prefetch_l2(const void *p) {
#if defined(__x86_64__) || defined(__i386__)
    /* asm, not _mm_prefetch: gcc's vectorizer drops prefetch builtins from the loops it rewrites */
    __asm__ volatile("prefetcht2 %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 0, 1);
#endif
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

/* ---- float32 products, weight (K, N) row-major: y (B, N) = x (B, K) @ w ---------------------- */

/* Few rows: the weight is read front to back, four rows of w per pass, each added into y's rows,
 * which stay in L1 (a panel of NP columns). Within a panel the weight stream is sequential, and
 * four rows per pass load and store y a quarter as often. Each y element still sums k in order. */
static inline __attribute__((always_inline)) void kmajor_stream(int R, int K, int N, const float *x, int ldx,
                                                                const float *w, int ldw, float *y, int ldy) {
    const int NP = NPANEL / R;
    for (int n0 = 0; n0 < N; n0 += NP) {
        const int nn = N - n0 < NP ? N - n0 : NP, nv = nn & ~15;
        for (int r = 0; r < R; r++) memset(y + (size_t)r * ldy + n0, 0, sizeof(float) * nn);
        int k = 0;
        for (; k + 4 <= K; k += 4) {
            const float *w0 = w + (size_t)k * ldw + n0, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
            v16 xv[4][4];
            for (int r = 0; r < R; r++)
                for (int i = 0; i < 4; i++) xv[r][i] = splat(x[(size_t)r * ldx + k + i]);
            const float *ahead = w0 + (size_t)PREFETCH_ROWS * ldw;
            for (int j = 0; j < nv; j += 16) {
                for (int i = 0; i < 4; i++) prefetch_l2(ahead + (size_t)i * ldw + j);
                const v16 a = ld(w0 + j), b = ld(w1 + j), c = ld(w2 + j), d = ld(w3 + j);
                for (int r = 0; r < R; r++) {
                    float *yr = y + (size_t)r * ldy + n0 + j;
                    v16 s = ld(yr);
                    s += xv[r][0] * a, s += xv[r][1] * b, s += xv[r][2] * c, s += xv[r][3] * d;
                    st(yr, s);
                }
            }
            for (int j = nv; j < nn; j++)
                for (int r = 0; r < R; r++) {
                    float *yr = y + (size_t)r * ldy + n0 + j;
                    const float *xr = x + (size_t)r * ldx + k;
                    *yr += xr[0] * w0[j], *yr += xr[1] * w1[j], *yr += xr[2] * w2[j], *yr += xr[3] * w3[j];
                }
        }
        for (; k < K; k++) {
            const float *wk = w + (size_t)k * ldw + n0;
            for (int r = 0; r < R; r++) {
                const float xs = x[(size_t)r * ldx + k];
                const v16 xv = splat(xs);
                float *yr = y + (size_t)r * ldy + n0;
                for (int j = 0; j < nv; j += 16) st(yr + j, ld(yr + j) + xv * ld(wk + j));
                for (int j = nv; j < nn; j++) yr[j] += xs * wk[j];
            }
        }
    }
}

/* Many rows: a 4-row x 64-column block of y in registers while k runs; the weight panel
 * (K x 64) stays in cache for the next rows. Same per-element order as kmajor_stream. */
static inline __attribute__((always_inline)) void kmajor_block(int R, int K, const float *x, int ldx,
                                                               const float *w, int ldw, float *y, int ldy) {
    v16 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < 4; v++) acc[r][v] = splat(0.0f);
    for (int k = 0; k < K; k++) {
        const float *wk = w + (size_t)k * ldw;
        for (int i = 0; i < 64; i += 16) prefetch_l2(wk + (size_t)PREFETCH_ROWS * ldw + i);
        const v16 w0 = ld(wk), w1 = ld(wk + 16), w2 = ld(wk + 32), w3 = ld(wk + 48);
        for (int r = 0; r < R; r++) {
            const v16 xr = splat(x[(size_t)r * ldx + k]);
            acc[r][0] += xr * w0, acc[r][1] += xr * w1, acc[r][2] += xr * w2, acc[r][3] += xr * w3;
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < 4; v++) st(y + (size_t)r * ldy + 16 * v, acc[r][v]);
}

static void gemm_kmajor(int B, int K, int N, const float *x, int ldx, const float *w, float *y, int ldy) {
    switch (B) {
        case 1: kmajor_stream(1, K, N, x, ldx, w, N, y, ldy); return;
        case 2: kmajor_stream(2, K, N, x, ldx, w, N, y, ldy); return;
        case 3: kmajor_stream(3, K, N, x, ldx, w, N, y, ldy); return;
        case 4: kmajor_stream(4, K, N, x, ldx, w, N, y, ldy); return;
    }
    const int N64 = N & ~63;
    for (int n0 = 0; n0 < N64; n0 += 64) {
        for (int b0 = 0; b0 < B; b0 += 4) {
            const float *xb = x + (size_t)b0 * ldx;
            float *yb = y + (size_t)b0 * ldy + n0;
            switch (B - b0 < 4 ? B - b0 : 4) {
                case 1: kmajor_block(1, K, xb, ldx, w + n0, N, yb, ldy); break;
                case 2: kmajor_block(2, K, xb, ldx, w + n0, N, yb, ldy); break;
                case 3: kmajor_block(3, K, xb, ldx, w + n0, N, yb, ldy); break;
                default: kmajor_block(4, K, xb, ldx, w + n0, N, yb, ldy); break;
            }
        }
    }
    if (N64 < N) { /* the last < 64 columns, a row at a time */
        for (int b = 0; b < B; b++)
            kmajor_stream(1, K, N - N64, x + (size_t)b * ldx, ldx, w + N64, N, y + (size_t)b * ldy + N64, ldy);
    }
}

/* ---- int8 products, q (N, K) row-major, scale (N,), rowsum (N,) = sum_k q[n, k] ------------------
 * W8A8, the arithmetic of llama.cpp's q8_0 products: each row of activations is rounded to 8 bits
 * over its own range, xq = round(x / sx) with sx = max|x| / 127, and int8 x int8 products are
 * summed exactly in int32:
 *     y[b, n] = ((sum_k xq[b, k] q[n, k]) * sx[b]) * scale[n]
 * The products use AVX-512 VNNI's u8 x s8 dot (64 pairs an instruction) where the CPU has it, so
 * xq is stored as xu = xq + 128 (unsigned) and 128 * rowsum[n] is taken off again. Integer sums
 * are exact, so the result does not depend on the order of k, nor on the other rows. */
static void quantize_rows(int B, int K, const float *x, uint8_t *xu, float *sx) {
    for (int b = 0; b < B; b++) {
        const float *xb = x + (size_t)b * K;
        float amax = 0.0f;
        for (int k = 0; k < K; k++) amax = fabsf(xb[k]) > amax ? fabsf(xb[k]) : amax;
        const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
        for (int k = 0; k < K; k++) {
            long v = lrintf(xb[k] / s); /* round half to even, like torch.round */
            xu[(size_t)b * K + k] = (uint8_t)((v > 127 ? 127 : v < -127 ? -127 : v) + 128);
        }
        sx[b] = s;
    }
}

static inline int32_t dot_u8s8(const uint8_t *a, const int8_t *w, int n) {
    int32_t s = 0;
    for (int k = 0; k < n; k++) s += (int32_t)a[k] * (int32_t)w[k];
    return s;
}

static inline __attribute__((always_inline)) void int8_block(int RB, int NB, int K, const uint8_t *xu,
                                                             const float *sx, const int8_t *q, const float *scale,
                                                             const int32_t *rowsum, float *y, int ldy) {
    int32_t sums[4][4];
    int k0 = 0;
#if defined(__AVX512VNNI__)
    __m512i acc[4][4];
    for (int r = 0; r < RB; r++)
        for (int b = 0; b < NB; b++) acc[r][b] = _mm512_setzero_si512();
    for (; k0 + 64 <= K; k0 += 64) {
        __m512i wv[4];
        for (int r = 0; r < RB; r++) {
            prefetch_l2(q + (size_t)(r + INT8_PREFETCH_ROWS) * K + k0);
            wv[r] = _mm512_loadu_si512((const void *)(q + (size_t)r * K + k0));
        }
        for (int b = 0; b < NB; b++) {
            const __m512i xv = _mm512_loadu_si512((const void *)(xu + (size_t)b * K + k0));
            for (int r = 0; r < RB; r++) acc[r][b] = _mm512_dpbusd_epi32(acc[r][b], xv, wv[r]);
        }
    }
    for (int r = 0; r < RB; r++)
        for (int b = 0; b < NB; b++) sums[r][b] = _mm512_reduce_add_epi32(acc[r][b]);
#else
    for (int r = 0; r < RB; r++)
        for (int b = 0; b < NB; b++) sums[r][b] = 0;
#endif
    for (int r = 0; r < RB; r++)
        for (int b = 0; b < NB; b++) {
            const int32_t s = sums[r][b] + dot_u8s8(xu + (size_t)b * K + k0, q + (size_t)r * K + k0, K - k0);
            const float v = (float)(s - 128 * rowsum[r]) * sx[b];
            y[(size_t)b * ldy + r] = scale ? v * scale[r] : v; /* no scale: the caller applies it */
        }
}

/* RB weight rows (4 or 1) against every row of x, four rows of x at a time. */
static inline __attribute__((always_inline)) void int8_rows(int RB, int B, int K, const uint8_t *xu,
                                                            const float *sx, const int8_t *q, const float *scale,
                                                            const int32_t *rowsum, float *y, int ldy) {
    for (int b0 = 0; b0 < B; b0 += 4) {
        const uint8_t *xb = xu + (size_t)b0 * K;
        float *yb = y + (size_t)b0 * ldy;
        switch (B - b0 < 4 ? B - b0 : 4) {
            case 1: int8_block(RB, 1, K, xb, sx + b0, q, scale, rowsum, yb, ldy); break;
            case 2: int8_block(RB, 2, K, xb, sx + b0, q, scale, rowsum, yb, ldy); break;
            case 3: int8_block(RB, 3, K, xb, sx + b0, q, scale, rowsum, yb, ldy); break;
            default: int8_block(RB, 4, K, xb, sx + b0, q, scale, rowsum, yb, ldy); break;
        }
    }
}

/* y (B, N) = x (B, K) @ (q * scale)^T; xu (B * K bytes) and sx (B floats) are scratch. */
static void gemm_int8(int B, int K, int N, const float *x, const int8_t *q, const float *scale,
                      const int32_t *rowsum, float *y, int ldy, uint8_t *xu, float *sx) {
    quantize_rows(B, K, x, xu, sx);
    int n = 0;
    for (; n + 4 <= N; n += 4)
        int8_rows(4, B, K, xu, sx, q + (size_t)n * K, scale ? scale + n : 0, rowsum + n, y + n, ldy);
    for (; n < N; n++) int8_rows(1, B, K, xu, sx, q + (size_t)n * K, scale ? scale + n : 0, rowsum + n, y + n, ldy);
}

/* y (B, N) = x (B, K) @ W (+ bias) */
static void linear(const Model *m, const Linear *L, int B, int K, int N, const float *x, float *y, uint8_t *xu,
                   float *sx) {
    if (m->int8)
        gemm_int8(B, K, N, x, (const int8_t *)L->w, L->scale, L->rowsum, y, N, xu, sx);
    else
        gemm_kmajor(B, K, N, x, K, (const float *)L->w, y, N);
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

/* Rotate each (i, i + D/2) pair of one head: x cos + swap_halves(x) sin, sin's sign folded in. */
static void rope_head(float *h, const float *cos, const float *sin, int D) {
    const int half = D / 2;
    for (int i = 0; i < half; i++) {
        const float a = h[i], b = h[i + half];
        h[i] = a * cos[i] + b * sin[i];
        h[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* One row's attention for one KV head: G query heads against slots 0..n-1 of its seat. */
static void attend(const float *q, const float *keys, const float *values, int n, int G, int D, float *scores,
                   float *out) {
    const float scale = 1.0f / sqrtf((float)D);
    for (int g = 0; g < G; g++) {
        const float *qg = q + (size_t)g * D;
        float *sg = scores + (size_t)g * n, mx = -INFINITY;
        for (int s = 0; s < n; s++) {
            const float *ks = keys + (size_t)s * D;
            float dot;
            if ((D & 15) == 0) {
                v16 acc = splat(0.0f);
                for (int i = 0; i < D; i += 16) acc += ld(qg + i) * ld(ks + i);
                dot = hsum(acc);
            } else {
                dot = 0.0f;
                for (int i = 0; i < D; i++) dot += qg[i] * ks[i];
            }
            sg[s] = dot * scale;
            mx = sg[s] > mx ? sg[s] : mx;
        }
        v16 sum = splat(0.0f);
        int s = 0;
        for (; s + 16 <= n; s += 16) {
            const v16 e = exp16(ld(sg + s) - mx);
            st(sg + s, e), sum += e;
        }
        float total = hsum(sum);
        for (; s < n; s++) total += (sg[s] = expf(sg[s] - mx));
        const float inv = 1.0f / total;
        float *og = out + (size_t)g * D;
        memset(og, 0, sizeof(float) * D);
        for (s = 0; s < n; s++) {
            const float p = sg[s] * inv, *vs = values + (size_t)s * D;
            if ((D & 15) == 0)
                for (int i = 0; i < D; i += 16) st(og + i, ld(og + i) + p * ld(vs + i));
            else
                for (int i = 0; i < D; i++) og[i] += p * vs[i];
        }
    }
}

/* Floats of scratch one step of B rows needs (engine/native.py allocates it). */
long twopot_scratch_floats(const Model *m, int B, int seat_len) {
    const long qkv = (long)(m->n_heads + 2 * m->n_kv_heads) * m->head_dim;
    const long up = (m->gated ? 2L : 1L) * m->ffn;
    const long G = m->n_heads / m->n_kv_heads;
    long widest = m->d > m->ffn ? m->d : m->ffn;
    widest = widest > (long)m->n_heads * m->head_dim ? widest : (long)m->n_heads * m->head_dim;
    return B * (2L * m->d + qkv + (long)m->n_heads * m->head_dim + up + m->ffn) + G * seat_len + B + (B * widest + 3) / 4;
}

/* One decode step: rows b = 0..B-1 feed token tok[b] at position pos[b] and sit in seat b of
 * k_seats[l], v_seats[l] ((S, Hkv, T, D) per layer, T = seat_len). Writes logits (B, V).
 * Returns 0, or 1 if a position is outside its seat or the context (nothing is written then). */
int twopot_decode_step(const Model *m, int B, const int64_t *tok, const int64_t *pos, float *const *k_seats,
                       float *const *v_seats, int seat_len, float *logits, float *scratch) {
    const int d = m->d, H = m->n_heads, Hkv = m->n_kv_heads, D = m->head_dim, G = H / Hkv, F = m->ffn;
    const int qd = H * D, kvd = Hkv * D, nqkv = qd + 2 * kvd, nup = m->gated ? 2 * F : F;
    for (int b = 0; b < B; b++)
        if (pos[b] < 0 || pos[b] >= seat_len || pos[b] >= m->max_context || tok[b] < 0 || tok[b] >= m->vocab)
            return 1;
    float *x = scratch, *h = x + (size_t)B * d, *qkv = h + (size_t)B * d, *att = qkv + (size_t)B * nqkv;
    float *up = att + (size_t)B * qd, *act = up + (size_t)B * nup, *scores = act + (size_t)B * F;
    float *sx = scores + (size_t)G * seat_len; /* int8: each row's activation scale */
    uint8_t *xu = (uint8_t *)(sx + B);        /* int8: the rows rounded to 8 bits, B * max(d, qd, F) */

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
        linear(m, &L->qkv, B, d, nqkv, h, qkv, xu, sx); /* (B, q | k | v) */
        for (int b = 0; b < B; b++) {
            float *row = qkv + (size_t)b * nqkv;
            const size_t p = (size_t)pos[b];
            if (m->rope)
                for (int hh = 0; hh < H + Hkv; hh++) /* q heads then k heads, side by side */
                    rope_head(row + (size_t)hh * D, m->rope_cos + p * D, m->rope_sin + p * D, D);
            for (int kh = 0; kh < Hkv; kh++) { /* this token's K/V into seat b, slot p */
                const size_t at = (((size_t)b * Hkv + kh) * seat_len + p) * D;
                memcpy(k_seats[l] + at, row + qd + (size_t)kh * D, sizeof(float) * D);
                memcpy(v_seats[l] + at, row + qd + kvd + (size_t)kh * D, sizeof(float) * D);
            }
            for (int kh = 0; kh < Hkv; kh++) {
                const size_t seat = ((size_t)b * Hkv + kh) * seat_len * D;
                attend(row + (size_t)kh * G * D, k_seats[l] + seat, v_seats[l] + seat, (int)p + 1, G, D, scores,
                       att + (size_t)b * qd + (size_t)kh * G * D);
            }
        }
        linear(m, &L->out, B, qd, d, att, h, xu, sx);
        for (size_t i = 0; i < (size_t)B * d; i++) x[i] += h[i];
        norm(m, B, x, L->norm2_w, L->norm2_b, h);
        linear(m, &L->up, B, d, nup, h, up, xu, sx);
        for (int b = 0; b < B; b++) {
            const float *ub = up + (size_t)b * nup;
            float *ab = act + (size_t)b * F;
            if (m->gated)
                for (int i = 0; i < F; i++) ab[i] = activate(m->act, ub[i]) * ub[F + i];
            else
                for (int i = 0; i < F; i++) ab[i] = activate(m->act, ub[i]);
        }
        linear(m, &L->down, B, F, d, act, h, xu, sx);
        for (size_t i = 0; i < (size_t)B * d; i++) x[i] += h[i];
    }
    norm(m, B, x, m->final_w, m->final_b, h);
    linear(m, &m->lm_head, B, d, m->vocab, h, logits, xu, sx);
    return 0;
}

/* The float32 product alone, for the bench's kernel ceilings and the tests. */
void twopot_gemm_f32(int B, int K, int N, const float *x, const float *w, float *y) {
    gemm_kmajor(B, K, N, x, K, w, y, N);
}

/* The int8 product alone: the model's forward runs its few-row int8 products here too
 * (engine/int8_op.py), so a row gets the same numbers in every pass. xu: B * K bytes, sx: B floats. */
void twopot_gemm_int8(int B, int K, int N, const float *x, const int8_t *q, const float *scale,
                      const int32_t *rowsum, float *y, uint8_t *xu, float *sx) {
    gemm_int8(B, K, N, x, q, scale, rowsum, y, N, xu, sx);
}
