"""Screens of untrusted candidate text, each with real inputs: headers, C sources built by real gcc,
Python (Triton) sources.

- `kope: require` is read by a fixed grammar: nothing in a header is ever executed by the controller.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kope.errors import SpecError
from pytest_kope.spec import TuningSpace, evaluate_require, parse_spec, require_error

# -- `kope: require`: a fixed grammar, never eval ---------------------------------------------------------

AXES = {"BLOCK": (64, 128, 32), "VEC": (0, 8), "flags": ("-O2", "-O3 -march=native")}
POINT = {"BLOCK": 128, "VEC": 8, "flags": "-O3 -march=native"}


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("BLOCK % 64 == 0", True),
        ("BLOCK >= 256 or flags == '-O2'", False),
        ("16 <= BLOCK < 256", True),
        ("BLOCK in (64, 128)", True),
        ("BLOCK not in [64, 32]", True),
        ("VEC in (-1, +8)", True),
        ("not (BLOCK == 128)", False),
        ("BLOCK == 128 and VEC > 0", True),
        ("(BLOCK + VEC) * 2 - 1 == 271", True),
        ("BLOCK / 3 > 42.6", True),
        ("BLOCK // 3 == 42", True),
        ("BLOCK ** 2 <= 16384", True),
        ("2 ** VEC == 256", True),
        ("-BLOCK < 0", True),
        ("BLOCK > 127.5", True),
        ("'march' in flags", True),
        ("flags + ' -g' == '-O3 -march=native -g'", True),
        ("True", True),
        ("False or VEC", True),
        # evaluation errors rule the point out
        ("1 / (VEC - 8) > 0", False),
        ("BLOCK % (VEC - 8) == 0", False),
        ("BLOCK < flags", False),
        ("'x' * BLOCK == 'x'", False),  # no string repetition (a memory bomb with a big param)
        ("VEC ** BLOCK > 0", False),  # an exponent (param value 128) over the cap at run time
        ("BLOCK in flags", False),  # `in` over a non-literal needs two strings
    ],
)
def test_require_grammar_accepts_and_evaluates(expr, expected):
    assert require_error(expr, AXES) is None
    assert evaluate_require(expr, POINT) is expected
    assert TuningSpace(AXES, (expr,)).allows(POINT) is expected


@pytest.mark.parametrize(
    "expr, found",
    [
        ("().__class__.__base__.__subclasses__()", "a call"),
        ("__import__('os')", "a call"),
        ("open('x')", "a call"),
        ("[c for c in ()]", "a comprehension"),
        ("(c for c in ())", "a comprehension"),
        ("lambda: 0", "a lambda"),
        ("x.y", "an attribute access"),
        ("a[0]", "a subscript"),
        ("2**10**10", "a power whose exponent is not a param or a number of at most 64"),
        ("BLOCK ** 100", "a power whose exponent is not a param or a number of at most 64"),
        ("f'{BLOCK}' == '1'", "an f-string"),
        ("__builtins__", "the dunder name __builtins__"),
        ("BLOCK if VEC else 0", "a conditional expression"),
        ("(x := 1)", "an assignment"),
        ("BLOCK << 40", "the operator LShift"),
        ("~BLOCK", "the operator Invert"),
        ("BLOCK == None", "the constant None"),
        ("b'x' == BLOCK", "the constant b'x'"),
        ("{1: 2}", "a dict"),
        ("(BLOCK, VEC)", "a list outside `in`/`not in`"),
        ("BLOCK in (VEC, 1)", "a list with an element that is not a number or a string"),
        ("UNDECLARED > 1", "the name UNDECLARED, which is not a param of this source"),
        ("BLOCK >", "a syntax error"),
    ],
)
def test_require_grammar_rejects_at_parse_time(expr, found):
    header = f"// kope: kernel void f(float *y)\n// kope: param BLOCK = 64 | 128\n// kope: require {expr}\n"
    header += "// kope: param VEC = 0 | 8\n"  # a param declared after the require line still counts
    with pytest.raises(SpecError) as info:
        parse_spec(header, "softmax.c")
    message = str(info.value)
    assert message.startswith("softmax.c:3: `kope: require` allows only params, numbers, comparisons")
    assert f"found {found}" in message
    assert "\n" not in message


def test_a_candidate_header_payload_is_never_executed(tmp_path):
    """The payloads would each create a file if evaluated; neither parsing nor the tuner's use runs them."""
    target = tmp_path / "pwned"
    payloads = [
        f"__import__('os').system('touch {target}') == 0",
        f"open('{target}', 'w') is not None",
        "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'Popen'][0]"
        f"(['touch', '{target}']) is not None",
    ]
    for payload in payloads:
        source = (
            f"// kope: kernel void f(float *y)\n// kope: param BLOCK = 1 | 2\n// kope: require {payload}\n"
        )
        with pytest.raises(SpecError, match=r"^softmax\.c:3: `kope: require` allows only"):
            parse_spec(source, "softmax.c")
        # a space built without the parser (say, by a plugin) is still only interpreted, never evaluated
        space = TuningSpace({"BLOCK": (1, 2)}, (payload,))
        assert list(space.points()) == []
        assert not space.allows({"BLOCK": 1})
    assert not target.exists()


def test_require_interpreter_refuses_unchecked_nodes():
    """evaluate_require is safe on text the parser never saw: anything off the grammar is False."""
    assert evaluate_require("(1).__class__", {}) is False
    assert evaluate_require("print('x') or True", {}) is False
    assert evaluate_require("BLOCK", {"BLOCK": [1]}) is False  # a param value that is not a scalar


def test_sample_op_constraints_still_parse_and_filter():
    root = Path(__file__).resolve().parent.parent
    softmax = parse_spec((root / "sample_ops/softmax/softmax.c").read_text(), "softmax.c")
    points = list(softmax.space.points())
    assert len(points) == 30 and all(p["FAST_EXP"] == 0 or p["VEC"] > 0 for p in points)
    sgemm = parse_spec((root / "sample_ops/sgemm/sgemm.c").read_text(), "sgemm.c")
    assert len(list(sgemm.space.points())) == 132
