// kope: kernel void logsoftmax(const float *x, float *y, int rows, int cols)
// kope: param VEC = 0 | 8 | 16
// kope: param ONEPASS = 0 | 1
// kope: param NT = 0 | 1
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 -march=native | -O3 -march=native -fno-math-errno -fno-trapping-math
//
// Row-wise log-softmax: y[r, :] = x[r, :] - (max + log(sum(exp(x[r, :] - max)))).
// The default is three plain scalar passes per row (the max, the sum of libm
// expf, the shifted output). VEC is the `omp simd` length; VEC > 0 also swaps in
// an inline exp the compiler can vectorize (libm expf vectorizes only under
// -ffast-math, which we avoid). ONEPASS reads each row once for both statistics
// (the "online" form): it walks the row in blocks of BLK floats, takes each
// block's max and, when the running max rises, rescales the running sum by
// exp(old max - new max) before adding the block's exps. NT writes the output
// with streaming stores, past the caches (see below).

#include <math.h>

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

#define PRAGMA(x) _Pragma(#x)
#if VEC > 0
#define SIMD(...) PRAGMA(omp simd simdlen(VEC) __VA_ARGS__)
#else
#define SIMD(...)
#endif

#if VEC > 0 /* vector loops get an exp they can vectorize (libm's never does) */
// exp(x) = 2^n * e^r with n = round(x / ln2), |r| <= ln2/2; degree-6 Taylor
// polynomial on r keeps the relative error near 2e-7. Branch-free so it
// vectorizes. Inputs below -87 give ~1e-38 instead of 0 (harmless in a sum).
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

#if NT
/* NT: the output leaves through streaming (non-temporal) stores, which write whole cache lines
   without first reading them from memory (write-allocate): a third less traffic for a kernel that
   reads one buffer and writes another. x86 has them (the widest the flags enable); elsewhere the
   same code stores normally. The output is a shift of the input, so it is streamed directly. */
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

/* dst[0:n] = src[0:n] - k; the part of dst aligned to whole vectors through streaming stores */
static void stream_shifted(float *restrict dst, const float *restrict src, float k, long n) {
    long i = 0;
    for (; i < n && (unsigned long)(dst + i) % sizeof(vf); i++)
        dst[i] = src[i] - k;
    for (; i + VW <= n; i += VW) {
        vf v;
        __builtin_memcpy(&v, src + i, sizeof v);
        v -= k;
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
        dst[i] = src[i] - k;
}

/* streaming stores are weakly ordered: each thread fences before the kernel returns */
#if defined(__SSE__)
#define FENCE() _mm_sfence()
#else
#define FENCE()
#endif
#endif

/* max + log(sum(exp(x - max))) of one row */
static inline float log_sum_exp(const float *xr, int cols) {
#if ONEPASS
#define BLK 512 /* floats per block: 2 KiB, read twice from L1, once from memory */
    float m = -INFINITY, s = 0.0f;
    for (int c0 = 0; c0 < cols; c0 += BLK) {
        int n = cols - c0 < BLK ? cols - c0 : BLK;
        const float *xb = xr + c0;
        float bm = -INFINITY;
        SIMD(reduction(max : bm))
        for (int c = 0; c < n; c++)
            bm = xb[c] > bm ? xb[c] : bm;
        if (bm > m) { /* the running sum was taken against the old max */
            s *= EXP(m - bm);
            m = bm;
        }
        float bs = 0.0f;
        SIMD(reduction(+ : bs))
        for (int c = 0; c < n; c++)
            bs += EXP(xb[c] - m);
        s += bs;
    }
    return m + logf(s);
#else
    float m = -INFINITY;
    SIMD(reduction(max : m))
    for (int c = 0; c < cols; c++)
        m = xr[c] > m ? xr[c] : m;
    float s = 0.0f;
    SIMD(reduction(+ : s))
    for (int c = 0; c < cols; c++)
        s += EXP(xr[c] - m);
    return m + logf(s);
#endif
}

void logsoftmax(const float *x, float *y, int rows, int cols) {
    PRAGMA(omp parallel num_threads(THREADS) if(THREADS > 1))
    {
        PRAGMA(omp for schedule(static))
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (long)r * cols;
            float *yr = y + (long)r * cols;
            float lse = log_sum_exp(xr, cols);
#if NT
            stream_shifted(yr, xr, lse, cols);
#else
            SIMD()
            for (int c = 0; c < cols; c++)
                yr[c] = xr[c] - lse;
#endif
        }
#if NT
        FENCE();
#endif
    }
}
