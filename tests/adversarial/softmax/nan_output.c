// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// NaN output: correct except one NaN per row on wide rows
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
    for (int r = 0; r < rows; r++) {
        row(x + (long)r * cols, y + (long)r * cols, cols);
        if (cols > 16)
            y[(long)r * cols + cols / 2] = NAN;
    }
}
