"""Pull requests through the real PyGithub and python-gitlab, over HTTP to a local forge."""

from __future__ import annotations

import pytest
from forge_server import ForgeServer, forge_server_fixture  # noqa: F401

from pytest_kope.errors import ConfigError, ForgeError
from pytest_kope.review.forge import ForgeSettings, GitLabForge, make_forge, redact


def settings(server: ForgeServer, kind: str = "github", token: str | None = None) -> ForgeSettings:
    return ForgeSettings(
        kind, server.url, "acme/ops", token or server.token, attempts=3, backoff=0.01, throttle=False
    )


def test_opens_then_updates_one_pull_request_per_branch(forge_server: ForgeServer) -> None:
    said: list[str] = []
    forge = make_forge(settings(forge_server), said.append)
    first = forge.review("kope/scale", "main", "kope(scale): 2.00x", "body 1", "ignored on create")
    assert first.created and first.number == 1 and first.url.endswith("/acme/ops/pull/1")
    again = forge.review("kope/scale", "main", "kope(scale): 3.00x", "body 2", "new winner")
    assert not again.created and again.number == 1
    (pull,) = forge_server.pulls
    assert (pull.title, pull.body, pull.comments) == ("kope(scale): 3.00x", "body 2", ["new winner"])
    other = forge.review("kope/twice", "main", "t", "b", "")
    assert other.created and other.number == 2
    methods = [(m, p.split("?")[0]) for m, p, _, _ in forge_server.requests]
    assert ("GET", "/repos/acme/ops/pulls") in methods and ("PATCH", "/repos/acme/ops/pulls/1") in methods
    assert ("POST", "/repos/acme/ops/issues/1/comments") in methods
    listed = [p for m, p, _, _ in forge_server.requests if m == "GET"]
    assert "head=acme%3Akope%2Fscale" in listed[0] or "head=acme:kope/scale" in listed[0]
    assert not said


def test_a_502_is_retried_with_backoff_and_then_succeeds(forge_server: ForgeServer) -> None:
    said: list[str] = []
    forge_server.fail("POST", r"/pulls$", 502, {"message": "Server Error"})
    forge_server.fail("GET", r"/pulls$", 503, headers={"Retry-After": "0"})
    review = make_forge(settings(forge_server), said.append).review("kope/scale", "main", "t", "b", "")
    assert review.created and len(forge_server.pulls) == 1
    assert len(said) == 2 and "HTTP 503" in said[0] and "retrying in 0 s" in said[0]
    assert "HTTP 502" in said[1] and "retrying in 0.01 s" in said[1]  # each call backs off on its own


def test_422_already_exists_updates_the_open_one(forge_server: ForgeServer) -> None:
    # A create that the forge answered with 422: the pull request was opened meanwhile (another job).
    forge = make_forge(settings(forge_server), lambda line: None)
    forge.review("kope/scale", "main", "first", "b", "")
    forge_server.fail("GET", r"/pulls$", 200, [])  # the listing misses it, as a race would
    review = forge.review("kope/scale", "main", "second", "b2", "new winner")
    assert not review.created and review.number == 1
    codes = [(m, p.split("?")[0]) for m, p, _, _ in forge_server.requests]
    assert codes.count(("POST", "/repos/acme/ops/pulls")) == 2  # the second answered 422
    assert forge_server.pulls[0].title == "second" and forge_server.pulls[0].comments == ["new winner"]


def test_a_bad_token_is_one_permanent_error_without_the_token(forge_server: ForgeServer) -> None:
    bad = "ghp_wrong_token_that_must_not_print"
    said: list[str] = []
    with pytest.raises(ForgeError) as e:
        make_forge(settings(forge_server, token=bad), said.append).review("kope/scale", "main", "t", "b", "")
    message = str(e.value)
    assert "HTTP 401" in message and "Bad credentials" in message and "token was refused" in message
    assert bad not in message and not said  # not retried
    assert len(forge_server.requests) == 1


def test_retries_give_up_with_the_count(forge_server: ForgeServer) -> None:
    for _ in range(3):
        forge_server.fail("GET", r"/pulls$", 502)
    with pytest.raises(ForgeError, match=r"after 3 tries: github acme/ops at .*: HTTP 502"):
        make_forge(settings(forge_server), lambda line: None).review("kope/x", "main", "t", "b", "")


