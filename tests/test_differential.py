"""The differential check, through real judging children: the committed kernel records its calls,
each candidate replays them, and the controller alone decides from the outputs.

Also for Python (Triton) candidates, which run in the interpreter on a CPU: whatever a candidate
does inside its own process, its outputs on inputs it never saw decide.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import threading
from pathlib import Path

import pytest

from pytest_kope.candidate import Candidate
from pytest_kope.judge.controller import sandbox
from pytest_kope.judge.controller.plan import Plan
from pytest_kope.judge.controller.runner import Judge
from pytest_kope.judge.outcome import Outcome
from pytest_kope.operator import Operator
from pytest_kope.toolchains import screening

C_KERNEL = """\
// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
#include <math.h>
void softmax(const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float *yr = y + (long)r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int c = 0; c < cols; c++) s += (yr[c] = expf(xr[c] - m));
        for (int c = 0; c < cols; c++) yr[c] /= s;
    }
}
"""
C_NO_MAX = C_KERNEL.replace("expf(xr[c] - m)", "expf(xr[c])")
C_DROPS_LAST_ROW_WHEN_BIG = C_KERNEL.replace(
    "for (int r = 0; r < rows; r++) {", "for (int r = 0; r < rows - (cols > 500); r++) {"
)

TESTS = """\
import numpy as np
import pytest
from pytest_kope import assert_close

pytestmark = pytest.mark.kope("softmax", source="{source}")


def reference(x):
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("rows,cols", [(2, 7), (3, 64)])
def test_fresh(kernel, rng, rows, cols):
    x = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    y = {empty}
    kernel.softmax({args})
    assert_close({out}, reference(x), rtol=1e-4)


def test_fixed_inputs(kernel):
    x = np.random.default_rng(0).standard_normal((4, 600)).astype(np.float32)
    y = {empty}
    kernel.softmax({args})
    assert_close({out}, reference(x), rtol=1e-4)
"""
IDS = [
    "test_softmax.py::test_fresh[2-7]",
    "test_softmax.py::test_fresh[3-64]",
    "test_softmax.py::test_fixed_inputs",
]


def _repo(tmp_path: Path, source: str, text: str, tests: str) -> Plan:
    (tmp_path / source).write_text(text)
    (tmp_path / "test_softmax.py").write_text(tests)
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    toolchain = "c" if source.endswith(".c") else "triton"
    op = Operator("softmax", tmp_path / source, toolchain, "rowwise")
    env = {"TRITON_INTERPRET": "1"} if toolchain == "triton" else {"OMP_WAIT_POLICY": "passive"}
    return Plan(
        operator=op,
        rootdir=tmp_path,
        inifile=tmp_path / "pytest.ini",
        files=[tmp_path / "test_softmax.py"],
        correctness=IDS,
        performance=[],
        toolchain_env=env,
        limits=sandbox.Limits(wall_s=120),
        jobs=2,
        keep=tmp_path / "logs",  # each child's log, for the failure messages
    )


def _c_plan(tmp_path: Path) -> Plan:
    tests = TESTS.format(source="softmax.c", empty="np.empty_like(x)", args="x, y, *x.shape", out="y")
    return _repo(tmp_path, "softmax.c", C_KERNEL, tests)


def _candidate(plan: Plan, text: str) -> Candidate:
    return Candidate(text, plan.operator.source.name, plan.operator.toolchain, idea="test", agent="replay")


def test_honest_candidate_passes_and_wrong_ones_are_named(tmp_path):
    plan = _c_plan(tmp_path)
    judge = Judge(plan, lambda c: [])
    try:
        base = judge.baseline(plan.operator.baseline())
        assert base.outcome == Outcome.OK, base.failures
        assert judge.recorded is not None and not (judge.recorded / "expected").exists()
        honest, no_max, tail = judge.correctness(
            [
                _candidate(plan, C_KERNEL + "\n"),
                _candidate(plan, C_NO_MAX),
                _candidate(plan, C_DROPS_LAST_ROW_WHEN_BIG),
            ]
        )
    finally:
        judge.close()
    assert honest.outcome == Outcome.OK, honest.failures
    assert no_max.outcome == Outcome.INCORRECT
    assert "scaled x1000" in no_max.failures[0] and "non-finite" in no_max.failures[0], no_max.failures
    # wrong only on the fixed-input test's shape: the tests catch it first, in the child
    assert tail.outcome == Outcome.INCORRECT, tail.failures


def test_counts_what_each_test_really_ran(tmp_path):
    """A test that makes its own inputs runs once per child whatever the seeds; it counts once."""
    plan = _c_plan(tmp_path).with_settings(seeds=3)
    judge = Judge(plan, lambda c: [])
    try:
        base = judge.baseline(plan.operator.baseline())
    finally:
        judge.close()
    assert base.outcome == Outcome.OK, base.failures
    assert sorted(base.tests_passed) == sorted(IDS)


RELU = """\
// kope: kernel void relu(const float *x, float *y, int n)
void relu(const float *x, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] = x[i] < 0 ? 0.0f : x[i];
}
"""
RELU_TESTS = """\
import numpy as np
import pytest
from pytest_kope import assert_close

