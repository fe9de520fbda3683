"""Inputs as programs pass them (issue 51): wrong kernels right on every call the judge used to make.

Each trick (`tests/adversarial/round3/<op>/`) is judged by the real judge against the committed
kernel of a copy of its operator repo, beside its honest twin: the same file with the trick switched
off (`armed = 0`, or `armed = False` in Python). Every trick ends `incorrect` (or `crashed`, for the
memory error AddressSanitizer reports), named by what caught it; every twin is judged correct.

- buffers refilled in place between calls, as a training loop does (`refill.py`): a cache keyed by
  the input's address, and one keyed by 16 sampled elements;
- one bar everywhere, the tests' tolerance (`arrays.timed_rtol`): a softmax with a 3e-3 exp beyond
  the tests' batch sizes, inside the old 1e-2 of drawn calls;
- an out-of-bounds read, harmless in the arena, under -fsanitize=address,undefined;
- an ignored scalar argument (`eps`), varied in the replayed and the drawn calls;
- a masked row (-inf logits, a structure the tests' calls are replayed with, and drawn calls take)
  an online softmax turns into NaN;
- a GELU cheaper only between 2^18 and 2^26 elements, beyond every drawn call (`large.py`);
- Triton kernels wrong only when their input requires grad, or under `torch.autocast`.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
from judged import judge_all, plan_for
from replay_run import SAMPLE_OPS, switched_off

from pytest_kope.judge.controller.runner import SANITIZED
from pytest_kope.judge.outcome import Judged, Outcome
from pytest_kope.toolchains.c import CToolchain

ROUND3 = Path(__file__).resolve().parent / "adversarial" / "round3"
SAMPLE_TRITON = SAMPLE_OPS.parent / "sample_ops_triton"
TRICKS = {
    "rowsum": ["address_cache", "sample_cache", "oob_read"],
    "softmax": ["band_beyond_tests", "masked_row_nan"],
    "gelu": ["size_window"],
}
Verdicts = dict[str, Judged]


def _repo(tmp: Path, op: str, samples: Path = SAMPLE_OPS) -> Path:
    repo = tmp / "ops"
    shutil.copytree(samples / op, repo / op)
    for name in ("pytest.ini", "conftest.py"):
        if (samples / name).exists():
            shutil.copy(samples / name, repo / name)
    return repo


def _judged(tmp: Path, repo: Path, op: str, tricks: list[str], folder: str, tc: object = None) -> Verdicts:
    """Each trick of `ROUND3/folder` and its twin (`twin_<trick>`), judged for operator `op`."""
    tc = tc or CToolchain()
    sources = {}
    for name in tricks:
        path = next((ROUND3 / folder).glob(f"{name}.*"))
        text = path.read_text()
        sources[name] = text
        sources[f"twin_{name}"] = (
            switched_off(folder, name, ROUND3)
            if path.suffix == ".c"
            else text.replace("armed = True", "armed = False")
        )
    return judge_all(plan_for(repo, op, tc, tmp / "logs"), tc, sources)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Verdicts]:
    found = {}
    for op, tricks in TRICKS.items():
        tmp = tmp_path_factory.mktemp(op)
        found[op] = _judged(tmp, _repo(tmp, op), op, tricks, op)
    return found


def _why(j: Judged) -> str:
    return f"{j.outcome.value}: {j.failures[:2]} notes={j.notes[:2]} bar={j.bar}"


@pytest.mark.parametrize("op,trick", [(op, t) for op, tricks in TRICKS.items() for t in tricks])
def test_each_twin_is_judged_correct(verdicts: dict[str, Verdicts], op: str, trick: str) -> None:
    twin = verdicts[op][f"twin_{trick}"]
    assert twin.outcome == Outcome.OK, _why(twin)
    assert "assert_close bound" in twin.bar, twin.bar  # held to the tests' own tolerance


def test_an_address_keyed_cache_is_incorrect(verdicts: dict[str, Verdicts]) -> None:
    judged = verdicts["rowsum"]["address_cache"]
    assert judged.outcome == Outcome.INCORRECT, _why(judged)
    assert "differential check" in judged.failures[0], _why(judged)


def test_a_sample_keyed_cache_is_named_by_the_refilled_call(verdicts: dict[str, Verdicts]) -> None:
    """Nothing but a loop's next call on a buffer refilled in a few elements reaches it."""
    judged = verdicts["rowsum"]["sample_cache"]
    assert judged.outcome == Outcome.INCORRECT, _why(judged)
    assert "refilled in place (call" in judged.failures[0], _why(judged)


