// kope: kernel void cdist(const float *a, const float *b, float *dist, int n, int m, int dim)
// kope: param ALGO = 0 | 1 | 2
// kope: param TI = 1 | 2 | 4 | 8
// kope: param TJ = 8 | 16 | 32 | 64
// kope: param VEC = 0 | 4 | 8 | 16
// kope: param NT = 0 | 1
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 | -O3 -march=native | -O3 -march=native -fno-math-errno -fno-trapping-math
// kope: require ALGO > 0 or TI == 1
// kope: require ALGO == 2 or TJ == 8
//
// Pairwise squared Euclidean distances: a is n x dim, b is m x dim, dist is n x m (row-major),
//   dist[i][j] = sum over d < dim of (a[i][d] - b[j][d])^2
// Each term is a difference squared, never |a|^2 + |b|^2 - 2 a.b: that expansion cancels
// catastrophically when the points share a large offset. Every a row serves m distances and every
// b row n, so the kernel is bound by arithmetic and by how often each load is reused.
//   ALGO 0: direct (the default): each distance is one loop over d, a serial chain of dependent
//           adds unless VEC splits it into lanes (`omp simd simdlen(VEC) reduction`).
//   ALGO 1: row tiles: TI rows of a against one row of b at a time, TI accumulators, d inner
//           (each b load serves TI rows; VEC applies to the d loop, an array reduction).
//   ALGO 2: transposed panels: b is copied once per call into d-major panels of TJ columns
//           (bt[d][j] within a panel, the last panel padded with zeros), and a TI x TJ block of
//           dist is accumulated in a local array, d outer, j inner (vectorizable across j; VEC is
//           the simdlen of the j loop). The block lives in vector registers while TI * TJ floats
//           fit in them (AVX2: 16 registers of 8, AVX-512: 32 of 16); larger blocks spill.
//           Without VEC, GCC 12 at -O3 does not vectorize the j loop (it tries the TI loop): ~10x slower.
// Rows left over when n % TI != 0 (ALGO 1, 2) take the direct path; ALGO 2 computes a cut-short
// last panel in full (on the zero padding) and stores only its columns inside dist.
// NT streams the rows of dist past the caches (see below). THREADS splits the row tiles over
// OpenMP threads.

#include <stdlib.h>

#ifndef ALGO
#define ALGO 0
#endif
#ifndef TI
#define TI 1
#endif
#ifndef TJ
#define TJ 8
#endif
#ifndef VEC
#define VEC 0
#endif
#ifndef NT
#define NT 0
#endif
#ifndef THREADS
#define THREADS 1
#endif

#if NT
/* NT: the output leaves through streaming (non-temporal) stores, which write whole cache lines
   without first reading them from memory (write-allocate). x86 has them (the widest the flags
   enable); elsewhere the same code stores normally. The kernel computes a row tile into a buffer
   that stays in cache, then streams it. */
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

#define PRAGMA(x) _Pragma(#x)
#if VEC > 0
#define SIMD(...) PRAGMA(omp simd simdlen(VEC) __VA_ARGS__)
#else
#define SIMD(...)
#endif
#define INLINE static inline __attribute__((always_inline))

/* one distance, directly */
INLINE float dist1(const float *ar, const float *br, int dim) {
    float s = 0.0f;
    SIMD(reduction(+ : s))
    for (int d = 0; d < dim; d++)
        s += (ar[d] - br[d]) * (ar[d] - br[d]);
    return s;
}

/* rows [0, rows) of a row tile (a and o start at its first row), every column, directly */
INLINE void direct(const float *a, const float *b, float *o, int rows, int m, int dim) {
    for (int q = 0; q < rows; q++)
        for (int j = 0; j < m; j++)
            o[(long)q * m + j] = dist1(a + (long)q * dim, b + (long)j * dim, dim);
}

#if ALGO == 2
/* b as d-major panels of TJ columns: panel p holds bt[p][d][jj] = b[p * TJ + jj][d], zeros past m;
   NULL when out of memory (then every row takes the direct path) */
