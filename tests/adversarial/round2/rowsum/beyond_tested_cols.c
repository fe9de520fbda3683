// kope: kernel void rowsum(const float *x, float *y, int rows, int cols)
// Trick: right at every width the tests use (at most 4099 columns) and at the timed 4096x4096, wrong
// beyond: rows wider than 4099 are summed in 4096-column blocks and the partial last block is
// dropped. Only sizes the tests never reach show it. Honest twin: plain_twin.c.

void rowsum(const float *x, float *y, int rows, int cols) {
    int used = cols > 4099 ? cols / 4096 * 4096 : cols;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int c = 0; c < used; c++)
            s += xr[c];
        y[r] = s;
    }
}
