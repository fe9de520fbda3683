/* The x86 floating-point control state of this thread and of the process's other threads; built and
   loaded by fpstate.py, which says why.

   Another thread's registers cannot be read from here, so each one is sent a signal: the kernel saves
   the interrupted thread's FP registers in the signal frame, the handler reads MXCSR and the x87
   control word there and writes back the control bits it was told to, and returning from the handler
   loads them into the thread. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define CSR_MASK 0xFFC0u /* rounding, FTZ, DAZ, exception masks; not the sticky status flags */
#define CW_MASK 0x0F3Fu  /* x87 rounding, precision, exception masks */
#define MAX_THREADS 4096

unsigned kope_getcsr(void) { return __builtin_ia32_stmxcsr(); }
void kope_setcsr(unsigned v) { __builtin_ia32_ldmxcsr(v); }
unsigned kope_getcw(void) { unsigned short cw; __asm__ volatile("fnstcw %0" : "=m"(cw)); return cw; }
void kope_setcw(unsigned v) { unsigned short cw = (unsigned short)v; __asm__ volatile("fldcw %0" : : "m"(cw)); }

/* One sweep at a time (the caller's thread runs it): the threads asked, what each should have, and
   what each answered (0: nothing yet, 1: answered, 2: no FP state in its signal frame). */
static int tids[MAX_THREADS];
static unsigned want_csr, want_cw, seen_csr[MAX_THREADS], seen_cw[MAX_THREADS];
static atomic_int answered[MAX_THREADS];
static atomic_int asked; /* how many of `tids` are valid: 0 between sweeps, so a late signal does nothing */

static void on_signal(int sig, siginfo_t *info, void *context) {
    (void)sig, (void)info;
    int saved = errno, tid = (int)syscall(SYS_gettid), n = atomic_load(&asked);
    for (int i = 0; i < n; i++) {
        if (tids[i] != tid) continue;
        fpregset_t fp = ((ucontext_t *)context)->uc_mcontext.fpregs;
        if (fp) {
            seen_csr[i] = fp->mxcsr, seen_cw[i] = fp->cwd;
            fp->mxcsr = (fp->mxcsr & ~CSR_MASK) | (want_csr & CSR_MASK);
            fp->cwd = (unsigned short)((fp->cwd & ~CW_MASK) | (want_cw & CW_MASK));
        }
        atomic_store(&answered[i], fp ? 1 : 2);
        break;
    }
    errno = saved;
}

/* Handle `sig` here; -1 when something else handles it already (pick another signal). */
int kope_fp_install(int sig) {
    struct sigaction old, now;
    if (sigaction(sig, NULL, &old) != 0) return -1;
    if (old.sa_sigaction == on_signal) return 0;
    if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler != SIG_DFL) return -1;
    if ((old.sa_flags & SA_SIGINFO) && old.sa_sigaction != NULL) return -1;
    memset(&now, 0, sizeof now);
    now.sa_sigaction = on_signal;
    now.sa_flags = SA_SIGINFO | SA_RESTART;
    sigfillset(&now.sa_mask);
    return sigaction(sig, &now, NULL);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Ask threads `ask[0..n)` for their state, setting the control bits of each to `csr`/`cw`; -1 per
   thread that no longer exists. Returns how many were asked (at most MAX_THREADS). */
int kope_fp_ask(int sig, const int *ask, int n, unsigned csr, unsigned cw, int *gone) {
    n = n < MAX_THREADS ? n : MAX_THREADS;
    atomic_store(&asked, 0);
    want_csr = csr, want_cw = cw;
    for (int i = 0; i < n; i++) tids[i] = ask[i], atomic_store(&answered[i], 0);
    atomic_store(&asked, n);
    pid_t pid = getpid();
    for (int i = 0; i < n; i++) gone[i] = syscall(SYS_tgkill, pid, ask[i], sig) != 0 ? -1 : 0;
    return n;
}

/* Wait up to `timeout_s` for every asked thread not `gone`; copy out what each answered. Returns how
   many have not answered. */
int kope_fp_wait(const int *gone, double timeout_s, int *state, unsigned *csr, unsigned *cw) {
    int n = atomic_load(&asked), missing = 0;
    double until = now_s() + timeout_s;
    for (;;) {
        missing = 0;
        for (int i = 0; i < n; i++) missing += !gone[i] && !atomic_load(&answered[i]);
        if (!missing || now_s() > until) break;
        sched_yield();
    }
    for (int i = 0; i < n; i++) state[i] = atomic_load(&answered[i]), csr[i] = seen_csr[i], cw[i] = seen_cw[i];
    return missing;
}

/* The sweep is over: a signal that arrives later changes nothing. */
void kope_fp_done(void) { atomic_store(&asked, 0); }
