"""`kope doctor` (`pytest --kope-check`) on what users get wrong: each mistake is said on its own line,
naming the file and what to write instead, the other operators are still checked, and no traceback
is ever shown. Real repos (copies of sample_ops/gelu) in tmp dirs, real gcc, real pytest processes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from op_repos import git

from pytest_kope.buildhints import first_error, include_hint, missing_header
from pytest_kope.errors import SpecError
from pytest_kope.spec import parse_spec

SAMPLES = Path(__file__).resolve().parent.parent / "sample_ops"
FIXED_INPUTS = "def test_gelu_matches_reference(kernel, n):\n    rng = np.random.default_rng(0)\n"


def _operator(
    repo: Path, name: str, source: Callable[[str], str] = str, tests: Callable[[str], str] = str
) -> Path:
    """sample_ops/gelu copied to repo/<name>/ as operator `name`, its source and tests edited."""
    folder = repo / name
    folder.mkdir(parents=True)
    (folder / "gelu.c").write_text(source((SAMPLES / "gelu" / "gelu.c").read_text()))
    text = (SAMPLES / "gelu" / "test_gelu.py").read_text().replace('kope("gelu"', f'kope("{name}"')
    (folder / f"test_{name}.py").write_text(tests(text))
    shutil.copy(SAMPLES / "pytest.ini", repo / "pytest.ini")
    return folder


def _doctor(repo: Path, *args: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest_kope.cli", "doctor", "-p", "no:cacheprovider", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = done.stdout + done.stderr
    assert "Traceback" not in out and "INTERNALERROR" not in out, out[-6000:]
    return done.returncode, out


def _said(out: str, lead: str) -> str:
    (line,) = [line for line in out.splitlines() if line.startswith(lead)]
    return line


def test_each_broken_operator_gets_its_own_line_and_the_others_are_checked(tmp_path: Path) -> None:
    repo = tmp_path / "ops"
    header = "// kope: param NT = 0 | 1"
    _operator(repo, "quiet", tests=lambda t: t[: t.index("def test_gelu_perf")])  # passes; nothing times it
    _operator(repo, "parm", lambda s: s.replace(header, "// kope: parm NT 0 1"))
    _operator(repo, "noval", lambda s: s.replace(header, "// kope: param NT ="))
    _operator(repo, "comma", lambda s: s.replace(header, "// kope: param NT = 0, 1"))
    _operator(repo, "req", lambda s: s.replace(header, header + "\n// kope: require NT >"))
    _operator(
        repo,
        "cc",
        lambda s: s.replace("#include <math.h>", "#include <math.h>\nint broken = ;\nint worse = ;"),
        lambda t: t.replace("def test_gelu_matches_reference(kernel, rng, n):\n", FIXED_INPUTS),
    )
    _operator(repo, "hdr", lambda s: s.replace("#include <math.h>", '#include <math.h>\n#include "extra.h"'))
    (repo / "kernels" / "include").mkdir(parents=True)
    (repo / "kernels" / "include" / "extra.h").write_text("#define EXTRA 1\n")
    (repo / "Makefile").write_text("CFLAGS = -O2 -Ikernels/include\nall:\n\tgcc $(CFLAGS) -shared */gelu.c\n")
    loud = 'void gelu(const float *x, float *y, long n) {\n    printf("hi\\n");'
    _operator(
        repo,
        "loud",
        lambda s: "#include <stdio.h>\n" + s.replace("void gelu(const float *x, float *y, long n) {", loud),
    )

    rc, out = _doctor(repo)

    assert rc == 1, out[-6000:]
    assert "8 operator(s), 1 ready to optimize (1 of them not timed: nothing to commit), 7 not" in out
    assert _said(out, "quiet ").endswith(" passes")
    assert "no performance test" in _said(out, "kope quiet: ")
    assert "parm/gelu.c:3: unknown declaration 'parm' (did you mean `kope: param`?)" in _said(
        out, "kope parm: "
    )
    assert "gelu.c:3: list choices as `kope: param NT = a | b | c`" in _said(out, "kope noval: ")
    assert "gelu.c:4: `kope: require`" in _said(out, "kope req: ")
    assert _said(out, "kope comma: ").endswith(
        "comma/gelu.c:3: separate the choices of param NT with `|`, not commas or spaces:"
        " write `kope: param NT = 0 | 1` (first is the default)"
    )
    # the compiler's first error, whole: its line and the context under it, not the second error
    lines = out.splitlines()
    at = lines.index(_said(out, "kope cc: "))
    assert lines[at].startswith("kope cc: does not compile: cc/gelu.c:16:14: error: expected expression")
    assert "int broken = ;" in lines[at + 1] and "^" in lines[at + 2], lines[at : at + 4]
    assert "worse" not in out
    # fresh inputs come from the tests, the same whether or not the kernel ever ran
    assert " 0 of 10 " in _said(out, "cc ") and " 10 of 10 " in _said(out, "parm "), out
    assert "fatal error: extra.h: No such file or directory" in _said(out, "kope hdr: does not compile: ")
    assert _said(out, "kope hdr: hint: ").endswith(
        'extra.h is in kernels/include (Makefile: -Ikernels/include): add include="../kernels/include" to'
        " the kope marker in hdr/test_hdr.py, or `kope_include = kernels/include` to pytest.ini"
    )
    assert "imports puts" in _said(out, "kope loud: rejected: ")
    assert "winners will not be committed to kope/<operator> branches here (no git repository at" in out
    assert ".kope/runs/<run-id>/<operator>/ instead" in out


def test_test_modules_that_do_not_import_are_one_line_each(tmp_path: Path) -> None:
    for name, text in (("syn", "import pytest\ndef broken(:\n"), ("imp", "import no_such_module_kope\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"test_{name}.py").write_text(text)
    rc, out = _doctor(tmp_path)
    assert rc == 1, out
    assert _said(out, "kope: syn/test_syn.py:2: cannot collect: SyntaxError: invalid syntax; fix it")
    assert _said(out, "kope: imp/test_imp.py:1: cannot collect: ModuleNotFoundError: No module named")
    assert "0 operator(s), 0 ready to optimize, 2 test module(s) not collected" in out
    assert "importlib" not in out and "_bootstrap" not in out


@pytest.mark.parametrize("mistake", ["two kernels, one name", "no such source"])
def test_markers_that_cannot_work_are_a_usage_error_in_one_line(tmp_path: Path, mistake: str) -> None:
    _operator(tmp_path, "gelu")
    if mistake == "two kernels, one name":
        _operator(tmp_path, "other", tests=lambda t: t.replace('kope("other"', 'kope("gelu"'))
        expected = "give each kernel its own name"
    else:
        test = tmp_path / "gelu" / "test_gelu.py"
        test.write_text(test.read_text().replace('source="gelu.c"', 'source="gelu2.c"'))
        expected = "does not exist; fix source= in the marker"
    rc, out = _doctor(tmp_path)
    assert rc == 4, out
    assert expected in _said(out, "ERROR: ")


def test_a_git_repo_is_named_for_what_it_lacks(tmp_path: Path) -> None:
    """A repo with a commit gets no warning; one with none is not called "no git repository"."""
    _operator(tmp_path, "parm", lambda s: s.replace("// kope: param NT = 0 | 1", "// kope: parm NT"))
    git(tmp_path, "init", "-q")
    rc, out = _doctor(tmp_path)
    assert rc == 1, out
    assert f"here (the git repository at {tmp_path} has no commit yet)" in _said(
        out, "kope: winners will not"
    )
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "ops")
    rc, out = _doctor(tmp_path)
    assert rc == 1 and "winners will not be committed" not in out, out


# -- the pieces, on their own ----------------------------------------------------------------------

GCC_LOG = """\
$ gcc -shared -fPIC k.c -o kernel.so
k.c: In function 'f':
k.c:3:9: error: 'y' undeclared (first use in this function)
    3 |     x = y;
      |         ^
