// kope: kernel void rmsnorm(const float *x, const float *w, float *y, int rows, int cols)
// Honest twin of scale_cache.c: the sample kernel itself, vectorized (params in twin_vectorized.json).
// kope: param VEC = 0 | 4 | 8 | 16
// kope: param NT = 0 | 1
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 -march=native | -O3 -march=native -fno-math-errno -fno-trapping-math
//
// RMS norm over each row: y = x / sqrt(mean(x^2) + 1e-6) * w. The default is
// plain scalar loops (the sum of squares is one serial dependency chain); VEC is
// the `omp simd` length, which splits the sum into independent lanes. NT streams
// the output past the caches (see below).

#include <math.h>
#include <stdlib.h>

#ifndef VEC
#define VEC 0
#endif
#ifndef NT
#define NT 0
#endif
#ifndef THREADS
#define THREADS 1
#endif

#define EPS 1e-6f
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

/* y = x * rrms * w over one row; under NT through a row buffer in cache (when there is one) */
static inline void scale_row(const float *xr, const float *w, float *yr, float *t, int cols, float rrms) {
    float *o = t ? t : yr;
    SIMD()
    for (int c = 0; c < cols; c++)
        o[c] = xr[c] * rrms * w[c];
#if NT
    if (t)
        stream_out(yr, t, cols);
#endif
}

void rmsnorm(const float *x, const float *w, float *y, int rows, int cols) {
    PRAGMA(omp parallel num_threads(THREADS) if(THREADS > 1))
    {
        /* NT: this thread's row buffer (out of memory: rows go straight to y) */
        float *t = NT ? malloc(sizeof(float) * (cols > 0 ? cols : 1)) : NULL;
        PRAGMA(omp for schedule(static))
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (long)r * cols;
            float q = 0.0f;
            SIMD(reduction(+ : q))
            for (int c = 0; c < cols; c++)
                q += xr[c] * xr[c];
            scale_row(xr, w, y + (long)r * cols, t, cols, 1.0f / sqrtf(q / cols + EPS));
        }
        free(t);
#if NT
        FENCE();
#endif
    }
}
