/* The contract between Python and the native step: every buffer Python hands to C, its element
 * type, its shape, and when it is needed, in tables both sides read.
 *
 * Python (engine/native_contract.py) parses the TWOPOT_* tables below, builds its ctypes mirror of
 * these structs from them, and checks every tensor against them before a call. C checks every length
 * it is handed against the same tables at its boundary (twopot_step and the other entries), so a
 * wrong buffer is refused with one line naming it, never read past its end. A test holds the
 * mirror's layout to this file's (twopot_layout).
 *
 * A buffer travels as a Buf: its address, its length in elements and its element type. A table
 * row X(field, type, need, dim, ...) says: `field` holds `type` elements, dim x dim x ... of them
 * (each dim a config name or a derived one, TWOPOT_DIMS; a Linear's are din inputs and dout
 * outputs, from the LINEARS tables), when `need` holds. need is 1 (always), a config flag, !flag,
 * or OPT (may be absent; when present, exactly this). A row whose need does not hold is not read.
 * Each struct lays out its tables' rows in order: the CONFIG ints, the REALS, the BUFFERS (a field
 * named twice is one field), then the LINEARS.
 *
 * Worked example, the chef (d 256, 8 heads, 4 KV heads of 32): layers[0].qkv.w is F32 (d, nqkv) =
 * (256, 512), 131,072 floats; in int8 it is I8 (nqkv, d), with scale F16 (nqkv, (d + 31) / 32) =
 * (512, 8): a float16 scale per 32 inputs, as llama.cpp's Q8_0 blocks (native_int8.h). `/` in a
 * dimension is C's integer division.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

typedef enum { F32 = 1, I8, I32, I64, U8, BUF, LAYER, F16 } BufType; /* F16: IEEE half, as uint16_t bits */
typedef struct {
    const void *p; /* NULL: absent */
    int64_t n;     /* elements */
    int32_t type;  /* BufType */
} Buf;

typedef struct {
    Buf w, scale, bias;
} Linear;

typedef struct {
    Buf norm1_w, norm1_b, norm2_w, norm2_b; /* biases: LayerNorm only */
    Linear qkv, out, up, down;
} Layer;

typedef struct {
    int d, n_layers, n_heads, n_kv_heads, head_dim, ffn, vocab, max_context;
    int layer_norm; /* 0: RMSNorm, 1: LayerNorm with bias */
    int act;        /* 0: silu, 1: gelu (erf), 2: gelu (tanh) */
    int gated;      /* SwiGLU: the up projection is gate | up */
    int rope;       /* 1: RoPE tables, 0: learned positions (wpe) */
    int int8;       /* the Linear weights are int8 */
    int tied;       /* no embedding table: a token's embedding is a column of the float32 LM head */
    float eps;
    Buf embed, embed_cols, wpe, rope_cos, rope_sin, final_w, final_b;
    Buf layers; /* (n_layers,) Layer */
    Linear lm_head;
} Model;

/* One pass: row b feeds tok[b] at pos[b] of the sequence in seat seat[b]; logits for rows out[] */
typedef struct {
    int rows, n_out, seats, seat_len, cap, threads;
    Buf tok, pos, seat, out, logits, k, v, scratch; /* k, v: (n_layers,) Buf, a layer's seats each */
} Pass;

/* y = x @ W: float32 W (depth, cols), or int8 W (cols, depth) with a scale per 32 inputs; `refine`
 * (int8): x is rounded to 8 bits twice, as the LM head's input is (native_refine.h) */
typedef struct {
    int rows, depth, cols, int8, refine;
    Buf x, w, scale, y, xq, sx;
} Product;

/* rows consecutive queries of one seat at positions p0.., G query heads on one KV head of size D */
typedef struct {
    int rows, p0, G, D;
    Buf q, keys, values, out, scratch;
} Attention;

#define OPT (-1)
#define TWOPOT_MODEL_CONFIG(C) C(d) C(n_layers) C(n_heads) C(n_kv_heads) C(head_dim) C(ffn) C(vocab) \
    C(max_context) C(layer_norm) C(act) C(gated) C(rope) C(int8) C(tied)
#define TWOPOT_MODEL_REALS(C) C(eps)
#define TWOPOT_DIMS(D) D(qd, n_heads * head_dim) D(nqkv, (n_heads + 2 * n_kv_heads) * head_dim) \
    D(nup, (gated + 1) * ffn)
