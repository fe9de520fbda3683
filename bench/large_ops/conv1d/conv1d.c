// kope: kernel void conv1d(const float *x, const float *w, float *y, int batch, int cin, int cout, int n, int k)
// kope: param ALGO = 0 | 1 | 2
// kope: param OB = 8 | 16 | 32 | 64 | 128
// kope: param OCB = 1 | 2 | 4
// kope: param KFIX = 0 | 1
// kope: param UNROLL = 1 | 2 | 4
// kope: param THREADS = 1 | 2
// kope: flags -O2 | -O3 | -O3 -march=native | -O3 -march=native -funroll-loops
// kope: require ALGO > 0 or (OB == 8 and OCB == 1)
// kope: require ALGO == 1 or OCB == 1
//
// Batched multi-channel 1-D convolution (cross-correlation, "same" size, zero padding): x is
// batch x cin x n, w is cout x cin x k, y is batch x cout x n, with p = (k - 1) / 2 and
//   y[b][o][i] = sum over c < cin, t < k of w[o][c][t] * x[b][c][i + t - p]
// where x outside [0, n) is zero. Every input element serves cout * k products, so the kernel
// is bound by arithmetic and by where its partial sums live, not by memory bandwidth.
//   ALGO 0: direct (the default): each output is one dot product over c and t, a serial chain
//           of dependent adds.
//   ALGO 1: register-blocked: a block of OCB output channels x OB consecutive outputs is
//           accumulated in a local array, channels and taps outer, outputs inner (vectorizable
//           across outputs; each x load serves OCB channels). The block lives in vector
//           registers while OCB * OB floats fit in them (AVX2: 16 registers of 8, AVX-512: 32
//           of 16); larger blocks spill to the stack: a load and a store per product.
//   ALGO 2: row-axpy: for each output channel, OB outputs at a time, the partial sums are kept
//           in the output row itself (in L1): for each (c, t) the chunk adds w * a shifted
//           chunk of x. A load and a store of y per product, short loops for small OB.
// Blocks only cover outputs whose whole window lies inside x; the outputs near the ends of a
// row (and blocks cut short by them or by the last output channels) take the direct path.
// KFIX compiles the kernel once more for each of k = 3, 5, 7 with the tap count a constant
// (loops over taps unrolled, addresses folded), and dispatches on k; other k use the generic one.
// UNROLL asks GCC to unroll the loop over taps (the generic one) that many times.
// THREADS splits the (batch, output channel block) pairs over OpenMP threads.

#ifndef ALGO
#define ALGO 0
#endif
#ifndef OB
#define OB 8
#endif
#ifndef OCB
#define OCB 1
#endif
#ifndef KFIX
#define KFIX 0
#endif
#ifndef UNROLL
#define UNROLL 1
#endif
#ifndef THREADS
#define THREADS 1
#endif

#define PRAGMA(x) _Pragma(#x)
#define UNROLL_BY(u) PRAGMA(GCC unroll u)
#define UNROLLED UNROLL_BY(UNROLL)
#define INLINE static inline __attribute__((always_inline))

/* one output y[b][o][i], directly: taps whose input lies outside the row are skipped */
INLINE float dot(const float *xb, const float *wo, int cin, int n, int k, int i) {
    int pad = (k - 1) / 2, t0 = pad - i > 0 ? pad - i : 0, t1 = n - i + pad < k ? n - i + pad : k;
    float s = 0.0f;
    for (int c = 0; c < cin; c++) {
        const float *xr = xb + (long)c * n + i - pad, *wr = wo + (long)c * k;
        UNROLLED
        for (int t = t0; t < t1; t++)
            s += wr[t] * xr[t];
    }
    return s;
}

/* outputs [i0, i1) of output channels [o0, o1) of one batch, directly */
INLINE void direct(const float *xb, const float *w, float *yb, int cin, int n, int k, int o0, int o1,
                   int i0, int i1) {
    for (int o = o0; o < o1; o++)
        for (int i = i0; i < i1; i++)
            yb[(long)o * n + i] = dot(xb, w + (long)o * cin * k, cin, n, k, i);
}

/* the outputs whose window lies inside the row: [lo, hi), empty when k > n */
#define INTERIOR(n, k)                                                                                 \
    int lo = (k - 1) / 2, hi = n - (k - 1 - lo);                                                       \
    if (hi < lo)                                                                                       \
        hi = lo = n

