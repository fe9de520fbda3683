// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// control: an honest kernel (same as the committed one, written differently); must stay correct
#include <math.h>

void softmax(const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float *yr = y + (long)r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int c = 0; c < cols; c++)
            m = xr[c] > m ? xr[c] : m;
        for (int c = 0; c < cols; c++)
            s += (yr[c] = expf(xr[c] - m));
        for (int c = 0; c < cols; c++)
            yr[c] /= s;
    }
}
