/* The native step's int8 products (included by native_step.c, after native_products.h).
 *
 * The rule, the same everywhere int8 runs (engine/quant.py, engine/int8_op.py): weights and
 * activations are rounded to 8 bits QBLOCK = 32 inputs at a time, each block over its own range,
 * as llama.cpp's Q8_0 blocks are. With g = k / 32 and G = ceil(K / 32) blocks a row:
 *     W[n, k] ~ q[n, k] sw[n, g]    (q int8 (N, K), sw float16 (N, G): the weight's own blocks)
 *     x[b, k] ~ xq[b, k] sx[b, g]   (xq = round(x / sx), sx = max |x| over the block / 127, per call)
 *     y[b, n] = sum_g sx[b, g] sw[n, g] sum_{k in block g} xq[b, k] q[n, k]
 * Why blocks: one scale per whole activation row lets a few outlier features (real models have
 * them) coarsen every other input of the row; 32-wide blocks keep each outlier to its block
 * (docs/benchmarks/int8-cpu.md has the measurements).
 *
 * One order of arithmetic on every CPU, so every build gives the same bits and a row gets the same
 * numbers alone or beside others: integer sums are exact, and the float part is fixed as 16 lanes
 * A. Lane 4 (g % 4) + t takes block g's eight products at inputs 4t..4t+3 and 16+4t..16+4t+3 of
 * the block, their exact int32 sum P, as A = fma(P, sx sw, A), blocks in order; then y is A's sum
 * by hsum's tree (native_vec.h). AVX-512 VNNI does four blocks per two 64-byte dots (its 16 int32
 * lanes are those lanes), ARM's sdot one block per two 16-byte dots into the same four lanes, the
 * plain loop one lane at a time; fma is fused everywhere (a CPU without FMA gets libm's exact fmaf).
 * VNNI multiplies unsigned by signed bytes: the weight byte goes in as q + 128 (its top bit
 * flipped) against the signed x byte, and each lane's sum starts from -128 x its x bytes' sum
 * (`x_quads`, once per row of x), so it ends at the exact sum of q x.
 */

#define QBLOCK 32
#ifndef INT8_PREFETCH_ROWS /* int8 rows are read one after another: a row is a quarter of a float row */
#define INT8_PREFETCH_ROWS 16
#endif

static inline int qblocks(int K) { return (K + QBLOCK - 1) / QBLOCK; }

/* A float16 (its IEEE bits) as float32, exactly: normals rebiased, subnormals as man x 2^-24. */
static inline float half_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    uint32_t bits;
    float out;
    if (exp == 0x1F)
        bits = sign | 0x7F800000u | (man << 13); /* infinity, NaN */
    else if (exp)
        bits = sign | ((exp + 112) << 23) | (man << 13); /* exponent bias 15 -> 127 */
    else {
        out = (float)man * 5.9604644775390625e-08f; /* 0 or a subnormal: exact */
        memcpy(&bits, &out, 4);
        bits |= sign;
    }
    memcpy(&out, &bits, 4);
    return out;
}

/* One block of x (n <= 32 values) to 8 bits over its own range: qb[k] = round(xb[k] / s), ties to
 * even (torch.round), s = max |xb| / 127 returned (an all-zero block is 0 with s = 0). */
