/* The model's pass in one call, in C: decode steps (the soup pot) and prompts (the wok).
 *
 * Why: a batch-1 decode step of a small model is ~150 small operations between a few weight
 * streams. Run one torch op at a time, each pays Python and dispatch (a few microseconds), which
 * on the chef is most of the step; torch's fp32 GEMV streams the weights at well under what one
 * core can read, and its GEMM at many rows reaches about 70% of a kernel shaped for these
 * matrices. Here a pass is one call: every layer's norm, projections, RoPE, K/V write, attention
 * and MLP, then the LM head for the rows that sample, over buffers made once. engine/native.py
 * builds this file with the machine's C compiler (-O3, tuned for this CPU), loads it with ctypes and
 * hands it pointers to the model's own weights and KV seats; nothing is copied.
 *
 * The math is the model's (engine/model.py, engine/attention.py, engine/layers.py), row for row:
 * tests/test_native.py holds it to the eager forward and to transformers.
 *
 * Layouts (as the model keeps them):
 *   float32 weight    (in, out) row-major, used as y = x @ W          -> gemm_kmajor
 *   int8 weight       q (out, in) row-major, scale (out, in / 32) float16, a scale per 32 inputs -> gemm_int8
 *   KV seats, a layer (S, Hkv, T, D); row b sits in seat seat[b] and writes slot pos[b]
 *   RoPE tables       cos, sin (ctx, D), sin's first half negated (rotate_half folded in)
 *
 * Every output element of a product is summed over k in the same order whatever the batch, so a
 * decode row's logits are the same bits alone or beside other rows.
 *
 * Included pieces: native_vec.h (the vectors, and what differs by CPU), native_contract.h (the
 * structs Python hands over and the checks of every length), native_products.h (the products),
 * native_int8.h (the int8 products), native_refine.h (the int8 LM head's refinement), native_crew.h
 * (the threads), native_attention.h (attention).
 */
#include "native_vec.h"

#include "native_contract.h"

#ifndef QTILE /* prompt rows whose attention shares one pass over the keys */
#define QTILE 32
#endif

#include "native_products.h"

#include "native_int8.h"

#include "native_refine.h"

#include "native_crew.h"

typedef struct {
    const Model *m;
    const Linear *L;
    int B, K, N, refine;
    const float *x;
    float *y;
    const int8_t *xq;
    const float *sx;
} LinearJob;

/* Share t of T of one product: a run of 64-column panels (float32) or of 4-row groups (int8). */
static void linear_share(const void *job, int t, int T) {
    const LinearJob *j = job;
    int a, b;
    if (j->m->int8) {
        crew_share((j->N + 3) / 4, t, T, &a, &b);
        const int n1 = 4 * b < j->N ? 4 * b : j->N;
        int8_span(j->B, j->K, 4 * a, n1, j->xq, j->sx, j->L->w.p, j->L->scale.p, j->y, j->N);
    } else {
        crew_share((j->N + 63) / 64, t, T, &a, &b);
        const int n0 = 64 * a, n1 = 64 * b < j->N ? 64 * b : j->N;
        if (n1 > n0) gemm_kmajor(j->B, j->K, n1 - n0, j->x, j->K, (const float *)j->L->w.p + n0, j->N, j->y + n0, j->N);
    }
}

/* Share t of T of the LM head's refinement (native_refine.h refine_top): a run of rows. */
static void refine_share(const void *job, int t, int T) {
    const LinearJob *j = job;
    int a, b;
    crew_share(j->B, t, T, &a, &b);
    refine_top(j->B, a, b, j->K, j->N, j->xq, j->sx, j->L->w.p, j->L->scale.p, j->y, j->N);
}

/* y (B, N) = x (B, K) @ W (+ bias), on T threads (native_crew.h). `refine` (int8, the LM head): x is
 * rounded twice (quantize_rows_twice, so xq and sx hold 2B rows) and each row's largest outputs
 * refined (refine_top) before the bias. */
