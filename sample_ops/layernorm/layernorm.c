// kope: kernel void layernorm(const float *x, const float *w, const float *b, float *y, int rows, int cols)
// kope: param VEC = 0 | 4 | 8 | 16
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 -march=native | -O3 -march=native -fno-math-errno -fno-trapping-math
//
// Layer norm over each row: y = (x - mean) / sqrt(var + 1e-5) * w + b, with the
// biased variance. Two passes for the statistics (a one-pass sum of squares
// cancels badly when the mean is large). The default is plain scalar loops, where
// each float sum is a serial dependency chain; VEC is the `omp simd` length,
// which splits the sums into independent lanes.

#include <math.h>

#ifndef VEC
#define VEC 0
#endif
#ifndef THREADS
#define THREADS 1
#endif

#define EPS 1e-5f
#define PRAGMA(x) _Pragma(#x)
#if VEC > 0
#define SIMD(...) PRAGMA(omp simd simdlen(VEC) __VA_ARGS__)
#else
#define SIMD(...)
#endif

void layernorm(const float *x, const float *w, const float *b, float *y, int rows, int cols) {
    PRAGMA(omp parallel for num_threads(THREADS) if(THREADS > 1) schedule(static))
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float *yr = y + (long)r * cols;
        float s = 0.0f;
        SIMD(reduction(+ : s))
        for (int c = 0; c < cols; c++)
            s += xr[c];
        float mean = s / cols;
        float q = 0.0f;
        SIMD(reduction(+ : q))
        for (int c = 0; c < cols; c++)
            q += (xr[c] - mean) * (xr[c] - mean);
        float rstd = 1.0f / sqrtf(q / cols + EPS);
        SIMD()
        for (int c = 0; c < cols; c++)
            yr[c] = (xr[c] - mean) * rstd * w[c] + b[c];
    }
}
