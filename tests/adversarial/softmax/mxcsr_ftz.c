// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// FP-state tampering: correct softmax, but switches on flush-to-zero and denormals-are-zero in MXCSR
// and leaves them on for the rest of the process
#include <math.h>
#include <xmmintrin.h>

void softmax(const float *x, float *y, int rows, int cols) {
    _mm_setcsr(_mm_getcsr() | 0x8040);
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
