"""A small forge on 127.0.0.1 that speaks the parts of the GitHub and GitLab REST APIs pytest-kope uses,
for driving the real PyGithub and python-gitlab over real HTTP.

GitHub (any base URL, as GitHub Enterprise):
    GET   /repos/{owner}/{name}                           default_branch: `server.default_branch`
    GET   /repos/{owner}/{name}/pulls?state=open&head=owner:branch
    POST  /repos/{owner}/{name}/pulls                     422 "already exists" for a second open one;
                                                          422 base invalid when not in `server.branches`
    PATCH /repos/{owner}/{name}/pulls/{number}
    POST  /repos/{owner}/{name}/issues/{number}/comments
GitLab (under /api/v4):
    GET  /projects/{id}                                   default_branch: `server.default_branch`
    GET  /projects/{id}/merge_requests?source_branch=...&state=opened
    POST /projects/{id}/merge_requests, PUT /projects/{id}/merge_requests/{iid}
    POST /projects/{id}/merge_requests/{iid}/notes, POST /projects/{id}/uploads

Requests without the server's token get 401 ("Bad credentials"). `server.fail(method, pattern, status)`
makes the next matching request fail once (a 502, a 429 with Retry-After, ...) before it reaches the
state. Every request is recorded in `server.requests` as (method, path, headers, body).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest


@dataclass
class Pull:
    number: int
    head: str
    base: str
    title: str
    body: str
    state: str = "open"
    comments: list[str] = field(default_factory=list)


@dataclass
class Failure:
    method: str
    pattern: str
    status: int
    body: Any
    headers: dict[str, str]


class ForgeServer:
    def __init__(self, token: str = "ghs_test_token_0123456789") -> None:
        self.token = token
        self.default_branch = "main"
        self.branches: set[str] | None = None  # the repository's branches, when a test names them
        self.pulls: list[Pull] = []
        self.uploads: list[str] = []
        self.failures: list[Failure] = []
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_port}"

    def fail(
        self, method: str, pattern: str, status: int, body: Any = None, headers: dict[str, str] | None = None
    ) -> None:
        """The next `method` request whose path matches `pattern` (a regex) answers `status` once."""
        body = body if body is not None else {"message": f"scripted {status}"}
        with self.lock:
            self.failures.append(Failure(method, pattern, status, body, headers or {}))

    def start(self) -> ForgeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def open_pulls(self, head: str | None = None) -> list[Pull]:
        return [p for p in self.pulls if p.state == "open" and (head is None or p.head == head)]

    # -- GitHub ---------------------------------------------------------------------------------------
    def github_json(self, repo: str, p: Pull) -> dict[str, Any]:
        owner = repo.split("/")[0]
        api = f"{self.url}/repos/{repo}"
        return {
            "number": p.number,
            "id": p.number,
            "url": f"{api}/pulls/{p.number}",
            "html_url": f"{self.url}/{repo}/pull/{p.number}",
            "issue_url": f"{api}/issues/{p.number}",
            "title": p.title,
            "body": p.body,
            "state": p.state,
            "head": {"ref": p.head, "label": f"{owner}:{p.head}"},
            "base": {"ref": p.base, "label": f"{owner}:{p.base}"},
        }

    def github(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        whole = re.fullmatch(r"/repos/([^/]+)/([^/]+)", path)
        if whole and method == "GET":
            name = f"{whole.group(1)}/{whole.group(2)}"
            return 200, {
                "id": 1,
                "name": whole.group(2),
                "full_name": name,
                "default_branch": self.default_branch,
            }
        m = re.fullmatch(r"/repos/([^/]+/[^/]+)/(pulls|issues)(?:/(\d+))?(/comments)?", path)
        if not m:
            return 404, {"message": "Not Found"}
        repo, kind, number, comments = m.group(1), m.group(2), m.group(3), m.group(4)
        owner = repo.split("/")[0]
        if kind == "pulls" and number is None and method == "GET":
            head = query.get("head", [""])[0].removeprefix(f"{owner}:") or None
            return 200, [self.github_json(repo, p) for p in self.open_pulls(head)]
        if kind == "pulls" and number is None and method == "POST":
            if self.open_pulls(body["head"]):
                error = {"resource": "PullRequest", "code": "custom"}
                error["message"] = f"A pull request already exists for {owner}:{body['head']}."
                return 422, {"message": "Validation Failed", "errors": [error]}
            if self.branches is not None and body["base"] not in self.branches:  # as GitHub answers
                error = {"resource": "PullRequest", "field": "base", "code": "invalid"}
                return 422, {"message": "Validation Failed", "errors": [error]}
            opened = Pull(
                len(self.pulls) + 1, body["head"], body["base"], body["title"], body.get("body", "")
            )
            self.pulls.append(opened)
            return 201, self.github_json(repo, opened)
        pull = next((p for p in self.pulls if str(p.number) == number), None)
        if pull is None:
            return 404, {"message": "Not Found"}
        if kind == "pulls" and method == "PATCH":
            pull.title, pull.body = body.get("title", pull.title), body.get("body", pull.body)
            return 200, self.github_json(repo, pull)
        if kind == "issues" and comments and method == "POST":
            pull.comments.append(body["body"])
            return 201, {"id": len(pull.comments), "body": body["body"]}
        return 404, {"message": "Not Found"}

    # -- GitLab ---------------------------------------------------------------------------------------
    def gitlab_json(self, project: str, p: Pull) -> dict[str, Any]:
        return {
            "id": 1000 + p.number,
            "iid": p.number,
            "project_id": 1,
            "web_url": f"{self.url}/{project}/-/merge_requests/{p.number}",
            "title": p.title,
            "description": p.body,
            "state": "opened" if p.state == "open" else p.state,
            "source_branch": p.head,
            "target_branch": p.base,
        }

    def gitlab(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        whole = re.fullmatch(r"/api/v4/projects/([^/]+)", path)
        if whole and method == "GET":
            return 200, {
                "id": 1,
                "path_with_namespace": unquote(whole.group(1)),
                "default_branch": self.default_branch,
            }
        m = re.fullmatch(r"/api/v4/projects/([^/]+)/(merge_requests|uploads)(?:/(\d+))?(/notes)?", path)
        if not m:
            return 404, {"message": "404 Not Found"}
        project, kind, iid, notes = unquote(m.group(1)), m.group(2), m.group(3), m.group(4)
        if kind == "uploads" and method == "POST":
            self.uploads.append(project)
            url = f"/uploads/{len(self.uploads):032x}/plot.png"
            return 201, {"alt": "plot", "url": url, "markdown": f"![plot]({url})"}
        if iid is None and method == "GET":
            head = query.get("source_branch", [None])[0]
            return 200, [self.gitlab_json(project, p) for p in self.open_pulls(head)]
        if iid is None and method == "POST":
            if self.open_pulls(body["source_branch"]):
                return 409, {"message": ["Another open merge request already exists for this source branch"]}
            opened = Pull(
                len(self.pulls) + 1,
                body["source_branch"],
                body["target_branch"],
                body["title"],
                body.get("description", ""),
            )
            self.pulls.append(opened)
            return 201, self.gitlab_json(project, opened)
        pull = next((p for p in self.pulls if str(p.number) == iid), None)
        if pull is None:
            return 404, {"message": "404 Not found"}
        if method == "PUT" and not notes:
            pull.title, pull.body = body.get("title", pull.title), body.get("description", pull.body)
            return 200, self.gitlab_json(project, pull)
        if notes and method == "POST":
            pull.comments.append(body["body"])
            return 201, {"id": len(pull.comments), "body": body["body"]}
        return 404, {"message": "404 Not found"}

    def answer(
        self, method: str, raw_path: str, headers: dict[str, str], raw: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        parts = urlsplit(raw_path)
        path, query = parts.path, parse_qs(parts.query)
        try:
            body: Any = json.loads(raw) if raw else {}
        except ValueError:
            body = {"_raw_bytes": len(raw)}  # a multipart upload
        with self.lock:
            self.requests.append((method, raw_path, headers, body))
            for f in self.failures:
                if f.method == method and re.search(f.pattern, path):
                    self.failures.remove(f)
                    return f.status, f.body, f.headers
            gitlab = path.startswith("/api/v4/")
            given = headers.get("private-token", "") if gitlab else headers.get("authorization", "")
            if given.split(" ")[-1] != self.token:
                return 401, {"message": "401 Unauthorized" if gitlab else "Bad credentials"}, {}
            code, out = (self.gitlab if gitlab else self.github)(method, path, query, body)
            return code, out, {}


def _handler(server: ForgeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            code, out, extra = server.answer(self.command, self.path, headers, raw)
            data = json.dumps(out).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json; charset=utf-8")
            self.send_header("content-length", str(len(data)))
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_PUT = _serve

    return Handler


@pytest.fixture(name="forge_server")
def forge_server_fixture() -> Iterator[ForgeServer]:
    server = ForgeServer().start()
    try:
        yield server
    finally:
        server.stop()
