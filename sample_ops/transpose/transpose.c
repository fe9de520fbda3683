// kope: kernel void transpose(const float *x, float *y, int rows, int cols)
// kope: param BLOCK = 0 | 4 | 8 | 16 | 32 | 64
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 | -O3 -march=native
// kope: require BLOCK > 0 or THREADS == 1
//
// y = x.T for a row-major rows x cols matrix x (y is cols x rows). The default
// (BLOCK = 0) walks x in order and writes y with a stride of `rows` floats, so
// each store touches a new cache line, and with a power-of-two stride all of
// them fight over the same cache sets. BLOCK > 0 transposes BLOCK x BLOCK tiles
// so both sides stay in cache; THREADS splits the tile rows.

#ifndef BLOCK
#define BLOCK 0
#endif
#ifndef THREADS
#define THREADS 1
#endif

#define PRAGMA(x) _Pragma(#x)

void transpose(const float *x, float *y, int rows, int cols) {
#if BLOCK == 0
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
