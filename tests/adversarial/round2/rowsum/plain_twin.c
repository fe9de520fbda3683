// kope: kernel void rowsum(const float *x, float *y, int rows, int cols)
// Honest twin of env_oversubscribed.c and judge_stack_env.c: the same vectorized row sum, in every
// environment and at every shape.

void rowsum(const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int c = 0; c < cols; c++)
            s += xr[c];
        y[r] = s;
    }
}
