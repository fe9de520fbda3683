// kope: kernel void layernorm(const float *x, const float *w, const float *b, float *y, int rows, int cols)
// kope: param VEC = 0 | 4 | 8 | 16
// kope: param ONEPASS = 0 | 1
// kope: param NT = 0 | 1
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 -march=native | -O3 -march=native -fno-math-errno -fno-trapping-math
//
// Layer norm over each row: y = (x - mean) / sqrt(var + 1e-5) * w + b, with the
// biased variance. Two passes for the statistics (a one-pass sum of squares
// cancels badly when the mean is large). The default is plain scalar loops, where
// each float sum is a serial dependency chain; VEC is the `omp simd` length,
// which splits the sums into independent lanes. ONEPASS reads the row once for
// both statistics: sums of x - k and (x - k)^2 in double, shifted by the row's
// first value k, so a common offset (x + 100 max|x|) cancels before squaring,
// where an unshifted E[x^2] - E[x]^2 would lose the variance to it. NT streams
// the output past the caches (see below).

#include <math.h>
#include <stdlib.h>

#ifndef VEC
#define VEC 0
#endif
#ifndef ONEPASS
#define ONEPASS 0
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

#define EPS 1e-5f
#define PRAGMA(x) _Pragma(#x)
#if VEC > 0
#define SIMD(...) PRAGMA(omp simd simdlen(VEC) __VA_ARGS__)
#else
#define SIMD(...)
#endif

/* mean and 1 / sqrt(var + eps) of one row */
static inline void row_stats(const float *xr, int cols, float *mean_out, float *rstd_out) {
#if ONEPASS
    float k = xr[0];
    double s = 0.0, q = 0.0;
    SIMD(reduction(+ : s, q))
    for (int c = 0; c < cols; c++) {
        double d = xr[c] - k;
        s += d;
        q += d * d;
    }
    double md = s / cols, var = q / cols - md * md;
    *mean_out = (float)(k + md);
    *rstd_out = 1.0f / sqrtf((float)(var > 0.0 ? var : 0.0) + EPS);
#else
    float s = 0.0f;
    SIMD(reduction(+ : s))
    for (int c = 0; c < cols; c++)
        s += xr[c];
    float mean = s / cols;
    float q = 0.0f;
    SIMD(reduction(+ : q))
    for (int c = 0; c < cols; c++)
        q += (xr[c] - mean) * (xr[c] - mean);
    *mean_out = mean;
    *rstd_out = 1.0f / sqrtf(q / cols + EPS);
#endif
}

void layernorm(const float *x, const float *w, const float *b, float *y, int rows, int cols) {
    PRAGMA(omp parallel num_threads(THREADS) if(THREADS > 1))
    {
        /* NT: this thread's row buffer (out of memory: rows go straight to y) */
        float *t = NT ? malloc(sizeof(float) * (cols > 0 ? cols : 1)) : NULL;
        PRAGMA(omp for schedule(static))
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (long)r * cols;
            float *yr = y + (long)r * cols, *o = t ? t : yr;
            float mean, rstd;
            row_stats(xr, cols, &mean, &rstd);
            SIMD()
            for (int c = 0; c < cols; c++)
                o[c] = (xr[c] - mean) * rstd * w[c] + b[c];
#if NT
            if (t)
                stream_out(yr, t, cols);
#endif
        }
        free(t);
#if NT
        FENCE();
#endif
    }
}
