// kope: kernel void roof_copy(const float *a, float *b, long n, int threads)
// kope: kernel void roof_read(const float *a, float *sums, long n, int threads)
// kope: kernel void roof_fma(float *out, long reps, int threads)
// kope: flags -O3 -march=native
//
// The roofline the peer comparison measures, timed in the same rounds as the kernels (peers/measure.py).
// STREAM-style, on the caller's buffers (numpy's, huge pages where the system gives them):
//   roof_copy: each thread copies its share with libc's memcpy, which picks the fastest stores this
//              CPU has for the size (non-temporal ones for large copies); counts bytes read + written.
//   roof_read: each thread sums its share with 8 independent vector accumulators; counts bytes read.
//   roof_fma:  each thread runs CHAINS independent chains of vector FMAs and writes the FLOPs per rep
//              it did to out[1024 + thread] (2 per lane per chain).
// The vector width follows the target the flags select (-march=native), never an assumed CPU.

#include <omp.h>
#include <string.h>

#if defined(__AVX512F__)
#define VB 64
#define CHAINS 16 /* 32 vector registers: 16 chains and their operands fit */
#elif defined(__AVX__)
#define VB 32
#define CHAINS 12 /* 16 vector registers */
#else
#define VB 16
#define CHAINS 12
#endif
#define NV (VB / 4)
#define FLOPS_AT 1024 /* out[FLOPS_AT + thread]: FLOPs per rep of that thread; out holds 2048 floats */
typedef float vf __attribute__((vector_size(VB)));

static void share(long n, int id, int nt, long *lo, long *hi) {
    long per = (n / nt + NV - 1) / NV * NV; /* whole vectors per thread */
    *lo = per * id < n ? per * id : n;
    *hi = per * (id + 1) < n ? per * (id + 1) : n;
}

void roof_copy(const float *a, float *b, long n, int threads) {
#pragma omp parallel num_threads(threads)
    {
        long lo, hi;
        share(n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        if (hi > lo)
            memcpy(b + lo, a + lo, sizeof(float) * (size_t)(hi - lo));
    }
}

void roof_read(const float *a, float *sums, long n, int threads) {
#pragma omp parallel num_threads(threads)
    {
        int id = omp_get_thread_num();
        long lo, hi, i;
        share(n, id, omp_get_num_threads(), &lo, &hi);
        vf s[8] = {0};
        for (i = lo; i + 8 * NV <= hi; i += 8 * NV)
            for (int j = 0; j < 8; j++) {
                vf v;
                memcpy(&v, a + i + j * NV, sizeof v);
                s[j] += v;
            }
        float t = 0.0f;
        for (; i < hi; i++)
            t += a[i];
        vf all = s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
        for (int j = 0; j < NV; j++)
            t += all[j];
        sums[id] = t;
    }
}

void roof_fma(float *out, long reps, int threads) {
#pragma omp parallel num_threads(threads)
    {
        int id = omp_get_thread_num();
        vf acc[CHAINS], m, c;
        float seed = out[id]; /* an input the compiler cannot see: nothing folds */
        for (int j = 0; j < NV; j++)
            m[j] = 0.999999f + seed * 0.0f, c[j] = 1e-6f;
        for (int k = 0; k < CHAINS; k++)
            acc[k] = m * (float)(k + 1);
        for (long r = 0; r < reps; r++)
            for (int k = 0; k < CHAINS; k++)
                acc[k] = acc[k] * m + c;
        for (int k = 1; k < CHAINS; k++)
            acc[0] += acc[k];
        out[id] = acc[0][0] + acc[0][NV - 1];
        out[FLOPS_AT + id] = (float)(2 * CHAINS * NV); /* FLOPs per rep, for the caller to count */
    }
}
