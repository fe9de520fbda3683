// kope: kernel void transpose(const float *x, float *y, int rows, int cols)
// kope: param BLOCK = 0 | 4 | 8 | 16 | 32 | 64
// kope: param NT = 0 | 1 | 2
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 | -O3 -march=native
// kope: require BLOCK > 0 or THREADS == 1
// kope: require NT == 0 or BLOCK >= 16
//
// y = x.T for a row-major rows x cols matrix x (y is cols x rows). The default
// (BLOCK = 0) walks x in order and writes y with a stride of `rows` floats, so
// each store touches a new cache line, and with a power-of-two stride all of
// them fight over the same cache sets. BLOCK > 0 transposes BLOCK x BLOCK tiles
// so both sides stay in cache, moving 8 x 8 blocks through vector registers
// where AVX is enabled; THREADS splits the tile rows. NT copies each
// tile transposed into a local buffer and streams its rows into y as whole
// aligned vectors, past the caches (see below); rows of x that would leave a
// row of y unaligned (and every row, when rows is not a whole number of
// vectors) are copied plainly. NT = 2 (with AVX) reads a strip of BLOCK rows of x
// over its whole width, 8 x 8 blocks at a time, and streams each block's rows
// from registers straight into y (no tile buffer): BLOCK long streams for the
// prefetchers instead of short tile rows, and each row of y gets BLOCK floats,
// whole cache lines, at once.

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
#define TR8 0

#if BLOCK >= 8 && defined(__AVX__)
#undef TR8
#define TR8 1
/* An 8 x 8 block moved in registers: eight row loads, three rounds of shuffles (pairs of floats,
   then pairs of pairs, then halves), eight row stores, instead of 64 single-float moves. GCC vector
   extensions; only where AVX is enabled (split into SSE halves it lost to the plain copy). */
typedef float v8 __attribute__((vector_size(8 * sizeof(float))));
typedef int i8 __attribute__((vector_size(8 * sizeof(int))));

/* unaligned loads and stores of 8 floats (macros: no 32-byte vector crosses a function's ABI) */
#define LD8(p) ({ v8 v_; __builtin_memcpy(&v_, (p), sizeof v_); v_; })
#define ST8(p, v) do { v8 s_ = (v); __builtin_memcpy((p), &s_, sizeof s_); } while (0)

/* o[j][i] = src[i * ld_src + j] for i, j < 8: the block's columns, in registers */
static inline void tr8_regs(const float *src, long ld_src, v8 o[8]) {
    v8 r[8], t[8], u[8];
    for (int i = 0; i < 8; i++)
        r[i] = LD8(src + i * ld_src);
    for (int i = 0; i < 8; i += 2) {
        t[i] = __builtin_shuffle(r[i], r[i + 1], (i8){0, 8, 1, 9, 4, 12, 5, 13});
        t[i + 1] = __builtin_shuffle(r[i], r[i + 1], (i8){2, 10, 3, 11, 6, 14, 7, 15});
    }
    for (int i = 0; i < 8; i += 4)
        for (int k = 0; k < 2; k++) {
            u[i + k] = __builtin_shuffle(t[i + k], t[i + k + 2], (i8){0, 1, 8, 9, 4, 5, 12, 13});
            u[i + k + 2] = __builtin_shuffle(t[i + k], t[i + k + 2], (i8){2, 3, 10, 11, 6, 7, 14, 15});
        }
    /* u[0..3] hold columns 0, 2, 1, 3 of rows 0-3 (low half) and 4, 6, 5, 7 (high half); u[4..7] rows 4-7 */
    static const int col[4] = {0, 2, 1, 3};
    for (int k = 0; k < 4; k++) {
        o[col[k]] = __builtin_shuffle(u[k], u[k + 4], (i8){0, 1, 2, 3, 8, 9, 10, 11});
        o[col[k] + 4] = __builtin_shuffle(u[k], u[k + 4], (i8){4, 5, 6, 7, 12, 13, 14, 15});
    }
}

