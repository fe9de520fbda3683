// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// writes outside its dir: into the repo (its absolute path, filled in by the test) and into /tmp, by
// absolute and by ../ paths. Raw system calls, so no name screen stops it; only a read-only view of
// everything outside the candidate's dir does. The output is left unwritten, so it always fails; the
// test checks that the files did not appear.
static long raw3(long n, long a, long b, long c) {
    long r;
    __asm__ volatile(".byte 0x0f, 0x05" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}

void softmax(const float *x, float *y, int rows, int cols) {
    static const char *targets[] = {
        "@REPO@/PWNED_BY_CANDIDATE",
        "/tmp/kope-pwned-by-candidate",
        "../../../../../../../../tmp/kope-pwned-by-candidate-rel",
    };
    for (int i = 0; i < 3; i++) {
        long fd = raw3(2 /* open */, (long)targets[i], 0101 /* O_WRONLY|O_CREAT */, 0644);
        if (fd >= 0) {
            raw3(1 /* write */, fd, (long)"pwned\n", 6);
            raw3(3 /* close */, fd, 0, 0);
        }
    }
    (void)x; (void)y; (void)rows; (void)cols;
}