k.c:3:9: note: each undeclared identifier is reported only once
k.c:4:5: error: expected ';' before '}' token
"""


def test_first_error_is_the_whole_first_diagnostic() -> None:
    assert first_error(GCC_LOG, {"k.c": "ops/k.c"}).splitlines() == [
        "ops/k.c:3:9: error: 'y' undeclared (first use in this function)",
        "    3 |     x = y;",
        "      |         ^",
    ]
    linker = (
        "$ gcc ...\n/usr/bin/ld: cannot find -lfoo: No such file or directory\ncollect2: error: ld returned 1"
    )
    assert first_error(linker) == "collect2: error: ld returned 1"
    assert missing_header("k.c:1:10: fatal error: 'a/b.h' file not found") == "a/b.h"


@pytest.mark.parametrize(
    "cmake",
    [
        "include_directories(${CMAKE_CURRENT_SOURCE_DIR}/third/include)",
        "target_include_directories(ops SYSTEM PUBLIC $<BUILD_INTERFACE:third/include> src)",
    ],
)
def test_include_hint_reads_cmake(tmp_path: Path, cmake: str) -> None:
    (tmp_path / "third" / "include" / "a").mkdir(parents=True)
    (tmp_path / "third" / "include" / "a" / "b.h").write_text("")
    (tmp_path / "src").mkdir()
    (tmp_path / "CMakeLists.txt").write_text(f"project(ops C)\n{cmake}\n")
    hint = include_hint(
        "a/b.h",
        tmp_path / "src" / "k.c",
        tmp_path,
        [tmp_path / "src"],
        tmp_path / "tests" / "test_k.py",
        None,
    )
    assert "a/b.h is in third/include (CMakeLists.txt:" in hint, hint
    assert 'add include="../third/include" to the kope marker in tests/test_k.py' in hint, hint


def test_include_hint_finds_the_header_where_no_build_file_names_it(tmp_path: Path) -> None:
    (tmp_path / "vendor" / "inc").mkdir(parents=True)
    (tmp_path / "vendor" / "inc" / "v.h").write_text("")
    ini = tmp_path / "pytest.ini"
    hint = include_hint("v.h", tmp_path / "k.c", tmp_path, [tmp_path], tmp_path / "test_k.py", ini)
    assert hint.endswith(
        'v.h is in vendor/inc: add include="vendor/inc" to the kope marker in test_k.py, '
        "or `kope_include = vendor/inc` to pytest.ini"
    ), hint
    assert (
        include_hint("nowhere.h", tmp_path / "k.c", tmp_path, [tmp_path], tmp_path / "test_k.py", ini) == ""
    )


def test_a_flags_line_without_choices_says_what_to_write() -> None:
    with pytest.raises(SpecError, match=r"k\.c:2: list choices as `kope: flags a \| b \| c`"):
        parse_spec("// kope: kernel void f(int n)\n// kope: flags\n", "k.c")


@pytest.mark.parametrize("values", ["0, 8, 16", "0 8 16", "0; 8; 16", "0, 8 | 16"])
def test_a_param_listed_with_commas_or_spaces_says_to_use_bars(values: str) -> None:
    header = f"// kope: kernel void f(int n)\n// kope: param VEC = {values}\n"
    with pytest.raises(SpecError, match=r"^k\.c:2: separate the choices of param VEC with `\|`") as e:
        parse_spec(header, "k.c")
    assert str(e.value).endswith("write `kope: param VEC = 0 | 8 | 16` (first is the default)")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("values", ['"a b" | "c"', "64 * 4 | 128", "float | double", "-1 | 2.5"])
def test_one_value_with_spaces_in_it_is_still_one_value(values: str) -> None:
    assert len(parse_spec(f"// kope: param V = {values}\n", "k.c").space.axes["V"]) == 2
