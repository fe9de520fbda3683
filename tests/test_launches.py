"""Launch discovery (`toolchains/launches.py`) with the real Triton interpreter installed here.

The Ascend lowering check sees what this module sees, so these run wherever any triton is installed
(community triton in CI, triton-ascend in its own venv): every launch of a kernel, plain or wrapped by
`heuristics` or `autotune` or reached through an alias, is described before the interpreter runs it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kope.toolchains import launches, pylaunch
from pytest_kope.toolchains.launches import Launch
from pytest_kope.toolchains.triton import TritonToolchain

TritonToolchain().prepare_process()  # the interpreter, before triton is imported
pytest.importorskip("triton")
torch = pytest.importorskip("torch")

SOURCE = """
import triton
import triton.language as tl


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, _twice(tl.load(x_ptr + offs, mask=mask)), mask=mask)


tuned = triton.heuristics({"BLOCK": lambda args: 64})(_double)
autotuned = triton.autotune(
    configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 128})],
    key=["n"],
    do_bench=lambda call, quantiles: (call(), [1.0, 1.0, 1.0])[1],
)(_double)
alias = _double


def plain(x, y, n):
    _double[(triton.cdiv(n, 32),)](x, y, n, BLOCK=32)


def heuristics(x, y, n):
    tuned[(triton.cdiv(n, 64),)](x, y, n)


def autotune(x, y, n):
    autotuned[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)


def aliased(x, y, n):
    alias[(1,)](x, y, n, BLOCK=128)
"""


class Stop(Exception):
    pass


@pytest.fixture
def module(tmp_path: Path):
    path = tmp_path / "doubling.py"
    path.write_text(SOURCE)
    assert launches.install()
    return pylaunch.load_module(path, "doubling.py")


@pytest.mark.parametrize(
    "launcher, block", [("plain", 32), ("heuristics", 64), ("autotune", 32), ("aliased", 128)]
)
def test_every_first_launch_is_seen_before_it_runs(module, launcher, block):
    seen: list[Launch] = []

    def stop(launch: Launch) -> None:
        seen.append(launch)
        raise Stop

    launches.watch(module.__name__, stop)
    x, y = torch.arange(100, dtype=torch.float32), torch.full((100,), float("nan"))
    with pytest.raises(Stop):
        getattr(module, launcher)(x, y, 100)
    assert [(s.kernel, dict(s.constants)) for s in seen] == [("_double", {"BLOCK": block})]
    assert seen[0].args == (("x_ptr", "*fp32", "16"), ("y_ptr", "*fp32", "16"), ("n", "i32", ""))
    assert torch.isnan(y).all()  # stopped before the interpreter ran a program


def test_autotune_launches_each_config_and_all_run(module):
    seen: list[Launch] = []
    launches.watch(module.__name__, seen.append)
    x, y = torch.arange(100, dtype=torch.float32), torch.empty(100)
    try:
        module.autotune(x, y, 100)
    except TypeError as e:  # triton-ascend 3.2's interpreter passes autotune's NPU options on to the kernel
        assert "unexpected keyword argument" in str(e)
        return
    assert torch.equal(y, x * 2)
    assert [dict(s.constants)["BLOCK"] for s in seen][:2] == [32, 128]  # each config benchmarked


def test_specialisation_and_options_as_triton_takes_them(module):
    seen: list[Launch] = []
    launches.watch(module.__name__, seen.append)
    x = torch.zeros(64)
    module._double[(1,)](x[1:], torch.zeros(64)[1:], 1, BLOCK=32, num_warps=4)  # 4-byte offset, n == 1
    module._double[(2,)](x, torch.zeros(64), 48, BLOCK=32)
    assert seen[0].args == (("x_ptr", "*fp32", ""), ("y_ptr", "*fp32", ""), ("n", "i32", "1"))
    assert ("num_warps", 4) in seen[0].options
    assert seen[1].args[2] == ("n", "i32", "16")
    assert seen[0].key() != seen[1].key()


def test_kernels_of_other_modules_go_to_the_launcher_being_called(module, tmp_path):
    other_path = tmp_path / "other.py"
    other_path.write_text(SOURCE)
    other = pylaunch.load_module(other_path, "other.py")  # no observer watches it
    seen: list[Launch] = []
    x, y = torch.arange(40, dtype=torch.float32), torch.empty(40)
    other.plain(x, y, 40)
    assert seen == []
    with launches.watching(seen.append):
        other.plain(x, y, 40)
    assert [(s.kernel, s.module) for s in seen] == [("_double", other.__name__)]
    assert seen[0].file == str(other_path)


def test_a_launch_travels_as_checked_json():
    launch = Launch(
        "_k", "m", (("x", "*fp32", "16"), ("n", "i32", "")), (("BLOCK", 64),), (("num_warps", 4),)
    )
    again = Launch.from_json(launch.to_json())
    assert again.key() == launch.key()
    for garbage in ({}, {"kernel": "k", "module": "m", "args": [[1]], "constants": [], "options": []}, None):
        with pytest.raises(ValueError, match="not a kernel launch"):
            Launch.from_json(garbage)
    bad = {**launch.to_json(), "constants": [["BLOCK", {"code": "x"}]]}
    with pytest.raises(ValueError):
        Launch.from_json(bad)
