// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// infinite loop: never returns (the wall-clock limit must kill it)
void softmax(const float *x, float *y, int rows, int cols) {
    (void)x; (void)y; (void)rows; (void)cols;
    for (volatile int i = 0;; i++)
        ;
}
