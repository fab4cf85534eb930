/* A C-level test driver of the native step, built for this CPU and for others (aarch64, run under
 * qemu-user): it runs cases that tests/native_cases.py wrote from the x86 native step, through the
 * step's own entries, and writes what came out, for the test to compare with x86's results.
 *
 * Usage: native_driver DIR. DIR/cases.txt holds one case a line:
 *   product CASE          CASE/config.txt (rows depth cols int8), CASE/<field>.<type>  -> CASE/y.out
 *   attention CASE        CASE/config.txt (rows p0 G D), CASE/<field>.<type>          -> CASE/out.out
 *   step MODEL CASE       MODEL/config.txt and its buffers, CASE/config.txt (the Pass's counts), its
 *                         tok, pos, seat, out and each layer's seats k.L, v.L -> CASE/logits.out, k.L.out, v.L.out
 * A buffer's file is its raw bytes, named by the contract's field path (native_contract.h):
 * "layers.1.qkv.w.i8" is layer 1's int8 qkv weight. The structs are filled from the contract's
 * tables, so the driver hands C exactly the buffers the Python side hands it, and C checks them.
 * Exit status 0, or 1 with one line on stderr.
 */
#include "native_step.c"

#include <stdio.h>

static const char *SUFFIX[] = {"", "f32", "i8", "i32", "i64", "u8", "", "", "f16"}; /* by BufType */
static const int SIZE[] = {0, 4, 1, 4, 8, 1, 0, 0, 2};

static int fail(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    exit(1);
}

/* DIR/PREFIXFIELD.<type> for whichever type exists: its bytes as a Buf; an empty Buf if none does. */
static Buf load(const char *dir, const char *prefix, const char *field) {
    char path[512];
    for (int t = F32; t <= F16; t++) {
        if (!SIZE[t]) continue; /* BUF, LAYER: no file of their own */
        snprintf(path, sizeof path, "%s/%s%s.%s", dir, prefix, field, SUFFIX[t]);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        fseek(f, 0, SEEK_END);
        const long bytes = ftell(f);
        fseek(f, 0, SEEK_SET);
        void *p = aligned_alloc(64, (size_t)(bytes + 63) & ~(size_t)63);
        if (!p || fread(p, 1, (size_t)bytes, f) != (size_t)bytes) fail("cannot read %s%s", path, "");
        fclose(f);
        return (Buf){p, bytes / SIZE[t], t};
    }
    return (Buf){0, 0, 0};
}

static void save(const char *dir, const char *name, const void *p, size_t bytes) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.out", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, bytes, f) != bytes) fail("cannot write %s%s", path, "");
    fclose(f);
}

