"""The `triton` toolchain on this machine: CUDA when there is a GPU, else Triton's CPU interpreter.

Skips cleanly without the [triton] extra. Kernels are built straight from sample_ops_triton/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from pytest_kope.candidate import Candidate
from pytest_kope.errors import BuildError, SpecError
from pytest_kope.judge.outcome import Outcome
from pytest_kope.spec import Point, parse_spec
from pytest_kope.toolchains import devices, pylaunch
from pytest_kope.toolchains.base import IN, OUT, SCALAR, Arg, Toolchain
from pytest_kope.toolchains.triton import TritonToolchain

# Before anything imports triton: the interpreter must be on when triton's own library is decorated.
TritonToolchain().prepare_process()
pytest.importorskip("triton")
torch = pytest.importorskip("torch")

OPS = Path(__file__).resolve().parent.parent / "sample_ops_triton"
ON_CPU = TritonToolchain().mode() == "interpreter"
cpu_only = pytest.mark.skipif(not ON_CPU, reason="checks the interpreter mode; a GPU is in use here")


def build(tmp_path: Path, op: str, params: Point | None = None, source: str | None = None):
    text = source if source is not None else (OPS / op / f"{op}.py").read_text()
    cand = Candidate(text, f"{op}.py", "triton", params or {})
    return TritonToolchain().build(cand, parse_spec(text, f"{op}.py"), tmp_path)


def test_is_a_toolchain():
    tc = TritonToolchain()
    assert isinstance(tc, Toolchain)
    assert tc.name == "triton" and tc.extensions == (".py",)


@cpu_only
def test_availability_says_interpreter_on_cpu():
    got = TritonToolchain().availability()
    assert got.ok
    assert got.reason.startswith("interpreter (TRITON_INTERPRET=1; correctness only, no timing)")
    assert TritonToolchain().environment() == {"TRITON_INTERPRET": "1"}
    assert TritonToolchain().count_devices() == 0


@cpu_only
def test_timer_cannot_time_on_cpu():
    timer = TritonToolchain().timer()
    assert timer.can_time is False
    assert timer.why_not == "Triton on CPU runs in the interpreter; its time means nothing"


def test_fingerprint_names_versions_and_device():
    fp = TritonToolchain().fingerprint()
    assert fp["toolchain"] == "triton"
    assert fp["triton"] and fp["torch"] and fp["arch"] and fp["model"]
    assert fp["device"] == ("cpu (triton interpreter)" if ON_CPU else fp["device"])


def test_builds_softmax_and_matches_torch(tmp_path):
    kernel = build(tmp_path, "softmax", {"BLOCK": 256})
    fn = kernel.functions["softmax"]
    assert fn.args == (Arg("x", IN), Arg("y", OUT), Arg("rows", SCALAR), Arg("cols", SCALAR))
    assert kernel.extra["params"] == {"BLOCK": 256, "num_warps": 4}
    assert kernel.extra["module"].BLOCK == 256  # the build set the module's `BLOCK = ...` literal
    dev = kernel.extra["device"]
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((3, 700), dtype=np.float32) * 5).to(dev)
    y = torch.full_like(x, float("nan"))
    fn.raw(x, y, 3, 700)  # 700 columns, BLOCK 256: three chunks, the last one masked
    err = (y.double() - torch.softmax(x.double(), dim=1)).abs().max().item()
    assert err < 1e-6


def test_each_candidate_gets_its_own_folder(tmp_path):
    a = build(tmp_path, "gelu", {"BLOCK": 256})
    b = build(tmp_path, "gelu", {"BLOCK": 512})
    assert a.extra["module"].__file__ != b.extra["module"].__file__
    x = torch.linspace(-6, 6, 3000, device=a.extra["device"])
    ya, yb = torch.empty_like(x), torch.empty_like(x)
    a.functions["gelu"].raw(x, ya, 3000)  # `a` still runs its own code after `b` was built
    b.functions["gelu"].raw(x, yb, 3000)
    ref = torch.nn.functional.gelu(x.double(), approximate="tanh")
    assert (ya.double() - ref).abs().max().item() < 1e-6
    assert (yb.double() - ref).abs().max().item() < 1e-6


def test_sgemm_through_the_toolchain(tmp_path):
    kernel = build(tmp_path, "sgemm", {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16})
    rng = np.random.default_rng(1)
    a, b = (torch.from_numpy(rng.standard_normal(s, dtype=np.float32)) for s in ((50, 40), (40, 30)))
    dev = kernel.extra["device"]
    a, b = a.to(dev), b.to(dev)
    c = torch.empty(50, 30, device=dev)
    kernel.functions["sgemm"].raw(a, b, c, 50, 30, 40)
    ref = a.cpu().double() @ b.cpu().double()
    assert (c.cpu().double() - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize(
    "line, why",
    [
        ("import os", "import of os is not allowed"),
        ("import subprocess as sp", "import of subprocess is not allowed"),
        ("from socket import socket", "import from socket is not allowed"),
        ("import ctypes", "import of ctypes is not allowed"),
        ("x = open('/etc/passwd').read()", "call to open() is not allowed"),
        ("eval('1')", "call to eval() is not allowed"),
        ("exec('1')", "call to exec() is not allowed"),
        ("m = __import__('os')", "call to __import__() is not allowed"),
        ("t = torch.load('w.pt')", "torch.load is not allowed"),
        ("k = ().__class__.__bases__", "dunder attribute .__class__ is not allowed"),
    ],
)
def test_screen_rejects_escapes(line, why):
    text = (OPS / "softmax" / "softmax.py").read_text() + f"\nimport torch\n{line}\n"
    reasons = TritonToolchain().screen(Candidate(text, "softmax.py", "triton"))
    assert any(why in r for r in reasons), reasons
    assert all(r.startswith("softmax.py:") for r in reasons)


@pytest.mark.parametrize("op", ["softmax", "layernorm", "rmsnorm", "gelu", "sgemm"])
def test_screen_passes_the_sample_ops(op):
    text = (OPS / op / f"{op}.py").read_text()
    assert TritonToolchain().screen(Candidate(text, f"{op}.py", "triton")) == []


def test_param_without_assignment_is_a_build_error(tmp_path):
    text = (OPS / "softmax" / "softmax.py").read_text().replace("num_warps = 4\n", "")
    with pytest.raises(
        BuildError, match=r"`kope: param num_warps` needs a top-level `num_warps = <literal>`"
    ):
        build(tmp_path, "softmax", source=text)


def test_syntax_and_import_errors_quote_the_line(tmp_path):
    text = (OPS / "softmax" / "softmax.py").read_text()
    with pytest.raises(BuildError, match=r"softmax.py:\d+: "):
        build(
            tmp_path / "a",
            "softmax",
            source=text.replace("def softmax(x, y, rows, cols):", "def softmax(x, y"),
        )
    with pytest.raises(BuildError, match=r"softmax.py:\d+: NameError"):
        build(tmp_path / "b", "softmax", source=text + "\nundefined_name + 1\n")


def test_launcher_must_exist_and_not_be_the_jit_kernel(tmp_path):
    text = (OPS / "softmax" / "softmax.py").read_text()
    with pytest.raises(BuildError, match="defines no softmax"):
        build(tmp_path / "a", "softmax", source=text.replace("def softmax(", "def softmax_launch("))
    jit_only = text.replace("kernel softmax(", "kernel _softmax_kernel(")
    with pytest.raises(BuildError, match="plain Python launcher"):
        build(tmp_path / "b", "softmax", source=jit_only)


def test_flags_are_refused(tmp_path):
    text = "# kope: flags -O2 | -O3\n" + (OPS / "gelu" / "gelu.py").read_text()
    with pytest.raises(BuildError, match="Triton sources take no compiler flags"):
        build(tmp_path, "gelu", source=text)


def test_kernel_declaration_syntax():
    name, args = pylaunch.parse_kernel("ln(x: in, w: in, y: out, acc: inout, rows, eps: float)")
    assert name == "ln"
    assert [a.role for a in args] == ["in", "in", "out", "inout", "scalar", "scalar"]
    assert pylaunch.parse_kernel("f(x: in, y)", frozenset({"y"}))[1][1].role == "inout"
    with pytest.raises(SpecError, match="write `kope: kernel NAME"):
        pylaunch.parse_kernel("not a declaration")


def test_bake_moves_the_winner_into_header_and_code(tmp_path):
    text = (OPS / "softmax" / "softmax.py").read_text()
    baked = pylaunch.bake(text, {"BLOCK": 2048, "num_warps": 8}, "softmax.py")
    assert "# kope: param BLOCK = 2048 | 1024 | 256 | 512 | 4096" in baked
    assert "\nBLOCK = 2048\n" in baked and "\nnum_warps = 8\n" in baked
    assert parse_spec(baked).space.defaults == {"BLOCK": 2048, "num_warps": 8}
    kernel = build(tmp_path, "softmax", source=baked)
    assert kernel.extra["module"].BLOCK == 2048


def test_visible_devices_env():
    from pytest_kope.toolchains.c import CToolchain

    var = TritonToolchain.device_env_var
    assert devices.visible_devices_env(var, 1, {}) == {"CUDA_VISIBLE_DEVICES": "1"}
    assert devices.visible_devices_env(var, 1, {"CUDA_VISIBLE_DEVICES": "2,3"}) == {
        "CUDA_VISIBLE_DEVICES": "3"
    }
    assert devices.visible_devices_env(CToolchain.device_env_var, 0, {}) == {}
    with pytest.raises(ValueError, match="out of range"):
        devices.visible_devices_env(var, 2, {"CUDA_VISIBLE_DEVICES": "2,3"})


def test_sample_ops_pass_through_the_plugin(pytester):
    for name in ("softmax", "gelu"):
        shutil.copytree(OPS / name, pytester.path / name)
    for name in ("conftest.py", "pytest.ini"):
        shutil.copy(OPS / name, pytester.path / name)
    # a subprocess: the suite itself has imported modules of the same names from sample_ops_triton/
    result = pytester.runpytest_subprocess("-q", "-rs", "-p", "no:cacheprovider")
    # On a GPU the two speed tests pass too; in the interpreter they skip, saying why.
    result.assert_outcomes(passed=8 if ON_CPU else 10, skipped=2 if ON_CPU else 0)
    if ON_CPU:
        result.stdout.fnmatch_lines(["*Triton on CPU runs in the interpreter; its time means nothing*"])


JIT_TESTS = """\
import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.kope("softmax", source="softmax.py", toolchain="triton")


