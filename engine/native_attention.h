/* The native step's attention (included by native_step.c, after the products and the crew).
 *
 *   attend        one decode row against its seat's slots 0..pos, per KV head
 *   attend_chunk  a prompt chunk of up to QTILE rows of one seat, sixteen keys at a time
 *   attention     a pass's units (a row or a chunk, against one KV head) shared by the crew
 */

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
static inline __attribute__((always_inline)) void softmax_values(float *sg, const float *values, int n, int D, float *og) {
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

/* One row's attention for one KV head: G query heads against slots 0..n-1 of its seat. Inlined into
 * the pass's attention units, the decode path, though twopot_attention (the tests' entry) calls it too. */
static inline __attribute__((always_inline)) void attend(const float *q, const float *keys, const float *values,
                                                         int n, int G, int D, float *scores, float *out) {
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

/* A pass's attention, shared by the crew like a product: unit u is run u / Hkv (a decode row or a
 * prompt chunk of up to QTILE rows, run_at[r] .. run_at[r + 1]) against KV head u % Hkv. A unit's
 * arithmetic is the same on any thread, so the bits do not depend on the threads. Share 0 uses the
 * pass's scratch, the crew's threads a buffer of their own; a thread that cannot get one marks its
 * share `missed`, and the caller runs it after the others. */
typedef struct {
    const Model *m;
    int l;
    const int64_t *pos, *seat;
    const Buf *k_seats, *v_seats; /* (n_layers,) a layer's seats each */
    int seat_len;
    const float *qkv;
    float *att;
    const int *run_at;
    int units;
    float *scores, *kt; /* share 0's */
    int *missed;        /* (CREW_MAX,) */
} AttendJob;

static void attend_units(const AttendJob *j, int a, int b, float *scores, float *kt) {
    const Model *m = j->m;
    const int H = m->n_heads, Hkv = m->n_kv_heads, D = m->head_dim, G = H / Hkv;
    const int qd = H * D, nqkv = qd + 2 * Hkv * D, l = j->l;
    for (int u = a; u < b; u++) {
        const int r = u / Hkv, kh = u % Hkv, row = j->run_at[r], R = j->run_at[r + 1] - row;
        const size_t at = ((size_t)j->seat[row] * Hkv + kh) * j->seat_len * D;
        const float *qh = j->qkv + (size_t)row * nqkv + (size_t)kh * G * D;
        float *oh = j->att + (size_t)row * qd + (size_t)kh * G * D;
        const float *keys = (const float *)j->k_seats[l].p + at, *values = (const float *)j->v_seats[l].p + at;
        if (R == 1)
            attend(qh, keys, values, (int)j->pos[row] + 1, G, D, scores, oh);
        else
            attend_chunk(qh, nqkv, R, (int)j->pos[row], keys, values, G, D, scores, kt, oh, qd);
    }
}

static void attend_share(const void *arg, int t, int T) {
    static __thread float *buf;
    static __thread size_t have;
    const AttendJob *j = arg;
    int a, b;
    crew_share(j->units, t, T, &a, &b);
    if (a == b) return;
    if (t == 0) {
        attend_units(j, a, b, j->scores, j->kt);
        return;
    }
    const size_t n_scores = (size_t)QTILE * (j->m->n_heads / j->m->n_kv_heads) * j->seat_len;
    float *scores = grow_floats(&buf, &have, n_scores + 16 * (size_t)j->m->head_dim);
    if (scores)
        attend_units(j, a, b, scores, scores + n_scores);
    else
        j->missed[t] = 1;
}

/* All of a pass's attention for layer l, on T threads. */
static void attention(const AttendJob *job, int T) {
    crew_run(T, attend_share, job);
    for (int t = 1; t < T; t++)
        if (job->missed[t]) {
            int a, b;
            crew_share(job->units, t, T, &a, &b);
            attend_units(job, a, b, job->scores, job->kt);
            job->missed[t] = 0;
        }
}