#if ALGO == 1
/* output channels [o0, o0 + OCB) of one batch, all outputs */
INLINE void block_rows(const float *xb, const float *w, float *yb, int cin, int cout, int n, int k, int o0) {
    if (o0 + OCB > cout) {
        direct(xb, w, yb, cin, n, k, o0, cout, 0, n);
        return;
    }
    INTERIOR(n, k);
    direct(xb, w, yb, cin, n, k, o0, o0 + OCB, 0, lo);
    int i0 = lo;
    for (; i0 + OB <= hi; i0 += OB) {
        float acc[OCB][OB];
        for (int q = 0; q < OCB; q++)
            for (int j = 0; j < OB; j++)
                acc[q][j] = 0.0f;
        for (int c = 0; c < cin; c++) {
            const float *xr = xb + (long)c * n + i0 - lo;
            UNROLLED
            for (int t = 0; t < k; t++)
                for (int q = 0; q < OCB; q++) {
                    float wv = w[((long)(o0 + q) * cin + c) * k + t];
                    PRAGMA(omp simd)
                    for (int j = 0; j < OB; j++)
                        acc[q][j] += wv * xr[t + j];
                }
        }
        for (int q = 0; q < OCB; q++)
            for (int j = 0; j < OB; j++)
                yb[(long)(o0 + q) * n + i0 + j] = acc[q][j];
    }
    direct(xb, w, yb, cin, n, k, o0, o0 + OCB, i0, n);
}
#elif ALGO == 2
/* output channel o0 of one batch, all outputs, partial sums in the output row */
INLINE void block_rows(const float *xb, const float *w, float *yb, int cin, int cout, int n, int k, int o0) {
    (void)cout;
    float *restrict yr = yb + (long)o0 * n;
    const float *wo = w + (long)o0 * cin * k;
    INTERIOR(n, k);
    direct(xb, w, yb, cin, n, k, o0, o0 + 1, 0, lo);
    for (int i0 = lo; i0 < hi; i0 += OB) {
        int nb = hi - i0 < OB ? hi - i0 : OB;
        for (int j = 0; j < nb; j++)
            yr[i0 + j] = 0.0f;
        for (int c = 0; c < cin; c++) {
            const float *restrict xr = xb + (long)c * n + i0 - lo;
            UNROLLED
            for (int t = 0; t < k; t++) {
                float wv = wo[(long)c * k + t];
                PRAGMA(omp simd)
                for (int j = 0; j < nb; j++)
                    yr[i0 + j] += wv * xr[t + j];
            }
        }
    }
    direct(xb, w, yb, cin, n, k, o0, o0 + 1, hi, n);
}
#else
INLINE void block_rows(const float *xb, const float *w, float *yb, int cin, int cout, int n, int k, int o0) {
    (void)cout;
    direct(xb, w, yb, cin, n, k, o0, o0 + 1, 0, n);
}
#endif

#if ALGO == 1
#define OSTEP OCB
#else
#define OSTEP 1
#endif

/* the whole convolution, k a constant wherever the caller passes one */
INLINE void conv(const float *x, const float *w, float *y, int batch, int cin, int cout, int n, int k) {
    int oblocks = (cout + OSTEP - 1) / OSTEP;
    long tasks = (long)batch * oblocks;
    PRAGMA(omp parallel for num_threads(THREADS) if(THREADS > 1) schedule(static))
    for (long task = 0; task < tasks; task++) {
        int b = (int)(task / oblocks), o0 = (int)(task % oblocks) * OSTEP;
        block_rows(x + (long)b * cin * n, w, y + (long)b * cout * n, cin, cout, n, k, o0);
    }
}

void conv1d(const float *x, const float *w, float *y, int batch, int cin, int cout, int n, int k) {
    if (k < 1) { /* no taps: every output is an empty sum */
        for (long e = 0; e < (long)batch * cout * n; e++)
            y[e] = 0.0f;
        return;
    }
#if KFIX
    switch (k) {
    case 3:
        conv(x, w, y, batch, cin, cout, n, 3);
        return;
    case 5:
        conv(x, w, y, batch, cin, cout, n, 5);
        return;
    case 7:
        conv(x, w, y, batch, cin, cout, n, 7);
        return;
    }
#endif
    conv(x, w, y, batch, cin, cout, n, k);
}
