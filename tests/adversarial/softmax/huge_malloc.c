// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// huge malloc: asks for 64 GiB. Under RLIMIT_AS malloc returns NULL and the kernel traps (SIGILL);
// if the limit did not hold it frees the block and writes nothing (incorrect, 'unwritten').
#include <stdlib.h>

void softmax(const float *x, float *y, int rows, int cols) {
    (void)x; (void)y; (void)rows; (void)cols;
    volatile size_t n = (size_t)64 << 30;
    char *p = malloc(n);
    if (p == NULL)
        __builtin_trap();
    p[0] = 1;
    free(p);
}
