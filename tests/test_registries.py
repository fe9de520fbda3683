"""Adding a toolchain, an agent, a guard or a report format touches only its own code and one registry
line (or hook).

Each test defines a toy one here and shows it working through the real machinery: the toy toolchain
optimizes an operator end to end (collection by suffix, judging children, timing, the report), the toy
guard fails a kernel call the built-in guards let through, the toy format is written beside report.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from op_repos import INI, UNJAILED

from pytest_kope.candidate import Candidate
from pytest_kope.errors import GuardViolation
from pytest_kope.judge.child import guards
from pytest_kope.review import report_formats
from pytest_kope.spec import parse_spec
from pytest_kope.toolchains.c import CToolchain

# The whole toy toolchain: its module (here a conftest) and the two registry hooks at the end.
TOY_CONFTEST = '''
import re

from pytest_kope.hardware import cpu_fingerprint
from pytest_kope.toolchains.base import Availability, Kernel, KernelFunction, ToolchainBase
from pytest_kope.toolchains.c import parse_prototype


class ToyToolchain(ToolchainBase):
    """`.toy` sources: one line `factor F`; each declared kernel computes y[:n] = F * x[:n] in numpy."""

    name = "toy"
    extensions = (".toy",)

    def availability(self):
        return Availability(True, "toy here")

    def fingerprint(self):
        return {**cpu_fingerprint(), "toolchain": self.name, "compiler": "toy 1"}

    def screen(self, candidate):
        return [] if "factor" in candidate.source else ["a toy source says its factor"]

    def build(self, candidate, spec, build_dir):
        factor = float(re.search(r"^factor (\\S+)", candidate.source, re.M).group(1))
        chunk = int(candidate.params.get("CHUNK", 1))

        def scale(x, y, n):
            for i in range(0, n, max(1, n // chunk)):
                j = min(n, i + max(1, n // chunk))
                y[i:j] = factor * x[i:j]

        functions = {}
        for proto in spec.kernels:
            name, args, _ = parse_prototype(proto)
            functions[name] = KernelFunction(name, scale, args)
        return Kernel(candidate, functions, f"toy build, factor {factor}, chunk {chunk}")


def pytest_kope_make_toolchain(name, config):
    return ToyToolchain() if name == "toy" else None


def pytest_kope_toolchain_names(config):
    return ["toy"]
'''

TOY_SOURCE = """\
# kope: kernel void scale(const float *x, float *y, int n)
# kope: param CHUNK = 1 | 4
factor 2.0
"""

TOY_TEST = """\
import numpy as np
import pytest
from pytest_kope import assert_close

pytestmark = pytest.mark.kope("scale", source="scale.toy")


@pytest.mark.parametrize("n", [1, 7, 1001])
def test_scale(kernel, rng, n):
    x = rng.standard_normal(n, dtype=np.float32)
    y = np.empty_like(x)
    kernel.scale(x, y, n)
    assert_close(y, 2 * x, rtol=1e-6)


def test_scale_speed(kernel, kope_bench, rng):
    n = 1 << 16
    x = rng.standard_normal(n, dtype=np.float32)
    y = np.empty_like(x)
    kope_bench(kernel.scale, x, y, n)
"""


@pytest.fixture
def toy_repo(pytester: pytest.Pytester) -> Path:
    pytester.makeconftest(TOY_CONFTEST)
    (pytester.path / "pytest.ini").write_text(INI)
    (pytester.path / "scale.toy").write_text(TOY_SOURCE)
    (pytester.path / "test_scale.py").write_text(TOY_TEST)
    return pytester.path


def test_a_toy_toolchain_runs_plain_tests(pytester: pytest.Pytester, toy_repo: Path) -> None:
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=4)
    (toy_repo / "scale.toy").write_text(TOY_SOURCE.replace("factor 2.0", "factor 3.0"))
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1, failed=3)


def test_a_toy_toolchain_is_optimized_end_to_end(pytester: pytest.Pytester, toy_repo: Path) -> None:
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--kope-optimize",
        "--kope-agent",
        "tuner",
        "--kope-budget",
        "2",
        "--kope-no-commit",
        "--kope-report",
        str(toy_repo / "out.json"),
        timeout=600,
    )
    result.stdout.fnmatch_lines(["kope: toolchain toy: available: toy here", "*kope: results*"])
    assert result.ret == 0, result.stdout.str()[-3000:]
    data = json.loads((toy_repo / "out.json").read_text())
    assert data["availability"]["toy"] == {"available": True, "reason": "toy here"}
    (op,) = data["operators"]
    assert op["toolchain"] == "toy" and op["baseline_s"] > 0  # found by its suffix, built and timed
    assert [c["params"] for c in op["candidates"]] == [{"CHUNK": 4}]  # the tuner swept its space
    assert op["candidates"][0]["outcome"] in ("ok", "better")


# A whole toy agent: an AgentBase subclass (the declarations' defaults) and the hook; and an object
# that declares nothing, which the run refuses in one line naming what it lacks.
TOY_AGENT = """
from pytest_kope.agents.base import AgentBase
from pytest_kope.candidate import Candidate


