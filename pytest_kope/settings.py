"""Process-wide keys every floor needs (the run's seed, built kernels), and the one
reader of the optimize run's options and ini values (`Settings.from_config`).

They live here, at the bottom of the import order, so that the judging child and the builder never
import `plugin.py` (which would close an import circle through the workflow).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

import pytest

from .errors import ConfigError

SEED = pytest.StashKey[int]()
BUILT = pytest.StashKey[dict[str, Any]]()


EXECUTORS = ("local", "ray")  # where judging children may run (judge/controller/executors.py)

# Each setting's default, the one place it is written: `Settings`' fields, the reader below and the
# options' help texts (`options.py`) take it from here.
DEFAULTS: dict[str, Any] = {
    "kope_budget": 24,
    "kope_patience": 8,
    "kope_min_gain": 0.05,
    "kope_seeds": 2,
    "kope_timeout": 120.0,
    "kope_concurrency": 1,
    "kope_timing_seconds": 3.0,
    "kope_explore": 0.1,
}


def setting(config: pytest.Config, name: str, default: Any = None) -> Any:
    """The option `--kope-x`, else the ini value `kope_x`, else `default`, else `DEFAULTS`' (an
    empty value counts as unset)."""
    value = config.getoption(name, None)
    if value is None:
        try:
            value = config.getini(name)
        except ValueError:  # not an ini option
            value = None
    if value in (None, "", []):
        return DEFAULTS.get(name) if default is None else default
    return value


@dataclass(frozen=True)
class Settings:
    """An optimize run's options, read and checked once (`from_config`); the loop reads only these.

    The judge's `Plan` and every `JudgeRequest` carry this object whole, so a setting a judging child
    needs is a field here, its option in `options.py`, and the line that reads it in the child
    (`request.settings.x`). `Settings()` is a run with every default."""

    budget: int = DEFAULTS["kope_budget"]
    agent: str = "auto"
    min_gain: float = DEFAULTS["kope_min_gain"]  # the gain a winner must show (its 95% interval decides)
    fork_server: bool = True  # judge in children forked from warm servers, built once (launch.py)
    seeds: int = DEFAULTS["kope_seeds"]
    timeout: float = DEFAULTS["kope_timeout"]
    jobs: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    prefix: str = "kope/"
    no_commit: bool = False
    check_only: bool = False
    since: str | None = None
    patience: int = DEFAULTS["kope_patience"]
    minutes: float | None = None  # the whole run's time budget; None: unlimited
    allow_unjailed: bool = False
    db: str | None = None
    devices: str = ""
    report: str | None = None
    executor: str = "local"  # where judging children run: local or ray (judge/controller/executors.py)
    concurrency: int = DEFAULTS["kope_concurrency"]  # operators optimized at once (scheduler.py)
    ray_repo: str = "ship"  # how Ray workers get the operator repo: ship or shared
    jobs_given: bool = True  # --kope-jobs (or kope_jobs) was set; else an executor may choose
    operators: tuple[str, ...] = ()  # --kope-operator: only these operators; () for all collected
    no_wait: bool = False  # --kope-no-wait: refuse, not wait, when another run holds the repo
    timing_s: float = DEFAULTS["kope_timing_seconds"]  # the most one paired timing runs (child/bench.py)
    explore: float = DEFAULTS["kope_explore"]  # the least share of the tuner's proposals that explore
    # the benches' switches (no option): paired rounds stop once decided (else run to the cap), and a
    # fork server runs a perf test's body once for the children it forks
    sequential: bool = True
    record_inputs: bool = True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Settings:
        return cls(**{**data, "operators": tuple(data.get("operators") or ())})

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        minutes = setting(config, "kope_time_budget", None)
        s = cls(
            budget=int(setting(config, "kope_budget")),
            agent=str(setting(config, "kope_agent", "auto")),
            min_gain=float(setting(config, "kope_min_gain")),
            fork_server=setting(config, "kope_fork_server", True) not in (False, "false", "0", "no"),
            seeds=int(setting(config, "kope_seeds")),
            timeout=float(setting(config, "kope_timeout")),
            jobs=int(setting(config, "kope_jobs", len(os.sched_getaffinity(0)))),
            prefix=str(setting(config, "kope_branch_prefix", "kope/")),
            no_commit=bool(config.getoption("kope_no_commit")),
            check_only=bool(config.getoption("kope_check")),
            since=setting(config, "kope_since", None),
            patience=int(setting(config, "kope_patience")),
            minutes=float(minutes) if minutes is not None else None,
            allow_unjailed=bool(setting(config, "kope_allow_unjailed", False)),
            db=setting(config, "kope_db", None),
            devices=str(setting(config, "kope_devices", "")).strip(),
            report=config.getoption("kope_report", None),
            executor=str(setting(config, "kope_executor", "local")),
            concurrency=int(setting(config, "kope_concurrency")),
            ray_repo=str(setting(config, "kope_ray_repo", "ship")),
            jobs_given=setting(config, "kope_jobs", None) is not None,
            operators=tuple(config.getoption("kope_operator", None) or ()),
            no_wait=bool(config.getoption("kope_no_wait", False)),
            timing_s=float(setting(config, "kope_timing_seconds")),
            explore=_share(setting(config, "kope_explore"), "--kope-explore"),
        )
        if s.budget < 1:
            raise ConfigError(f"--kope-budget must be at least 1, got {s.budget}")
        if s.patience < 0:
            raise ConfigError(f"--kope-patience must be 0 (off) or more, got {s.patience}")
        if not 0.1 <= s.timing_s <= 600:
            raise ConfigError(f"--kope-timing-seconds takes 0.1 to 600 seconds, got {s.timing_s:g}")
        if s.minutes is not None and s.minutes < 0:
            raise ConfigError(f"--kope-time-budget takes minutes, 0 or more; got {s.minutes}")
        s.check_executor()
        s.device_indices()  # a bad --kope-devices is a usage error before anything runs
        return s

    def check_executor(self) -> None:
        """--kope-executor, --kope-concurrency and --kope-ray-repo name something that can work."""
        if self.executor not in EXECUTORS:
            raise ConfigError(
                f"--kope-executor {self.executor}: no such executor; choose one of {', '.join(EXECUTORS)}"
            )
        if self.concurrency < 1:
            raise ConfigError(f"--kope-concurrency must be at least 1, got {self.concurrency}")
        if self.ray_repo not in ("ship", "shared"):
            raise ConfigError(f"--kope-ray-repo takes ship or shared, got {self.ray_repo!r}")

    def device_indices(self) -> tuple[int, ...] | None:
        """--kope-devices 0,1 (or ini kope_devices) as indices; None when not given."""
        if not self.devices:
            return None
        try:
            return tuple(int(d) for d in self.devices.split(",") if d.strip())
        except ValueError:
            raise ConfigError(f"--kope-devices takes device indices like 0,1; got {self.devices!r}") from None


def _share(value: Any, option: str) -> float:
    """`value` as a share between 0 and 1, else a usage error naming `option`."""
    try:
        share = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{option} takes a share between 0 and 1, got {value!r}") from None
    if not 0.0 <= share <= 1.0:
        raise ConfigError(f"{option} takes a share between 0 and 1, got {share:g}")
    return share


FORGE_INI = ("kope_forge", "kope_forge_url", "kope_forge_repo", "kope_forge_token_env", "kope_pr_base")


@dataclass(frozen=True)
class ReviewSettings:
    """Where a run's winners go past their branches, read once (`from_config`): the remote to push
    to, whether to open pull requests and against which branch, the forge's ini values, the peers."""

    push: str | None = None  # --kope-push REMOTE; with --kope-pr alone, origin
    pr: bool = False  # --kope-pr
    pr_base: str = ""  # --kope-pr-base (or ini kope_pr_base); "": found from the remote (prbase.py)
    peers: bool = False  # --kope-peers: time the winner beside its kernel-only peers
    forge: dict[str, Any] = field(default_factory=dict)  # the forge's ini values (review/forge.py)

    @classmethod
    def from_config(cls, config: pytest.Config) -> ReviewSettings:
        pr = bool(setting(config, "kope_pr"))
        return cls(
            push=setting(config, "kope_push") or ("origin" if pr else None),
            pr=pr,
            pr_base=str(setting(config, "kope_pr_base", "")),
            peers=bool(setting(config, "kope_peers")),
            forge={k: setting(config, k) for k in FORGE_INI},
        )


