"""A jail that holds (issue 50): what a candidate tries from inside its kernel server.

Each candidate below is a correct Triton softmax whose module, when its kernel server imports it,
first tries one escape; what it reaches it proves by halving its outputs (judged incorrect), and a
system call the filter forbids ends its server (crashed, the candidate's fault). The source screen
is switched off (KOPE_PY_SCREEN=0): it is a first pass, and these test the boundary behind it. The
host side is checked too: no marker written, no connection made, no link followed.
"""

from __future__ import annotations

import os
import site
import socket
import threading
from pathlib import Path

import pytest
from test_differential import TESTS, TRITON_KERNEL, _candidate, _repo, needs_triton

from pytest_kope.judge.controller import files, sandbox
from pytest_kope.judge.controller.plan import Plan
from pytest_kope.judge.controller.runner import Judge
from pytest_kope.judge.outcome import Judged, Outcome

JAIL, JAIL_WHY = sandbox.bubblewrap()
needs_jail = pytest.mark.skipif(JAIL is None, reason=f"no bubblewrap jail here: {JAIL_WHY}")

PRELUDE_END = "\nESCAPED = _try()\n"
HALVE = """

_launch = softmax


def softmax(x, y, rows, cols):
    _launch(x, y, rows, cols)
    if ESCAPED:
        y.mul_(0.5)
"""


def _escaping(attempt: str) -> str:
    """A correct kernel that first runs `attempt` (the body of `_try()`, True when it got out)."""
    body = "\n".join("    " + line for line in attempt.strip().splitlines())
    return f"def _try():\n{body}\n" + PRELUDE_END + TRITON_KERNEL + HALVE


def _plan(tmp_path: Path) -> Plan:
    tests = TESTS.format(source="softmax.py", empty="np.empty_like(x)", args="*_t(x, y), *x.shape", out="y")
    tests = tests.replace(
        "from pytest_kope import assert_close\n",
        "from pytest_kope import assert_close\nimport torch\n\n\ndef _t(x, y):\n"
        "    return torch.from_numpy(x), torch.from_numpy(y)\n",
    )
    (tmp_path / "repo").mkdir()
    plan = _repo(tmp_path / "repo", "softmax.py", TRITON_KERNEL, tests)
    return plan.with_settings(seeds=2)


def _judge(tmp_path: Path, monkeypatch, attempts: dict[str, str]) -> dict[str, Judged]:
    monkeypatch.setenv("KOPE_PY_SCREEN", "0")
    plan = _plan(tmp_path)
    judge = Judge(plan, lambda c: [])
    try:
        assert judge.baseline(plan.operator.baseline()).outcome == Outcome.OK
        judged = judge.correctness([_candidate(plan, _escaping(a)) for a in attempts.values()])
    finally:
        judge.close()
    return dict(zip(attempts, judged))


@needs_triton
@needs_jail
def test_nothing_of_the_host_is_there_to_read_or_write(tmp_path, monkeypatch):
    marker = tmp_path / "marker.txt"
    marker.write_text("host secret")
    pth = Path(site.getsitepackages()[0]) / "kope_round3_escape.pth"
    attempts = {
        "marker": f"return open({str(marker)!r}).read() == 'host secret'",
        "home": "import os\nreturn os.path.exists(os.path.expanduser('~root/.bashrc')) or os.path.exists('/root/.bashrc')",
        "run": "import os\nreturn any(os.path.exists(p) for p in ('/run', '/var/run', '/var/run/docker.sock', '/etc/passwd'))",
        "repo": f"import os\nreturn os.path.exists({str(tmp_path / 'repo' / 'test_softmax.py')!r})",
        "pth": f"open({str(pth)!r}, 'w').write('import os')\nreturn True",
        "proc": "import os\nreturn len([p for p in os.listdir('/proc') if p.isdigit()]) > 1",
        "control": "return True",  # it got out: how every attempt above would be judged had it
    }
    judged = _judge(tmp_path, monkeypatch, attempts)
    control = judged.pop("control")
    assert control.outcome == Outcome.INCORRECT, control.failures
    for name, j in judged.items():
        # reached nothing (correct), or was stopped trying (a read-only file system raises: crashed at import)
        assert j.outcome in (Outcome.OK, Outcome.COMPILE_FAILED), (name, j.outcome, j.failures)
    assert not pth.exists()


