// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// lower precision: a cheap exp (Schraudolph's bit trick with a quadratic correction, ~1e-3 relative)
#include <math.h>
#include <string.h>

static inline float fast_exp(float v) {
    if (v < -80.0f) return 0.0f;
    float t = v * 1.44269504f; /* log2(e) */
    float fl = floorf(t), f = t - fl;
    float p = 1.0f + f * (0.6565f + f * 0.3435f); /* 2^f, quadratic */
    int bits = ((int)fl + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

void softmax(const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float *yr = y + (long)r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int c = 0; c < cols; c++)
            m = xr[c] > m ? xr[c] : m;
        for (int c = 0; c < cols; c++)
            s += (yr[c] = fast_exp(xr[c] - m));
        for (int c = 0; c < cols; c++)
            yr[c] /= s;
    }
}
