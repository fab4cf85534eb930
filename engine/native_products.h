/* The native step's products (included by native_step.c, after its vector helpers).
 *
 * Two kernels, both batch-invariant: every output element is summed over k in one order whatever
 * the number of rows, the other rows, or the columns a thread was given (native_crew.h).
 *   gemm_kmajor  float32, weight (K, N) row-major as the model keeps it: a streaming GEMV for
 *                1-4 rows, a 6 x 64 register block for more
 *   gemm_int8    int8 weight q (N, K) with a float32 scale per row: W8A8 through AVX-512 VNNI,
 *                ARM's dot-product instructions, or a plain integer loop
 */

#ifndef NPANEL
#define NPANEL 1024
#endif

/* Software prefetch into L2 (native_vec.h), PREFETCH_ROWS weight rows ahead of the rows being
 * read. One core keeps only so many cache misses in flight; asking early keeps the memory bus busy
 * (docs/benchmarks/native-cpu.md has what it gains). */
#ifndef PREFETCH_ROWS
#define PREFETCH_ROWS 8
#endif
#ifndef INT8_PREFETCH_ROWS /* int8 rows are read one after another: a row is a quarter of a float row */
#define INT8_PREFETCH_ROWS 16
#endif

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
 * kmajor_stream. `fetch`: prefetch the panel ahead (the block that reads it first); `pack`: also
 * store the panel there, (K, 64) contiguous, for the blocks after it. */
#define BLOCK_ROWS 6
#ifndef BLOCK_PREFETCH_ROWS /* the panel's k rows are a stride apart: ask early enough for DRAM's latency */
#define BLOCK_PREFETCH_ROWS 32
#endif
static inline __attribute__((always_inline)) void kmajor_block(int R, int K, const float *x, int ldx,
                                                               const float *w, int ldw, float *y, int ldy,
                                                               int fetch, float *pack) {
    v16 acc[BLOCK_ROWS][4];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < 4; v++) acc[r][v] = splat(0.0f);
    for (int k = 0; k < K; k++) {
        const float *wk = w + (size_t)k * ldw;
        if (fetch)
            for (int i = 0; i < 64; i += 16) prefetch_l2(wk + (size_t)BLOCK_PREFETCH_ROWS * ldw + i);
        v16 w0 = ld(wk), w1 = ld(wk + 16), w2 = ld(wk + 32), w3 = ld(wk + 48);
        keep4(w0, w1, w2, w3); /* loaded once, not folded into each row's FMA (native_vec.h) */
        if (pack) {
            float *pk = pack + (size_t)k * 64;
            st(pk, w0), st(pk + 16, w1), st(pk + 32, w2), st(pk + 48, w3);
        }
        for (int r = 0; r < R; r++) {
            const v16 xr = splat(x[(size_t)r * ldx + k]);
            acc[r][0] += xr * w0, acc[r][1] += xr * w1, acc[r][2] += xr * w2, acc[r][3] += xr * w3;
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < 4; v++) st(y + (size_t)r * ldy + 16 * v, acc[r][v]);
}

/* Weights whose k rows lie PACK_STRIDE_BYTES or more apart (an LM head: one row per vocab-wide
 * stride, each in its own pages) are copied, panel by panel, by the first block of rows as it reads
 * them, and the later blocks read that contiguous K x 64 copy. Nearer rows are read in place: there
 * the copy costs more than it saves (docs/benchmarks/native-cpu.md). */
#ifndef PACK_STRIDE_BYTES
#define PACK_STRIDE_BYTES (64 << 10)
#endif

/* A buffer of at least `floats`, kept in *buf between calls and grown on demand; NULL if out of
 * memory. Each user keeps its own thread-local *buf, so threads never share one. */
static float *grow_floats(float **buf, size_t *have, size_t floats) {
    if (floats > *have) {
        free(*buf);
        *buf = aligned_alloc(64, (floats * sizeof(float) + 63) & ~(size_t)63);
        *have = *buf ? floats : 0;
    }
    return *buf;
}

