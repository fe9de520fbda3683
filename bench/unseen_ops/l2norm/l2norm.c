// kope: kernel void l2norm(const float *x, float *y, int rows, int cols)
// kope: param VEC = 0 | 8 | 16
// kope: param ACC = 1 | 2 | 4
// kope: param NT = 0 | 1
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 -march=native | -O3 -march=native -fno-math-errno -fno-trapping-math
// kope: require ACC == 1 or VEC > 0
//
// Row-wise L2 normalization: y = x / sqrt(sum(x^2) + 1e-12). The default is two
// plain scalar passes per row; the sum of squares is one serial chain of
// dependent float adds. VEC is the `omp simd` length (independent partial sums
// per lane, and a vector scaling pass). ACC > 1 sums the squares in ACC
// independent accumulators of VEC lanes each (GCC vector extensions), so the
// add latency of one chain is hidden by the others; each accumulator is held in
// vectors of the width the target has (the flags select it), never wider, so
// VEC = 16 is one AVX-512 vector or two AVX2 ones. NT writes the output with
// streaming stores, past the caches (see below).

#include <math.h>
#include <string.h>

#ifndef VEC
#define VEC 0
#endif
#ifndef ACC
#define ACC 1
#endif
#ifndef NT
#define NT 0
#endif
#ifndef THREADS
#define THREADS 1
#endif

#define EPS 1e-12f
#define PRAGMA(x) _Pragma(#x)
#if VEC > 0
#define SIMD(...) PRAGMA(omp simd simdlen(VEC) __VA_ARGS__)
#else
#define SIMD(...)
#endif

/* the widest vector the target has, in bytes (what the flags select) */
#if defined(__AVX512F__)
#define WIDE 64
#elif defined(__AVX__)
#define WIDE 32
#else
#define WIDE 16
#endif

#if NT
/* NT: the output leaves through streaming (non-temporal) stores, which write whole cache lines
   without first reading them from memory (write-allocate): a third less traffic for a kernel that
   reads one buffer and writes another. x86 has them (the widest the flags enable); elsewhere the
   same code stores normally. The output is a scaled copy of the input, so it is streamed directly. */
#if defined(__SSE__)
#include <immintrin.h>
#endif
#define VW (WIDE / 4)
typedef float vw_t __attribute__((vector_size(WIDE)));

/* dst[0:n] = src[0:n] * k; the part of dst aligned to whole vectors through streaming stores */
static void stream_scaled(float *restrict dst, const float *restrict src, float k, long n) {
    long i = 0;
    for (; i < n && (unsigned long)(dst + i) % sizeof(vw_t); i++)
        dst[i] = src[i] * k;
    for (; i + VW <= n; i += VW) {
        vw_t v;
        memcpy(&v, src + i, sizeof v);
        v *= k;
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
        dst[i] = src[i] * k;
}

/* streaming stores are weakly ordered: each thread fences before the kernel returns */
#if defined(__SSE__)
#define FENCE() _mm_sfence()
#else
#define FENCE()
#endif
#endif

#if ACC > 1
#if VEC <= 0
#error "ACC > 1 needs VEC > 0"
#endif
#define VB (4 * VEC < WIDE ? 4 * VEC : WIDE) /* bytes per vector */
#define NV (ACC * 4 * VEC / VB)              /* independent vectors: ACC accumulators of VEC lanes */
#define STEP (NV * VB / 4)                   /* floats per sweep of all accumulators */
typedef float vf __attribute__((vector_size(VB)));

static float sum_squares(const float *xr, int cols) {
    vf s[NV];
    for (int a = 0; a < NV; a++)
        s[a] = (vf){0};
    int c = 0;
    for (; c + STEP <= cols; c += STEP)
        for (int a = 0; a < NV; a++) {
            vf v;
            memcpy(&v, xr + c + a * (VB / 4), sizeof v); /* unaligned load */
            s[a] += v * v;
        }
    for (; c + VB / 4 <= cols; c += VB / 4) {
        vf v;
        memcpy(&v, xr + c, sizeof v);
        s[0] += v * v;
    }
    for (int a = 1; a < NV; a++)
        s[0] += s[a];
    float t = 0.0f;
    for (int j = 0; j < VB / 4; j++)
        t += s[0][j];
    for (; c < cols; c++)
        t += xr[c] * xr[c];
    return t;
}
#else
static float sum_squares(const float *xr, int cols) {
    float s = 0.0f;
    SIMD(reduction(+ : s))
    for (int c = 0; c < cols; c++)
        s += xr[c] * xr[c];
    return s;
}
#endif

void l2norm(const float *x, float *y, int rows, int cols) {
    PRAGMA(omp parallel num_threads(THREADS) if(THREADS > 1))
    {
        PRAGMA(omp for schedule(static))
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (long)r * cols;
            float *yr = y + (long)r * cols;
            float inv = 1.0f / sqrtf(sum_squares(xr, cols) + EPS);
#if NT
            stream_scaled(yr, xr, inv, cols);
#else
            SIMD()
            for (int c = 0; c < cols; c++)
                yr[c] = xr[c] * inv;
#endif
        }
#if NT
        FENCE();
#endif
    }
}
