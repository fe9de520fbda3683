// kope: kernel void leakyrelu(const float *x, float *y, long n)
// kope: param VEC = 0 | 8 | 16
// kope: param FORM = 0 | 1
// kope: param NT = 0 | 1
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 -march=native | -O3 -march=native -fno-math-errno -fno-trapping-math
//
// Leaky ReLU, slope 0.01: y = x > 0 ? x : 0.01 x. A pure stream: one read, one
// write, one compare per element. The default is a plain scalar loop over
// 4096-element chunks. VEC is the `omp simd` length. FORM picks how the
// element is written: 0 the select above, 1 the branch-free
// max(x, 0) + 0.01 min(x, 0) (the same values, bit for bit: one of the two terms
// is always an exact zero). NT writes the output with streaming stores, past
// the caches (see below). THREADS split the chunks.

#include <string.h>

#ifndef VEC
#define VEC 0
#endif
#ifndef FORM
#define FORM 0
#endif
#ifndef NT
#define NT 0
#endif
#ifndef THREADS
#define THREADS 1
#endif

#define SLOPE 0.01f
#define PRAGMA(x) _Pragma(#x)
#if VEC > 0
#define SIMD(...) PRAGMA(omp simd simdlen(VEC) __VA_ARGS__)
#else
#define SIMD(...)
#endif

static inline float leaky1(float v) {
#if FORM == 0
    return v > 0.0f ? v : SLOPE * v;
#else
    float pos = v > 0.0f ? v : 0.0f, neg = v < 0.0f ? v : 0.0f;
    return pos + SLOPE * neg;
#endif
}

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
        memcpy(&v, src + i, sizeof v);
#if defined(__AVX512F__)
        _mm512_stream_ps(dst + i, (__m512)v);
#elif defined(__AVX__)
        _mm256_stream_ps(dst + i, (__m256)v);
#elif defined(__SSE__)
        _mm_stream_ps(dst + i, (__m128)v);
#else
        memcpy(dst + i, &v, sizeof v);
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

/* threads take whole chunks so each inner loop is a clean simd loop */
#define CHUNK 4096

void leakyrelu(const float *x, float *y, long n) {
    long chunks = (n + CHUNK - 1) / CHUNK;
#if NT
    PRAGMA(omp parallel num_threads(THREADS) if(THREADS > 1))
    {
        float t[CHUNK] __attribute__((aligned(64))); /* one chunk of results, in cache */
        PRAGMA(omp for schedule(static))
        for (long b = 0; b < chunks; b++) {
            long lo = b * CHUNK, len = lo + CHUNK < n ? CHUNK : n - lo;
            SIMD()
            for (long i = 0; i < len; i++)
                t[i] = leaky1(x[lo + i]);
            stream_out(y + lo, t, len);
        }
        FENCE();
    }
#else
    PRAGMA(omp parallel for num_threads(THREADS) if(THREADS > 1) schedule(static))
    for (long b = 0; b < chunks; b++) {
        long lo = b * CHUNK, hi = lo + CHUNK < n ? lo + CHUNK : n;
        SIMD()
        for (long i = lo; i < hi; i++)
            y[i] = leaky1(x[i]);
    }
#endif
}
