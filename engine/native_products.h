/* The native step's products (included by native_step.c, after its vector helpers).
 *
 * The float32 kernel, batch-invariant: every output element is summed over k in one order whatever
 * the number of rows, the other rows, or the columns a thread was given (native_crew.h).
 *   gemm_kmajor  float32, weight (K, N) row-major as the model keeps it: a streaming GEMV for
 *                1-4 rows, a 6 x 64 register block for more
 * The int8 products are native_int8.h's.
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