def test_softmax_and_the_jit_cache(kernel):
    on_gpu = os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available()
    x = torch.randn(3, 40, device="cuda" if on_gpu else "cpu")
    y = torch.empty_like(x)
    kernel.softmax(x, y, 3, 40)
    torch.testing.assert_close(y, torch.softmax(x, dim=1))
    if "TRITON_CACHE_DIR" in os.environ:  # a compile's output, as Triton writes it on a GPU
        (Path(os.environ["TRITON_CACHE_DIR"]) / os.urandom(8).hex()).write_text("compiled")
"""


def test_a_candidates_children_share_its_jit_cache_and_the_verification_compiles_afresh(tmp_path):
    """Each judging child of a candidate finds what its earlier children compiled (on a GPU a Triton
    child spent most of its time recompiling them); another candidate's children get another cache;
    the winner's verification gets none."""
    from pytest_kope.judge.controller import sandbox
    from pytest_kope.judge.controller.environments import ENVIRONMENTS
    from pytest_kope.judge.controller.plan import Plan
    from pytest_kope.judge.controller.runner import Judge
    from pytest_kope.operator import Operator

    shutil.copy(OPS / "softmax" / "softmax.py", tmp_path / "softmax.py")
    (tmp_path / "test_jit.py").write_text(JIT_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    op = Operator("softmax", tmp_path / "softmax.py", "triton", "rowwise")
    plan = Plan(
        operator=op,
        rootdir=tmp_path,
        inifile=tmp_path / "pytest.ini",
        files=[tmp_path / "test_jit.py"],
        correctness=["test_jit.py::test_softmax_and_the_jit_cache"],
        performance=[],
        toolchain_env=dict(TritonToolchain().environment()),
        limits=sandbox.Limits(wall_s=120, device=not ON_CPU),  # RLIMIT_AS would hide the GPU
        jit_cache_env=TritonToolchain.jit_cache_env,
    )
    judge = Judge(plan, lambda c: [])
    try:
        judge.baseline(op.baseline())
        text = (tmp_path / "softmax.py").read_text()
        a = Candidate(text, "softmax.py", "triton", {"BLOCK": 256}, "a", "replay")
        b = Candidate(text, "softmax.py", "triton", {"BLOCK": 512}, "b", "replay")
        judged = judge.correctness([a]) + judge.correctness([a, b])
        assert all(j.outcome == Outcome.OK for j in judged), [j.failures for j in judged]
        root = judge.launcher.jit_root
        assert root is not None
        seen = {d.name: len(list(d.iterdir())) for d in root.iterdir()}
        each = len(ENVIRONMENTS)  # a child per environment a correctness judgement runs in
        assert seen[a.hash] == 2 * each and seen[b.hash] == each, seen
        judge.fresh_processes()
        (fresh,) = judge.correctness([a])
        assert fresh.outcome == Outcome.OK and len(list((root / a.hash).iterdir())) == 2 * each
    finally:
        judge.close()
    assert not root.exists()
