// kope: kernel void swiglu(const float *a, const float *b, float *y, long n)
// kope: param FAST_EXP = 0 | 1
// kope: param VEC = 0 | 8 | 16
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 -march=native | -O3 -march=native -fno-math-errno -fno-trapping-math
// kope: require FAST_EXP == 0 or VEC > 0
//
// SwiGLU gate: y = silu(a) * b = a / (1 + exp(-a)) * b, elementwise.
// The default calls libm expf per element, which never vectorizes without
// -ffast-math (avoided: see README). FAST_EXP uses an inline, vectorizable exp.

#include <math.h>

#ifndef FAST_EXP
#define FAST_EXP 0
#endif
#ifndef VEC
#define VEC 0
#endif
#ifndef THREADS
#define THREADS 1
#endif

#define PRAGMA(x) _Pragma(#x)
#if VEC > 0
#define SIMD(...) PRAGMA(omp simd simdlen(VEC) __VA_ARGS__)
#else
#define SIMD(...)
#endif

#if FAST_EXP
// exp(x) = 2^n * e^r with n = round(x / ln2), |r| <= ln2/2; degree-6 Taylor
// polynomial on r keeps the relative error near 2e-7. Branch-free so it
// vectorizes; the clamp keeps 2^n a normal float.
static inline float exp_approx(float x) {
    /* three independent selects: two chained clamps get jump-threaded by
       GCC 12 into branches, and then the loop no longer vectorizes */
    float lo = x < -87.0f ? -87.0f : x, hi = x > 88.0f ? 88.0f : x;
    x = x < 0.0f ? lo : hi;
    float t = x * 1.44269504f + 0.5f;
    int n = (int)(t + 127.0f) - 127; /* t + 127 > 0, so truncation is floor */
    float r = x - (float)n * 0.693145752f;
    r -= (float)n * 1.42860677e-6f; /* ln2 split in two for accuracy */
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.66666667e-1f + r * (4.16666667e-2f +
              r * (8.33333333e-3f + r * 1.38888889e-3f)))));
    int bits = (n + 127) << 23; /* 2^n built in the exponent field */
    float scale;
    __builtin_memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}
#define EXP exp_approx
#else
#define EXP expf
#endif

/* threads take whole chunks so each inner loop is a clean simd loop */
#define CHUNK 4096

void swiglu(const float *a, const float *b, float *y, long n) {
    long chunks = (n + CHUNK - 1) / CHUNK;
    PRAGMA(omp parallel for num_threads(THREADS) if(THREADS > 1) schedule(static))
    for (long c = 0; c < chunks; c++) {
        long lo = c * CHUNK, hi = lo + CHUNK < n ? lo + CHUNK : n;
        SIMD()
        for (long i = lo; i < hi; i++)
            y[i] = a[i] / (1.0f + EXP(-a[i])) * b[i];
    }
}
