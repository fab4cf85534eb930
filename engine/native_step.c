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
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512VNNI__)
#include <immintrin.h> /* the int8 products' VNNI dot */
#endif

#ifndef QTILE /* prompt rows whose attention shares one pass over the keys */
#define QTILE 32
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

/* Many rows: a 6-row x 64-column block of y in registers while k runs (24 accumulators, 4 weight
 * vectors, 1 broadcast: 29 of AVX-512's 32 registers); the weight panel (K x 64) stays in cache for
 * the next rows. Per k: 4 weight loads and 6 broadcasts feed 24 FMAs. Same per-element order as
 * kmajor_stream. */
#define BLOCK_ROWS 6
#ifndef BLOCK_PREFETCH_ROWS /* the panel's k rows are a stride apart: ask early enough for DRAM's latency */
#define BLOCK_PREFETCH_ROWS 32
#endif
static inline __attribute__((always_inline)) void kmajor_block(int R, int K, const float *x, int ldx,
                                                               const float *w, int ldw, float *y, int ldy) {
    v16 acc[BLOCK_ROWS][4];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < 4; v++) acc[r][v] = splat(0.0f);
    for (int k = 0; k < K; k++) {
        const float *wk = w + (size_t)k * ldw;
        for (int i = 0; i < 64; i += 16) prefetch_l2(wk + (size_t)BLOCK_PREFETCH_ROWS * ldw + i);
        v16 w0 = ld(wk), w1 = ld(wk + 16), w2 = ld(wk + 32), w3 = ld(wk + 48);
        __asm__("" : "+v"(w0), "+v"(w1), "+v"(w2), "+v"(w3)); /* loaded once, not folded into each row's FMA */
        for (int r = 0; r < R; r++) {
            const v16 xr = splat(x[(size_t)r * ldx + k]);
            acc[r][0] += xr * w0, acc[r][1] += xr * w1, acc[r][2] += xr * w2, acc[r][3] += xr * w3;
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < 4; v++) st(y + (size_t)r * ldy + 16 * v, acc[r][v]);
}

