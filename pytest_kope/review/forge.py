"""Pull requests through the forge's own API: GitHub (and GitHub Enterprise, or any server that speaks
GitHub's pulls API at another base URL) with PyGithub, GitLab merge requests with python-gitlab.

One review per branch: the open pull request whose head is the branch is updated (title, body, and a
comment for the new winner), else one is created. Transient errors (5xx, 429, a rate limit, a dropped
connection) are retried with exponential backoff, honouring Retry-After; anything else is a
`ForgeError` with a one-line message, which the caller reports for that operator and goes on.

Settings come from the environment as CI sets it (GITHUB_TOKEN, GITHUB_API_URL, GITHUB_REPOSITORY;
GitLab's CI_SERVER_URL, CI_PROJECT_ID and a token variable), from the ini options `kope_forge`,
`kope_forge_url`, `kope_forge_repo`, `kope_forge_token_env`, or from the push remote's URL. The token is
held here and in the git child that pushes, nowhere else; messages pass through `redact`.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict
from urllib.parse import urlsplit

from ..errors import ConfigError, ForgeError

GITHUB_TOKENS = ("GITHUB_TOKEN", "GH_TOKEN")
GITLAB_TOKENS = ("KOPE_GITLAB_TOKEN", "GITLAB_TOKEN")
_REMOTE = re.compile(r"^(?:[\w.+-]+://)?(?:[^@/]+@)?(?P<host>[^:/]+)(?::\d+)?[:/](?P<path>.+?)(?:\.git)?/?$")


@dataclass(frozen=True)
class ForgeSettings:
    """Which forge, where, which repository and which token, resolved from ini values and CI variables."""

    kind: str  # github | gitlab
    url: str  # API base URL (GitHub) or server URL (GitLab)
    repo: str  # owner/name, or a GitLab project path or id
    token: str = field(repr=False)
    run_url: str = ""  # the CI run's page, where the run's files are kept
    attempts: int = 4
    backoff: float = 1.0  # seconds before the first retry; doubles each time
    throttle: bool = True  # PyGithub's pauses between requests (GitHub's secondary rate limits)

    @classmethod
    def resolve(
        cls, env: Mapping[str, str], ini: Mapping[str, str | None], remote_url: str | None
    ) -> ForgeSettings:
        """From ini first, then CI's environment, then the remote's URL; ConfigError says what is missing."""
        kind = (ini.get("kope_forge") or ("gitlab" if env.get("GITLAB_CI") else "github")).lower()
        if kind not in ("github", "gitlab"):
            raise ConfigError(f"kope_forge = {kind!r}: pytest-kope speaks github (also GHE) or gitlab")
        host, path = _parse_remote(remote_url or "")
        if kind == "github":
            url = ini.get("kope_forge_url") or env.get("GITHUB_API_URL") or _github_api(host)
            repo = ini.get("kope_forge_repo") or env.get("GITHUB_REPOSITORY") or path
            run_url = _github_run_url(env)
            names: tuple[str, ...] = GITHUB_TOKENS
        else:
            url = ini.get("kope_forge_url") or env.get("CI_SERVER_URL") or (f"https://{host}" if host else "")
            repo = (
                ini.get("kope_forge_repo") or env.get("CI_PROJECT_ID") or env.get("CI_PROJECT_PATH") or path
            )
            run_url = env.get("CI_JOB_URL", "")
            names = GITLAB_TOKENS
        named = ini.get("kope_forge_token_env")
        names = (named,) if named else names
        token = next((env[n] for n in names if env.get(n)), "")
        missing = [
            what
            for what, value in (
                ("the API URL (kope_forge_url)", url),
                ("the repository (kope_forge_repo)", repo),
            )
            if not value
        ]
        if not token:
            missing.append(f"a token in ${' or $'.join(names)}")
        if missing:
            raise ConfigError(f"--kope-pr on {kind} needs {', '.join(missing)}")
        return cls(kind, url.rstrip("/"), repo, token, run_url)

    def git_auth_env(self, remote_url: str) -> dict[str, str]:
        """Environment for the git child that fetches and pushes over HTTPS: the token as an HTTP
        header in git's command-line config (GIT_CONFIG_*), never on disk or in argv."""
        parts = urlsplit(remote_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return {}
        user = "x-access-token" if self.kind == "github" else "oauth2"
        basic = base64.b64encode(f"{user}:{self.token}".encode()).decode()
        port = f":{parts.port}" if parts.port else ""
        return {
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": f"http.{parts.scheme}://{parts.hostname}{port}/.extraheader",
            "GIT_CONFIG_VALUE_0": f"AUTHORIZATION: basic {basic}",
        }


def redact(text: str, *secrets: str) -> str:
    """The text with every secret replaced by ***."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
            text = text.replace(base64.b64encode(secret.encode()).decode(), "***")
    return text


@dataclass(frozen=True)
class Review:
    """A pull (merge) request opened or updated on the forge."""

    number: int
    url: str
    created: bool  # False: an open one was updated


def _parse_remote(url: str) -> tuple[str, str]:
    m = _REMOTE.match(url.strip())
    return (m["host"], m["path"]) if m and "/" in m["path"] else ("", "")


def _github_api(host: str) -> str:
    if not host or host == "github.com":
        return "https://api.github.com"
    return f"https://{host}/api/v3"  # GitHub Enterprise Server


def _github_run_url(env: Mapping[str, str]) -> str:
    if not (env.get("GITHUB_REPOSITORY") and env.get("GITHUB_RUN_ID")):
        return ""
    server = env.get("GITHUB_SERVER_URL", "https://github.com")
    return f"{server}/{env['GITHUB_REPOSITORY']}/actions/runs/{env['GITHUB_RUN_ID']}"


# -- retries -----------------------------------------------------------------------------------------
def _status_of(e: BaseException) -> tuple[int | None, Mapping[str, str]]:
    status = getattr(e, "status", None) or getattr(e, "response_code", None)
    headers = getattr(e, "headers", None) or {}
    return (int(status) if status else None), headers


def _transient(e: BaseException) -> bool:
    import requests

    if isinstance(e, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError)):
        return True
    status, headers = _status_of(e)
    if status in (429, 500, 502, 503, 504):
        return True
    return status == 403 and (
        str(headers.get("x-ratelimit-remaining", "")) == "0" or "rate limit" in str(e).lower()
    )


def _retry_after(e: BaseException) -> float | None:
    _, headers = _status_of(e)
    value = {k.lower(): v for k, v in headers.items()}.get("retry-after")
    try:
        return min(60.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _explain(e: BaseException, settings: ForgeSettings) -> str:
    status, _ = _status_of(e)
    where = f"{settings.kind} {settings.repo} at {settings.url}"
    data = getattr(e, "data", None) or getattr(e, "error_message", None) or str(e)
    message = data.get("message", data) if isinstance(data, dict) else data
    fields = data.get("errors") if isinstance(data, dict) else None
    if isinstance(fields, list):  # GitHub's 422: which field was refused ("base invalid")
        said = [
            " ".join(str(f[k]) for k in ("field", "code") if k in f) for f in fields if isinstance(f, dict)
        ]
        message = f"{message} ({'; '.join(s for s in said if s)})" if any(said) else message
    hint = {
        401: "the token was refused: check the token variable (and that it has not expired)",
        403: "the token may not do this: it needs pull-requests: write (GitHub) or api scope (GitLab)",
        404: "no such repository, or the token cannot see it: check kope_forge_repo and kope_forge_url",
    }.get(status or 0, "")
    if "base invalid" in str(message):
        hint = "the target branch is not on the forge: set ini kope_pr_base to one of its branches"
    text = f"{where}: HTTP {status}: {message}" if status else f"{where}: {type(e).__name__}: {message}"
    return redact(f"{text}{'; ' + hint if hint else ''}", settings.token)


def retrying(
    settings: ForgeSettings,
    what: str,
    call: Callable[[], Any],
    say: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> Any:
    """`call()`, retried on transient errors with exponential backoff; ForgeError when it gives up."""
    delay = settings.backoff
    for attempt in range(1, settings.attempts + 1):
        try:
            return call()
        except ForgeError:
            raise
        except Exception as e:
            if not _transient(e) or attempt == settings.attempts:
                tries = f" after {attempt} tries" if attempt > 1 else ""
                raise ForgeError(f"{what}{tries}: {_explain(e, settings)}") from None
            wait = _retry_after(e)
            wait = delay if wait is None else wait
            say(f"kope: {what}: {_explain(e, settings)}; retrying in {wait:g} s")
            sleep(wait)
            delay *= 2
    raise AssertionError("unreachable")


class _Pauses(TypedDict, total=False):
    """PyGithub's own throttle, zeroed when ours is off (its defaults hold otherwise)."""

    seconds_between_requests: float
    seconds_between_writes: float


# -- the forges --------------------------------------------------------------------------------------
class GitHubForge:
    """Pull requests through PyGithub (its own retries off: ours are reported)."""

    def __init__(self, settings: ForgeSettings, say: Callable[[str], None]):
        from github import Auth, Github

        self.settings, self.say = settings, say
        pauses: _Pauses = (
            {} if settings.throttle else {"seconds_between_requests": 0, "seconds_between_writes": 0}
        )
        self.client = Github(
            auth=Auth.Token(settings.token),
            base_url=settings.url,
            retry=None,
            timeout=30,
            lazy=True,
            **pauses,
        )
        self.repo = self.client.get_repo(settings.repo)  # lazy: no request until a pulls call
        self.owner = settings.repo.split("/")[0]

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        return retrying(self.settings, what, call, self.say)

    def default_branch(self) -> str:
        """The repository's default branch, as the forge says."""
        return str(self._call("reading the repository's default branch", lambda: self.repo.default_branch))

    def _open_for(self, head: str) -> Any | None:
        found = self._call(
            f"listing pull requests for {head}",
            lambda: next(iter(self.repo.get_pulls(state="open", head=f"{self.owner}:{head}")), None),
        )
        return found

    def review(self, head: str, base: str, title: str, body: str, comment: str) -> Review:
        from github import GithubException

        def create() -> Any:
            try:
                return self.repo.create_pull(base=base, head=head, title=title, body=body)
            except GithubException as e:  # opened meanwhile (or by a create that answered 502)
                if e.status == 422 and "already exists" in str(e.data).lower():
                    return None
                raise

        pr = self._open_for(head)
        if pr is None:
            pr = self._call(f"opening a pull request for {head}", create)
            if pr is not None:
                return Review(pr.number, pr.html_url, True)
            pr = self._open_for(head)
            if pr is None:
                raise ForgeError(
                    f"{self.settings.repo}: GitHub says a pull request for {head} exists, but lists none open"
                )
        return self._update(pr, head, title, body, comment)

    def _update(self, pr: Any, head: str, title: str, body: str, comment: str) -> Review:
        self._call(f"updating pull request #{pr.number}", lambda: pr.edit(title=title, body=body))
        if comment:
            self._call(f"commenting on pull request #{pr.number}", lambda: pr.create_issue_comment(comment))
        return Review(pr.number, pr.html_url, False)


class GitLabForge:
    """Merge requests through python-gitlab (its own retries off: ours are reported)."""

    def __init__(self, settings: ForgeSettings, say: Callable[[str], None]):
        import gitlab

        self.settings, self.say = settings, say
        self.client = gitlab.Gitlab(settings.url, private_token=settings.token, timeout=30)
        self.project = self.client.projects.get(settings.repo, lazy=True)

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        return retrying(self.settings, what, call, self.say)

    def default_branch(self) -> str:
        """The project's default branch, as the forge says."""
        project = self._call(
            "reading the project's default branch", lambda: self.client.projects.get(self.settings.repo)
        )
        return str(project.default_branch or "")

    def attach(self, name: str, data: bytes) -> str:
        """Upload a file to the project; the Markdown that shows it."""
        done = self._call(f"uploading {name}", lambda: self.project.upload(name, filedata=data))
        return str(done.get("markdown", ""))

    def review(self, head: str, base: str, title: str, body: str, comment: str) -> Review:
        found = self._call(
            f"listing merge requests for {head}",
            lambda: self.project.mergerequests.list(source_branch=head, state="opened", get_all=False),
        )
        if not found:
            mr = self._call(
                f"opening a merge request for {head}",
                lambda: self.project.mergerequests.create(
                    {"source_branch": head, "target_branch": base, "title": title, "description": body}
                ),
            )
            return Review(mr.iid, mr.web_url, True)
        mr = found[0]
        mr.title, mr.description = title, body
        self._call(f"updating merge request !{mr.iid}", mr.save)
        if comment:
            self._call(f"commenting on merge request !{mr.iid}", lambda: mr.notes.create({"body": comment}))
        return Review(mr.iid, mr.web_url, False)


def make_forge(settings: ForgeSettings, say: Callable[[str], None]) -> GitHubForge | GitLabForge:
    """The GitHub or GitLab client the settings name."""
    try:
        return GitHubForge(settings, say) if settings.kind == "github" else GitLabForge(settings, say)
    except ImportError as e:
        extra = "PyGithub" if settings.kind == "github" else "python-gitlab"
        raise ConfigError(f"--kope-pr on {settings.kind} needs {extra}: pip install {extra} ({e})") from None