pytestmark = pytest.mark.kope("relu", source="relu.c")


def test_one_negative_value(kernel):
    x = np.array([-8.0], dtype=np.float32)
    y = np.empty_like(x)
    kernel.relu(x, y, 1)
    assert_close(y, np.maximum(x, 0), rtol=1e-5, atol=1e-2)  # lenient: the differential must judge
"""


def test_an_all_zero_output_is_judged_at_the_inputs_resolution_not_as_exact(tmp_path):
    """Seen in a main job: one gelu of x = -8 is exactly 0 from the committed tanhf, and 2e-9 from an
    honest exp-based candidate; with no floor, half of gelu's space was rejected for it. An error
    below the float resolution of the call's largest input is rounding; one above it is still named."""
    (tmp_path / "relu.c").write_text(RELU)
    (tmp_path / "test_relu.py").write_text(RELU_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    op = Operator("relu", tmp_path / "relu.c", "c", "elementwise")
    ids = ["test_relu.py::test_one_negative_value"]
    env = {"OMP_WAIT_POLICY": "passive"}
    plan = Plan(
        operator=op,
        rootdir=tmp_path,
        inifile=tmp_path / "pytest.ini",
        files=[tmp_path / "test_relu.py"],
        correctness=ids,
        performance=[],
        toolchain_env=env,
    )
    judge = Judge(plan, lambda c: [])
    try:
        assert judge.baseline(plan.operator.baseline()).outcome == Outcome.OK
        rounding, leaky = judge.correctness(
            [
                _candidate(plan, RELU.replace("? 0.0f : x[i]", "? x[i] * 1e-9f : x[i]")),
                _candidate(plan, RELU.replace("? 0.0f : x[i]", "? x[i] * 1e-3f : x[i]")),
            ]
        )
    finally:
        judge.close()
    assert rounding.outcome == Outcome.OK, rounding.failures
    assert leaky.outcome == Outcome.INCORRECT and "differential" in leaky.failures[0], leaky.failures


TRITON_KERNEL = """\
# kope: kernel softmax(x: in, y: out, rows, cols)
import triton
import triton.language as tl


@triton.jit
def _row(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * cols + offs, e / tl.sum(e, 0), mask=mask)


def softmax(x, y, rows, cols):
    _row[(rows,)](x, y, cols, BLOCK=triton.next_power_of_2(cols))
"""
TRITON_NO_MAX = TRITON_KERNEL.replace("tl.exp(x - tl.max(x, 0))", "tl.exp(x)")

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None,
    reason="needs triton and torch (pip install 'pytest-kope[triton]')",
)


