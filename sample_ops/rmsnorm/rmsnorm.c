// kope: kernel void rmsnorm(const float *x, const float *w, float *y, int rows, int cols)
// kope: param VEC = 0 | 4 | 8 | 16
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 -march=native | -O3 -march=native -fno-math-errno -fno-trapping-math
//
// RMS norm over each row: y = x / sqrt(mean(x^2) + 1e-6) * w. The default is
// plain scalar loops (the sum of squares is one serial dependency chain); VEC is
// the `omp simd` length, which splits the sum into independent lanes.

#include <math.h>

#ifndef VEC
#define VEC 0
#endif
#ifndef THREADS
#define THREADS 1
#endif

#define EPS 1e-6f
#define PRAGMA(x) _Pragma(#x)
#if VEC > 0
#define SIMD(...) PRAGMA(omp simd simdlen(VEC) __VA_ARGS__)
#else
#define SIMD(...)
#endif

void rmsnorm(const float *x, const float *w, float *y, int rows, int cols) {
    PRAGMA(omp parallel for num_threads(THREADS) if(THREADS > 1) schedule(static))
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float *yr = y + (long)r * cols;
        float q = 0.0f;
        SIMD(reduction(+ : q))
        for (int c = 0; c < cols; c++)
            q += xr[c] * xr[c];
        float rrms = 1.0f / sqrtf(q / cols + EPS);
        SIMD()
        for (int c = 0; c < cols; c++)
            yr[c] = xr[c] * rrms * w[c];
    }
}
