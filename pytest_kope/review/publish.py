"""The last step for one operator: commit the verified winner without losing a commit, push it with a
lease, and open or update its pull request; plus the speedup plot.

`Publisher` is made once per run by the workflow. Its git steps run under the repo's kope lock, so two
runs on one repo take turns there. Push and forge trouble is reported for that operator (in the
terminal and in report.json) and never stops the run. The forge token lives in `ForgeSettings` and in
the environment of the git child that pushes; every message that could carry it passes `redact`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..errors import ConfigError, ForgeError
from ..hardware import describe
from ..settings import ReviewSettings
from . import plot, prbase, prbody, report
from .forge import ForgeSettings, GitHubForge, GitLabForge, make_forge, redact
from .vcs import ZERO, Target, Vcs

if TYPE_CHECKING:
    from ..judge.controller.sandbox import Children
    from ..judge.outcome import Judged
    from ..memory.graph import Graph
    from ..operator import Operator

@dataclass(frozen=True)
class VerifiedWinner:
    """A verified winner, what it was judged against and on which machine: what its commit message
    and pull request are made of, wherever the commit goes."""

    op: Operator
    verified: Judged
    baseline: Judged
    history: list[Judged]
    hw: dict[str, Any]  # the hardware fingerprint


class Publisher:
    """Commit, push and review for one run."""

    def __init__(
        self, config: pytest.Config, vcs: Vcs | None, run_id: str, prefix: str, run_dir: Path, graph: Graph
    ):
        self.config, self.vcs, self.run_id, self.prefix = config, vcs, run_id, prefix
        self.run_dir, self.graph = run_dir, graph
        self._mpl = run_dir.parent.parent / "matplotlib"  # .kope/matplotlib: ignored with .kope/
        self.review = ReviewSettings.from_config(config)  # read once, here
        self.pr, self.remote = self.review.pr, self.review.push
        self.say: Callable[..., None] = lambda line, red=False: None
        self.settings: ForgeSettings | None = None
        self.results: dict[str, dict[str, Any]] = {}
        self.env: dict[str, str] = {}
        self.pr_base = ""
        if vcs is not None and self.remote:
            self._resolve_forge()
        if vcs is not None and self.pr and self.remote:
            self.pr_base = self._resolve_pr_base()

    def _resolve_forge(self) -> None:
        assert self.vcs is not None and self.remote
        try:
            url = self.vcs.repo.remote(self.remote).url
        except ValueError:
            raise ConfigError(
                f"--kope-push {self.remote}: this repository has no remote {self.remote!r} "
                f"(git remote -v lists them)"
            ) from None
        try:
            self.settings = ForgeSettings.resolve(os.environ, self.review.forge, url)
        except ConfigError:
            if self.pr:
                raise
            self.settings = None  # pushing needs no forge: git's own credentials, if any
        if self.settings is not None:
            self.env = self.settings.git_auth_env(url)

    def _resolve_pr_base(self) -> str:
        """The pull requests' target branch, found before anything is optimized (or a usage error)."""
        assert self.vcs is not None and self.remote and self.settings is not None
        settings = self.settings
        return prbase.pr_base(
            self.vcs,
            self.remote,
            self.review.pr_base or None,
            os.environ,
            lambda: make_forge(settings, self.say).default_branch(),
        )

    def _secret(self, text: str) -> str:
        return redact(text, self.settings.token) if self.settings else text

    # -- commit ------------------------------------------------------------------------------------
    def commit(
        self, winner: VerifiedWinner, files: Sequence[Path], baked: str
    ) -> tuple[str | None, str | None, str]:
        """(branch, sha, what happened): the winner committed where no commit is lost, then pushed.
        `files`: the operator's test files; `baked`: the file to commit, the winner's source with its
        values as the defaults."""
        assert self.vcs is not None
        op, verified, hw = winner.op, winner.verified, winner.hw
        branch = f"{self.prefix}{op.name}"
        with self.vcs.locked(self.say):
            fetched = self.vcs.fetch(self.remote, self.prefix, self.env) if self.remote else None
            if fetched:
                self.say(
                    f"kope {op.name}: could not fetch {self.prefix}* from {self.remote}: {self._secret(fetched)}"
                )
            target = self.vcs.plan(branch, self.run_id, [Path(op.source), *files], self.remote)
            skip = self._already_there(target, verified, hw)
            if skip:
                tip = self._unpushed_tip(target) if self.remote else None
                if tip:  # an earlier push of it did not get through
                    same = "this winner" in skip
                    skip += "; " + self._push(
                        winner, target.branch, tip, target.remote_tip, review=same, why=""
                    )
                return target.branch, None, skip
            message = self._message(winner, target.note)
            try:
                done = self.vcs.commit(target, op.source, baked, message, self.run_id)
            except Exception as e:  # git trouble must not lose the run's results
                return None, None, f"could not commit to {target.branch}: {e}"
            note = "; ".join(
                n for n in (target.note, done.moved_aside and f"{done.moved_aside}: on {done.branch}") if n
            )
            said = f"committed {done.sha[:10]} to {done.branch}" + (f" ({note})" if note else "")
            if note:
                self.results.setdefault(op.name, {})["branch_note"] = note
            if self.remote:
                lease = target.remote_tip if done.branch == target.branch else None
                said += "; " + self._push(winner, done.branch, done.sha, lease, review=True, why=note)
        return done.branch, done.sha, said

    def _push(
        self, winner: VerifiedWinner, branch: str, sha: str, lease: str | None, review: bool, why: str
    ) -> str:
        """Push one branch tip; on success open or update its pull request. What happened, in words."""
        assert self.vcs is not None and self.remote
        name = winner.op.name
        pushed = self.vcs.push(self.remote, branch, sha, lease, self.env)
        detail = self._secret(pushed.detail)
        self.results.setdefault(name, {})["push"] = detail
        if not pushed.ok:
            self.say(f"kope {name}: {detail}", red=True)
        elif self.pr and review:
            self._review(winner, branch, sha, why)
        return detail

    def _unpushed_tip(self, target: Target) -> str | None:
        """The local branch's tip when it has commits the remote's lacks (and none of the remote's is
        missing), else None."""
        assert self.vcs is not None
        local = self.vcs.rev(f"refs/heads/{target.branch}")
        theirs = target.remote_tip
        if not local or local == theirs:
            return None
        return local if theirs is None or self.vcs.is_ancestor(theirs, local) else None

    def _already_there(self, target: Target, verified: Judged, hw: dict[str, Any]) -> str:
        assert self.vcs is not None
        if target.old == ZERO and target.remote_tip is None:
            return ""
        last = self.vcs.latest_kope_commit(target.parent) if target.parent != self.vcs.base else {}
        if last.get("Kope-Candidate") == verified.candidate.hash:
            return f"{target.branch} already holds this winner; no new commit"
        same_base = last.get("Kope-Base", last.get("_parent")) == self.vcs.base
        if last and same_base and last.get("Kope-Hardware") == describe(hw):
            try:
                if float(last.get("Kope-Speedup", "0")) >= (verified.speedup or 0):
                    return f"{target.branch} already holds a winner at least as fast; no new commit"
            except ValueError:
                pass
        return ""

    def _message(self, winner: VerifiedWinner, note: str) -> str:
        assert self.vcs is not None
        op = winner.op
        message = report.commit_message(
            op, winner.verified, winner.baseline, winner.history, self.run_id, describe(winner.hw)
        )
        head, _, rest = message.partition("\n\n")
        extra = []
        if self.vcs.is_dirty(op.source):
            extra.append(
                f"Note: {op.source.name} had uncommitted changes when the run started; the run judged "
                "them and this commit includes them."
            )
            self.say(f"kope {op.name}: {op.source.name} has uncommitted changes; the winner includes them")
        if note:
            extra.append(f"Note: {note}.")
        if extra:
            message = "\n\n".join([head, *extra, rest])
        return message.rstrip("\n") + f"\nKope-Base: {self.vcs.base}\n"

    # -- peers ---------------------------------------------------------------------------------------
    def measure_peers(self, op: Operator, baked: str, children: Children) -> None:
        """--kope-peers: the verified winner (`baked`: its source with its values as the defaults) next
        to its kernel-only peers, measured in a jailed child (pytest_kope/peers); the headline goes into
        report.json/report.md and the pull request."""
        if not self.review.peers or op.toolchain != "c":
            return
        from ..peers import child, headline
        from ..peers.measure import Comparison

        source = Path(op.source)
        if not child.applies(op.name, source.read_text()):
            return
        self.say(f"kope {op.name}: timing the winner next to its peers (--kope-peers)")
        data = child.measure(op.name, source, baked, source.parent, children=children)
        entry: dict[str, object]  # for report.json
        if "error" in data:
            entry = {"error": self._secret(str(data["error"]))}
        else:
            versions = data.pop("versions", {})
            result = Comparison.from_json(data)
            best = result.get("winner")
            entry = {
                "headline": headline(result, "winner"),
                "best_peer": result.best_peer,
                "ratio": best.vs_best_peer if best else None,
                "ratio_low": best.vs_best_peer_low if best else None,
                "ratio_high": best.vs_best_peer_high if best else None,
                "roof": result.roof,
                "roof_fraction": best.roof_fraction if best else None,
                "threads": result.threads,
                "versions": versions,
            }
        self.results.setdefault(op.name, {})["peers"] = entry
        self.say(f"kope {op.name}: {entry.get('headline') or entry.get('error')}")

    # -- review --------------------------------------------------------------------------------------
    def _review(self, winner: VerifiedWinner, branch: str, sha: str, note: str) -> None:
        assert self.settings is not None and self.vcs is not None and self.remote
        op = winner.op
        entry = self.results.setdefault(op.name, {})
        off_target = prbase.not_on_target(self.vcs, self.remote, self.pr_base)
        if off_target:  # the pull request would show the user's unpushed commits too: say so, there
            self.say(f"kope {op.name}: {off_target}")
            note = "; ".join(n for n in (note, off_target) if n)
        try:
            forge = make_forge(self.settings, self.say)
            evidence = self._evidence(winner, branch, sha, note)
            evidence.plot = self._plot_markdown(forge, op.name, winner.history)
            made = forge.review(
                branch,
                self.pr_base,
                prbody.title(evidence),
                prbody.body(evidence),
                prbody.comment(evidence),
            )
        except (ForgeError, ConfigError) as e:
            entry["review_error"] = self._secret(str(e))
            self.say(f"kope {op.name}: pull request not opened: {entry['review_error']}", red=True)
            return
        word = "opened" if made.created else "updated"
        entry["pull_request"] = {"number": made.number, "url": made.url, "created": made.created}
        self.say(f"kope {op.name}: {word} pull request #{made.number}: {made.url}")
        (self.run_dir / f"{op.name}-pr.md").write_text(self._secret(prbody.body(evidence)))

    def _evidence(self, winner: VerifiedWinner, branch: str, sha: str, note: str) -> prbody.Evidence:
        from ..settings import SEED

        assert self.vcs is not None
        op, verified, hw = winner.op, winner.verified, winner.hw
        return prbody.Evidence(
            operator=op.name,
            toolchain=op.toolchain,
            source=str(Path(op.source).resolve().relative_to(self.vcs.top.resolve())),
            branch=branch,
            sha=sha,
            base=self.vcs.base,
            run_id=self.run_id,
            seed=int(self.config.stash[SEED]),
            hardware=hw,
            hardware_name=describe(hw),
            winner=verified,
            baseline=winner.baseline,
            history=winner.history,
            lessons=self._lessons(op.name),
            build=self._build_line(op, verified),
            flags_in_source=report.flags_in_source(op, verified.candidate),
            note=note,
            run_url=self.settings.run_url if self.settings else "",
            peers=str((self.results.get(op.name, {}).get("peers") or {}).get("headline", "")),
            remote=self.remote or "origin",
        )

    def _lessons(self, operator: str) -> list[dict[str, Any]]:
        return self.graph.rows(
            "SELECT l.text FROM lessons l JOIN edges e ON e.src_kind = 'lesson' AND e.src_id = CAST(l.id AS TEXT)"
            " WHERE e.rel = 'used_in_context' AND e.dst_kind = 'run' AND e.dst_id = ? AND e.note = ?"
            " GROUP BY l.id ORDER BY max(l.value) DESC LIMIT 12",
            (self.run_id, operator),
        )

    def _build_line(self, op: Operator, verified: Judged) -> str:
        from ..toolchains import toolchain_of

        tc = toolchain_of(self.config, op.toolchain)
        command = getattr(tc, "command", None)
        if command is None:
            return ""
        try:
            return " ".join(command(verified.candidate, Path(Path(op.source).name), Path("kernel.so")))
        except Exception:  # a toolchain whose build is not one command line
            return ""

    def _plot_markdown(self, forge: GitHubForge | GitLabForge, operator: str, history: list[Judged]) -> str:
        png = plot.speedup_png(operator, [_point(j) for j in history], self.run_dir, self._mpl)
        if png is None:
            return ""
        if hasattr(forge, "attach"):
            try:
                return forge.attach(png.name, png.read_bytes())
            except ForgeError as e:
                self.say(f"kope {operator}: plot not attached: {self._secret(str(e))}")
        where = (
            f"[the CI run's files]({self.settings.run_url})"
            if self.settings and self.settings.run_url
            else f"`{png}`"
        )
        return f"`{png.name}` is in the run's folder, `.kope/runs/{self.run_id}/`, among {where}."

    # -- every operator ------------------------------------------------------------------------------
    def after(self, name: str, summary: dict[str, Any]) -> dict[str, Any]:
        """What report.json adds for an operator: the plot, and what push and review did."""
        extra = dict(self.results.get(name, {}))
        made = self.run_dir / f"{name}-speedup.png"
        candidates = summary.get("candidates", [])
        png = made if made.exists() else plot.speedup_png(name, candidates, self.run_dir, self._mpl)
        if png is not None:
            extra["plot"] = png.name
        return extra


def _point(judged: Judged) -> dict[str, Any]:
    return {"speedup": judged.speedup if judged.timings else None, "outcome": judged.outcome.value}
