// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// stale output: writes only the first half of each row
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
    float tmp[1 << 14];
    for (int r = 0; r < rows; r++) {
        row(x + (long)r * cols, tmp, cols);
        for (int c = 0; c < cols / 2; c++)
            y[(long)r * cols + c] = tmp[c];
    }
}
