// kope: kernel void rowsum(const float *x, float *y, int rows, int cols)
// kope: param VEC = 0 | 4 | 8 | 16
// kope: param ROWS = 1 | 2 | 4
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 -march=native | -O3 -march=native -fno-math-errno -fno-trapping-math
//
// y[r] = sum of row r. The default is one scalar sum per row, a serial chain of
// dependent float adds that runs far below memory bandwidth. VEC is the `omp simd`
// length (independent partial sums per lane); ROWS sums that many rows in one
// sweep, more independent chains for the scalar and narrow-vector points.

#ifndef VEC
#define VEC 0
#endif
#ifndef ROWS
#define ROWS 1
#endif
#if ROWS != 1 && ROWS != 2 && ROWS != 4
#error "ROWS must be 1, 2 or 4"
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

void rowsum(const float *x, float *y, int rows, int cols) {
    int full = rows - rows % ROWS;
    PRAGMA(omp parallel for num_threads(THREADS) if(THREADS > 1) schedule(static))
    for (int r = 0; r < full; r += ROWS) {
        /* named scalars, not an array: GCC keeps these in registers under simd */
        const float *x0 = x + (long)r * cols;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        SIMD(reduction(+ : s0, s1, s2, s3))
        for (int c = 0; c < cols; c++) {
            s0 += x0[c];
#if ROWS > 1
            s1 += x0[(long)cols + c];
#endif
#if ROWS > 2
            s2 += x0[2L * cols + c];
            s3 += x0[3L * cols + c];
#endif
        }
        y[r] = s0;
#if ROWS > 1
        y[r + 1] = s1;
#endif
#if ROWS > 2
        y[r + 2] = s2;
        y[r + 3] = s3;
#endif
    }
    /* leftover rows when ROWS does not divide rows */
    for (int r = full; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float s = 0.0f;
        SIMD(reduction(+ : s))
        for (int c = 0; c < cols; c++)
            s += xr[c];
        y[r] = s;
    }
}