static float quantize_block(const float *xb, int n, int8_t *qb) {
    typedef int8_t v16b __attribute__((vector_size(16), aligned(1), may_alias));
    const v16i absmask = (v16i)splat(-0.0f);
    float amax = 0.0f;
    if (n == QBLOCK) {
        const v16 a = (v16)((v16i)ld(xb) & ~absmask), c = (v16)((v16i)ld(xb + 16) & ~absmask);
        const v16 m = pick(a > c, a, c);
        for (int i = 0; i < 16; i++) amax = m[i] > amax ? m[i] : amax;
    } else
        for (int k = 0; k < n; k++) amax = fabsf(xb[k]) > amax ? fabsf(xb[k]) : amax;
    const float s = amax / 127.0f;
    if (!(amax > 0.0f)) {
        memset(qb, 0, (size_t)n);
        return s;
    }
    if (n == QBLOCK)
        for (int k = 0; k < QBLOCK; k += 16) { /* x / s to the nearest integer, ties to even */
            v16 v = (ld(xb + k) / s + 12582912.0f) - 12582912.0f;
            v = pick(v > splat(127.0f), splat(127.0f), v);
            v = pick(v < splat(-127.0f), splat(-127.0f), v);
            *(v16b *)(qb + k) = __builtin_convertvector(__builtin_convertvector(v, v16i), v16b);
        }
    else
        for (int k = 0; k < n; k++) {
            const long v = lrintf(xb[k] / s);
            qb[k] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
    return s;
}

/* Each row of x (B, K) to 8 bits, block by block: xq (B, K), sx (B, G). */
static void quantize_rows(int B, int K, const float *x, int8_t *xq, float *sx) {
    const int G = qblocks(K);
    for (int b = 0; b < B; b++)
        for (int g = 0; g < G; g++) {
            const int k0 = g * QBLOCK, n = K - k0 < QBLOCK ? K - k0 : QBLOCK;
            sx[(size_t)b * G + g] = quantize_block(x + (size_t)b * K + k0, n, xq + (size_t)b * K + k0);
        }
}

/* Block g's lane t: its inputs 4t..4t+3 and 16+4t..16+4t+3 (in K), summed exactly, into lane
 * 4 (g % 4) + t, blocks g0..G-1 in order: the rule's one order, one lane at a time. */
static inline void int8_lanes(int K, int g0, const int8_t *x, const int8_t *w, const float *sx, const uint16_t *sw,
                              float *A) {
    for (int g = g0; g < qblocks(K); g++) {
        const float d = sx[g] * half_float(sw[g]);
        for (int t = 0; t < 4 && QBLOCK * g + 4 * t < K; t++) {
            int32_t p = 0;
            for (int half = 0; half < QBLOCK; half += 16)
                for (int k = QBLOCK * g + half + 4 * t; k < QBLOCK * g + half + 4 * t + 4 && k < K; k++)
                    p += (int32_t)x[k] * (int32_t)w[k];
            A[4 * (g & 3) + t] = fmaf((float)p, d, A[4 * (g & 3) + t]);
        }
    }
}

static inline float hsum_lanes(const float *A) { /* hsum's tree (native_vec.h), on 16 stored lanes */
    float a[8], c[4];
    for (int i = 0; i < 8; i++) a[i] = A[i] + A[i + 8];
    for (int i = 0; i < 4; i++) c[i] = a[i] + a[i + 4];
    return (c[0] + c[2]) + (c[1] + c[3]);
}

#if defined(TWOPOT_VNNI)
/* Four blocks at once (128 bytes): the first 16 bytes of each block side by side (lo), then the
 * last 16 (hi), so one 64-byte dot puts block i's lane t in int32 lane 4 i + t, and a second adds
 * the block's other half into the same lane. `n` of the 4 blocks are there (the rest read as 0). */
typedef struct {
    __m512i lo, hi;
} Quad;

static inline __attribute__((always_inline)) Quad quad_bytes(const int8_t *p, int n) {
    const __mmask64 m0 = n >= 2 ? ~0ull : n == 1 ? 0xFFFFFFFFull : 0, m1 = n >= 4 ? ~0ull : n == 3 ? 0xFFFFFFFFull : 0;
    const __m512i a = n >= 2 ? _mm512_loadu_si512((const void *)p) : _mm512_maskz_loadu_epi8(m0, p);
    const __m512i b = n >= 4 ? _mm512_loadu_si512((const void *)(p + 64)) : _mm512_maskz_loadu_epi8(m1, p + 64);
    return (Quad){_mm512_shuffle_i64x2(a, b, 0x88), _mm512_shuffle_i64x2(a, b, 0xDD)};
}

static const int32_t QUAD_LANES[16] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};

/* Four float16 scales (n of them there, the rest 0) as lanes: lanes 4 i .. 4 i + 3 hold scale i. */
static inline __attribute__((always_inline)) __m512 quad_scales(const uint16_t *p, int n) {
    const __m128i h = n == 4 ? _mm_loadl_epi64((const __m128i *)p) : _mm_maskz_loadu_epi16((__mmask8)((1u << n) - 1), p);
    return _mm512_permutexvar_ps(_mm512_loadu_si512((const void *)QUAD_LANES), _mm512_castps128_ps512(_mm_cvtph_ps(h)));
}

/* hsum's tree (native_vec.h) on four vectors at once: element 4 r of the result is v_r's sum.
 * a = lanes 0-7 + lanes 8-15, c = a 0-3 + a 4-7, then (c0 + c2) + (c1 + c3), each add as hsum does it. */
static inline __m512 sum4(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
    const __m512 a01 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, 0x44), _mm512_shuffle_f32x4(v0, v1, 0xEE));
    const __m512 a23 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, 0x44), _mm512_shuffle_f32x4(v2, v3, 0xEE));
    const __m512 c = _mm512_add_ps(_mm512_shuffle_f32x4(a01, a23, 0x88), _mm512_shuffle_f32x4(a01, a23, 0xDD));
    const __m512 e = _mm512_add_ps(c, _mm512_permute_ps(c, 0x4E)); /* (c0 + c2, c1 + c3, ..) in each 128 bits */
    return _mm512_add_ps(e, _mm512_permute_ps(e, 0xB1));          /* (c0 + c2) + (c1 + c3) in element 0 */
}

