"""The Ascend lowering check on a CPU (`toolchains/ascend_lowering.py`), with triton-ascend's own tools.

Needs triton-ascend as the installed triton, so these skip under community triton (the project's CI)
and run in triton-ascend's own venv (`bench/ascend_install.py` makes one). The kernel that does not
lower is the issue's: a `tl.load` of a `tl.where`-selected pointer, which `triton-adapter-opt` fails in
ConvertTritonIRToLinalgIR. Each launch is checked in-process (a user's plain run) and through a
kernel server (a judging run), and rejected before its result counts.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pytest_kope.candidate import Candidate
from pytest_kope.errors import LoweringFailed
from pytest_kope.spec import parse_spec
from pytest_kope.toolchains import devices
from pytest_kope.toolchains.triton_ascend import TritonAscendToolchain

pytestmark = pytest.mark.skipif(
    devices.triton_flavour() != "ascend" or devices.npu_devices()["ok"],
    reason="needs triton-ascend as the installed triton and no NPU (its own venv: pip install "
    "torch==2.13.0 'pytest-kope[ascend]')",
)
if devices.triton_flavour() == "ascend":
    TritonAscendToolchain().prepare_process()
    torch = pytest.importorskip("torch")

HEAD = "# kope: kernel f(x: in, y: out, n)\nimport triton\nimport triton.language as tl\n\nBLOCK = 128\n"
WHERE = """
@triton.jit
def _k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(tl.where(mask, x_ptr + offs, x_ptr), mask=mask, other=0.0)
    tl.store(y_ptr + offs, x * 2, mask=mask)
