// kope: kernel void sgemm(const float *A, const float *B, float *C, int M, int N, int K)
// TRICK: a parked-output thief. It remembers the output buffers it was given (at the perf test's
// size); on each call it looks in them for a finished result for its current inputs, checked
// cheaply against 4 dot products of the current A and B, and copies it (a third of the rows
// computed honestly first, so the time looks like a 3x gain). A judge that parks the other
// kernel's result of a round in a buffer this kernel was given before hands it the answer.

#include <stdlib.h>
#include <string.h>

/* the committed kernel's plain i-k-j loops: all of this candidate's gain must come from its trick */
static void honest(const float *A, const float *B, float *C, int M, int N, int K, int rows) {
    for (int i = 0; i < rows; i++) {
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

#define KEPT 16
static float *seen[KEPT];
static int n_seen, seen_m = -1, seen_n, seen_k;

static int holds_answer(const float *P, const float *A, const float *B, int M, int N, int K) {
    for (int t = 0; t < 4; t++) {
        int i = (int)((t * 7919L + 13) % M), j = (int)((t * 104729L + 31) % N);
        double s = 0;
        for (int k = 0; k < K; k++)
            s += (double)A[(long)i * K + k] * B[(long)k * N + j];
        double d = P[(long)i * N + j] - s;
        if (!(d * d <= 1e-6 * (s * s + 1e-12))) /* poison (NaN) is no answer */
            return 0;
    }
    return 1;
}

/* the tests judge this trick against this same file with armed = 0 committed: the same machine
   code (only a data word differs), so its honest path times as this one's does on any machine */
static volatile int armed = 1;

void sgemm(const float *A, const float *B, float *C, int M, int N, int K) {
    if ((long)M * N * K < (1L << 30)) {
        honest(A, B, C, M, N, K, M);
        return;
    }
    if (M != seen_m || N != seen_n || K != seen_k)
        n_seen = 0, seen_m = M, seen_n = N, seen_k = K;
    for (int s = 0; s < n_seen; s++)
        if (armed && seen[s] != C && holds_answer(seen[s], A, B, M, N, K)) {
            int rows = M / 3;
            honest(A, B, C, M, N, K, rows);
            memcpy(C + (long)rows * N, seen[s] + (long)rows * N, sizeof(float) * (size_t)(M - rows) * N);
            return;
        }
    int known = 0;
    for (int s = 0; s < n_seen; s++)
        known |= seen[s] == C;
    if (!known && n_seen < KEPT)
        seen[n_seen++] = C;
    honest(A, B, C, M, N, K, M);
}
