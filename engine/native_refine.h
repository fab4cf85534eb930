/* The int8 LM head's refinement, and the int8 product whole (included by native_step.c, after
 * native_int8.h).
 *
 * Why: the LM head's rounding error lands on the logits directly, with no later layer to average it
 * out, so its input is rounded twice (quantize_rows_twice) and each row's REFINE_TOP largest logits
 * get the remainder's product added (refine_top): the top of the distribution, which sampling and
 * a KL divergence depend on, sees the input to about 16 bits, for a few dozen of the vocabulary's
 * rows of the weight. engine/int8_op.py emulates the same rule in torch; docs/benchmarks/int8-cpu.md
 * measures what it buys and costs.
 */

/* Each row of x (B, K) to 8 bits twice (the LM head's input): rows 0..B-1 of xq and sx as
 * quantize_rows rounds x, rows B..2B-1 what that rounding missed, r = x - xq sx (one fmaf: the exact
 * difference, rounded once), rounded to 8 bits over its own blocks. A pair stands for x to about 16
 * bits: a block of x whose largest value is 1 is off by at most 1/254 after the first rounding,
 * and by at most 1/254^2 after both. xq (2B, K), sx (2B, G). */
static void quantize_rows_twice(int B, int K, const float *x, int8_t *xq, float *sx) {
    const int G = qblocks(K);
    float r[QBLOCK];
    quantize_rows(B, K, x, xq, sx);
    for (int b = 0; b < B; b++)
        for (int g = 0; g < G; g++) {
            const int k0 = g * QBLOCK, n = K - k0 < QBLOCK ? K - k0 : QBLOCK;
            const float *xb = x + (size_t)b * K + k0, s = sx[(size_t)b * G + g];
            const int8_t *hi = xq + (size_t)b * K + k0;
            for (int k = 0; k < n; k++) r[k] = fmaf(-(float)hi[k], s, xb[k]);
            sx[(size_t)(B + b) * G + g] = quantize_block(r, n, xq + (size_t)(B + b) * K + k0);
        }
}

/* Each row's REFINE_TOP largest logits (the input rounded once) are refined. Below the top the
 * logits keep 8-bit inputs: their probabilities are too small to move sampling or a KL divergence much. */
#ifndef REFINE_TOP
#define REFINE_TOP 64
#endif

/* a ranks below b: a smaller value, or an equal one at a higher index (ties go to the lower index) */
static inline int ranks_below(const float *y, int a, int b) { return y[a] < y[b] || (y[a] == y[b] && a > b); }

/* One more candidate i for the n kept in the min-heap `top` (full): it replaces the root, the
 * lowest kept, if it is above it (equal: the lower index, already kept, stays), then sifts down. */
static inline void top_offer(const float *y, int n, int *top, int i) {
    if (!(y[i] > y[top[0]])) return;
    int at = 0;
    for (;;) {
        int c = 2 * at + 1;
        if (c >= n) break;
        if (c + 1 < n && ranks_below(y, top[c + 1], top[c])) c++;
        if (!ranks_below(y, top[c], i)) break;
        top[at] = top[c];
        at = c;
    }
    top[at] = i;
}

/* The indices of y's n largest values (N of them; ties to the lower index; a NaN never displaces a
 * number), in `top`, in no particular order: a min-heap of the n kept, its root the lowest. Past
 * the first n, 16 values at a time are compared with the root and skipped when none is above it,
 * which is nearly always once the heap holds the top of a long row. */
static int top_indices(const float *y, int N, int n, int *top) {
    n = n < N ? n : N;
    for (int i = 0; i < n; i++) { /* filling: sift each new one up */
        int at = i;
        while (at && ranks_below(y, i, top[(at - 1) / 2])) {
            top[at] = top[(at - 1) / 2];
            at = (at - 1) / 2;
        }
        top[at] = i;
    }
    int i = n;
    for (; i + 16 <= N; i += 16) {
        const v16i above = (v16i)(ld(y + i) > splat(y[top[0]]));
        int any = 0;
        for (int j = 0; j < 16; j++) any |= above[j];
        if (any)
            for (int j = i; j < i + 16; j++) top_offer(y, n, top, j);
    }
    for (; i < N; i++) top_offer(y, n, top, i);
    return n;
}

/* Rows b0..b1-1 of y (B, N), the input rounded once: each row's REFINE_TOP largest values plus the
 * remainder's product (rows B.. of xq and sx), each by the same kernel as every product. */
static void refine_top(int B, int b0, int b1, int K, int N, const int8_t *xq, const float *sx, const int8_t *q,
                       const uint16_t *sw, float *y, int ldy) {
    const size_t G = (size_t)qblocks(K);
    int top[REFINE_TOP];
    for (int b = b0; b < b1; b++) {
        float *yb = y + (size_t)b * ldy;
        const int8_t *lo = xq + (size_t)(B + b) * K;
        const float *slo = sx + (size_t)(B + b) * G;
        const int n = top_indices(yb, N, REFINE_TOP, top);
#if defined(TWOPOT_VNNI)
        const void *xp = x_quads(1, K, lo, slo);
#else
        const void *xp = 0;
#endif
        for (int t = 0; t < n; t++) {
            float r;
            int8_rows(1, 1, K, lo, slo, xp, q + (size_t)top[t] * K, sw + (size_t)top[t] * G, &r, 1);
            yb[top[t]] += r;
        }
    }
}

/* y (B, N) = x (B, K) @ W^T, W the int8 weight (q, sw); xq (B * K bytes) and sx (B * G floats) are
 * scratch, twice that with `refine` (the LM head's input rounded twice, then `refine_top`). */
static void gemm_int8(int B, int K, int N, const float *x, const int8_t *q, const uint16_t *sw, float *y, int ldy,
                      int8_t *xq, float *sx, int refine) {
    if (refine)
        quantize_rows_twice(B, K, x, xq, sx);
    else
        quantize_rows(B, K, x, xq, sx);
    int8_span(B, K, 0, N, xq, sx, q, sw, y, ldy);
    if (refine) refine_top(B, 0, B, K, N, xq, sx, q, sw, y, ldy);
}