class Once(AgentBase):
    name = "once"

    def __init__(self):
        self.gave = set()

    def propose(self, ctx, n):
        if ctx.operator.name in self.gave:
            return []
        self.gave.add(ctx.operator.name)
        c = ctx.baseline.candidate
        return [Candidate(c.source, c.filename, c.toolchain, {**c.params, "CHUNK": 4}, "chunk 4", self.name, c.hash)]


class Bare:
    name = "bare"

    def propose(self, ctx, n):
        return []


def pytest_kope_make_agent(name, config):
    return {"once": Once, "bare": Bare}[name]() if name in ("once", "bare") else None
"""


def test_a_toy_agent_is_one_class_and_one_hook(pytester: pytest.Pytester, toy_repo: Path) -> None:
    (toy_repo / "conftest.py").write_text(TOY_CONFTEST + TOY_AGENT)
    args = ["-p", "no:cacheprovider", "--kope-optimize", "--kope-budget", "2", "--kope-no-commit", *UNJAILED]
    result = pytester.runpytest_subprocess(
        *args, "--kope-agent", "once", "--kope-report", "out.json", timeout=600
    )
    assert result.ret == 0, result.stdout.str()[-3000:]
    (op,) = json.loads((toy_repo / "out.json").read_text())["operators"]
    assert [(c["params"], c["agent"]) for c in op["candidates"]] == [({"CHUNK": 4}, "once")]
    assert op["stopped"]["reason"] == "agent_done"
    bare = pytester.runpytest_subprocess(*args, "--kope-agent", "bare", timeout=600)
    assert bare.ret == 4
    bare.stderr.fnmatch_lines(
        ["*--kope-agent bare: Bare lacks *needs_jail*; subclass pytest_kope.agents.base.AgentBase*"]
    )
    assert "Traceback" not in bare.stderr.str() + bare.stdout.str()


def test_a_toy_guard_is_one_class_and_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    class NoNegativeOutputs:  # the toy guard: a kernel that writes a negative number is wrong
        needs_clean = True

        def before(self, call: guards.Call) -> None:
            pass

        def after(self, call: guards.Call) -> list[str]:
            outs = [v for _, a, v in call.arrays if a.role == "out"]
            return ["wrote a negative output"] if any((np.asarray(v) < 0).any() for v in outs) else []

    source = "// kope: kernel void scale(const float *x, float *y, int n)\n"
    source += (
        "void scale(const float *x, float *y, int n) { for (int i = 0; i < n; i++) y[i] = 2.0f * x[i]; }\n"
    )
    spec = parse_spec(source, "scale.c")
    kernel = guards.GuardedKernel(CToolchain().build(Candidate(source, "scale.c", "c"), spec, tmp_path))
    x = np.array([1.0, -1.0], dtype=np.float32)
    y = np.empty_like(x)
    kernel.scale(x, y, 2)  # the built-in guards find nothing wrong
    monkeypatch.setattr(guards, "GUARDS", [*guards.GUARDS, NoNegativeOutputs()])  # the one line
    with pytest.raises(GuardViolation, match=r"kernel scale\(\) wrote a negative output"):
        kernel.scale(x, y, 2)


def test_a_toy_report_format_is_one_function_and_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def csv(data: dict[str, Any]) -> str:  # the toy format
        return "name,speedup\n" + "".join(f"{o['name']},{o['speedup']}\n" for o in data["operators"])

    monkeypatch.setitem(report_formats.FORMATS, "report.csv", csv)  # the one line
    data = {"operators": [{"name": "scale", "speedup": 1.5}]}
    monkeypatch.setitem(report_formats.FORMATS, "report.md", lambda d: "# run\n")  # needs a whole run
    paths = report_formats.write(tmp_path, data)
    assert [p.name for p in paths] == ["report.json", "report.md", "report.csv"]
    assert (tmp_path / "report.csv").read_text() == "name,speedup\nscale,1.5\n"
    assert json.loads((tmp_path / "report.json").read_text()) == data
    assert report_formats.said(paths) == f"{paths[0]}, {paths[1]} and {paths[2]}"


def test_report_formats_are_what_a_run_writes() -> None:
    assert list(report_formats.FORMATS) == ["report.json", "report.md"]
