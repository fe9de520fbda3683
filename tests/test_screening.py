"""Screens of untrusted candidate text, each with real inputs: headers, C sources built by real gcc,
Python (Triton) sources.

- `kope: require` is read by a fixed grammar: nothing in a header is ever executed by the controller.
- A built C/C++ library may import only allow-listed symbols: every sample and honest test kernel,
  built by gcc with its flag sets, passes; glibc's aliases and weak references of forbidden calls fail.
- One C comment stripper and one forbidden-name list serve the toolchains and the claude agent.
- A Python (Triton) source imports only allow-listed modules and cannot reach the interpreter, the
  oracle or the standard library through attributes, nor patch anything; the samples still pass.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from op_repos import SCALE_C

from pytest_kope.candidate import Candidate
from pytest_kope.errors import BuildError, SpecError
from pytest_kope.requires import evaluate_require, require_error
from pytest_kope.spec import FLAGS, Point, TuningSpace, parse_spec
from pytest_kope.toolchains import screening
from pytest_kope.toolchains.c import CToolchain

ROOT = Path(__file__).resolve().parent.parent
needs_gcc = pytest.mark.skipif(
    not (shutil.which("gcc") and shutil.which("g++") and shutil.which("nm") and shutil.which("objdump")),
    reason="needs gcc, g++ and binutils",
)

# -- `kope: require`: a fixed grammar, never eval ---------------------------------------------------------

AXES = {"BLOCK": (64, 128, 32), "VEC": (0, 8), "flags": ("-O2", "-O3 -march=native")}
POINT = {"BLOCK": 128, "VEC": 8, "flags": "-O3 -march=native"}


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("BLOCK % 64 == 0", True),
        ("BLOCK >= 256 or flags == '-O2'", False),
        ("16 <= BLOCK < 256", True),
        ("BLOCK in (64, 128)", True),
        ("BLOCK not in [64, 32]", True),
        ("VEC in (-1, +8)", True),
        ("not (BLOCK == 128)", False),
        ("BLOCK == 128 and VEC > 0", True),
        ("(BLOCK + VEC) * 2 - 1 == 271", True),
        ("BLOCK / 3 > 42.6", True),
        ("BLOCK // 3 == 42", True),
        ("BLOCK ** 2 <= 16384", True),
        ("2 ** VEC == 256", True),
        ("-BLOCK < 0", True),
        ("BLOCK > 127.5", True),
        ("'march' in flags", True),
        ("flags + ' -g' == '-O3 -march=native -g'", True),
        ("True", True),
        ("False or VEC", True),
        # evaluation errors rule the point out
        ("1 / (VEC - 8) > 0", False),
        ("BLOCK % (VEC - 8) == 0", False),
        ("BLOCK < flags", False),
        ("'x' * BLOCK == 'x'", False),  # no string repetition (a memory bomb with a big param)
        ("VEC ** BLOCK > 0", False),  # an exponent (param value 128) over the cap at run time
        ("BLOCK in flags", False),  # `in` over a non-literal needs two strings
    ],
)
def test_require_grammar_accepts_and_evaluates(expr, expected):
    assert require_error(expr, AXES) is None
    assert evaluate_require(expr, POINT) is expected
    assert TuningSpace(AXES, (expr,)).allows(POINT) is expected


@pytest.mark.parametrize(
    "expr, found",
    [
        ("().__class__.__base__.__subclasses__()", "a call"),
        ("__import__('os')", "a call"),
        ("open('x')", "a call"),
        ("[c for c in ()]", "a comprehension"),
        ("(c for c in ())", "a comprehension"),
        ("lambda: 0", "a lambda"),
        ("x.y", "an attribute access"),
        ("a[0]", "a subscript"),
        ("2**10**10", "a power whose exponent is not a param or a number of at most 64"),
        ("BLOCK ** 100", "a power whose exponent is not a param or a number of at most 64"),
        ("f'{BLOCK}' == '1'", "an f-string"),
        ("__builtins__", "the dunder name __builtins__"),
        ("BLOCK if VEC else 0", "a conditional expression"),
        ("(x := 1)", "an assignment"),
        ("BLOCK << 40", "the operator LShift"),
        ("~BLOCK", "the operator Invert"),
        ("BLOCK == None", "the constant None"),
        ("b'x' == BLOCK", "the constant b'x'"),
        ("{1: 2}", "a dict"),
        ("(BLOCK, VEC)", "a list outside `in`/`not in`"),
        ("BLOCK in (VEC, 1)", "a list with an element that is not a number or a string"),
        ("UNDECLARED > 1", "the name UNDECLARED, which is not a param of this source"),
        ("BLOCK >", "a syntax error"),
    ],
)
def test_require_grammar_rejects_at_parse_time(expr, found):
    header = f"// kope: kernel void f(float *y)\n// kope: param BLOCK = 64 | 128\n// kope: require {expr}\n"
    header += "// kope: param VEC = 0 | 8\n"  # a param declared after the require line still counts
    with pytest.raises(SpecError) as info:
        parse_spec(header, "softmax.c")
    message = str(info.value)
    assert message.startswith("softmax.c:3: `kope: require` allows only params, numbers, comparisons")
    assert f"found {found}" in message
    assert "\n" not in message


def test_a_candidate_header_payload_is_never_executed(tmp_path):
    """The payloads would each create a file if evaluated; neither parsing nor the tuner's use runs them."""
    target = tmp_path / "pwned"
    payloads = [
        f"__import__('os').system('touch {target}') == 0",
        f"open('{target}', 'w') is not None",
        "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'Popen'][0]"
        f"(['touch', '{target}']) is not None",
    ]
    for payload in payloads:
        source = (
            f"// kope: kernel void f(float *y)\n// kope: param BLOCK = 1 | 2\n// kope: require {payload}\n"
        )
        with pytest.raises(SpecError, match=r"^softmax\.c:3: `kope: require` allows only"):
            parse_spec(source, "softmax.c")
        # a space built without the parser (say, by a plugin) is still only interpreted, never evaluated
        space = TuningSpace({"BLOCK": (1, 2)}, (payload,))
        assert list(space.points()) == []
        assert not space.allows({"BLOCK": 1})
    assert not target.exists()