#define TWOPOT_MODEL_BUFFERS(X) X(embed, F32, !tied, vocab, d) X(embed_cols, F32, tied, d, vocab) \
    X(wpe, F32, !rope, max_context, d) X(rope_cos, F32, rope, max_context, head_dim)          \
    X(rope_sin, F32, rope, max_context, head_dim) X(final_w, F32, 1, d) X(final_b, F32, layer_norm, d) \
    X(layers, LAYER, 1, n_layers)
#define TWOPOT_MODEL_LINEARS(L) L(lm_head, d, vocab)
#define TWOPOT_LAYER_BUFFERS(X) X(norm1_w, F32, 1, d) X(norm1_b, F32, layer_norm, d) \
    X(norm2_w, F32, 1, d) X(norm2_b, F32, layer_norm, d)
#define TWOPOT_LAYER_LINEARS(L) L(qkv, d, nqkv) L(out, qd, d) L(up, d, nup) L(down, ffn, d)
#define TWOPOT_LINEAR_BUFFERS(X) X(w, F32, !int8, din, dout) X(w, I8, int8, dout, din) \
    X(scale, F16, int8, dout, (din + 31) / 32) X(bias, F32, OPT, dout)
#define TWOPOT_PASS_CONFIG(C) C(rows) C(n_out) C(seats) C(seat_len) C(cap) C(threads)
#define TWOPOT_PASS_BUFFERS(X) X(tok, I64, 1, rows) X(pos, I64, 1, rows) X(seat, I64, 1, rows) \
    X(out, I64, OPT, n_out) X(logits, F32, 1, n_out, vocab) X(k, BUF, 1, n_layers)             \
    X(v, BUF, 1, n_layers) X(scratch, F32, 1, scratch_floats)
#define TWOPOT_SEAT_BUFFERS(X) X(seats, F32, 1, seats, n_kv_heads, seat_len, head_dim)
#define TWOPOT_PRODUCT_CONFIG(C) C(rows) C(depth) C(cols) C(int8) C(refine)
#define TWOPOT_PRODUCT_BUFFERS(X) X(x, F32, 1, rows, depth) X(w, F32, !int8, depth, cols) \
    X(w, I8, int8, cols, depth) X(scale, F16, int8, cols, (depth + 31) / 32) X(y, F32, 1, rows, cols) \
    X(xq, I8, int8, (refine + 1) * rows, depth) X(sx, F32, int8, (refine + 1) * rows, (depth + 31) / 32)
#define TWOPOT_ATTENTION_CONFIG(C) C(rows) C(p0) C(G) C(D)
#define TWOPOT_ATTENTION_BUFFERS(X) X(q, F32, 1, rows, G, D) X(keys, F32, 1, p0 + rows, D) \
    X(values, F32, 1, p0 + rows, D) X(out, F32, 1, rows, G, D) X(scratch, F32, 1, attention_floats)

/* ---- the checks: one line into the caller's `why` buffer, and a nonzero return ------------- */
typedef struct {
    char *text;
    int len;
} Why;

static int refuse(Why *why, const char *fmt, ...) {
    if (why->text && why->len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why->text, (size_t)why->len, fmt, ap);
        va_end(ap);
    }
    return 1;
}

static const char *type_name(int t) {
    static const char *names[] = {"?", "float32", "int8", "int32", "int64", "uint8", "buffer", "layer", "float16"};
    return t >= 0 && t <= F16 ? names[t] : "?";
}

/* Where a buffer sits, spelled only when a check fails: {"layers", 3, "qkv."} is "layers[3].qkv.". */
typedef struct {
    const char *name;
    int index; /* -1: none */
    const char *sub;
} Where;

/* One table row against the Buf handed: dims (ndim of them, named `shape`) multiply to its length. */
static int check_buf(Why *why, Where at, const char *field, const Buf *b, int type, int64_t need, const char *shape,
                     const int64_t *dims, int ndim) {
    if (need == 0 || (!b->p && need == OPT)) return 0;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n = n >= 0 && dims[i] >= 0 && (!dims[i] || n <= INT64_MAX / dims[i]) ? n * dims[i] : -1;
    if (b->p && b->type == type && b->n == n && n >= 0) return 0;
    if (!b->p && n == 0 && b->n == 0) return 0; /* nothing to read or write: no address needed */
    char place[96];
    if (at.index >= 0)
        snprintf(place, sizeof place, "%s[%d].%s%s", at.name, at.index, at.sub, field);
    else
        snprintf(place, sizeof place, "%s%s%s", at.name, at.sub, field);
    if (!b->p) return refuse(why, "%s is missing: the contract wants %s (%s)", place, type_name(type), shape);
    return refuse(why, "%s: %lld %s handed, the contract wants %lld %s (%s)", place, (long long)b->n,
                  type_name(b->type), (long long)n, type_name(type), shape);
}

