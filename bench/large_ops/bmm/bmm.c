// kope: kernel void bmm(const float *A, const float *B, float *C, int batch, int m, int n, int k)
// kope: param ORDER = 0 | 1 | 2 | 3
// kope: param MT = 1 | 2 | 4 | 8
// kope: param NB = 8 | 16 | 32 | 64
// kope: param UNROLL = 1 | 2 | 4
// kope: param PACK = 0 | 1
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 | -O3 -march=native | -O3 -march=native -funroll-loops
// kope: require ORDER == 3 or (MT == 1 and NB == 8)
// kope: require MT * NB <= 128
// kope: require PACK == 0 or ORDER in [0, 3]
//
// Batched small matrix products, all row-major: C[b] = A[b] @ B[b], with A[b] m x k,
// B[b] k x n and C[b] m x n, for many small matrices (tens of rows and columns), so a
// whole product lives in L1/L2 and the loop structure decides the speed.
//   ORDER 0: i-j-k (the default): each C element is a dot product down a column of B
//            (a strided walk and a serial chain of dependent adds). PACK 1 first
//            transposes B into a per-thread buffer, so the dot product reads both rows
//            contiguously.
//   ORDER 1: i-k-j: each row of C accumulates scaled rows of B (contiguous, vectorizable).
//   ORDER 2: k-i-j: for each k, the whole of C takes a rank-1 update (C reread k times).
//   ORDER 3: register tiles: MT rows x NB columns of C accumulated in a local array across
//            the whole k loop, then stored once; the tile stays in vector registers while
//            MT * NB floats fit (AVX2: 16 registers of 8 floats, AVX-512: 32 of 16). A
//            tile cut short by the edge of C (n not a multiple of NB, m of MT) takes the
//            same loops with run-time bounds, its sums in memory. PACK 1 copies each
//            NB-wide column panel of B into a contiguous k x NB buffer first (zero-padded
//            past n), so every tile reads whole, unit-stride rows of the panel.
// UNROLL asks GCC to unroll the loop over k that many times.
// THREADS splits the batch over OpenMP threads.

#include <stdlib.h>

#ifndef ORDER
#define ORDER 0
#endif
#ifndef MT
#define MT 1
#endif
#ifndef NB
#define NB 8
#endif
#ifndef UNROLL
#define UNROLL 1
#endif
#ifndef PACK
#define PACK 0
#endif
#ifndef THREADS
#define THREADS 1
#endif

#define PRAGMA(x) _Pragma(#x)
#define UNROLL_BY(u) PRAGMA(GCC unroll u)
#define UNROLLED UNROLL_BY(UNROLL)