static void gemm_kmajor(int B, int K, int N, const float *x, int ldx, const float *w, int ldw, float *y, int ldy) {
    switch (B) {
        case 1: kmajor_stream(1, K, N, x, ldx, w, ldw, y, ldy); return;
        case 2: kmajor_stream(2, K, N, x, ldx, w, ldw, y, ldy); return;
        case 3: kmajor_stream(3, K, N, x, ldx, w, ldw, y, ldy); return;
        case 4: kmajor_stream(4, K, N, x, ldx, w, ldw, y, ldy); return;
    }
    const int N64 = N & ~63;
    for (int n0 = 0; n0 < N64; n0 += 64) {
        for (int b0 = 0; b0 < B; b0 += BLOCK_ROWS) {
            const float *xb = x + (size_t)b0 * ldx;
            float *yb = y + (size_t)b0 * ldy + n0;
            switch (B - b0 < BLOCK_ROWS ? B - b0 : BLOCK_ROWS) {
                case 1: kmajor_block(1, K, xb, ldx, w + n0, ldw, yb, ldy); break;
                case 2: kmajor_block(2, K, xb, ldx, w + n0, ldw, yb, ldy); break;
                case 3: kmajor_block(3, K, xb, ldx, w + n0, ldw, yb, ldy); break;
                case 4: kmajor_block(4, K, xb, ldx, w + n0, ldw, yb, ldy); break;
                case 5: kmajor_block(5, K, xb, ldx, w + n0, ldw, yb, ldy); break;
                default: kmajor_block(6, K, xb, ldx, w + n0, ldw, yb, ldy); break;
            }
        }
    }
    if (N64 < N) /* the last < 64 columns, four rows at a time */
        for (int b0 = 0; b0 < B; b0 += 4) {
            const float *xb = x + (size_t)b0 * ldx, *wn = w + N64;
            float *yb = y + (size_t)b0 * ldy + N64;
            switch (B - b0 < 4 ? B - b0 : 4) {
                case 1: kmajor_stream(1, K, N - N64, xb, ldx, wn, ldw, yb, ldy); break;
                case 2: kmajor_stream(2, K, N - N64, xb, ldx, wn, ldw, yb, ldy); break;
                case 3: kmajor_stream(3, K, N - N64, xb, ldx, wn, ldw, yb, ldy); break;
                default: kmajor_stream(4, K, N - N64, xb, ldx, wn, ldw, yb, ldy); break;
            }
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
    typedef uint8_t v16b __attribute__((vector_size(16), aligned(1), may_alias));
    const v16i absmask = (v16i)splat(-0.0f);
    for (int b = 0; b < B; b++) {
        const float *xb = x + (size_t)b * K;
        uint8_t *ub = xu + (size_t)b * K;
        const int kv = K & ~15;
        v16 vmax = splat(0.0f);
        for (int k = 0; k < kv; k += 16) {
            const v16 a = (v16)((v16i)ld(xb + k) & ~absmask);
            vmax = pick(a > vmax, a, vmax);
        }
        float amax = 0.0f;
        for (int i = 0; i < 16; i++) amax = vmax[i] > amax ? vmax[i] : amax;
        for (int k = kv; k < K; k++) amax = fabsf(xb[k]) > amax ? fabsf(xb[k]) : amax;
        const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
        for (int k = 0; k < kv; k += 16) { /* x / s to the nearest integer, ties to even (torch.round) */
            v16 q = (ld(xb + k) / s + 12582912.0f) - 12582912.0f;
            q = pick(q > splat(127.0f), splat(127.0f), q);
            q = pick(q < splat(-127.0f), splat(-127.0f), q);
            *(v16b *)(ub + k) = __builtin_convertvector(__builtin_convertvector(q, v16i) + 128, v16b);
        }
        for (int k = kv; k < K; k++) {
            long v = lrintf(xb[k] / s);
            ub[k] = (uint8_t)((v > 127 ? 127 : v < -127 ? -127 : v) + 128);
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
    if (NB == 1) { /* one activation row: read the weight rows one after another, a single stream */
        const int kv = K & ~63;
        for (int r = 0; r < RB; r++)
            for (int k = 0; k < kv; k += 64) {
                const int8_t *wr = q + (size_t)r * K + k;
                prefetch_l2(wr + (size_t)INT8_PREFETCH_ROWS * K);
                acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], _mm512_loadu_si512((const void *)(xu + k)),
                                                _mm512_loadu_si512((const void *)wr));
            }
        k0 = kv;
    }
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
    if (RB == 4) { /* up to 16 sums at once: halve and pair vectors instead of one reduction each */
        __m512i u[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
        for (int b = 0; b < NB; b++) {
            const __m512i a = acc[0][b], c = acc[1][b], e = acc[2][b], g = acc[3][b];
            const __m512i ac = _mm512_add_epi32(_mm512_shuffle_i64x2(a, c, 0x44), _mm512_shuffle_i64x2(a, c, 0xEE));
            const __m512i eg = _mm512_add_epi32(_mm512_shuffle_i64x2(e, g, 0x44), _mm512_shuffle_i64x2(e, g, 0xEE));
            /* 128-bit lane r holds four partial sums of weight row r */
            u[b] = _mm512_add_epi32(_mm512_shuffle_i64x2(ac, eg, 0x88), _mm512_shuffle_i64x2(ac, eg, 0xDD));
        }
        const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(u[0], u[1]), _mm512_unpackhi_epi32(u[0], u[1]));
        const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(u[2], u[3]), _mm512_unpackhi_epi32(u[2], u[3]));
        const __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
        int32_t out[16]; /* out[4 r + b] */
        _mm512_storeu_si512((void *)out, t);
        for (int r = 0; r < 4; r++)
            for (int b = 0; b < NB; b++) sums[r][b] = out[4 * r + b];
    } else
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

/* Weight rows n0..n1-1 of y (B, N) = x @ (q * scale)^T, x already rounded (xu, sx): 4 rows at a
 * time from n0, which callers keep a multiple of 4 so every row is summed the same way. */
static void int8_span(int B, int K, int n0, int n1, const uint8_t *xu, const float *sx, const int8_t *q,
                      const float *scale, const int32_t *rowsum, float *y, int ldy) {
    int n = n0;
    for (; n + 4 <= n1; n += 4)
        int8_rows(4, B, K, xu, sx, q + (size_t)n * K, scale ? scale + n : 0, rowsum + n, y + n, ldy);
    for (; n < n1; n++) int8_rows(1, B, K, xu, sx, q + (size_t)n * K, scale ? scale + n : 0, rowsum + n, y + n, ldy);
}

/* y (B, N) = x (B, K) @ (q * scale)^T; xu (B * K bytes) and sx (B floats) are scratch. */
static void gemm_int8(int B, int K, int N, const float *x, const int8_t *q, const float *scale,
                      const int32_t *rowsum, float *y, int ldy, uint8_t *xu, float *sx) {
    quantize_rows(B, K, x, xu, sx);
    int8_span(B, K, 0, N, xu, sx, q, scale, rowsum, y, ldy);
}

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

/* scores[0..n-1] (one query head's, scaled) -> their softmax, in place. */
static void softmax(float *sg, int n) {
    float mx = -INFINITY;
    for (int s = 0; s < n; s++) mx = sg[s] > mx ? sg[s] : mx;
    v16 sum = splat(0.0f);
    int s = 0;
    for (; s + 16 <= n; s += 16) {
        const v16 e = exp16(ld(sg + s) - mx);
        st(sg + s, e), sum += e;
    }
    float total = hsum(sum);
    for (; s < n; s++) total += (sg[s] = expf(sg[s] - mx));
    const float inv = 1.0f / total;
    for (s = 0; s + 16 <= n; s += 16) st(sg + s, ld(sg + s) * inv);
    for (; s < n; s++) sg[s] *= inv;
}

/* softmax(scores[0..n-1]) @ values (n, D) -> out (D). */
static void softmax_values(float *sg, const float *values, int n, int D, float *og) {
    softmax(sg, n);
    memset(og, 0, sizeof(float) * D);
    for (int s = 0; s < n; s++) {
        const float p = sg[s], *vs = values + (size_t)s * D;
        if ((D & 15) == 0)
            for (int i = 0; i < D; i += 16) st(og + i, ld(og + i) + p * ld(vs + i));
        else
            for (int i = 0; i < D; i++) og[i] += p * vs[i];
    }
}

/* One row's attention for one KV head: G query heads against slots 0..n-1 of its seat. */
static void attend(const float *q, const float *keys, const float *values, int n, int G, int D, float *scores,
                   float *out) {
    const float scale = 1.0f / sqrtf((float)D);
    for (int g = 0; g < G; g++) {
        const float *qg = q + (size_t)g * D;
        float *sg = scores + (size_t)g * n;
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
        }
        softmax_values(sg, values, n, D, out + (size_t)g * D);
    }
}