/* dst[j * ld_dst + i] = src[i * ld_src + j] for i, j < 8 */
static inline void tr8(const float *src, long ld_src, float *dst, long ld_dst) {
    v8 o[8];
    tr8_regs(src, ld_src, o);
    for (int j = 0; j < 8; j++)
        ST8(dst + j * ld_dst, o[j]);
}
#endif

#define STRIPS (NT == 2 && TR8) /* NT = 2 without AVX: the tile path */

#if NT
static void plain_rows(const float *x, float *y, int rows, int cols, int lo, int hi) {
    for (int i = lo; i < hi; i++)
        for (int j = 0; j < cols; j++)
            y[(long)j * rows + i] = x[(long)i * cols + j];
}

#if !STRIPS
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
#if TR8
                if (w == BLOCK) {
                    for (int i = 0; i < BLOCK; i += 8)
                        for (int j = 0; j < BLOCK; j += 8)
                            tr8(x + (long)(i0 + i) * cols + j0 + j, cols, &tile[j][i], BLOCK);
                } else
#endif
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
#endif

#if STRIPS
static void transpose_strips(const float *x, float *y, int rows, int cols) {
    /* rows [a0, a1) of x land on whole 64-byte lines of every row of y (rows a multiple of 16): each
       line is written by two streaming stores in a row, so it leaves the core whole */
    int a0 = (int)((16 - (unsigned long)y / sizeof(float) % 16) % 16), a1 = 0, c8 = cols / 8 * 8;
    if (rows % 16 == 0 && rows >= a0 + BLOCK)
        a1 = a0 + (rows - a0) / BLOCK * BLOCK;
    else
        a0 = 0;
    PRAGMA(omp parallel num_threads(THREADS) if(THREADS > 1))
    {
        PRAGMA(omp for schedule(static))
        for (int i0 = a0; i0 < a1; i0 += BLOCK) {
            for (int j = 0; j < c8; j += 8)
                for (int i = i0; i < i0 + BLOCK; i += 16) {
                    v8 lo[8], hi[8];
                    tr8_regs(x + (long)i * cols + j, cols, lo);
                    tr8_regs(x + (long)(i + 8) * cols + j, cols, hi);
                    for (int k = 0; k < 8; k++) {
                        _mm256_stream_ps(y + (long)(j + k) * rows + i, (__m256)lo[k]);
                        _mm256_stream_ps(y + (long)(j + k) * rows + i + 8, (__m256)hi[k]);
                    }
                }
            for (int j = c8; j < cols; j++) /* the last cols % 8 columns */
                for (int i = i0; i < i0 + BLOCK; i++)
                    y[(long)j * rows + i] = x[(long)i * cols + j];
        }
        FENCE();
    }
    plain_rows(x, y, rows, cols, 0, a0);
    plain_rows(x, y, rows, cols, a1, rows);
}
#endif

void transpose(const float *x, float *y, int rows, int cols) {
#if STRIPS
    transpose_strips(x, y, rows, cols);
#elif NT
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
#if TR8
                /* full tile: 8 x 8 blocks in registers */
                for (int i = 0; i < BLOCK; i += 8)
                    for (int j = 0; j < BLOCK; j += 8)
                        tr8(x + (long)(i0 + i) * cols + j0 + j, cols, y + (long)(j0 + j) * rows + i0 + i, rows);
#else
                /* full tile: constant trip counts let the compiler unroll it */
                for (int j = 0; j < BLOCK; j++)
                    for (int i = 0; i < BLOCK; i++)
                        y[(long)(j0 + j) * rows + i0 + i] = x[(long)(i0 + i) * cols + j0 + j];
#endif
            } else {
                for (int j = j0; j < j1; j++)
                    for (int i = i0; i < i1; i++)
                        y[(long)j * rows + i] = x[(long)i * cols + j];
            }
        }
    }
#endif
}