"""
LAUNCH = "\ndef f(x, y, n):\n    {kernel}[(triton.cdiv(n, 128),)](x, y, n{block})\n"
WRAPPED = {
    "plain": WHERE + LAUNCH.format(kernel="_k", block=", BLOCK=BLOCK"),
    "heuristics": WHERE.replace("@triton.jit", "@triton.heuristics({'BLOCK': lambda a: 128})\n@triton.jit")
    + LAUNCH.format(kernel="_k", block=""),
    "autotune": WHERE.replace(
        "@triton.jit",
        "@triton.autotune(configs=[triton.Config({'BLOCK': 128})], key=['n'], "
        "do_bench=lambda call, quantiles: [1.0, 1.0, 1.0])\n@triton.jit",
    )
    + LAUNCH.format(kernel="_k", block=""),
    "alias": WHERE + "\nrun = _k\n" + LAUNCH.format(kernel="run", block=", BLOCK=BLOCK"),
    "nested": WHERE.replace("def _k(", "def _inner(")
    + textwrap.dedent("""
        @triton.jit
        def _k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            _inner(x_ptr, y_ptr, n, BLOCK)
        """)
    + LAUNCH.format(kernel="_k", block=", BLOCK=BLOCK"),
}
# lowers when n is even, not when it is odd: one kernel, two signatures (a constexpr picks the pointer)
BY_PARITY = HEAD + textwrap.dedent("""
    @triton.jit
    def _k(x_ptr, y_ptr, n, BLOCK: tl.constexpr, WHERE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        ptr = tl.where(mask, x_ptr + offs, x_ptr) if WHERE else x_ptr + offs
        tl.store(y_ptr + offs, tl.load(ptr, mask=mask, other=0.0) * 2, mask=mask)


    def f(x, y, n):
        _k[(triton.cdiv(n, 128),)](x, y, n, BLOCK=BLOCK, WHERE=n % 2 == 1)
    """)
FAILS = "does not lower for Ascend (Ascend910B2, triton-ascend"


def build(tmp_path: Path, text: str, served: bool):
    tc, cand = TritonAscendToolchain(), Candidate(text, "f.py", "triton-ascend")
    if not served:
        return tc.build(cand, parse_spec(text), tmp_path)
    from pytest_kope.judge.kernel import hosting

    return hosting.serve(tc, cand, parse_spec(text), tmp_path)


def call(kernel, n: int):
    x, y = torch.randn(n), torch.full((n,), float("nan"))
    kernel.functions["f"].raw(x, y, n)
    return x, y


@pytest.mark.parametrize("served", [False, True], ids=["in-process", "kernel-server"])
@pytest.mark.parametrize("wrapper", sorted(WRAPPED))
def test_a_kernel_that_does_not_lower_is_rejected_at_its_first_launch(tmp_path, wrapper, served):
    kernel = build(tmp_path, HEAD + WRAPPED[wrapper], served)
    for _ in range(2):  # and again at the next call: a verdict is never forgotten
        with pytest.raises(LoweringFailed) as info:
            call(kernel, 300)
        line = str(info.value)
        assert "\n" not in line and FAILS in line, line
        assert "at ConvertTritonIRToLinalgIR: triton-adapter-opt crashed: Assertion" in line


def test_in_process_the_check_comes_before_the_interpreter_runs(tmp_path):
    kernel = build(tmp_path, HEAD + WRAPPED["plain"], served=False)
    x, y = torch.randn(300), torch.full((300,), float("nan"))
    with pytest.raises(LoweringFailed):
        kernel.functions["f"].raw(x, y, 300)
    assert torch.isnan(y).all()


@pytest.mark.parametrize("served", [False, True], ids=["in-process", "kernel-server"])
def test_a_failing_signature_after_a_passing_one_is_rejected(tmp_path, served):
    kernel = build(tmp_path, BY_PARITY, served)
    x, y = call(kernel, 300)
    assert torch.equal(y, x * 2)
    with pytest.raises(LoweringFailed, match="kernel _k does not lower"):
        call(kernel, 301)
    call(kernel, 302)  # the passing signature still passes: verdicts are per signature


def test_nothing_is_kept_between_checks(tmp_path):
    """Two builds in one folder, as two candidates or two runs would be: the second checks afresh."""
    first = build(tmp_path, BY_PARITY, served=False)
    call(first, 300)
    second = build(tmp_path, BY_PARITY, served=False)
    with pytest.raises(LoweringFailed):
        call(second, 301)
    assert not [p for p in tmp_path.rglob("*") if p.suffix in (".ttir", ".ttadapter", ".json")]


FP64 = HEAD + textwrap.dedent("""
    @triton.jit
    def _k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(y_ptr + offs, x * x, mask=offs < n)


    def f(x, y, n):
        _k[(triton.cdiv(n, BLOCK),)](x, y, n, BLOCK=BLOCK)
    """)
ASM = FP64.replace(
    "x * x",
    'tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)',
)


@pytest.mark.parametrize(
    "load, where",
    [
        ("tl.load(x_ptr + offs, mask=offs < n)", "at Python -> TTIR: at 3:8: ValueError"),  # its cast rule
        (
            "tl.load(x_ptr + offs)",
            "at TTIR: fp64 values in the kernel:",
        ),  # no cast: the same rule on the TTIR
    ],
)
def test_fp64_arithmetic_is_rejected_by_triton_ascends_rule(tmp_path, load, where):
    kernel = build(tmp_path, FP64.replace("tl.load(x_ptr + offs, mask=offs < n)", load), served=False)
    x, y = torch.randn(128, dtype=torch.float64), torch.empty(128, dtype=torch.float64)
    with pytest.raises(LoweringFailed) as info:
        kernel.functions["f"].raw(x, y, 128)
    assert where in str(info.value) and "[fp8, fp64] is unsupported on Ascend" in str(info.value)


def test_inline_assembly_is_rejected(tmp_path):
    kernel = build(tmp_path, ASM, served=False)
    with pytest.raises(LoweringFailed, match="inline assembly .* has no Ascend lowering"):
        call(kernel, 100)


@pytest.mark.parametrize("op", ["softmax", "gelu", "sgemm"])
def test_the_sample_kernels_lower(tmp_path, op):
    text = (Path(__file__).resolve().parent.parent / "sample_ops_triton" / op / f"{op}.py").read_text()
    kernel = TritonAscendToolchain().build(
        Candidate(text, f"{op}.py", "triton-ascend"), parse_spec(text), tmp_path
    )
    args = {
        "softmax": lambda: (torch.randn(4, 300), torch.empty(4, 300), 4, 300),
        "gelu": lambda: (torch.randn(1000), torch.empty(1000), 1000),
        "sgemm": lambda: (torch.randn(40, 30), torch.randn(30, 20), torch.empty(40, 20), 40, 20, 30),
    }[op]()
    kernel.functions[op].raw(*args)


def test_a_failing_signature_after_a_passing_one_across_runs(pytester):
    """Two plain runs of one repo, each a fresh process: the passing signature first, then the failing
    one; both runs reject it, and the check leaves nothing in the repo for a later run to find."""
    (pytester.path / "f.py").write_text(BY_PARITY)
    pytester.makepyfile(
        test_f="""
        import pytest
        import torch

        pytestmark = pytest.mark.kope("f", source="f.py")

        @pytest.mark.parametrize("n", [300, 301])
        def test_doubles(kernel, n):
            x, y = torch.randn(n), torch.empty(n)
            kernel.f(x, y, n)
            assert torch.equal(y, x * 2)
        """
    )
    pytester.makeini("[pytest]\nkope_toolchain = triton-ascend\n")
    for _ in range(2):
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
        result.assert_outcomes(passed=1, failed=1)
        result.stdout.fnmatch_lines(
            [
                "E *LoweringFailed: kernel _k does not lower for Ascend*",
                "FAILED test_f.py::test_doubles[[]301[]]*",
            ]
        )
    assert not [p for p in pytester.path.rglob("*") if p.suffix in (".ttir", ".ttadapter")]