/* A prompt chunk's attention for one KV head: R consecutive rows of one seat at positions
 * p0..p0+R-1, row r's G query heads at q + r * ldq, against slots 0..p0+r. Sixteen keys at a
 * time are transposed into kt (D, 16), so each query head's sixteen scores are D broadcast
 * multiply-adds, with no horizontal sum; the block is shared by all R x G query heads.
 * scores: R * G * (p0 + R) floats; kt: 16 * D floats. */
static void attend_chunk(const float *q, int ldq, int R, int p0, const float *keys, const float *values, int G,
                         int D, float *scores, float *kt, float *out, int ldo) {
    const float scale = 1.0f / sqrtf((float)D);
    const int n = p0 + R, ld_s = n; /* the last row sees every slot the chunk reaches */
    for (int s0 = 0; s0 < n; s0 += 16) {
        const int ns = n - s0 < 16 ? n - s0 : 16;
        for (int i = 0; i < D; i++)
            for (int j = 0; j < 16; j++) kt[i * 16 + j] = j < ns ? keys[(size_t)(s0 + j) * D + i] : 0.0f;
        /* query heads j = r * G + g, four at a time (independent sums keep the FMA pipes full);
         * rows before s0 - p0 see none of these keys */
        const int j1 = R * G;
        for (int j0 = (s0 - p0 > 0 ? s0 - p0 : 0) * G; j0 < j1; j0 += 4) {
            const int nj = j1 - j0 < 4 ? j1 - j0 : 4;
            const float *qj[4];
            for (int t = 0; t < 4; t++) {
                const int j = j0 + (t < nj ? t : 0);
                qj[t] = q + (size_t)(j / G) * ldq + (size_t)(j % G) * D;
            }
            v16 acc[4] = {splat(0.0f), splat(0.0f), splat(0.0f), splat(0.0f)};
            for (int i = 0; i < D; i++) {
                const v16 k = ld(kt + i * 16);
                for (int t = 0; t < 4; t++) acc[t] += splat(qj[t][i]) * k;
            }
            for (int t = 0; t < nj; t++) {
                const v16 a = acc[t] * scale;
                float *sg = scores + (size_t)(j0 + t) * ld_s + s0;
                if (ns == 16)
                    st(sg, a);
                else
                    for (int c = 0; c < ns; c++) sg[c] = a[c];
            }
        }
    }
    /* each row's probabilities, 0 past its own position; then P (R, n) @ V (n, D) as one product a head */
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++) {
            float *sg = scores + ((size_t)r * G + g) * ld_s;
            softmax(sg, p0 + r + 1);
            memset(sg + p0 + r + 1, 0, sizeof(float) * (size_t)(R - r - 1));
        }
    for (int g = 0; g < G; g++)
        gemm_kmajor(R, n, D, scores + (size_t)g * ld_s, G * ld_s, values, D, out + (size_t)g * D, ldo);
}

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
        for (int b = 0; b < B;) {
            int R = 1;
            while (R < QTILE && b + R < B && seat[b + R] == seat[b] && pos[b + R] == pos[b] + R) R++;
            const size_t st_ = (size_t)seat[b];
            for (int kh = 0; kh < Hkv; kh++) {
                const size_t at = (st_ * Hkv + kh) * seat_len * D;
                float *qh = qkv + (size_t)b * nqkv + (size_t)kh * G * D, *oh = att + (size_t)b * qd + (size_t)kh * G * D;
                if (R == 1)
                    attend(qh, k_seats[l] + at, v_seats[l] + at, (int)pos[b] + 1, G, D, scores, oh);
                else
                    attend_chunk(qh, nqkv, R, (int)pos[b], k_seats[l] + at, v_seats[l] + at, G, D, scores, kt, oh, qd);
            }
            b += R;
        }
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
 * (the rows that sample); out NULL: every row, logits (B, V). The products run on `threads` threads
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
