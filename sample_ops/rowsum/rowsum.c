// kope: kernel void rowsum(const float *x, float *y, int rows, int cols)
// kope: param VEC = 0 | 4 | 8 | 16
// kope: param ACC = 1 | 2 | 4
// kope: param ROWS = 1 | 2 | 4
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 -march=native | -O3 -march=native -fno-math-errno -fno-trapping-math
// kope: require ACC == 1 or (VEC > 0 and ROWS == 1)
//
// y[r] = sum of row r. The default is one scalar sum per row, a serial chain of
// dependent float adds that runs far below memory bandwidth. VEC is the `omp simd`
// length (independent partial sums per lane); ROWS sums that many rows in one
// sweep, more independent chains for the scalar and narrow-vector points.
// ACC > 1 sums one row at a time in ACC independent accumulators of VEC lanes each
// (GCC vector extensions), one read stream per thread as torch's sum does: the
// add latency of one chain is hidden by the others. Each accumulator is held in
// vectors of the width the target has (the flags select it), never wider, so
// VEC = 16 is one AVX-512 vector or two AVX2 ones, never a 64-byte vector the
// compiler would have to emulate.

#include <string.h>

#ifndef VEC
#define VEC 0
#endif
#ifndef ACC
#define ACC 1
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

#if ACC > 1
#if VEC <= 0
#error "ACC > 1 needs VEC > 0"
#endif
/* the widest vector the target has, in bytes (what the flags select) */
#if defined(__AVX512F__)
#define WIDE 64
#elif defined(__AVX__)
#define WIDE 32
#else
#define WIDE 16
#endif
#define VB (4 * VEC < WIDE ? 4 * VEC : WIDE) /* bytes per vector */
#define NV (ACC * 4 * VEC / VB)              /* independent vectors: ACC accumulators of VEC lanes */
#define STEP (NV * VB / 4)                   /* floats per sweep of all accumulators */
typedef float vf __attribute__((vector_size(VB)));

static float sum_row(const float *xr, int cols) {
    vf s[NV];
    for (int a = 0; a < NV; a++)
        s[a] = (vf){0};
    int c = 0;
    for (; c + STEP <= cols; c += STEP)
        for (int a = 0; a < NV; a++) {
            vf v;
            memcpy(&v, xr + c + a * (VB / 4), sizeof v); /* unaligned load */
            s[a] += v;
        }
    for (; c + VB / 4 <= cols; c += VB / 4) {
        vf v;
        memcpy(&v, xr + c, sizeof v);
        s[0] += v;
    }
    for (int a = 1; a < NV; a++)
        s[0] += s[a];
    float t = 0.0f;
    for (int j = 0; j < VB / 4; j++)
        t += s[0][j];
    for (; c < cols; c++)
        t += xr[c];
    return t;
}

void rowsum(const float *x, float *y, int rows, int cols) {
    PRAGMA(omp parallel for num_threads(THREADS) if(THREADS > 1) schedule(static))
    for (int r = 0; r < rows; r++)
        y[r] = sum_row(x + (long)r * cols, cols);
}

#else

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

#endif
