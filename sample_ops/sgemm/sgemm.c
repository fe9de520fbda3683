// kope: kernel void sgemm(const float *A, const float *B, float *C, int M, int N, int K)
// kope: param KERNEL = 0 | 1
// kope: param MR = 4 | 6 | 8
// kope: param NR = 16 | 32 | 64
// kope: param KC = 64 | 128 | 256
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 -march=native | -O3 -march=native -fno-math-errno -fno-trapping-math
// kope: require KERNEL == 1 or (MR == 4 and NR == 16 and KC == 64)
// kope: require MR * NR <= 256
// kope: require KERNEL == 0 or flags != "-O2"
//
// C = A @ B, all row-major: A is M x K, B is K x N, C is M x N.
//   KERNEL 0: plain i-k-j loops (the default): each row of C accumulates scaled
//             rows of B, so the inner loop is contiguous. (Textbook i-j-k walks a
//             column of B per dot product and takes ~7 s at 1024^3 here.)
//   KERNEL 1: blocked, packed, register-tiled: for each KC-deep slice of K, B is
//             packed into NR-wide column panels, A into MR-row panels, and an
//             MR x NR tile of C stays in vector registers across the slice.
//             MR * NR / 16 accumulators must leave room in the 32 AVX-512
//             registers, hence MR * NR <= 256.
//             Its vector width follows the target: at -O2 (no -march) that is
//             SSE's 4 lanes, a register tile too narrow to pay, hence no KERNEL 1
//             without -march=native.
// THREADS splits the rows of C.

#include <stdlib.h>
#include <string.h>

#ifndef KERNEL
#define KERNEL 0
#endif
#ifndef MR
#define MR 4
#endif
#ifndef NR
#define NR 16
#endif
#ifndef KC
#define KC 64
#endif
#ifndef THREADS
#define THREADS 1
#endif

#define PRAGMA(x) _Pragma(#x)

#if KERNEL == 0
void sgemm(const float *A, const float *B, float *C, int M, int N, int K) {
    PRAGMA(omp parallel for num_threads(THREADS) if(THREADS > 1) schedule(static))
    for (int i = 0; i < M; i++) {
        float *restrict c = C + (long)i * N;
        for (int j = 0; j < N; j++)
            c[j] = 0.0f;
        for (int k = 0; k < K; k++) {
            float a = A[(long)i * K + k];
            const float *restrict b = B + (long)k * N;
            for (int j = 0; j < N; j++)
                c[j] += a * b[j];
        }
    }
}

#else
/* one vector register's worth of floats for the ISA the flags enable */
#if defined(__AVX512F__)
#define VW 16
#elif defined(__AVX__)
#define VW 8
#else
#define VW 4
#endif
typedef float vf __attribute__((vector_size(VW * sizeof(float))));
#define NV (NR / VW)

/* acc(MR x NR) = Ap(MR x kc, k-major) @ Bp(kc x NR, k-major), held in registers */
static inline void micro_tile(const float *restrict ap, const float *restrict bp, int kc,
                              float *restrict out /* MR x NR */) {
    vf acc[MR][NV];
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NV; v++)
            acc[r][v] = (vf){0};
    for (int k = 0; k < kc; k++) {
        vf b[NV];
        for (int v = 0; v < NV; v++)
            b[v] = *(const vf *)(bp + (long)k * NR + v * VW);
        for (int r = 0; r < MR; r++) {
            float a = ap[k * MR + r];
            for (int v = 0; v < NV; v++)
                acc[r][v] += a * b[v];
        }
    }
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NV; v++)
            *(vf *)(out + r * NR + v * VW) = acc[r][v];
}

void sgemm(const float *A, const float *B, float *C, int M, int N, int K) {
    if (K <= 0) { /* empty sum: C is all zeros */
        memset(C, 0, sizeof(float) * (size_t)M * N);
        return;
    }
    int npanels = (N + NR - 1) / NR;
    /* B slice, packed: [panel][k][NR], zero-padded past column N */
    float *bp = aligned_alloc(64, sizeof(float) * (size_t)npanels * KC * NR);
    if (!bp) { /* out of memory: still give the right answer, slowly */
        for (long i = 0; i < (long)M * N; i++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++)
                s += A[i / N * K + k] * B[(long)k * N + i % N];
            C[i] = s;
        }
        return;
    }
    for (int k0 = 0; k0 < K; k0 += KC) {
        int kc = K - k0 < KC ? K - k0 : KC;
        PRAGMA(omp parallel num_threads(THREADS) if(THREADS > 1))
        {
            PRAGMA(omp for schedule(static))
            for (int p = 0; p < npanels; p++) {
                int j0 = p * NR, nr = N - j0 < NR ? N - j0 : NR;
                float *dst = bp + (long)p * KC * NR;
                for (int k = 0; k < kc; k++) {
                    const float *src = B + (long)(k0 + k) * N + j0;
                    for (int j = 0; j < nr; j++)
                        dst[k * NR + j] = src[j];
                    for (int j = nr; j < NR; j++)
                        dst[k * NR + j] = 0.0f;
                }
            }
            /* implicit barrier: bp is complete before any thread reads it */
            float ap[KC * MR] __attribute__((aligned(64)));
            float tile[MR * NR] __attribute__((aligned(64)));
            PRAGMA(omp for schedule(static))
            for (int i0 = 0; i0 < M; i0 += MR) {
                int mr = M - i0 < MR ? M - i0 : MR;
                /* A panel, packed: [k][MR], zero-padded past row M */
                for (int k = 0; k < kc; k++)
                    for (int r = 0; r < MR; r++)
                        ap[k * MR + r] = r < mr ? A[(long)(i0 + r) * K + k0 + k] : 0.0f;
                for (int p = 0; p < npanels; p++) {
                    int j0 = p * NR, nr = N - j0 < NR ? N - j0 : NR;
                    micro_tile(ap, bp + (long)p * KC * NR, kc, tile);
                    for (int r = 0; r < mr; r++) {
                        float *c = C + (long)(i0 + r) * N + j0;
                        if (k0 == 0)
                            for (int j = 0; j < nr; j++)
                                c[j] = tile[r * NR + j];
                        else
                            for (int j = 0; j < nr; j++)
                                c[j] += tile[r * NR + j];
                    }
                }
            }
        }
    }
    free(bp);
}
#endif