/* One row of x's quad of blocks: its bytes as Quad lays them out, where each lane's dot starts
 * (-128 x the lane's eight x bytes: the weight goes in as q + 128), and its four scales as lanes. */
typedef struct {
    Quad x;
    __m512i start;
    __m512 sx;
} XQuad;

static inline int quads(int K) { return (K / QBLOCK + 3) / 4; } /* of whole blocks; the last may hold 1-3 */

/* x's side of every quad of B rows, made once per span into the thread's own buffer. */
static const XQuad *x_quads(int B, int K, const int8_t *xq, const float *sx) {
    static __thread XQuad *buf;
    static __thread size_t have;
    const int nq = quads(K), whole = K / QBLOCK, G = qblocks(K);
    const size_t n = (size_t)B * nq;
    if (n > have) {
        free(buf);
        buf = aligned_alloc(64, (n ? n : 1) * sizeof(XQuad));
        have = buf ? n : 0;
        if (!buf) abort(); /* 2 bytes per input of x: out of memory here is out of memory everywhere */
    }
    const __m512i flip = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nq; h++) {
            const int in = whole - 4 * h < 4 ? whole - 4 * h : 4;
            const Quad x = quad_bytes(xq + (size_t)b * K + 4 * QBLOCK * h, in);
            const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, flip, x.lo), flip, x.hi);
            float four[4] = {0, 0, 0, 0};
            memcpy(four, sx + (size_t)b * G + 4 * h, sizeof(float) * (size_t)in);
            const __m512 sxq = _mm512_permutexvar_ps(_mm512_loadu_si512((const void *)QUAD_LANES),
                                                     _mm512_castps128_ps512(_mm_loadu_ps(four)));
            buf[(size_t)b * nq + h] = (XQuad){x, _mm512_sub_epi32(zero, s), sxq};
        }
    return buf;
}

/* Quad h (`in` whole blocks of it) of RB weight rows against NB rows of x (X: their quad h, nq apart). */
static inline __attribute__((always_inline)) void quad_step(int RB, int NB, int K, int G, int h, int in,
                                                            const XQuad *X, int nq, const int8_t *q,
                                                            const uint16_t *sw, __m512 acc[4][4]) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const int k = 4 * QBLOCK * h;
    for (int r = 0; r < RB; r++) {
        prefetch_l2(q + (size_t)(r + INT8_PREFETCH_ROWS) * K + k);
        prefetch_l2(q + (size_t)(r + INT8_PREFETCH_ROWS) * K + k + 64);
        const Quad w = quad_bytes(q + (size_t)r * K + k, in);
        const __m512i wlo = _mm512_xor_si512(w.lo, flip), whi = _mm512_xor_si512(w.hi, flip);
        const __m512 swq = quad_scales(sw + (size_t)r * G + 4 * h, in);
        for (int b = 0; b < NB; b++) {
            const XQuad *xb = X + (size_t)b * nq;
            const __m512i p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(xb->start, wlo, xb->x.lo), whi, xb->x.hi);
            const __m512 t = _mm512_cvtepi32_ps(p), d = _mm512_mul_ps(xb->sx, swq);
            acc[r][b] = in == 4 ? _mm512_fmadd_ps(t, d, acc[r][b])
                                : _mm512_mask3_fmadd_ps(t, d, acc[r][b], (__mmask16)((1u << (4 * in)) - 1));
        }
    }
}
#endif

/* RB weight rows (at q, their scales at sw) x NB rows of x: y[b, r] for each pair. `xp`: x_quads of
 * these rows of x (VNNI only). */