@dataclass(frozen=True)
class LlmSettings:
    """The LLM agent's settings, read and checked once (`from_config`): which model, where its server
    is, and the limits on one request (a self-hosted server reads a long prompt for minutes and has a
    small context, so both are the user's to set)."""

    timeout: float = 300.0  # seconds one request may take, whole (--kope-llm-timeout)
    output: int = 8_192  # output tokens asked for at most, fitted to the context (--kope-llm-output)
    context: int | None = None  # the model's context in tokens; None: ask the server (--kope-llm-context)
    model: str = ""  # --kope-model, else $KOPE_MODEL; "": the agent's default
    max_tokens: int | None = None  # LLM tokens each operator may use (--kope-max-tokens); None: no limit
    openai_key_env: str = ""  # ini kope_openai_key_env: the variable that holds the key
    openai_base_url: str = ""  # ini kope_openai_base_url: a URL, or the variable that holds one

    @classmethod
    def from_config(cls, config: pytest.Config) -> LlmSettings:
        given = {name: setting(config, f"kope_llm_{name}", None) for name in ("timeout", "output", "context")}
        given["max_tokens"] = setting(config, "kope_max_tokens", None)
        try:
            s = cls(
                timeout=float(given["timeout"] or cls.timeout),
                output=int(given["output"] or cls.output),
                context=int(given["context"]) if given["context"] else None,
                model=str(setting(config, "kope_model") or os.environ.get("KOPE_MODEL") or ""),
                max_tokens=int(given["max_tokens"]) if given["max_tokens"] else None,
                openai_key_env=str(setting(config, "kope_openai_key_env", "")),
                openai_base_url=str(setting(config, "kope_openai_base_url", "")),
            )
        except (TypeError, ValueError):
            raise ConfigError(
                "--kope-llm-timeout takes seconds, --kope-llm-output, --kope-llm-context and --kope-max-tokens"
                f" whole numbers of tokens; got {', '.join(f'{k}={v!r}' for k, v in given.items() if v is not None)}"
            ) from None
        if s.timeout <= 0 or s.output < 64 or (s.context is not None and s.context < 512):
            raise ConfigError(
                f"--kope-llm-timeout must be over 0 s (got {s.timeout:g}), --kope-llm-output at least 64"
                f" tokens (got {s.output}), --kope-llm-context at least 512 (got {s.context})"
            )
        return s