/* DIR/config.txt: "name value" a line; the value of `name` (a float in C's %a or decimal). */
static double config(const char *dir, const char *name) {
    char path[512], key[64];
    double value;
    snprintf(path, sizeof path, "%s/config.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) fail("cannot read %s%s", path, "");
    while (fscanf(f, "%63s %lf", key, &value) == 2)
        if (!strcmp(key, name)) return fclose(f), value;
    return fail("%s has no %s", path, name), 0;
}

static float *floats(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

#define READ_INT(f) s->f = (int)config(dir, #f);
#define LOAD(f, ...) \
    if (!s->f.p) s->f = load(dir, prefix, #f); /* a field named twice (w) is one file */
#define LOAD_LINEAR(f, ...)                                                                                 \
    {                                                                                                      \
        char sub[96];                                                                                      \
        snprintf(sub, sizeof sub, "%s" #f ".", prefix);                                                    \
        Linear *L = &s->f;                                                                                 \
        load_linear(dir, sub, L);                                                                          \
    }

static void load_linear(const char *dir, const char *prefix, Linear *s) { TWOPOT_LINEAR_BUFFERS(LOAD) }

static Model load_model(const char *dir) {
    Model model = {0}, *s = &model;
    const char *prefix = "";
    TWOPOT_MODEL_CONFIG(READ_INT)
    s->eps = (float)config(dir, "eps");
    TWOPOT_MODEL_BUFFERS(LOAD)
    TWOPOT_MODEL_LINEARS(LOAD_LINEAR)
    Layer *layers = calloc((size_t)model.n_layers, sizeof(Layer));
    for (int l = 0; l < model.n_layers; l++) {
        char at[32];
        snprintf(at, sizeof at, "layers.%d.", l);
        const char *prefix = at;
        Layer *s = layers + l;
        TWOPOT_LAYER_BUFFERS(LOAD)
        TWOPOT_LAYER_LINEARS(LOAD_LINEAR)
    }
    model.layers = (Buf){layers, model.n_layers, LAYER};
    return model;
}

static void run_step(const char *model_dir, const char *dir, char *why) {
    const Model m = load_model(model_dir);
    Pass pass = {0}, *s = &pass;
    const char *prefix = "";
    TWOPOT_PASS_CONFIG(READ_INT)
    s->tok = load(dir, prefix, "tok"), s->pos = load(dir, prefix, "pos"), s->seat = load(dir, prefix, "seat");
    s->out = load(dir, prefix, "out");
    const size_t n_logits = (size_t)pass.n_out * m.vocab, n_scratch = (size_t)twopot_scratch_floats(&m, pass.cap, pass.seat_len);
    s->logits = (Buf){floats(n_logits), (int64_t)n_logits, F32}, s->scratch = (Buf){floats(n_scratch), (int64_t)n_scratch, F32};
    Buf *k = calloc((size_t)m.n_layers, sizeof(Buf)), *v = calloc((size_t)m.n_layers, sizeof(Buf));
    for (int l = 0; l < m.n_layers; l++) {
        char name[32];
        snprintf(name, sizeof name, "k.%d", l), k[l] = load(dir, "", name);
        snprintf(name, sizeof name, "v.%d", l), v[l] = load(dir, "", name);
    }
    s->k = (Buf){k, m.n_layers, BUF}, s->v = (Buf){v, m.n_layers, BUF};
    if (twopot_step(&m, &pass, why, 256)) fail("step %s: %s", dir, why);
    save(dir, "logits", pass.logits.p, n_logits * sizeof(float));
    for (int l = 0; l < m.n_layers; l++) {
        char name[32];
        snprintf(name, sizeof name, "k.%d", l), save(dir, name, k[l].p, (size_t)k[l].n * sizeof(float));
        snprintf(name, sizeof name, "v.%d", l), save(dir, name, v[l].p, (size_t)v[l].n * sizeof(float));
    }
}

static void run_product(const char *dir, char *why) {
    Product product = {0}, *s = &product;
    const char *prefix = "";
    TWOPOT_PRODUCT_CONFIG(READ_INT)
    TWOPOT_PRODUCT_BUFFERS(LOAD)
    const size_t n = (size_t)product.rows * product.cols;
    s->y = (Buf){floats(n), (int64_t)n, F32};
    if (product.int8) { /* scratch: the rows rounded to 8 bits (twice with refine), each block's scale */
        const size_t rows = (size_t)product.rows * (product.refine ? 2 : 1), blocks = rows * qblocks(product.depth);
        s->xq = (Buf){calloc(rows, (size_t)product.depth), (int64_t)rows * product.depth, I8};
        s->sx = (Buf){floats(blocks), (int64_t)blocks, F32};
    }
    if (twopot_product(&product, why, 256)) fail("product %s: %s", dir, why);
    save(dir, "y", product.y.p, n * sizeof(float));
}

static void run_attention(const char *dir, char *why) {
    Attention attention = {0}, *s = &attention;
    const char *prefix = "";
    TWOPOT_ATTENTION_CONFIG(READ_INT)
    TWOPOT_ATTENTION_BUFFERS(LOAD)
    const size_t n = (size_t)attention.rows * attention.G * attention.D;
    const size_t n_scratch = (size_t)attention_scratch(attention.rows, attention.p0, attention.G, attention.D);
    s->out = (Buf){floats(n), (int64_t)n, F32}, s->scratch = (Buf){floats(n_scratch), (int64_t)n_scratch, F32};
    if (twopot_attention(&attention, why, 256)) fail("attention %s: %s", dir, why);
    save(dir, "out", attention.out.p, n * sizeof(float));
}

int main(int argc, char **argv) {
    if (argc != 2) fail("usage: %s DIR%s", argv[0], "");
    char path[512], kind[32], a[256], b[256], why[256] = "";
    snprintf(path, sizeof path, "%s/cases.txt", argv[1]);
    FILE *f = fopen(path, "r");
    if (!f) fail("cannot read %s%s", path, "");
    char line[600];
    int ran = 0;
    while (fgets(line, sizeof line, f)) {
        char da[600], db[600];
        const int n = sscanf(line, "%31s %255s %255s", kind, a, b);
        if (n < 2) continue;
        snprintf(da, sizeof da, "%s/%s", argv[1], a), snprintf(db, sizeof db, "%s/%s", argv[1], n > 2 ? b : "");
        if (!strcmp(kind, "product")) run_product(da, why);
        else if (!strcmp(kind, "attention")) run_attention(da, why);
        else if (!strcmp(kind, "step") && n == 3) run_step(da, db, why);
        else fail("unknown case: %s%s", line, "");
        ran++;
    }
    fclose(f);
    printf("%d cases on %s\n", ran, twopot_isa());
    return 0;
}
