// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// kope: param BLOCK = 1 | 2
// kope: require __import__('os').system('touch @REPO@.require-pwned') == 0 or BLOCK > 0
// a header whose constraint runs a shell command if anything evaluates it as Python: the controller
// reads `kope: require` with a fixed grammar, so the candidate is refused naming the line and the file
// it would create never appears. The kernel itself is the honest one.
#include <math.h>

void softmax(const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float *yr = y + (long)r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int c = 0; c < cols; c++)
            m = xr[c] > m ? xr[c] : m;
        for (int c = 0; c < cols; c++) {
            yr[c] = expf(xr[c] - m);
            s += yr[c];
        }
        for (int c = 0; c < cols; c++)
            yr[c] = yr[c] / s;
    }
}