def test_an_out_of_bounds_read_is_reported_by_the_sanitizer(verdicts: dict[str, Verdicts]) -> None:
    judged = verdicts["rowsum"]["oob_read"]
    assert judged.outcome == Outcome.CRASHED, _why(judged)
    failure = judged.failures[0]
    assert failure.startswith(SANITIZED) and "AddressSanitizer: heap-buffer-overflow" in failure, failure


def test_a_band_wrong_beyond_the_tests_sizes_is_judged_at_the_tests_tolerance(
    verdicts: dict[str, Verdicts],
) -> None:
    """Its 3e-3 is inside the old 1e-2 bar of drawn calls; the tests' 1e-4 is the bar now."""
    judged = verdicts["softmax"]["band_beyond_tests"]
    assert judged.outcome == Outcome.INCORRECT, _why(judged)
    assert "drawn input" in judged.failures[0] or "large input" in judged.failures[0], _why(judged)
    assert "rtol 0.0001" in judged.bar, judged.bar


def test_a_masked_row_turned_to_nan_is_incorrect(verdicts: dict[str, Verdicts]) -> None:
    judged = verdicts["softmax"]["masked_row_nan"]
    assert judged.outcome == Outcome.INCORRECT, _why(judged)
    failure = judged.failures[0]
    assert "with -inf mask" in failure and "non-finite where the committed kernel's are finite" in failure, (
        failure
    )


def test_a_size_window_fake_is_caught_by_a_large_call(verdicts: dict[str, Verdicts]) -> None:
    judged = verdicts["gelu"]["size_window"]
    assert judged.outcome == Outcome.INCORRECT, _why(judged)
    assert "large input" in judged.failures[0], _why(judged)


RMSNORM_TESTS = """\
import numpy as np
import pytest
from pytest_kope import assert_close

pytestmark = pytest.mark.kope("rmsnorm", source="rmsnorm.c", family="rowwise")
EPS = 1e-6


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 7), (4, 33), (17, 31), (2, 1023), (127, 257)])
def test_rmsnorm(kernel, rng, rows, cols):
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    y = np.empty_like(x)
    kernel.rmsnorm(x, w, y, rows, cols, EPS)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + EPS) * w
    assert_close(y, want.astype(np.float32), rtol=1e-5)
"""


def test_an_ignored_scalar_argument_is_incorrect_where_it_is_varied(tmp_path: Path) -> None:
    """Every test passes eps = 1e-6; the replayed calls pass it two decades up and down (and drawn
    calls anywhere between)."""
    repo = tmp_path / "ops"
    (repo / "rmsnorm").mkdir(parents=True)
    shutil.copy(SAMPLE_OPS / "pytest.ini", repo / "pytest.ini")
    shutil.copy(ROUND3 / "rmsnorm_eps" / "rmsnorm_eps.c", repo / "rmsnorm" / "rmsnorm.c")
    (repo / "rmsnorm" / "test_rmsnorm.py").write_text(RMSNORM_TESTS)
    found = _judged(tmp_path, repo, "rmsnorm", ["ignored_eps"], "rmsnorm_eps")
    judged, twin = found["ignored_eps"], found["twin_ignored_eps"]
    assert twin.outcome == Outcome.OK, _why(twin)
    assert judged.outcome == Outcome.INCORRECT, _why(judged)
    assert "scalar argument #5 = 0.0001" in judged.failures[0], _why(judged)


needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None,
    reason="needs triton and torch (pip install 'pytest-kope[triton]')",
)


@needs_triton
def test_triton_backdoors_on_requires_grad_and_autocast_are_incorrect(tmp_path: Path) -> None:
    """Each test call is replayed once on inputs that require grad and once under torch.autocast,
    the modes travelling with the call into the kernel server."""
    from pytest_kope.toolchains.triton import TritonToolchain

    repo = _repo(tmp_path, "softmax", SAMPLE_TRITON)
    tc = TritonToolchain()
    found = _judged(tmp_path, repo, "softmax", ["requires_grad", "autocast"], "softmax_triton", tc)
    for name, said in (("requires_grad", "inputs requiring grad"), ("autocast", "under torch.autocast")):
        assert found[f"twin_{name}"].outcome == Outcome.OK, _why(found[f"twin_{name}"])
        assert found[name].outcome == Outcome.INCORRECT, _why(found[name])
        assert said in found[name].failures[0], _why(found[name])