static void linear(const Model *m, const Linear *L, int B, int K, int N, const float *x, float *y, int8_t *xq,
                   float *sx, int T, int refine) {
    refine = refine && m->int8;
    if (refine) /* once, before the rows are shared */
        quantize_rows_twice(B, K, x, xq, sx);
    else if (m->int8)
        quantize_rows(B, K, x, xq, sx);
    const LinearJob job = {m, L, B, K, N, refine, x, y, xq, sx};
    crew_run(T, linear_share, &job);
    if (refine) crew_run(T, refine_share, &job);
    const float *bias = L->bias.p;
    if (bias)
        for (int b = 0; b < B; b++)
            for (int n = 0; n < N; n++) y[(size_t)b * N + n] += bias[n];
}

/* ---- the small operations ------------------------------------------------------------------ */
static void norm(const Model *m, int B, const float *x, Buf wb, Buf bb, float *y) {
    const int d = m->d;
    const float *w = wb.p, *bias = bb.p;
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
    Why quiet = {0, 0};
    if (B < 1 || seat_len < 1 || check_model(&quiet, m)) return -1;
    const long qkv = (long)(m->n_heads + 2 * m->n_kv_heads) * m->head_dim;
    const long up = (m->gated ? 2L : 1L) * m->ffn;
    const long G = m->n_heads / m->n_kv_heads;
    long widest = m->d > m->ffn ? m->d : m->ffn;
    widest = widest > (long)m->n_heads * m->head_dim ? widest : (long)m->n_heads * m->head_dim;
    return B * (2L * m->d + qkv + (long)m->n_heads * m->head_dim + up + m->ffn) + QTILE * G * seat_len +
           16L * m->head_dim + B * (long)qblocks((int)widest) + (B * widest + 3) / 4;
}

/* One group of at most `cap` rows through every layer: row b feeds token tok[b] at position pos[b]
 * of the sequence in seat seat[b]. Each row writes its K/V into slot pos[b] before it attends to
 * slots 0..pos[b], so rows of one seat in ascending positions -- a prompt chunk -- see each other
 * causally, exactly as if they had been fed one step at a time. Leaves the rows' hidden states in x. */
