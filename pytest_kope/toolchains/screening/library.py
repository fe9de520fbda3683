"""Built C/C++ libraries: every dynamic symbol the library imports must be on an allow-list of what
numeric kernels use (libm, memory and string functions of libc, the libgomp entry points that
``#pragma omp`` emits, the minimal C++/libgcc runtime), widened by the ini option ``kope_allow_symbols``;
and no system-call instruction may appear in its code."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

# -- built libraries: the allow-list of imported symbols ----------------------------------------------


def _words(text: str) -> list[str]:
    return text.split()


# libm: every function of C99/C23 <math.h> and <complex.h>, in each floating type glibc exports.
_LIBM_BASES = _words("""
acos acosh asin asinh atan atan2 atanh cbrt ceil copysign cos cosh erf erfc exp exp10 exp2 expm1 fabs
fdim floor fma fmax fmin fmod frexp gamma hypot ilogb j0 j1 jn ldexp lgamma llogb llrint llround log
log10 log1p log2 logb lrint lround modf nan nearbyint nextafter nexttoward nextdown nextup pow pow10
remainder remquo rint round roundeven scalb scalbln scalbn significand sin sincos sinh sqrt tan tanh
tgamma trunc y0 y1 yn drem finite fmaximum fminimum fmaximum_num fminimum_num fmaximum_mag
fminimum_mag fmaximum_mag_num fminimum_mag_num fmaxmag fminmag canonicalize totalorder totalordermag
getpayload setpayload setpayloadsig fromfp fromfpx ufromfp ufromfpx
cabs cacos cacosh carg casin casinh catan catanh ccos ccosh cexp cimag clog clog10 conj cpow cproj
creal csin csinh csqrt ctan ctanh
""")
_FLOAT_SUFFIXES = ("", "f", "l", "f32", "f64", "f128", "f32x", "f64x")
# narrowing operations (C23 fadd, daddl, f32addf64, ...): result type prefix + op + argument suffix
_NARROWING = [
    f"{to}{op}{arg}"
    for op in ("add", "sub", "mul", "div", "sqrt", "fma")
    for to, args in (
        ("f", ("", "l")),
        ("d", ("l",)),
        ("f32", ("f64", "f32x", "f64x", "f128")),
        ("f32x", ("f64", "f64x", "f128")),
        ("f64", ("f32x", "f64x", "f128")),
        ("f64x", ("f128",)),
    )
    for arg in args
] + ["dadd", "dsub", "dmul", "ddiv", "dsqrt", "dfma"]
LIBM_FUNCTIONS = frozenset(
    [b + s for b in _LIBM_BASES for s in _FLOAT_SUFFIXES]
    + [f"{b}{s}_r" for b in ("lgamma", "gamma") for s in _FLOAT_SUFFIXES]
    + _NARROWING
    # classification helpers that <math.h> macros expand to
    + [
        f"__{h}{s}"
        for h in (
            "fpclassify",
            "signbit",
            "isnan",
            "isinf",
            "finite",
            "issignaling",
            "iseqsig",
            "iscanonical",
        )
        for s in ("", "f", "l", "f128")
    ]  # fmt: skip
    + ["signgam", "__signgam", "__clog10", "__clog10f", "__clog10l"]
    # reading the floating-point environment and clearing its flags (not setting modes or traps)
    + [
        "fegetround",
        "fegetenv",
        "fegetmode",
        "fegetexcept",
        "fegetexceptflag",
        "fetestexcept",
        "fetestexceptflag",
        "feclearexcept",
    ]  # fmt: skip
)
# -ffast-math's finite-only entry points (older glibc headers emit them): __expf_finite, __lgamma_r_finite
_FINITE_RE = re.compile(r"^__(\w+?)_finite$")
# libmvec vector variants (vectorized math calls): _ZGVdN8v_expf, _ZGVbN2vv_pow, _ZGVeN16vvv_sincosf
_LIBMVEC_RE = re.compile(r"^_ZGV[b-e][NM]\d+[vlLuU\d]*_(\w+)$")

# libc: memory and string functions, allocation, and what the compiler or its startup files reference.
LIBC_FUNCTIONS = frozenset(
    _words("""
    memcpy memmove memset memcmp memchr memrchr rawmemchr mempcpy bcmp bcopy bzero explicit_bzero
    strlen strnlen strcmp strncmp strcpy strncpy stpcpy stpncpy strcat strncat strchr strrchr strchrnul
    strstr strspn strcspn strpbrk
    __memcpy_chk __memmove_chk __memset_chk __mempcpy_chk __strcpy_chk __strncpy_chk __stpcpy_chk
    __stpncpy_chk __strcat_chk __strncat_chk __explicit_bzero_chk __chk_fail
    malloc calloc realloc reallocarray free aligned_alloc posix_memalign memalign malloc_usable_size
    qsort qsort_r bsearch abs labs llabs div ldiv lldiv
    abort __assert_fail __stack_chk_fail __errno_location
    __cxa_finalize __cxa_atexit __cxa_thread_atexit_impl __gmon_start__ __tls_get_addr
    _ITM_deregisterTMCloneTable _ITM_registerTMCloneTable __libc_single_threaded
    """)
)

# libgomp: what gcc emits for parallel/for (every schedule), reductions, simd, sections, single,
# critical, atomic, ordered/doacross, barriers, tasks, taskloops, taskgroups, teams on the host, scope,
# cancellation; and the omp_* queries, locks and allocators a kernel calls. Not offloading (GOMP_target*,
# GOACC_*), and no omp_set_* (thread counts, schedule, dynamic...): settings that outlive the call and
# would change how the next kernel in the process (the incumbent's) runs.
OPENMP_FUNCTIONS = frozenset(
    _words("""
    GOMP_parallel GOMP_parallel_start GOMP_parallel_end GOMP_parallel_reductions GOMP_parallel_sections
    GOMP_parallel_sections_start GOMP_barrier GOMP_barrier_cancel GOMP_critical_start GOMP_critical_end
    GOMP_critical_name_start GOMP_critical_name_end GOMP_atomic_start GOMP_atomic_end GOMP_single_start
    GOMP_single_copy_start GOMP_single_copy_end GOMP_sections_start GOMP_sections2_start
    GOMP_sections_next GOMP_sections_end GOMP_sections_end_nowait GOMP_sections_end_cancel
    GOMP_ordered_start GOMP_ordered_end GOMP_doacross_post GOMP_doacross_wait GOMP_doacross_ull_post
    GOMP_doacross_ull_wait GOMP_loop_end GOMP_loop_end_nowait GOMP_loop_end_cancel GOMP_loop_start
    GOMP_loop_ordered_start GOMP_loop_doacross_start GOMP_loop_ull_start GOMP_loop_ull_ordered_start
    GOMP_loop_ull_doacross_start GOMP_task GOMP_taskwait GOMP_taskwait_depend GOMP_taskyield
    GOMP_taskgroup_start GOMP_taskgroup_end GOMP_taskgroup_reduction_register
    GOMP_taskgroup_reduction_unregister GOMP_task_reduction_remap GOMP_workshare_task_reduction_unregister
    GOMP_taskloop GOMP_taskloop_ull GOMP_teams_reg GOMP_teams4 GOMP_scope_start GOMP_cancel
    GOMP_cancellation_point GOMP_alloc GOMP_free GOMP_error GOMP_warning
    omp_get_num_threads omp_get_thread_num omp_get_max_threads omp_get_num_procs omp_in_parallel
    omp_in_final omp_get_level omp_get_active_level omp_get_ancestor_thread_num omp_get_team_size
    omp_get_thread_limit omp_get_max_active_levels omp_get_supported_active_levels omp_get_dynamic
    omp_get_nested omp_get_schedule omp_get_cancellation omp_get_proc_bind omp_get_num_places
    omp_get_place_num omp_get_place_num_procs omp_get_place_proc_ids omp_get_partition_num_places
    omp_get_partition_place_nums omp_get_num_teams omp_get_team_num omp_get_max_teams
    omp_get_teams_thread_limit omp_get_max_task_priority omp_get_default_device omp_get_num_devices
    omp_get_device_num omp_get_initial_device omp_is_initial_device omp_get_wtime omp_get_wtick
    omp_init_lock omp_destroy_lock omp_set_lock omp_unset_lock omp_test_lock omp_init_nest_lock
    omp_destroy_nest_lock omp_set_nest_lock omp_unset_nest_lock omp_test_nest_lock
    omp_alloc omp_aligned_alloc omp_calloc omp_aligned_calloc omp_realloc omp_free omp_init_allocator
    omp_destroy_allocator omp_get_default_allocator omp_fulfill_event
    """)
)
# the loop entry points, one per schedule kind and variant: GOMP_loop_nonmonotonic_dynamic_start, ...
_GOMP_LOOP_RE = re.compile(
    r"^GOMP_(parallel_)?loop(_ull)?(_ordered|_doacross)?(_maybe_nonmonotonic|_nonmonotonic)?"
    r"_(static|dynamic|guided|runtime)(_start|_next)?$"
)

# C++ sources: operator new/delete, static-local guards, exceptions, RTTI, std::__throw_* helpers.
CXX_RUNTIME = frozenset(
    _words("""
    _Znwm _Znam _ZdlPv _ZdaPv _ZdlPvm _ZdaPvm _ZnwmSt11align_val_t _ZnamSt11align_val_t
    _ZdlPvSt11align_val_t _ZdaPvSt11align_val_t _ZdlPvmSt11align_val_t _ZdaPvmSt11align_val_t
    _ZnwmRKSt9nothrow_t _ZnamRKSt9nothrow_t _ZnwmSt11align_val_tRKSt9nothrow_t
    _ZnamSt11align_val_tRKSt9nothrow_t _ZdlPvRKSt9nothrow_t _ZdaPvRKSt9nothrow_t _ZSt7nothrow
    __cxa_guard_acquire __cxa_guard_release __cxa_guard_abort __cxa_pure_virtual __cxa_deleted_virtual
    __cxa_thread_atexit __cxa_allocate_exception __cxa_free_exception __cxa_throw __cxa_rethrow
    __cxa_begin_catch __cxa_end_catch __cxa_get_exception_ptr __cxa_call_unexpected __cxa_bad_cast
    __cxa_bad_typeid __cxa_throw_bad_array_new_length __dynamic_cast __gxx_personality_v0
    _ZSt9terminatev _ZSt17__throw_bad_allocv _ZSt28__throw_bad_array_new_lengthv
    _ZSt20__throw_length_errorPKc _ZSt20__throw_out_of_rangePKc _ZSt24__throw_out_of_range_fmtPKcz
    _ZSt19__throw_logic_errorPKc _ZSt21__throw_runtime_errorPKc _ZSt24__throw_invalid_argumentPKc
    _ZSt20__throw_domain_errorPKc _ZSt21__throw_overflow_errorPKc _ZSt22__throw_underflow_errorPKc
    _ZSt19__throw_range_errorPKc _ZSt25__throw_bad_function_callv _ZSt16__throw_bad_castv
    _ZSt18__throw_bad_typeidv _ZSt21__throw_bad_exceptionv
    """)
)
# typeinfo objects and names (_ZTISt12out_of_range), the ABI's type_info vtables, and the constructors,
# destructors and what() of the standard exception classes a kernel may throw.
_STD_EXCEPTIONS = (
    "9exception|9bad_alloc|20bad_array_new_length|11logic_error|12length_error|12out_of_range|"
    "16invalid_argument|12domain_error|13runtime_error|11range_error|14overflow_error|15underflow_error"
)
_CXX_RE = re.compile(
    r"^(_ZT[IS]\w+|_ZTVN10__cxxabiv1\d+__\w+_type_infoE|_ZTVSt(" + _STD_EXCEPTIONS + r")"
    r"|_ZNSt(" + _STD_EXCEPTIONS + r")(C[12]|D[012])E\w*|_ZNKSt(" + _STD_EXCEPTIONS + r")4whatEv)$"
)

# libgcc_s: the arithmetic helpers gcc calls for complex multiply/divide, __builtin_powi, 128-bit
# integers, _Float16/__float128 conversions, bit counts; and the unwinder entry points of exceptions.
LIBGCC_FUNCTIONS = frozenset(
    _words("""
    __mulsc3 __muldc3 __mulxc3 __multc3 __mulhc3 __divsc3 __divdc3 __divxc3 __divtc3 __divhc3
    __powisf2 __powidf2 __powixf2 __powitf2
    __divti3 __udivti3 __modti3 __umodti3 __divmodti4 __udivmodti4 __multi3 __negti2 __ashlti3 __ashrti3
    __lshrti3 __cmpti2 __ucmpti2 __absvti2 __addvti3 __subvti3 __mulvti3 __negvti2 __absvdi2 __absvsi2
    __addvdi3 __addvsi3 __subvdi3 __subvsi3 __mulvdi3 __mulvsi3 __negvdi2 __negvsi2
    __popcountdi2 __popcountti2 __paritydi2 __parityti2 __clzdi2 __clzti2 __ctzdi2 __ctzti2 __ffsdi2
    __ffsti2 __clrsbdi2 __clrsbti2 __bswapsi2 __bswapdi2
    __addtf3 __subtf3 __multf3 __divtf3 __negtf2 __eqtf2 __netf2 __getf2 __gttf2 __letf2 __lttf2
    __unordtf2 __eqhf2 __nehf2
    __extendsfdf2 __extendsftf2 __extenddftf2 __extendxftf2 __extendhfsf2 __extendhfdf2 __extendhftf2
    __extendhfxf2 __truncdfsf2 __trunctfdf2 __trunctfsf2 __trunctfxf2 __truncsfhf2 __truncdfhf2
    __trunctfhf2 __truncxfhf2
    __fixsfti __fixdfti __fixxfti __fixtfti __fixhfti __fixtfdi __fixtfsi __fixunssfti __fixunsdfti
    __fixunsxfti __fixunstfti __fixunshfti __fixunssfdi __fixunsdfdi __fixunsxfdi __fixunstfdi
    __fixunstfsi __floattisf __floattidf __floattixf __floattitf __floattihf __floatuntisf __floatuntidf
    __floatuntixf __floatuntitf __floatuntihf __floatditf __floatsitf __floatunditf __floatunsitf
    __cpu_model __cpu_indicator_init __gcc_personality_v0 _Unwind_Resume _Unwind_DeleteException
    """)
)

ALLOWED_SYMBOLS = LIBM_FUNCTIONS | LIBC_FUNCTIONS | OPENMP_FUNCTIONS | CXX_RUNTIME | LIBGCC_FUNCTIONS
ALLOW_SYMBOLS_INI = "kope_allow_symbols"
BINARY_SCREEN_ENV = "KOPE_C_SCREEN_BINARY"  # "0" switches the built-library check off (tests of the jail)
_SYSCALL_INSN = re.compile(r"\s(syscall|sysenter|int\s+\$0x80|svc\s+#?0x0|svc\s+#?0)\b")


def symbol_allowed(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether a built kernel library may import the dynamic symbol `name` (version suffix stripped).

    `extra`: names or fnmatch globs that widen the allow-list (the ini option ``kope_allow_symbols``).
    """
    name = name.split("@")[0]
    if name in ALLOWED_SYMBOLS or _GOMP_LOOP_RE.match(name) or _CXX_RE.match(name):
        return True
    finite = _FINITE_RE.match(name)
    if finite and finite.group(1) in LIBM_FUNCTIONS:
        return True
    vector = _LIBMVEC_RE.match(name)
    if vector and vector.group(1).removeprefix("__").removesuffix("_finite") in LIBM_FUNCTIONS:
        return True
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in extra)


