"""The replay agent: candidates from a folder, for CI replays, hand-written variants and other generators.

`DIR/<operator>/<name>.<ext>` is one candidate (a whole kernel source); an optional `<name>.json`
beside it gives `{"params": {...}, "idea": "..."}`. Each file is proposed once, in name order.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..candidate import Candidate
from ..errors import ConfigError
from ..judge.outcome import Judged
from ..spec import Point, as_point, parse_spec
from .base import AgentBase, Context


class Replay(AgentBase):
    """Proposes the candidates recorded in a folder, `DIR/<operator>/<name>.<ext>`, each once."""

    name = "replay"
    # A folder is a fixed list that the user wants judged whole (a CI replay, a suite of hand-written
    # variants): --kope-patience does not cut it short; the budget still caps it.
    exhaustive = True

    def __init__(self, folder: str | Path, rootdir: Path | None = None):
        path = Path(folder)
        if not path.is_absolute() and rootdir is not None and not path.exists():
            path = Path(rootdir) / path
        if not path.is_dir():
            raise ConfigError(
                f"--kope-agent replay:{folder}: {path} is not a folder; give DIR with DIR/<operator>/ files"
            )
        self.folder = path
        self.proposed: set[Path] = set()

    def propose(self, ctx: Context, n: int) -> list[Candidate]:
        folder = self.folder / ctx.operator.name
        files = (
            sorted(p for p in folder.glob("*") if p.is_file() and p.suffix != ".json")
            if folder.is_dir()
            else []
        )
        out: list[Candidate] = []
        for path in files:
            if path in self.proposed:
                continue
            if len(out) >= n:
                break
            self.proposed.add(path)
            out.append(self._candidate(path, ctx))
        return out

    def _candidate(self, path: Path, ctx: Context) -> Candidate:
        source = path.read_text()
        sidecar = path.with_suffix(".json")
        meta: dict[str, Any] = {}
        if sidecar.exists():
            try:
                meta = json.loads(sidecar.read_text())
            except json.JSONDecodeError as e:
                raise ConfigError(
                    f"{sidecar}: not valid JSON ({e.msg} at line {e.lineno}); fix or remove it"
                ) from None
        try:
            defaults = parse_spec(source, str(path)).space.defaults
        except Exception:  # a broken header is the judge's to report, like any other broken candidate
            defaults = {}
        try:
            given = as_point(meta.get("params", {}))
        except ValueError as e:
            raise ConfigError(f"{sidecar}: {e}; give params as numbers or strings") from None
        params: Point = {**defaults, **given}
        return Candidate(
            source,
            ctx.operator.filename,
            ctx.operator.toolchain,
            params,
            meta.get("idea", f"replayed {path.name}"),
            self.name,
            ctx.incumbent.candidate.hash,
        )

    def observe(self, ctx: Context, results: list[Judged]) -> None:
        pass

    def usage(self) -> dict[str, Any]:
        return {"replayed": len(self.proposed)}