@needs_triton
def test_no_socket_no_process_and_no_signal_to_another(tmp_path, monkeypatch):
    """Each is a system call the filter forbids: the kernel server dies of it, the candidate is named."""
    path = tmp_path / "listener.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    listener.settimeout(0.2)
    reached: list[bytes] = []

    def accept() -> None:
        try:
            conn, _ = listener.accept()
            reached.append(conn.recv(100))
        except OSError:
            pass

    waiter = threading.Thread(target=accept)
    waiter.start()
    attempts = {
        "unix": f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({str(path)!r})\ns.send(b'secret')\nreturn True",
        "tcp": "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\nreturn True",
        "process": f"import subprocess\nsubprocess.run(['touch', {str(tmp_path / 'spawned')!r}])\nreturn True",
        "signal": "import os\nos.kill(os.getppid() or 1, 0)\nos.kill(0, 0)\nreturn True",
    }
    try:
        judged = _judge(tmp_path, monkeypatch, attempts)
    finally:
        waiter.join()
        listener.close()
    for name, j in judged.items():
        assert j.outcome in (Outcome.CRASHED, Outcome.COMPILE_FAILED), (name, j.outcome, j.failures)
        assert "SIGSYS" in " ".join(j.failures) or "forbid" in " ".join(j.failures), (name, j.failures)
    assert not reached and not (tmp_path / "spawned").exists()


@pytest.mark.parametrize("target", ["/proc/self/environ", "outside"])
def test_the_controller_follows_no_link(tmp_path, monkeypatch, target):
    """A link where a child could write it is never read through, nor copied as its target."""
    monkeypatch.setenv("KOPE_TEST_SECRET", "sk-kope-should-not-leak")
    outside = tmp_path / "outside.txt"
    outside.write_text("outside the child's folder")
    aim = Path("/proc/self/environ") if target != "outside" else outside
    work = tmp_path / "work"
    work.mkdir()
    (work / "child.log").symlink_to(aim)
    assert files.read_text(work / "child.log") == ""
    assert not files.copy(work / "child.log", tmp_path / "kept.log")
    assert not (tmp_path / "kept.log").exists()
    (work / "child.log").unlink()
    (work / "child.log").write_text("a log")
    os.symlink(aim, tmp_path / "kept.log")  # a link at the target: replaced? never written through
    with pytest.raises(OSError):
        files.copy(work / "child.log", tmp_path / "kept.log")
    assert "should-not-leak" not in outside.read_text()


RESERVE = """\
// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
// Honest where a 3 x 3 GiB reservation (never touched) fails, as under an address-space rlimit;
// drops its work where it succeeds, as in a user's process.
#include <math.h>
#include <stdlib.h>
static int reserved = -1;
void softmax(const float *x, float *y, int rows, int cols) {
    if (reserved < 0) {
        void *p[3];
        reserved = 1;
        for (int i = 0; i < 3; i++)
            reserved &= (p[i] = malloc((size_t)3 << 30)) != 0;
        for (int i = 0; i < 3; i++)
            free(p[i]);
    }
    if (reserved && @ARMED@)
        return;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float *yr = y + (long)r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int c = 0; c < cols; c++)
            m = xr[c] > m ? xr[c] : m;
        for (int c = 0; c < cols; c++)
            s += (yr[c] = expf(xr[c] - m));
        for (int c = 0; c < cols; c++)
            yr[c] /= s;
    }
}
"""


def test_a_kernel_cannot_tell_the_judge_by_its_memory_limit(tmp_path):
    """No address-space rlimit: reserving 9 GiB it never touches succeeds in its kernel server as in
    a user's process, so the kernel that drops its work when it does is judged on that path."""
    from test_differential import _c_plan

    plan = _c_plan(tmp_path)
    judge = Judge(plan, lambda c: [])
    try:
        assert judge.baseline(plan.operator.baseline()).outcome == Outcome.OK
        cheat, twin = judge.correctness(
            [
                _candidate(plan, RESERVE.replace("@ARMED@", "1")),
                _candidate(plan, RESERVE.replace("@ARMED@", "0")),
            ]
        )
    finally:
        judge.close()
    assert cheat.outcome == Outcome.INCORRECT, cheat.failures
    assert twin.outcome == Outcome.OK, twin.failures


def test_a_thread_that_ends_while_its_state_is_read_is_gone_not_an_error():
    """A kernel the jail kills mid-call (SIGSYS) ends while the host waits for it to stop: reading its
    thread's state then fails with ESRCH, which means gone (seen: a timer patch judged `incorrect`
    with "ProcessLookupError" as its failure, instead of `crashed` by SIGSYS)."""
    from pytest_kope.judge.kernel import process

    done = threading.Event()
    thread = threading.Thread(target=done.wait)
    thread.start()
    live = os.open(f"/proc/self/task/{thread.native_id}/stat", os.O_RDONLY)
    assert process._state(live) in (b"S", b"R")
    ended = os.open(f"/proc/self/task/{thread.native_id}/stat", os.O_RDONLY)
    done.set()
    thread.join()
    assert process._state(ended) is None
