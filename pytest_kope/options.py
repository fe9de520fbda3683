"""The --kope-* command-line options and kope_* ini values, grouped by what they decide."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from .settings import DEFAULTS


def add_options(parser: pytest.Parser) -> None:
    """The --kope-* options and kope_* ini values."""
    g = parser.getgroup("kope", "kernel optimization (pytest-kope)")
    _search_options(g, parser)
    _agent_options(g, parser)
    _output_options(g, parser)
    _judge_options(g, parser)
    _executor_options(g, parser)
    _review_options(g, parser)
    _toolchain_options(g, parser)


def _option(
    group: Any, parser: pytest.Parser, name: str, help: str, ini_type: Any = "string", **kwargs: Any
) -> None:
    """A `--kope-x` option that, where `ini_type` is given, is also the ini option `kope_x`; `{default}`
    in its help is its default (`settings.DEFAULTS`)."""
    dest = name.replace("-", "_")
    help = help.format(default=DEFAULTS[dest]) if dest in DEFAULTS else help
    group.addoption(f"--{name}", dest=dest, help=help, **kwargs)
    if ini_type:
        parser.addini(dest, help=help.split(";")[0], type=ini_type, default=None)


def _search_options(g: Any, parser: pytest.Parser) -> None:
    """What to optimize, with which agent, and how long."""
    g.addoption(
        "--kope-optimize",
        action="store_true",
        dest="kope_optimize",
        help="optimize the kernels of the selected operators instead of only testing them",
    )
    g.addoption(
        "--kope-check",
        action="store_true",
        dest="kope_check",
        help="check the repo's kope operators without optimizing: toolchains, tests, fresh inputs, "
        "whether each committed kernel passes in a judging child, the isolation available",
    )
    _option(
        g,
        parser,
        "kope-budget",
        "most evaluations per operator (default {default})",
        type=int,
    )
    g.addoption(
        "--kope-operator",
        dest="kope_operator",
        action="append",
        default=[],
        metavar="NAME",
        help="only this operator (the `kope` marker's name); repeat for more",
    )
    _option(
        g,
        parser,
        "kope-patience",
        "stop an operator after N successive evaluations without a gain (default {default}; 0: never)",
        type=int,
    )
    _option(
        g,
        parser,
        "kope-explore",
        "least share of the tuner's proposals that ignore the experience graph and explore "
        "(default 0.1; the bandit may explore more)",
        type=float,
    )
    _option(
        g,
        parser,
        "kope-time-budget",
        "minutes the whole optimize run may take, shared among the operators (default: no limit)",
        type=float,
    )


def _agent_options(g: Any, parser: pytest.Parser) -> None:
    """Which agent proposes, with which model, endpoint and token budget."""
    _option(
        g,
        parser,
        "kope-agent",
        "who proposes candidates: auto (claude when ANTHROPIC_API_KEY is set, else "
        "tuner), tuner, claude[:MODEL], openai:MODEL (any OpenAI-compatible server), replay:DIR "
        "(default auto)",
    )
    _option(
        g,
        parser,
        "kope-model",
        "model for the claude or openai agent (default: $KOPE_MODEL or claude-sonnet-4-6)",
    )
    _option(
        g,
        parser,
        "kope-max-tokens",
        "LLM tokens (input, output and cached) each operator may use; the agent stops for that operator "
        "when they are spent (default: no limit)",
        type=int,
    )
    _option(
        g,
        parser,
        "kope-llm-timeout",
        "seconds one model request may take, whole (default 300); one that runs out is closed and "
        "retried, within --kope-time-budget",
        type=float,
    )
    _option(
        g,
        parser,
        "kope-llm-output",
        "output tokens a model request asks for at most (default 8192), fitted to what the prompt "
        "leaves of the model's context",
        type=int,
    )
    _option(
        g,
        parser,
        "kope-llm-context",
        "the model's context in tokens; prompts are built to fit it (default: asked of the server, "
        "else learned from its first context-length error)",
        type=int,
    )
    parser.addini(
        "kope_openai_base_url",
        "base URL of the OpenAI-compatible server for --kope-agent openai:MODEL, or the name of the "
        "variable that holds it (default: $OPENAI_BASE_URL)",
        default=None,
    )
    parser.addini(
        "kope_openai_key_env",
        "name of the environment variable holding the key for --kope-agent openai:MODEL "
        "(default OPENAI_API_KEY); never the key itself",
        default=None,
    )


def _output_options(g: Any, parser: pytest.Parser) -> None:
    """Where the experience, the winners and the report go."""
    _option(g, parser, "kope-db", "experience graph file (default <rootdir>/.kope/experience.db)")
    _option(g, parser, "kope-branch-prefix", "branch prefix for verified winners (default kope/)")
    g.addoption(
        "--kope-no-commit",
        action="store_true",
        dest="kope_no_commit",
        help="do not commit winners to git branches (report only)",
    )
    g.addoption(
        "--kope-no-wait",
        action="store_true",
        dest="kope_no_wait",
        help="when another optimize run holds this repo's .kope/, stop at once (exit status 4) "
        "instead of waiting for it to end",
    )
    _option(g, parser, "kope-report", "also write the run's JSON report to this path", ini_type=None)


def _judge_options(g: Any, parser: pytest.Parser) -> None:
    """How candidates are judged: seeds, gain, limits, isolation, workers, devices."""
    _option(
        g,
        parser,
        "kope-seed",
        "seed of the `rng` fixture (default: fresh each run, shown in the header)",
        ini_type=None,
        type=int,
    )
    for name, help, kind in (
        ("kope-seeds", "seeds each candidate's correctness tests run with (default {default})", int),
        ("kope-min-gain", "smallest speedup counted as a gain beyond noise (default {default})", float),
        ("kope-timeout", "seconds a candidate's test process may run (default {default:g})", float),
        (
            "kope-timing-seconds",
            "seconds one paired timing may run before its rounds stop, decided or not; more decides "
            "smaller gains on a noisy machine (default {default:g})",
            float,
        ),
    ):
        _option(g, parser, name, help, type=kind)
    _option(
        g,
        parser,
        "kope-allow-unjailed",
        "run candidates of agents other than the tuner (claude, replay:DIR, plugins) even where the "
        "bubblewrap jail does not work (default: refuse to start, see apt-get install bubblewrap)",
        ini_type="bool",
        action="store_true",
        default=None,
    )
    _option(g, parser, "kope-jobs", "parallel correctness workers (default: number of cores)", type=int)
    g.addoption(
        "--kope-fork-server",
        "--no-kope-fork-server",
        action=_Toggle,
        dest="kope_fork_server",
        default=None,
        help="judge in children forked from warm per-operator fork servers, each candidate built once "
        "(default); --no-kope-fork-server starts a fresh process per judgement, each building its own",
    )
    parser.addini(
        "kope_fork_server", type="bool", default=None, help="judge in forked children (default true)"
    )
    parser.addini(
        "kope_include",
        type="linelist",
        default=[],
        help="include directories (relative to the ini file) for every operator's kernel build, read-only",
    )
    parser.addini(
        "kope_plugins",
        type="linelist",
        default=[],
        help="pytest plugins (module names) that judging children load besides pytest-kope",
    )
    _option(
        g, parser, "kope-devices", "accelerator devices for performance judging, e.g. 0,1 (default: auto)"
    )


def _executor_options(g: Any, parser: pytest.Parser) -> None:
    """Where judging children run, and how many operators are optimized at once."""
    _option(
        g,
        parser,
        "kope-executor",
        "where judging children run: local (this machine, default) or ray (a Ray cluster: the one at "
        "$RAY_ADDRESS, else a local one; needs pip install 'pytest-kope[ray]')",
    )
    _option(
        g,
        parser,
        "kope-concurrency",
        "operators optimized at once, each with its own budget (default {default})",
        type=int,
    )
    _option(
        g,
        parser,
        "kope-ray-repo",
        "how Ray workers get the operator repo: ship (as the tasks' working dir, default) or shared "
        "(the same path on every node)",
    )


def _review_options(g: Any, parser: pytest.Parser) -> None:
    """Pushing winners and opening pull requests; which operators a CI run takes."""
    _option(
        g,
        parser,
        "kope-push",
        "push each new winner's branch to this git remote, with a lease on the tip it read, after "
        "fetching the remote's kope/* branches (default: no push)",
    )
    _option(
        g,
        parser,
        "kope-pr",
        "open (or update) one pull request per new winner on the forge: GitHub, GitHub Enterprise "
        "or GitLab; pushes to --kope-push or origin; token from GITHUB_TOKEN, GITLAB_TOKEN or "
        "the variable ini kope_forge_token_env names",
        ini_type="bool",
        action="store_true",
        default=None,
    )
    _option(
        g,
        parser,
        "kope-peers",
        "after verifying a winner, time it next to its kernel-only peers (torch eager with out=, "
        "torch.compile, numpy/OpenBLAS) and the measured roofline, in a jailed child, and put the "
        "headline in report.md and the pull request (informational; operators the peers know)",
        ini_type="bool",
        action="store_true",
        default=None,
    )
    _option(
        g,
        parser,
        "kope-since",
        "optimize only the operators whose kernel source or test modules changed since this git "
        "revision (plus any -k names)",
    )
    parser.addini("kope_forge", help="github or gitlab (default: gitlab under GitLab CI, else github)")
    parser.addini(
        "kope_forge_url", help="forge API URL (default: $GITHUB_API_URL, $CI_SERVER_URL, or from the remote)"
    )
    parser.addini(
        "kope_forge_repo", help="owner/name or GitLab project (default: $GITHUB_REPOSITORY, $CI_PROJECT_ID)"
    )
    parser.addini("kope_forge_token_env", help="name of the environment variable that holds the forge token")
    parser.addini(
        "kope_pr_base",
        help="branch pull requests target (default: the current branch's upstream, else the remote's default)",
    )


def _toolchain_options(g: Any, parser: pytest.Parser) -> None:
    """Which toolchain builds a suffix; how the C toolchain builds: what a library may import, and for
    which machines it is tuned."""
    g.addoption(
        "--kope-toolchain",
        dest="kope_toolchain",
        action="append",
        default=[],
        metavar="NAME",
        help="build every operator whose source suffix NAME builds with the toolchain NAME, unless its "
        "marker names one (e.g. triton-ascend for .py); repeat for more",
    )
    parser.addini(
        "kope_toolchain",
        type="args",
        default=[],
        help="toolchains that build the operators of their suffixes (as --kope-toolchain)",
    )
    parser.addini(
        "kope_allow_symbols",
        type="linelist",
        default=[],
        help="symbols (names or fnmatch globs) a built C/C++ kernel library may import besides the "
        "built-in allow-list (libm, memory/string libc, OpenMP, the C++ runtime)",
    )
    parser.addini(
        "kope_c_target_flags",
        type="args",
        default=[],
        help="compiler flags added after every C/C++ candidate's own, to tune for the machines the "
        "kernels will run on, e.g. -mno-avx512f (default: $KOPE_C_TARGET_FLAGS)",
    )


class _Toggle(argparse.Action):
    """`--x` sets True, `--no-x` sets False (argparse.BooleanOptionalAction, which pytest's parser lacks)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, not (option_string or "").startswith("--no-"))
