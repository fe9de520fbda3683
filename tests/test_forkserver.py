"""The fast judge: fork servers, the build-once cache and sequential timing, through real children.

The isolation a fresh jailed child had must hold per candidate when children fork from one warm
server: nothing a candidate starts outlives its judgement, the server's memory and the build cache
are out of its reach, and a candidate that kills its server only gets judged again, afresh.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from pytest_kope.candidate import Candidate
from pytest_kope.judge.controller import sandbox
from pytest_kope.judge.controller.buildcache import BuildCache
from pytest_kope.judge.controller.plan import Plan
from pytest_kope.judge.controller.runner import Judge
from pytest_kope.judge.measure import rotation as rotation_module
from pytest_kope.judge.measure import timing
from pytest_kope.judge.outcome import Outcome
from pytest_kope.operator import Operator

JAIL, JAIL_WHY = sandbox.bubblewrap()
needs_jail = pytest.mark.skipif(JAIL is None, reason=f"no bubblewrap jail here: {JAIL_WHY}")

KERNEL = """\
// kope: kernel void scale(const float *x, float *y, int n)
{prelude}
void scale(const float *x, float *y, int n) {{
{body}
    for (int i = 0; i < n; i++) y[i] = 2.0f * x[i];
{after}
}}
"""

TESTS = """\
import numpy as np
import pytest
from pytest_kope import assert_close

pytestmark = pytest.mark.kope("scale", source="scale.c")


@pytest.mark.parametrize("n", [3, 1000])
def test_scale(kernel, rng, n):
    x = rng.standard_normal(n).astype(np.float32)
    y = np.empty_like(x)
    kernel.scale(x, y, n)
    assert_close(y, 2 * x, rtol=1e-6)


def test_scale_perf(kernel, rng, kope_bench):
    x = rng.standard_normal(1 << 16).astype(np.float32)
    y = np.empty_like(x)
    kope_bench(kernel.scale, x, y, x.size)
