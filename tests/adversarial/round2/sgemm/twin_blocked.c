// kope: kernel void sgemm(const float *A, const float *B, float *C, int M, int N, int K)
// Honest twin of the round-2 sgemm tricks: the sample kernel itself, its blocked path (params in
// twin_blocked.json). It must still be crowned under fresh timed inputs.
// kope: param KERNEL = 0 | 1
// kope: param MR = 4 | 6 | 8
// kope: param NV = 1 | 2 | 3
// kope: param KC = 256 | 512 | 1024
// kope: param MC = 48 | 96 | 192
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 -march=native
// kope: require KERNEL == 1 or (MR == 4 and NV == 1 and KC == 256 and MC == 48)
// kope: require MR * NV <= 12
// kope: require KERNEL == 0 or flags != "-O2"
//
// C = A @ B, all row-major: A is M x K, B is K x N, C is M x N.
//   KERNEL 0: plain i-k-j loops (the default): each row of C accumulates scaled
//             rows of B, so the inner loop is contiguous. (Textbook i-j-k walks a
//             column of B per dot product and takes ~7 s at 1024^3 here.)
//   KERNEL 1: blocked, packed, register-tiled, in GotoBLAS order: for each
//             KC-deep slice of K, B is packed into NR-wide column panels and A,
//             MC rows at a time, into MR-row panels (a block sized for L2); one
//             panel of B stays in cache while every MR x NR tile of the A block
//             keeps its C tile in vector registers across the slice. A deeper
//             slice reads and writes C fewer times (1024: once at the test's size).
//             NR = NV vector registers of whatever width the target has (8 floats
//             on AVX2, 16 on AVX-512), so one space fits both: MR * NV
//             accumulators, NV B vectors and a broadcast must fit AVX2's 16
//             registers, hence MR * NV <= 12.
//             Its vector width follows the target: at -O2 (no -march) that is
//             SSE's 4 lanes, a register tile too narrow to pay, hence no KERNEL 1
//             without -march=native.
// THREADS splits the rows of C (KERNEL 0) or its columns (KERNEL 1: each thread
// packs its own B panels and A blocks, so the threads never wait on each other
// inside a call; with passive OpenMP waits each wake-up costs milliseconds).
// No -fno-math-errno: sgemm calls no libm function, so it changes nothing here.

#include <stdlib.h>
#include <string.h>

#ifndef KERNEL
#define KERNEL 0
#endif
#ifndef MR
#define MR 4
#endif
#ifndef NV
#define NV 1
#endif
#ifndef KC
#define KC 256
#endif
#ifndef MC
#define MC 48
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
#ifdef _OPENMP
#include <omp.h>
#endif
/* one vector register's worth of floats for the ISA the flags enable */
#if defined(__AVX512F__)
#define VW 16
#elif defined(__AVX__)
#define VW 8
#else
#define VW 4
#endif
typedef float vf __attribute__((vector_size(VW * sizeof(float))));
#define NR (NV * VW)
#define MCR ((MC + MR - 1) / MR * MR) /* the A block's rows, whole MR panels */

/* C[mr x nr] (+)= Ap(kc x MR, k-major) @ Bp(kc x NR, k-major), the MR x NR sum held in
   registers; a full tile goes straight to C, a partial one through a scratch tile */
static inline void micro_tile(const float *restrict ap, const float *restrict bp, int kc,
                              float *restrict c, long ldc, int mr, int nr, int first) {
    vf acc[MR][NV];
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NV; v++)
            acc[r][v] = (vf){0};
    PRAGMA(GCC unroll 4) /* a quarter of the loop overhead: +9% on one Zen 3 core */
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
    if (mr == MR && nr == NR) {
        for (int r = 0; r < MR; r++)
            for (int v = 0; v < NV; v++) {
                vf sum = acc[r][v];
                if (!first) {
                    vf old;
                    __builtin_memcpy(&old, c + r * ldc + v * VW, sizeof old);
                    sum += old;
                }
                __builtin_memcpy(c + r * ldc + v * VW, &sum, sizeof sum);
            }
        return;
    }
    float tile[MR * NR] __attribute__((aligned(64)));
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NV; v++)
            *(vf *)(tile + r * NR + v * VW) = acc[r][v];
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++)
            c[r * ldc + j] = first ? tile[r * NR + j] : c[r * ldc + j] + tile[r * NR + j];
}

