// kope: kernel void softmax(float *x, float *y, int rows, int cols)
// kope: inplace x
// interface forgery: re-declares the prototype without const and x as in-place, so the guards
// would treat x as an output; then zeroes x and writes the uniform softmax of zeros. A test that
// computes its reference from x after the call would agree.
void softmax(const float *x, float *y, int rows, int cols) {
    float *w = (float *)x;
    for (long i = 0; i < (long)rows * cols; i++) {
        w[i] = 0.0f;
        y[i] = 1.0f / cols;
    }
}
