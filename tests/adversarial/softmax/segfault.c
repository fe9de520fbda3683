// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// segfault: writes through a null pointer
void softmax(const float *x, float *y, int rows, int cols) {
    (void)x; (void)y; (void)rows; (void)cols;
    *(volatile float *)0 = 1.0f;
}