def test_gitlab_merge_requests_through_python_gitlab(forge_server: ForgeServer) -> None:
    said: list[str] = []
    forge_server.fail("POST", r"/merge_requests$", 502)
    forge = make_forge(settings(forge_server, "gitlab"), said.append)
    assert isinstance(forge, GitLabForge)
    first = forge.review("kope/scale", "main", "kope(scale): 2x", "body", "")
    assert first.created and first.url.endswith("/-/merge_requests/1") and len(said) == 1
    markdown = forge.attach("scale-speedup.png", b"\x89PNG fake")
    assert markdown.startswith("![plot](/uploads/")
    again = forge.review("kope/scale", "main", "kope(scale): 3x", "body 2", "new winner")
    assert not again.created and forge_server.pulls[0].comments == ["new winner"]
    assert forge_server.pulls[0].body == "body 2"
    tokens = {h.get("private-token") for _, p, h, _ in forge_server.requests}
    assert tokens == {forge_server.token}


def test_settings_from_ci_environment_and_remote_url() -> None:
    env = {
        "GITHUB_TOKEN": "tok",
        "GITHUB_API_URL": "https://ghe.example/api/v3",
        "GITHUB_REPOSITORY": "acme/ops",
        "GITHUB_SERVER_URL": "https://ghe.example",
        "GITHUB_RUN_ID": "42",
    }
    s = ForgeSettings.resolve(env, {}, None)
    assert (s.kind, s.url, s.repo, s.token) == ("github", "https://ghe.example/api/v3", "acme/ops", "tok")
    assert s.run_url == "https://ghe.example/acme/ops/actions/runs/42" and "tok" not in repr(s)
    s = ForgeSettings.resolve({"GH_TOKEN": "t"}, {}, "git@github.com:acme/ops.git")
    assert (s.url, s.repo) == ("https://api.github.com", "acme/ops")
    s = ForgeSettings.resolve({"MY_PAT": "t"}, {"kope_forge_token_env": "MY_PAT"}, "https://git.corp/a/b")
    assert (s.url, s.repo) == ("https://git.corp/api/v3", "a/b")
    lab = {"GITLAB_CI": "true", "CI_SERVER_URL": "https://gitlab.example", "CI_PROJECT_ID": "7"}
    s = ForgeSettings.resolve({**lab, "KOPE_GITLAB_TOKEN": "glpat"}, {}, None)
    assert (s.kind, s.url, s.repo, s.token) == ("gitlab", "https://gitlab.example", "7", "glpat")
    with pytest.raises(ConfigError, match=r"needs a token in \$KOPE_GITLAB_TOKEN or \$GITLAB_TOKEN"):
        ForgeSettings.resolve(lab, {}, None)
    auth = ForgeSettings.resolve(env, {}, None).git_auth_env("https://ghe.example/acme/ops.git")
    assert auth["GIT_CONFIG_KEY_0"] == "http.https://ghe.example/.extraheader"
    assert auth["GIT_CONFIG_VALUE_0"].startswith("AUTHORIZATION: basic ")
    assert redact("refused s3cr3t here", "s3cr3t") == "refused *** here"


def test_a_target_branch_the_forge_lacks_is_named_in_the_error(forge_server: ForgeServer) -> None:
    forge_server.branches = {"main"}
    forge = make_forge(settings(forge_server), lambda line: None)
    with pytest.raises(ForgeError) as e:
        forge.review("kope/scale", "master", "t", "b", "")
    message = str(e.value)
    assert "HTTP 422: Validation Failed (base invalid)" in message and "set ini kope_pr_base" in message
    assert not forge_server.pulls and forge.review("kope/scale", "main", "t", "b", "").created


def test_the_default_branch_as_each_forge_says(forge_server: ForgeServer) -> None:
    forge_server.default_branch = "trunk"
    for kind in ("github", "gitlab"):
        assert make_forge(settings(forge_server, kind), lambda line: None).default_branch() == "trunk"
    forge_server.fail("GET", r"/repos/acme/ops$", 404)
    with pytest.raises(ForgeError, match=r"reading the repository's default branch: .*HTTP 404"):
        make_forge(settings(forge_server), lambda line: None).default_branch()
