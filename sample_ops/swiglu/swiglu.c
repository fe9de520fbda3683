// kope: kernel void swiglu(const float *a, const float *b, float *y, long n)
// kope: param VEC = 0 | 8 | 16
// kope: param NT = 0 | 1
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 -march=native | -O3 -march=native -fno-math-errno -fno-trapping-math
//
// SwiGLU gate: y = silu(a) * b = a / (1 + exp(-a)) * b, elementwise.
// The default calls libm expf per element, which never vectorizes without
// -ffast-math (avoided: see README). VEC is the `omp simd` length, and VEC > 0
// uses an inline, vectorizable exp (around libm's the loop would stay scalar).
// NT streams the output past the caches (see below).

#include <math.h>

#ifndef VEC
#define VEC 0
#endif
#ifndef NT
#define NT 0
#endif
#ifndef THREADS
#define THREADS 1
#endif

#if NT
/* NT: the output leaves through streaming (non-temporal) stores, which write whole cache lines
   without first reading them from memory (write-allocate): a third less traffic for a kernel that
   reads one buffer and writes another. x86 has them (the widest the flags enable); elsewhere the
   same code stores normally. The kernel computes into a buffer that stays in cache, then streams it. */
#if defined(__SSE__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__)
#define VW 16
#elif defined(__AVX__)
#define VW 8
#else
#define VW 4
#endif
typedef float vf __attribute__((vector_size(VW * sizeof(float))));

/* dst[0:n] = src[0:n]; the part of dst aligned to whole vectors through streaming stores */
static void stream_out(float *restrict dst, const float *restrict src, long n) {
    long i = 0;
    for (; i < n && (unsigned long)(dst + i) % sizeof(vf); i++)
        dst[i] = src[i];
    for (; i + VW <= n; i += VW) {
        vf v;
        __builtin_memcpy(&v, src + i, sizeof v);
#if defined(__AVX512F__)
        _mm512_stream_ps(dst + i, (__m512)v);
#elif defined(__AVX__)
        _mm256_stream_ps(dst + i, (__m256)v);
#elif defined(__SSE__)
        _mm_stream_ps(dst + i, (__m128)v);
#else
        __builtin_memcpy(dst + i, &v, sizeof v);
#endif
    }
    for (; i < n; i++)
        dst[i] = src[i];
}

/* streaming stores are weakly ordered: each thread fences before the kernel returns */
#if defined(__SSE__)
#define FENCE() _mm_sfence()
#else
#define FENCE()
#endif
#endif

#define PRAGMA(x) _Pragma(#x)
#if VEC > 0
#define SIMD(...) PRAGMA(omp simd simdlen(VEC) __VA_ARGS__)
#else
#define SIMD(...)
#endif

#if VEC > 0 /* vector loops get an exp they can vectorize (libm's never does) */
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
#if NT
    PRAGMA(omp parallel num_threads(THREADS) if(THREADS > 1))
    {
        float t[CHUNK] __attribute__((aligned(64))); /* one chunk of results, in cache */
        PRAGMA(omp for schedule(static))
        for (long c = 0; c < chunks; c++) {
            long lo = c * CHUNK, len = lo + CHUNK < n ? CHUNK : n - lo;
            SIMD()
            for (long i = 0; i < len; i++)
                t[i] = a[lo + i] / (1.0f + EXP(-a[lo + i])) * b[lo + i];
            stream_out(y + lo, t, len);
        }
        FENCE();
    }
    return;
#endif
    PRAGMA(omp parallel for num_threads(THREADS) if(THREADS > 1) schedule(static))
    for (long c = 0; c < chunks; c++) {
        long lo = c * CHUNK, hi = lo + CHUNK < n ? lo + CHUNK : n;
        SIMD()
        for (long i = lo; i < hi; i++)
            y[i] = a[i] / (1.0f + EXP(-a[i])) * b[i];
    }
}