def library_imports(lib: Path) -> tuple[set[str], str]:
    """The dynamic symbols `lib` imports (strong or weak, version suffixes stripped), and an error text."""
    try:
        nm = subprocess.run(
            ["nm", "-D", "--undefined-only", "--format=posix", str(lib)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return set(), f"cannot inspect the built library ({e}); install binutils (nm, objdump)"
    if nm.returncode != 0:
        return set(), f"cannot inspect the built library: {nm.stderr.strip()[:200]}"
    return {line.split()[0].split("@")[0] for line in nm.stdout.splitlines() if line.strip()}, ""


def screen_library(lib: Path, allow: Iterable[str] = ()) -> list[str]:
    """Why a built kernel library must not be loaded: imports off the allow-list, raw system calls.

    Weak imports are checked like strong ones: the dynamic loader binds a weak reference to any
    definition it finds (a weak ``__libc_system`` is libc's). Fails closed: a library that cannot be
    inspected (no binutils) is refused. `allow` widens the allow-list (names or fnmatch globs).
    """
    allow = tuple(allow)
    imported, error = library_imports(lib)
    if error:
        return [error]
    try:
        dis = subprocess.run(
            ["objdump", "-d", "--no-show-raw-insn", str(lib)], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.SubprocessError) as e:
        return [f"cannot inspect the built library ({e}); install binutils (nm, objdump)"]
    if dis.returncode != 0:
        return [f"cannot inspect the built library: {dis.stderr.strip()[:200]}"]
    bad = sorted(n for n in imported if not symbol_allowed(n, allow))
    reasons = []
    if bad:
        reasons.append(
            f"the built library imports {', '.join(bad)} (not in the allow-list of kernel imports; "
            f"widen it with the ini option {ALLOW_SYMBOLS_INI} if your kernels need it)"
        )
    insns = sorted({m.group(1) for m in _SYSCALL_INSN.finditer(dis.stdout)})
    if insns:
        reasons.append(f"the built library issues raw system calls ({', '.join(insns)})")
    return reasons
