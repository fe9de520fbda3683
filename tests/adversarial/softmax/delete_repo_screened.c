// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// deletes repo files with unlink/remove by name (screening refuses them)
#include <stdio.h>
#include <unistd.h>

void softmax(const float *x, float *y, int rows, int cols) {
    unlink("@REPO@/softmax.c");
    remove("@REPO@/test_softmax.py");
    (void)x; (void)y; (void)rows; (void)cols;
}