@needs_triton
def test_python_candidate_is_judged_by_its_outputs_outside_its_process(tmp_path):
    tests = TESTS.format(
        source="softmax.py",
        empty="np.empty_like(x)",
        args="*_t(x, y), *x.shape",
        out="y",
    ).replace(
        "from pytest_kope import assert_close\n",
        "from pytest_kope import assert_close\nimport torch\n\n\ndef _t(x, y):\n"
        "    tx, ty = torch.from_numpy(x), torch.from_numpy(y)\n"
        "    return tx, ty\n",
    )
    plan = _repo(tmp_path, "softmax.py", TRITON_KERNEL, tests).with_settings(seeds=1)
    judge = Judge(plan, lambda c: screening.screen_python_source(c.source, c.filename))
    try:
        base = judge.baseline(plan.operator.baseline())
        assert base.outcome == Outcome.OK, base.failures
        (wrong,) = judge.correctness([_candidate(plan, TRITON_NO_MAX)])
    finally:
        judge.close()
    assert wrong.outcome == Outcome.INCORRECT
    # exp overflows to inf, inf/inf is NaN: the torch guard reads NaN as an unwritten element
    assert "differential check" in wrong.failures[0], wrong.failures
    assert "scaled x1000" in wrong.failures[0] and "unwritten" in wrong.failures[0], wrong.failures


@pytest.mark.parametrize(
    "patch",
    [
        "import typing\ntyping.sys.modules['pytest_kope'].assert_close = lambda *a, **k: None\n",
        "import torch\ntorch.testing.assert_close = lambda *a, **k: None\n",
        "import numpy\nnumpy.testing.assert_allclose = lambda *a, **k: None\n",
        "import torch\ntorch.allclose = lambda *a, **k: True\n",
        "import torch\ntorch.sys.modules['pytest_kope.judge.child.guards'].GUARDS.clear()\n",
        "import triton\ntriton.__builtins__['__import__']('time').perf_counter = lambda: 0.0\n",
        "import numpy as np\nnp.os.environ.clear()\n",
    ],
    ids=["assert_close", "torch.testing", "numpy.testing", "torch.allclose", "guard", "timer", "np.os"],
)
def test_python_candidates_cannot_patch_the_oracle(patch):
    """Refused before anything runs; were one to pass the screen, the differential check above decides."""
    reasons = screening.screen_python_source(patch + TRITON_NO_MAX, "softmax.py")
    assert reasons, patch


FLAKY_TEST = """

def test_too_tight_for_some_inputs(kernel, rng, kope_seed):
    x = rng.standard_normal((2, 9)).astype(np.float32)
    y = np.empty_like(x)
    kernel.softmax(x, y, 2, 9)
    assert kope_seed % 1000 != 13, "this seed's inputs break the test's own tolerance"
"""


class ScriptedSeeds(Judge):
    """The real judge, drawing its seeds from a script instead of the system's random source."""

    def __init__(self, plan: Plan, script: list[list[int]]):
        super().__init__(plan, lambda c: [])
        self.script = script

    def _draw_seeds(self) -> list[int]:
        return self.script.pop(0)


def test_a_flaky_test_is_the_tests_fault_not_the_candidates(tmp_path):
    tests = TESTS.format(source="softmax.c", empty="np.empty_like(x)", args="x, y, *x.shape", out="y")
    plan = _repo(tmp_path, "softmax.c", C_KERNEL, tests + FLAKY_TEST)
    plan = dataclasses.replace(plan, correctness=[*IDS, "test_softmax.py::test_too_tight_for_some_inputs"])
    # the committed kernel: first on a seed that breaks the test (retried), then the candidate on one
    judge = ScriptedSeeds(plan, [[2013, 4], [5, 6], [1013, 8]])
    try:
        base = judge.baseline(plan.operator.baseline())
        assert base.outcome == Outcome.OK, base.failures
        (honest,) = judge.correctness([_candidate(plan, C_KERNEL + "\n")])
    finally:
        judge.close()
    assert any("--kope-seed 2013" in n for n in base.notes), base.notes
    assert honest.outcome == Outcome.OK, honest.failures
    assert honest.notes == [
        "flaky test: test_softmax.py::test_too_tight_for_some_inputs fails the committed kernel too with "
        "--kope-seed 1013; fix its tolerance"
    ]