#define TWOPOT_LOCAL(name) const int64_t name = s->name; (void)name;
#define TWOPOT_DIM(name, expr) const int64_t name = expr; (void)name;
#define TWOPOT_CHECK(field, type, need, ...)                                                                  \
    if (check_buf(why, at, #field, &s->field, type, need, #__VA_ARGS__, (const int64_t[]){__VA_ARGS__},      \
                  (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t))))                          \
        return 1;

static int check_linear(Why *why, Where at, const Linear *s, int64_t int8, int64_t din, int64_t dout) {
    TWOPOT_LINEAR_BUFFERS(TWOPOT_CHECK)
    return 0;
}

#define TWOPOT_CHECK_LINEAR(field, din_, dout_)                                                               \
    if (check_linear(why, (Where){at.name, at.index, #field "."}, &s->field, int8, din_, dout_)) return 1;

/* The config first (every dimension 1..2^24, the flags 0 or 1), then every buffer of the model. */
static int check_model(Why *why, const Model *m) {
    const Where at = {"", -1, ""};
    const Model *s = m;
    TWOPOT_MODEL_CONFIG(TWOPOT_LOCAL)
    TWOPOT_DIMS(TWOPOT_DIM)
    const int dims[] = {m->d, m->n_layers, m->n_heads, m->n_kv_heads, m->head_dim, m->ffn, m->vocab, m->max_context};
    for (int i = 0; i < 8; i++)
        if (dims[i] < 1 || dims[i] > (1 << 24)) return refuse(why, "model config: a dimension is %d (1..2^24)", dims[i]);
    if (m->n_heads % m->n_kv_heads || (m->rope && m->head_dim % 2) || m->act < 0 || m->act > 2 ||
        (m->layer_norm | m->gated | m->rope | m->int8 | m->tied) & ~1 || !(m->eps >= 0.0f))
        return refuse(why, "model config: heads %d / kv heads %d, head_dim %d, act %d or a flag is out of range",
                      m->n_heads, m->n_kv_heads, m->head_dim, m->act);
    TWOPOT_MODEL_BUFFERS(TWOPOT_CHECK)
    TWOPOT_MODEL_LINEARS(TWOPOT_CHECK_LINEAR)
    for (int l = 0; l < m->n_layers; l++) {
        const Where at = {"layers", l, ""};
        const Layer *s = (const Layer *)m->layers.p + l;
        TWOPOT_LAYER_BUFFERS(TWOPOT_CHECK)
        TWOPOT_LAYER_LINEARS(TWOPOT_CHECK_LINEAR)
    }
    return 0;
}

long twopot_scratch_floats(const Model *m, int B, int seat_len);

/* A pass against its model (checked first): its counts, its buffers, each layer's K and V seats. */
static int check_pass(Why *why, const Model *m, const Pass *p) {
    if (check_model(why, m)) return 1;
    const Where at = {"pass.", -1, ""};
    const Pass *s = p;
    const int64_t n_layers = m->n_layers, vocab = m->vocab, n_kv_heads = m->n_kv_heads, head_dim = m->head_dim;
    TWOPOT_PASS_CONFIG(TWOPOT_LOCAL)
    if (rows < 1 || cap < 1 || cap > 4096 || seats < 1 || seat_len < 1 || threads < 1 || n_out < 0 || n_out > rows ||
        (!p->out.p && n_out != rows))
        return refuse(why, "pass: rows %d, n_out %d, seats %d, seat_len %d, cap %d (1..4096), threads %d", p->rows,
                      p->n_out, p->seats, p->seat_len, p->cap, p->threads);
    const int64_t scratch_floats = twopot_scratch_floats(m, p->cap, p->seat_len);
    TWOPOT_PASS_BUFFERS(TWOPOT_CHECK)
    for (int l = 0; l < m->n_layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            const Where at = {kv ? "pass.v" : "pass.k", l, ""};
            const struct { Buf seats; } *s = (const void *)((const Buf *)(kv ? p->v.p : p->k.p) + l); /* the table's row */
            TWOPOT_SEAT_BUFFERS(TWOPOT_CHECK)
        }
    return 0;
}

static int check_product(Why *why, const Product *s) {
    const Where at = {"product.", -1, ""};
    TWOPOT_PRODUCT_CONFIG(TWOPOT_LOCAL)
    if (rows < 1 || depth < 1 || cols < 1 || (int8 & ~1) || (refine & ~int8))
        return refuse(why, "product: rows %d, depth %d, cols %d must be at least 1 (int8 %d, refine %d: 0 or 1, "
                      "refine only with int8)", s->rows, s->depth, s->cols, s->int8, s->refine);
    TWOPOT_PRODUCT_BUFFERS(TWOPOT_CHECK)
    return 0;
}

/* Attention's scratch: each row's scores (rows, G, p0 + rows), then a block of 16 keys (D, 16). */
static int64_t attention_scratch(int64_t rows, int64_t p0, int64_t G, int64_t D) { return rows * G * (p0 + rows) + 16 * D; }

static int check_attention(Why *why, const Attention *s) {
    const Where at = {"attention.", -1, ""};
    TWOPOT_ATTENTION_CONFIG(TWOPOT_LOCAL)
    if (rows < 1 || p0 < 0 || G < 1 || D < 1 || rows > 4096 || p0 > (1 << 24) || G > 4096 || D > 4096)
        return refuse(why, "attention: rows %d, p0 %d, G %d, D %d out of range", s->rows, s->p0, s->G, s->D);
    const int64_t attention_floats = attention_scratch(rows, p0, G, D);
    TWOPOT_ATTENTION_BUFFERS(TWOPOT_CHECK)
    return 0;
}

/* Every struct field's offset and size, "Struct.field offset size" a line: the Python mirror's test. */
const char *twopot_layout(void) {
    static char text[8192];
    int at = 0;
#define TWOPOT_FIELD(S, f) at += snprintf(text + at, sizeof text - at, #S "." #f " %zu %zu\n", offsetof(S, f), sizeof(((S *)0)->f));
#define M_(f) TWOPOT_FIELD(Model, f)
#define MB_(f, ...) TWOPOT_FIELD(Model, f)
#define ML_(f, ...) TWOPOT_FIELD(Model, f)
#define LB_(f, ...) TWOPOT_FIELD(Layer, f)
#define LL_(f, ...) TWOPOT_FIELD(Layer, f)
#define LIN_(f, ...) TWOPOT_FIELD(Linear, f)
#define P_(f) TWOPOT_FIELD(Pass, f)
#define PB_(f, ...) TWOPOT_FIELD(Pass, f)
#define R_(f) TWOPOT_FIELD(Product, f)
#define RB_(f, ...) TWOPOT_FIELD(Product, f)
#define A_(f) TWOPOT_FIELD(Attention, f)
#define AB_(f, ...) TWOPOT_FIELD(Attention, f)
    TWOPOT_FIELD(Buf, p) TWOPOT_FIELD(Buf, n) TWOPOT_FIELD(Buf, type)
    TWOPOT_MODEL_CONFIG(M_) TWOPOT_MODEL_REALS(M_) TWOPOT_MODEL_BUFFERS(MB_) TWOPOT_MODEL_LINEARS(ML_)
    TWOPOT_LAYER_BUFFERS(LB_) TWOPOT_LAYER_LINEARS(LL_) TWOPOT_LINEAR_BUFFERS(LIN_)
    TWOPOT_PASS_CONFIG(P_) TWOPOT_PASS_BUFFERS(PB_)
    TWOPOT_PRODUCT_CONFIG(R_) TWOPOT_PRODUCT_BUFFERS(RB_)
    TWOPOT_ATTENTION_CONFIG(A_) TWOPOT_ATTENTION_BUFFERS(AB_)
    at += snprintf(text + at, sizeof text - at, "sizeof Buf %zu Linear %zu Layer %zu Model %zu Pass %zu Product %zu "
                   "Attention %zu\n", sizeof(Buf), sizeof(Linear), sizeof(Layer), sizeof(Model), sizeof(Pass),
                   sizeof(Product), sizeof(Attention));
    return text;
}
