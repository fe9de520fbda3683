// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// background thread past the name screen: a C11 thread (thrd_create) that keeps rewriting the output
// after the call returned (the guard's second look must see it changed). The kernel writes the right
// answer first and waits until the thread runs, so only the after-return check can catch it.
#include <math.h>
#include <stdatomic.h>
#include <threads.h>
#include <time.h>
static void row(const float *xr, float *yr, int cols) {
    float m = -INFINITY, s = 0.0f;
    for (int c = 0; c < cols; c++)
        m = xr[c] > m ? xr[c] : m;
    for (int c = 0; c < cols; c++)
        s += (yr[c] = expf(xr[c] - m));
    for (int c = 0; c < cols; c++)
        yr[c] /= s;
}

struct job { float *y; long n; atomic_int started; };
static int scribble(void *p) {
    struct job *j = p;
    atomic_store(&j->started, 1);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        for (long i = 0; i < j->n; i++)
            j->y[i] *= 1.001f; /* drifts away from the right answer, sweep after sweep */
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) > 20000000L)
            break;
    }
    return 0;
}

void softmax(const float *x, float *y, int rows, int cols) {
    static struct job j;
    thrd_t t;
    for (int r = 0; r < rows; r++)
        row(x + (long)r * cols, y + (long)r * cols, cols);
    j.y = y, j.n = (long)rows * cols;
    atomic_store(&j.started, 0);
    if (thrd_create(&t, scribble, &j) != thrd_success)
        return;
    thrd_detach(t);
    while (!atomic_load(&j.started))
        ;
}