def _scale_functions(late: bool, threads: list[threading.Thread]):
    """A `scale` kernel in Python; `late`: right when it returns, then a thread (which holds the
    buffers, so they outlive it) adds 1 to the output 0.2 ms later."""
    import time

    import numpy as np

    from pytest_kope.judge.child.guards import GuardedFunction, replay_guards
    from pytest_kope.toolchains.base import Arg, KernelFunction

    def raw(x, y, n):
        np.multiply(x, 2, out=y)

        def add_one_later():
            time.sleep(2e-4)
            np.add(y, 1, out=y)

        if late:
            threads.append(threading.Thread(target=add_one_later))
            threads[-1].start()

    fn = KernelFunction("scale", raw, (Arg("x", "in"), Arg("y", "out"), Arg("n", "scalar")))
    return GuardedFunction(fn), {"scale": GuardedFunction(fn, replay_guards())}


def test_the_replay_checks_settling_once_for_all_its_calls(tmp_path):
    """The replay waits once for all its calls, not once a call: an output a thread still rewrites
    after the call returned is named, and an honest candidate's outputs are all written."""
    import numpy as np

    from pytest_kope.judge.child import differential, refill

    threads: list[threading.Thread] = []
    honest, honest_replay = _scale_functions(False, threads)
    _, late_replay = _scale_functions(True, threads)
    recorder = honest.run.switches.recorder = differential.Recorder()
    try:
        for n in (7, 1000):
            honest(np.arange(n, dtype=np.float32), np.empty(n, dtype=np.float32), n)
    finally:
        honest.run.switches.recorder = None
    # each call as tested, transformed, and as a loop on refilled buffers (`refill.py`)
    per_call = len(differential.TRANSFORMS) + refill.STEPS
    assert recorder.write(tmp_path / "recorded") == 2 * per_call
    assert differential.replay(tmp_path / "recorded", honest_replay, tmp_path / "honest") == []
    runs = per_call - 1 + differential.RACE_REPEATS
    index = json.loads((tmp_path / "honest" / "outputs.json").read_text())  # an entry a run
    assert len(index) == 2 * runs
    problems = differential.replay(tmp_path / "recorded", late_replay, tmp_path / "late")
    for t in threads:
        t.join()
    assert any("changed after the call returned" in p for p in problems), problems


RACY = """\
#include <math.h>
static float scratch[1 << 14];  /* one buffer for every call: calls at once overwrite each other's */
void softmax(const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int c = 0; c < cols; c++) s += (scratch[c] = expf(xr[c] - m));
        for (int c = 0; c < cols; c++) y[(long)r * cols + c] = scratch[c] / s;
    }
}
"""


def _softmax_functions(tmp_path: Path, text: str):
    """A C softmax built with gcc and wrapped as the judge wraps a kernel: (recording, replaying)."""
    import ctypes
    import subprocess

    import numpy as np

    from pytest_kope.judge.child.guards import GuardedFunction, replay_guards
    from pytest_kope.toolchains.base import Arg, KernelFunction

    (tmp_path / "k.c").write_text(text)
    lib = tmp_path / f"k{len(list(tmp_path.glob('*.so')))}.so"
    subprocess.run(
        ["gcc", "-O2", "-shared", "-fPIC", str(tmp_path / "k.c"), "-o", str(lib), "-lm"], check=True
    )
    raw = ctypes.CDLL(str(lib)).softmax
    ptr = np.ctypeslib.ndpointer(np.float32, flags="C")
    raw.argtypes, raw.restype = [ptr, ptr, ctypes.c_int, ctypes.c_int], None
    args = (Arg("x", "in"), Arg("y", "out"), Arg("rows", "scalar"), Arg("cols", "scalar"))
    fn = KernelFunction("softmax", raw, args)
    return GuardedFunction(fn), {"softmax": GuardedFunction(fn, replay_guards())}


