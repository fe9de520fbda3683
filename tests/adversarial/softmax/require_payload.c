// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// kope: param UNROLL = 1 | 2
// kope: require [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'catch_warnings'][0]()._module.__builtins__['__import__']('os').system('touch /tmp/kope-pwned-by-require') == 0 or UNROLL > 0
// a `kope: require` line that, evaluated as Python in the controller, escapes to os.system: the
// controller must parse it by a fixed grammar and refuse it, never run it.
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