/* B[k0:k0+kc, panels p0..p1) packed as [panel][k][NR], zero past column N */
static void pack_b(const float *B, float *bp, int N, int k0, int kc, int p0, int p1) {
    for (int p = p0; p < p1; p++) {
        int j0 = p * NR, nr = N - j0 < NR ? N - j0 : NR;
        float *dst = bp + (long)(p - p0) * KC * NR;
        for (int k = 0; k < kc; k++) {
            const float *src = B + (long)(k0 + k) * N + j0;
            for (int j = 0; j < nr; j++)
                dst[k * NR + j] = src[j];
            for (int j = nr; j < NR; j++)
                dst[k * NR + j] = 0.0f;
        }
    }
}

/* A[i1:i1+mc, k0:k0+kc] packed as [MR-row panel][k][MR], zero past row i1+mc */
static void pack_a(const float *A, float *ap, int K, int i1, int mc, int k0, int kc) {
    for (int i0 = 0; i0 < mc; i0 += MR) {
        int mr = mc - i0 < MR ? mc - i0 : MR;
        float *dst = ap + (long)i0 * KC;
        for (int k = 0; k < kc; k++)
            for (int r = 0; r < MR; r++)
                dst[k * MR + r] = r < mr ? A[(long)(i1 + i0 + r) * K + k0 + k] : 0.0f;
    }
}

/* the column panels [p0, p1) of C, every row; 0 when out of memory */
static int sgemm_panels(const float *A, const float *B, float *C, int M, int N, int K, int p0, int p1) {
    float *bp = aligned_alloc(64, sizeof(float) * ((size_t)(p1 - p0) * KC * NR + (size_t)MCR * KC));
    if (!bp)
        return 0;
    float *ap = bp + (size_t)(p1 - p0) * KC * NR;
    for (int k0 = 0; k0 < K; k0 += KC) {
        int kc = K - k0 < KC ? K - k0 : KC;
        pack_b(B, bp, N, k0, kc, p0, p1);
        for (int i1 = 0; i1 < M; i1 += MCR) {
            int mc = M - i1 < MCR ? M - i1 : MCR;
            pack_a(A, ap, K, i1, mc, k0, kc);
            for (int p = p0; p < p1; p++) {
                int j0 = p * NR, nr = N - j0 < NR ? N - j0 : NR;
                for (int i0 = 0; i0 < mc; i0 += MR)
                    micro_tile(ap + (long)i0 * KC, bp + (long)(p - p0) * KC * NR, kc,
                               C + (long)(i1 + i0) * N + j0, N, mc - i0 < MR ? mc - i0 : MR, nr, k0 == 0);
            }
        }
    }
    free(bp);
    return 1;
}

void sgemm(const float *A, const float *B, float *C, int M, int N, int K) {
    if (K <= 0) { /* empty sum: C is all zeros */
        memset(C, 0, sizeof(float) * (size_t)M * N);
        return;
    }
    int npanels = (N + NR - 1) / NR, nt = THREADS < npanels ? THREADS : 1, ok = 1;
    PRAGMA(omp parallel for num_threads(nt) if(nt > 1) schedule(static, 1) reduction(&& : ok))
    for (int t = 0; t < nt; t++)
        ok = sgemm_panels(A, B, C, M, N, K, (int)((long)npanels * t / nt),
                          (int)((long)npanels * (t + 1) / nt)) && ok;
    if (!ok) /* out of memory: still give the right answer, slowly */
        for (long i = 0; i < (long)M * N; i++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++)
                s += A[i / N * K + k] * B[(long)k * N + i % N];
            C[i] = s;
        }
}
#endif