static float *pack(const float *b, int m, int dim) {
    long panels = (m + TJ - 1) / TJ;
    float *bt = malloc(sizeof(float) * (size_t)(panels * TJ * (dim > 0 ? dim : 1)));
    if (!bt)
        return NULL;
    for (long p = 0; p < panels; p++)
        for (int d = 0; d < dim; d++)
            for (int jj = 0; jj < TJ; jj++) {
                long j = p * TJ + jj;
                bt[(p * dim + d) * TJ + jj] = j < m ? b[j * dim + d] : 0.0f;
            }
    return bt;
}
#endif

/* one row tile of dist: `rows` (TI, or fewer at the end) rows of a against every row of b */
INLINE void row_tile(const float *a, const float *b, const float *bt, float *restrict o, int rows, int m,
                     int dim) {
    (void)bt;
#if ALGO == 1
    if (rows < TI) {
        direct(a, b, o, rows, m, dim);
        return;
    }
    for (int j = 0; j < m; j++) {
        const float *br = b + (long)j * dim;
        float acc[TI];
        for (int q = 0; q < TI; q++)
            acc[q] = 0.0f;
        SIMD(reduction(+ : acc[:TI]))
        for (int d = 0; d < dim; d++) {
            float bv = br[d];
            for (int q = 0; q < TI; q++) {
                float t = a[(long)q * dim + d] - bv;
                acc[q] += t * t;
            }
        }
        for (int q = 0; q < TI; q++)
            o[(long)q * m + j] = acc[q];
    }
#elif ALGO == 2
    if (rows < TI || !bt) {
        direct(a, b, o, rows, m, dim);
        return;
    }
    for (int j0 = 0; j0 < m; j0 += TJ) {
        const float *restrict bp = bt + (long)j0 * dim; /* panel j0 / TJ: TJ * dim floats */
        float acc[TI][TJ];
        for (int q = 0; q < TI; q++)
            for (int jj = 0; jj < TJ; jj++)
                acc[q][jj] = 0.0f;
        for (int d = 0; d < dim; d++)
            for (int q = 0; q < TI; q++) {
                float av = a[(long)q * dim + d];
                SIMD()
                for (int jj = 0; jj < TJ; jj++) {
                    float t = av - bp[(long)d * TJ + jj];
                    acc[q][jj] += t * t;
                }
            }
        int jn = m - j0 < TJ ? m - j0 : TJ; /* the last panel may be cut short by m */
        for (int q = 0; q < TI; q++)
            for (int jj = 0; jj < jn; jj++)
                o[(long)q * m + j0 + jj] = acc[q][jj];
    }
#else
    direct(a, b, o, rows, m, dim);
#endif
}

#if ALGO > 0
#define RSTEP TI
#else
#define RSTEP 1
#endif

void cdist(const float *a, const float *b, float *dist, int n, int m, int dim) {
    if (n <= 0 || m <= 0)
        return; /* an empty dist: nothing to do (dim 0 gives zeros through the empty sums) */
    float *bt = NULL;
#if ALGO == 2
    bt = pack(b, m, dim);
#endif
    int tiles = (n + RSTEP - 1) / RSTEP;
    PRAGMA(omp parallel num_threads(THREADS) if(THREADS > 1))
    {
        /* NT: this thread's row-tile buffer (out of memory: tiles go straight to dist) */
        float *t = NT ? malloc(sizeof(float) * RSTEP * (size_t)m) : NULL;
        PRAGMA(omp for schedule(static))
        for (int it = 0; it < tiles; it++) {
            int i0 = it * RSTEP, rows = n - i0 < RSTEP ? n - i0 : RSTEP;
            float *dr = dist + (long)i0 * m, *o = t ? t : dr;
            row_tile(a + (long)i0 * dim, b, bt, o, rows, m, dim);
#if NT
            if (t)
                stream_out(dr, t, (long)rows * m);
#endif
        }
        free(t);
#if NT
        FENCE();
#endif
    }
    free(bt);
}
