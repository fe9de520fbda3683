// kope: kernel void cumsum(const float *x, float *y, int rows, int cols)
// kope: param VEC = 0 | 4 | 8 | 16
// kope: param ROWS = 1 | 2 | 4
// kope: param NT = 0 | 1
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 -march=native | -O3 -march=native -fno-math-errno -fno-trapping-math
// kope: require ROWS == 1 or VEC == 0
//
// Row-wise inclusive prefix sum: y[r, c] = x[r, 0] + ... + x[r, c]. The default
// is one scalar running sum per row: a serial chain of dependent float adds, one
// add latency per element. ROWS scans that many rows in one sweep, independent
// chains interleaved (scalar). VEC > 0 scans VEC floats per step in registers
// (GCC vector extensions): each vector is scanned by log2(lanes) shifted adds,
// then the running total of the row is added to all its lanes, so the serial
// chain is one add per vector instead of one per element. A vector holds at
// most the width the target has (the flags select it), never wider: VEC = 16
// is one AVX-512 vector or two AVX2 ones scanned in turn. NT builds each row in
// a buffer that stays in cache and streams it to y past the caches (see below).

#include <stdlib.h>
#include <string.h>

#ifndef VEC
#define VEC 0
#endif
#ifndef ROWS
#define ROWS 1
#endif
#if ROWS != 1 && ROWS != 2 && ROWS != 4
#error "ROWS must be 1, 2 or 4"
#endif
#ifndef NT
#define NT 0
#endif
#ifndef THREADS
#define THREADS 1
#endif

#define PRAGMA(x) _Pragma(#x)

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
   same code stores normally. The kernel computes into a buffer that stays in cache, then streams it. */
#if defined(__SSE__)
#include <immintrin.h>
#endif
#define VW (WIDE / 4)
typedef float vw_t __attribute__((vector_size(WIDE)));

/* dst[0:n] = src[0:n]; the part of dst aligned to whole vectors through streaming stores */
static void stream_out(float *restrict dst, const float *restrict src, long n) {
    long i = 0;
    for (; i < n && (unsigned long)(dst + i) % sizeof(vw_t); i++)
        dst[i] = src[i];
    for (; i + VW <= n; i += VW) {
        vw_t v;
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

#if VEC > 0
#if ROWS != 1
#error "ROWS > 1 is the scalar kernel's (VEC = 0)"
#endif
#define VB (4 * VEC < WIDE ? 4 * VEC : WIDE) /* bytes per vector */
#define L (VB / 4)                           /* lanes per vector */
#define NV (VEC / L)                         /* vectors per step */
typedef float vf __attribute__((vector_size(VB)));

/* v shifted up by k lanes, zeros shifted in: shifted adds of 1, 2, 4, ... lanes scan a vector */
#define Z ((vf){0})
#if L == 4
#define SCAN(v)                                                    \
    do {                                                           \
        v += __builtin_shufflevector(Z, v, 0, 4, 5, 6);            \
        v += __builtin_shufflevector(Z, v, 0, 1, 4, 5);            \
    } while (0)
#elif L == 8
#define SCAN(v)                                                                  \
    do {                                                                         \
        v += __builtin_shufflevector(Z, v, 0, 8, 9, 10, 11, 12, 13, 14);         \
        v += __builtin_shufflevector(Z, v, 0, 1, 8, 9, 10, 11, 12, 13);          \
        v += __builtin_shufflevector(Z, v, 0, 1, 2, 3, 8, 9, 10, 11);            \
    } while (0)
#elif L == 16
#define SCAN(v)                                                                                      \
    do {                                                                                             \
        v += __builtin_shufflevector(Z, v, 0, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28,   \
                                     29, 30);                                                        \
        v += __builtin_shufflevector(Z, v, 0, 1, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,    \
                                     28, 29);                                                        \
        v += __builtin_shufflevector(Z, v, 0, 1, 2, 3, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,  \
                                     27);                                                            \
        v += __builtin_shufflevector(Z, v, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23); \
    } while (0)
#endif

static void scan_row(const float *restrict xr, float *restrict yr, int cols) {
    float run = 0.0f;
    int c = 0;
    for (; c + VEC <= cols; c += VEC)
        for (int a = 0; a < NV; a++) {
            vf v;
            memcpy(&v, xr + c + a * L, sizeof v); /* unaligned load */
            SCAN(v);
            v += run;
            run = v[L - 1];
            memcpy(yr + c + a * L, &v, sizeof v);
        }
    for (; c < cols; c++)
        yr[c] = run += xr[c];
}

/* the vector kernel scans one row at a time */
#define scan_rows(x, y, cols) scan_row(x, y, cols)

#else
/* ROWS rows in one sweep, each its own running sum (named scalars: GCC keeps them in registers) */
static void scan_rows(const float *restrict x0, float *restrict y0, int cols) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (int c = 0; c < cols; c++) {
        y0[c] = s0 += x0[c];
#if ROWS > 1
        y0[(long)cols + c] = s1 += x0[(long)cols + c];
#endif
#if ROWS > 2
        y0[2L * cols + c] = s2 += x0[2L * cols + c];
        y0[3L * cols + c] = s3 += x0[3L * cols + c];
#endif
    }
    (void)s1, (void)s2, (void)s3;
}

static void scan_row(const float *restrict xr, float *restrict yr, int cols) {
    float s = 0.0f;
    for (int c = 0; c < cols; c++)
        yr[c] = s += xr[c];
}
#endif

void cumsum(const float *x, float *y, int rows, int cols) {
    int full = rows - rows % ROWS;
    PRAGMA(omp parallel num_threads(THREADS) if(THREADS > 1))
    {
        /* NT: this thread's block of rows, built in cache (out of memory: rows go straight to y) */
        float *t = NT ? malloc(sizeof(float) * ROWS * (cols > 0 ? cols : 1)) : NULL;
        PRAGMA(omp for schedule(static))
        for (int r = 0; r < full; r += ROWS) {
            const float *xr = x + (long)r * cols;
            float *yr = y + (long)r * cols;
            scan_rows(xr, t ? t : yr, cols);
#if NT
            if (t)
                stream_out(yr, t, (long)ROWS * cols);
#endif
        }
        free(t);
#if NT
        FENCE();
#endif
    }
    /* leftover rows when ROWS does not divide rows */
    for (int r = full; r < rows; r++)
        scan_row(x + (long)r * cols, y + (long)r * cols, cols);
}
