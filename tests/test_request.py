"""A JudgeRequest survives the trip a child's request makes (JSON text), whole and equal."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_kope.candidate import Candidate
from pytest_kope.judge.request import JudgeRequest, Shrink
from pytest_kope.operator import Operator
from pytest_kope.settings import Settings


def _candidate(text: str) -> Candidate:
    return Candidate(text, "k.c", "c", {"BLOCK": 8}, "an idea", "tuner")


def test_a_request_round_trips_through_json_text_whole(tmp_path: Path):
    op = Operator(
        "softmax", tmp_path / "k.c", "c", "rowwise", 1e-5, (tmp_path / "inc",), (), None, (("x", "2*N"),)
    )
    request = JudgeRequest(
        candidate=_candidate("int a;"),
        operator=op,
        results=str(tmp_path / "results.jsonl"),
        tests=["test_k.py::test_a"],
        seeds=[7, 9],
        reference=_candidate("int b;"),
        record=None,
        replay=str(tmp_path / "rec"),
        rtol=0.0,
        ceilings={"copy_gbs": 10.0},
        settings=Settings(min_gain=0.1, record_inputs=False, operators=("softmax",), minutes=3.5),
        environment="oversubscribed",
        shrink=Shrink("call-3", _candidate("int c;")),
        key_fd=5,
    )
    back = JudgeRequest.from_json(json.loads(json.dumps(request.to_json())))
    assert back == request
    assert back.seed == 7 and JudgeRequest(_candidate(""), op, "r").seed == 1


def test_the_guards_follow_the_request():
    op = Operator("relu", Path("k.c"), "c", "elementwise")
    plain = JudgeRequest(_candidate(""), op, "r")
    assert plain.guard_switches() == {"probe": True, "settled_in_replay": False, "record": False}
    replaying = JudgeRequest(_candidate(""), op, "r", replay="rec", record="out")
    assert replaying.guard_switches() == {"probe": True, "settled_in_replay": True, "record": True}
