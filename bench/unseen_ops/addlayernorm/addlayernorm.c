// kope: kernel void addlayernorm(const float *x, const float *res, const float *w, const float *b, float *y, int rows, int cols)
// kope: param VEC = 0 | 8 | 16
// kope: param ONEPASS = 0 | 1
// kope: param STASH = 0 | 1
// kope: param NT = 0 | 1
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 -march=native | -O3 -march=native -fno-math-errno -fno-trapping-math
//
// Residual add fused with layer norm, over each row: h = x + res, then
// y = (h - mean(h)) / sqrt(var(h) + 1e-5) * w + b, with the biased variance.
// The default recomputes h = x + res in each of three plain scalar passes (the
// mean, the variance around it, the output): two input rows read three times.
// VEC is the `omp simd` length, which splits the sums into independent lanes.
// STASH writes h into the output row on the first pass (it stays in cache) and
// the later passes read it back and overwrite it in place: each input row is
// read once. ONEPASS
// takes both statistics in one pass: sums of h - k and (h - k)^2 in double,
// shifted by the row's first h, so a common offset cancels before squaring,
// where an unshifted E[h^2] - E[h]^2 would lose the variance to it. NT writes
// the output with streaming stores, past the caches (see below).

#include <math.h>
#include <stdlib.h>

#ifndef VEC
#define VEC 0
#endif
#ifndef ONEPASS
#define ONEPASS 0
#endif
#ifndef STASH
#define STASH 0
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

/* element c of h: from the stash (the output row o) once it holds h, else recomputed from the inputs */
#if STASH
#define H(c) o[c]
#else
#define H(c) (xr[c] + rr[c])
#endif

/* mean and 1 / sqrt(var + eps) of one row of h = x + res; STASH: h is also left in o */
static inline void row_stats(const float *xr, const float *rr, float *o, int cols, float *mean_out,
                             float *rstd_out) {
#if ONEPASS
    float k = xr[0] + rr[0];
    double s = 0.0, q = 0.0;
    SIMD(reduction(+ : s, q))
    for (int c = 0; c < cols; c++) {
        float h = xr[c] + rr[c];
#if STASH
        o[c] = h;
#endif
        double d = h - k;
        s += d;
        q += d * d;
    }
    double md = s / cols, var = q / cols - md * md;
    *mean_out = (float)(k + md);
    *rstd_out = 1.0f / sqrtf((float)(var > 0.0 ? var : 0.0) + EPS);
#else
    float s = 0.0f;
    SIMD(reduction(+ : s))
    for (int c = 0; c < cols; c++) {
        float h = xr[c] + rr[c];
#if STASH
        o[c] = h;
#endif
        s += h;
    }
    float mean = s / cols;
    float q = 0.0f;
    SIMD(reduction(+ : q))
    for (int c = 0; c < cols; c++)
        q += (H(c) - mean) * (H(c) - mean);
    *mean_out = mean;
    *rstd_out = 1.0f / sqrtf(q / cols + EPS);
#endif
    (void)o;
}

void addlayernorm(const float *x, const float *res, const float *w, const float *b, float *y, int rows,
                  int cols) {
    PRAGMA(omp parallel num_threads(THREADS) if(THREADS > 1))
    {
        /* NT: this thread's row buffer (out of memory: rows go straight to y) */
        float *t = NT ? malloc(sizeof(float) * (cols > 0 ? cols : 1)) : NULL;
        PRAGMA(omp for schedule(static))
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (long)r * cols, *rr = res + (long)r * cols;
            float *yr = y + (long)r * cols, *o = t ? t : yr;
            float mean, rstd;
            row_stats(xr, rr, o, cols, &mean, &rstd);
            SIMD()
            for (int c = 0; c < cols; c++)
                o[c] = (H(c) - mean) * rstd * w[c] + b[c];
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
