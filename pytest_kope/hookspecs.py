"""Hooks that third-party plugins and conftest files implement to add toolchains and agents.

Built-ins answer the same hooks as ``trylast`` implementations, so yours wins when it returns a value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import pytest

    from .agents.base import Agent
    from .judge.outcome import Judged
    from .toolchains.base import Toolchain

hookspec = pluggy.HookspecMarker("pytest")


@hookspec(firstresult=True)
def pytest_kope_make_toolchain(name: str, config: pytest.Config) -> Toolchain | None:
    """Return the toolchain called `name`, or None to let another plugin answer.

    Example, in a conftest.py::

        def pytest_kope_make_toolchain(name, config):
            if name == "hip":
                return HipToolchain()

    .. versionadded:: 0.1
    """


@hookspec
def pytest_kope_toolchain_names(config: pytest.Config) -> list[str]:  # type: ignore[empty-body]
    """Return the names of the toolchains your plugin provides (listed in the availability report).

    Example, in a conftest.py::

        def pytest_kope_toolchain_names(config):
            return ["hip"]

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def pytest_kope_make_agent(name: str, config: pytest.Config) -> Agent | None:
    """Return the agent called `name` (`tuner`, `claude`, `replay:DIR`, ...), or None.

    Example, in a conftest.py::

        def pytest_kope_make_agent(name, config):
            if name == "random":
                return MyRandomAgent(seed=1)

    .. versionadded:: 0.1
    """


@hookspec
def pytest_kope_candidate_judged(operator: str, result: Judged, config: pytest.Config) -> None:
    """Called in the controlling process after each candidate is judged (`result` is a `Judged`).

    Example: stream results to a dashboard::

        def pytest_kope_candidate_judged(operator, result, config):
            print(operator, result.candidate.short, result.outcome)

    .. versionadded:: 0.1
    """


@hookspec
def pytest_kope_operator_done(operator: str, summary: dict[str, Any], config: pytest.Config) -> None:
    """Called after an operator's loop, verification and commit; `summary` is its report entry.

    Called once for every operator the report holds: also for one an interruption (Ctrl-C, SIGTERM)
    found unfinished or kept from starting, whose `summary["stopped"]["reason"]` is "interrupted".

    `summary` is a plain dict, the operator's entry in report.json (`OperatorSummary.to_json()`), not
    the typed object the run keeps: hooks written against it are users' code, so its shape is a
    contract; a copy, so changing it changes nothing in the report.

    Example: post the speedup to a chat channel::

        def pytest_kope_operator_done(operator, summary, config):
            notify(f"{operator}: {summary['speedup']:.2f}x")

    .. versionadded:: 0.1
    """