def test_require_interpreter_refuses_unchecked_nodes():
    """evaluate_require is safe on text the parser never saw: anything off the grammar is False."""
    assert evaluate_require("(1).__class__", {}) is False
    assert evaluate_require("print('x') or True", {}) is False
    assert evaluate_require("BLOCK", {"BLOCK": [1]}) is False  # a param value that is not a scalar


def test_sample_op_constraints_still_parse_and_filter():
    transpose = parse_spec((ROOT / "sample_ops/transpose/transpose.c").read_text(), "transpose.c")
    points = list(transpose.space.points())
    assert len(points) == 69
    for p in points:
        block = p["BLOCK"]
        assert isinstance(block, int), p
        assert block > 0 or p["THREADS"] == 1, p
        assert p["NT"] == 0 or block >= 16, p
    sgemm = parse_spec((ROOT / "sample_ops/sgemm/sgemm.c").read_text(), "sgemm.c")
    assert len(list(sgemm.space.points())) == 112  # MR * NV <= 12: 6 register tiles


# -- built libraries: the allow-list of imported symbols ---------------------------------------------


def _points(space: TuningSpace) -> list[Point]:
    """The defaults, each other value of each axis alone, and every axis at its last value: the flag
    sets (-O3 -march=native ...), THREADS (OpenMP) and VEC (omp simd) variants all get built."""
    base = space.defaults
    points = [base] + [{**base, k: v} for k, vals in space.axes.items() for v in vals[1:]]
    points.append({k: vals[-1] for k, vals in space.axes.items()})
    return [p for i, p in enumerate(points) if space.allows(p) and p not in points[:i]]


SAMPLES = sorted(ROOT.glob("sample_ops/*/*.c"))