#if ORDER == 0
/* one product; bt: a k x n scratch when PACK (B transposed into it) */
static void one(const float *restrict a, const float *restrict b, float *restrict c, int m, int n, int k,
                float *restrict bt) {
#if PACK
    for (int p = 0; p < k; p++)
        for (int j = 0; j < n; j++)
            bt[(long)j * k + p] = b[(long)p * n + j];
#endif
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float s = 0.0f;
            UNROLLED
            for (int p = 0; p < k; p++)
#if PACK
                s += a[(long)i * k + p] * bt[(long)j * k + p];
#else
                s += a[(long)i * k + p] * b[(long)p * n + j];
#endif
            c[(long)i * n + j] = s;
        }
    (void)bt;
}
#elif ORDER == 1
static void one(const float *restrict a, const float *restrict b, float *restrict c, int m, int n, int k,
                float *restrict bt) {
    (void)bt;
    for (int i = 0; i < m; i++) {
        float *restrict ci = c + (long)i * n;
        for (int j = 0; j < n; j++)
            ci[j] = 0.0f;
        UNROLLED
        for (int p = 0; p < k; p++) {
            float av = a[(long)i * k + p];
            const float *restrict bp = b + (long)p * n;
            for (int j = 0; j < n; j++)
                ci[j] += av * bp[j];
        }
    }
}
#elif ORDER == 2
static void one(const float *restrict a, const float *restrict b, float *restrict c, int m, int n, int k,
                float *restrict bt) {
    (void)bt;
    for (long e = 0; e < (long)m * n; e++)
        c[e] = 0.0f;
    UNROLLED
    for (int p = 0; p < k; p++) {
        const float *restrict bp = b + (long)p * n;
        for (int i = 0; i < m; i++) {
            float av = a[(long)i * k + p];
            float *restrict ci = c + (long)i * n;
            for (int j = 0; j < n; j++)
                ci[j] += av * bp[j];
        }
    }
}
#else
/* C[i0:i0+mr, j0:j0+nr] from rows of B (or of a packed panel) with row stride ldb */
static inline __attribute__((always_inline)) void tile(const float *restrict a, const float *restrict bj,
                                                       long ldb, float *restrict c, int n, int k, int i0,
                                                       int j0, int mr, int nr) {
    float acc[MT][NB];
    for (int r = 0; r < MT; r++)
        for (int j = 0; j < NB; j++)
            acc[r][j] = 0.0f;
    UNROLLED
    for (int p = 0; p < k; p++) {
        const float *restrict bp = bj + p * ldb;
        for (int r = 0; r < mr; r++) {
            float av = a[(long)(i0 + r) * k + p];
            PRAGMA(omp simd)
            for (int j = 0; j < nr; j++)
                acc[r][j] += av * bp[j];
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++)
            c[(long)(i0 + r) * n + j0 + j] = acc[r][j];
}

/* bt: a k x NB scratch when PACK */
static void one(const float *restrict a, const float *restrict b, float *restrict c, int m, int n, int k,
                float *restrict bt) {
    for (int j0 = 0; j0 < n; j0 += NB) {
        int nr = n - j0 < NB ? n - j0 : NB;
        const float *bj = b + j0;
        long ldb = n;
#if PACK
        for (int p = 0; p < k; p++)
            for (int j = 0; j < NB; j++)
                bt[(long)p * NB + j] = j < nr ? b[(long)p * n + j0 + j] : 0.0f;
        bj = bt;
        ldb = NB;
#endif
        (void)bt;
        int i0 = 0;
        if (nr == NB) /* full-width tiles: constant bounds, the tile in registers */
            for (; i0 + MT <= m; i0 += MT)
                tile(a, bj, ldb, c, n, k, i0, j0, MT, NB);
        for (; i0 < m; i0 += MT)
            tile(a, bj, ldb, c, n, k, i0, j0, m - i0 < MT ? m - i0 : MT, nr);
    }
}
#endif

#if PACK && ORDER == 0
#define SCRATCH(m, n, k) ((size_t)(k) * (n))
#elif PACK
#define SCRATCH(m, n, k) ((size_t)(k) * NB)
#else
#define SCRATCH(m, n, k) ((size_t)0)
#endif

/* the slow, allocation-free path: when a scratch buffer cannot be had */
static void plain(const float *a, const float *b, float *c, int m, int n, int k) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float s = 0.0f;
            for (int p = 0; p < k; p++)
                s += a[(long)i * k + p] * b[(long)p * n + j];
            c[(long)i * n + j] = s;
        }
}

void bmm(const float *A, const float *B, float *C, int batch, int m, int n, int k) {
    PRAGMA(omp parallel num_threads(THREADS) if(THREADS > 1))
    {
        size_t words = SCRATCH(m, n, k);
        float *bt = words ? malloc(sizeof(float) * words) : NULL;
        PRAGMA(omp for schedule(static))
        for (int b = 0; b < batch; b++) {
            const float *a = A + (long)b * m * k, *bb = B + (long)b * k * n;
            float *c = C + (long)b * m * n;
            if (words && !bt)
                plain(a, bb, c, m, n, k);
            else
                one(a, bb, c, m, n, k, bt);
        }
        free(bt);
    }
}
