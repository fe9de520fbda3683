// kope: kernel void transpose(const float *x, float *y, int rows, int cols)
// kope: param BLOCK = 0 | 4 | 8 | 16 | 32 | 64
// kope: param NT = 0 | 1
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 | -O3 -march=native
// kope: require BLOCK > 0 or THREADS == 1
// kope: require NT == 0 or BLOCK >= 16
//
// y = x.T for a row-major rows x cols matrix x (y is cols x rows). The default
// (BLOCK = 0) walks x in order and writes y with a stride of `rows` floats, so
// each store touches a new cache line, and with a power-of-two stride all of
// them fight over the same cache sets. BLOCK > 0 transposes BLOCK x BLOCK tiles
// so both sides stay in cache; THREADS splits the tile rows. NT copies each
// tile transposed into a local buffer and streams its rows into y as whole
// aligned vectors, past the caches (see below); rows of x that would leave a
// row of y unaligned (and every row, when rows is not a whole number of
// vectors) are copied plainly.

#ifndef BLOCK
#define BLOCK 0
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

/* one whole aligned vector of y, past the caches */
static inline void put(float *dst, vf v) {
#if defined(__AVX512F__)
    _mm512_stream_ps(dst, (__m512)v);
#elif defined(__AVX__)
    _mm256_stream_ps(dst, (__m256)v);
#elif defined(__SSE__)
    _mm_stream_ps(dst, (__m128)v);
#else
    __builtin_memcpy(dst, &v, sizeof v);
#endif
}

/* streaming stores are weakly ordered: each thread fences before the kernel returns */
#if defined(__SSE__)
#define FENCE() _mm_sfence()
#else
#define FENCE()
#endif
#endif

#define PRAGMA(x) _Pragma(#x)

#if NT
static void plain_rows(const float *x, float *y, int rows, int cols, int lo, int hi) {
    for (int i = lo; i < hi; i++)
        for (int j = 0; j < cols; j++)
            y[(long)j * rows + i] = x[(long)i * cols + j];
}

static void transpose_nt(const float *x, float *y, int rows, int cols) {
    /* every row of y starts at the same alignment when rows is a whole number of vectors: rows
       [a0, a1) of x then fill whole aligned vectors of y, tile by tile */
    int a0 = (int)((VW - (unsigned long)y / sizeof(float) % VW) % VW), a1 = 0;
    if (rows % VW == 0 && rows >= a0 + BLOCK)
        a1 = a0 + (rows - a0) / BLOCK * BLOCK;
    else
        a0 = 0;
    PRAGMA(omp parallel num_threads(THREADS) if(THREADS > 1))
    {
        float tile[BLOCK][BLOCK] __attribute__((aligned(64)));
        PRAGMA(omp for schedule(static))
        for (int i0 = a0; i0 < a1; i0 += BLOCK) {
            for (int j0 = 0; j0 < cols; j0 += BLOCK) {
                int w = cols - j0 < BLOCK ? cols - j0 : BLOCK;
                for (int i = 0; i < BLOCK; i++)
                    for (int j = 0; j < w; j++)
                        tile[j][i] = x[(long)(i0 + i) * cols + j0 + j];
                for (int j = 0; j < w; j++)
                    for (int v = 0; v < BLOCK; v += VW) {
                        vf t;
                        __builtin_memcpy(&t, &tile[j][v], sizeof t);
                        put(y + (long)(j0 + j) * rows + i0 + v, t);
                    }
            }
        }
        FENCE();
    }
    /* the rows of x outside [a0, a1), plainly */
    plain_rows(x, y, rows, cols, 0, a0);
    plain_rows(x, y, rows, cols, a1, rows);
}
#endif

void transpose(const float *x, float *y, int rows, int cols) {
#if NT
    transpose_nt(x, y, rows, cols);
#elif BLOCK == 0
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++)
            y[(long)j * rows + i] = x[(long)i * cols + j];
#else
    PRAGMA(omp parallel for num_threads(THREADS) if(THREADS > 1) schedule(static))
    for (int i0 = 0; i0 < rows; i0 += BLOCK) {
        int i1 = i0 + BLOCK < rows ? i0 + BLOCK : rows;
        for (int j0 = 0; j0 < cols; j0 += BLOCK) {
            int j1 = j0 + BLOCK < cols ? j0 + BLOCK : cols;
            if (i1 - i0 == BLOCK && j1 - j0 == BLOCK) {
                /* full tile: constant trip counts let the compiler unroll it */
                for (int j = 0; j < BLOCK; j++)
                    for (int i = 0; i < BLOCK; i++)
                        y[(long)(j0 + j) * rows + i0 + i] = x[(long)(i0 + i) * cols + j0 + j];
            } else {
                for (int j = j0; j < j1; j++)
                    for (int i = i0; i < i1; i++)
                        y[(long)j * rows + i] = x[(long)i * cols + j];
            }
        }
    }
#endif
}
