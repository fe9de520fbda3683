// kope: kernel void matvec(const float *A, const float *x, float *y, int batch, int m, int n)
// kope: param VEC = 0 | 8 | 16
// kope: param ACC = 1 | 2 | 4
// kope: param ROWS = 1 | 2 | 4
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 -march=native | -O3 -march=native -fno-math-errno -fno-trapping-math
// kope: require ACC == 1 or VEC > 0
// kope: require ACC == 1 or ROWS == 1
//
// Batched matrix-vector product: y[b] = A[b] @ x[b], with A[b] an m x n
// row-major matrix, x[b] of length n and y[b] of length m. Each y element is a
// dot product of one row of A with x; A is read once, so the kernel is bound by
// memory bandwidth once the dot products run fast enough. The default is one
// scalar dot product per row (a serial chain of dependent adds). VEC is the
// `omp simd` length (independent partial sums per lane). ROWS computes that many
// rows in one sweep over x, so each load of x serves ROWS rows. ACC > 1 sums
// one row at a time in ACC independent accumulators of VEC lanes each (GCC
// vector extensions), each held in vectors of the width the target has (the
// flags select it), never wider. THREADS split the rows of all batches. No
// streaming stores: y is m floats per n read, too little to matter.

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
#if VEC <= 0 || ROWS != 1
#error "ACC > 1 needs VEC > 0 and ROWS == 1"
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

static float dot(const float *a, const float *x, int n) {
    vf s[NV];
    for (int k = 0; k < NV; k++)
        s[k] = (vf){0};
    int c = 0;
    for (; c + STEP <= n; c += STEP)
        for (int k = 0; k < NV; k++) {
            vf u, v;
            memcpy(&u, a + c + k * (VB / 4), sizeof u); /* unaligned loads */
            memcpy(&v, x + c + k * (VB / 4), sizeof v);
            s[k] += u * v;
        }
    for (; c + VB / 4 <= n; c += VB / 4) {
        vf u, v;
        memcpy(&u, a + c, sizeof u);
        memcpy(&v, x + c, sizeof v);
        s[0] += u * v;
    }
    for (int k = 1; k < NV; k++)
        s[0] += s[k];
    float t = 0.0f;
    for (int j = 0; j < VB / 4; j++)
        t += s[0][j];
    for (; c < n; c++)
        t += a[c] * x[c];
    return t;
}
#else
static float dot(const float *a, const float *x, int n) {
    float s = 0.0f;
    SIMD(reduction(+ : s))
    for (int c = 0; c < n; c++)
        s += a[c] * x[c];
    return s;
}
#endif

/* ROWS consecutive rows of one matrix against the same x (named scalars: kept in registers) */
static void dot_rows(const float *a0, const float *x, float *y, int n) {
#if ROWS == 1
    y[0] = dot(a0, x, n);
#else
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    SIMD(reduction(+ : s0, s1, s2, s3))
    for (int c = 0; c < n; c++) {
        float xc = x[c];
        s0 += a0[c] * xc;
        s1 += a0[(long)n + c] * xc;
#if ROWS > 2
        s2 += a0[2L * n + c] * xc;
        s3 += a0[3L * n + c] * xc;
#endif
    }
    y[0] = s0;
    y[1] = s1;
#if ROWS > 2
    y[2] = s2;
    y[3] = s3;
#endif
    (void)s2, (void)s3;
#endif
}

void matvec(const float *A, const float *x, float *y, int batch, int m, int n) {
    /* tasks are blocks of ROWS rows of one matrix; a matrix's last block may be shorter */
    long blocks = (m + ROWS - 1) / ROWS, tasks = (long)batch * blocks;
    PRAGMA(omp parallel for num_threads(THREADS) if(THREADS > 1) schedule(static))
    for (long t = 0; t < tasks; t++) {
        long b = t / blocks;
        int r0 = (int)(t % blocks) * ROWS;
        const float *a = A + (b * m + r0) * (long)n, *xb = x + b * n;
        float *yb = y + b * m + r0;
        if (r0 + ROWS <= m)
            dot_rows(a, xb, yb, n);
        else
            for (int r = 0; r < m - r0; r++)
                yb[r] = dot(a + (long)r * n, xb, n);
    }
}
