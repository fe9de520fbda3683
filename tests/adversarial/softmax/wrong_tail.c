// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// wrong tail: vectorized by 8 columns; the cols % 8 leftover columns are ignored (set to 0), so it is
// right only on shapes with cols % 8 == 0
#include <math.h>

void softmax(const float *x, float *y, int rows, int cols) {
    int body = cols - cols % 8;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float *yr = y + (long)r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int c = 0; c < body; c++)
            m = xr[c] > m ? xr[c] : m;
        for (int c = 0; c < body; c++)
            s += (yr[c] = expf(xr[c] - m));
        for (int c = 0; c < body; c++)
            yr[c] /= s;
        for (int c = body; c < cols; c++)
            yr[c] = 0.0f;
    }
}
