// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// background work via OpenMP: a task in a "single nowait" region (OpenMP joins it at the region's
// end, so this cannot outlive the call; it is here to show that)
#include <math.h>
static void row(const float *xr, float *yr, int cols) {
    float m = -INFINITY, s = 0.0f;
    for (int c = 0; c < cols; c++)
        m = xr[c] > m ? xr[c] : m;
    for (int c = 0; c < cols; c++)
        s += (yr[c] = expf(xr[c] - m));
    for (int c = 0; c < cols; c++)
        yr[c] /= s;
}

void softmax(const float *x, float *y, int rows, int cols) {
    for (long i = 0; i < (long)rows * cols; i++)
        y[i] = 0.0f;
#pragma omp parallel num_threads(2)
#pragma omp single nowait
    {
#pragma omp task
        for (int r = 0; r < rows; r++)
            row(x + (long)r * cols, y + (long)r * cols, cols);
    }
    for (long i = 0; i < (long)rows * cols; i++)
        y[i] *= 1.5f; /* after the join: wrong on purpose, so this one must fail as incorrect */
}
