// kope: kernel void rmsnorm(const float *x, const float *w, float *y, int rows, int cols, float eps)
// The committed kernel of a test operator (tests/test_adversarial_programs.py): RMS norm over each
// row with weight, eps given by the caller.
#include <math.h>

void rmsnorm(const float *x, const float *w, float *y, int rows, int cols, float eps) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float *yr = y + (long)r * cols;
        double ss = 0.0;
        for (int c = 0; c < cols; c++)
            ss += (double)xr[c] * xr[c];
        float inv = (float)(1.0 / sqrt(ss / cols + eps));
        for (int c = 0; c < cols; c++)
            yr[c] = xr[c] * inv * w[c];
    }
}
