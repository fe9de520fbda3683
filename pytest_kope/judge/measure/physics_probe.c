/* pytest-kope physics probe: best-of-N read (vector sum), write (memset) and copy (memcpy) bandwidth
   of all OpenMP threads per working-set size, and the float32 FMA peak; prints one JSON object, with
   each size's spread (best over median sample, the largest of the three figures') and the FMA's.
   usage: probe MIN_SAMPLE_SECONDS BEST_OF SIZE_BYTES...  (built and run by physics.py)

   Each thread times its own share inside one parallel region, between barriers, and a sample's rate
   is the sum of the threads' own rates: a thread the OS preempts or wakes late (a loaded 2-core VM
   took 4-8 ms to wake one) lowers only its share, never the whole figure. Threads that did not
   overlap make the sum an overestimate: the safe side for a ceiling. Widths come from the target's
   own macros (-march=native), never assumed. */
#define _GNU_SOURCE
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#if defined(__AVX512F__)
#define VB 64
#elif defined(__AVX__)
#define VB 32
#else
#define VB 16
#endif
typedef float vf __attribute__((vector_size(VB)));
#define NV (VB / 4)
#define CLOBBER(p) __asm__ volatile("" : : "r"(p) : "memory")
static volatile float sink;
#define MAX_SAMPLES 64
static double rates[1024], times[1024];

static double work(int k, char *buf, size_t size, long reps, int id, int nt) {
    size_t half = size / 2, span = k == 2 ? half : size, blocks = span / (8 * VB);
    int users = blocks < (size_t)nt ? (int)blocks : nt; /* tiny sets: fewer threads, whole blocks */
    if (k < 3 && id >= users) return 0;
    size_t slice = k < 3 ? blocks / users * (8 * VB) : 0;
    char *p = buf + id * slice, *q = buf + half + id * slice;
    if (k == 0) { /* read: vector sum with 8 independent accumulators */
        vf a[8] = {0};
        for (long r = 0; r < reps; r++) {
            for (size_t i = 0; i < slice; i += 8 * VB)
                for (int j = 0; j < 8; j++) a[j] += *(vf *)(p + i + j * VB);
            CLOBBER(p);
        }
        vf s = a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
        sink = s[0] + s[NV - 1];
        return (double)slice * reps;
    }
    if (k == 1) { /* write: libc's memset picks the fastest stores (non-temporal when large) */
        for (long r = 0; r < reps; r++) { memset(p, (int)r, slice); CLOBBER(p); }
        return (double)slice * reps;
    }
    if (k == 2) { /* copy: counts the bytes read and written */
        for (long r = 0; r < reps; r++) { memcpy(q, p, slice); CLOBBER(q); }
        return 2.0 * slice * reps;
    }
    vf a[12], b, c; /* FMA: 12 independent chains */
    float z = sink * 0;
    for (int j = 0; j < NV; j++) b[j] = 0.999999f + z, c[j] = 1e-6f + z;
    for (int j = 0; j < 12; j++) a[j] = b * (float)j;
    for (long r = 0; r < reps; r++)
        for (int j = 0; j < 12; j++) a[j] = a[j] * b + c;
    for (int j = 1; j < 12; j++) a[0] += a[j];
    sink = a[0][0];
    return 2.0 * 12 * NV * reps;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* the best sample's rate; *spread: the best over the median sample's (how steady the machine was) */
static double best_rate(int k, char *buf, size_t size, long reps, int samples, double *slowest, double *spread) {
    double best = 0, sums[MAX_SAMPLES];
    *slowest = 0;
#pragma omp parallel
    {
        int id = omp_get_thread_num(), nt = omp_get_num_threads();
        for (int n = 0; n < samples; n++) {
#pragma omp barrier
            double t = omp_get_wtime(), amount = work(k, buf, size, reps, id, nt);
            t = omp_get_wtime() - t;
            rates[id] = amount > 0 && t > 0 ? amount / t : 0, times[id] = t;
#pragma omp barrier
#pragma omp master
            {
                double sum = 0, longest = 0;
                for (int i = 0; i < nt; i++) sum += rates[i], longest = times[i] > longest ? times[i] : longest;
                if (sum > best) best = sum, *slowest = longest;
                sums[n] = sum;
            }
        }
    }
    qsort(sums, samples, sizeof(double), by_value);
    *spread = sums[samples / 2] > 0 ? best / sums[samples / 2] : 1;
    return best;
}

static double measure(int k, char *buf, size_t size, double min_s, int samples, double *spread) {
    double t;
    long reps = 1;
    while (best_rate(k, buf, size, reps, 1, &t, spread), t < min_s) reps *= t < min_s / 16 ? 8 : 2;
    return best_rate(k, buf, size, reps, samples, &t, spread);
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: probe MIN_SAMPLE_S BEST_OF [SIZE...]\n"); return 2; }
    double min_s = atof(argv[1]), t0 = omp_get_wtime();
    int samples = atoi(argv[2]), nt = omp_get_max_threads(), n = argc - 3;
    if (nt > 1024) { fprintf(stderr, "more than 1024 threads\n"); return 2; }
    if (samples < 1 || samples > MAX_SAMPLES) { fprintf(stderr, "BEST_OF is 1 to %d\n", MAX_SAMPLES); return 2; }
    double *gbs = calloc(3 * (n + 1), sizeof(double)), *spread = calloc(n + 1, sizeof(double)), s, fs;
    for (int i = 0; i < n; i++) {
        size_t size = strtoull(argv[i + 3], 0, 10), huge = 2u << 20, len = (size + huge - 1) / huge * huge;
        if (size < 32 * VB) { fprintf(stderr, "working set %zu is below %d bytes\n", size, 32 * VB); return 2; }
        char *buf = aligned_alloc(huge, len);
        if (!buf) { fprintf(stderr, "cannot allocate %zu bytes\n", size); return 3; }
#ifdef MADV_HUGEPAGE
        madvise(buf, len, MADV_HUGEPAGE);
#endif
#pragma omp parallel for schedule(static)
        for (size_t o = 0; o < len; o += 4096) memset(buf + o, 1, 4096);
        for (int k = 0; k < 3; k++) {
            gbs[k * n + i] = measure(k, buf, size, min_s, samples, &s) / 1e9;
            spread[i] = s > spread[i] ? s : spread[i];
        }
        free(buf);
    }
    double gflops = measure(3, 0, 0, min_s, samples, &fs) / 1e9;
    printf("{\"threads\": %d, \"vector_bytes\": %d, \"gflops\": %.3f, \"gflops_spread\": %.4f, \"spread\": [",
           nt, VB, gflops, fs);
    for (int i = 0; i < n; i++) printf("%s%.4f", i ? ", " : "", spread[i]);
    printf("], \"sizes\": [");
    for (int i = 0; i < n; i++) printf("%s%s", i ? ", " : "", argv[i + 3]);
    const char *names[3] = {"read", "write", "copy"};
    for (int k = 0; k < 3; k++) {
        printf("], \"%s\": [", names[k]);
        for (int i = 0; i < n; i++) printf("%s%.3f", i ? ", " : "", gbs[k * n + i]);
    }
    printf("], \"seconds\": %.3f}\n", omp_get_wtime() - t0);
    return 0;
}