static void layers_pass(const Model *m, int B, const int64_t *tok, const int64_t *pos, const int64_t *seat,
                        const Buf *k_seats, const Buf *v_seats, int seat_len, float *scratch, int cap, int T) {
    const int d = m->d, H = m->n_heads, Hkv = m->n_kv_heads, D = m->head_dim, G = H / Hkv, F = m->ffn;
    const int qd = H * D, kvd = Hkv * D, nqkv = qd + 2 * kvd, nup = m->gated ? 2 * F : F;
    /* scratch, laid out for `cap` rows: x, h (cap, d), qkv, att, up, act, scores (G, seat_len), sx, xq */
    float *x = scratch, *h = x + (size_t)cap * d, *qkv = h + (size_t)cap * d, *att = qkv + (size_t)cap * nqkv;
    float *up = att + (size_t)cap * qd, *act = up + (size_t)cap * nup, *scores = act + (size_t)cap * F;
    float *kt = scores + (size_t)QTILE * G * seat_len; /* a block of 16 keys, transposed (D, 16) */
    const int widest = d > F ? (d > qd ? d : qd) : (F > qd ? F : qd);
    float *sx = kt + (size_t)16 * D;                          /* int8: each row's block scales, cap * qblocks(widest) */
    int8_t *xq = (int8_t *)(sx + (size_t)cap * qblocks(widest)); /* int8: the rows rounded to 8 bits, cap * widest */
    int run_at[B + 1]; /* attention: where each run of rows starts (a decode row, or a chunk of <= QTILE) */
    int missed[CREW_MAX] = {0};

    for (int b = 0; b < B; b++) { /* the embedding, plus GPT-2's learned position */
        float *xb = x + (size_t)b * d;
        if (!m->tied)
            memcpy(xb, (const float *)m->embed.p + (size_t)tok[b] * d, sizeof(float) * d);
        else
            for (int i = 0; i < d; i++) xb[i] = ((const float *)m->embed_cols.p)[(size_t)i * m->vocab + tok[b]];
        if (!m->rope)
            for (int i = 0; i < d; i++) xb[i] += ((const float *)m->wpe.p)[(size_t)pos[b] * d + i];
    }
    for (int l = 0; l < m->n_layers; l++) {
        const Layer *L = (const Layer *)m->layers.p + l;
        norm(m, B, x, L->norm1_w, L->norm1_b, h);
        linear(m, &L->qkv, B, d, nqkv, h, qkv, xq, sx, T, 0); /* (B, q | k | v) */
        for (int b = 0; b < B; b++) { /* RoPE, then this token's K/V into its seat, slot pos[b] */
            float *row = qkv + (size_t)b * nqkv;
            const size_t p = (size_t)pos[b], st_ = (size_t)seat[b];
            if (m->rope)
                for (int hh = 0; hh < H + Hkv; hh++) /* q heads then k heads, side by side */
                    rope_head(row + (size_t)hh * D, (const float *)m->rope_cos.p + p * D, (const float *)m->rope_sin.p + p * D, D);
            for (int kh = 0; kh < Hkv; kh++) {
                const size_t at = ((st_ * Hkv + kh) * seat_len + p) * D;
                memcpy((float *)k_seats[l].p + at, row + qd + (size_t)kh * D, sizeof(float) * D);
                memcpy((float *)v_seats[l].p + at, row + qd + kvd + (size_t)kh * D, sizeof(float) * D);
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
        linear(m, &L->out, B, qd, d, att, h, xq, sx, T, 0);
        for (size_t i = 0; i < (size_t)B * d; i++) x[i] += h[i];
        norm(m, B, x, L->norm2_w, L->norm2_b, h);
        linear(m, &L->up, B, d, nup, h, up, xq, sx, T, 0);
        for (int b = 0; b < B; b++) {
            const float *ub = up + (size_t)b * nup;
            float *ab = act + (size_t)b * F;
            int i = 0;
            if (m->act != 1) /* SiLU and tanh-GELU sixteen at a time; erf-GELU stays scalar */
                for (; i + 16 <= F; i += 16) st(ab + i, m->gated ? activate16(m->act, ld(ub + i)) * ld(ub + F + i)
                                                                   : activate16(m->act, ld(ub + i)));
            for (; i < F; i++) ab[i] = m->gated ? activate(m->act, ub[i]) * ub[F + i] : activate(m->act, ub[i]);
        }
        linear(m, &L->down, B, F, d, act, h, xq, sx, T, 0);
        for (size_t i = 0; i < (size_t)B * d; i++) x[i] += h[i];
    }
}

/* One pass of B rows (any mix of decode rows and prompt chunks), `cap` rows at a time: scratch holds
 * twopot_scratch_floats(m, cap, seat_len). A group runs every layer before the next group starts,
 * so a later group's rows find the earlier ones' K/V in the seats: a 512-token prompt at cap 64 is
 * eight chunks of chunked prefill. Logits (n_out, V) are made only for rows out[0] < out[1] < ...
 * (the rows that sample); out NULL: every row, logits (B, V). The products and attention run on
 * `threads` threads (native_crew.h), the rest on the caller's.
 * Returns 0, or 1 with one line in `why` if a buffer breaks the contract (native_contract.h) or a
 * position, seat or token is out of range; nothing is written then. */
int twopot_step(const Model *m, const Pass *p, char *why_text, int why_len) {
    Why why = {why_text, why_len};
    if (check_pass(&why, m, p)) return 1;
    const int B = p->rows, n_out = p->n_out, cap = p->cap, seat_len = p->seat_len;
    const int64_t *tok = p->tok.p, *pos = p->pos.p, *seat = p->seat.p, *out = p->out.p;
    for (int b = 0; b < B; b++)
        if (pos[b] < 0 || pos[b] >= seat_len || pos[b] >= m->max_context || tok[b] < 0 || tok[b] >= m->vocab ||
            seat[b] < 0 || seat[b] >= p->seats)
            return refuse(&why, "row %d: position %lld, seat %lld or token %lld is outside the pool (seat_len %d, %d seats)"
                          " or the vocabulary (%d)", b, (long long)pos[b], (long long)seat[b], (long long)tok[b],
                          seat_len, p->seats, m->vocab);
    for (int i = 0; i < (out ? n_out : 0); i++)
        if (out[i] < 0 || out[i] >= B || (i && out[i] <= out[i - 1]))
            return refuse(&why, "out[%d] = %lld: the rows that sample must ascend within 0..%d", i, (long long)out[i], B - 1);
    const int d = m->d, T = crew_begin(p->threads);
    float *scratch = (float *)p->scratch.p, *logits = (float *)p->logits.p;
    float *x = scratch, *h = x + (size_t)cap * d;
    int next = 0; /* the next output row's index into out */
    for (int g0 = 0; g0 < B; g0 += cap) {
        const int n = B - g0 < cap ? B - g0 : cap;
        layers_pass(m, n, tok + g0, pos + g0, seat + g0, p->k.p, p->v.p, seat_len, scratch, cap, T);
        /* the group's sampling rows, packed to the front of x, through the final norm and the LM head */
        int r = 0;
        if (!out)
            r = n;
        else
            for (; next < n_out && out[next] < g0 + n; next++, r++)
                if (out[next] - g0 != r) memmove(x + (size_t)r * d, x + (size_t)(out[next] - g0) * d, sizeof(float) * d);
        if (!r) continue;
        /* h's rows are free again: the LM head's own scratch follows them, x rounded twice: 2r rows
         * (2r G floats of scales, then 2r d bytes), inside the qkv rows' cap x (q | k | v) floats */
        float *sx = h + (size_t)cap * d;
        norm(m, r, x, m->final_w, m->final_b, h);
        linear(m, &m->lm_head, r, d, m->vocab, h, logits + (size_t)(out ? next - r : g0) * m->vocab,
               (int8_t *)(sx + (size_t)2 * r * qblocks(d)), sx, T, 1);
    }
    crew_end(T);
    return 0;
}

/* One product alone: y = x @ W, float32 or int8 (W8A8 in 32-wide blocks). The model's forward runs
 * its int8 products here too (engine/int8_op.py), so a row gets the same numbers in every pass; the
 * bench's kernel ceilings time the float32 one. Returns 0, or 1 with one line in `why`. */
int twopot_product(const Product *p, char *why_text, int why_len) {
    Why why = {why_text, why_len};
    if (check_product(&why, p)) return 1;
    if (p->int8)
        gemm_int8(p->rows, p->depth, p->cols, p->x.p, p->w.p, p->scale.p, (float *)p->y.p, p->cols,
                  (int8_t *)p->xq.p, (float *)p->sx.p, p->refine);
    else
        gemm_kmajor(p->rows, p->depth, p->cols, p->x.p, p->depth, p->w.p, p->cols, (float *)p->y.p, p->cols);
    return 0;
}

/* Attention alone, as a pass runs it (for the tests on every CPU): one decode row, or a prompt chunk. */
int twopot_attention(const Attention *a, char *why_text, int why_len) {
    Why why = {why_text, why_len};
    if (check_attention(&why, a)) return 1;
    const int R = a->rows, G = a->G, D = a->D;
    float *scores = (float *)a->scratch.p, *kt = scores + (size_t)R * G * (a->p0 + R);
    if (R == 1)
        attend(a->q.p, a->keys.p, a->values.p, a->p0 + 1, G, D, scores, (float *)a->out.p);
    else
        attend_chunk(a->q.p, G * D, R, a->p0, a->keys.p, a->values.p, G, D, scores, kt, (float *)a->out.p, G * D);
    return 0;
}

/* The instruction set this build was made for, in words: "AVX-512 VNNI", "NEON dotprod", "portable C". */
const char *twopot_isa(void) { return TWOPOT_ISA; }