/* The calling thread's panel copy, K x 64 floats. */
static float *panel_buffer(int K) {
    static __thread float *buf;
    static __thread size_t have;
    return grow_floats(&buf, &have, (size_t)K * 64);
}

static void gemm_kmajor(int B, int K, int N, const float *x, int ldx, const float *w, int ldw, float *y, int ldy) {
    switch (B) {
        case 1: kmajor_stream(1, K, N, x, ldx, w, ldw, y, ldy); return;
        case 2: kmajor_stream(2, K, N, x, ldx, w, ldw, y, ldy); return;
        case 3: kmajor_stream(3, K, N, x, ldx, w, ldw, y, ldy); return;
        case 4: kmajor_stream(4, K, N, x, ldx, w, ldw, y, ldy); return;
    }
    const int N64 = N & ~63;
    float *pack = B > BLOCK_ROWS && (size_t)ldw * sizeof(float) >= PACK_STRIDE_BYTES ? panel_buffer(K) : NULL;
    for (int n0 = 0; n0 < N64; n0 += 64) {
        for (int b0 = 0; b0 < B; b0 += BLOCK_ROWS) {
            const float *xb = x + (size_t)b0 * ldx;
            const int first = b0 == 0, lw = pack && !first ? 64 : ldw;
            const float *wp = pack && !first ? pack : w + n0;
            float *yb = y + (size_t)b0 * ldy + n0, *to = first ? pack : NULL;
            switch (B - b0 < BLOCK_ROWS ? B - b0 : BLOCK_ROWS) {
                case 1: kmajor_block(1, K, xb, ldx, wp, lw, yb, ldy, first, to); break;
                case 2: kmajor_block(2, K, xb, ldx, wp, lw, yb, ldy, first, to); break;
                case 3: kmajor_block(3, K, xb, ldx, wp, lw, yb, ldy, first, to); break;
                case 4: kmajor_block(4, K, xb, ldx, wp, lw, yb, ldy, first, to); break;
                case 5: kmajor_block(5, K, xb, ldx, wp, lw, yb, ldy, first, to); break;
                default: kmajor_block(6, K, xb, ldx, wp, lw, yb, ldy, first, to); break;
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
 * xq is stored as xu = xq + 128 (unsigned) and 128 * rowsum[n] is taken off again; ARM's sdot
 * (s8 x s8, 16 pairs) takes xu - 128 back. Integer sums are exact, so the result does not depend
 * on the order of k, nor on the other rows, nor on the CPU. */
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
#if defined(TWOPOT_VNNI)
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
#elif defined(TWOPOT_SDOT)
    if ((K & 15) == 0) { /* signed x signed dots, 16 pairs an instruction: xu - 128 (its top bit flipped) against q */
        int32x4_t acc[4][4];
        for (int r = 0; r < RB; r++)
            for (int b = 0; b < NB; b++) acc[r][b] = vdupq_n_s32(0);
        for (int k = 0; k < K; k += 16) {
            int8x16_t wv[4];
            for (int r = 0; r < RB; r++) {
                prefetch_l2(q + (size_t)(r + INT8_PREFETCH_ROWS) * K + k);
                wv[r] = vld1q_s8(q + (size_t)r * K + k);
            }
            for (int b = 0; b < NB; b++) {
                const int8x16_t xv = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(xu + (size_t)b * K + k), vdupq_n_u8(0x80)));
                for (int r = 0; r < RB; r++) acc[r][b] = vdotq_s32(acc[r][b], xv, wv[r]);
            }
        }
        for (int r = 0; r < RB; r++) /* + 128 rowsum: the unsigned form's sum, as below takes it (exact in int32) */
            for (int b = 0; b < NB; b++) sums[r][b] = vaddvq_s32(acc[r][b]) + 128 * rowsum[r];
        k0 = K;
    } else
        for (int r = 0; r < RB; r++)
            for (int b = 0; b < NB; b++) sums[r][b] = 0;
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
