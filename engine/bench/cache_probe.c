/* The cache probe: how fast these threads can read a buffer that stays in one level of cache.
 *
 * Why C: a cache-sized buffer is read in microseconds (1 MB from L2 at ~200 GB/s is 5 us), about
 * the cost of one torch call, so torch's `x.sum()` would time its own dispatch, not the cache.
 * Here each thread sums its own slice `passes` times in one call, with eight independent
 * accumulators so the compiler can vectorise the loop and no add waits on the one before it.
 *
 * The sum is returned (and the loop is fenced each pass), so the compiler cannot drop the reads or
 * fold the passes into one. Integer adds: exact and associative, so vectorising needs no fast-math.
 */

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define TPK_MAX_THREADS 256

typedef struct {
    const uint64_t *words;
    size_t n;     /* words in this slice, a multiple of TPK_BLOCK */
    long passes;
    uint64_t sum;
} slice_t;

#if defined(__GNUC__) || defined(__clang__)
/* 64 bytes of words, loadable from any 8-byte boundary: one AVX-512 register, two AVX2 or four NEON */
typedef uint64_t words8 __attribute__((vector_size(64), aligned(8)));
#define TPK_BLOCK 32 /* words per iteration: four independent vector sums, so no add waits on another */

static void sum_pass(const uint64_t *p, size_t n, words8 acc[4]) {
    for (size_t i = 0; i + TPK_BLOCK <= n; i += TPK_BLOCK) {
        acc[0] += *(const words8 *)(p + i);
        acc[1] += *(const words8 *)(p + i + 8);
        acc[2] += *(const words8 *)(p + i + 16);
        acc[3] += *(const words8 *)(p + i + 24);
    }
}

static void *read_slice(void *arg) {
    slice_t *s = (slice_t *)arg;
    words8 acc[4] = {{0}, {0}, {0}, {0}};
    for (long r = 0; r < s->passes; r++) {
        sum_pass(s->words, s->n, acc);
        __asm__ __volatile__("" ::: "memory"); /* read the slice again next pass, not a folded copy */
    }
    uint64_t total = 0;
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 8; j++) total += acc[k][j];
    s->sum = total;
    return NULL;
}
#else
#define TPK_BLOCK 8 /* plain C: eight independent sums the compiler may vectorise */

static void *read_slice(void *arg) {
    slice_t *s = (slice_t *)arg;
    const uint64_t *p = s->words;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    for (long r = 0; r < s->passes; r++) {
        for (size_t i = 0; i + 8 <= s->n; i += 8) {
            a0 += p[i];
            a1 += p[i + 1];
            a2 += p[i + 2];
            a3 += p[i + 3];
            a4 += p[i + 4];
            a5 += p[i + 5];
            a6 += p[i + 6];
            a7 += p[i + 7];
        }
    }
    s->sum = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    return NULL;
}
#endif

/* Sum `n_words` 64-bit words `passes` times, split into `threads` equal slices read in parallel.
 * Returns 0 and writes the sum to *out; -1 for a bad argument (threads outside 1..256, fewer than
 * TPK_BLOCK words per thread, passes < 1, a NULL pointer); -2 if a thread could not be started. */
int tpk_read_passes(const uint64_t *buf, size_t n_words, int threads, long passes, uint64_t *out) {
    if (buf == NULL || out == NULL || threads < 1 || threads > TPK_MAX_THREADS || passes < 1) return -1;
    size_t per = (n_words / (size_t)threads) / TPK_BLOCK * TPK_BLOCK;
    if (per < TPK_BLOCK) return -1;
    slice_t slices[TPK_MAX_THREADS];
    pthread_t ids[TPK_MAX_THREADS];
    for (int t = 0; t < threads; t++) {
        slices[t].words = buf + (size_t)t * per;
        slices[t].n = per;
        slices[t].passes = passes;
        slices[t].sum = 0;
    }
    int started = 1, failed = 0;
    for (int t = 1; t < threads; t++) { /* the caller's thread reads slice 0 */
        if (pthread_create(&ids[t], NULL, read_slice, &slices[t]) != 0) {
            failed = 1;
            break;
        }
        started++;
    }
    read_slice(&slices[0]);
    uint64_t total = slices[0].sum;
    for (int t = 1; t < started; t++) {
        pthread_join(ids[t], NULL);
        total += slices[t].sum;
    }
    *out = total;
    return failed ? -2 : 0;
}