"""

# Leaves a process behind (own session, named kope-stray), once per process.
STRAY = KERNEL.format(
    prelude="#include <unistd.h>\n#include <sys/prctl.h>\nstatic int started;",
    body="    if (!started) { started = 1; if (fork() == 0) { setsid(); "
    'prctl(PR_SET_NAME, "kope-stray"); for (;;) pause(); } }',
    after="",
)

# Writes a wrong y[0] naming the first thing it could reach that it must not (see its stderr).
PROBE = KERNEL.format(
    prelude="""\
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static int reach(void) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    char path[300], name[64];
    while (d && (e = readdir(d))) {
        snprintf(path, sizeof path, "/proc/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (f && fgets(name, sizeof name, f) && strncmp(name, "kope-stray", 10) == 0) {
            fprintf(stderr, "kope-probe: an earlier candidate's process is alive\\n");
            return 1;
        }
        if (f) fclose(f);
    }
    if (d) closedir(d);
    snprintf(path, sizeof path, "/proc/%d/mem", (int)getppid());
    int fd = open(path, O_RDONLY);
    if (fd >= 0) { fprintf(stderr, "kope-probe: the server's memory is open\\n"); return 2; }
    snprintf(path, sizeof path, "/proc/%d/environ", (int)getppid());
    fd = open(path, O_RDONLY);
    if (fd >= 0) { fprintf(stderr, "kope-probe: the server's environment is open\\n"); return 3; }
    const char *cache = getenv("KOPE_BUILD_CACHE");
    if (cache && access(cache, W_OK) == 0) { fprintf(stderr, "kope-probe: the cache is writable\\n"); return 4; }
    return 0;
}""",
    body="    int bad = reach();",
    after="    if (bad) y[0] = 1000.0f + bad;",
)

# Kills its own parent: the test host, or (in its jail) pid 0, its own process group.
PARRICIDE = KERNEL.format(
    prelude="#include <signal.h>\n#include <unistd.h>\nstatic int done;",
    body="    if (!done) { done = 1; kill(getppid(), SIGKILL); }",
    after="",
)


def _plan(tmp_path: Path, jobs: int = 1, tests: str = TESTS) -> Plan:
    (tmp_path / "scale.c").write_text(KERNEL.format(prelude="", body="", after=""))
    (tmp_path / "test_scale.py").write_text(tests)
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    op = Operator("scale", tmp_path / "scale.c", "c", "elementwise")
    # the library screen would refuse fork/open/kill: switched off to test the next layers
    env = {"OMP_WAIT_POLICY": "passive", "KOPE_C_SCREEN_BINARY": "0"}
    ids = ["test_scale.py::test_scale[3]", "test_scale.py::test_scale[1000]"]
    plan = Plan(
        operator=op,
        rootdir=tmp_path,
        inifile=tmp_path / "pytest.ini",
        files=[tmp_path / "test_scale.py"],
        correctness=ids,
        performance=[],
        toolchain_env=env,
    )
    return dataclasses.replace(
        plan, performance=["test_scale.py::test_scale_perf"], jobs=jobs, keep=tmp_path / "kept"
    )


def _candidate(plan: Plan, text: str) -> Candidate:
    return Candidate(text, "scale.c", "c", idea="test", agent="replay")


@needs_jail
def test_one_candidate_cannot_reach_the_next_or_the_server(tmp_path):
    plan = _plan(tmp_path)
    judge = Judge(plan, lambda c: [])
    try:
        assert judge.baseline(plan.operator.baseline()).outcome == Outcome.OK
        (stray,) = judge.correctness([_candidate(plan, STRAY)])
        (probe,) = judge.correctness([_candidate(plan, PROBE)])
        assert judge.launcher.pool is not None and len(judge.launcher.pool.servers) == 1
    finally:
        judge.close()
    assert stray.outcome == Outcome.CRASHED, stray.failures  # no new process: the filter kills its server
    assert "forbids" in stray.failures[0], stray.failures
    assert plan.keep is not None
    log = (plan.keep / probe.candidate.short / "correctness.log").read_text()
    assert probe.outcome == Outcome.OK, (probe.failures, log[-2000:])
    assert "kope-probe" not in log


def test_a_candidate_that_signals_its_parent_is_killed_by_the_filter_and_harms_no_one(tmp_path):
    """Its kernel server may signal no process but itself (seccomp): the kill ends the server, the
    candidate crashed by its own doing, and the fork server judges the next one as if nothing was."""
    plan = _plan(tmp_path)
    judge = Judge(plan, lambda c: [])
    try:
        judge.baseline(plan.operator.baseline())
        (killer,) = judge.correctness([_candidate(plan, PARRICIDE)])
        (after,) = judge.correctness([_candidate(plan, KERNEL.format(prelude="", body="", after="") + "\n")])
    finally:
        judge.close()
    assert killer.outcome == Outcome.CRASHED and "SIGSYS" in killer.failures[0], killer.failures
    assert not any("fresh process" in n for n in judge.notes), judge.notes  # no server died
    assert after.outcome == Outcome.OK, after.failures


def test_each_candidate_is_built_once_and_the_cache_is_read_only_to_children(tmp_path):
    plan = _plan(tmp_path, jobs=2)
    judge = Judge(plan, lambda c: [])
    twin = _candidate(plan, KERNEL.format(prelude="", body="", after="") + "\n")
    try:
        base = judge.baseline(plan.operator.baseline())
        judged = judge.correctness([twin])[0]
        judge.performance(judged, base.candidate)
        judge.correctness([twin])
        cache = judge.launcher.cache
        assert cache is not None
        assert cache.builds == 2, cache.builds  # the committed kernel and the twin, once each
        assert set(cache.keys) == {base.candidate.hash, twin.hash}
    finally:
        judge.close()
    assert judged.outcome == Outcome.OK and judged.timings, judged.failures
    assert judged.phases["build"] > 0 and judged.phases["start"] < judged.seconds


def test_the_tests_own_code_is_told_apart_from_the_kernel_and_the_judge(tmp_path):
    """`tests`: what correctness test bodies spent outside guarded kernel calls (the bench's split)."""
    plan = _plan(
        tmp_path,
        tests=TESTS.replace(
            "    kernel.scale(x, y, n)\n", "    time.sleep(0.05)\n    kernel.scale(x, y, n)\n"
        ).replace("import numpy", "import time\nimport numpy"),
    )
    plan = plan.with_settings(seeds=2)  # 2 tests x 2 seeds: 4 bodies of 50 ms, each calling a 300 ms kernel
    judge = Judge(plan, lambda c: [])
    slow = _candidate(
        plan, KERNEL.format(prelude="#include <unistd.h>", body="    usleep(300000);", after="")
    )
    try:
        assert judge.baseline(plan.operator.baseline()).outcome == Outcome.OK
        (judged,) = judge.correctness([slow])
    finally:
        judge.close()
    assert judged.outcome == Outcome.OK, judged.failures
    # the sleeps, and not the kernel's 1.2 s or more (more: the guards' own calls): the two phases are
    # compared with each other, not with a clock a loaded machine stretches
    assert judged.phases["tests"] >= 0.2, judged.phases
    assert judged.phases["correctness"] >= 1.2, judged.phases  # the guarded calls are the judge's
    assert judged.phases["tests"] < judged.phases["correctness"] / 2, judged.phases


def test_a_build_failure_is_remembered_not_rebuilt(tmp_path):
    plan = _plan(tmp_path)
    judge = Judge(plan, lambda c: [])
    broken = _candidate(plan, KERNEL.format(prelude="", body="    this is not C;", after=""))
    try:
        judge.baseline(plan.operator.baseline())
        first, again = judge.correctness([broken]), judge.correctness([broken])
        cache = judge.launcher.cache
        assert cache is not None
        builds = cache.builds
    finally:
        judge.close()
    assert first[0].outcome == again[0].outcome == Outcome.COMPILE_FAILED
    assert "error" in first[0].failures[0] and builds == 2  # the committed kernel, the broken one


def test_the_cache_adopts_only_the_key_the_server_named(tmp_path):
    cache = BuildCache("t")
    try:
        work = tmp_path / "w"
        (work / "builds" / "theirs").mkdir(parents=True)
        (work / "builds" / "theirs" / "kernel.so").write_bytes(b"planted")
        assert not cache.adopt("abc", work, "mine")
        assert not (cache.root / "theirs").exists() and "abc" not in cache.keys
        (work / "builds" / "mine").mkdir()
        assert cache.adopt("abc", work, "mine") and (cache.root / "mine").is_dir()
    finally:
        cache.close()


def test_the_old_path_still_judges(tmp_path):
    plan = _plan(tmp_path).with_settings(fork_server=False)
    judge = Judge(plan, lambda c: [])
    try:
        base = judge.baseline(plan.operator.baseline())
        judged = judge.correctness([_candidate(plan, KERNEL.format(prelude="", body="", after="") + "\n")])
    finally:
        judge.close()
    assert base.outcome == judged[0].outcome == Outcome.OK
    assert judge.launcher.pool is None


def _double(x, y):
    np.multiply(x, 2, out=y)


class FakeClock:
    """Time that passes only in kernel calls: 1 ms a reference call, 4 ms a candidate call."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def kernel(self, cost: float):
        def call(x, y):
            self.now += cost
            np.multiply(x, 2, out=y)

        return call


def test_paired_timing_stops_once_the_bound_decides():
    clock = FakeClock()
    x = np.random.default_rng(0).standard_normal(1 << 12).astype(np.float32)

    def timed(reference_s: float, candidate_s: float) -> timing.Paired:
        return timing.measure_paired(
            timing.KernelPair(clock.kernel(reference_s), clock.kernel(candidate_s)),
            timing.CallArgs((x, np.empty_like(x)), ["in", "out"]),
            timing.Clock(clock, lambda: None),
            timing.PAIRED,
            stop=timing.decided(0.05),
        )

    paired = timed(1e-3, 4e-3)
    assert paired.ratio.rounds == timing.PAIRED.first_look == 4, paired.ratio  # 4x slower: the first look
    assert paired.ratio.median == pytest.approx(0.25)
    faster = timed(4e-3, 1e-3)
    assert faster.ratio.rounds == timing.PAIRED.min_rounds == 6, faster.ratio  # a win needs the 95% bound
    unstopped = timing.measure_paired(
        timing.KernelPair(clock.kernel(1e-3), clock.kernel(4e-3)),
        timing.CallArgs((x, np.empty_like(x))),
        timing.Clock(clock, lambda: None),
        timing.PAIRED,
    )
    assert unstopped.ratio.rounds > paired.ratio.rounds  # without the rule: to the cap


def test_a_first_call_that_compiled_does_not_make_a_fast_kernel_one_call_a_round():
    """A JIT kernel's first call compiles (a cold Triton reference: about a second); timed one call
    a round, device sync included, it loses to a warm candidate it equals (seen on an H200: 2.4x)."""
    clock = FakeClock()
    x = np.random.default_rng(0).standard_normal(1 << 12).astype(np.float32)
    compiled: list[int] = []

    def cold(x, y):
        clock.now += 40e-6 if compiled else 1.0
        compiled.append(1)
        np.multiply(x, 2, out=y)

    def sync() -> None:  # waiting for the device: a round trip, paid once a round
        clock.now += 40e-6

    paired = timing.measure_paired(
        timing.KernelPair(cold, clock.kernel(40e-6)),
        timing.CallArgs((x, np.empty_like(x)), ["in", "out"]),
        timing.Clock(clock, sync),
        timing.PAIRED,
    )
    assert paired.reference.iterations == paired.candidate.iterations > 1
    assert paired.ratio.median == pytest.approx(1.0)


def test_the_stop_rule_is_the_verdicts_rule():
    stop = timing.decided(0.05)
    assert stop([1.0] * 4, [1.01] * 4)  # four rounds, slower in each: not better, already
    assert not stop([1.0] * 4, [0.5] * 4)  # faster in each: a win waits for the 95% bound
    assert not stop([1.0, 1.0, 1.0, 1.0], [1.5, 1.5, 1.5, 0.99])  # faster once: undecided yet
    assert stop([1.0] * 10, [0.5] * 10)  # twice as fast every round: decided better
    assert stop([1.0] * 10, [2.0] * 10)  # twice as slow: decided not better
    assert not stop([1.0, 1.2, 0.9, 1.1, 1.0, 0.95, 1.15, 0.9, 1.05, 1.1], [1.0] * 10)  # undecided


def test_an_early_win_needs_every_round_past_the_gain_a_marginal_one_runs_to_the_cap():
    """Rounds drift together for a while (a neighbour's burst, the page cache): measured on A/A
    pairs of a memory-bound rowsum, six rounds in a row each 3-17% faster for the same machine code.
    Stopped there, the sign test's bound (all six above 1) crowned it. A win decided before the cap
    needs its whole bound past 1 + the gain; a marginal one is decided on every round the cap allows."""
    stop = timing.decided(0.05)
    drifted = [1.068, 1.173, 1.046, 1.030, 1.048, 1.095]  # a real A/A pair's first six rounds
    assert not stop([1.0] * 6, [1.0 / r for r in drifted])  # median 1.058, low 1.03: not yet
    assert stop([1.0] * 6, [1.0 / 1.2] * 6)  # a clear win: decided at once
    marginal = [1.0 / 1.08] * 8 + [1.0 / 1.03] * 4  # median 1.08, bound's low end 1.03: to the cap
    assert not stop([1.0] * 12, marginal)


def _counting(fn):
    calls = []

    def call(x, y):
        calls.append(1)
        fn(x, y, len(calls))

    return call, calls


def test_slow_kernels_timed_outputs_are_checked_inside_the_rounds():
    """One call a block: both kernels write the same copy from the same inputs in a round; a
    candidate wrong on every other call is caught there, and an honest one costs no extra calls."""
    import time

    x = np.random.default_rng(1).standard_normal(4096).astype(np.float32)
    budget = timing.Budget(min_rounds=8, max_rounds=8, max_time_s=30.0, min_round_s=0.0)  # 8 copies
    honest, honest_calls = _counting(lambda x, y, k: np.multiply(x, 2, out=y))
    sly, _ = _counting(lambda x, y, k: np.multiply(x, 2 if k % 2 else 3, out=y))
    for candidate, wrong in ((honest, False), (sly, True)):
        paired = timing.measure_paired(
            timing.KernelPair(_double, candidate),
            timing.CallArgs((x, np.empty_like(x)), ["in", "out"]),
            timing.Clock(time.perf_counter, lambda: None),
            budget,
        )
        assert bool(paired.mismatch) == wrong, paired.mismatch
    assert "timed buffer copy" in paired.mismatch
    assert len(honest_calls) == 2 + 8  # warm-up, a second slow call, one a round: no check calls after


def _count_preparations(rotation) -> list[int]:
    """The copies `rotation` prepares from now on, one entry per preparation."""
    prepared: list[int] = []
    prepare = rotation.prepare

    def counting(factors, used=None, poison=True):
        prepared.extend(range(len(rotation.sets)) if used is None else used)
        prepare(factors, used, poison)

    rotation.prepare = counting
    return prepared


def test_calibration_reuses_prepared_copies_and_blocks_keep_only_the_copies_they_call():
    """What a calibrating call writes is never read: a copy prepared once serves all of a kernel's
    calibrating calls. A block of n calls re-prepares the n copies it uses, so n copies are kept (two
    at least); the rest were eight 64 MiB first touches for a 3 ms rowsum timed two calls a block."""
    from pytest_kope.judge.measure.rotation import Rotation

    x = np.random.default_rng(4).standard_normal(4096).astype(np.float32)
    budget = timing.Budget(min_rounds=6, max_rounds=6, max_time_s=30.0, min_round_s=0.002)
    for cost, calls, copies in ((3e-3, 1, 2), (1.2e-3, 2, 2)):  # a fake clock: no sleep decides it
        clock = FakeClock()
        args = (x, np.empty_like(x))
        rotations = (Rotation(args, ["in", "out"]), Rotation(args, ["in", "out"]))
        assert len(rotations[1].sets) == 8  # a small call: as many copies as the rotation makes
        prepared = _count_preparations(rotations[1])
        paired = timing.measure_paired(
            timing.KernelPair(clock.kernel(cost), clock.kernel(cost)),
            timing.CallArgs(args, ["in", "out"]),
            timing.Clock(clock, lambda: None),
            budget,
            rotations=rotations,
        )
        assert paired.candidate.iterations == calls and paired.copies == copies and not paired.mismatch
        if calls == 1:  # one preparation for its calibration, then one per timed block
            assert len(prepared) == 1 + 6, prepared


def test_one_call_a_block_is_checked_inside_the_rounds_however_fast():
    """A kernel timed one call a block but far from slow (a 64 MiB memory-bound pass: tens of ms)
    has its outputs checked in the rounds too: no calls after them, a wrong one still named."""
    import time

    x = np.random.default_rng(3).standard_normal(4096).astype(np.float32)
    budget = timing.Budget(min_rounds=8, max_rounds=8, max_time_s=30.0, min_round_s=0.002)  # 8 copies

    def pace(k):  # one call is a round's worth (3 ms > 2 ms), 20 rounds' worth is far off
        time.sleep(0.003)

    honest, honest_calls = _counting(lambda x, y, k: (pace(k), np.multiply(x, 2, out=y)))
    sly, _ = _counting(lambda x, y, k: (pace(k), np.multiply(x, 2 if k % 2 else 3, out=y)))
    reference, _ = _counting(lambda x, y, k: (pace(k), _double(x, y)))
    for candidate, wrong in ((honest, False), (sly, True)):
        paired = timing.measure_paired(
            timing.KernelPair(reference, candidate),
            timing.CallArgs((x, np.empty_like(x)), ["in", "out"]),
            timing.Clock(time.perf_counter, lambda: None),
            budget,
        )
        assert bool(paired.mismatch) == wrong, paired.mismatch
    assert len(honest_calls) == 1 + 1 + 8  # warm-up, calibration, one a round: no check calls after


def test_a_kernel_wrong_only_on_its_early_timed_calls_is_caught():
    """Every round of a one-call-a-block timing is checked, not only enough rounds to see each copy
    once: a kernel that counts its calls and skips work on all but the last rounds (a median of
    fast rounds) is named, and one call a block cycles through two copies, not the eight a large
    last-level cache would ask for (each copy a first touch in the timing child)."""
    import time

    x = np.random.default_rng(5).standard_normal(4096).astype(np.float32)
    budget = timing.Budget(min_rounds=6, max_rounds=6, max_time_s=30.0, min_round_s=0.002)

    def pace(k):
        time.sleep(0.003)

    reference, _ = _counting(lambda x, y, k: (pace(k), _double(x, y)))
    early, _ = _counting(lambda x, y, k: (pace(k), np.multiply(x, 2 if k > 6 else 0, out=y)))  # rounds 0-3
    paired = timing.measure_paired(
        timing.KernelPair(reference, early),
        timing.CallArgs((x, np.empty_like(x)), ["in", "out"]),
        timing.Clock(time.perf_counter, lambda: None),
        budget,
    )
    assert paired.candidate.iterations == paired.reference.iterations == 1
    assert paired.copies == 2
    assert "timed buffer copy" in paired.mismatch, paired


def test_fast_kernels_wrong_on_every_timed_call_are_caught_in_the_rounds():
    """Many calls a block: after every round, copies drawn then are compared with the reference's
    from the same inputs, so a kernel wrong on every call the rounds time, and right only on calls
    after them (all that a check after the rounds would see), is named; an honest kernel never is."""
    clock = FakeClock()
    x = np.random.default_rng(6).standard_normal(4096).astype(np.float32)
    budget = timing.Budget(min_rounds=6, max_rounds=6, max_time_s=30.0)
    rounds_end = budget.warmup + (1 + 5) + 6 * 5  # warm-up, calibration (1 call, then 5), six rounds of 5
    calls = []

    def sly(x, y):
        clock.now += 1e-3
        calls.append(1)
        np.multiply(x, 2 if len(calls) > rounds_end else 0, out=y)

    def timed(candidate):
        return timing.measure_paired(
            timing.KernelPair(clock.kernel(1e-3), candidate),
            timing.CallArgs((x, np.empty_like(x)), ["in", "out"]),
            timing.Clock(clock, lambda: None),
            budget,
        )

    for _ in range(10):
        calls.clear()
        clock.now = 0.0  # ms steps on a clock near 0: five calls always make the 5 ms round
        paired = timed(sly)
        assert paired.candidate.iterations == 5 and paired.checked >= 1
        assert "timed buffer copy" in paired.mismatch, paired
        clock.now = 0.0
        assert not timed(clock.kernel(1e-3)).mismatch


def test_a_kernel_right_only_on_the_last_calls_of_each_block_is_caught(monkeypatch):
    """Two copies (capped: a block has a copy a call while they fit under MAX_COPY_BYTES) for five
    calls a block: each copy's last write in a block was one of its last two calls, so a kernel that
    counts its calls and works only there passed any check of whole blocks. A block now makes no
    more calls than there are copies, so every call's output is there to be compared."""
    import random

    budget = timing.Budget(min_rounds=6, max_rounds=6, max_time_s=30.0)
    ahead = budget.warmup + 1 + 5  # warm-up and calibration: then blocks of five
    monkeypatch.setattr(rotation_module, "MAX_COPY_BYTES", 2 * 2 * 4096 * 4)  # two copies at most
    caught = 0
    for seed in range(10):
        # outputcheck's audits draw from random.SystemRandom: seeded instead
        monkeypatch.setattr(random, "SystemRandom", lambda seed=seed: random.Random(seed))
        clock = FakeClock()
        calls: list[int] = []
        x = np.random.default_rng(seed).standard_normal(4096).astype(np.float32)

        def last_two(x, y, clock=clock, calls=calls):
            clock.now += 1e-3
            calls.append(1)
            work = len(calls) <= ahead or (len(calls) - ahead) % 5 in (4, 0)
            np.multiply(x, 2 if work else 0, out=y)

        args = (x, np.empty_like(x))
        rotations = tuple(rotation_module.Rotation(args, ["in", "out"], max_copies=2) for _ in "rc")
        paired = timing.measure_paired(
            timing.KernelPair(clock.kernel(1e-3), last_two),
            timing.CallArgs(args, ["in", "out"]),
            timing.Clock(clock, lambda: None),
            budget,
            rotations=rotations,  # type: ignore[arg-type]
        )
        assert paired.candidate.iterations == 2 and paired.copies == 2 and paired.checked >= 1
        caught += "timed buffer copy" in paired.mismatch
    assert caught == 10, caught


def test_in_place_kernels_are_compared_after_as_many_calls_as_the_candidate_made():
    """An in-place kernel called many times a block compounds on its copy: the reference gets the
    same fresh inputs and the same number of calls, so an honest in-place kernel agrees and one that
    skips its timed calls is named."""
    clock = FakeClock()
    budget = timing.Budget(min_rounds=6, max_rounds=6, max_time_s=30.0)

    def step(x):
        clock.now += 1e-3
        np.multiply(x, 0.5, out=x)
        x += 1.0

    calls = 0

    def lazy(x):  # right until the rounds start, then does nothing
        nonlocal calls
        clock.now += 1e-3
        calls += 1
        if calls <= budget.warmup + 1 + 5:
            step(x)
            clock.now -= 1e-3

    x = np.random.default_rng(7).standard_normal(4096).astype(np.float32)
    for candidate, wrong in ((step, False), (lazy, True)):
        paired = timing.measure_paired(
            timing.KernelPair(step, candidate),
            timing.CallArgs((x,), ["inout"]),
            timing.Clock(clock, lambda: None),
            budget,
        )
        assert paired.candidate.iterations == 5 and paired.checked >= 1
        assert bool(paired.mismatch) == wrong, paired.mismatch


def test_many_call_kernels_with_an_integer_in_place_argument_are_checked_after_the_rounds():
    """Fresh inputs restore floating arguments only: an in-place integer argument has no known state
    before a block, so such a kernel is checked after the rounds, as before, and not audited."""
    clock = FakeClock()
    budget = timing.Budget(min_rounds=6, max_rounds=6, max_time_s=30.0)

    def bump(counts):
        clock.now += 1e-3
        counts += 1

    counts = np.zeros(1024, dtype=np.int32)
    paired = timing.measure_paired(
        timing.KernelPair(bump, bump),
        timing.CallArgs((counts,), ["inout"]),
        timing.Clock(clock, lambda: None),
        budget,
    )
    assert paired.checked == 0 and not paired.mismatch


def test_timing_never_writes_the_callers_arrays():
    """The caller's arrays are the pristine inputs: no timed call, fresh input or poisoning writes
    them (in a forked timing child they stay the server's pages), and each kernel is given copies of
    its own: no buffer the reference wrote is ever given to the candidate."""
    import time

    x = np.random.default_rng(4).standard_normal(4096).astype(np.float32)
    y = np.full_like(x, 7.0)
    x0 = x.copy()
    budget = timing.Budget(min_rounds=8, max_rounds=8, max_time_s=30.0, min_round_s=0.0)
    seen, theirs = [], []

    def candidate(a, b):
        seen.append((a, b))
        np.multiply(a, 2, out=b)

    def reference(a, b):
        theirs.append(b)
        _double(a, b)

    paired = timing.measure_paired(
        timing.KernelPair(reference, candidate),
        timing.CallArgs((x, y), ["in", "out"]),
        timing.Clock(time.perf_counter, lambda: None),
        budget,
    )
    assert not paired.mismatch
    assert np.array_equal(x, x0) and (y == 7.0).all()
    assert all(b is not y for _, b in seen)
    assert not {id(b) for _, b in seen} & {id(b) for b in theirs}


def test_timed_outputs_of_in_place_kernels_are_checked_from_the_same_inputs():
    """The timed-output check runs the reference into scratch buffers; an in-place argument's
    scratch starts from the copy's own contents, so an honest in-place kernel agrees and a wrong one
    is named."""
    import time

    acc = np.random.default_rng(2).standard_normal(4096).astype(np.float32)
    budget = timing.Budget(min_rounds=6, max_rounds=6, max_time_s=30.0)

    def reference(a):  # idempotent: the rounds call it many times on one block's inputs
        np.abs(a, out=a)

    for candidate, wrong in (
        (lambda a: np.sqrt(np.multiply(a, a, out=a), out=a), False),
        (lambda a: np.negative(np.abs(a, out=a), out=a), True),
    ):
        paired = timing.measure_paired(
            timing.KernelPair(reference, candidate),
            timing.CallArgs((acc.copy(),), ["inout"]),
            timing.Clock(time.perf_counter, lambda: None),
            budget,
        )
        assert bool(paired.mismatch) == wrong, paired.mismatch


# Imported once in the fork server (at collection), so only a body run there sees its own pid.
PERF = """\
import os

IMPORTED_BY = os.getpid()


def test_scale_perf(kernel, rng, kope_bench):
    x = rng.standard_normal(1 << 16).astype(np.float32)
    y = np.empty_like(x)
    {before}
    kope_bench(kernel.scale, x, y, x.size)
    {after}
"""


@pytest.mark.parametrize(
    "before,after",
    [
        ("assert os.getpid() == IMPORTED_BY, 'the body ran in a child'", ""),
        ("kernel.scale(x, y, x.size)  # calls the kernel itself: runs in each child", ""),
        ("", "assert_close(y, 2 * x, rtol=1e-6)  # checks outputs after timing: runs in each child"),
    ],
    ids=["recorded", "calls-the-kernel", "checks-after"],
)
def test_a_perf_tests_inputs_are_made_once_per_server(tmp_path, before, after):
    plan = _plan(
        tmp_path, tests=TESTS.split("def test_scale_perf")[0] + PERF.format(before=before, after=after)
    )
    judge = Judge(plan, lambda c: [])
    twins = [_candidate(plan, KERNEL.format(prelude="", body="", after="") + "\n" * k) for k in (1, 2)]
    try:
        base = judge.baseline(plan.operator.baseline())
        judged = [judge.performance(judge.correctness([t])[0], base.candidate) for t in twins]
    finally:
        judge.close()
    for j in judged:
        assert j.outcome == Outcome.OK and j.timings, j.failures


# Another style: inputs from a module-scoped fixture, a class, a parametrized size.
PERF_IN_A_CLASS = """\
import os

IMPORTED_BY = os.getpid()


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(7).standard_normal(1 << 16).astype(np.float32)


class TestSpeed:
    @pytest.mark.parametrize("n", [1 << 12, 1 << 16])
    def test_scale_perf(self, kernel, data, kope_bench, n):
        assert os.getpid() == IMPORTED_BY, "the body ran in a child"
        x, y = data[:n].copy(), np.empty(n, dtype=np.float32)
        kope_bench(kernel.scale, x, y, n)
"""


def test_a_perf_test_in_a_class_with_fixtures_is_recorded_too(tmp_path):
    plan = _plan(tmp_path, tests=TESTS.split("def test_scale_perf")[0] + PERF_IN_A_CLASS)
    plan = dataclasses.replace(
        plan,
        performance=[
            "test_scale.py::TestSpeed::test_scale_perf[4096]",
            "test_scale.py::TestSpeed::test_scale_perf[65536]",
        ],
    )
    judge = Judge(plan, lambda c: [])
    twin = _candidate(plan, KERNEL.format(prelude="", body="", after="") + "\n")
    try:
        base = judge.baseline(plan.operator.baseline())
        judged = judge.performance(judge.correctness([twin])[0], base.candidate)
    finally:
        judge.close()
    assert judged.outcome == Outcome.OK and len(judged.timings) == 2, judged.failures


@needs_jail
def test_the_runs_settings_reach_the_childs_timing_whole(tmp_path):
    """`--kope-timing-seconds` travels in the request's settings: a paired timing of twins run to the
    cap (not sequential) stops at the fewest rounds when its window is a tenth of a second, and runs
    many more in the default 3 s."""
    twin_text = KERNEL.format(prelude="", body="", after="") + "\n"
    rounds = {}
    for seconds in (0.1, 3.0):
        plan = _plan(tmp_path).with_settings(timing_s=seconds, sequential=False)
        judge = Judge(plan, lambda c: [])
        try:
            base = judge.baseline(plan.operator.baseline())
            judged = judge.performance(judge.correctness([_candidate(plan, twin_text)])[0], base.candidate)
        finally:
            judge.close()
        assert judged.outcome == Outcome.OK and judged.timings, judged.failures
        rounds[seconds] = judged.timings[0].rounds
    assert rounds[0.1] == timing.PAIRED.min_rounds < rounds[3.0], rounds
