// kope: kernel void stencil2d(const float *x, const float *w, float *y, int rows, int cols)
// kope: param ALGO = 0 | 1 | 2
// kope: param BX = 0 | 64 | 256 | 1024
// kope: param RB = 1 | 2 | 4
// kope: param VEC = 0 | 4 | 8 | 16
// kope: param NT = 0 | 1
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 | -O3 -march=native | -O3 -march=native -fno-math-errno -fno-trapping-math
// kope: require ALGO > 0 or BX == 0
// kope: require ALGO == 2 or RB == 1
//
// One sweep of a 3 x 3 stencil over a rows x cols grid ("same" size, zero outside the grid):
//   y[i][j] = sum over di, dj in {-1, 0, 1} of w[(di + 1) * 3 + dj + 1] * x[i + di][j + dj]
// Nine multiply-adds per output for two floats of memory traffic: on a grid larger than the
// caches the kernel is bound by memory and by how well its inner loops vectorize.
//   ALGO 0: direct (the default): each output checks each tap against the edges of the grid.
//   ALGO 1: interior split: the first and last row and column take the direct path; the other
//           outputs are one branch-free nine-tap expression, columns inner.
//   ALGO 2: input-row order: RB output rows at a time; each input row that touches the block is
//           read once and added into every output row it feeds (three taps a row), so an input
//           row is loaded from memory once per block, not once per output row it serves.
// BX (ALGO 1, 2) sweeps the columns in blocks of BX (0: whole rows), so that the rows a block
// reads stay in L1 while the block's output rows are written.
// VEC is the `omp simd` length of the loops over columns (0: none).
// NT streams the output rows past the caches (see below) from a per-thread buffer.
// THREADS splits the rows (ALGO 2: blocks of RB rows) over OpenMP threads.

#include <stdlib.h>

#ifndef ALGO
#define ALGO 0
#endif
#ifndef BX
#define BX 0
#endif
#ifndef RB
#define RB 1
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
   without first reading them from memory (write-allocate): a third less traffic for a kernel that
   reads one buffer and writes another. x86 has them (the widest the flags enable); elsewhere the
   same code stores normally. */
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
#define SIMD() PRAGMA(omp simd simdlen(VEC))
#else
#define SIMD()
#endif
#define INLINE static inline __attribute__((always_inline))

#if ALGO == 2
#define ROWSTEP RB
#else
#define ROWSTEP 1
#endif

/* output row i, columns [j0, j1), into o (o[j] is y[i][j]), checking every tap */
INLINE void direct(const float *x, const float *w, float *o, int rows, int cols, int i, int j0, int j1) {
    SIMD()
    for (int j = j0; j < j1; j++) {
        float s = 0.0f;
        for (int di = -1; di <= 1; di++)
            for (int dj = -1; dj <= 1; dj++) {
                int r = i + di, c = j + dj;
                if (r >= 0 && r < rows && c >= 0 && c < cols)
                    s += w[(di + 1) * 3 + dj + 1] * x[(long)r * cols + c];
            }
        o[j] = s;
    }
}

#if ALGO == 1
/* output row i (0 < i < rows - 1), columns [j0, j1) inside [1, cols - 1): all nine taps exist */
INLINE void interior(const float *x, const float *w, float *restrict o, int cols, int i, int j0, int j1) {
    const float *u = x + (long)(i - 1) * cols, *m = u + cols, *d = m + cols;
    SIMD()
    for (int j = j0; j < j1; j++)
        o[j] = w[0] * u[j - 1] + w[1] * u[j] + w[2] * u[j + 1] + w[3] * m[j - 1] + w[4] * m[j] +
               w[5] * m[j + 1] + w[6] * d[j - 1] + w[7] * d[j] + w[8] * d[j + 1];
}

/* output rows [i0, i0 + 1) into out (stride cols) */
INLINE void block(const float *x, const float *w, float *out, int rows, int cols, int i0) {
    if (i0 == 0 || i0 == rows - 1 || cols < 3) {
        direct(x, w, out, rows, cols, i0, 0, cols);
        return;
    }
    int bw = BX > 0 ? BX : cols;
    direct(x, w, out, rows, cols, i0, 0, 1);
    for (int j0 = 1; j0 < cols - 1; j0 += bw)
        interior(x, w, out, cols, i0, j0, j0 + bw < cols - 1 ? j0 + bw : cols - 1);
    direct(x, w, out, rows, cols, i0, cols - 1, cols);
}
#elif ALGO == 2
/* o[j] += the three taps of kernel row wr over input row xr, columns [j0, j1) inside [1, cols - 1) */
INLINE void add_row(const float *restrict xr, const float *wr, float *restrict o, int j0, int j1) {
    float a = wr[0], b = wr[1], c = wr[2];
    SIMD()
    for (int j = j0; j < j1; j++)
        o[j] += a * xr[j - 1] + b * xr[j] + c * xr[j + 1];
}

/* output rows [i0, i0 + RB) (those inside the grid) into out (stride cols) */
INLINE void block(const float *x, const float *w, float *out, int rows, int cols, int i0) {
    int nr = rows - i0 < RB ? rows - i0 : RB;
    if (cols < 3) {
        for (int q = 0; q < nr; q++)
            direct(x, w, out + (long)q * cols, rows, cols, i0 + q, 0, cols);
        return;
    }
    int bw = BX > 0 ? BX : cols;
    for (int j0 = 1; j0 < cols - 1; j0 += bw) {
        int j1 = j0 + bw < cols - 1 ? j0 + bw : cols - 1;
        for (int q = 0; q < nr; q++)
            for (int j = j0; j < j1; j++)
                out[(long)q * cols + j] = 0.0f;
        for (int r = i0 - 1; r <= i0 + nr; r++) { /* each input row once, into every row it feeds */
            if (r < 0 || r >= rows)
                continue;
            for (int q = 0; q < nr; q++) {
                int di = r - (i0 + q);
                if (di >= -1 && di <= 1)
                    add_row(x + (long)r * cols, w + (di + 1) * 3, out + (long)q * cols, j0, j1);
            }
        }
    }
    for (int q = 0; q < nr; q++) { /* the first and last column */
        direct(x, w, out + (long)q * cols, rows, cols, i0 + q, 0, 1);
        direct(x, w, out + (long)q * cols, rows, cols, i0 + q, cols - 1, cols);
    }
}
#else
INLINE void block(const float *x, const float *w, float *out, int rows, int cols, int i0) {
    direct(x, w, out, rows, cols, i0, 0, cols);
}
#endif

void stencil2d(const float *x, const float *w, float *y, int rows, int cols) {
    if (rows <= 0 || cols <= 0)
        return;
    long blocks = (rows + ROWSTEP - 1) / ROWSTEP;
    PRAGMA(omp parallel num_threads(THREADS) if(THREADS > 1))
    {
        /* NT: this thread's rows buffer (out of memory: rows go straight to y) */
        float *t = NT ? malloc(sizeof(float) * (size_t)cols * ROWSTEP) : NULL;
        PRAGMA(omp for schedule(static))
        for (long bi = 0; bi < blocks; bi++) {
            int i0 = (int)(bi * ROWSTEP), nr = rows - i0 < ROWSTEP ? rows - i0 : ROWSTEP;
            float *yr = y + (long)i0 * cols;
            block(x, w, t ? t : yr, rows, cols, i0);
#if NT
            if (t)
                stream_out(yr, t, (long)nr * cols);
#else
            (void)nr;
#endif
        }
        free(t);
#if NT
        FENCE();
#endif
    }
}