static inline __attribute__((always_inline)) void int8_block(int RB, int NB, int K, const int8_t *xq, const float *sx,
                                                             const void *xp, const int8_t *q, const uint16_t *sw,
                                                             float *y, int ldy) {
    const int G = qblocks(K);
    float lanes[4][4][16];
    int g0 = 0;
#if defined(TWOPOT_VNNI)
    const int nq = quads(K), whole = K / QBLOCK;
    const XQuad *X = xp;
    __m512 acc[4][4];
    for (int r = 0; r < RB; r++)
        for (int b = 0; b < NB; b++) acc[r][b] = _mm512_setzero_ps();
    for (int h = 0; h < nq; h++) /* the RB weight rows side by side: RB x NB chains of adds, none waiting on another */
        if (whole - 4 * h >= 4)
            quad_step(RB, NB, K, G, h, 4, X + h, nq, q, sw, acc);
        else /* the last 1-3 whole blocks */
            quad_step(RB, NB, K, G, h, whole - 4 * h, X + h, nq, q, sw, acc);
    if (RB == 4 && whole == G) { /* no short block: each x row's four sums at once, hsum's tree on each */
        for (int b = 0; b < NB; b++) {
            float out[16];
            _mm512_storeu_ps(out, sum4(acc[0][b], acc[1][b], acc[2][b], acc[3][b]));
            for (int r = 0; r < 4; r++) y[(size_t)b * ldy + r] = out[4 * r];
        }
        return;
    }
    for (int r = 0; r < RB; r++)
        for (int b = 0; b < NB; b++) _mm512_storeu_ps(lanes[r][b], acc[r][b]);
    g0 = whole;
#elif defined(TWOPOT_SDOT)
    const int whole = K / QBLOCK; /* whole blocks: two 16-byte signed dots into the same four lanes */
    float32x4_t acc[4][4][4];     /* [r][b][g % 4]: lanes 4 (g % 4) .. + 3 */
    for (int r = 0; r < RB; r++)
        for (int b = 0; b < NB; b++)
            for (int i = 0; i < 4; i++) acc[r][b][i] = vdupq_n_f32(0.0f);
    for (int g = 0; g < whole; g++) {
        const int k = QBLOCK * g;
        for (int r = 0; r < RB; r++) {
            prefetch_l2(q + (size_t)(r + INT8_PREFETCH_ROWS) * K + k);
            const int8x16_t w0 = vld1q_s8(q + (size_t)r * K + k), w1 = vld1q_s8(q + (size_t)r * K + k + 16);
            const float swg = half_float(sw[(size_t)r * G + g]);
            for (int b = 0; b < NB; b++) {
                const int8_t *xb = xq + (size_t)b * K + k;
                const int32x4_t p = vdotq_s32(vdotq_s32(vdupq_n_s32(0), vld1q_s8(xb), w0), vld1q_s8(xb + 16), w1);
                const float32x4_t d = vdupq_n_f32(sx[(size_t)b * G + g] * swg);
                acc[r][b][g & 3] = vfmaq_f32(acc[r][b][g & 3], vcvtq_f32_s32(p), d);
            }
        }
    }
    for (int r = 0; r < RB; r++)
        for (int b = 0; b < NB; b++)
            for (int i = 0; i < 4; i++) vst1q_f32(lanes[r][b] + 4 * i, acc[r][b][i]);
    g0 = whole;
#else
    for (int r = 0; r < RB; r++)
        for (int b = 0; b < NB; b++) memset(lanes[r][b], 0, sizeof lanes[r][b]);
#endif
    for (int r = 0; r < RB; r++) /* the short last block (all blocks on the plain path), then the sum */
        for (int b = 0; b < NB; b++) {
            int8_lanes(K, g0, xq + (size_t)b * K, q + (size_t)r * K, sx + (size_t)b * G, sw + (size_t)r * G, lanes[r][b]);
            y[(size_t)b * ldy + r] = hsum_lanes(lanes[r][b]);
        }
}

/* RB weight rows (4 or 1) against every row of x, four rows of x at a time. */
static inline __attribute__((always_inline)) void int8_rows(int RB, int B, int K, const int8_t *xq, const float *sx,
                                                            const void *xp, const int8_t *q, const uint16_t *sw,
                                                            float *y, int ldy) {
    const int G = qblocks(K);
    for (int b0 = 0; b0 < B; b0 += 4) {
        const int8_t *xb = xq + (size_t)b0 * K;
        const float *sb = sx + (size_t)b0 * G;
        float *yb = y + (size_t)b0 * ldy;
#if defined(TWOPOT_VNNI)
        const void *pb = (const XQuad *)xp + (size_t)b0 * quads(K);
#else
        const void *pb = xp;
#endif
        switch (B - b0 < 4 ? B - b0 : 4) {
            case 1: int8_block(RB, 1, K, xb, sb, pb, q, sw, yb, ldy); break;
            case 2: int8_block(RB, 2, K, xb, sb, pb, q, sw, yb, ldy); break;
            case 3: int8_block(RB, 3, K, xb, sb, pb, q, sw, yb, ldy); break;
            default: int8_block(RB, 4, K, xb, sb, pb, q, sw, yb, ldy); break;
        }
    }
}

/* Weight rows n0..n1-1 of y (B, N) = x @ W^T, x already rounded (xq, sx): 4 rows at a time from n0. */
static void int8_span(int B, int K, int n0, int n1, const int8_t *xq, const float *sx, const int8_t *q,
                      const uint16_t *sw, float *y, int ldy) {
    const size_t G = (size_t)qblocks(K);
#if defined(TWOPOT_VNNI)
    const void *xp = x_quads(B, K, xq, sx);
#else
    const void *xp = 0;
#endif
    int n = n0;
    for (; n + 4 <= n1; n += 4) int8_rows(4, B, K, xq, sx, xp, q + (size_t)n * K, sw + n * G, y + n, ldy);
    for (; n < n1; n++) int8_rows(1, B, K, xq, sx, xp, q + (size_t)n * K, sw + n * G, y + n, ldy);
}
