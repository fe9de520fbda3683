// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// input mutation: uses x as scratch (casts const away) and leaves it changed
#include <math.h>

void softmax(const float *x, float *y, int rows, int cols) {
    float *w = (float *)x;
    for (int r = 0; r < rows; r++) {
        float *xr = w + (long)r * cols, *yr = y + (long)r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int c = 0; c < cols; c++)
            m = xr[c] > m ? xr[c] : m;
        for (int c = 0; c < cols; c++)
            s += (xr[c] = expf(xr[c] - m));
        for (int c = 0; c < cols; c++)
            yr[c] = xr[c] / s;
    }
}
