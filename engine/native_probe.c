/* What this CPU can run: the native step's build is cached under a key that holds this answer, so a
 * step built for one CPU is never loaded on another (engine/native_build.py).
 *
 * Built without -march, so it runs on any CPU of its architecture: the answer is the CPU's, not the
 * compiler's. x86: the CPUID feature words (leaves 1, 7 and 0x80000001, every extension is a bit of
 * one) and which register states the OS saves (XCR0: AVX-512 needs the OS too). aarch64: the
 * kernel's HWCAP words (Linux) or the FEAT_ flags (macOS). Elsewhere: the architecture alone.
 */
#include <stdio.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

const char *twopot_cpu_features(void) {
    static char text[256];
#if defined(__x86_64__) || defined(__i386__)
    unsigned a = 0, b = 0, c = 0, d = 0, a7 = 0, b7 = 0, c7 = 0, d7 = 0, a71 = 0, ce = 0, de = 0, xlo = 0, xhi = 0, e;
    __get_cpuid(1, &a, &b, &c, &d); /* a: family, model, stepping; c, d: features (b holds the core's id: left out) */
    __get_cpuid_count(7, 0, &a7, &b7, &c7, &d7);
    __get_cpuid_count(7, 1, &a71, &e, &e, &e);
    __get_cpuid(0x80000001, &e, &e, &ce, &de);
    if (c & (1u << 27)) __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0)); /* OSXSAVE: XCR0 readable */
    snprintf(text, sizeof text, "x86 %x %x.%x %x.%x.%x.%x %x.%x xcr0 %x.%x", a, c, d, b7, c7, d7, a71, ce, de, xhi, xlo);
#elif defined(__aarch64__) && defined(__linux__)
    snprintf(text, sizeof text, "aarch64 hwcap %lx.%lx", getauxval(AT_HWCAP), getauxval(AT_HWCAP2));
#elif defined(__aarch64__) && defined(__APPLE__)
    static const char *names[] = {"hw.optional.arm.FEAT_DotProd", "hw.optional.arm.FEAT_I8MM",
                                  "hw.optional.arm.FEAT_BF16", "hw.optional.arm.FEAT_FP16", "hw.optional.arm.FEAT_SME"};
    int at = snprintf(text, sizeof text, "arm64 macOS");
    for (unsigned i = 0; i < sizeof names / sizeof *names; i++) {
        int v = 0;
        size_t n = sizeof v;
        if (sysctlbyname(names[i], &v, &n, 0, 0) != 0) v = -1;
        at += snprintf(text + at, sizeof text - (size_t)at, " %d", v);
    }
#else
    snprintf(text, sizeof text, "unknown architecture");
#endif
    return text;
}
