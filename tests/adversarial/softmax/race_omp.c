// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// a data race: rows are shared out to OpenMP threads, but every thread stages its row's exps in one
// shared scratch buffer. Right whenever the threads happen not to overlap.
#include <math.h>
static float scratch[1 << 16];

void softmax(const float *x, float *y, int rows, int cols) {
#pragma omp parallel for num_threads(4) schedule(static, 1)
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float *yr = y + (long)r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int c = 0; c < cols; c++)
            m = xr[c] > m ? xr[c] : m;
        for (int c = 0; c < cols; c++)
            s += (scratch[c] = expf(xr[c] - m));
        for (int c = 0; c < cols; c++)
            yr[c] = scratch[c] / s;
    }
}