@needs_gcc
@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_sample_kernels_build_and_pass_the_allow_list(tmp_path, path):
    text = path.read_text()
    spec = parse_spec(text, path.name)
    points = _points(spec.space)
    assert any("march=native" in str(p.get(FLAGS, "")) for p in points)
    for point in points:
        kernel = CToolchain().build(Candidate(text, path.name, "c", point), spec, tmp_path)
        assert set(kernel.functions) == {n.split("(")[0].split()[-1] for n in spec.kernels}


HONEST_TRICKS = [  # tests/adversarial kernels whose cheat is for the oracle, not a forbidden import
    "control_ok", "huge_malloc", "infinite_loop", "inplace_redeclared", "input_mutation", "low_precision",
    "mxcsr_ftz", "nan_output", "pointer_cache", "segfault", "stale_nothing", "stale_partial",
    "thread_omp_nowait", "wrong_tail",
]  # fmt: skip


def _gcc(tmp_path: Path, source: str, name: str = "k.c", flags: str = "-O2") -> Path:
    src = tmp_path / name
    src.write_text(source)
    lib = tmp_path / (Path(name).stem + ".so")
    cc = "gcc" if name.endswith(".c") else "g++"
    std = "-std=gnu11" if name.endswith(".c") else "-std=gnu++17"
    cmd = [cc, "-shared", "-fPIC", "-fopenmp", std, *flags.split(), str(src), "-o", str(lib), "-lm"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return lib


@needs_gcc
@pytest.mark.parametrize("flags", ["-O0", "-O3 -march=native", "-O2 -D_FORTIFY_SOURCE=2"])
def test_honest_test_kernels_pass_the_allow_list(tmp_path, flags):
    sources = {f"{n}.c": (ROOT / "tests/adversarial/softmax" / f"{n}.c").read_text() for n in HONEST_TRICKS}
    sources["scale.c"] = SCALE_C.replace("#if UNROLL > 1", "#if 1").replace("UNROLL", "4")
    for name, text in sources.items():
        lib = _gcc(tmp_path, text, name, flags)
        assert screening.screen_library(lib) == [], name


OPENMP_AND_LIBC = r"""
#include <assert.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
static int tid;
#pragma omp threadprivate(tid)
static int cmp(const void *a, const void *b) { return *(const float *)a < *(const float *)b ? -1 : 1; }
float k(const float *x, float *y, int n) {
    float s = 0, m = -INFINITY; double d = 0; long long cnt = 0;
    double t0 = omp_get_wtime();
    #pragma omp parallel for reduction(+:s) reduction(max:m) schedule(static)
    for (int i = 0; i < n; i++) { s += x[i]; m = fmaxf(m, x[i]); }
    #pragma omp parallel for schedule(dynamic, 4)
    for (int i = 0; i < n; i++) y[i] = expf(x[i]) + sinf(x[i]) + powf(x[i], 1.5f) + erff(x[i]);
    #pragma omp parallel for schedule(guided)
    for (int i = 0; i < n; i++) y[i] += logf(fabsf(x[i]) + 1) + tanh(x[i]) + cbrt(x[i]);
    #pragma omp parallel for schedule(runtime) collapse(2)
    for (int i = 0; i < n; i++) for (int j = 0; j < 2; j++) y[i] += j;
    #pragma omp parallel for ordered
    for (int i = 0; i < n; i++) {
        #pragma omp ordered
        d += x[i];
    }
    #pragma omp parallel
    {
        tid = omp_get_thread_num() + omp_get_num_threads();
        #pragma omp for nowait
        for (int i = 0; i < n; i++) y[i] += 1;
        #pragma omp barrier
        #pragma omp critical
        { s += 1; }
        #pragma omp critical(named)
        { s += 2; }
        #pragma omp atomic
        cnt += 1;
        #pragma omp atomic update
        d += 1.5;
        #pragma omp single
        { d += 1; }
        #pragma omp masked
        { d += 1; }
        #pragma omp sections
        {
            #pragma omp section
            { y[0] += 1; }
            #pragma omp section
            { y[1] += 1; }
        }
        #pragma omp single
        {
            for (int i = 0; i < 4 && i < n; i++) {
                #pragma omp task firstprivate(i) shared(y)
                y[i] += 1;
            }
            #pragma omp taskwait
            #pragma omp taskgroup
            {
                #pragma omp task
                y[0] += 1;
            }
            #pragma omp taskloop grainsize(4)
            for (int i = 0; i < n; i++) y[i] += 0;
            #pragma omp taskyield
        }
    }
    #pragma omp simd reduction(+:s) simdlen(8)
    for (int i = 0; i < n; i++) s += sqrtf(x[i]);
    #pragma omp parallel for simd
    for (int i = 0; i < n; i++) y[i] = fmaf(x[i], 2.f, 1.f);
    #pragma omp parallel for reduction(+:y[:4])
    for (int i = 0; i < n; i++) y[i % 4] += 1;
    #pragma omp parallel for ordered(1)
    for (int i = 1; i < n; i++) {
        #pragma omp ordered depend(sink: i - 1)
        y[i] += y[i - 1];
        #pragma omp ordered depend(source)
    }
    #pragma omp teams num_teams(2)
    {
        #pragma omp distribute parallel for
        for (int i = 0; i < n; i++) y[i] += 0;
    }
    omp_lock_t l; omp_init_lock(&l); omp_set_lock(&l); omp_unset_lock(&l); omp_destroy_lock(&l);
    float *buf = omp_alloc(64, omp_default_mem_alloc); omp_free(buf, omp_default_mem_alloc);
    float *p = aligned_alloc(64, 64 * sizeof(float)), *q = calloc(n + 1, sizeof(float));
    void *r = NULL;
    if (posix_memalign(&r, 64, 256) == 0) free(r);
    memset(p, 0, 64 * sizeof(float)); memcpy(q, x, n * sizeof(float)); memmove(q + 1, q, n);
    qsort(q, n, sizeof(float), cmp);
    q = realloc(q, 2 * (n + 1) * sizeof(float));
    assert(memcmp(p, p, 4) == 0 && n >= 0);
    free(p); free(q);
    return s + m + (float)d + cnt + omp_get_max_threads() + (float)(omp_get_wtime() - t0);
}
"""

CXX_NUMERIC = r"""
#include <algorithm>
#include <array>
#include <cmath>
#include <complex>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <vector>
struct Op { virtual float f(float x) const = 0; virtual ~Op() = default; };
struct Sq : Op { float f(float x) const override { return x * x; } };
static std::vector<float> &scratch() { static std::vector<float> v; return v; }
extern "C" void k(const float *x, float *y, int n) {
    std::vector<float> v(x, x + n);
    std::sort(v.begin(), v.end());
    float s = std::accumulate(v.begin(), v.end(), 0.0f);
    float m = *std::max_element(v.begin(), v.end());
    std::unique_ptr<float[]> buf(new float[n]);
    std::unique_ptr<Op> op(new Sq());
    auto &sc = scratch(); sc.resize(n);
    std::function<float(float)> fn = [&](float z) { return std::exp(z - m) + op->f(z); };
    std::complex<float> c(1, 2); c = c * std::complex<float>(x[0], 1.f) / std::complex<float>(2, 3);
    if (n < 0) throw std::invalid_argument("n < 0");
    try { s += v.at(n + 5); } catch (const std::out_of_range &) { s += 1; }
    #pragma omp parallel for
    for (int i = 0; i < n; i++) y[i] = fn(x[i]) / s + std::sqrt(std::abs(x[i])) + std::pow(x[i], 3) + c.real();
    std::memcpy(buf.get(), y, n * sizeof(float));
    std::copy(buf.get(), buf.get() + n, sc.begin());
}
"""


@needs_gcc
@pytest.mark.parametrize("flags", ["-O2", "-O3 -march=native", "-O0", "-O2 -fstack-protector-all"])
@pytest.mark.parametrize("name, source", [("omp.c", OPENMP_AND_LIBC), ("numeric.cpp", CXX_NUMERIC)])
def test_openmp_libc_and_cxx_runtime_pass_the_allow_list(tmp_path, flags, name, source):
    lib = _gcc(tmp_path, source, name, flags)
    assert screening.screen_library(lib) == []


# Each would reach a forbidden capability through a name the old deny-list did not have: glibc's internal
# aliases, a weak reference (bound to libc's definition if there is one), data, output, process-wide state.
ESCAPES = {
    "__open": "extern int __open(const char *, int, ...); int k(void) { return __open(\"/etc/passwd\", 0); }",
    "__write": "extern long __write(int, const void *, unsigned long); long k(void) { return __write(1, \"x\", 1); }",
    "_IO_popen": "extern void *_IO_popen(const char *, const char *); void *k(void) { return _IO_popen(\"id\", \"r\"); }",
    "__fork": "extern int __fork(void); int k(void) { return __fork(); }",
    "__libc_system": "extern int __libc_system(const char *); int k(void) { return __libc_system(\"id\"); }",
    "syscall": "extern long syscall(long, ...); long (*p)(long, ...) = syscall; long k(void) { return p(39); }",
    "__libc_dlopen_mode": "extern void *__libc_dlopen_mode(const char *, int); void *k(void) { return __libc_dlopen_mode(\"x\", 2); }",
    "__environ": "extern char **__environ; char *k(void) { return __environ[0]; }",
    "printf": "#include <stdio.h>\nint k(void) { return printf(\"forged\\n\"); }",
    "omp_set_num_threads": "#include <omp.h>\nvoid k(void) { omp_set_num_threads(1); }",
    "pthread_create": "extern int pthread_create(); int (*p)() = pthread_create; int k(void) { return p(0, 0, 0, 0); }",
}  # fmt: skip
WEAK = 'extern int __libc_system(const char *) __attribute__((weak));\nint k(void) { return __libc_system ? __libc_system("id") : 0; }\n'


@needs_gcc
@pytest.mark.parametrize("symbol", list(ESCAPES) + ["weak __libc_system"])
def test_forbidden_imports_are_refused_naming_the_symbol(tmp_path, symbol):
    source = WEAK if symbol.startswith("weak") else ESCAPES[symbol]
    name = symbol.split()[-1]
    lib = _gcc(tmp_path, source)
    (reason,) = screening.screen_library(lib)
    names, _, why = reason.removeprefix("the built library imports ").partition(" (")
    assert name in names.split(", ")  # `__environ` comes with its aliases `_environ, environ`
    assert why == (
        "not in the allow-list of kernel imports; "
        "widen it with the ini option kope_allow_symbols if your kernels need it)"
    )


@needs_gcc
def test_the_toolchain_refuses_the_build_and_the_ini_option_widens_the_list(tmp_path):
    text = "// kope: kernel int k(void)\n" + ESCAPES["__open"] + "\n"
    cand = Candidate(text, "k.c", "c")
    with pytest.raises(BuildError, match=r"screening: the built library imports __open \(not in the allow"):
        CToolchain().build(cand, parse_spec(text), tmp_path)
    assert not list(tmp_path.glob("*/kernel.so"))  # nothing refused is left where a later build finds it
    kernel = CToolchain(allow_symbols=["__op?n"]).build(cand, parse_spec(text), tmp_path)
    assert "k" in kernel.functions
    with pytest.raises(BuildError, match=r"imports __open"):  # the wider build is not reused
        CToolchain().build(cand, parse_spec(text), tmp_path)


def test_kope_allow_symbols_reaches_the_c_toolchain(pytester: pytest.Pytester):
    pytester.makeini("[pytest]\nkope_allow_symbols =\n    __open\n    _IO_*\n")
    config = pytester.parseconfigure()
    tc = config.hook.pytest_kope_make_toolchain(name="c", config=config)
    assert tc.allow_symbols == ("__open", "_IO_*")
    assert screening.symbol_allowed("_IO_popen", tc.allow_symbols)
    assert not screening.symbol_allowed("_IO_popen")


@pytest.mark.parametrize(
    "name, allowed",
    [
        ("expf@GLIBC_2.27", True), ("__expf_finite", True), ("__lgammaf_r_finite", True),
        ("_ZGVdN8v_expf", True), ("_ZGVbN2vv_pow", True), ("__isnanf", True), ("sincosf", True),
        ("GOMP_loop_nonmonotonic_dynamic_start", True), ("GOMP_parallel_loop_static", True),
        ("_ZTISt12out_of_range", True), ("_ZNSt16invalid_argumentC1EPKc", True), ("__mulsc3", True),
        ("fesetround", False), ("feenableexcept", False), ("GOMP_target_ext", False),
        ("_ZGVdN8v_system", False), ("__system_finite", False), ("_ZNSt6thread15_M_start_threadE", False),
        ("_ZNSt13random_device7_M_initERKSs", False), ("omp_display_env", False), ("dlsym", False),
    ],
)  # fmt: skip
def test_symbol_allow_list(name, allowed):
    assert screening.symbol_allowed(name) is allowed


def test_screen_library_fails_closed(tmp_path):
    (reason,) = screening.screen_library(tmp_path / "missing.so")
    assert reason.startswith("cannot inspect the built library")


# -- C sources: one comment stripper, one forbidden-name list ------------------------------------------


@pytest.mark.parametrize(
    "source, found",
    [
        ('void f(void) { system("x"); }', ["system"]),
        ('/* system("x") */ // fork()\nint x;', []),
        ('const char *u = "http://x"; void f(void) { system("x"); }', ["system"]),  # `//` in a string
        ('void f(void) { sys\\\ntem("x"); }', ["system"]),  # a line splice inside the name
        ('// comment \\\nsystem("x");\nint y;', []),  # the splice carries the comment on: not code
        ('int n = 1\'000; void f(void) { system("x"); }', ["system"]),  # a C++14 digit separator
        ('const char *r = R"(//)"; void f(void) { fork(); }', ["fork"]),  # a raw string with `//`
        ('char c = \'"\'; void f(void) { popen("x", "r"); }', ["popen"]),
        ("int (*p)(void) = (fork);", ["fork"]),
    ],
)
def test_c_source_screen(source, found):
    assert screening.forbidden_c_names(source) == found


def test_one_c_screen_for_the_toolchains_and_the_agent():
    from pytest_kope.agents.base import Context, OperatorInfo
    from pytest_kope.agents.llm import tools
    from pytest_kope.judge.outcome import Judged, Outcome
    from pytest_kope.toolchains import ascendc, c

    text = 'const char *u = "//"; void f(void) { getenv("HOME"); }'
    want = ["calls getenv() (process/file/network/environment APIs are not allowed in a kernel)"]
    assert c.CToolchain().screen(Candidate(text, "f.c", "c")) == want
    assert ascendc.AscendCToolchain().screen(Candidate(text, "f.cpp", "ascendc")) == want
    info = OperatorInfo("f", "f", "c", "f.c", text, TuningSpace(), (), screen=c.CToolchain().screen)
    committed = Judged(Candidate(text, "f.c", "c"), Outcome.OK)
    ctx = Context(
        info, {}, committed, committed, [committed], 1, recall=lambda **_: None, seen=lambda h: False
    )
    assert tools.screen(ctx, text) == want  # the agent screens with the operator's toolchain
    assert not hasattr(tools, "_strip_c_comments") and not hasattr(tools, "_FORBIDDEN_C")
    # the names c.py binds (imported for its own use, not its typed API) are screening's own objects
    c_names = vars(c)
    assert c_names["FORBIDDEN_CALLS"] is screening.FORBIDDEN_CALLS
    assert c_names["screen_library"] is screening.screen_library


# -- Python (Triton) sources ---------------------------------------------------------------------------

TRITON_SOURCES = sorted(ROOT.glob("sample_ops_triton/*/*.py"))
TRITON_SOURCES = [p for p in TRITON_SOURCES if not p.name.startswith(("test_", "conftest"))]
HONEST_PY = (ROOT / "sample_ops_triton/softmax/softmax.py").read_text()


@pytest.mark.parametrize("path", TRITON_SOURCES, ids=[p.stem for p in TRITON_SOURCES])
def test_triton_sample_sources_pass(path):
    assert screening.screen_python_source(path.read_text(), path.name) == []


def test_triton_template_source_passes():
    readme = (ROOT / "conftest_templates/triton/README.md").read_text()
    source = readme.split("```python\n")[1].split("```")[0]
    assert "kope: kernel" in source
    assert screening.screen_python_source(source, "softmax.py") == []


@pytest.mark.parametrize(
    "line, why",
    [
        ("import typing\nm = typing.sys.modules", "import of typing is not allowed"),
        ("import typing\nm = typing.sys.modules", "attribute .sys is not allowed in a kernel source (it names"),
        ("import typing\nm = typing.sys.modules", "attribute .modules is not allowed"),
        ("import torch\ns = torch.sys", "attribute .sys is not allowed"),
        ("import numpy as np\no = np.os", "attribute .os is not allowed"),
        ("import torch\np = torch.os.popen", "attribute .os is not allowed"),
        ("import torch\ntorch.testing.assert_close = lambda *a, **k: None", "attribute .testing is not allowed"),
        ("import torch\ntorch.testing.assert_close = lambda *a, **k: None", "assignment to attribute .assert_close"),
        ("import numpy as np\nnp.allclose = lambda *a, **k: True", "assignment to attribute .allclose"),
        ("import triton.language as tl\ntl.exp = tl.abs", "assignment to attribute .exp"),
        ("import torch\ndel torch.allclose", "assignment to attribute .allclose"),
        ("import torch\nm = torch\nm.allclose = 1", "assignment to attribute .allclose"),
        ("import torch\ntorch.ops['x'] = 1", "assignment into torch (an imported module)"),
        ("b = __builtins__", "use of __builtins__ is not allowed"),
        ("k = ().__class__", "dunder attribute .__class__ is not allowed"),
        ("n = __name__", "use of __name__ is not allowed"),
        ("import importlib", "import of importlib is not allowed"),
        ("from typing import *", "import from typing is not allowed"),
        ("from torch import *", "star import from torch is not allowed"),
        ("import functools", "import of functools is not allowed"),
        ("from torch import testing", "import of testing from torch is not allowed"),
        ("from torch.utils import cpp_extension", "import of cpp_extension from torch.utils is not allowed"),
        ("import torch.multiprocessing", "import of torch.multiprocessing is not allowed"),
        ("import numpy.ctypeslib", "import of numpy.ctypeslib is not allowed"),
        ("import torch\nc = torch._C", "private attribute ._C is not allowed"),
        ("import numpy as np\np = np.zeros(1).ctypes.data", "attribute .ctypes is not allowed"),
        ("def g():\n    yield 1\nf = g().gi_frame.f_globals", "attribute .gi_frame is not allowed"),
        ("import torch\nmatch torch:\n    case object(sys=s):\n        pass", "attribute .sys is not allowed"),
        ("import torch\ndef f():\n    global torch\n    torch = None", "global torch (an imported module)"),
        ("f = open", "use of open is not allowed"),
        ("x = open('/etc/passwd').read()", "call to open() is not allowed"),
        ("g = getattr(1, 'real')", "call to getattr() is not allowed"),
        ("import torch\nt = torch.load('w.pt')", "torch.load is not allowed"),
        ("import numpy as np\nnp.savez('x', a=1)", "numpy.savez is not allowed"),
        ("import torch\ntorch.set_flush_denormal(True)", "torch.set_flush_denormal is not allowed"),
        ("import torch as __builtins__", "import as __builtins__ is not allowed"),
        ("from . import x", "import from . is not allowed"),
    ],
)  # fmt: skip
def test_python_screen_refuses_escapes(line, why):
    reasons = screening.screen_python_source(HONEST_PY + "\n" + line + "\n", "softmax.py")
    assert any(why in r for r in reasons), reasons
    assert all(r.startswith("softmax.py:") and "\n" not in r for r in reasons)


def test_pylaunch_screen_is_the_shared_one():
    from pytest_kope.toolchains import pylaunch

    assert pylaunch.screen("import typing\n", "k.py") == screening.screen_python_source(
        "import typing\n", "k.py"
    )
    assert {"triton", "torch", "torch_npu", "math", "numpy", "__future__"} == pylaunch.ALLOWED_IMPORTS