def test_calls_released_together_expose_state_shared_between_calls(tmp_path):
    """A kernel right alone but sharing a static buffer between calls is named by the pairs the replay
    starts at once; the honest kernel never is. Overlap is up to the machine, so the racy kernel gets
    a few replays: a pair that overlaps at all shows the race (ten rows of 4000 take ~0.1 ms a call)."""
    import numpy as np

    from pytest_kope.judge.child import differential

    honest, honest_replay = _softmax_functions(tmp_path, C_KERNEL)
    _, racy_replay = _softmax_functions(tmp_path, RACY)
    recorder = honest.run.switches.recorder = differential.Recorder()
    try:
        x = np.random.default_rng(0).standard_normal((10, 4000)).astype(np.float32)
        honest(x, np.empty_like(x), 10, 4000)
    finally:
        honest.run.switches.recorder = None
    recorder.write(tmp_path / "recorded")
    for k in range(3):
        assert differential.replay(tmp_path / "recorded", honest_replay, tmp_path / f"honest{k}") == []
    found = [differential.replay(tmp_path / "recorded", racy_replay, tmp_path / f"racy{k}") for k in range(5)]
    assert any(found), found
    named = [p for problems in found for p in problems]
    assert all("two threads at once" in p or "differs" in p for p in named), named


ADDRESS_CACHE = C_KERNEL.replace(
    "void softmax(const float *x, float *y, int rows, int cols) {\n",
    """static const float *seen;
static float kept[1 << 16];
void softmax(const float *x, float *y, int rows, int cols) {
    if (x == seen) { for (long i = 0; i < (long)rows * cols; i++) y[i] = kept[i]; return; }
    seen = x;
    softmax_rows(x, y, rows, cols);
    for (long i = 0; i < (long)rows * cols; i++) kept[i] = y[i];
}
static void softmax_rows(const float *x, float *y, int rows, int cols) {
""",
).replace(
    "#include <math.h>\n", "#include <math.h>\nstatic void softmax_rows(const float *, float *, int, int);\n"
)


def test_a_loop_on_refilled_buffers_names_a_cache_kept_by_address(tmp_path):
    """In this process, where every replayed call gets buffers of its own, a cache by the input's
    address is found by the loop alone: the same buffers refilled in place, whatever addresses the
    other calls happen to get."""
    import numpy as np

    from pytest_kope.judge.child import differential, refill

    honest, _ = _softmax_functions(tmp_path, C_KERNEL)
    _, cached_replay = _softmax_functions(tmp_path, ADDRESS_CACHE)
    recorder = honest.run.switches.recorder = differential.Recorder()
    try:
        x = np.random.default_rng(0).standard_normal((8, 300)).astype(np.float32)
        honest(x, np.empty_like(x), 8, 300)
    finally:
        honest.run.switches.recorder = None
    recorder.write(tmp_path / "recorded")
    manifest = json.loads((tmp_path / "recorded" / "manifest.json").read_text())
    loop = [e for e in manifest if "refill" in e]
    assert [e["refill"] for e in loop] == list(range(refill.STEPS)), loop
    expected = differential.take_expected(tmp_path / "recorded")
    # races off: the cache is not thread-safe either, and two threads at once may name it first
    assert differential.replay(tmp_path / "recorded", cached_replay, tmp_path / "out", races=False) == []
    found = differential.compare(manifest, expected, tmp_path / "out", 1e-4)
    assert found and "refilled in place (call 2 of 4" in found[0], found


def test_a_loop_refills_every_element_then_a_few_then_one():
    import numpy as np

    from pytest_kope.judge.child import refill

    x = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    w = np.random.default_rng(2).standard_normal(64).astype(np.float32)
    steps = list(refill.steps({0: x, 1: w}, which=1))
    assert [what for what, _ in steps][0] == "as tested" and len(steps) == refill.STEPS
    (_, tested), (_, every), (_, few), (_, one) = steps
    assert np.array_equal(tested[0], x) and np.count_nonzero(every[0] != x) > 0.99 * x.size
    assert (
        np.count_nonzero(few[0] != every[0]) <= refill.FEW
        and np.count_nonzero(few[1] != every[1]) <= refill.FEW
    )
    assert np.array_equal(one[0], few[0]) and np.count_nonzero(one[1] != few[1]) == 1
    lo, hi = float(x.min()), float(x.max())
    assert set(few[0][few[0] != every[0]].tolist()) <= {lo, hi}  # the far end of the input's own range
