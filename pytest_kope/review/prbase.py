"""The branch a pull request targets, resolved once when the run starts.

A local branch need not exist on the remote under its own name (`git push origin master:main`), so
the local name is the last guess, not the first: ini `kope_pr_base`; the current branch's upstream on
the push remote (its name there); on a detached HEAD, the branch CI names; the remote's default branch
(its HEAD as git knows it, else as the forge says); the local name when the remote has such a branch.
When none applies the run stops before it starts, with one line naming what to set.

Only the target's name is resolved here: the winner's commit keeps the run's base (the commit that was
measured) as its parent and in its `Kope-Base` trailer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import git

from ..errors import ConfigError, ForgeError
from .vcs import Vcs

CI_BRANCH_VARIABLES = ("GITHUB_BASE_REF", "GITHUB_REF_NAME", "CI_COMMIT_BRANCH", "CI_DEFAULT_BRANCH")


def pr_base(
    vcs: Vcs, remote: str, given: str | None, env: Mapping[str, str], forge_default: Callable[[], str]
) -> str:
    """The name, on `remote`, of the branch pull requests target; ConfigError when nothing tells."""
    if given:
        return given
    repo = vcs.repo
    local = None if repo.head.is_detached else repo.active_branch.name
    tried: list[str] = []
    if local is not None:
        upstream = _upstream(vcs, local, remote)
        if upstream:
            return upstream
        tried.append(f"{local} has no upstream on {remote}")
    else:
        named = next((env[v] for v in CI_BRANCH_VARIABLES if env.get(v)), "")
        if named:
            return named
        tried.append(f"HEAD is detached and ${', $'.join(CI_BRANCH_VARIABLES)} are unset")
    head = _git(repo, "symbolic-ref", "-q", "--short", f"refs/remotes/{remote}/HEAD")
    if head.startswith(f"{remote}/"):
        return head.removeprefix(f"{remote}/")
    try:
        default, why = forge_default(), "it has none"
    except (ForgeError, ConfigError) as e:
        default, why = "", str(e)
    if default:
        return default
    tried.append(f"the forge did not name {remote}'s default branch ({why})")
    if local is not None and vcs.rev(f"refs/remotes/{remote}/{local}"):
        return local
    if local is not None:
        tried.append(f"{remote} has no branch {local}")
    raise ConfigError(
        f"--kope-pr: the pull request's target branch is unknown ({'; '.join(tried)}): "
        f"set ini kope_pr_base to a branch of {remote}"
    )


def _upstream(vcs: Vcs, branch: str, remote: str) -> str:
    """The name on `remote` of `branch`'s upstream; "" when it has none there (or it is gone)."""
    line = _git(
        vcs.repo,
        "for-each-ref",
        "--format=%(upstream:remotename)%00%(upstream:remoteref)%00%(upstream:track)",
        f"refs/heads/{branch}",
    )
    where, ref, track = (line.split("\0") + ["", "", ""])[:3]
    if where != remote or not ref.startswith("refs/heads/") or "gone" in track:
        return ""
    return ref.removeprefix("refs/heads/")


def not_on_target(vcs: Vcs, remote: str, target: str) -> str:
    """A sentence when the run's base is not on the target branch as last fetched (unpushed commits,
    which the pull request then shows too); "" otherwise."""
    tip = vcs.rev(f"refs/remotes/{remote}/{target}")
    if tip is None or vcs.is_ancestor(vcs.base, tip):
        return ""
    return (
        f"the run started from {vcs.base[:10]}, which {remote}/{target} does not hold: "
        "the pull request also shows the commits between them"
    )


def _git(repo: git.Repo, *args: str) -> str:
    status, out, _ = repo.git.execute(["git", *args], with_extended_output=True, with_exceptions=False)
    return str(out).strip() if status == 0 else ""
