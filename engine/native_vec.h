/* The native step's vectors and the few things that differ by CPU (included first by native_step.c).
 *
 * The kernels are written once, on 16-lane float vectors (GCC/Clang vector extensions): the
 * compiler maps a v16 onto one AVX-512 register, two AVX2 ones, or four SSE or NEON ones. Sums keep
 * the same order whatever the width, so every CPU adds the same terms in the same order; only a
 * fused multiply-add where the CPU has one rounds once instead of twice.
 *
 * What is CPU-specific sits here, behind architecture guards, each with a plain fallback:
 *   TWOPOT_ISA        the instruction set the step was built for, in words ("AVX-512 VNNI", "NEON dotprod")
 *   TWOPOT_VNNI       the int8 products through AVX-512 VNNI (x86-64)
 *   TWOPOT_SDOT       the int8 products through the dot-product instructions (aarch64)
 *   cpu_relax()       one spin of a wait: x86 `pause`, ARM `yield`, else nothing
 *   prefetch_l2(p)    ask for p's cache line into L2
 *   keep4(a, b, c, d) hold four loaded vectors in registers (AVX-512 only)
 * Build with -DTWOPOT_PORTABLE for the plain C path everywhere (no intrinsics, no asm).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if !defined(TWOPOT_PORTABLE) && (defined(__x86_64__) || defined(__i386__))
#define TWOPOT_X86 1
#elif !defined(TWOPOT_PORTABLE) && defined(__aarch64__)
#define TWOPOT_ARM64 1
#endif

#if defined(TWOPOT_X86) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define TWOPOT_VNNI 1
#include <immintrin.h>
#elif defined(TWOPOT_ARM64) && defined(__ARM_FEATURE_DOTPROD)
#define TWOPOT_SDOT 1
#include <arm_neon.h>
#endif

#if defined(TWOPOT_VNNI)
#define TWOPOT_ISA "AVX-512 VNNI"
#elif defined(TWOPOT_X86) && defined(__AVX512F__)
#define TWOPOT_ISA "AVX-512"
#elif defined(TWOPOT_X86) && defined(__AVX2__)
#define TWOPOT_ISA "AVX2"
#elif defined(TWOPOT_X86)
#define TWOPOT_ISA "SSE"
#elif defined(TWOPOT_SDOT)
#define TWOPOT_ISA "NEON dotprod"
#elif defined(TWOPOT_ARM64)
#define TWOPOT_ISA "NEON"
#else
#define TWOPOT_ISA "portable C"
#endif

static inline void cpu_relax(void) {
#if defined(TWOPOT_X86)
    __builtin_ia32_pause();
#elif defined(TWOPOT_ARM64)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static inline void prefetch_l2(const void *p) {
#if defined(TWOPOT_X86)
    /* asm, not _mm_prefetch: gcc's vectorizer drops prefetch builtins from the loops it rewrites */
    __asm__ volatile("prefetcht2 %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 0, 1);
#endif
}

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t v16i __attribute__((vector_size(64)));

/* Four weight vectors loaded once, not folded into each row's FMA as a memory operand. One
 * AVX-512 register holds a v16; elsewhere a v16 spans several registers and the compiler decides. */
#if defined(TWOPOT_X86) && defined(__AVX512F__)
#define keep4(a, b, c, d) __asm__("" : "+v"(a), "+v"(b), "+v"(c), "+v"(d))
#else
#define keep4(a, b, c, d) ((void)0)
#endif

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
static inline v16 pick(v16i mask, v16 a, v16 b) { return (v16)(((v16i)a & mask) | ((v16i)b & ~mask)); }

/* expf on 16 lanes for x <= 0 (softmax's exponents): x = n ln2 + r with |r| <= ln2 / 2, e^r from
 * Cephes' degree-6 polynomial, 2^n put in the exponent bits. Within 2 ulp of expf; 0 below -87. */
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
